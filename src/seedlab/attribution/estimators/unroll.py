"""``unroll``: the exact linearized counterfactual of one swapped row, carried through the twin's own steps.

Every estimator at θ_s predicts the effect of the swap from the state at the fork point. ``unroll``
is the reference they approximate: the candidate's run, linearized around the twin's *actual*
trajectory. Write the trainer's update at step t as a map of the whole optimizer state,

    z_{t+1} = F_t(z_t),   z = (θ, m, v)   (AdamW; plain SGD: z = θ)

with F_t the update on the ordinary batch of (seed, t) at the rate lr_t: the raw gradient
g = ∇L_t(θ), torch's global-norm clip c = g·min(1, C/(‖g‖ + 1e-6)), then (AdamW, torch's
arithmetic) m' = β₁m + (1−β₁)c, v' = β₂v + (1−β₂)c², θ' = θ(1 − lr·wd) − (lr/bc₁)·m'/(√(v'/bc₂) + ε)
with bc_k = 1 − β_kᵗ and the decay on the matrices only (the trainer's groups); SGD: θ' = θ − lr(c + wd·θ).

1. **At s** the swap's change of the state is taken *exactly*, not linearized (as ``adam`` does):
   with the twin's gradient g and δ_c = (∇ℓ_c − ∇ℓ_r)/N (attribution/estimators/builtin.py),
   Δθ_{s+1} = u(g + δ_c) − u(g) (lm/gradients.py ``AdamStep``), Δm = (1−β₁)(clip(g+δ_c) − clip(g)),
   Δv = (1−β₂)(clip(g+δ_c)² − clip(g)²); SGD: Δθ = −lr_s(clip(g+δ_c) − clip(g)).
2. **Then** the tangent is carried through the twin's steps s+1 … h by the Jacobian of each
   step's map at the twin's state: Δz_{t+1} = ∂F_t(z_t)·Δz_t, a forward-mode ``torch.func.jvp``
   of the whole update (a Hessian-vector product inside: the gradient is differentiated through the
   clip, the moments and the square root), vmapped over the candidates in chunks of ``chunk``.
   The twin is *replayed* from the kept prefix by the bank's own trainer, so the state the Jacobian
   is taken at is the twin's bit for bit; the replay's weights are checked against the twin's
   manifest at every saved step (``check``).
3. **At each horizon h**: Δ L_q ≈ ⟨∇L_q(θ_h), Δθ_h⟩ (the query's gradient at the twin's weights
   of that horizon, :class:`~seedlab.attribution.estimators.builtin.Gradients`).

So ``unroll`` is exact to first order in the swap at every horizon: what separates it from the
measured effect is the nonlinearity of training in the swap (and chaos, which amplifies it); what
separates an estimator at θ_s from it is that estimator's own approximation (the
decomposition of attribution/analyses/horizon.py). Under plain SGD at a small rate it matches the measured
effect at every horizon (tests/attribution/test_unroll.py).

Numerics: float32 (the model's dtype) throughout the propagation, the step at s in float64.
Attention runs on torch's MATH kernel inside the JVP (the fused CPU kernel has no forward-mode
derivative); the primal it linearizes at is the replayed twin's state. Where the twin's v is
exactly 0, √v has no derivative: the square root's tangent is taken as 0 there (Adam's update is
sign-like in such a coordinate; a linearization cannot follow it). bf16 runs are linearized in
float32 around their (autocast) trajectory.

Cost: one replay of the twin per seed, plus per candidate and step one JVP of the update — about
3-4 forward+backward passes of the batch (docs/benchmarks.md measures it against the bank's
training of the same candidates).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.func import functional_call, grad, jvp, vmap

from seedlab.attribution.estimators.builtin import Gradients, adamw_state
from seedlab.errors import SeedlabError
from seedlab.lm.batches import get_batch
from seedlab.lm.gradients import clip_by_norm
from seedlab.lm.model import masked_ce_sum
from seedlab.lm.trainer import Trainer

State = tuple[tuple[torch.Tensor, ...], ...]  # (θ,) for SGD, (θ, m, v) for AdamW: each a tuple over the parameters


@contextlib.contextmanager
def _math_attention(device: torch.device) -> Iterator[None]:
    """Attention on torch's MATH kernel (differentiable in forward mode, on any device)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


