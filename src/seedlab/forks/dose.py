"""Every run's dose at the fork step s: how far the update that consumes the batch of s moves the run from its
twin, in each channel that update leaves behind — the size of the perturbation every later difference grows from.

    Δx = x_arm(s + 1) − x_twin(s + 1)      x: the weights θ, AdamW's first moment m (exp_avg), its second v (exp_avg_sq)

``dose.json`` in each run's folder (forks/folders.py ``RunFolder.dose``)::

    {"step": s,
     "theta":      {"l2": ‖Δθ‖₂, "per_tensor": {name: ‖Δθ_name‖₂},
                    "abs_quantiles": {"0.5": q, "0.9": q, "0.99": q, "1.0": q},   over every coordinate of |Δθ|
                    "changed_fraction": the fraction of coordinates with Δθ ≠ 0},
     "exp_avg":    {"l2": ‖Δm‖₂, "per_tensor": {name: ‖Δm_name‖₂}},
     "exp_avg_sq": {"l2": ‖Δv‖₂, "per_tensor": {name: ‖Δv_name‖₂}}}

Every difference is taken in float64 (the difference of two float32 numbers is exact there), each tensor's sum of
squares in float64 and the total as their exactly rounded sum (``math.fsum``: the same bits in any order); the
quantiles interpolate linearly between order statistics (numpy's default). The names are the model's parameters
(its state-dict keys: the GPT has no buffers).

Which runs have one:

- every arm that leaves the shared prefix at s: a row at s, a weighted row, a perturbation at s (a row, a removal
  or a perturbation after s has a dose of exactly 0 at s: it is the twin through s + 1);
- the **twin** too: its file is all zeros (its state against itself), so every such run of a seed has one;
- not an arm that leaves the prefix before s (forks/arms.py ``Arm.start``: it is not the twin at s), nor the
  replica control;
- with an optimizer that keeps no moments (SGD) ``exp_avg`` and ``exp_avg_sq`` are null;
- a run that passed s + 1 before an interruption keeps the file it wrote then (a run started again from the prefix
  writes it again); a run finished by an older seedlab has none.

Where the twin's state at s + 1 comes from: the serial loop (forks/loop.py) trains each seed's twin before its
other arms, and the stacks (forks/stacked.py) put a seed's twin ahead of its arms (in an earlier stack, or at an
earlier position of the same one, which is visited first at every step), so the twin passes s + 1 first and
:class:`Doses` keeps its weights and moments then. Where the twin did not pass s + 1 here (it finished, or resumed
past it, before an interruption), its state is trained again: the seed's prefix at s and one ordinary update, as
the twin's own (bitwise on CPU in fp32: what the replica control and the stacks' solo check show). Serial and
stacked designs write the same bytes.

Memory: one copy of the twin's weights and both AdamW moments per seed (3 × the model, on its device: mini at a
2,048-token vocabulary ~3 MB, gpt2-124m ~1.5 GB), held from the twin's s + 1 until its seed's last run is done;
and, per run once, the float64 |Δθ| of every coordinate, sorted for the quantiles (at most 24 bytes a parameter
for a moment, on the model's device: gpt2-124m ~3 GB).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from seedlab.forks.arms import TWIN, Arm
from seedlab.forks.folders import RunFolder
from seedlab.forks.prefix import advance_to
from seedlab.lm.trainer import MOMENTS, Trainer
from seedlab.store import write_json

#: the quantiles of |Δθ| over every coordinate that dose.json records
QUANTILES = (0.5, 0.9, 0.99, 1.0)

Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class State:
    """A run's weights and AdamW moments (``{"exp_avg": {name: t}, "exp_avg_sq": {...}}``; None: none) at one step."""

    weights: Tensors
    moments: Mapping[str, Tensors] | None

    @classmethod
    def of(cls, trainer: Trainer) -> State:
        """A solo trainer's (views: :meth:`copy` what you keep)."""
        return cls(trainer.weights(), trainer.moments())

    def copy(self) -> State:
        clone = lambda ts: {k: v.detach().clone() for k, v in ts.items()}
        return State(clone(self.weights), None if self.moments is None else {k: clone(v) for k, v in self.moments.items()})


