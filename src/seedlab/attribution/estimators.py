"""Influence estimators: predicted Δ L_query of replacing one row of one batch by a candidate.

The measured quantity they estimate (the attribution bench compares them with it): two runs
identical up to step ``s``; at step ``s`` the twin trains on the ordinary batch (x, y) and the
other run on the same batch with row ``r`` replaced by candidate ``c`` (lm/batches.py ``inject``:
the passage, then padding that the loss masks). Then

    Δ L_query(h) = L_query(θ_with_c at horizon h) − L_query(θ_twin at horizon h)

where ``L_query`` is a query text's mean next-token cross-entropy in nats/token
(:func:`query_loss`). Sign: learning the candidate lowers its own loss, so a candidate used
as its own query gives a *negative* Δ.

The trainer's loss at step s is Σ(masked CE over all rows) / N with N = B·T fixed for every
condition, so the swap changes the full-batch gradient by

    δ_c = (∇ℓ_c − ∇ℓ_r) / N            ℓ = a row's CE *sum* (nats), gradients at θ_s.

Every estimator is a function of δ_c (raw, before clipping) and of the query gradient
∇L_query; they differ in the map from δ_c to a weight change and in the weights they
are evaluated at:

=========  ===============================================  ===========================  ==========
name       estimate                                         horizon                      unit
=========  ===============================================  ===========================  ==========
sgd        −lr_s ⟨∇L_q, clip'(δ_c)⟩                          s+1 (one SGD step)           nats/token
adam       ⟨∇L_q, Δθ⟩, Δθ the first-order change of the      s+1 (the real AdamW step)    nats/token
           torch AdamW update (:func:`adam_one_step`)
tracin     −Σ_k lr_k ⟨∇L_q(θ_k), ∇ℓ_c(θ_k) − ∇ℓ_r(θ_k)⟩ / N   the last checkpoint          nats/token
cosine     −cos(∇L_q, ∇ℓ_c − ∇ℓ_r)                           none (a direction only)      cosine
ekfac      −⟨∇L_q, (F + λ)⁻¹ (∇ℓ_c − ∇ℓ_r)⟩ / D, kronfluence  convergence (response fn)    nats/token
kfac       the same with K-FAC curvature                    convergence                  nats/token
=========  ===============================================  ===========================  ==========

(the two influence-function rows live in :mod:`seedlab.attribution.influence`). All gradients
are of the model in eval mode, in the model's dtype, accumulated in float64, flattened over
``model.parameters()`` (seedlab.lm.gradients' helpers). A candidate identical to the replaced
row (its ``block_size + 1`` tokens) gives exactly 0 for every estimator: its row gradient is
computed by the very same kernels as the ordinary row's.

Entry points: :func:`estimate` (several estimators, one long DataFrame) and :func:`run`
(one estimator, a [candidates × queries] array); :data:`ESTIMATORS` is the registry and
:func:`get_estimator` the one place that turns a name into an estimator (unknown name or a
missing optional library: a one-line :class:`~seedlab.errors.SeedlabError`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import check_passage, inject
from seedlab.lm.determinism import deterministic
from seedlab.lm.gradients import ce_sum_grad
from seedlab.lm.model import GPT

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


@torch.no_grad()
def query_loss(model: GPT, ids: Sequence[int]) -> float:
    """L_query: mean next-token cross-entropy of ``ids`` in nats/token (eval mode, float64 CE
    of the model's logits). What the estimators predict the change of."""
    x, y, _ = query_tensors(ids)
    device = next(model.parameters()).device
    with _eval(model):
        logits, _ = model(x.to(device))
    return float(torch.nn.functional.cross_entropy(logits[0].double(), y[0].to(device)))


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


@dataclass
class AdamTerms:
    """The torch AdamW step's first-order response, flat over ``model.parameters()`` (float64):
    ``Δθ ≈ −step_size ⊙ J ⊙ clip'(δ)`` (see :func:`adam_one_step`)."""

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
    model = grads.model
    if not isinstance(optimizer, torch.optim.AdamW):
        raise SeedlabError(f"optimizer: the adam estimator needs a torch.optim.AdamW, got {type(optimizer).__name__}")
    params = list(model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    offsets = np.cumsum([0] + [p.numel() for p in params])
    dev, f64 = grads.device, torch.float64
    P = int(offsets[-1])
    m_prev, v_prev, b1, b2, eps, t = (torch.zeros(P, dtype=f64, device=dev) for _ in range(6))
    seen = 0
    for group in optimizer.param_groups:
        if group.get("amsgrad") or group.get("maximize"):
            raise SeedlabError("optimizer: the adam estimator supports plain AdamW (amsgrad and maximize off)")
        for p in group["params"]:
            if id(p) not in index:
                raise SeedlabError("optimizer: its parameters are not the model's (pass the trainer's opt with its model)")
            i = index[id(p)]
            sl = slice(int(offsets[i]), int(offsets[i + 1]))
            st = optimizer.state.get(p, {})
            if st:
                m_prev[sl] = st["exp_avg"].detach().reshape(-1).to(dev, f64)
                v_prev[sl] = st["exp_avg_sq"].detach().reshape(-1).to(dev, f64)
            t[sl] = float(st["step"]) + 1 if st else 1.0
            b1[sl], b2[sl], eps[sl] = group["betas"][0], group["betas"][1], group["eps"]
            seen += 1
    if seen != len(params):
        raise SeedlabError(f"optimizer: covers {seen} of the model's {len(params)} parameters")
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


def adam_one_step(grads: Gradients, *, optimizer: torch.optim.Optimizer, lr: float, grad_clip: float | None = None,
                  include_v: bool = True) -> np.ndarray:
    """One torch AdamW step, first order in the gradient change (the Adam preconditioner of step s).

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


def tracin(grads: Gradients, *, checkpoints: Sequence[tuple[Mapping[str, torch.Tensor], float]]) -> np.ndarray:
    """TracIn-CP (Pruthi et al., 2020) for the swap, in the Δ L_query sign convention:

        Δ L_q ≈ −Σ_k lr_k · ⟨∇L_q(θ_k), ∇ℓ_c(θ_k) − ∇ℓ_r(θ_k)⟩ / N

    ``checkpoints``: (state_dict, lr) pairs; θ_k is the state dict (model weights, the
    ``step-<t>`` files' tensors) and lr_k the rate of the update that *starts* from it,
    ``lr_at(t)`` (lm/schedule.py's step convention). Plain gradients: no clipping, no Adam.
    With the single checkpoint (θ_s, lr_at(s)) it is exactly the ``sgd`` estimate without
    clipping. With later checkpoints of the twin run it is TracIn's trajectory heuristic —
    the sum of the one-step effects *as if the row were swapped at each checkpoint's step* —
    not a propagation of the single swap at s; its horizon is the last checkpoint. The
    given model is not changed (a copy is loaded with each state dict)."""
    if not checkpoints:
        raise SeedlabError("checkpoints: tracin needs at least one (state_dict, lr) pair")
    case, n = grads.case, grads.case.n_targets
    work = copy.deepcopy(grads.model)
    total = np.zeros((len(case.candidates), len(case.queries)))
    for k, (state, lr) in enumerate(checkpoints):
        try:
            work.load_state_dict(state)
        except RuntimeError as e:
            raise SeedlabError(f"checkpoints[{k}]: does not fit the model ({str(e).splitlines()[0]})") from None
        at_k = Gradients(work, case, micro_batch=grads.micro_batch)
        total += _dots(at_k, lambda d, lr=float(lr): -lr * d / n)  # sgd_one_step's arithmetic
    return total


def cosine(grads: Gradients) -> np.ndarray:
    """−cos(∇L_q, ∇ℓ_c − ∇ℓ_r): the direction of a gradient step on the swap relative to the
    query, with the sign of Δ L_q (negative: a step towards the candidate lowers the query's
    loss). Unitless, in [−1, 1]; 0 where either vector is 0 (a candidate equal to the row)."""

    case = grads.case
    out = np.zeros((len(case.candidates), len(case.queries)))
    for i, c in enumerate(case.candidates):
        d = grads.swap(c)
        dn = float(torch.linalg.vector_norm(d))
        for j, q in enumerate(case.queries):
            gq = grads.query(q)
            qn = float(torch.linalg.vector_norm(gq))
            out[i, j] = 0.0 if dn == 0 or qn == 0 else -float(torch.dot(gq, d)) / (dn * qn)
    return out
