"""Interventions on every component of an ensemble: ablations and activation patching.

Computed for all S members of an :class:`EnsembleTransformer` at once. Component measures are
numpy arrays ``[S, layers, heads + 1]``, the extra last index being the layer's MLP; head-path
measures (QK/OV ablations) are ``[S, layers, heads]``.

Components and paths (TransformerLens hook names):
    head ``(l, h)``  -> ``blocks.l.attn.hook_result[..., h, :]`` (the head's write into the
                        residual stream, before the shared bias b_O), all positions;
    MLP ``l``        -> ``blocks.l.hook_mlp_out``, all positions;
    QK path of a head -> ``blocks.l.attn.hook_pattern[:, :, h]`` (its attention pattern
                        ``A``, [S, B, q_pos, k_pos]);
    OV path of a head -> ``blocks.l.attn.hook_v[..., h, :]`` (its value vectors ``v_j``; the
                        head writes ``z_i W_O`` with ``z_i = sum_j A_ij v_j``).
    paths downstream of a component (:data:`PATHS`, :func:`path_edit`), by what the patched
    write reaches: ``total``, everything (the component's activation replaced);
    ``direct``, only the unembedding (the write is added to the last
    ``blocks.{L-1}.hook_resid_post``, which only ``ln_final`` reads); ``via_mlp``, only the
    inputs of the MLPs that read it (layers ``l..L-1`` for a head, ``l+1..L-1`` for an MLP):
    each such MLP is recomputed on ``blocks.l'.hook_resid_mid`` + the change, its output
    then flows on as usual; later attention layers and the unembedding see the write unpatched.

The logit difference of a row with label ``y`` is ``ld = logit[y] - max_{c != y} logit[c]``,
or ``logit[y] - logit[o]`` against a given other class ``o != y`` (:func:`logit_diff`);
accuracies are argmax accuracies. The measures:

- :func:`ablate` (``zero`` / ``mean``): ``acc(ablated) - acc(clean)`` when a component's
  activation is replaced by 0 / by its batch mean (per member and position).
- :func:`path_ablate`, per head, ``acc(ablated) - acc(clean)``:
  ``qk_uniform``: ``A := U``, uniform over the keys a query may see (``U_ij = 1/(i+1)`` for
  ``j <= i`` when causal, else ``1/P`` with ``P = length + 1`` keys, the readout included);
  ``qk_mean``: ``A := mean_b A_b``, the head's mean pattern over the batch (per member);
  both keep the OV path (the values are the input's own). ``ov_mean``: ``v_j :=
  mean_b v_{b,j}`` (per member and position ``j``); the pattern is the input's own, so the
  head still routes, but what it moves carries nothing about the input.
- :func:`patch` / :func:`patch_delta`: row-paired activation patching (row i of a source
  batch into row i of a destination batch), as a fraction of the full source-vs-destination
  difference of batch means. With unrelated rows (val row i into adv row i, which share
  neither label nor content) this is a *resample ablation* score, and the analyses name it so.
- :func:`pair_patching`: activation patching on matched counterfactual pairs of either kind
  (:mod:`seedlab.shortcut.pairs`: clean = shortcut-consistent with label ``y``, corrupt =
  anti-shortcut with label ``y'``; same-label pairs ``y' = y``, label-changing pairs ``y' != y``),
  scored per pair by the clean label's ``ld``, against ``y'`` when it differs (else against the
  best other class): ``gap_i = ld(clean_i) - ld(corrupt_i)``;
  clean -> corrupt: run ``corrupt_i`` with the component's activation from ``clean_i``,
  ``dld_i = ld(patched_i) - ld(corrupt_i)``, ``frac_i = dld_i / gap_i`` (1 = the component
  alone restores the clean behaviour);
  corrupt -> clean: run ``clean_i`` with the activation from ``corrupt_i``,
  ``dld_i = ld(patched_i) - ld(clean_i)``, ``frac_i = -dld_i / gap_i`` (1 = the component
  alone carries the corrupt behaviour). A pair with ``|gap_i| < MIN_GAP`` logits is flagged:
  its ``frac_i`` is nan (the model treats both sides alike: on same-label pairs a model that
  follows the rule, on label-changing pairs one that follows the shortcut; there is nothing to
  normalize by), its ``dld_i`` stays. :meth:`PairPatching.summary` gives per-pair quantiles.
  With ``path`` (:data:`PATHS`) the component is patched along that path only: for a linear
  readout of the component (no layer norm, linear MLPs, no later attention reading it) the
  ``direct`` and ``via_mlp`` changes add up to the ``total`` one.

Every forward pass here (the clean reference as well as the intervened ones) runs with the
same hooks registered on all those points (:func:`hooked_run`), so the clean and the
intervened runs take the same code path: a replacement by identical values changes the
logits by exactly 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from seedlab.shortcut.constants import MIN_GAP
from seedlab.shortcut.fingerprints import check_batch
from seedlab.shortcut.model import EnsembleTransformer

#: the per-pair quantiles :meth:`PairPatching.summary` reports
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
#: the head-path ablations of :func:`path_ablate`
PATH_ABLATIONS = ("qk_uniform", "qk_mean", "ov_mean")
#: the two patching directions of :func:`pair_patching`
DIRECTIONS = ("clean_to_corrupt", "corrupt_to_clean")
#: the paths along which :func:`pair_patching` patches a component (module docstring)
PATHS = ("total", "direct", "via_mlp")

Edit = Callable[[Tensor], Tensor]  # a replacement of one activation: act -> new act
Run = tuple[Tensor, dict[str, Tensor]]  # (logits, activations) of one clean run: :func:`cached_run`


def intervention_points(model: EnsembleTransformer) -> list[str]:
    """Every hook point an intervention may replace: each layer's ``hook_v``, ``hook_pattern``,
    ``hook_result``, ``hook_resid_mid``, ``hook_mlp_out`` and ``hook_resid_post``."""
    names = []
    for l in range(model.cfg.layers):
        a, b = f"blocks.{l}.attn", f"blocks.{l}"
        names += [f"{a}.hook_v", f"{a}.hook_pattern", f"{a}.hook_result", f"{b}.hook_resid_mid", f"{b}.hook_mlp_out",
                  f"{b}.hook_resid_post"]
    return names


def hooked_run(model: EnsembleTransformer, x: Tensor, edits: Mapping[str, Edit] | None = None) -> Tensor:
    """Logits [S, B, C] with every intervention point hooked; ``edits[name](act)`` replaces that activation."""
    edits = edits or {}

    def fn(act: Tensor, name: str) -> Tensor | None:
        edit = edits.get(name)
        return None if edit is None else edit(act)

    with torch.no_grad():
        return model.run_with_hooks(x, [(n, fn) for n in intervention_points(model)])


def cached_run(model: EnsembleTransformer, x: Tensor) -> Run:
    """The clean logits and the activation at every intervention point (the same code path as :func:`hooked_run`).

    The measures below take such a run of their input as ``clean=`` (or ``src=``/``dst=``) to
    share it; without one they compute it."""
    with torch.no_grad():
        return model.run_with_cache(x, intervention_points(model))


def set_slice(index: tuple, value: Tensor) -> Edit:
    """An edit writing ``value`` (broadcast) into ``act[index]`` of a copy."""

    def edit(act: Tensor) -> Tensor:
        out = act.clone()
        out[index] = value
        return out

    return edit


def head_index(h: int) -> tuple:
    """The index of head ``h`` in ``hook_result`` / ``hook_v`` ([..., head, d])."""
    return (Ellipsis, h, slice(None))


def component_edit(model: EnsembleTransformer, layer: int, head: int, value: Tensor) -> dict[str, Edit]:
    """Replace one component's activation by ``value`` (broadcastable to [S, B, pos, d]).

    ``head`` in ``0..H-1`` is ``hook_result[..., head, :]`` of ``layer``; ``head == H`` is its ``hook_mlp_out``.
    """
    if head < model.cfg.heads:
        return {f"blocks.{layer}.attn.hook_result": set_slice(head_index(head), value)}
    return {f"blocks.{layer}.hook_mlp_out": lambda act: value.expand_as(act).clone()}


def path_edit(model: EnsembleTransformer, layer: int, head: int, value: Tensor, path: str,
              dst: dict[str, Tensor] | None = None) -> dict[str, Edit]:
    """Replace one component's activation by ``value`` along ``path`` only (:data:`PATHS`, module docstring).

    ``total`` is :func:`component_edit`; ``direct`` and ``via_mlp`` patch the change ``value -
    act``, with ``act`` the component's activation in the unpatched run (from its cache ``dst``).
    """
    if path not in PATHS:
        raise ValueError(f"path: must be one of {', '.join(PATHS)}, got {path!r}")
    if path == "total":
        return component_edit(model, layer, head, value)
    delta = value - component(dst, layer, head, model.cfg.heads)
    if path == "direct":
        return {f"blocks.{model.cfg.layers - 1}.hook_resid_post": lambda act: act + delta}
    resid: dict[int, Tensor] = {}  # each reading MLP's input residual, recorded in the same run
    edits: dict[str, Edit] = {}
    for l in range(layer + (head == model.cfg.heads), model.cfg.layers):
        blk = model.blocks[l]
        edits[f"blocks.{l}.hook_resid_mid"] = lambda act, l=l: resid.update({l: act}) or act
        edits[f"blocks.{l}.hook_mlp_out"] = lambda act, l=l, blk=blk: model._mlp(blk.mlp, model._ln(resid[l] + delta, blk.ln2))
    return edits


def component(cache: dict[str, Tensor], layer: int, head: int, H: int) -> Tensor:
    """One component's activation [S, B, pos, d] from a cache of :func:`cached_run`."""
    if head < H:
        return cache[f"blocks.{layer}.attn.hook_result"][..., head, :]
    return cache[f"blocks.{layer}.hook_mlp_out"]


