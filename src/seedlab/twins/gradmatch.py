"""Gradient matching: how much one injected passage changes the full-batch gradient.

At the injection step ``s`` of seed ``k`` every condition holds the same weights (the twin's
``step-<s>.safetensors``) and sees the same batch ``get_batch(train, k, s)``; an injected
condition differs only in row ``injection_row``. With the trainer's loss (masked CE *sum*
over the batch divided by its ``N`` target tokens),

    g_base = ∇ L(ordinary batch)              L = Σ_rows CE / N,             N  = B·T
    g_p    = ∇ L(batch with passage p)        L = (Σ_rest CE + Σ_p CE) / N', N' = (B-1)·T + len(p) - 1
    Δ_p    = g_p - g_base = G_rest·(1/N' - 1/N) + G_p/N' - G_row/N

where ``G_rest``, ``G_row`` and ``G_p`` are gradients of CE *sums* (the other rows, the
ordinary row, the passage row). So the other B-1 rows are differentiated once per seed and
every candidate costs one row; the combination is done in float64, which keeps ``Δ`` (about
1/B of ``g``) free of the cancellation that ``g_p - g_base`` in float32 would suffer. The
gradients are the raw ones, before the trainer's gradient clipping and AdamW; the model runs
in float32 (even for a ``precision: bf16`` run) in eval mode (dropout off).

The paper wrote its two fluent passages so that their deltas were nearly equal in size
(they "differed by 0.14%"): ``rel_norm_diff = |‖Δa‖ - ‖Δb‖| / mean(‖Δa‖, ‖Δb‖)``. Also
reported: ``rel_vec_diff = ‖Δa - Δb‖ / mean(‖Δa‖, ‖Δb‖)`` and ``cosine(Δa, Δb)``. ``match``
computes them for every fabricated x attested candidate pair and seed, averages over seeds,
and picks the pair with the smallest mean ``rel_norm_diff``; ``DIR/gradmatch.parquet``
holds the pairs (one row per seed and pair, plus the seed mean with ``seed`` null).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from seedlab.errors import SeedlabError
from seedlab.store import write_parquet
from seedlab.twins.batches import check_passage, get_batch, inject
from seedlab.twins.config import TwinsConfig
from seedlab.twins.distributed import World
from seedlab.twins.model import GPT, masked_ce_sum

#: candidate conditions, in the order pairs are formed (fabricated x attested)
SIDES = ("fluent-fabricated", "fluent-attested")


@dataclass
class Delta:
    """One passage's gradient delta: ``vec`` (float64, flattened over ``model.parameters()``) and norms."""

    vec: torch.Tensor
    norm: float  # ‖Δ‖₂
    grad_norm: float  # ‖g_p‖₂ (the trainer clips the gradient to grad_clip before AdamW)
    base_grad_norm: float  # ‖g_base‖₂
    n_targets: int  # N', the injected batch's target tokens


@contextlib.contextmanager
def _deterministic(device: torch.device):
    """Deterministic kernels on CUDA (the trainer's setting), restored afterwards."""
    if device.type != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _flat_grad(model: GPT, loss: torch.Tensor) -> torch.Tensor:
    params = list(model.parameters())
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double() for p, g in zip(params, grads)])


def _ce_sum_grad(model: GPT, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, micro: int) -> tuple[torch.Tensor, float]:
    """∇ of the masked CE *sum* over the rows of (x, y, mask), ``micro`` rows per forward; and the sum."""
    device = next(model.parameters()).device
    total, value = None, 0.0
    for i in range(0, x.shape[0], micro):
        xs, ys, ms = (t[i : i + micro].to(device) for t in (x, y, mask))
        logits, _ = model(xs)
        s = masked_ce_sum(logits, ys, ms)
        g = _flat_grad(model, s)
        total = g if total is None else total + g
        value += float(s.detach().double())
    assert total is not None
    return total, value


