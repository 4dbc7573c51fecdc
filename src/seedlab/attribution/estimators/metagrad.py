"""``metagrad``: the reverse mode of unroll's linearisation — every training row's metagradient, and every
candidate's first-order effect, from one backward pass through the twin's replayed run.

unroll (attribution/estimators/unroll.py, whose module doc states the step) writes the trainer's update at step t as a
map of the whole optimizer state, z_{t+1} = F_t(z_t), z = (θ, m, v) (plain SGD: z = θ), and carries a
tangent forward, one JVP per step and candidate. Here the same map is given the batch's per-row loss
weights w ∈ ℝ^B as a second input,

    z_{t+1} = F_t(z_t, w),   L_t(θ, w) = (Σ_i w_i ℓ_i(θ)) / N   (ℓ_i row i's CE sum, N = B·T; w = 1 the run),

and the *adjoint* of a query's loss at a horizon h, λ_t = ∂L_q(θ_h)/∂z_t, is carried backward:

    λ_h = (∇L_q(θ_h), 0, 0),      (λ_t, ∂L_q(θ_h)/∂w_{t,·}) = vjp(F_t at (z_t, w = 1))(λ_{t+1}).

**One step's VJP** (:class:`Update`, ``pull``). The step as torch computes it is the raw gradient g = ∇_θ L_t(θ, w),
torch's global-norm clip c = κg with κ = min(1, C/(‖g‖ + 1e-6)), then AdamW m' = β₁m + (1−β₁)c,
v' = β₂v + (1−β₂)c², θ' = θ(1 − lr·wd) − (lr/bc₁)·m'/(√(v'/bc₂) + ε) (bc_k = 1 − β_kᵗ, lr_t and t constants of
the step, not differentiated; SGD: θ' = θ − lr(c + wd·θ)). Everything after g is elementwise, so its adjoint is
written out by hand on the flat parameter vector, for every cotangent at once, and only g is left to autograd:
with λ_{t+1} = (λθ', λm', λv') and d = √(v'/bc₂) + ε,

    μ = λm' − λθ'·(lr/bc₁)/d,    ν = λv' + λθ'·(lr/bc₁)·m'/d² · 1/(2 bc₂ √(v'/bc₂))   (0 where v' = 0, as unroll's tangent)
    λm = β₁μ,   λv = β₂ν,   c̄ = (1−β₁)μ + 2(1−β₂)·c·ν   (SGD: c̄ = −lr·λθ'),
    ḡ = κc̄ where the clip does not act; where it acts (C/(‖g‖ + 1e-6) ≤ 1) ḡ = κ(c̄ − g·⟨g, c̄⟩/(‖g‖(‖g‖ + 1e-6))),
    λθ = (1 − lr·wd)·λθ' + H_t ḡ,      ∂L_q(θ_h)/∂w_{t,i} = ⟨ḡ, ∇ℓ_i(θ_t)⟩/N,

H_t the Hessian of L_t at θ_t: one forward and backward of the batch with the graph kept (torch's MATH attention:
the fused kernel has no second derivative), then per cotangent one backward of that graph (reverse over
reverse: ∂⟨ḡ, g⟩/∂(θ, w) gives H_tḡ and every row's weight derivative together). Each cotangent's backward is
its own (a loop, not vmapped): a query's adjoint is bitwise the same whichever other queries and horizons are
open beside it, so chunks of queries change no bit. :class:`WeightedStep` is the same step written as one
function for ``torch.func.vjp`` (the reference the hand-written adjoint is tested against, to float round-off).

- **Rows** — for every row (t, i) with t₀ ≤ t < h: ∂L_q(θ_h)/∂w_{t,i} at w = 1 (:attr:`Adjoints.rows`).
  Removing row i of step t changes L_q(θ_h) by ≈ −that value; up-weighting it by ε, by ε·that.
- **Candidates** — for a candidate c swapped into row r at s, its first-order effect ⟨λ_{s+1}, Δz_{s+1}(c)⟩
  with Δz_{s+1}(c) the *exact* change of the step at s, the very Δz unroll starts from
  (:func:`~seedlab.attribution.estimators.unroll.first_step`): forward and reverse mode of one linearisation, so
  it equals unroll's estimate at h up to float round-off (tests/attribution/test_metagrad.py).
- **Truncated** (``window`` W; the estimator ``metagrad-trunc``, ``attribute.metagrad_window``, default 10: the
  linear horizon measured at B 8, lr 1e-2, docs/assumptions.md): horizon h's adjoint is carried back W steps only,
  so a row (t, i) with h − t ≤ W (at most W updates older than the horizon) gets its metagradient, bitwise the full
  pass's, and an older row none: its predicted effect is 0 (so a group's prediction sums its young rows only). It
  costs at most W VJPs per horizon instead of h − t₀, and no replay past the last horizon it needs:
  :func:`metagrad` ``window`` for the swapped row at s, :func:`truncated_rows` for the run's own rows.

**Replay.** The adjoint is taken along the twin's trajectory bit for bit: the run is replayed by the bank's
own trainer, from the seed's initialisation (step 0: GPT ``init_from_seed`` and the (seed, t) batches of
lm/batches.py; for t₀ < s) or from the kept prefix (prefix.safetensors, the complete state at s), and
checked: at s every tensor of the complete state (weights, moments, step counts) against the prefix's
recorded hashes, and at every step the twin's manifest.json holds, the weights against it
(:func:`replay_check`); a mismatch (a corrupted or foreign prefix, another seed, another torch or thread
count) is a one-line error.

**Checkpoint-and-recompute.** The steps whose VJP is needed (t₀ .. H − 1, H the last horizon; with a window,
the union of [h − W, h)) are cut into segments of at most k (``every``) consecutive steps; the forward replay
keeps each segment's first complete state, and the backward pass, segment by segment from the last, recomputes
the segment's other states from it (each recomputed state's weights hashed against the forward replay's: bitwise
the same run) and runs the segment's VJPs in reverse. k = 1 keeps every state and recomputes nothing. Default
(``every`` None, :func:`plan`): the smallest k whose ⌈n/k⌉ + k − 1 kept states (n the steps needed) fit in
:data:`STATE_BUDGET` (1 GiB: every state of the mini bank's 200-update run, 3P·4 bytes ≈ 2.8 MB each), else
k = ⌈√n⌉, the fewest states (O(√n)).

**Memory.** Beside the kept states (at most ⌈n/k⌉ + k − 1 complete states of 3P numbers, θ, m, v; P for SGD) and
the one trainer that replays and recomputes (4P with its gradient): the **adjoints**, Q queries × the horizons open
at once × 3P numbers (θ, m and v parts; P under SGD) in the parameters' dtype — for the mini bank's 11 queries × 4
horizons × 3 × 235k float32 ≈ 124 MB, for GPT-2 small's 124M parameters ≈ 65 GB — so the queries are processed in
**chunks** (``query_chunk``; default :func:`plan`: as many queries as keep the adjoints within
:data:`ADJOINT_BUDGET`, 1 GiB, and at least one); a chunk's backward pass recomputes what it needs (the segments'
states and each step's graph) from the kept states, which stay until the last chunk. Also held: the weights at
each horizon (horizons × P, the query gradients are taken from them when a chunk's adjoints join), one step's graph
(a batch's forward and backward kept for its second derivative) and one cotangent's backward through it.

**Cost** (one chunk): the replay (H − start updates), the recomputation (n − ⌈n/k⌉ more; none at k = 1), and per
needed step one graph-keeping forward and backward of the batch (about one training step) and one backward of that
graph per open cotangent (about two training steps each: reverse over reverse). One query, one horizon, the whole
run at k = 1: about 1 + 1 + 2 training runs (docs/benchmarks.md, benchmarks/metagrad_cost.py). Every further chunk
repeats the recomputation and the graphs, not the replay.

Numerics: the adjoint in the parameters' dtype (float32 for the bank's fp32 runs, as unroll's tangent);
row weights in the loss's dtype (float32: the trainer's CE, lm/model.py ``masked_ce_sum``); inner products
and the written values in float64. Attention on torch's MATH kernel inside the VJP (as unroll).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.func import functional_call, vjp, vmap

from seedlab.attribution.bank.rundir import Bank, open_bank
from seedlab.attribution.estimators.builtin import Gradients
from seedlab.attribution.estimators.unroll import State, Step, _math_attention, first_step
from seedlab.errors import SeedlabError, in_seed
from seedlab.forks.prefix import first_difference, read_prefix
from seedlab.lm.batches import get_batch
from seedlab.lm.schedule import lr_of
from seedlab.lm.trainer import Trainer
from seedlab.store import digest, read_verified, tensor_hashes, write_json, write_parquet

#: ``check(t, trainer)``: called with the replayed run after every update it reaches (and at its start)
Check = Callable[[int, Trainer], None]
#: the bytes the kept complete states may take when ``every`` is not given (:func:`plan`)
STATE_BUDGET = 1 << 30
#: the bytes the open adjoints may take when ``query_chunk`` is not given (:func:`plan`)
ADJOINT_BUDGET = 1 << 30
#: the truncated estimator (``window``; attribution/estimators/registry.py, rowscores.py)
TRUNCATED = "metagrad-trunc"


class WeightedStep(Step):
    """unroll's :class:`~seedlab.attribution.estimators.unroll.Step` with the batch's per-row loss weights ``w`` [B] as an
    input: ``weighted(w, *z)`` = F_t(z, w) with the loss (Σ_i w_i ℓ_i)/N (ℓ_i row i's CE sum in float32, as
    ``masked_ce_sum``; N = B·T); at w = 1 it is :meth:`Step.__call__`'s function. :meth:`pull` is its VJP by
    ``torch.func`` (the reference for :class:`Update`'s hand-written adjoint: tests/attribution/test_metagrad.py)."""

    _w: torch.Tensor | None = None

    def loss(self, theta: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self._w is None:
            return super().loss(theta)
        logits, _ = functional_call(self.model, dict(zip(self.names, theta)), (self.x,))
        ce = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), self.y.flatten(), reduction="none")
        return (ce.view(self.y.shape).sum(1) * self._w.to(ce.dtype)).sum() / self.y.numel()

    def weighted(self, w: torch.Tensor, *state: tuple[torch.Tensor, ...]) -> State:
        """F_t(z, w): :meth:`Step.__call__` with the rows weighed by ``w`` (the weights read inside its gradient)."""
        self._w = w
        try:
            return self(*state)
        finally:
            self._w = None

    def pull(self, cotangents: State, chunk: int | None = None) -> tuple[torch.Tensor, State]:
        """For a batch of cotangents λ_{t+1} (each tensor with a leading axis R): (∂/∂w [R, B], λ_t) at
        (z_t, w = 1) — one ``torch.func.vjp`` of the step, its backward vmapped over the R cotangents."""
        ones = torch.ones(self.x.shape[0], dtype=self.state[0][0].dtype, device=self.x.device)
        with _math_attention(self.x.device):
            _, back = vjp(self.weighted, ones, *self.state)
            out = vmap(back, chunk_size=chunk)(cotangents)
        return out[0], tuple(out[1:])