def accuracy(logits: Tensor, y: Tensor) -> Tensor:
    """Per member: the fraction of rows whose argmax is the label. [S, B, C], [S, B] -> [S]."""
    return (logits.argmax(-1) == y).double().mean(1)


def logit_diff(logits: Tensor, y: Tensor, other: Tensor | None = None) -> Tensor:
    """Per row: class ``y``'s logit minus class ``other``'s, or minus the largest other logit where ``other`` is
    None or equals ``y``. [S, B, C], [S, B] (, [S, B]) -> [S, B]."""
    pick = lambda c: logits.gather(-1, c.unsqueeze(-1)).squeeze(-1)
    rest = logits.scatter(-1, y.unsqueeze(-1), float("-inf")).max(-1).values
    if other is not None:
        rest = torch.where(other == y, rest, pick(other))
    return (pick(y) - rest).double()


# --------------------------------------------------------------------------- ablation
def ablate(model: EnsembleTransformer, x: Tensor, y: Tensor, kind: str = "zero", clean: Run | None = None) -> np.ndarray:
    """Accuracy change from ablating each head's output and each layer's MLP output.

    ``kind="zero"`` replaces the component's activation (all positions) by 0;
    ``kind="mean"`` by its mean over the batch of ``x`` (per member and position) in the
    clean run. Returns ``ablated accuracy - clean accuracy`` on (x, y), shape
    [S, layers, heads + 1] (last index: the MLP). Negative = the component was needed.
    """
    if kind not in ("zero", "mean"):
        raise ValueError(f"kind: must be 'zero' or 'mean', got {kind!r}")
    check_batch(model, x)
    S, Ly, H = model.S, model.cfg.layers, model.cfg.heads
    base_logits, cache = clean or cached_run(model, x)
    base = accuracy(base_logits, y)
    out = np.zeros((S, Ly, H + 1))
    for l in range(Ly):
        for h in range(H + 1):
            act = component(cache, l, h, H)
            value = torch.zeros_like(act) if kind == "zero" else act.mean(1, keepdim=True).expand_as(act)
            out[:, l, h] = (accuracy(hooked_run(model, x, component_edit(model, l, h, value)), y) - base).cpu().numpy()
    return out


