"""An arm: one run of a seed, declared as data — the twin plus what differs from it.

A fork design trains, per seed, a shared prefix to the fork step s and then one run per arm:

- the **twin** (:data:`TWIN`): nothing differs; every batch is the ordinary batch of (seed, step);
- an **injection** arm: at step t, row r of the batch carries given tokens
  (``injections={(t, r): tokens}``). One text in one row at s is a twins condition or an
  attribution candidate; the same text at s, s + 10 and s + 20, or two texts in two rows of one
  batch, are a few more entries;
- a **weighted** injection: the injected row carries a loss weight w in (0, 1]
  (``weights={(t, r): w}``): the batch's loss is (Σ_{i≠r} ℓ_i + (1 − w)·ℓ_r + w·ℓ_passage)/N, so
  w = 1 is the plain replacement (bit for bit) and w → 0 the infinitesimal one (lm/trainer.py
  ``Trainer.backward``); the size axis of a single row at a fixed trajectory;
- a **removal** arm: rows of the ordinary batch left out of the loss (``removals={(t, r), ...}``): the row's
  loss weight set to 0 with no text in its place, so the batch's loss is Σ_{i∉removed} ℓ_i / N with N = B·T
  unchanged (lm/trainer.py ``Trainer.backward``; not the mean of B − 1 rows). It is w_r = 0 in (Σ_i w_i ℓ_i)/N,
  the parametrisation attribution/estimators/metagrad.py differentiates at w = 1 (a removal is Δw = −1). One row at one
  step is a leave-one-out arm; random rows of many steps, a group (attribution/bank/run.py);
- an arm that leaves the shared prefix **before** the fork step (``start`` = t < s): it starts from the
  prefix's own state after t updates (forks/prefix.py ``SharedPrefix``: kept when the prefix trains, or
  trained again from step 0, which is the same run: the prefix is a pure function of the seed) instead of s,
  so it may change batches from t on (a leave-one-out of a row older than s). It is bitwise the twin through
  t, and *not* at s: it is left out of the design's comparison at s;
- a **perturbation** arm: at step s something moves by a given delta (``{tensor: delta}``, or a
  function of the run's trainer then), in one of two channels (``Perturbation.channel``):
  ``"weights"``: the weights, just before that step's update, after its record (so the arm is bitwise
  the twin up to and at s; the weight kick :func:`weight_kick`, the one-ulp :func:`nudge`);
  ``"gradient"``: the raw batch gradient of step s, where a row's own gradient difference enters it
  (lm/trainer.py ``Trainer.backward``: after the backward and the weighted rows, before the sum over
  ranks, the clip and AdamW), so it passes through the clip and both AdamW moments exactly as a row does
  (:func:`matched_gradient`); the weights are the twin's through s and differ from s + 1 on.

:func:`check_arms` refuses, in one line, an arm that cannot run: a name that is not a folder name
or is used twice, an injection before the fork or after the end or into a row the batch does not
have, a text that does not fit a row, a delta for a tensor the model does not have (or of another shape), a
removal outside the arm's run or of a row the batch does not have (or that the arm also injects into), a start
after the fork step.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from seedlab.errors import SeedlabError

#: an arm's name is a folder name: letters, digits, '.', '_', '-' and (not first) '@' (a twins row-weight arm:
#: ``<arm>@w<w>``)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")


#: where a perturbation acts (module doc): the weights before the step's update, or the step's raw gradient
CHANNELS = ("weights", "gradient")


@dataclass(frozen=True)
class Perturbation:
    """``delta`` ({state_dict key: tensor of the same shape}) at ``step``, in ``channel``: ``"weights"``,
    the weights move by it just before that step's update; ``"gradient"``, it is added to that step's raw
    batch gradient before clipping (keys: the model's parameters). ``delta`` may also be a function of the
    run's trainer at that step (``trainer -> {key: tensor}``, or ``-> ({key: tensor}, {more of the record})``:
    a nudge of one ulp, noise scaled to a measured norm), computed when it is due. ``what`` says what it is,
    for the records."""

    step: int
    delta: Mapping[str, torch.Tensor] | Callable[..., Mapping[str, torch.Tensor] | tuple[Mapping[str, torch.Tensor], dict]]
    what: str = "perturbation"
    channel: str = "weights"

    def due(self, trainer) -> tuple[Mapping[str, torch.Tensor], dict]:
        """The delta at this step (computed now when it is a function of the trainer) and what the record gains."""
        out = self.delta(trainer) if callable(self.delta) else self.delta
        return out if isinstance(out, tuple) else (out, {})


def _norm(tensors) -> float:
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors)))


@dataclass(frozen=True)
class Arm:
    """One run of a seed: ``name`` (its folder), the rows it injects, the rows it removes, the perturbation it
    applies, and where it leaves the shared prefix (``start``; None: the design's fork step)."""

    name: str
    injections: Mapping[tuple[int, int], Sequence[int]] = field(default_factory=dict)  # {(step, row): token ids}
    perturbation: Perturbation | None = None
    weights: Mapping[tuple[int, int], float] = field(default_factory=dict)  # {(step, row): loss weight}; absent: 1
    removals: frozenset[tuple[int, int]] = frozenset()  # {(step, row)}: left out of the loss (weight 0, no text)
    start: int | None = None  # the step it leaves the shared prefix (None: the fork step s; t < s: module doc)

    @property
    def is_twin(self) -> bool:
        """Nothing differs from the ordinary run (and it forks where the twin does)."""
        return not self.injections and not self.removals and self.perturbation is None and self.start is None

    def leaves(self, fork: int) -> int:
        """The step this arm starts from in a design forked at ``fork``: ``start``, else the fork step."""
        return fork if self.start is None else int(self.start)

    def removed_at(self, step: int) -> frozenset[int] | None:
        """The rows of the batch of ``step`` this arm removes from the loss (None: none)."""
        rows = frozenset(r for t, r in self.removals if t == step)
        return rows or None

    def rows_at(self, step: int) -> dict[int, Sequence[int]] | None:
        """``{row: token ids}`` injected into the batch of ``step`` (None: the ordinary batch)."""
        rows = {r: tokens for (t, r), tokens in self.injections.items() if t == step}
        return rows or None

    def weights_at(self, step: int) -> dict[int, float] | None:
        """``{row: w}`` of the rows injected at ``step`` whose loss weight is not 1 (None: none)."""
        w = {r: float(v) for (t, r), v in self.weights.items() if t == step and float(v) != 1.0}
        return w or None

    def perturb(self, trainer, step: int) -> dict | None:
        """Apply a weights-channel perturbation if it is due at ``step`` to ``trainer``'s model (in place,
        exactly: ``w += delta``); returns what was done (None: nothing due, or a gradient-channel one:
        :meth:`gradient_delta`): the delta's norm, how far the weights actually moved (float32 rounding),
        and the SHA-256 of every delta tensor."""
        from seedlab.store import tensor_hashes

        p = self.perturbation
        if p is None or p.step != step or p.channel != "weights":
            return None
        delta, more = p.due(trainer)
        state = trainer.model.state_dict()
        bad = [k for k, d in delta.items() if k not in state or tuple(state[k].shape) != tuple(d.shape)]
        if bad:
            raise SeedlabError(f"arm {self.name}: a delta for {bad[0]!r} that the model has no tensor of that shape for")
        before = {k: state[k].detach().clone() for k in delta}
        with torch.no_grad():
            for name, d in delta.items():
                state[name].add_(d.to(state[name].device, state[name].dtype))
        return {"step": step, "what": p.what, "norm": _norm(delta.values()),
                "moved": _norm(state[k].detach() - before[k] for k in delta), "sha256": tensor_hashes(delta)} | more

    def gradient_delta(self, trainer, step: int) -> tuple[list[torch.Tensor], dict] | None:
        """A gradient-channel perturbation due at ``step``, for ``trainer`` at θ_step (None: nothing due, or a
        weights-channel one: :meth:`perturb`): one tensor per parameter in ``trainer.params``' order (zeros
        where the delta names none), for ``Trainer.advance(grad_delta=...)`` or ``Stack.advance``, and the
        record: the channel, the delta's norm and the SHA-256 of every delta tensor (and what the delta's
        function adds). Nothing is applied here; the weights and the optimizer are untouched."""
        from seedlab.store import tensor_hashes

        p = self.perturbation
        if p is None or p.step != step or p.channel != "gradient":
            return None
        delta, more = p.due(trainer)
        params = dict(trainer.model.named_parameters())
        bad = [k for k, d in delta.items() if k not in params or tuple(params[k].shape) != tuple(d.shape)]
        if bad:
            raise SeedlabError(f"arm {self.name}: a gradient delta for {bad[0]!r} that the model has no parameter of that shape for")
        out = [delta[k].detach() if k in delta else torch.zeros_like(q) for k, q in params.items()]
        record = {"step": step, "what": p.what, "channel": "gradient", "norm": _norm(delta.values()),
                  "sha256": tensor_hashes(dict(delta))}
        return out, record | more

    def record(self) -> dict:
        """JSON: what differs (each injection's step, row, length and the SHA-256 of its tokens)."""
        inj = [{"step": t, "row": r, "tokens": len(ids), "sha256": hashlib.sha256(str(list(ids)).encode()).hexdigest()}
               | ({"weight": float(self.weights[t, r])} if float(self.weights.get((t, r), 1.0)) != 1.0 else {})
               for (t, r), ids in sorted(self.injections.items())]
        p = self.perturbation
        return {"name": self.name, "injections": inj, "perturbation": None if p is None else
                {"step": p.step, "what": p.what} | ({"channel": p.channel} if p.channel != "weights" else {})} | (
            {"removals": [{"step": t, "row": r} for t, r in sorted(self.removals)]} if self.removals else {}) | (
            {"start": self.start} if self.start is not None else {})


#: the run every other arm is compared with
TWIN = Arm("twin")


def injection(name: str, tokens: Sequence[int], step: int, row: int, weight: float = 1.0) -> Arm:
    """The usual arm: ``tokens`` in row ``row`` of the batch of ``step`` (with loss weight ``weight``: module doc)."""
    return Arm(name, {(step, row): list(tokens)}, weights={(step, row): float(weight)} if weight != 1.0 else {})


def removal(name: str, rows, start: int | None = None) -> Arm:
    """Rows of the ordinary batches left out of the loss: ``rows`` an iterable of (step, row) (module doc);
    ``start``: where the arm leaves the shared prefix (None: the fork step)."""
    return Arm(name, removals=frozenset((int(t), int(r)) for t, r in rows), start=start)


def nudge(name: str, step: int, tensor: str, index: int) -> Arm:
    """The smallest possible difference: at ``step`` one weight element (``tensor``, flat ``index``)
    moves by one unit in the last place, toward +inf."""

    def delta(trainer) -> dict[str, torch.Tensor]:
        state = trainer.model.state_dict()
        if tensor not in state or not 0 <= index < state[tensor].numel():
            raise SeedlabError(f"nudge: the model has no element {index} in a tensor {tensor!r}")
        w = state[tensor].detach().reshape(-1)[index]
        d = torch.zeros_like(state[tensor])
        d.reshape(-1)[index] = torch.nextafter(w, torch.tensor(float("inf"), dtype=w.dtype, device=w.device)) - w
        return {tensor: d}  # w + (next - w) is next exactly: the difference of adjacent floats is exact

    return Arm(name, perturbation=Perturbation(step, delta, f"one ulp of {tensor}[{index}]"))


def _direction(trainer, seed: int, size: float) -> dict[str, torch.Tensor]:
    """A random direction of norm ``size``: standard normal in every parameter (float64, from ``seed`` and the
    run's training seed, in ``named_parameters()`` order), scaled, then cast to each parameter's dtype."""
    params = dict(trainer.model.named_parameters())
    g = torch.Generator().manual_seed(seed * 1_000_003 + trainer.seed)
    direction = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in params.items()}
    scale = size / _norm(direction.values())
    return {k: (d * scale).to(params[k].dtype) for k, d in direction.items()}


