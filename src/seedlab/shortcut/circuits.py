"""Circuit analyses of a trained ensemble: QK/OV fingerprints, ablation, activation patching.

Everything is computed for all S members of an :class:`EnsembleTransformer` at once and
returned as numpy arrays with the member axis first: ``[S, layers, heads]`` for the
fingerprints, ``[S, layers, heads + 1]`` for ablation and patching, where the extra last
index is the layer's MLP.

Components (for ablation and patching):
    head ``(l, h)``  -> ``blocks.l.attn.hook_result[..., h, :]`` (the head's write into the
                        residual stream, before the shared bias b_O), all positions;
    MLP ``l``        -> ``blocks.l.hook_mlp_out``, all positions.

Every forward pass here (the clean reference as well as the ablated/patched ones) runs with
the same hooks registered on all those points, so the clean and the intervened runs take
the same code path: a replacement by identical values changes the logits by exactly 0.

:func:`analyze_run` / :func:`write_circuits` apply everything to each checkpoint of a run
folder and write ``circuits.parquet`` (one row per member, epoch, layer, head; head = -1
is the MLP row).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.stats import rankdata
from torch import Tensor

from seedlab.errors import SeedlabError
from seedlab.shortcut.model import EnsembleTransformer

COLUMNS = [
    "member",
    "epoch",
    "layer",
    "head",
    "qk_rho_value",
    "attn_pos0",
    "ov_rho_residue",
    "zero_ablation_val",
    "zero_ablation_adv",
    "mean_ablation_val",
    "mean_ablation_adv",
    "patch_val_to_adv",
    "patch_adv_to_val",
]


# --------------------------------------------------------------------------- helpers
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


def _dims(model: EnsembleTransformer) -> tuple[int, int, int]:
    return model.S, model.cfg.layers, model.cfg.heads


def _check_x(model: EnsembleTransformer, x: Tensor) -> None:
    if x.dim() != 3 or x.shape[0] != model.S or x.shape[2] != model.length:
        raise ValueError(f"x: expected [S={model.S}, batch, length={model.length}], got {list(x.shape)}")


def _component_hooks(model: EnsembleTransformer) -> list[str]:
    names = []
    for l in range(model.cfg.layers):
        names += [f"blocks.{l}.attn.hook_result", f"blocks.{l}.hook_mlp_out"]
    return names


def _run(
    model: EnsembleTransformer, x: Tensor, layer: int | None = None, head: int = 0, value: Tensor | None = None
) -> Tensor:
    """Logits [S, B, C] with every component hook registered; optionally one component replaced.

    ``head`` in ``0..H-1`` replaces ``hook_result[..., head, :]`` of ``layer`` by ``value``
    (broadcastable to [S, B, pos, d]); ``head == H`` replaces the layer's ``hook_mlp_out``.
    """
    H = model.cfg.heads
    target = None
    if layer is not None:
        target = f"blocks.{layer}.attn.hook_result" if head < H else f"blocks.{layer}.hook_mlp_out"

    def fn(act: Tensor, name: str) -> Tensor | None:
        if name != target:
            return None
        if head < H:
            act = act.clone()
            act[..., head, :] = value
            return act
        return value.expand_as(act).clone()

    with torch.no_grad():
        return model.run_with_hooks(x, [(n, fn) for n in _component_hooks(model)])


def _cache(model: EnsembleTransformer, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    with torch.no_grad():
        return model.run_with_cache(x, _component_hooks(model))


def _component(cache: dict[str, Tensor], layer: int, head: int, H: int) -> Tensor:
    """One component's activation [S, B, pos, d] from a cache of :func:`_cache`."""
    if head < H:
        return cache[f"blocks.{layer}.attn.hook_result"][..., head, :]
    return cache[f"blocks.{layer}.hook_mlp_out"]


def _accuracy(logits: Tensor, y: Tensor) -> Tensor:
    return (logits.argmax(-1) == y).double().mean(1)


def logit_diff(logits: Tensor, y: Tensor) -> Tensor:
    """Per row: correct-class logit minus the largest other logit. [S, B, C], [S, B] -> [S, B]."""
    correct = logits.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    other = logits.scatter(-1, y.unsqueeze(-1), float("-inf")).max(-1).values
    return (correct - other).double()


# --------------------------------------------------------------------------- fingerprints
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
    _check_x(model, x)
    S, Ly, H = _dims(model)
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


def _readout_directions(model: EnsembleTransformer) -> Tensor:
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
    _check_x(model, x)
    S, Ly, H = _dims(model)
    C = model.n_classes
    k = C if modulus is None else int(modulus)
    if k != C:
        raise ValueError(f"modulus: must equal the model's number of classes {C}, got {k}")
    L = model.length
    with torch.no_grad():
        W_E = model.embed.W_E.detach().double()
        idx = torch.arange(S, device=x.device).view(S, 1, 1)
        resid = W_E[idx, x] + model.pos_embed.W_pos.detach().double()[:, None, :L]  # [S, B, L, d]
        u = _readout_directions(model)  # [S, d, C]
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