class Update:
    """The trainer's update as the adjoint needs it (module doc, one step's VJP): the parameters' layout, their weight
    decay, AdamW's constants and the clip, read once from ``tr`` (a trainer of the run; its optimizer's groups)."""

    def __init__(self, tr: Trainer):
        named = list(tr.model.named_parameters())
        if [p for _, p in named] != list(tr.params):
            raise SeedlabError("metagrad: the model's parameters() and named_parameters() orders differ")
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for p in tr.params]
        self.sizes = [p.numel() for p in tr.params]
        group = {id(p): g for g in tr.opt.param_groups for p in g["params"]}
        self.wd = [float(group[id(p)]["weight_decay"]) for p in tr.params]
        self.adam = isinstance(tr.opt, torch.optim.AdamW)
        self.channels = 3 if self.adam else 1
        g0 = tr.opt.param_groups[0]
        if self.adam:
            self.beta1, self.beta2 = (float(b) for b in g0["betas"])
            self.eps = float(g0["eps"])
        self.clip = float(tr.cfg.grad_clip)
        self.dtype = tr.params[0].dtype

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A flat [P] vector as per-parameter views (the parameters' shapes)."""
        return [c.view(s) for c, s in zip(flat.split(self.sizes), self.shapes)]

    def decay(self, lr: float, like: torch.Tensor) -> torch.Tensor:
        """∂θ'/∂θ, the flat [P] factor 1 − lr·wd (wd per parameter)."""
        return torch.cat([torch.full((n,), 1 - lr * wd, dtype=like.dtype, device=like.device)
                          for n, wd in zip(self.sizes, self.wd)])

    def pull(self, tr: Trainer, z: _Saved, lam: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """For cotangents λ_{t+1} (per channel a flat [R, P] tensor, R ≥ 1) at the complete state ``z`` of step t:
        (∂L/∂w [R, B], λ_t per channel [R, P]) — the module doc's adjoint; ``tr`` supplies the model, the batch of
        (seed, t) and the rate (its own state is not read)."""
        t, model, cfg = z.step, tr.model, tr.cfg
        x, y = get_batch(tr.tokens, tr.seed, t, cfg.batch_size, model.config.block_size)
        x, y = x.to(tr.device), y.to(tr.device)
        lr = lr_of(cfg, t)
        theta = [p.detach().requires_grad_() for p in z.params]
        w = torch.ones(x.shape[0], dtype=self.dtype, device=x.device, requires_grad=True)
        with _math_attention(x.device), torch.enable_grad():
            logits, _ = functional_call(model, dict(zip(self.names, theta)), (x,))
            ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
            loss = (ce.view(y.shape).sum(1) * w.to(ce.dtype)).sum() / y.numel()
            g = torch.autograd.grad(loss, theta, create_graph=True)
        gf = torch.cat([gi.detach().reshape(-1) for gi in g])
        norm = torch.sqrt(sum((gi.detach() * gi.detach()).sum() for gi in g))
        ratio = self.clip / (norm + 1e-6)
        kappa = torch.clamp(ratio, max=1.0)
        acts = bool(ratio <= 1.0)  # the clamp passes its derivative where ratio ≤ 1: the clip's κ moves with ‖g‖
        c = gf * kappa
        lt = lam[0]
        if self.adam:
            m, v = z.moments()
            b1, b2 = self.beta1, self.beta2
            step = z.adam_step() + 1
            bc2, a = 1 - b2**step, lr / (1 - b1**step)
            m2, v2 = b1 * m + (1 - b1) * c, b2 * v + (1 - b2) * c * c
            vh = v2 / bc2
            pos = vh > 0
            root = torch.where(pos, vh, torch.ones_like(vh)).sqrt()
            d = torch.where(pos, root, torch.zeros_like(root)) + self.eps
            dm = -a / d  # ∂θ'/∂m'
            dv = torch.where(pos, a * m2 / (d * d) / (2 * bc2 * root), torch.zeros_like(root))  # ∂θ'/∂v'
            mu, nu = lam[1] + lt * dm, lam[2] + lt * dv
            cbar = (1 - b1) * mu + (2 * (1 - b2)) * c * nu
            rest: tuple[torch.Tensor, ...] = (b1 * mu, b2 * nu)
        else:
            cbar, rest = -lr * lt, ()
        direct = lt * self.decay(lr, lt)
        R = lt.shape[0]
        hv, dw = torch.empty_like(lt), torch.empty(R, x.shape[0], dtype=w.dtype, device=w.device)
        for j in range(R):  # one cotangent at a time, each in a fresh buffer: its bits do not depend on R or on j
            cb = cbar[j].clone()
            gbar = cb * kappa
            if acts:
                gbar = gbar - (self.clip / (norm + 1e-6) ** 2 / norm) * torch.dot(cb, gf) * gf
            with _math_attention(x.device):
                out = torch.autograd.grad(g, (*theta, w), grad_outputs=self.views(gbar), retain_graph=j < R - 1)
            hv[j] = torch.cat([o.reshape(-1) for o in out[:-1]])
            dw[j] = out[-1]
        return dw, (direct + hv, *rest)


@dataclass
class Plan:
    """How :func:`adjoints` will run (:func:`plan`): the steps whose VJP is needed, cut into segments of at most
    ``every`` steps (each segment's first state kept by the replay), and the queries' chunks."""

    start: int  # the replay's first step (the trainer's)
    first: int  # t₀
    horizons: list[int]
    window: int | None
    firsts: dict[int, int]  # h -> the first step whose rows h's adjoint reaches (max(t₀, h − W))
    segments: list[tuple[int, int]]  # [c, e): consecutive needed steps, the state of c kept
    every: int
    query_chunk: int
    queries: int

    @property
    def needed(self) -> int:
        return sum(e - c for c, e in self.segments)

    @property
    def chunks(self) -> int:
        return -(-self.queries // self.query_chunk)

    @property
    def replay(self) -> int:
        """Updates the forward replay trains."""
        return max(self.horizons) - self.start

    @property
    def recompute(self) -> int:
        """Updates one chunk's backward pass recomputes."""
        return sum(e - c - 1 for c, e in self.segments)

    @property
    def held(self) -> int:
        """The most complete states held at once (the kept ones and one segment's recomputed ones)."""
        return len(self.segments) + max((e - c - 1 for c, e in self.segments), default=0)

    def ticks(self) -> int:
        """What ``tick`` is called for: the replay's updates, and per chunk the recomputed updates and the VJPs."""
        return self.replay + self.chunks * (self.recompute + self.needed)


def plan(start: int, queries: int, horizons: Sequence[int], *, first: int | None = None, every: int | None = None,
         query_chunk: int | None = None, window: int | None = None, state_bytes: int = 0, adjoint_bytes: int = 0,
         steps: int | None = None) -> Plan:
    """:class:`Plan` of :func:`adjoints` (its arguments; ``state_bytes``: one complete state's size, ``adjoint_bytes``:
    one adjoint's — both 0 leave the defaults at every state kept and every query at once). Bad input is a
    one-line error."""
    t0 = start if first is None else int(first)
    hs = sorted({int(h) for h in horizons})
    if queries < 1:
        raise SeedlabError("metagrad: at least one query is needed")
    if not hs or not start <= t0 <= hs[0] or (steps is not None and hs[-1] > steps):
        raise SeedlabError(f"metagrad: the first step must lie in {start} .. the first horizon, and the horizons within "
                           f"the run's {steps} updates, got first step {t0} and horizons {hs}")
    for name, value in (("every", every), ("query_chunk", query_chunk), ("window", window)):
        if value is not None and value < 1:
            raise SeedlabError(f"metagrad: {name} must be at least 1, got {value}")
    firsts = {h: t0 if window is None else max(t0, h - window) for h in hs}
    need = sorted(set().union(*(range(firsts[h], h) for h in hs)))
    n = len(need)
    if every is None:
        every = max(1, math.ceil(math.sqrt(n)))
        for k in range(1, every + 1):
            if (-(-n // k) + k - 1) * state_bytes <= STATE_BUDGET:
                every = k
                break
    if query_chunk is None:
        per = len(hs) * adjoint_bytes
        query_chunk = queries if per == 0 else max(1, min(queries, ADJOINT_BUDGET // per))
    query_chunk = min(query_chunk, queries)
    segments: list[tuple[int, int]] = []
    for t in need:  # runs of consecutive needed steps, cut every `every` steps
        if segments and segments[-1][1] == t and t - segments[-1][0] < every:
            segments[-1] = (segments[-1][0], t + 1)
        else:
            segments.append((t, t + 1))
    return Plan(start, t0, hs, window, firsts, segments, int(every), int(query_chunk), queries)


class _Open:
    """The adjoints open in one chunk's backward pass: ``lam`` per channel [R, P], R = Q × the open horizons, one block
    of Q rows (the chunk's queries in order) per horizon of ``order``."""

    def __init__(self, Q: int, channels: int):
        self.Q, self.channels = Q, channels
        self.lam: tuple[torch.Tensor, ...] = ()
        self.order: list[int] = []

    def join(self, h: int, theta: torch.Tensor) -> None:
        """Horizon h's adjoints (θ part ``theta`` [Q, P], m and v parts 0) appended."""
        new = (theta, *(torch.zeros_like(theta) for _ in range(self.channels - 1)))
        self.lam = new if not self.lam else tuple(torch.cat([a, b]) for a, b in zip(self.lam, new))
        self.order.append(h)

    def record(self, at: dict[int, dict[int, list[tuple[torch.Tensor, ...]]]], t: int, which: Collection[int]) -> None:
        """λ_t of the horizons ``which`` (copies) into ``at`` (t -> h -> one entry per chunk)."""
        Q = self.Q
        for j, h in enumerate(self.order):
            if h in which:
                at.setdefault(t, {}).setdefault(h, []).append(tuple(x[j * Q : (j + 1) * Q].clone() for x in self.lam))

    def close(self, gone: Collection[int]) -> None:
        """The horizons ``gone`` leave."""
        if not gone:
            return
        Q, stay = self.Q, [j for j, h in enumerate(self.order) if h not in gone]
        idx = torch.tensor([j * Q + i for j in stay for i in range(Q)], dtype=torch.long, device=self.lam[0].device)
        self.lam = tuple(x.index_select(0, idx) for x in self.lam) if stay else ()
        self.order = [self.order[j] for j in stay]


@dataclass
class Adjoints:
    """What :func:`adjoints` returns: per horizon, every row's metagradient and the adjoints asked for."""

    first: int  # t₀: the first step whose rows are differentiated
    horizons: list[int]
    queries: list[str]  # the rows' and the adjoints' query order
    rows: dict[int, np.ndarray]  # h -> [Q, h - firsts[h], B] float64: ∂L_q(θ_h)/∂w_{t,i} at w = 1, t = firsts[h] + index
    at: dict[int, dict[int, tuple[torch.Tensor, ...]]] = field(default_factory=dict)  # t -> h -> λ_t, per channel [Q, P]
    firsts: dict[int, int] = field(default_factory=dict)  # h -> its first row step: t₀, or h − W with a window
    every: int = 1  # k: the checkpoint spacing used
    query_chunk: int = 1  # queries per backward pass
    held: int = 0  # the most complete states held at once (the memory, in states)
    vjps: int = 0  # single-step VJPs taken (each over the cotangents open at its step: its chunk's queries × horizons)
    replayed: int = 0  # updates trained: the replay and the recomputation
    seconds: dict[str, float] = field(default_factory=dict)  # wall time: "replay" (forward), "backward" (every chunk)


def adjoints(start: Trainer, queries: Mapping[str, Sequence[int]], horizons: Sequence[int], *,
             first: int | None = None, every: int | None = None, keep: Collection[int] = (),
             check: Check | None = None, query_chunk: int | None = None, window: int | None = None,
             micro_batch: int | None = None, tick: Callable[[], None] | None = None) -> Adjoints:
    """The adjoints of every query's loss at every horizon, carried back from each horizon h to ``first`` = t₀
    (with ``window`` W: to max(t₀, h − W)), and every row's metagradient on the way (module doc).

    ``start``: a trainer anywhere at or before t₀ (``start.step`` ≤ t₀; not changed: a fork is replayed);
    ``queries``: {name: token ids} (∇L_q as the estimators take it: attribution/estimators/builtin.py ``Gradients``,
    eval mode, mean CE); ``horizons``: updates completed, each ≥ t₀ (a horizon at t₀ has no rows) and within
    the schedule; ``every``: k, the longest segment of recomputed steps (None: :func:`plan`'s budget);
    ``keep``: steps t (t₀ ≤ t ≤ H) whose adjoints λ_t to keep (:attr:`Adjoints.at`, the horizons whose adjoint
    reaches t); ``check(t, trainer)``: called at every step the forward replay reaches (the caller compares the run
    with the twin's hashes); ``query_chunk``: queries per backward pass (None: :func:`plan`'s budget); ``tick``:
    once per update replayed and per VJP."""
    if not queries:
        raise SeedlabError("metagrad: at least one query is needed")
    up = Update(start)
    P = sum(up.sizes)
    item = start.params[0].element_size()
    p = plan(start.step, len(queries), horizons, first=first, every=every, query_chunk=query_chunk, window=window,
             state_bytes=up.channels * P * item, adjoint_bytes=up.channels * P * item, steps=start.cfg.steps)
    t0, hs, H = p.first, p.horizons, p.horizons[-1]
    bad = sorted(t for t in keep if not t0 <= t <= H)
    if bad:
        raise SeedlabError(f"metagrad: adjoints can be kept at steps {t0} .. {H}, got {bad[0]}")
    names = list(queries)
    out = Adjoints(t0, hs, names, {}, firsts=dict(p.firsts), every=p.every, query_chunk=p.query_chunk)
    starts = {c: e for c, e in p.segments}
    inside = {t for c, e in p.segments for t in range(c + 1, e)}  # recomputed: their weights hashed by the replay

    # forward: the replay; each segment's first complete state, and the weights at every horizon
    clock = time.perf_counter()
    tr = start.fork()  # the one trainer replayed and recomputed: states are loaded into it
    kept: dict[int, _Saved] = {}
    weights: dict[int, str] = {}  # t -> the replay's weights' digest (the recomputation must match it)
    at_h: dict[int, list[torch.Tensor]] = {}  # h -> θ_h (the query gradients are taken there)
    while True:
        t = tr.step
        if check is not None:
            check(t, tr)
        if t in starts:
            kept[t] = _Saved.of(tr)
        elif t in inside:
            weights[t] = digest(tensor_hashes(tr.weights()))
        if t in hs:
            at_h[t] = [q.detach().clone() for q in tr.params]
        if t == H:
            break
        tr.advance()
        out.replayed += 1
        if tick is not None:
            tick()
    out.held = len(kept)
    out.seconds["replay"] = time.perf_counter() - clock
    clock = time.perf_counter()

    # backward: per chunk of queries, segment by segment from the last, its states recomputed from its first
    B = start.cfg.batch_size
    rows = {h: np.zeros((len(names), h - p.firsts[h], B)) for h in hs}
    at_parts: dict[int, dict[int, list[tuple[torch.Tensor, ...]]]] = {}
    chunks = [names[i : i + p.query_chunk] for i in range(0, len(names), p.query_chunk)]
    for n, chunk in enumerate(chunks):
        last, lo = n == len(chunks) - 1, n * p.query_chunk
        texts = {q: queries[q] for q in chunk}
        o = _Open(len(chunk), up.channels)
        pending = sorted(hs, reverse=True)  # horizons still to join, the latest first
        for c, e in sorted(p.segments, reverse=True):
            seg = [kept.pop(c) if last else kept[c]]
            seg[0].load(tr)
            while tr.step < e - 1:
                tr.advance()
                out.replayed += 1
                if tick is not None:
                    tick()
                if digest(tensor_hashes(tr.weights())) != weights[tr.step]:
                    raise SeedlabError(f"metagrad: the run recomputed from step {c} differs from the replay at step "
                                       f"{tr.step} (training is not deterministic here)")
                seg.append(_Saved.of(tr))
            out.held = max(out.held, len(kept) + len(seg) - (0 if last else 1))
            for t in range(e - 1, c - 1, -1):
                if pending and pending[0] == t + 1:  # a horizon: its queries' adjoints λ_h = (∇L_q(θ_h), 0, 0) join
                    h = pending.pop(0)
                    o.join(h, _target(tr, at_h[h], texts, micro_batch))
                if t + 1 in keep:
                    o.record(at_parts, t + 1, o.order)
                dw, lam = up.pull(tr, seg.pop(), o.lam)
                o.lam = lam
                out.vjps += 1
                if tick is not None:
                    tick()
                dw = dw.double().cpu().numpy()
                for j, h in enumerate(o.order):
                    rows[h][lo : lo + o.Q, t - p.firsts[h], :] = dw[j * o.Q : (j + 1) * o.Q]
                gone = [h for h in o.order if p.firsts[h] == t]  # their rows end here: λ_t recorded, then they leave
                if t in keep:
                    o.record(at_parts, t, gone)
                o.close(gone)
        for h in pending:  # a horizon at t₀ itself (no step between): λ_h is its own adjoint
            o.join(h, _target(tr, at_h[h], texts, micro_batch))
            if h in keep:
                o.record(at_parts, h, [h])
    out.at = {t: {h: tuple(torch.cat(parts) for parts in zip(*chunk_parts)) for h, chunk_parts in by_h.items()}
              for t, by_h in at_parts.items()}
    out.rows = rows
    out.seconds["backward"] = time.perf_counter() - clock
    return out


def candidate_effects(grads: Gradients, trainer: Trainer, adj: Adjoints) -> dict[int, np.ndarray]:
    """``{h: [candidates × queries]}`` of ⟨λ_{s+1}, Δz_{s+1}(c)⟩ (float64): every candidate's first-order effect on
    every query at every horizon of ``adj`` that holds λ_{s+1} (``keep`` s + 1) for ``grads.case``'s queries in their
    order. ``trainer``: the twin at the fork point (``step == s``), ``grads`` at θ_s (unroll's). Each query's column
    is its own product (no matrix product over the queries: its bits do not depend on the others)."""
    s = trainer.step
    if s + 1 not in adj.at or adj.queries != list(grads.case.queries):
        raise SeedlabError("metagrad: the adjoints hold no λ at s+1 for these queries")
    dz = _flat(first_step(grads, trainer))  # [K, 3P] float64: the exact change at s per candidate, unroll's start
    out = {}
    for h, lam in adj.at[s + 1].items():
        flat = torch.cat([x.double().cpu() for x in lam], dim=1)  # [Q, 3P]: channels, then parameters
        out[h] = torch.stack([dz @ flat[j] for j in range(flat.shape[0])], dim=1).numpy()
    return out


def metagrad(grads: Gradients, trainer: Trainer, horizons: Sequence[int], *, every: int | None = None,
             query_chunk: int | None = None, window: int | None = None, check: Check | None = None,
             tick: Callable[[], None] | None = None) -> dict[int, np.ndarray]:
    """``{h: [candidates × queries]}``: the estimator ``metagrad`` — every candidate's ⟨λ_{s+1}, Δz_{s+1}(c)⟩ at
    every horizon, one backward pass from the last horizon to s + 1 (the frame of unroll's :func:`~seedlab.
    attribution.unroll.unroll`, and its value to float round-off). ``trainer``: the twin at the fork point
    (``step == s``: the prefix loaded; not changed); ``check(t, trainer)`` at every replayed step.

    ``window`` W: ``metagrad-trunc`` — a horizon with h − s ≤ W (the candidate's row younger than W updates at h)
    gets metagrad's value, bit for bit (each query's adjoint is its own, module doc); a later one 0, and its
    adjoint is not computed (no replay past the last horizon within W, none at all when there is none)."""
    s = trainer.step
    hs = sorted({int(h) for h in horizons})
    if not hs or hs[0] <= s or hs[-1] > trainer.cfg.steps:
        raise SeedlabError(f"metagrad: horizons must be after the injection step {s} and within the run's "
                           f"{trainer.cfg.steps} updates, got {hs}")
    if window is not None and window < 1:
        raise SeedlabError(f"metagrad: window must be at least 1, got {window}")
    inside = [h for h in hs if window is None or h - s <= window]
    zero = np.zeros((len(grads.case.candidates), len(grads.case.queries)))
    out = {h: zero.copy() for h in hs}
    if inside:
        adj = adjoints(trainer, grads.case.queries, inside, first=s + 1, every=every, keep={s + 1}, check=check,
                       query_chunk=query_chunk, micro_batch=grads.micro_batch, tick=tick)
        out.update(candidate_effects(grads, trainer, adj))
    return out


def truncated_rows(bank: Bank, seed: int, rows: Sequence[tuple[int, int]], horizons: Sequence[int], device,
                   check: Check | None = None, window: int | None = None) -> pd.DataFrame:
    """``metagrad-trunc`` on the run's own rows (attribution/estimators/rowscores.py's long frame: seed, estimator,
    query, horizon, step, row, value, unit): for every row (t, i) of ``rows`` and every horizon h > t of ``horizons``,
    value = −∂L_q(θ_h)/∂w_{t,i} (a removal's first order, as rowscores.py reads metagrad.parquet) where h − t ≤ W, and
    0 for the older rows. W: ``window``, else the bank's ``attribute.metagrad_window``. One truncated backward pass
    (:func:`adjoints` with ``window``: at most W VJPs per horizon; the values bitwise those of metagrad.parquet) over
    the twin replayed from step 0 when a row is older than s, else from the kept prefix, ``check``-ed at every step
    (:func:`replay_check`)."""
    cfg, s = bank.cfg, bank.cfg.injection_step
    W = int(window or cfg.attribute.metagrad_window)
    queries = {n: t.tokens for n, t in bank.inputs.queries.items()}
    names = list(queries)
    t0 = min(t for t, _ in rows)
    hs = sorted(h for h in set(horizons) if h > t0)
    tr = Trainer(cfg.model_copy(update={"device": str(device)}), bank.inputs.gcfg, seed, bank.inputs.corpus.train)
    if t0 >= s:
        read_prefix(tr, bank.dir.prefix(seed), s)
    adj = adjoints(tr, queries, hs, first=t0, window=W, check=check, micro_batch=cfg.micro_batch)
    frames = []
    for h in hs:
        before = [(t, i) for t, i in rows if t < h]
        lo = adj.firsts[h]
        values = np.zeros((len(before), len(names)))
        for k, (t, i) in enumerate(before):
            if t >= lo:  # h − t ≤ W
                values[k] = -adj.rows[h][:, t - lo, i]
        frames.append(pd.DataFrame({
            "seed": seed, "estimator": TRUNCATED, "query": np.tile(np.asarray(names, dtype=object), len(before)),
            "horizon": h, "step": np.repeat([t for t, _ in before], len(names)),
            "row": np.repeat([i for _, i in before], len(names)), "value": values.reshape(-1), "unit": "nats/token"}))
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------- a bank's rows: metagrad.parquet

#: metagrad.parquet's columns: one row per seed × query × horizon × step × batch row
COLUMNS = ["seed", "query", "horizon", "step", "row", "value"]


def replay_check(bank: Bank, seed: int, horizons: Sequence[int]) -> Check:
    """``check(t, trainer)`` for a replay of the bank's twin of ``seed`` (module doc, Replay): at the injection
    step s every tensor of the complete state (weights, AdamW moments and step counts, as Trainer.save_state names
    them) must hash as prefix.safetensors recorded them (where the prefix was kept), and at every step the twin's
    manifest.json holds, the weights as it records them; else a one-line error. A horizon without the twin's
    hashes (nothing to check the replay against there) is refused first."""
    s, twin = bank.cfg.injection_step, bank.dir.twin(seed)
    manifest = twin.read_manifest()
    missing = [h for h in horizons if str(h) not in manifest]
    if missing:
        raise SeedlabError(f"seed {seed}: metagrad cannot reach step {missing[0]}: the twin recorded no hashes there "
                           f"(its steps: {', '.join(sorted(manifest, key=int)) or 'none'})")
    prefix = bank.dir.prefix(seed)
    recorded: dict[str, str] | None = None
    if prefix.is_file():
        _, meta = read_verified(prefix)  # the file against its own hashes: a corrupted prefix is refused here
        recorded = {k: v for k, v in json.loads(meta["sha256"]).items() if k != "losses"}

    def check(t: int, tr: Trainer) -> None:
        if t == s and recorded is not None:
            bad = first_difference(recorded, tensor_hashes(_complete_state(tr)))
            if bad is not None:
                raise SeedlabError(f"seed {seed}: the run replayed for metagrad differs from the kept prefix "
                                   f"({prefix.name}) at step {s} in tensor {bad!r} (a wrong seed, a foreign prefix, or "
                                   "another torch, device or thread count than the bank's? see environment.json)")
        want = manifest.get(str(t))
        bad = None if want is None else first_difference(want, tensor_hashes(tr.weights()))
        if bad is not None:
            raise SeedlabError(f"seed {seed}: the run replayed for metagrad differs from the bank's twin at step {t} "
                               f"in tensor {bad!r} (a wrong seed, a foreign prefix, or another torch, device or thread "
                               "count than the bank's? see environment.json)")

    return check


def _complete_state(tr: Trainer) -> dict[str, torch.Tensor]:
    """The complete training state under the names lm/trainer.py ``Trainer.save_state`` writes (losses aside)."""
    out = {f"model.{k}": v for k, v in tr.model.state_dict().items()}
    for i, st in tr.opt.state_dict()["state"].items():
        for k, v in st.items():
            out[f"opt.{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def bank_horizons(bank: Bank, horizons: Sequence[str | int] | None) -> list[int]:
    """The horizons asked for (labels as the bank names them — s+1, mid, end — or updates completed), as steps;
    None: every horizon of the bank. One the bank lacks is a one-line error."""
    have = bank.cfg.horizon_steps()  # {step: label}
    if not horizons:
        return sorted(have)
    by_label = {label: t for t, label in have.items()}
    out = []
    for h in horizons:
        key = str(h).strip()
        t = by_label.get(key, int(key) if key.lstrip("-").isdigit() else None)
        if t not in have:
            allowed = ", ".join(f"{label} ({t})" for t, label in have.items())
            raise SeedlabError(f"--horizon: must be one of the bank's horizons {allowed}, got {h!r}")
        out.append(t)
    return sorted(set(out))




def bank_metagrad(root: str | Path, *, first: int = 0, every: int | None = None,
                  horizons: Sequence[str | int] | None = None, device: str = "auto", query_chunk: int | None = None,
                  progress: bool = True, jobs: int = 1) -> pd.DataFrame:
    """``seedlab attribution metagrad BANK``: every row's metagradient ∂L_q(θ_h)/∂w_{t,i} for every query of the
    bank (its query rows and probes), every horizon h asked for and every row (t, i), ``first`` ≤ t < h, of every
    seed whose twin finished, the twin replayed (from step 0 when ``first`` < s, else from the kept prefix) and
    checked (:func:`replay_check`); written to metagrad.parquet (:data:`COLUMNS`) and metagrad.json (the
    settings, the replay's and the VJPs' counts, the states held, the wall time per seed) in the bank folder.
    ``jobs`` > 1: that many seeds at once, each in a process of its own on one thread (the same bits: a seed's
    metagradients depend on nothing else; its seconds are its own process's). Every input is checked before any
    work (a first step outside 0 .. the first horizon, a horizon the bank lacks, ``every``, ``query_chunk`` or
    ``jobs`` < 1, a bank without queries or a finished twin, a prefix missing where the replay starts from it):
    one line, nothing written."""
    from seedlab.lm.determinism import settle
    from seedlab.lm.distributed import World
    from seedlab.progress import Bar

    bank = open_bank(root)
    cfg, inputs, s = bank.cfg, bank.inputs, bank.cfg.injection_step
    hs = bank_horizons(bank, horizons)
    if not 0 <= first <= hs[0]:
        raise SeedlabError(f"--t0: must be in 0 .. {hs[0]} (0: the twin replayed from its seed's initialisation; "
                           f"{s} = s: from the kept prefix; at most the first horizon asked for), got {first}")
    if every is not None and every < 1:
        raise SeedlabError(f"--every: at least 1 (a complete state kept every K steps), got {every}")
    if query_chunk is not None and query_chunk < 1:
        raise SeedlabError(f"--query-chunk: at least 1, got {query_chunk}")
    if jobs < 1:
        raise SeedlabError(f"--jobs: at least 1, got {jobs}")
    queries = {n: t.tokens for n, t in inputs.queries.items()}
    if not queries:
        raise SeedlabError(f"{bank.root}: the bank has no queries (queries.heldout, queries.probes) to differentiate")
    seeds = [seed for seed in cfg.seeds if bank.dir.twin(seed).finished]
    if not seeds:
        raise SeedlabError(f"{bank.root}: no seed's twin has finished (run `seedlab attribution bank` first)")
    if first >= s:
        gone = [seed for seed in seeds if not bank.dir.prefix(seed).is_file()]
        if gone:
            raise SeedlabError(f"--t0: {first} replays from the kept prefix, and seed {gone[0]} kept none "
                               f"({bank.dir.prefix(gone[0])}); pass --t0 below {s} to replay from step 0")
    checks = {seed: replay_check(bank, seed, hs) for seed in seeds}  # every horizon's hashes, every prefix's file
    dev = World().device(device)
    settle(dev, 1 if jobs > 1 else cfg.threads)
    p = _plan(bank, hs, first, every, query_chunk)
    with Bar("metagrad", p.ticks() * len(seeds), "steps", enabled=progress) as bar:
        if jobs > 1:
            from seedlab.executors import run_tallied

            specs = [(str(bank.root), seed, hs, first, every, query_chunk, str(dev)) for seed in seeds]
            done = run_tallied(metagrad_seed, specs, bar.advance, lambda seed: p.ticks(), jobs)
        else:
            done = []
            for seed in seeds:
                bar.update(note=f"seed {seed}")
                done.append(seed_metagrad(bank, seed, hs, first, p, dev, checks[seed], bar.advance))
    df = pd.concat([frame for frame, _ in done], ignore_index=True)
    write_parquet(bank.dir.metagrad, df)
    write_json(bank.dir.metagrad_json, {"t0": first, "every": p.every, "horizons": hs, "queries": list(queries),
                                        "device": str(dev), "query_chunk": p.query_chunk, "jobs": jobs,
                                        "seeds": {str(seed): r for seed, (_, r) in zip(seeds, done)}})
    return df


def _plan(bank: Bank, hs: Sequence[int], first: int, every: int | None, query_chunk: int | None) -> Plan:
    """:func:`plan` for a bank's metagrad (the replay's start: step 0 before s, else the kept prefix)."""
    from seedlab.lm.gptconfig import param_count

    cfg, s = bank.cfg, bank.cfg.injection_step
    size = (3 if cfg.optimizer == "adamw" else 1) * param_count(bank.inputs.gcfg) * 4  # fp32 weights and moments
    return plan(0 if first < s else s, len(bank.inputs.queries), hs, first=first, every=every,
                query_chunk=query_chunk, state_bytes=size, adjoint_bytes=size)


def seed_metagrad(bank: Bank, seed: int, hs: Sequence[int], first: int, p: Plan, dev, check: Check,
                  tick: Callable[[], None] | None) -> tuple[pd.DataFrame, dict]:
    """One seed's metagradients (:func:`bank_metagrad`): its long frame and metagrad.json's record of it."""
    from seedlab.lm.determinism import nondeterminism_is_an_error

    cfg, s = bank.cfg, bank.cfg.injection_step
    start = 0 if first < s else s
    queries = {n: t.tokens for n, t in bank.inputs.queries.items()}
    t_start = time.perf_counter()
    with nondeterminism_is_an_error():
        tr = Trainer(cfg.model_copy(update={"device": str(dev)}), bank.inputs.gcfg, seed, bank.inputs.corpus.train)
        if start == s:
            read_prefix(tr, bank.dir.prefix(seed), s)
        adj = adjoints(tr, queries, hs, first=first, every=p.every, check=check, query_chunk=p.query_chunk,
                       micro_batch=cfg.micro_batch, tick=tick)
    record = {"seconds": time.perf_counter() - t_start, "replayed_from": start, "updates_replayed": adj.replayed,
              "vjps": adj.vjps, "states_held": adj.held, "replay_seconds": adj.seconds["replay"],
              "backward_seconds": adj.seconds["backward"]}
    return rows_frame(seed, adj), record


def metagrad_seed(spec: tuple[str, int, list[int], int, int | None, int | None, str]) -> tuple[pd.DataFrame, dict]:
    """One seed of ``metagrad --jobs`` in a process of its own: the bank read back, one thread, the replay checked
    as in the caller; its progress reported to the caller's bar (executors.py ``Reporter``); a failure is one line
    naming the seed."""
    from seedlab.executors import Reporter
    from seedlab.lm.determinism import settle
    from seedlab.lm.distributed import World

    root, seed, hs, first, every, query_chunk, device = spec
    try:
        bank = open_bank(root)
        dev = World().device(device)
        settle(dev, 1)
        return seed_metagrad(bank, seed, hs, first, _plan(bank, hs, first, every, query_chunk), dev,
                             replay_check(bank, seed, hs), Reporter(seed))
    except Exception as err:  # one line, whatever it was
        raise in_seed(seed, err) from None


def rows_frame(seed: int, adj: Adjoints) -> pd.DataFrame:
    """:attr:`Adjoints.rows` as metagrad.parquet's long frame (:data:`COLUMNS`); a horizon's rows start at its own
    first step (:attr:`Adjoints.firsts`: t₀, or h − W with a window)."""
    parts = []
    for h, arr in adj.rows.items():
        Q, n, B = arr.shape
        lo = adj.firsts.get(h, adj.first)
        parts.append(pd.DataFrame({
            "seed": np.full(Q * n * B, seed, dtype=np.int64),
            "query": np.repeat(np.asarray(adj.queries, dtype=object), n * B),
            "horizon": np.full(Q * n * B, h, dtype=np.int64),
            "step": np.tile(np.repeat(np.arange(lo, lo + n, dtype=np.int64), B), Q),
            "row": np.tile(np.arange(B, dtype=np.int64), Q * n),
            "value": arr.reshape(-1),
        }))
    return pd.concat(parts, ignore_index=True)[COLUMNS]


# --------------------------------------------------------------------------- helpers


@dataclass
class _Saved:
    """A run's complete state at one step (weights, and the optimizer's per-parameter state: AdamW's moments and step
    counts), copied out of a trainer and loaded back into one: a kept checkpoint of checkpoint-and-recompute."""

    step: int
    params: list[torch.Tensor]
    opt: dict[int, dict[str, object]]  # parameter index -> its optimizer state (tensors copied)

    @classmethod
    def of(cls, tr: Trainer) -> _Saved:
        opt = {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in tr.opt.state[p].items()}
               for i, p in enumerate(tr.params) if p in tr.opt.state}
        return cls(tr.step, [p.detach().clone() for p in tr.params], opt)

    def load(self, tr: Trainer) -> None:
        """``tr`` at this state (its parameters overwritten in place, its optimizer state replaced by copies), so that
        its next update is the one this state's run made (bit for bit: the same tensors, the same step)."""
        with torch.no_grad():
            for p, v in zip(tr.params, self.params):
                p.copy_(v)
                p.grad = None
        tr.opt.state.clear()
        for i, st in self.opt.items():
            tr.opt.state[tr.params[i]] = {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
        tr.step = self.step

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """AdamW's (m, v), each flat [P] (zeros before the first update, when the optimizer holds no state)."""
        out = []
        for key in ("exp_avg", "exp_avg_sq"):
            out.append(torch.cat([(self.opt[i][key] if i in self.opt else torch.zeros_like(p)).reshape(-1)  # type: ignore[union-attr]
                                  for i, p in enumerate(self.params)]))
        return out[0], out[1]

    def adam_step(self) -> int:
        """AdamW's step count before this state's update (0 before the first)."""
        st = self.opt.get(0)
        return int(st["step"]) if st else 0  # type: ignore[arg-type]


def _target(tr: Trainer, theta: Sequence[torch.Tensor], queries: Mapping[str, Sequence[int]],
            micro_batch: int | None) -> torch.Tensor:
    """∇L_q(θ) for every query at the weights ``theta`` (loaded into ``tr``'s model), [Q, P] flat in the parameters'
    dtype: estimators.py's ``Gradients.query`` (the kernels unroll's readout uses, so the same bits). λ_h is
    (this, 0, 0)."""
    with torch.no_grad():
        for p, v in zip(tr.params, theta):
            p.copy_(v)
    g = Gradients(tr.model, SimpleNamespace(queries=dict(queries)), micro_batch=micro_batch)  # query() reads .queries only
    flat = torch.stack([g.query(name) for name in queries])  # [Q, P] float64
    return flat.to(tr.params[0].dtype).to(tr.params[0].device)


def _flat(state: State) -> torch.Tensor:
    """A batched State (each tensor [R, ...]) -> [R, numbers] float64 on the CPU (channels, then parameters)."""
    return torch.cat([x.reshape(x.shape[0], -1).double().cpu() for part in state for x in part], dim=1)