def weight_kick(name: str, like: Arm, step: int, seed: int, pad_id: int = 0) -> Arm:
    """Same size, no content, once: at ``step`` the weights move in a random direction (normal in every
    parameter, from ``seed`` and the run's training seed) by exactly the norm of ``like``'s own update
    difference there — ‖θ_{s+1}(like) − θ_{s+1}(twin)‖, both updates taken from this run's θ_s. It moves
    the weights only, not AdamW's moments: a row's impulse keeps moving the weights for ~1/(1 − β₁) more
    updates through the first moment, this one does not (:func:`matched_gradient` does). Was ``matched_noise``."""

    def delta(trainer) -> tuple[dict[str, torch.Tensor], dict]:
        a, b = trainer.fork(), trainer.fork()
        a.advance(like.rows_at(step), pad_id=pad_id, weights=like.weights_at(step))
        b.advance(None, pad_id=pad_id)
        pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
        size = _norm(pa[k].detach() - pb[k].detach() for k in pa)
        return _direction(trainer, seed, size), {"like": like.name}

    return Arm(name, perturbation=Perturbation(step, delta, f"random direction, the norm of {like.name}'s update difference"))


def gradient_difference(trainer, like: Arm, step: int, pad_id: int = 0) -> list[torch.Tensor]:
    """∇L_batch(``like``'s rows at ``step``) − ∇L_batch(ordinary batch) at ``trainer``'s θ, per parameter
    (float64, of the raw float32 gradients, before clipping, summed over ranks: what the row adds to the
    gradient where it enters, lm/trainer.py ``Trainer.backward``). Leaves the weights and the optimizer
    untouched (only ``.grad``, which the next update replaces) and the global random state as it was."""
    devices = [trainer.device] if trainer.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # a forward that drew from it (dropout) leaves no trace
        trainer.backward(like.rows_at(step), pad_id=pad_id, weights=like.weights_at(step))
        with_row = [q.grad.detach().clone() for q in trainer.params]
        trainer.backward(None, pad_id=pad_id)
        diff = [a.double() - q.grad.detach().double() for a, q in zip(with_row, trainer.params)]
    trainer.opt.zero_grad(set_to_none=True)
    return diff