def _sqrt0(v: torch.Tensor) -> torch.Tensor:
    """√v with tangent 0 where v = 0 (the module doc)."""
    pos = v > 0
    return torch.where(pos, torch.where(pos, v, torch.ones_like(v)).sqrt(), torch.zeros_like(v))


class Step:
    """The trainer's update at one step as a pure function of the optimizer state (module doc), and
    its Jacobian-vector product. Built from a :class:`~seedlab.lm.trainer.Trainer` *before* it
    consumes the batch of its current step (its model, optimizer state, batch and rate)."""

    def __init__(self, trainer: Trainer):
        model, opt, cfg = trainer.model, trainer.opt, trainer.cfg
        self.model, self.clip = model, float(cfg.grad_clip)
        self.names = [n for n, _ in model.named_parameters()]
        params = [p for _, p in model.named_parameters()]
        group = {id(p): g for g in opt.param_groups for p in g["params"]}
        self.wd = [float(group[id(p)]["weight_decay"]) for p in params]
        self.adam = isinstance(opt, torch.optim.AdamW)
        self.lr = trainer.lr
        x, y = get_batch(trainer.tokens, trainer.seed, trainer.step, cfg.batch_size, model.config.block_size)
        self.x, self.y = x.to(trainer.device), y.to(trainer.device)
        theta = tuple(p.detach() for p in params)
        if self.adam:
            st = [opt.state.get(p, {}) for p in params]
            self.beta1, self.beta2 = opt.param_groups[0]["betas"]
            self.eps = float(opt.param_groups[0]["eps"])
            self.t = (int(st[0]["step"]) if st[0] else 0) + 1  # the step count after the increment
            m = tuple(s["exp_avg"].detach() if s else torch.zeros_like(p) for s, p in zip(st, theta))
            v = tuple(s["exp_avg_sq"].detach() if s else torch.zeros_like(p) for s, p in zip(st, theta))
            self.state: State = (theta, m, v)
        else:
            self.state = (theta,)

    def loss(self, theta: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The batch's loss as the trainer computes it: masked CE sum / N (every target counts)."""
        logits, _ = functional_call(self.model, dict(zip(self.names, theta)), (self.x,))
        return masked_ce_sum(logits, self.y, torch.ones_like(self.y, dtype=torch.bool)) / self.y.numel()

    def __call__(self, *state: tuple[torch.Tensor, ...]) -> State:
        """z_{t+1} = F_t(z_t)."""
        theta = state[0]
        g = grad(self.loss)(theta)
        norm = torch.sqrt(sum((gi * gi).sum() for gi in g))
        k = torch.clamp(self.clip / (norm + 1e-6), max=1.0)
        c = tuple(gi * k for gi in g)
        lr = self.lr
        if not self.adam:
            return (tuple(p - lr * (ci + wd * p) for p, ci, wd in zip(theta, c, self.wd)),)
        _, m, v = state
        b1, b2, t = self.beta1, self.beta2, self.t
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        m2 = tuple(b1 * mi + (1 - b1) * ci for mi, ci in zip(m, c))
        v2 = tuple(b2 * vi + (1 - b2) * ci * ci for vi, ci in zip(v, c))
        th2 = tuple(p * (1 - lr * wd) - (lr / bc1) * mi / (_sqrt0(vi / bc2) + self.eps)
                    for p, wd, mi, vi in zip(theta, self.wd, m2, v2))
        return th2, m2, v2

    def push(self, tangents: State, chunk: int | None) -> State:
        """∂F_t(z_t)·Δz for a batch of tangents (each tensor with a leading candidate axis)."""

        def one(*tan: tuple[torch.Tensor, ...]) -> State:
            return jvp(self, self.state, tan)[1]

        with _math_attention(self.x.device):
            return vmap(one, chunk_size=chunk)(*tangents)


def first_step(grads: Gradients, trainer: Trainer, *, tangent: bool = False) -> State:
    """The exact change of the optimizer state the swap makes at s, per candidate (module doc, 1.),
    in the parameters' dtype, stacked over ``grads.case.candidates``: (Δθ,) or (Δθ, Δm, Δv).

    ``tangent``: instead its derivative in the row's loss weight at w = 0 (the row weighed by w:
    the gradient g + w·δ_c), per unit w — the central difference (Δz(+h) − Δz(−h))/2h at
    h = :data:`TANGENT_STEP` in float64 (error O(h²) of the step's curvature, ~1e-8 relative; the clip's
    kink at ‖g‖ = C aside)."""
    params = [p for _, p in trainer.model.named_parameters()]
    if list(trainer.model.parameters()) != params:
        raise SeedlabError("unroll: the model's parameters() and named_parameters() orders differ")
    if tangent:
        plus, minus = _first_rows(grads, trainer, TANGENT_STEP), _first_rows(grads, trainer, -TANGENT_STEP)
        rows = [(a - b) / (2 * TANGENT_STEP) for a, b in zip(plus, minus)]
    else:
        rows = _first_rows(grads, trainer, 1.0)
    return tuple(_unflatten(r, params) for r in rows)


#: h of the tangent's central difference (module doc; :func:`first_step`)
TANGENT_STEP = 1e-4


def _first_rows(grads: Gradients, trainer: Trainer, w: float) -> list[torch.Tensor]:
    """The state's change at s when each candidate's row is weighed by ``w`` (the gradient g + w·δ_c):
    per channel (Δθ[, Δm, Δv]) a [K, P] float64 tensor."""
    opt, clip = trainer.opt, float(trainer.cfg.grad_clip)
    g, n = grads.batch().double().cpu(), grads.case.n_targets
    adam = isinstance(opt, torch.optim.AdamW)
    if adam:
        step = adamw_state(grads, opt, lr=trainer.lr, grad_clip=clip)  # checked: a plain AdamW over the model
        twin = step.update(g)
        b1, b2 = step.b1, step.b2
    c0 = clip_by_norm(g, clip)
    rows: list[list[torch.Tensor]] = []
    for name in grads.case.candidates:
        gc = g + w * grads.swap(name).double().cpu() / n
        c1 = clip_by_norm(gc, clip)
        if adam:
            rows.append([step.update(gc) - twin, (1 - b1) * (c1 - c0), (1 - b2) * (c1 * c1 - c0 * c0)])
        else:
            rows.append([-trainer.lr * (c1 - c0)])
    return [torch.stack([r[k] for r in rows]) for k in range(len(rows[0]))]


def _unflatten(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """[K, P] flat (parameters() order) -> per-parameter [K, *shape] in each parameter's dtype and device."""
    out, i = [], 0
    for p in params:
        out.append(flat[:, i : i + p.numel()].reshape(flat.shape[0], *p.shape).to(p.dtype).to(p.device))
        i += p.numel()
    return tuple(out)


def _flat(theta: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Per-parameter [K, *shape] -> [K, P] float64."""
    return torch.cat([t.reshape(t.shape[0], -1).double() for t in theta], dim=1)


#: what :func:`unroll` can return, by estimator name (attribution/estimators/registry.py)
UNROLL, READOUT, TANGENT = "unroll", "unroll-readout", "unroll-tangent"


def unroll(grads: Gradients, trainer: Trainer, horizons: Sequence[int], *, chunk: int | None = 16,
           check: Callable[[int, dict[str, torch.Tensor]], None] | None = None,
           tick: Callable[[], None] | None = None) -> dict[int, np.ndarray]:
    """``{h: [candidates × queries]}`` of ⟨∇L_q(θ_h), Δθ_h⟩ (:func:`responses`' ``unroll`` alone)."""
    return responses(grads, trainer, horizons, chunk=chunk, check=check, tick=tick)[UNROLL]


def responses(grads: Gradients, trainer: Trainer, horizons: Sequence[int], *, chunk: int | None = 16,
              check: Callable[[int, dict[str, torch.Tensor]], None] | None = None,
              tick: Callable[[], None] | None = None,
              outputs: Sequence[str] = (UNROLL,)) -> dict[str, dict[int, np.ndarray]]:
    """``{h: [candidates × queries]}`` of ⟨∇L_q(θ_h), Δθ_h⟩ for every horizon ``h`` (updates
    completed, each > s) — the module doc's linear response.

    ``grads``: the :class:`Gradients` of the case at θ_s (``trainer``'s model; its swaps and batch
    gradient are reused); ``trainer``: the twin at the fork point (``step == s``: the prefix
    loaded); it is not changed (a fork of it is replayed). ``chunk``: candidates per vmapped JVP
    (memory; None: all at once). ``check(t, weights)``: called with the replayed twin's weights after
    every update (the caller compares them with the twin's manifest). ``tick``: called once per update.

    Returns ``{name: {h: [candidates × queries]}}`` for each of ``outputs`` —
    ``unroll`` (above); ``unroll-readout``, the same tangent read out exactly, L_q(θ_h + Δθ_h) − L_q(θ_h)
    (each candidate's weights one forward over every query: the readout's curvature apart from the
    propagation's error); ``unroll-tangent``, the w → 0 limit per unit row weight (the first step's
    derivative in w, :func:`first_step` ``tangent``, carried and read out linearly) — one replay, the
    tangents of both kinds pushed together."""
    s = trainer.step
    hs = sorted(set(int(h) for h in horizons))
    if not hs or hs[0] <= s or hs[-1] > trainer.cfg.steps:
        raise SeedlabError(f"unroll: horizons must be after the injection step {s} and within the run's "
                           f"{trainer.cfg.steps} updates, got {hs}")
    if chunk is not None and chunk < 1:
        raise SeedlabError(f"unroll: chunk must be at least 1, got {chunk}")
    bad = [o for o in outputs if o not in (UNROLL, READOUT, TANGENT)]
    if bad or not outputs:
        raise SeedlabError(f"unroll: outputs are {UNROLL}, {READOUT} and {TANGENT}, got {list(outputs) or 'none'}")
    exact, linear = UNROLL in outputs or READOUT in outputs, TANGENT in outputs
    parts = ([first_step(grads, trainer)] if exact else []) + ([first_step(grads, trainer, tangent=True)] if linear else [])
    tangents = tuple(tuple(torch.cat(ts) for ts in zip(*channel)) for channel in zip(*parts))  # [K or 2K, ...]
    K = len(grads.case.candidates)
    twin = trainer.fork()
    twin.advance()  # the ordinary update of s: the twin itself
    out: dict[str, dict[int, np.ndarray]] = {o: {} for o in outputs}
    while True:
        t = twin.step
        if check is not None:
            check(t, twin.weights())
        if tick is not None:
            tick()
        if t in hs:
            lin = _predict(twin, grads, tangents[0])
            if UNROLL in outputs:
                out[UNROLL][t] = lin[:K]
            if TANGENT in outputs:
                out[TANGENT][t] = lin[-K:]
            if READOUT in outputs:
                out[READOUT][t] = _readout(twin, grads, tuple(d[:K] for d in tangents[0]))
        if t == hs[-1]:
            return out
        tangents = Step(twin).push(tangents, chunk)
        twin.advance()


def _readout(twin: Trainer, grads: Gradients, dtheta: tuple[torch.Tensor, ...]) -> np.ndarray:
    """[candidates × queries] of L_q(θ_h + Δθ_h) − L_q(θ_h) at the twin's current weights: every query
    padded into one batch, one forward per candidate (eval mode; float64 cross-entropy as
    measures/text.py ``text_ce`` takes it)."""
    model = twin.model
    names = [n for n, _ in model.named_parameters()]
    texts = list(grads.case.queries.values())
    T = max(len(ids) for ids in texts) - 1
    x = torch.zeros(len(texts), T, dtype=torch.int64)
    y = torch.zeros(len(texts), T, dtype=torch.int64)
    mask = torch.zeros(len(texts), T, dtype=torch.bool)
    for i, ids in enumerate(texts):
        ids = torch.as_tensor(list(ids), dtype=torch.int64)
        x[i, : len(ids) - 1], y[i, : len(ids) - 1], mask[i, : len(ids) - 1] = ids[:-1], ids[1:], True
    device = next(model.parameters()).device
    x, y, mask = x.to(device), y.to(device), mask.to(device)

    def losses(theta: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, _ = functional_call(model, theta, (x,))
        ce = torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="none")
        ce = ce.view(y.shape) * mask
        return ce.sum(1) / mask.sum(1)

    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            base = {n: p.detach() for n, p in model.named_parameters()}
            at = losses(base)
            rows = [losses({n: base[n] + d[k].to(base[n].dtype) for n, d in zip(names, dtheta)}) - at
                    for k in range(dtheta[0].shape[0])]
    finally:
        model.train(was)
    return torch.stack(rows).cpu().numpy()


def _predict(twin: Trainer, grads: Gradients, dtheta: tuple[torch.Tensor, ...]) -> np.ndarray:
    """[candidates × queries] of ⟨∇L_q(θ_h), Δθ_h⟩ at the twin's current weights."""
    at_h = Gradients(twin.model, grads.case, micro_batch=grads.micro_batch)
    q = torch.stack([at_h.query(name) for name in grads.case.queries])  # [Q, P] float64
    return (_flat(dtheta).to(q.device) @ q.T).cpu().numpy()