def uniform_pattern(model: EnsembleTransformer, P: int, device: torch.device | str = "cpu") -> Tensor:
    """[P, P]: each query's weights spread evenly over the keys it may see (all P, or ``j <= i`` when causal)."""
    seen = torch.ones(P, P, device=device)
    if model.cfg.causal:
        seen = seen.tril()
    return seen / seen.sum(-1, keepdim=True)


def path_ablate(model: EnsembleTransformer, x: Tensor, y: Tensor, kind: str, clean: Run | None = None) -> np.ndarray:
    """Accuracy change from ablating one path (QK or OV) of each head: [S, layers, heads].

    ``kind``: ``qk_uniform`` (pattern -> uniform over the visible keys), ``qk_mean`` (pattern ->
    its mean over the batch of ``x``, per member), ``ov_mean`` (value vectors -> their mean
    over the batch, per member and position). See the module docstring. Negative = the path
    was needed.
    """
    if kind not in PATH_ABLATIONS:
        raise ValueError(f"kind: must be one of {', '.join(PATH_ABLATIONS)}, got {kind!r}")
    check_batch(model, x)
    S, Ly, H = model.S, model.cfg.layers, model.cfg.heads
    base_logits, cache = clean or cached_run(model, x)
    base = accuracy(base_logits, y)
    out = np.zeros((S, Ly, H))
    for l in range(Ly):
        pattern, v = cache[f"blocks.{l}.attn.hook_pattern"], cache[f"blocks.{l}.attn.hook_v"]
        for h in range(H):
            if kind == "ov_mean":
                edits = {f"blocks.{l}.attn.hook_v": set_slice(head_index(h), v[..., h, :].mean(1, keepdim=True))}
            else:
                A = uniform_pattern(model, pattern.shape[-1], pattern.device) if kind == "qk_uniform" else (
                    pattern[:, :, h].mean(1, keepdim=True))
                edits = {f"blocks.{l}.attn.hook_pattern": set_slice((slice(None), slice(None), h), A)}
            out[:, l, h] = (accuracy(hooked_run(model, x, edits), y) - base).cpu().numpy()
    return out


