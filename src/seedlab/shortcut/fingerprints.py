"""Fingerprints of every attention head: what its QK circuit attends to, what its OV circuit writes.

Computed for all S members of an :class:`EnsembleTransformer` at once and returned as numpy
arrays with the member axis first, ``[S, layers, heads]``:

- ``qk_rho_value`` / ``attn_pos0`` (:func:`qk_fingerprint`): does the readout query attend to
  large tokens (the max shortcut) or to position 0 (the first-element shortcut)?
- ``ov_rho_residue`` (:func:`ov_fingerprint`): does the head's value/output path write each
  token's residue class onto the readout directions (:func:`readout_directions`)?
"""

from __future__ import annotations

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
    """OV fingerprint of every head: does the head's value/output path write the token's residue?

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
            h = resid
            if model.cfg.layer_norm:
                w, b = blk.ln1.w.double()[:, None, None], blk.ln1.b.double()[:, None, None]
                h = F.layer_norm(h, h.shape[-1:]) * w + b
            v = torch.einsum("sbpd,shde->sbphe", h, a.W_V.double()) + a.b_V.double()[:, None, None]
            o = torch.einsum("sbphe,shed->sbphd", v, a.W_O.double())  # [S, B, L, H, d]
            score = torch.einsum("sbphd,sdc->shcbp", o, u).reshape(S, H, C, -1).cpu().numpy()
            rhos = [spearman(score[:, :, c], np.broadcast_to(residue == c, score[:, :, c].shape)) for c in range(C)]
            out[:, l] = np.mean(rhos, axis=0)
    return out
