"""Fingerprints of every attention head: what its QK circuit attends to, what its OV circuit writes.

Computed for all S members of an :class:`EnsembleTransformer` at once and returned as numpy
arrays with the member axis first, ``[S, layers, heads]``:

- ``qk_rho_value`` / ``attn_pos0`` (:func:`qk_fingerprint`): does the readout query attend to
  large tokens (the max shortcut) or to position 0 (the first-element shortcut)?
- ``ov_rho_residue`` (:func:`ov_fingerprint`): does the head's value/output path write each
  single token's OWN residue class onto the readout directions (:func:`readout_directions`),
  on the direct path to the unembedding? It measures a per-token copy of residues, not the sum's
  residue (the label), and it is blind to whatever a later MLP reads from the head.
- ``qk_w_rho_value`` / ``qk_w_pos0`` (:func:`qk_weight_fingerprint`): the same two questions
  asked of the weights alone: the readout query against every token value's key, through
  the embeddings (no data).
- ``probe_sum`` / ``probe_shortcut`` (:func:`probe_fingerprint`): can a linear probe read the
  sum residue (the label) / the shortcut residue from what a head (or an MLP) writes at the
  readout position? Cross-validated accuracy; no direct path to the unembedding is assumed,
  so a parity writer whose output only a later MLP reads is found. Its chance level is
  ``probe_*_chance`` (:func:`best_from`): on rows where the label and the shortcut disagree half
  the time, a component that writes only the shortcut still reads the label half the time
  (1/2 for binary AND ternary tasks, not 1/k).

Formulas (``E = W_E``, ``P = W_pos``, ``READ`` = the readout token at position ``length``;
``LN1`` = the layer's ``ln1`` when the model has layer norm, else the identity):

    qk_rho_value[l,h]   = Spearman over (sequence, key position j < length) of
                          (A[READ -> j] / sum_{j' < length} A[READ -> j'], x_j)
                          with A = blocks.l.attn.hook_pattern on the data
    attn_pos0[l,h]      = mean over sequences of that renormalized weight at j = 0
    s[v, p]             = (LN1(E[READ] + P[length]) W_Q + b_Q) . (LN1(E[v] + P[p]) W_K + b_K) / sqrt(d_head)
                          for every token value v and input position p < length
    qk_w_rho_value[l,h] = Spearman over v of mean_p s[v, p]
    qk_w_pos0[l,h]      = mean over v of softmax_p(s[v, :])[0]  (the readout query's weight on
                          position 0 in a sequence of ``length`` copies of v, readout key excluded)
    ov_rho_residue[l,h] = mean over classes c of Spearman over token occurrences of
                          ((LN1(E[x] + P[p]) W_V + b_V) W_O . u_c, [x mod k == c])
                          (x: the token itself, not the sequence; u_c: the direct path to class c)
    probe_*[l,h]        = K-fold cross-validated accuracy of a ridge least-squares probe
                          (one-hot targets, intercept, standardized features) reading the target
                          from blocks.l.attn.hook_result[:, :, length, h] (or hook_mlp_out[:, :, length])
    probe_*_chance      = sum over values v of the other target of max_c #{rows: other = v, target = c} / rows

For layers > 0 the weight-based fingerprints (``qk_w_*``, ``ov_rho_residue``) use the same
embedding inputs: a direct-path approximation that ignores what earlier layers wrote.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import rankdata
from torch import Tensor

from seedlab.shortcut.model import EnsembleTransformer


def spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman rho along the last axis (average ranks for ties); nan where either side is constant."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    va, vb = (ra * ra).sum(-1), (rb * rb).sum(-1)
    den = np.sqrt(va * vb)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(den > 0, (ra * rb).sum(-1) / np.where(den > 0, den, 1.0), np.nan)
    return rho


def check_batch(model: EnsembleTransformer, x: Tensor) -> None:
    """``x`` is a batch of every member's sequences: [S, batch, length]."""
    if x.dim() != 3 or x.shape[0] != model.S or x.shape[2] != model.length:
        raise ValueError(f"x: expected [S={model.S}, batch, length={model.length}], got {list(x.shape)}")