def batch_gradient_difference(trainer, like: Arm, step: int, pad_id: int = 0) -> float:
    """‖:func:`gradient_difference`‖: the norm of what ``like``'s rows add to the raw batch gradient at ``step``."""
    return _norm(gradient_difference(trainer, like, step, pad_id))


def _update_norms(trainer, like: Arm, step: int, grad_delta: list[torch.Tensor], pad_id: int) -> dict:
    """What a gradient delta and ``like``'s rows each do to the update of ``step``, from forks of this θ_s:
    ‖θ_{s+1}(delta) − θ_{s+1}(twin)‖ (``update_norm``) and ‖θ_{s+1}(like) − θ_{s+1}(twin)‖ (``like_update_norm``)."""
    kicked, passage, twin = trainer.fork(), trainer.fork(), trainer.fork()
    kicked.advance(None, pad_id=pad_id, grad_delta=grad_delta)
    passage.advance(like.rows_at(step), pad_id=pad_id, weights=like.weights_at(step))
    twin.advance(None, pad_id=pad_id)
    apart = lambda a: _norm(x.detach() - y.detach() for x, y in zip(a.params, twin.params))
    return {"update_norm": apart(kicked), "like_update_norm": apart(passage)}


def sign_gradient(name: str, like: Arm, step: int, seed: int, pad_id: int = 0) -> Arm:
    """Same size in every coordinate, no direction: at ``step`` no row changes; ``like``'s own batch-gradient
    difference there (:func:`gradient_difference`, at this run's θ_s) is added to the raw batch gradient with
    every coordinate's sign drawn at random (Rademacher, from ``seed`` and the run's training seed):
    δ_i = ±|Δg_i|. So δ has Δg's norm, its support (the coordinates the rows touch) and its size per
    coordinate — hence the same δ_i² entering AdamW's second moment and, up to the moments' history, the
    same update size per coordinate — while E[δ] = 0 and δ is uncorrelated with Δg: it removes only the
    direction. :func:`matched_gradient` matches the norm alone: an isotropic direction puts gradient on
    coordinates where v is tiny, and AdamW turns it into an update several times the passage's (the
    record's ``update_norm`` / ``like_update_norm``). The record holds both norms, both update norms and
    cos(δ, Δg) (``cosine``)."""

    def delta(trainer) -> tuple[dict[str, torch.Tensor], dict]:
        diff = gradient_difference(trainer, like, step, pad_id)
        # + 7: not _direction's stream (same seeds), so the signs are independent of matched_gradient's direction
        g = torch.Generator().manual_seed(seed * 1_000_003 + trainer.seed + 7)
        signs = [torch.randint(0, 2, d.shape, generator=g, dtype=torch.int64).double() * 2 - 1 for d in diff]
        named = [k for k, _ in trainer.model.named_parameters()]
        d64 = [d.abs() * s for d, s in zip(diff, signs)]
        out = {k: d.to(q.dtype) for k, d, q in zip(named, d64, trainer.params)}
        dot = float(sum((a * b).sum() for a, b in zip(d64, diff)))
        size = _norm(diff)
        record = {"like": like.name, "like_norm": size, "cosine": dot / (size * size) if size else 0.0,
                  **_update_norms(trainer, like, step, [out[k] for k in named], pad_id)}
        return out, record

    return Arm(name, perturbation=Perturbation(
        step, delta, f"{like.name}'s batch-gradient difference with random signs per coordinate", channel="gradient"))