def dose(arm: State, twin: State, step: int) -> dict:
    """dose.json's record (module doc): ``arm`` against ``twin``, both after the update of ``step``."""
    out = {"step": int(step), "theta": _channel(arm.weights, twin.weights, profile=True)}
    for k in MOMENTS:
        out[k] = None if arm.moments is None or twin.moments is None else _channel(arm.moments[k], twin.moments[k])
    return out


def _channel(a: Tensors, b: Tensors, *, profile: bool = False) -> dict:
    diffs = {n: a[n].detach().double() - b[n].detach().double() for n in b}
    sums = {n: float((d * d).sum()) for n, d in diffs.items()}
    out = {"l2": math.sqrt(math.fsum(sums.values())), "per_tensor": {n: math.sqrt(v) for n, v in sums.items()}}
    if profile:
        flat = torch.cat([d.abs().reshape(-1) for d in diffs.values()])
        del diffs  # the per-tensor differences are summed: only |Δθ| stays for the profile
        out["changed_fraction"] = int(torch.count_nonzero(flat)) / flat.numel()
        ordered = torch.sort(flat).values
        out["abs_quantiles"] = {str(q): _quantile(ordered, q) for q in QUANTILES}
    return out


def _quantile(ordered: torch.Tensor, q: float) -> float:
    """The ``q`` quantile of sorted values, linear between the order statistics around q·(n − 1)."""
    h = q * (ordered.numel() - 1)
    lo = math.floor(h)
    hi = min(lo + 1, ordered.numel() - 1)
    a, b = float(ordered[lo]), float(ordered[hi])
    return a + (h - lo) * (b - a)


class Doses:
    """The doses of a design's runs, written as each passes s + 1 (module doc), and the twins' states they are taken
    against. ``d``: a forks/loop.py ``Design``; ``at_s(seed)``: a trainer at the seed's fork step (a copy of its
    prefix), for the twin's state when the twin did not pass s + 1 here."""

    def __init__(self, d, at_s: Callable[[int], Trainer]):
        self.d, self.at_s, self.s = d, at_s, d.cfg.injection_step
        self.twins: dict[int, State] = {}  # seed -> the twin after s + 1 updates

    def wants(self, arm: Arm, where: RunFolder, *, fresh: bool) -> bool:
        """Whether ``arm``'s run (folder ``where``) writes its dose when it passes s + 1: it leaves the prefix at s, and
        it starts from the prefix (``fresh``: its folder cleared) or resumes without the file. Decided before the run
        trains, on every rank alike."""
        return arm.leaves(self.s) == self.s and (fresh or not where.dose.is_file())

    def watches(self, arm: Arm, wants: bool) -> bool:
        """Whether the run is visited at s + 1: it writes its dose there, or it is the twin (kept for the others)."""
        return arm.leaves(self.s) == self.s and (wants or arm == TWIN)

    def record(self, seed: int, arm: Arm, where: RunFolder, state: State, *, write: bool) -> None:
        """``arm``'s run of ``seed`` after s + 1 updates (``state``: views of its weights and moments): the twin's
        kept; its dose written when ``write`` (rank 0)."""
        if arm == TWIN:
            self.twins[seed] = state.copy()
        if not write:
            return
        twin = self.twin(seed)
        if self.d.world.main:
            write_json(where.dose, dose(state, twin, self.s))

    def twin(self, seed: int) -> State:
        """The seed's twin after s + 1 updates: as it passed there, else trained again from the prefix (module doc)."""
        if seed not in self.twins:
            trainer = self.at_s(seed)
            advance_to(trainer, self.s + 1, pad_id=self.d.pad_id)  # the twin's own update of s: the ordinary batch
            self.twins[seed] = State.of(trainer).copy()
        return self.twins[seed]

    def drop(self, seed: int) -> None:
        """Let the seed's twin state go (its last run is done)."""
        self.twins.pop(seed, None)