def qk_fingerprint(model: EnsembleTransformer, x: Tensor) -> dict[str, np.ndarray]:
    """QK fingerprints of every head from the readout query's attention pattern.

    For each layer and head, take the attention pattern of the READOUT query (the last
    position) over the ``length`` input keys, dropping the readout key itself and
    renormalizing the remaining weights to sum to 1 per sequence. Then:

    - ``qk_rho_value``: Spearman rho (average ranks for ties), pooled over all
      (sequence, key position) pairs of ``x``, between the weight a head puts on a key
      and that key token's integer value. High for a head that attends to large tokens
      (the max shortcut). nan if the weights or the values are constant.
    - ``attn_pos0``: the mean over sequences of the (renormalized) weight on position 0.
      High for a head that attends to the first element (the positional shortcut).

    x: [S, B, length] -> both arrays [S, layers, heads].
    """
    check_batch(model, x)
    S, Ly, H = model.S, model.cfg.layers, model.cfg.heads
    L = model.length
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(Ly)]
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names)
    rho = np.full((S, Ly, H), np.nan)
    pos0 = np.full((S, Ly, H), np.nan)
    values = x.detach().cpu().double().numpy().reshape(S, 1, -1)  # [S, 1, B*L]
    for l, name in enumerate(names):
        p = cache[name][:, :, :, -1, :L].double()  # [S, B, H, L]
        p = p / p.sum(-1, keepdim=True)
        pos0[:, l] = p[..., 0].mean(1).cpu().numpy()
        w = p.permute(0, 2, 1, 3).reshape(S, H, -1).cpu().numpy()  # [S, H, B*L]
        rho[:, l] = spearman(w, np.broadcast_to(values, w.shape))
    return {"qk_rho_value": rho, "attn_pos0": pos0}


def readout_directions(model: EnsembleTransformer) -> Tensor:
    """[S, d, C]: column c is class c's unembedding minus the mean of the other classes'.

    With layer norm, the final LN's linear part (centering, then the gain) is folded in:
    u -> center(w_ln_final * u). (The LN's division by the norm is ignored.)
    """
    W_U = model.unembed.W_U.detach().double()  # [S, d, C]
    C = W_U.shape[-1]
    others = (W_U.sum(-1, keepdim=True) - W_U) / max(C - 1, 1)
    u = W_U - others
    if model.cfg.layer_norm:
        u = model.ln_final.w.detach().double().unsqueeze(-1) * u
        u = u - u.mean(1, keepdim=True)
    return u