# --------------------------------------------------------------------------- ablation
def ablate(model: EnsembleTransformer, x: Tensor, y: Tensor, kind: str = "zero") -> np.ndarray:
    """Accuracy change from ablating each head's output and each layer's MLP output.

    ``kind="zero"`` replaces the component's activation (all positions) by 0;
    ``kind="mean"`` by its mean over the batch of ``x`` (per member and position) in the
    clean run. Returns ``ablated accuracy - clean accuracy`` on (x, y), shape
    [S, layers, heads + 1] (last index: the MLP). Negative = the component was needed.
    """
    if kind not in ("zero", "mean"):
        raise ValueError(f"kind: must be 'zero' or 'mean', got {kind!r}")
    _check_x(model, x)
    S, Ly, H = _dims(model)
    base_logits, cache = _cache(model, x)
    base = _accuracy(base_logits, y)
    out = np.zeros((S, Ly, H + 1))
    for l in range(Ly):
        for h in range(H + 1):
            act = _component(cache, l, h, H)
            value = torch.zeros_like(act) if kind == "zero" else act.mean(1, keepdim=True).expand_as(act)
            out[:, l, h] = (_accuracy(_run(model, x, l, h, value), y) - base).cpu().numpy()
    return out


# --------------------------------------------------------------------------- patching
def patch_delta(
    model: EnsembleTransformer, x_src: Tensor, x_dst: Tensor, y_dst: Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """The two parts of :func:`patch`: (moved [S, layers, heads+1], full [S]).

    ``moved = mean_i ld(patched)_i - mean_i ld(dst)_i`` and ``full = mean_i ld(src)_i - mean_i ld(dst)_i``,
    every logit difference ``ld`` taken against ``y_dst`` (see :func:`patch`).
    """
    _check_x(model, x_src)
    _check_x(model, x_dst)
    if x_src.shape != x_dst.shape or y_dst.shape != x_dst.shape[:2]:
        raise ValueError(
            f"patch: x_src {list(x_src.shape)}, x_dst {list(x_dst.shape)} and y_dst {list(y_dst.shape)}"
            " must pair row i with row i"
        )
    S, Ly, H = _dims(model)
    src_logits, cache = _cache(model, x_src)
    dst_logits = _run(model, x_dst)
    ld_dst = logit_diff(dst_logits, y_dst).mean(1)
    full = (logit_diff(src_logits, y_dst).mean(1) - ld_dst).cpu().numpy()
    moved = np.zeros((S, Ly, H + 1))
    for l in range(Ly):
        for h in range(H + 1):
            patched = _run(model, x_dst, l, h, _component(cache, l, h, H))
            moved[:, l, h] = (logit_diff(patched, y_dst).mean(1) - ld_dst).cpu().numpy()
    return moved, full


def patch(model: EnsembleTransformer, x_src: Tensor, x_dst: Tensor, y_dst: Tensor, eps: float = 1e-9) -> np.ndarray:
    """Cross-split activation patching: the fraction of the logit difference each component moves.

    Row i of ``x_src`` is paired with row i of ``x_dst`` (same shape [S, B, length]).
    ``ld(logits)_i = logits_i[y_dst_i] - max_{c != y_dst_i} logits_i[c]`` (correct-class
    logit minus the best other class, always w.r.t. the DESTINATION labels). Runs:

    - dst:     the model on ``x_dst``;
    - src:     the model on ``x_src`` (its logits scored against ``y_dst``: where a full
               transplant of the source computation would take the destination);
    - patched: the model on ``x_dst`` with one component's activation (all positions)
               replaced by its activation in the src run (row i from row i).

    ``fraction = (mean_i ld(patched) - mean_i ld(dst)) / (mean_i ld(src) - mean_i ld(dst))``,
    per member (a ratio of batch means, not a mean of per-row ratios). 1 = this component
    alone carries the whole src-vs-dst difference, 0 = none of it; it may leave [0, 1]. When
    ``|denominator| <= eps`` the fraction is nan: in particular ``x_src == x_dst`` gives nan
    (and its numerator, see :func:`patch_delta`, is exactly 0). Returns [S, layers, heads + 1].
    """
    moved, full = patch_delta(model, x_src, x_dst, y_dst)
    den = full[:, None, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.abs(den) > eps, moved / np.where(np.abs(den) > eps, den, 1.0), np.nan)


# --------------------------------------------------------------------------- run folders
def _load_checkpoint(path: Path, cfg, n_classes_of) -> tuple[EnsembleTransformer, list, int]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    from seedlab.shortcut.config import Member

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    members = [Member(**m) for m in json.loads(meta["members"])] if "members" in meta else cfg.expand()
    epoch = int(meta["epoch"]) if "epoch" in meta else int(path.stem.split("-")[-1])
    model = EnsembleTransformer(cfg.model, len(members), cfg.data.vocab, cfg.data.length, n_classes_of(members))
    model.load_state_dict(load_file(str(path)))
    model.eval()
    return model, members, epoch


def analyze_run(run_dir: str | Path, n: int = 512) -> pd.DataFrame:
    """All circuit measures for every checkpoint of a run folder, as one long DataFrame.

    Data: the first ``m = min(n, n_val, n_adv)`` rows of each member's validation split
    (all shortcut-consistent) and adversarial split (all anti-shortcut); the same rows
    serve ablation and the row-paired patching. Fingerprints (``qk_rho_value``,
    ``attn_pos0``, ``ov_rho_residue``) are computed on the val and adv rows together.
    ``*_ablation_{val,adv}`` are accuracy changes (ablated - clean) on that split;
    ``patch_val_to_adv`` patches val (source) activations into adv (destination) runs and
    ``patch_adv_to_val`` the reverse (fractions as defined in :func:`patch`).

    One row per (member, epoch, layer, head) with head in 0..H-1 and head = -1 for the
    layer's MLP (fingerprint columns are nan on MLP rows). Columns: :data:`COLUMNS`.
    """
    from seedlab.config import load_yaml, parse
    from seedlab.shortcut.config import EnsembleConfig
    from seedlab.shortcut.tasks import get_task
    from seedlab.shortcut.train import member_data

    run_dir = Path(run_dir)
    ckpts = sorted((run_dir / "checkpoints").glob("epoch-*.safetensors"))
    if not ckpts:
        raise SeedlabError(f"{run_dir}: no checkpoints (set train.checkpoint_epochs)")
    cfg = parse(EnsembleConfig, load_yaml(run_dir / "config.yaml"))
    n_classes_of = lambda members: get_task(members[0].task).n_classes  # noqa: E731
    frames = []
    data_for: dict[str, dict] = {}
    for path in ckpts:
        model, members, epoch = _load_checkpoint(path, cfg, n_classes_of)
        key = json.dumps([(m.task, m.ratio) for m in members])
        if key not in data_for:
            data_for[key] = member_data(cfg, members)
        data = data_for[key]
        m = min(n, data["val"][0].shape[1], data["adv"][0].shape[1])
        xv, yv = data["val"][0][:, :m], data["val"][1][:, :m]
        xa, ya = data["adv"][0][:, :m], data["adv"][1][:, :m]
        both = torch.cat([xv, xa], 1)
        qk = qk_fingerprint(model, both)
        ov = ov_fingerprint(model, both, n_classes_of(members))
        cols = {
            "zero_ablation_val": ablate(model, xv, yv, "zero"),
            "zero_ablation_adv": ablate(model, xa, ya, "zero"),
            "mean_ablation_val": ablate(model, xv, yv, "mean"),
            "mean_ablation_adv": ablate(model, xa, ya, "mean"),
            "patch_val_to_adv": patch(model, xv, xa, ya),
            "patch_adv_to_val": patch(model, xa, xv, yv),
        }
        S, Ly, H = _dims(model)
        pad = lambda a: np.concatenate([a, np.full((S, Ly, 1), np.nan)], -1)  # noqa: E731  (MLP rows: nan)
        fp = {"qk_rho_value": pad(qk["qk_rho_value"]), "attn_pos0": pad(qk["attn_pos0"]), "ov_rho_residue": pad(ov)}
        s_, l_, h_ = np.meshgrid(np.arange(S), np.arange(Ly), np.arange(H + 1), indexing="ij")
        df = pd.DataFrame(
            {
                "member": s_.ravel(),
                "epoch": epoch,
                "layer": l_.ravel(),
                "head": np.where(h_ == H, -1, h_).ravel(),
                **{k: v.ravel() for k, v in fp.items()},
                **{k: v.ravel() for k, v in cols.items()},
            }
        )
        frames.append(df[COLUMNS])
    out = pd.concat(frames, ignore_index=True)
    return out.astype({"member": "int64", "epoch": "int64", "layer": "int64", "head": "int64"})


def write_circuits(run_dir: str | Path, n: int = 512) -> Path:
    """:func:`analyze_run` written to ``run_dir/circuits.parquet``; returns that path.

    A sweep folder is analyzed job by job (jobs with checkpoints), with the sweep's global
    member ids, as in its summary.parquet.
    """
    from seedlab.shortcut.sweep import finished_jobs
    from seedlab.store import write_parquet

    run_dir = Path(run_dir)
    if not (run_dir / "sweep.yaml").is_file():
        return write_parquet(run_dir / "circuits.parquet", analyze_run(run_dir, n=n))
    parts = []
    for key, folder, offset in finished_jobs(run_dir):
        if any((folder / "checkpoints").glob("epoch-*.safetensors")):
            df = analyze_run(folder, n=n)
            df["member"] += offset
            df.insert(0, "job", key)
            parts.append(df)
    if not parts:
        raise SeedlabError(f"{run_dir}: no checkpoints in any finished job (set train.checkpoint_epochs)")
    return write_parquet(run_dir / "circuits.parquet", pd.concat(parts, ignore_index=True))