# --------------------------------------------------------------------------- patching
def patch_rows(
    model: EnsembleTransformer, x_src: Tensor, x_dst: Tensor, y: Tensor, src: Run | None = None, dst: Run | None = None,
    *, other: Tensor | None = None, path: str = "total",
) -> tuple[Tensor, Tensor, Tensor]:
    """Row-paired patching, per row: ``(ld_src [S, B], ld_dst [S, B], ld_patched [S, layers, heads+1, B])``.

    ``ld_patched[:, l, h, i]``: the run on ``x_dst`` row i with component (l, h) replaced by its
    activation on ``x_src`` row i (all positions), along ``path`` (:func:`path_edit`). Every
    ``ld`` is taken against ``y`` (and ``other``, :func:`logit_diff`).
    """
    check_batch(model, x_src)
    check_batch(model, x_dst)
    if x_src.shape != x_dst.shape or y.shape != x_dst.shape[:2]:
        raise ValueError(
            f"patch: x_src {list(x_src.shape)}, x_dst {list(x_dst.shape)} and y {list(y.shape)}"
            " must pair row i with row i"
        )
    S, Ly, H = model.S, model.cfg.layers, model.cfg.heads
    src_logits, cache = src or cached_run(model, x_src)
    if dst is None:
        dst = cached_run(model, x_dst) if path != "total" else (hooked_run(model, x_dst), None)
    ld = lambda logits: logit_diff(logits, y, other)
    ld_dst = ld(dst[0])
    patched = torch.zeros(S, Ly, H + 1, x_dst.shape[1], dtype=torch.float64, device=ld_dst.device)
    for l in range(Ly):
        for h in range(H + 1):
            patched[:, l, h] = ld(hooked_run(model, x_dst, path_edit(model, l, h, component(cache, l, h, H), path, dst[1])))
    return ld(src_logits), ld_dst, patched