def ov_fingerprint(model: EnsembleTransformer, x: Tensor, modulus: int | None = None) -> np.ndarray:
    """OV fingerprint of every head: each token's residue on the direct path (OV circuit -> unembedding).

    It asks whether the head's value/output path, fed ONE token, writes that token's own residue
    class in the direction the unembedding reads for that class. It does not measure the sum's
    residue (the label): a head that attends to all tokens and copies their residues gives the
    readout their count per class, which a later MLP must turn into the sum's residue; and a head
    whose output only an MLP reads scores nan or ~0 here (the probes and the path patching of
    :mod:`seedlab.shortcut.interventions` see those).

    For every token occurrence (sequence b, input position p) of ``x`` the head's input is
    the token's layer-0 residual contribution ``W_E[x_bp] + W_pos[p]`` (per position, not
    averaged), passed through the layer's ``ln1`` when the model has layer norm. Its OV
    output is ``(input W_V + b_V) W_O`` ([d]; attention weights are not involved: this is
    the OV circuit alone). For layers > 0 the SAME token-embedding input is used: a
    direct-path approximation that ignores what earlier layers added to the residual.

    Projection onto the readout: for each class c, the direction
    ``u_c = W_U[:, c] - mean_{c' != c} W_U[:, c']`` (final-LN gain and centering folded in
    when the model has layer norm). The fingerprint is the mean over classes c of the
    Spearman rho, over all token occurrences, between the projection onto ``u_c`` and the
    indicator ``x_bp mod modulus == c``. For a binary task ``u_1 = W_U[:,1] - W_U[:,0] = -u_0``
    and both classes give the same value, so this is exactly Spearman(projection onto
    ``W_U[:,1] - W_U[:,0]``, parity). It is +1 for a head that writes each token's own
    residue class, -1 for one that writes against it; nan where constant.

    ``modulus`` defaults to the model's number of classes and must equal it (class c is
    residue c). Returns [S, layers, heads].
    """
    check_batch(model, x)
    S, Ly, H = model.S, model.cfg.layers, model.cfg.heads
    C = model.n_classes
    k = C if modulus is None else int(modulus)
    if k != C:
        raise ValueError(f"modulus: must equal the model's number of classes {C}, got {k}")
    L = model.length
    with torch.no_grad():
        W_E = model.embed.W_E.detach().double()
        idx = torch.arange(S, device=x.device).view(S, 1, 1)
        resid = W_E[idx, x] + model.pos_embed.W_pos.detach().double()[:, None, :L]  # [S, B, L, d]
        u = readout_directions(model)  # [S, d, C]
        residue = (x % k).reshape(S, 1, -1).cpu().numpy()  # [S, 1, B*L]
        out = np.full((S, Ly, H), np.nan)
        for l, blk in enumerate(model.blocks):
            a = blk.attn
            h = _ln1(model, l, resid)
            v = torch.einsum("sbpd,shde->sbphe", h, a.W_V.double()) + a.b_V.double()[:, None, None]
            o = torch.einsum("sbphe,shed->sbphd", v, a.W_O.double())  # [S, B, L, H, d]
            score = torch.einsum("sbphd,sdc->shcbp", o, u).reshape(S, H, C, -1).cpu().numpy()
            rhos = [spearman(score[:, :, c], np.broadcast_to(residue == c, score[:, :, c].shape)) for c in range(C)]
            out[:, l] = np.mean(rhos, axis=0)
    return out


def _ln1(model: EnsembleTransformer, layer: int, h: Tensor) -> Tensor:
    """``blocks.layer.ln1`` applied to [S, ..., d] (float64), or ``h`` itself without layer norm."""
    if not model.cfg.layer_norm:
        return h
    ln = model.blocks[layer].ln1
    shape = (h.shape[0],) + (1,) * (h.dim() - 2) + (h.shape[-1],)
    return F.layer_norm(h, h.shape[-1:]) * ln.w.double().view(shape) + ln.b.double().view(shape)