def matched_gradient(name: str, like: Arm, step: int, seed: int, pad_id: int = 0) -> Arm:
    """Same size, no content, through every channel a row acts through: no row changes; at ``step`` a random
    direction (normal in every parameter, from ``seed`` and the run's training seed: the same direction as
    :func:`weight_kick`'s with that seed) is added to the raw batch gradient before clipping, scaled to the
    norm of ``like``'s own batch-gradient difference there (:func:`batch_gradient_difference`, at this run's
    θ_s). It then passes through the clip, AdamW's first and second moments and every later update exactly
    as a row's gradient does. The record holds that norm (``like_norm``) beside the delta's own (``norm``), and
    what each does to the update of s: ‖θ_{s+1}(this arm) − θ_{s+1}(twin)‖ (``update_norm``) and ‖θ_{s+1}(like) −
    θ_{s+1}(twin)‖ (``like_update_norm``, the weight kick's size), from forks of this θ_s: AdamW normalizes each
    coordinate by its second moment, so a gradient matched in norm need not be matched in update size."""

    def delta(trainer) -> tuple[dict[str, torch.Tensor], dict]:
        size = batch_gradient_difference(trainer, like, step, pad_id)
        d = _direction(trainer, seed, size)
        moved = _update_norms(trainer, like, step, [d[k] for k, _ in trainer.model.named_parameters()], pad_id)
        return d, {"like": like.name, "like_norm": size, **moved}

    return Arm(name, perturbation=Perturbation(
        step, delta, f"random gradient direction, the norm of {like.name}'s batch-gradient difference", channel="gradient"))


