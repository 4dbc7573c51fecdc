"""Influence estimators: predicted Δ L_query of replacing one row of one batch by a candidate.

The measured quantity they estimate (the attribution bench compares them with it): two runs
identical up to step ``s``; at step ``s`` the twin trains on the ordinary batch (x, y) and the
other run on the same batch with row ``r`` replaced by candidate ``c`` (lm/batches.py ``inject``:
the passage, then padding that the loss masks). Then

    Δ L_query(h) = L_query(θ_with_c at horizon h) − L_query(θ_twin at horizon h)

where ``L_query`` is a query text's mean next-token cross-entropy in nats/token
(:func:`seedlab.measures.text.text_ce`). Sign: learning the candidate lowers its own loss, so a candidate used
as its own query gives a *negative* Δ.

The trainer's loss at step s is Σ(masked CE over all rows) / N with N = B·T fixed for every
condition, so the swap changes the full-batch gradient by

    δ_c = (∇ℓ_c − ∇ℓ_r) / N            ℓ = a row's CE *sum* (nats), gradients at θ_s.

The estimators are functions of δ_c (raw, before clipping) and of the query gradient ∇L_q;
they differ in the map from δ_c to a weight change and in the weights they are evaluated at.
``label`` (registry.py): *estimator* — the method as its paper defines it, for this one-visit swap;
*variant* — a labelled alternative kept for comparison; *baseline* — no influence model at all.

===========  ==========================================================  ===================  ==========  ========
name         estimate                                                    horizon              unit        label
===========  ==========================================================  ===================  ==========  ========
sgd          −lr_s ⟨∇L_q, clip'(δ_c)⟩                                     s+1 (one SGD step)   nats/token  estimator
adam         ⟨∇L_q, u(g + δ_c) − u(g)⟩, u the exact AdamW update of        s+1 (the real step)  nats/token  estimator
             step s (lm.gradients.AdamStep: clip, moments, bias terms)
adam-linear  the same, first order in δ_c (:func:`adam_linear`)            s+1                  nats/token  variant
tracin       −lr_s ⟨∇L_q(θ_s), ∇ℓ_c(θ_s) − ∇ℓ_r(θ_s)⟩ / N                  s+1                  nats/token  estimator
tracin-cp    −Σ_k lr_k ⟨∇L_q(θ_k), ∇ℓ_c(θ_k) − ∇ℓ_r(θ_k)⟩ / N, later θ_k  the last checkpoint  nats/token  variant
cosine       −cos(∇L_q, ∇ℓ_c − ∇ℓ_r)                                       none (a direction)   cosine      estimator
adam-cosine  −cos(P∇L_q, P(∇ℓ_c − ∇ℓ_r)), P = 1/(√v̂_s + ε) (TrackStar)     none (a direction)   cosine      estimator
ekfac        −⟨∇L_q, (F + λ)⁻¹ (∇ℓ_c − ∇ℓ_r)⟩ / D, kronfluence             convergence          nats/token  estimator
kfac         the same with K-FAC curvature                                convergence          nats/token  estimator
trak         −(τ(q, c) − τ(q, r)), TRAK's score through traker (one model)  convergence          score       estimator
unroll       ⟨∇L_q(θ_h), Δθ_h⟩: the exact change at s carried through the    every horizon        nats/token  reference
             twin's replayed steps by JVPs (first order in the swap)
metagrad     ⟨λ_{s+1}, Δz_{s+1}(c)⟩: unroll in reverse mode, the adjoint     every horizon        nats/token  reference
             of L_q(θ_h) carried back (equal to unroll to round-off)
random       −(u(c) − u(r)), u a seeded uniform number per text           none                 score       baseline
loss         −(L(c) − L(r)), L a text's mean CE at θ_s (nats/token)        none                 score       baseline
gradnorm     −(‖∇ℓ_c‖ − ‖∇ℓ_r‖) at θ_s                                     none                 score       baseline
length       −(n(c) − n(r)), n a text's token count                       none                 score       baseline
===========  ==========================================================  ===================  ==========  ========

(ekfac, kfac and trak live in :mod:`seedlab.attribution.estimators.influence`: their definitions and
sources are there; unroll, the reference the estimators at θ_s approximate, in
:mod:`seedlab.attribution.estimators.unroll`, and metagrad, its reverse mode, in :mod:`seedlab.attribution.estimators.metagrad`). The others':

- **TracIn** (Pruthi et al. 2020, "Estimating Training Data Influence by Tracing Gradient
  Descent", §3): TracInIdeal sums the loss change of the test example over the iterations *that
  used the training example*; its first-order form is Σ_t lr_t ⟨∇ℓ_test(θ_t), ∇ℓ_z(θ_t)⟩ over
  those iterations (for a mini-batch, divided by the loss's normaliser: N here). The candidate is used once, at s, so ``tracin`` is that one term: the
  same number as ``sgd`` without clipping. Their practical TracIn-CP replaces the visits by
  saved checkpoints; over the twin's checkpoints *after* s (``tracin-cp``) that adds terms for
  visits that never happened — a trajectory heuristic, kept as a labelled variant.
- **adam-cosine**: TrackStar (Chang et al. 2024, "Scalable Influence and Fact Tracing for Large
  Language Model Pretraining", §3): a gradient is divided elementwise by the square root of the
  optimizer's second moment, projected, corrected by a task Hessian R^{-1/2} and unit-normalised;
  the score is the dot product of the query's and the training example's unit vectors. Here with
  no projection (exact) and R = I; the training side is the swap ∇ℓ_c − ∇ℓ_r; the second moment
  is AdamW's at θ_s (the state before step s, bias-corrected), with its ε: P = 1/(√v̂ + ε).
  LESS (Xia et al. 2024) differs: it preconditions the training side only, with the Adam update
  (momentum included) of a hypothetical step on the example, and keeps the query gradient plain.
  Where v̂ ≈ 0 (a parameter the twin has barely moved, e.g. the embedding of a token it has not
  seen) P ≈ 1/ε dominates the direction: that is the method's own behaviour.
- **baselines** score a text ``t`` (a candidate, or the replaced row r); the estimate is
  −(score(c) − score(r)): the row's score is the same for every candidate of a case, so it
  changes no rank across candidates, and the own-row candidate gets exactly 0 like every
  estimator. The sign says "a larger score predicts a larger drop of the query's loss".
  ``random`` is a per-text uniform number from ``default_rng([seed, *tokens])`` (a random ranking
  of the candidates, the same for every query).

All gradients are of the model in eval mode, in the model's dtype, accumulated in float64,
flattened over ``model.parameters()`` (seedlab.lm.gradients' helpers). A candidate identical to
the replaced row (its ``block_size + 1`` tokens) gives exactly 0 for every estimator: its row
gradient, loss and token count are computed by the very same kernels as the ordinary row's.

Entry points: :mod:`seedlab.attribution.estimators.registry` (the estimators by name, plug-ins, the
long frame of several estimators).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import check_passage, inject
from seedlab.lm.determinism import deterministic
from seedlab.lm.gradients import AdamStep, ce_sum_grad
from seedlab.lm.model import GPT
from seedlab.measures.text import text_ce

Texts = Mapping[str, Sequence[int]] | Sequence[Sequence[int]]


# --------------------------------------------------------------------------- the case


@dataclass(frozen=True)
class Case:
    """One injected step: the ordinary batch ``x, y`` [B, T] (the twin's), the row ``row`` a
    candidate replaces, the candidates and queries (token ids, 2 .. block_size + 1 each, by
    name) and the pad id that fills a short candidate's row."""

    x: torch.Tensor
    y: torch.Tensor
    row: int
    candidates: dict[str, tuple[int, ...]]
    queries: dict[str, tuple[int, ...]]
    pad_id: int

    @classmethod
    def of(cls, x: torch.Tensor, y: torch.Tensor, row: int, candidates: Texts, queries: Texts, pad_id: int) -> Case:
        """Validate and normalise: lists of ids get the names "0", "1", ..."""
        if x.dim() != 2 or x.shape != y.shape:
            raise SeedlabError(f"batch: x and y must both be [B, T], got {tuple(x.shape)} and {tuple(y.shape)}")
        B, T = x.shape
        if not 0 <= row < B:
            raise SeedlabError(f"row: must be in 0 .. {B - 1}, got {row!r}")
        cands, qs = _named(candidates, "candidates"), _named(queries, "queries")
        for kind, texts in (("candidate", cands), ("query", qs)):
            for name, ids in texts.items():
                check_passage(len(ids), T, f"{kind} {name!r}")
        return cls(x.detach().cpu(), y.detach().cpu(), int(row), cands, qs, int(pad_id))

    @property
    def n_targets(self) -> int:
        """N = B·T, the trainer's fixed denominator."""
        return self.x.numel()

    def own_row(self) -> tuple[int, ...]:
        """The replaced row as a passage (its block_size + 1 tokens): the candidate that changes nothing."""
        r = self.row
        return tuple(int(t) for t in torch.cat([self.x[r], self.y[r, -1:]]))

    def passage(self, name: str | None) -> tuple[int, ...]:
        """Candidate ``name``'s tokens; None: the replaced row's (:meth:`own_row`)."""
        return self.own_row() if name is None else self.candidates[name]

    def candidate_row(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x, y, mask) [1, T] of row ``row`` with candidate ``name`` injected (lm/batches.py inject)."""
        xp, yp, mp = inject(self.x, self.y, self.row, self.candidates[name], self.pad_id)
        r = self.row
        return xp[r : r + 1], yp[r : r + 1], mp[r : r + 1]

    def ordinary_row(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r = self.row
        return self.x[r : r + 1], self.y[r : r + 1], torch.ones(1, self.x.shape[1], dtype=torch.bool)


def _named(texts: Texts, what: str) -> dict[str, tuple[int, ...]]:
    items = texts.items() if isinstance(texts, Mapping) else ((str(i), t) for i, t in enumerate(texts))
    out = {str(k): tuple(int(t) for t in np.asarray(v).reshape(-1)) for k, v in items}
    if not out:
        raise SeedlabError(f"{what}: at least one is needed")
    return out


def query_tensors(ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [1, n-1] of a query text: ``x = ids[:-1]``, ``y = ids[1:]``, every target counts."""
    t = torch.as_tensor(list(ids), dtype=torch.int64).reshape(1, -1)
    return t[:, :-1], t[:, 1:], torch.ones(1, t.shape[1] - 1, dtype=torch.bool)


@contextlib.contextmanager
def _eval(model: torch.nn.Module) -> Iterator[None]:
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


# --------------------------------------------------------------------------- gradients


class Gradients:
    """Flat float64 gradients at one model state, each computed once and cached.

    ``query(q)``: ∇L_q (mean CE of query q); ``swap(c)``: ∇ℓ_c − ∇ℓ_r (CE sums of the
    candidate's row and of the ordinary row); ``batch()``: the twin's full-batch gradient
    (Σ rows' CE) / N, needed by gradient clipping and by Adam's second moment. Memory: one
    vector of ``num_params`` float64 per cached item, on the model's device."""

    def __init__(self, model: GPT, case: Case, *, micro_batch: int | None = None):
        self.model, self.case, self.micro_batch = model, case, micro_batch
        self.device = next(model.parameters()).device
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    def _grad(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, micro: int | None = None) -> torch.Tensor:
        with _eval(self.model), deterministic(self.device):
            g, _ = ce_sum_grad(self.model, x, y, mask, micro or x.shape[0])
        return g

    def _cached(self, key: tuple[str, str], make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def row(self) -> torch.Tensor:
        """∇ℓ_r, the ordinary row's CE sum."""
        return self._cached(("row", ""), lambda: self._grad(*self.case.ordinary_row()))

    def swap(self, name: str) -> torch.Tensor:
        """∇ℓ_c − ∇ℓ_r (= N·δ_c)."""
        return self._cached(("swap", name), lambda: self._grad(*self.case.candidate_row(name)) - self.row())

    def query(self, name: str) -> torch.Tensor:
        """∇L_q, the query's mean CE (nats/token)."""
        ids = self.case.queries[name]
        return self._cached(("query", name), lambda: self._grad(*query_tensors(ids)) / (len(ids) - 1))

    def batch(self) -> torch.Tensor:
        """The twin's full-batch gradient g = (Σ_rows ∇ℓ) / N, before clipping."""

        def make() -> torch.Tensor:
            c = self.case
            rest = [i for i in range(c.x.shape[0]) if i != c.row]
            g = self.row().clone()
            if rest:
                ones = torch.ones(len(rest), c.x.shape[1], dtype=torch.bool)
                g += self._grad(c.x[rest], c.y[rest], ones, self.micro_batch)
            return g / c.n_targets

        return self._cached(("batch", ""), make)


def _dots(grads: Gradients, transform: Callable[[torch.Tensor], torch.Tensor]) -> np.ndarray:
    """[candidates × queries] of ⟨∇L_q, transform(∇ℓ_c − ∇ℓ_r)⟩."""
    case = grads.case
    out = np.zeros((len(case.candidates), len(case.queries)))
    for i, c in enumerate(case.candidates):
        v = transform(grads.swap(c))
        for j, q in enumerate(case.queries):
            out[i, j] = float(torch.dot(grads.query(q), v))
    return out


def clip_jvp(g: torch.Tensor, delta: torch.Tensor, max_norm: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's ``clip_grad_norm_(max_norm)`` at the twin's gradient ``g`` and its first-order
    change for a gradient change ``delta``: returns (clipped g, d clip(g)·delta).

    clip(g) = g·min(1, C/(‖g‖+1e-6)); where clipping is active
    d clip = c·δ − C·(g·δ)/((‖g‖+1e-6)²‖g‖)·g with c = C/(‖g‖+1e-6) (the norm shrinks along g)."""
    if max_norm is None:
        return g, delta
    norm = float(torch.linalg.vector_norm(g))
    coef = max_norm / (norm + 1e-6)
    if coef >= 1.0:
        return g, delta
    along = float(torch.dot(g, delta)) * max_norm / ((norm + 1e-6) ** 2 * norm)
    return g * coef, delta * coef - g * along


# --------------------------------------------------------------------------- estimators


def sgd_one_step(grads: Gradients, *, lr: float, grad_clip: float | None = None) -> np.ndarray:
    """One plain-SGD step (P = I): Δθ = −lr_s · clip'(δ_c), so

        Δ L_q ≈ −lr_s ⟨∇L_q, clip'(δ_c)⟩,   δ_c = (∇ℓ_c − ∇ℓ_r)/N,

    with clip' the first-order change of torch's gradient-norm clipping at the twin's
    gradient (:func:`clip_jvp`; ``grad_clip=None``: no clipping, clip' = identity). The
    twin's own update and weight decay are identical in both runs and cancel; what is left
    out is second order: O(lr²) curvature of L_q and O(‖δ‖²) of the clip. ``lr`` is the
    rate of the injected update, ``lr_at(s)`` (lm/schedule.py)."""
    n = grads.case.n_targets
    if grad_clip is None:
        return _dots(grads, lambda d: -lr * d / n)
    g = grads.batch()
    return _dots(grads, lambda d: -lr * clip_jvp(g, d / n, grad_clip)[1])


def tracin(grads: Gradients, *, lr: float) -> np.ndarray:
    """TracIn for a candidate seen once (Pruthi et al. 2020; the module doc): the one term at s,

        −lr_s · ⟨∇L_q(θ_s), ∇ℓ_c(θ_s) − ∇ℓ_r(θ_s)⟩ / N,

    the same at every horizon. Plain gradients (no clipping, no Adam): :func:`sgd_one_step`
    without ``grad_clip``."""
    return sgd_one_step(grads, lr=lr)


def tracin_cp(grads: Gradients, *, checkpoints: Sequence[tuple[Mapping[str, torch.Tensor], float]]) -> np.ndarray:
    """``tracin-cp``, a labelled variant: TracIn-CP (Pruthi et al. 2020) over checkpoints,

        Δ L_q ≈ −Σ_k lr_k · ⟨∇L_q(θ_k), ∇ℓ_c(θ_k) − ∇ℓ_r(θ_k)⟩ / N

    ``checkpoints``: (state_dict, lr) pairs; θ_k is the state dict (model weights, the
    ``step-<t>`` files' tensors) and lr_k the rate of the update that *starts* from it,
    ``lr_at(t)`` (lm/schedule.py's step convention). Plain gradients: no clipping, no Adam.
    With the single checkpoint (θ_s, lr_at(s)) it is exactly :func:`tracin`. With later
    checkpoints of the twin run it **adds terms for visits that never happened** — the one-step
    effects *as if the row were swapped again at each checkpoint's step* — so it is neither
    TracIn's sum over the candidate's visits (the term at s) nor a propagation of the single
    swap; its horizon is the last checkpoint. The given model is not changed (a copy is loaded
    with each state dict)."""
    if not checkpoints:
        raise SeedlabError("checkpoints: tracin-cp needs at least one (state_dict, lr) pair")
    case = grads.case
    work = copy.deepcopy(grads.model)
    total = np.zeros((len(case.candidates), len(case.queries)))
    for k, (state, lr) in enumerate(checkpoints):
        try:
            work.load_state_dict(state)
        except RuntimeError as e:
            raise SeedlabError(f"checkpoints[{k}]: does not fit the model ({str(e).splitlines()[0]})") from None
        total += tracin(Gradients(work, case, micro_batch=grads.micro_batch), lr=float(lr))
    return total


def adamw_state(grads: Gradients, optimizer: torch.optim.Optimizer, *, lr: float = 0.0,
                grad_clip: float | None = None) -> AdamStep:
    """``optimizer``'s state as a :class:`~seedlab.lm.gradients.AdamStep` (float64, CPU), once it
    is checked to be a plain torch AdamW over exactly the model's parameters (else a one-line
    error). ``lr`` and ``grad_clip`` (None: no clipping) are the step's."""
    if not isinstance(optimizer, torch.optim.AdamW):
        raise SeedlabError(f"optimizer: the adam estimators need a torch.optim.AdamW, got {type(optimizer).__name__}")
    if any(group.get("amsgrad") or group.get("maximize") for group in optimizer.param_groups):
        raise SeedlabError("optimizer: the adam estimators support plain AdamW (amsgrad and maximize off)")
    params = list(grads.model.parameters())
    mine = {id(p) for p in params}
    covered = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if covered - mine:
        raise SeedlabError("optimizer: its parameters are not the model's (pass the trainer's opt with its model)")
    if len(covered) != len(params):
        raise SeedlabError(f"optimizer: covers {len(covered)} of the model's {len(params)} parameters")
    return AdamStep(optimizer, params, lr=lr, grad_clip=math.inf if grad_clip is None else grad_clip)


def adam_one_step(grads: Gradients, *, optimizer: torch.optim.Optimizer, lr: float,
                  grad_clip: float | None = None) -> np.ndarray:
    """One AdamW step, exact in the update: with Δθ = u(g + δ_c) − u(g),

        Δ L_q ≈ ⟨∇L_q(θ_s), Δθ⟩,

    u the trainer's whole update from the state before step s for a raw full-batch gradient
    (:class:`~seedlab.lm.gradients.AdamStep`: the clip at that gradient's own norm, m and v with
    their bias corrections, √v̂ + ε; the decoupled weight decay is the same in both runs and
    cancels) and g the twin's gradient (:meth:`Gradients.batch`). Adam's nonlinearity in δ_c is
    kept (:func:`adam_linear` drops it); the query loss's response is linearised *at θ_s*, which
    leaves out more than the O(‖Δθ‖²) curvature of L_q. At s+1 the measured effect is
    L_q(θ' + Δθ) − L_q(θ') with θ' = θ_s + u(g) the twin's next weights, i.e.
    ⟨∇L_q(θ'), Δθ⟩ + O(‖Δθ‖²), and ∇L_q(θ') = ∇L_q(θ_s) + H_q u(g) + O(‖u(g)‖²) (H_q the
    Hessian of L_q at θ_s): reading the gradient at θ_s also drops ⟨H_q u(g), Δθ⟩, which is
    *first* order in the swap (the twin's own step u(g) does not shrink with δ_c). That term is,
    to first order in u(g), the whole gap between this estimate and ``unroll`` at s+1 (which reads
    ∇L_q at θ'); at later horizons the twin's steps after s act on Δθ as well, which neither the
    estimate nor the gradient at θ_s sees. ``optimizer``: the AdamW *before* the
    injected update (the trainer at the fork point, ``trainer.step == s``); ``lr = lr_at(s)``
    (the group's lr is stale then and is not read); betas and eps from the param groups;
    ``grad_clip`` the trainer's (None: none)."""
    step = adamw_state(grads, optimizer, lr=lr, grad_clip=grad_clip)
    g, n = grads.batch(), grads.case.n_targets
    twin = step.update(g)
    return _dots(grads, lambda d: (step.update(g + d / n) - twin).to(grads.device))


@dataclass
class AdamTerms:
    """The torch AdamW step's first-order response, flat over ``model.parameters()`` (float64):
    ``Δθ ≈ −step_size ⊙ J ⊙ clip'(δ)`` (see :func:`adam_linear`)."""

    g_raw: torch.Tensor  # the twin's full-batch gradient at step s, before clipping
    g: torch.Tensor  # ... after clipping (what enters m and v)
    J: torch.Tensor  # ∂(m_t / D)/∂g, diagonal
    step_size: torch.Tensor  # lr / bc1 per parameter (bc1 may differ between params)
    grad_clip: float | None

    def delta_theta(self, delta: torch.Tensor) -> torch.Tensor:
        """First-order Δθ of the injected run's update for a raw full-batch gradient change ``delta``."""
        return -self.step_size * self.J * clip_jvp(self.g_raw, delta, self.grad_clip)[1]


def adam_terms(grads: Gradients, optimizer: torch.optim.Optimizer, *, lr: float, grad_clip: float | None,
               include_v: bool = True) -> AdamTerms:
    """:class:`AdamTerms` of the update that ``optimizer`` (its state *before* step s) makes at step s."""
    st = adamw_state(grads, optimizer, lr=lr, grad_clip=grad_clip)
    m_prev, v_prev, b1, b2, eps, t = (z.to(grads.device) for z in (st.m, st.v, st.b1, st.b2, st.eps, st.t))
    g_raw = grads.batch()
    g = clip_jvp(g_raw, g_raw, grad_clip)[0]
    m = b1 * m_prev + (1 - b1) * g
    v = b2 * v_prev + (1 - b2) * g * g
    bc1, bc2 = 1 - b1**t, 1 - b2**t
    root = torch.sqrt(v / bc2)  # √v̂ (torch: exp_avg_sq.sqrt() / √bc2)
    D = root + eps
    J = (1 - b1) / D
    if include_v:
        safe = torch.where(root > 0, root, torch.ones_like(root))
        J = J - torch.where(root > 0, (1 - b2) * m * g / (bc2 * safe * D * D), torch.zeros_like(root))
    return AdamTerms(g_raw, g, J, lr / bc1, grad_clip)


def adam_linear(grads: Gradients, *, optimizer: torch.optim.Optimizer, lr: float, grad_clip: float | None = None,
                include_v: bool = True) -> np.ndarray:
    """``adam-linear``, a labelled variant of :func:`adam_one_step`: the AdamW step first order in δ_c.

    ``optimizer`` is the AdamW *before* the injected update (the trainer at the fork point,
    ``trainer.step == s``: its state holds m_{t-1}, v_{t-1} and step t-1); ``lr = lr_at(s)``
    (the trainer sets the group lr just before ``opt.step()``, so the group's lr is stale
    then and is not read); betas, eps are read from the param groups; ``grad_clip`` is the
    trainer's clip (None: none).

    Derivation (torch.optim.AdamW, fused or not: the same arithmetic). With the clipped
    gradient g of step s and t = step + 1 after the increment,

        θ ← θ·(1 − lr·wd)                              (decoupled decay: same in both runs)
        m_t = β1·m_{t-1} + (1−β1)·g                    v_t = β2·v_{t-1} + (1−β2)·g²
        bc1 = 1 − β1^t    bc2 = 1 − β2^t               v̂ = v_t/bc2      D = √v̂ + eps
        θ ← θ − (lr/bc1) · m_t / D

    The injected run starts from the same θ, m_{t-1}, v_{t-1} and sees g + δ̃, where
    δ̃ = clip'(δ_c) is the first-order change of the *clipped* gradient (:func:`clip_jvp`;
    clipping rescales both runs by their own norms). The update differs by

        Δθ = −(lr/bc1) · [m'_t/D' − m_t/D] ≈ −(lr/bc1) · J ⊙ δ̃,
        J = ∂(m_t/D)/∂g = (1−β1)/D  −  (1−β2)·m_t·g / (bc2·√v̂·D²)

    (elementwise; ∂m_t/∂g = 1−β1, ∂v_t/∂g = 2(1−β2)g, ∂D/∂v_t = 1/(2·bc2·√v̂)). The first
    term is the preconditioner P = diag((1−β1)/(bc1·(√v̂+eps))) applied to δ̃. The second
    term — the changed *second* moment — is **not** second order: v_t depends on g², so its
    change 2(1−β2)·g·δ̃ is linear in δ̃ wherever g ≠ 0, and its size relative to the first
    term is (1−β2)/(1−β1) · m_t·g/(bc2·√v̂·D) — about 0.5·m_t·g/v̂ for (0.9, 0.95), so order
    one when the gradient is consistent from step to step. It is included (``include_v=False``
    drops it, giving −lr·⟨∇L_q, P·δ̃⟩ alone). What remains neglected is second order in δ
    (the δ̃² in v_t, the clip's curvature, the curvature of 1/D) and O(lr²) curvature of L_q.
    Caveat: the linearisation needs |δ̃| ≪ √v̂ per coordinate; where v_{t-1} ≈ 0 and g ≈ 0
    (an embedding row of a token only the candidate uses) Adam's normalised step is
    sign-like in δ and the first-order term over-states it.

        Δ L_q ≈ ⟨∇L_q, Δθ⟩ = −Σ_i ∇L_q,i · (lr/bc1)_i · J_i · δ̃_i
    """
    terms = adam_terms(grads, optimizer, lr=lr, grad_clip=grad_clip, include_v=include_v)
    n = grads.case.n_targets
    return _dots(grads, lambda d: terms.delta_theta(d / n))


def _cosines(grads: Gradients, scale: torch.Tensor | None = None) -> np.ndarray:
    """[candidates × queries] of −cos(P∇L_q, P(∇ℓ_c − ∇ℓ_r)), P = diag(``scale``) (None: I);
    0 where either vector is 0 (a candidate equal to the row)."""

    def unit(v: torch.Tensor) -> torch.Tensor:
        v = v if scale is None else v * scale
        norm = float(torch.linalg.vector_norm(v))
        return v / norm if norm > 0 else torch.zeros_like(v)

    case = grads.case
    queries = [unit(grads.query(q)) for q in case.queries]
    out = np.zeros((len(case.candidates), len(case.queries)))
    for i, c in enumerate(case.candidates):
        d = unit(grads.swap(c))
        out[i] = [-float(torch.dot(q, d)) for q in queries]
    return out


def cosine(grads: Gradients) -> np.ndarray:
    """−cos(∇L_q, ∇ℓ_c − ∇ℓ_r): the direction of a gradient step on the swap relative to the
    query, with the sign of Δ L_q (negative: a step towards the candidate lowers the query's
    loss). Unitless, in [−1, 1]; 0 where either vector is 0 (a candidate equal to the row)."""
    return _cosines(grads)


def adam_cosine(grads: Gradients, *, optimizer: torch.optim.Optimizer) -> np.ndarray:
    """TrackStar's score without projection or task Hessian (Chang et al. 2024, §3; the module doc):

        −cos(P∇L_q, P(∇ℓ_c − ∇ℓ_r)),   P = 1/(√v̂ + ε),   v̂ = v / (1 − β₂^k)

    with v the AdamW second moment at θ_s (``optimizer`` before step s, k its updates so far;
    k = 0: v̂ = 0, P = 1/ε, the plain cosine) and ε its eps. Unitless, in [−1, 1]."""
    st = adamw_state(grads, optimizer)
    k = st.t - 1
    vhat = torch.where(k > 0, st.v / torch.where(k > 0, 1 - st.b2**k, 1.0), 0.0)
    return _cosines(grads, (1 / (vhat.sqrt() + st.eps)).to(grads.device))


# --------------------------------------------------------------------------- baselines


def _baseline(grads: Gradients, score: Callable[[str | None], float]) -> np.ndarray:
    """[candidates × queries] of −(score(c) − score(r)), the same for every query; ``score(None)``
    is the replaced row's (the module doc: a larger score predicts a larger drop)."""
    case = grads.case
    row = score(None)
    col = np.array([-(score(c) - row) for c in case.candidates], dtype=np.float64)
    return np.repeat(col[:, None], len(case.queries), axis=1)


def random_baseline(grads: Gradients, *, seed: int = 0) -> np.ndarray:
    """``random``: a uniform number per text from ``default_rng([seed, *tokens])`` — seeded, and
    the same for equal texts (the own-row candidate gets exactly 0)."""
    return _baseline(grads, lambda c: float(np.random.default_rng([int(seed), *grads.case.passage(c)]).random()))


def loss_baseline(grads: Gradients) -> np.ndarray:
    """``loss``: the text's mean next-token CE at θ_s (nats/token, measures/text.py ``text_ce``)."""
    return _baseline(grads, lambda c: text_ce(grads.model, grads.case.passage(c)))


def gradnorm_baseline(grads: Gradients) -> np.ndarray:
    """``gradnorm``: ‖∇ℓ_c(θ_s)‖, the norm of the row's CE-sum gradient (∇ℓ_c = swap + ∇ℓ_r)."""
    return _baseline(grads, lambda c: float(torch.linalg.vector_norm(grads.row() if c is None
                                                                     else grads.swap(c) + grads.row())))


def length_baseline(grads: Gradients) -> np.ndarray:
    """``length``: the text's token count (the replaced row: block_size + 1)."""
    return _baseline(grads, lambda c: float(len(grads.case.passage(c))))