def qk_weight_fingerprint(model: EnsembleTransformer) -> dict[str, np.ndarray]:
    """QK fingerprints of every head from the weights alone (no data): the readout query against every value's key.

    The readout query is ``q = LN1(W_E[READ] + W_pos[length]) W_Q + b_Q``; the key of token
    value ``v`` at input position ``p`` is ``k[v, p] = LN1(W_E[v] + W_pos[p]) W_K + b_K``
    (positional terms included: each key carries its own position's embedding), and
    ``s[v, p] = q . k[v, p] / sqrt(d_head)`` is the pre-softmax score. Then:

    - ``qk_w_rho_value``: Spearman rho over the ``vocab`` values between ``mean_p s[v, p]`` and
      ``v``: +1 for a head whose query prefers larger tokens (the max shortcut); nan if constant.
    - ``qk_w_pos0``: the mean over ``v`` of ``softmax_p(s[v, :])[0]``, the weight the readout
      query would put on position 0 of a sequence of ``length`` copies of ``v`` (readout key
      excluded, as in ``attn_pos0``); ``1/length`` for a head blind to position.

    Layers > 0 use the same embedding inputs (direct path). Returns both as [S, layers, heads].
    """
    S, Ly, H, L, V = model.S, model.cfg.layers, model.cfg.heads, model.length, model.vocab
    rho = np.full((S, Ly, H), np.nan)
    pos0 = np.full((S, Ly, H), np.nan)
    with torch.no_grad():
        W_E, W_pos = model.embed.W_E.detach().double(), model.pos_embed.W_pos.detach().double()
        key_in = W_E[:, :V, None, :] + W_pos[:, None, :L, :]  # [S, V, L, d]
        query_in = W_E[:, V] + W_pos[:, L]  # [S, d]
        values = np.arange(V, dtype=np.float64)
        for l, blk in enumerate(model.blocks):
            a = blk.attn
            q = torch.einsum("sd,shde->she", _ln1(model, l, query_in), a.W_Q.double()) + a.b_Q.double()
            k = torch.einsum("svpd,shde->svphe", _ln1(model, l, key_in), a.W_K.double()) + a.b_K.double()[:, None, None]
            s_ = torch.einsum("she,svphe->shvp", q, k) / np.sqrt(a.W_Q.shape[-1])  # [S, H, V, L]
            rho[:, l] = spearman(s_.mean(-1).cpu().numpy(), values)
            pos0[:, l] = s_.softmax(-1)[..., 0].mean(-1).cpu().numpy()
    return {"qk_w_rho_value": rho, "qk_w_pos0": pos0}


def readout_writes(model: EnsembleTransformer, x: Tensor, chunk: int = 1024) -> Tensor:
    """[S, layers, heads + 1, B, d]: what each head (``hook_result``) and each MLP (``hook_mlp_out``,
    last index) writes at the readout position, on the batch ``x`` [S, B, length] (``chunk`` rows at a time)."""
    check_batch(model, x)
    names = []
    for l in range(model.cfg.layers):
        names += [f"blocks.{l}.attn.hook_result", f"blocks.{l}.hook_mlp_out"]
    out = []
    for i in range(0, x.shape[1], chunk):
        with torch.no_grad():
            _, cache = model.run_with_cache(x[:, i : i + chunk], names)
        per_layer = []
        for l in range(model.cfg.layers):
            heads = cache[f"blocks.{l}.attn.hook_result"][:, :, -1].permute(0, 2, 1, 3)  # [S, H, B, d]
            mlp = cache[f"blocks.{l}.hook_mlp_out"][:, None, :, -1]  # [S, 1, B, d]
            per_layer.append(torch.cat([heads, mlp], 1))
        out.append(torch.stack(per_layer, 1).double())
    return torch.cat(out, 3)


def best_from(feature: Tensor, target: Tensor, n_classes: int) -> np.ndarray:
    """[S]: the accuracy of the best classifier of ``target`` that sees ``feature`` alone (both [S, B] in 0..n_classes-1).

    For each value of ``feature``, predict its most frequent ``target`` on these rows (in-sample:
    n_classes^2 cells, negligible optimism at hundreds of rows). The chance level of a probe of
    ``target`` from a component that writes ``feature`` and nothing else, e.g. the sum residue
    from the shortcut residue; it includes the majority-class guess.
    """
    feature, target = torch.as_tensor(feature).long(), torch.as_tensor(target).long()
    S, B = target.shape
    counts = torch.zeros(S, n_classes * n_classes, dtype=torch.float64, device=target.device)
    counts.scatter_add_(1, feature * n_classes + target, torch.ones(S, B, dtype=torch.float64, device=target.device))
    return (counts.view(S, n_classes, n_classes).max(-1).values.sum(-1) / B).cpu().numpy()