def patch_delta(
    model: EnsembleTransformer, x_src: Tensor, x_dst: Tensor, y_dst: Tensor, src: Run | None = None, dst: Run | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The two parts of :func:`patch`: (moved [S, layers, heads+1], full [S]).

    ``moved = mean_i ld(patched)_i - mean_i ld(dst)_i`` and ``full = mean_i ld(src)_i - mean_i ld(dst)_i``,
    every logit difference ``ld`` taken against ``y_dst`` (see :func:`patch`).
    """
    ld_src, ld_dst, patched = patch_rows(model, x_src, x_dst, y_dst, src, dst)
    moved = patched.mean(-1) - ld_dst.mean(1)[:, None, None]
    return moved.cpu().numpy(), (ld_src.mean(1) - ld_dst.mean(1)).cpu().numpy()


def patch(
    model: EnsembleTransformer, x_src: Tensor, x_dst: Tensor, y_dst: Tensor, eps: float = 1e-9,
    src: Run | None = None, dst: Run | None = None,
) -> np.ndarray:
    """Row-paired activation patching: the fraction of the batch-mean logit difference each component moves.

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

    When the rows of the two batches are unrelated (they share neither label nor content),
    this is a resample-ablation score, not a counterfactual one: use :func:`pair_patching`.
    """
    moved, full = patch_delta(model, x_src, x_dst, y_dst, src, dst)
    den = full[:, None, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.abs(den) > eps, moved / np.where(np.abs(den) > eps, den, 1.0), np.nan)


@dataclass
class PairPatching:
    """Per-pair results of :func:`pair_patching` (numpy, float64)."""

    ld_clean: np.ndarray  # [S, B]: ld of the clean label (against the corrupt one, if it differs) on the clean sequence
    ld_corrupt: np.ndarray  # [S, B]: ... on the corrupt sequence
    patched: dict[str, np.ndarray]  # direction -> [S, layers, heads+1, B]: ld of the patched run

    @property
    def gap(self) -> np.ndarray:
        """[S, B]: ``ld(clean) - ld(corrupt)``, the denominator of every pair's fraction."""
        return self.ld_clean - self.ld_corrupt

    def dld(self, direction: str) -> np.ndarray:
        """[S, layers, heads+1, B]: the patched run's ld minus its unpatched run's (corrupt, or clean)."""
        base = self.ld_corrupt if direction == "clean_to_corrupt" else self.ld_clean
        return self.patched[direction] - base[:, None, None]

    def small_gap(self, min_gap: float = MIN_GAP) -> np.ndarray:
        """[S, B]: the flagged pairs, ``|gap| < min_gap``: too little difference to normalize by."""
        return np.abs(self.gap) < min_gap

    def fractions(self, direction: str, min_gap: float = MIN_GAP) -> np.ndarray:
        """[S, layers, heads+1, B]: each pair's fraction of its gap (nan for flagged pairs); 1 = the whole gap."""
        sign = 1.0 if direction == "clean_to_corrupt" else -1.0
        gap = self.gap[:, None, None]
        ok = ~self.small_gap(min_gap)[:, None, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ok, sign * self.dld(direction) / np.where(ok, gap, 1.0), np.nan)

    def summary(self, min_gap: float = MIN_GAP) -> dict[str, dict[str, np.ndarray]]:
        """direction -> statistic -> [S, layers, heads+1]: the per-pair distributions.

        ``n_pairs``, ``n_small_gap`` (flagged pairs); ``frac_q10 .. frac_q90`` and ``frac_mean``
        over the unflagged pairs' fractions; ``frac_ratio_of_means`` = ``sign * mean(dld) /
        mean(gap)`` over all pairs (nan when ``|mean(gap)| < min_gap``); ``dld_q25/q50/q75``
        (logits, all pairs); ``gap_q50``, ``ld_clean_q50``, ``ld_corrupt_q50`` (per member,
        repeated over components).
        """
        out = {}
        S, Ly, Hp, B = self.patched[DIRECTIONS[0]].shape
        rep = lambda a: np.broadcast_to(np.asarray(a, dtype=np.float64)[:, None, None], (S, Ly, Hp))
        mean_gap = self.gap.mean(1)
        for d in DIRECTIONS:
            frac, dld = self.fractions(d, min_gap), self.dld(d)
            sign = 1.0 if d == "clean_to_corrupt" else -1.0
            stats = {"n_pairs": rep(np.full(S, B)), "n_small_gap": rep(self.small_gap(min_gap).sum(1))}
            stats |= {f"frac_q{round(100 * q):02d}": _nanquantile(frac, q) for q in QUANTILES}
            stats["frac_mean"] = _nanmean(frac)
            ok = np.abs(mean_gap) >= min_gap
            with np.errstate(invalid="ignore", divide="ignore"):
                stats["frac_ratio_of_means"] = np.where(
                    ok[:, None, None], sign * dld.mean(-1) / np.where(ok, mean_gap, 1.0)[:, None, None], np.nan)
            stats |= {f"dld_q{round(100 * q):02d}": np.quantile(dld, q, axis=-1) for q in (0.25, 0.5, 0.75)}
            stats |= {"gap_q50": rep(np.median(self.gap, 1)), "ld_clean_q50": rep(np.median(self.ld_clean, 1)),
                      "ld_corrupt_q50": rep(np.median(self.ld_corrupt, 1))}
            out[d] = stats
        return out


def _nanquantile(a: np.ndarray, q: float) -> np.ndarray:
    """Quantile along the last axis ignoring nan; nan (no warning) where every value is nan."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(a, q, axis=-1)


def _nanmean(a: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(a, axis=-1)


def pair_patching(
    model: EnsembleTransformer, clean: Tensor, corrupt: Tensor, y: Tensor,
    clean_run: Run | None = None, corrupt_run: Run | None = None, *, y_corrupt: Tensor | None = None, path: str = "total",
) -> PairPatching:
    """Activation patching on matched counterfactual pairs, both directions, every component, every pair.

    ``clean`` [S, B, length] (shortcut-consistent), ``corrupt`` (anti-shortcut, row i the
    partner of clean row i), ``y`` [S, B] the clean labels, ``y_corrupt`` the corrupt ones
    (None: the same, as in same-label pairs); each component patched along ``path``. See the
    module docstring.
    """
    clean_run, corrupt_run = clean_run or cached_run(model, clean), corrupt_run or cached_run(model, corrupt)
    kw = {"other": y_corrupt, "path": path}
    ld_clean, ld_corrupt, to_corrupt = patch_rows(model, clean, corrupt, y, clean_run, corrupt_run, **kw)  # clean into corrupt
    _, _, to_clean = patch_rows(model, corrupt, clean, y, corrupt_run, clean_run, **kw)  # corrupt activations into clean runs
    np_ = lambda t: t.cpu().numpy()
    return PairPatching(np_(ld_clean), np_(ld_corrupt), {"clean_to_corrupt": np_(to_corrupt), "corrupt_to_clean": np_(to_clean)})