def check_arms(arms: Sequence[Arm], *, fork: int, end: int, batch_size: int, block_size: int,
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Every arm can run in a design forked at ``fork`` that trains to ``end``, with batches of
    ``batch_size`` rows of ``block_size`` tokens (``shapes``: the model's {tensor: shape}, to check
    deltas against); else a one-line :class:`SeedlabError`. Nothing is written before this passes."""
    from seedlab.lm.batches import check_passage

    seen: set[str] = set()
    for arm in arms:
        if not NAME.match(arm.name):
            raise SeedlabError(f"arm name: letters, digits, '.', '_', '-' and '@' only (a folder name), got {arm.name!r}")
        if arm.name in seen:
            raise SeedlabError(f"arms: two arms are named {arm.name!r} (each arm is one run folder)")
        seen.add(arm.name)
        if arm.start is not None and not (isinstance(arm.start, int) and 0 <= arm.start <= fork):
            raise SeedlabError(f"arm {arm.name}: leaves the shared prefix at step {arm.start!r}; it must be in 0 .. {fork} "
                               "(the fork step or an earlier state of the prefix)")
        lo = arm.leaves(fork)
        run = (f"steps {lo} .. {end - 1}: the fork step to the last update" if lo == fork else
               f"steps {lo} .. {end - 1}: its start in the prefix to the last update")
        for (t, r), ids in arm.injections.items():
            if not lo <= t < end:
                raise SeedlabError(f"arm {arm.name}: injects at step {t}, outside the forked run ({run})")
            if not 0 <= r < batch_size:
                raise SeedlabError(f"arm {arm.name}: injects into row {r}, but a batch has rows 0 .. {batch_size - 1}")
            check_passage(len(ids), block_size, f"arm {arm.name} (step {t}, row {r})")
        for t, r in sorted(arm.removals):
            if not lo <= t < end:
                raise SeedlabError(f"arm {arm.name}: removes a row at step {t}, outside the forked run ({run})")
            if not 0 <= r < batch_size:
                raise SeedlabError(f"arm {arm.name}: removes row {r}, but a batch has rows 0 .. {batch_size - 1}")
            if (t, r) in arm.injections:
                raise SeedlabError(f"arm {arm.name}: removes row {r} of step {t}, which it also injects into")
        for key, w in arm.weights.items():
            if key not in arm.injections:
                raise SeedlabError(f"arm {arm.name}: a loss weight for step {key[0]}, row {key[1]}, where it injects nothing")
            if not (isinstance(w, (int, float)) and 0 < w <= 1):
                raise SeedlabError(f"arm {arm.name}: a row's loss weight must lie in (0, 1] (1: the plain swap), got {w!r}")
        p = arm.perturbation
        if p is not None:
            if p.channel not in CHANNELS:
                raise SeedlabError(f"arm {arm.name}: a perturbation's channel is one of {', '.join(CHANNELS)}, got {p.channel!r}")
            if not lo <= p.step < end:
                raise SeedlabError(f"arm {arm.name}: perturbs at step {p.step}, outside the forked run ({lo} .. {end - 1})")
            for name, d in ({} if callable(p.delta) else p.delta).items():  # a computed delta: checked when due
                if shapes is not None and tuple(shapes.get(name, ())) != tuple(d.shape):
                    why = "the model has no such tensor" if name not in shapes else f"its shape is {tuple(shapes[name])}"
                    raise SeedlabError(f"arm {arm.name}: a delta for {name!r} of shape {tuple(d.shape)} ({why})")