def probe_accuracy(
    features: Tensor, labels: Tensor, n_classes: int, folds: int = 5, ridge: float = 1e-3, seed: int = 0
) -> np.ndarray:
    """Cross-validated accuracy of a linear probe, batched: features [..., n, d], labels [..., n] -> [...].

    The probe: standardize each feature on the training folds (a constant feature stays 0),
    regress the one-hot class indicators on them with an intercept by ridge least squares
    (penalty ``ridge * n_train`` on standardized features), predict the argmax. Rows are dealt
    into ``folds`` folds by a fixed permutation (``seed``), the same for every batch entry;
    each row is predicted by the probe fitted on the other folds, and the accuracy is over all
    rows. A probe of features that carry nothing predicts its training folds' majority class
    (about the majority class's share: chance).
    """
    *batch, n, d = features.shape
    if labels.shape != (*batch, n):
        raise ValueError(f"labels: expected {[*batch, n]}, got {list(labels.shape)}")
    if not 2 <= folds <= n:
        raise ValueError(f"folds: must be in [2, n={n}], got {folds}")
    X = features.reshape(-1, n, d).double()
    y = labels.reshape(-1, n).long().to(X.device)
    Y = F.one_hot(y, n_classes).double()
    fold = torch.as_tensor(np.random.default_rng(seed).permutation(n) % folds, device=X.device)
    correct = torch.zeros(X.shape[0], dtype=torch.float64, device=X.device)
    eye = torch.eye(d, dtype=torch.float64, device=X.device)
    for f in range(folds):
        tr, te = fold != f, fold == f
        Xtr, Ytr = X[:, tr], Y[:, tr]
        mu, sd = Xtr.mean(1, keepdim=True), Xtr.std(1, keepdim=True)
        sd = torch.where(sd > 1e-12 * (1 + mu.abs()), sd, torch.ones_like(sd))
        Z = (Xtr - mu) / sd
        ybar = Ytr.mean(1, keepdim=True)
        W = torch.linalg.solve(Z.transpose(1, 2) @ Z + ridge * int(tr.sum()) * eye, Z.transpose(1, 2) @ (Ytr - ybar))
        pred = (((X[:, te] - mu) / sd) @ W + ybar).argmax(-1)
        correct += (pred == y[:, te]).sum(1).double()
    return (correct / n).reshape(batch).cpu().numpy()


def probe_fingerprint(
    model: EnsembleTransformer, x: Tensor, targets: Mapping[str, Tensor], folds: int = 5
) -> dict[str, np.ndarray]:
    """Linear-probe fingerprints of every head and MLP: ``probe_{name}`` and ``probe_{name}_chance``, [S, layers, heads + 1].

    For each component, the features are its write at the readout position
    (:func:`readout_writes`); each target (``targets[name]``, [S, B] integers in
    ``0..n_classes-1``, e.g. the sum residue and the shortcut residue) gets the
    cross-validated accuracy of :func:`probe_accuracy`. A head that writes the maximum's
    parity into a direction only an MLP reads scores high on the shortcut target although
    its projection on the unembedding is 0. Use a batch where the targets disagree (val and
    adv rows together): on val alone the label and the shortcut are the same column.

    ``probe_{name}_chance`` (the same for every component) is the best accuracy reached from
    any OTHER target alone (:func:`best_from`; the majority class with a single target): a
    probe of the sum residue must beat what the shortcut residue alone gives, which on val+adv
    rows is 1/2 for ternary tasks too, not 1/3.
    """
    writes = readout_writes(model, x)  # [S, Ly, H+1, B, d]
    S, Ly, Hp, B, _ = writes.shape
    C, out = model.n_classes, {}
    targets = {name: torch.as_tensor(t) for name, t in targets.items()}
    for name, t in targets.items():
        if t.shape != (S, B):
            raise ValueError(f"targets[{name!r}]: expected [S={S}, B={B}], got {list(t.shape)}")
        labels = t[:, None, None, :].expand(S, Ly, Hp, B)
        out[f"probe_{name}"] = probe_accuracy(writes, labels, C, folds=folds)
        chance = np.max([best_from(u, t, C) for other, u in targets.items() if other != name] or [best_from(0 * t, t, C)], 0)
        out[f"probe_{name}_chance"] = np.broadcast_to(chance[:, None, None], (S, Ly, Hp))
    return out