class BatchGradients:
    """The ordinary batch's gradients at one model state, reused by every candidate passage.

    ``x, y`` [B, T]: the batch; ``row``: the row a passage replaces; ``micro_batch``: rows
    per forward/backward for the other rows (memory only)."""

    def __init__(self, model: GPT, x: torch.Tensor, y: torch.Tensor, row: int, *, micro_batch: int | None = None):
        B, T = x.shape
        if not 0 <= row < B:
            raise SeedlabError(f"row: must be in 0 .. {B - 1}, got {row!r}")
        self.model, self.x, self.y, self.row = model, x, y, row
        self.device = next(model.parameters()).device
        self.n = B * T
        ones = torch.ones(B, T, dtype=torch.bool)
        rest = [i for i in range(B) if i != row]
        with _deterministic(self.device):
            if rest:
                self.g_rest, self.loss_rest = _ce_sum_grad(model, x[rest], y[rest], ones[rest], micro_batch or len(rest))
            else:
                self.g_rest, self.loss_rest = None, 0.0
            self.g_row, self.loss_row = _ce_sum_grad(model, x[row : row + 1], y[row : row + 1], ones[:1], 1)
        base = self.g_row if self.g_rest is None else self.g_rest + self.g_row
        self.base_norm = float(torch.linalg.vector_norm(base)) / self.n  # ‖g_base‖

    @property
    def loss(self) -> float:
        """The ordinary batch's mean loss (what the trainer records for this step)."""
        return (self.loss_rest + self.loss_row) / self.n

    def delta(self, passage: Sequence[int], pad_id: int) -> Delta:
        """``Δ_p = g_p - g_base`` for ``passage`` (token ids, at most block_size + 1) in the row."""
        xp, yp, mp = inject(self.x, self.y, self.row, passage, pad_id)
        r = self.row
        with _deterministic(self.device):
            g_p, _ = _ce_sum_grad(self.model, xp[r : r + 1], yp[r : r + 1], mp[r : r + 1], 1)
        n_p = int(mp.sum())
        vec = g_p / n_p - self.g_row / self.n
        if self.g_rest is not None:
            vec = vec + self.g_rest * (1.0 / n_p - 1.0 / self.n)
        g = g_p if self.g_rest is None else self.g_rest + g_p  # n_p·g_p
        grad_norm = float(torch.linalg.vector_norm(g)) / n_p
        return Delta(vec, float(torch.linalg.vector_norm(vec)), grad_norm, self.base_norm, n_p)


def gradient_delta(
    model: GPT, x: torch.Tensor, y: torch.Tensor, row: int, passage: Sequence[int], pad_id: int, *, micro_batch: int | None = None
) -> Delta:
    """``Δ = ∇L(batch with passage in row) - ∇L(batch)``, the trainer's mean loss (see the module docstring).

    For several passages on one batch build :class:`BatchGradients` once and call ``delta``."""
    return BatchGradients(model, x, y, row, micro_batch=micro_batch).delta(passage, pad_id)


def pair_stats(a: Delta, b: Delta) -> dict[str, float]:
    """rel_norm_diff, rel_vec_diff (both relative to the mean norm) and cosine of two deltas."""
    mean = (a.norm + b.norm) / 2
    diff = 0.0 if a.vec is b.vec else float(torch.linalg.vector_norm(a.vec - b.vec))
    dot = float(torch.dot(a.vec, b.vec))
    return {
        "rel_norm_diff": abs(a.norm - b.norm) / mean if mean > 0 else math.nan,
        "rel_vec_diff": diff / mean if mean > 0 else math.nan,
        "cosine": dot / (a.norm * b.norm) if a.norm > 0 and b.norm > 0 else math.nan,
    }


# --------------------------------------------------------------------------- a run folder


@dataclass
class GradMatch:
    """What :func:`match` computed: per-candidate norms, per-pair statistics, the best pair."""

    norms: pd.DataFrame  # seed, condition, passage, tokens, norm, grad_norm, base_grad_norm, base_loss
    pairs: pd.DataFrame  # seed (null: mean over seeds), fabricated, attested, norm_*, rel_norm_diff, rel_vec_diff, cosine
    best: pd.Series  # the mean row with the smallest rel_norm_diff
    path: Path  # DIR/gradmatch.parquet

    @property
    def mean(self) -> pd.DataFrame:
        """The seed-mean pairs, best first."""
        return self.pairs[self.pairs["seed"].isna()].sort_values("rel_norm_diff", kind="stable").reset_index(drop=True)


def match(
    run_dir: str | Path,
    candidates: Mapping[str, Sequence[str | Path]] | None = None,
    *,
    seed: int | None = None,
    corpus: str | Path | None = None,
    device: str | None = None,
    loss_check: bool = True,
) -> GradMatch:
    """Gradient-delta matching of fabricated x attested candidate passages on a twins run.

    ``candidates``: ``{"fluent-fabricated": [files], "fluent-attested": [files]}`` (paths as
    given, relative to the cwd); a side left out (or ``None``: both) is the run's own passage,
    as it was trained (its token ids in ``DIR/inputs.json``, labelled ``inputs.json:<condition>``).
    ``seed``: one of the run's seeds (default: all of them; the mean is over the seeds used).
    ``corpus``: where the run's corpus is now, if it moved. ``device``: default the config's.
    ``loss_check``: compare the ordinary batch's loss with the twin's recorded loss at the
    injection step (a batch that is not the run's).

    Everything is checked (files, passage lengths, checkpoints) before any gradient is
    computed. Writes ``DIR/gradmatch.parquet`` (the pairs table) atomically."""
    from seedlab.twins.rundir import open_run

    run = open_run(run_dir, corpus)
    cfg, corp, gcfg = run.cfg, run.corpus, run.gcfg
    s, row = cfg.injection_step, cfg.injection_row
    # --- candidates: files, or the run's own passage
    given = dict(candidates or {})
    unknown = [c for c in given if c not in SIDES]
    if unknown:
        raise SeedlabError(f"candidates: conditions are {', '.join(SIDES)}, got {unknown[0]!r}")
    texts: dict[str, list[int]] = {}  # label -> token ids
    names: dict[str, list[str]] = {}  # condition -> labels, in input order
    for c in SIDES:
        if c in given:
            if not given[c]:
                raise SeedlabError(f"passages.{c}: give at least one candidate passage file")
            names[c] = [str(p) for p in given[c]]
            twice = [lab for i, lab in enumerate(names[c]) if lab in names[c][:i]]
            if twice:
                raise SeedlabError(f"passages.{c}: {twice[0]!r} is given twice")
            for p in given[c]:
                if not Path(p).is_file():
                    raise SeedlabError(f"passages.{c}: no such file {str(p)!r}")
                texts.setdefault(str(p), corp.encode(Path(p).read_text().strip()))
        elif c in run.passages:
            names[c] = [f"inputs.json:{c}"]
            texts[names[c][0]] = [int(i) for i in run.passages[c]]
        else:
            raise SeedlabError(f"passages.{c}: the run has no passage for it; give candidates")
        for label in names[c]:
            check_passage(len(texts[label]), gcfg.block_size, f"passages.{c} {label}")
    labels = [(c, lab) for c in SIDES for lab in names[c]]
    # --- seeds, and every seed's state at the injection step (verified against the manifest)
    if seed is not None and seed not in cfg.seeds:
        raise SeedlabError(f"seed: the run's seeds are {cfg.seeds}, got {seed!r}")
    seeds = list(cfg.seeds) if seed is None else [seed]
    states = {k: run.weights(k, "twin", s) for k in seeds}
    # --- gradients
    dev = World().device(device or cfg.device)
    norm_rows, pair_rows = [], []
    for k in seeds:
        model = GPT(gcfg)
        try:
            model.load_state_dict(states.pop(k), strict=True)
        except RuntimeError as err:
            raise SeedlabError(f"seed {k} twin step {s}: does not fit the run's model ({str(err).splitlines()[0]})") from None
        model = model.float().to(dev).eval()
        x, y = get_batch(corp.train, k, s, cfg.batch_size, gcfg.block_size)
        bg = BatchGradients(model, x, y, row, micro_batch=cfg.micro_batch)
        if loss_check:
            _check_loss(run.root, cfg, k, bg.loss)
        deltas = {key: bg.delta(ids, corp.eot_id) for key, ids in texts.items()}
        for c, key in labels:
            d = deltas[key]
            norm_rows.append({"seed": k, "condition": c, "passage": key, "tokens": len(texts[key]), "norm": d.norm,
                              "grad_norm": d.grad_norm, "base_grad_norm": d.base_grad_norm, "base_loss": bg.loss})
        for fa in names[SIDES[0]]:
            for at in names[SIDES[1]]:
                a, b = deltas[fa], deltas[at]
                pair_rows.append({"seed": k, "fabricated": fa, "attested": at,
                                  "norm_fabricated": a.norm, "norm_attested": b.norm, **pair_stats(a, b)})
        del deltas, bg, model
    per_seed = pd.DataFrame(pair_rows)
    cols = ["norm_fabricated", "norm_attested", "rel_norm_diff", "rel_vec_diff", "cosine"]
    mean = per_seed.groupby(["fabricated", "attested"], sort=False, as_index=False)[cols].mean()
    pairs = pd.concat([per_seed, mean.assign(seed=None)], ignore_index=True)[["seed", "fabricated", "attested", *cols]]
    pairs["seed"] = pairs["seed"].astype("Int64")
    best = mean.loc[int(np.argmin(mean["rel_norm_diff"].fillna(np.inf).to_numpy()))]  # first of ties, in input order
    out = write_parquet(run.root / "gradmatch.parquet", pairs)
    return GradMatch(norms=pd.DataFrame(norm_rows), pairs=pairs, best=best, path=out)


def _check_loss(run_dir: Path, cfg: TwinsConfig, seed: int, loss: float) -> None:
    """The ordinary batch's loss must be the twin's recorded loss at the injection step."""
    path = run_dir / f"seed-{seed}" / "twin" / "losses.parquet"
    if not path.is_file():  # the twin has not finished: nothing recorded to compare with
        return
    recorded = pd.read_parquet(path).set_index("step")["loss"]
    if cfg.injection_step not in recorded.index:
        return
    want = float(recorded.loc[cfg.injection_step])
    tol = 5e-2 if cfg.precision == "bf16" else 1e-4
    if not abs(loss - want) <= tol * max(1.0, abs(want)):
        raise SeedlabError(
            f"corpus: seed {seed}'s batch at step {cfg.injection_step} gives loss {loss:.6f}, the run recorded"
            f" {want:.6f} (not the corpus this run trained on?)"
        )
