"""Every run's distance to its seed's twin, step by step: how a difference grows through training.

    distance(arm, t) = ‖θ_arm(t) − θ_twin(t)‖₂      over every tensor of the state dict, in float64

:class:`Distances` is an observer (forks/loop.py) of a fork design: it keeps the twin's weights at
the steps it records (``steps``; the twin trains before its seed's other arms in the serial loop
and in the stacks alike) and, at each of those steps of every other arm, the arm's distance to
them; when an arm finishes, ``distances.parquet`` (step, distance) goes into its folder. A step
whose twin weights it did not see (the twin finished before an interruption) is read from the
twin's saved checkpoints when there is one, and otherwise left out.

It is how a design measures the growth of a perturbation: a one-ulp nudge's distance grows as
ε·e^{λ(t − s)} until it saturates (λ: training's largest Lyapunov exponent; attribution/analyses/chaos.py
fits it), and a row's (or a weighted row's) distance at s+1 is the size of its kick.

Memory: one float32 copy of the weights per recorded step of each seed whose arms are still
training (``steps`` × the model; the mini GPT: 1 MB a step). A seed's copies are dropped when its
last watched arm finishes (``watched``: how many arms of a seed it records).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import pandas as pd
import torch

from seedlab.forks.arms import Arm
from seedlab.forks.folders import RunFolder
from seedlab.forks.loop import Manifest, Observer
from seedlab.store import write_parquet

COLUMNS = ["step", "distance"]


def distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """‖a − b‖₂ over every tensor of ``b`` (float64)."""
    total = torch.zeros((), dtype=torch.float64)
    for k, v in b.items():
        total += ((a[k].detach().double().cpu() - v.detach().double().cpu()) ** 2).sum()
    return float(total.sqrt())


class Distances(Observer):
    """Records ‖θ_arm − θ_twin‖₂ at ``steps`` for the arms ``wants(arm)`` says (module doc).

    ``twin_folder(seed)``: the twin's run folder (its checkpoints, for steps it did not see here);
    ``watched(seed)``: how many arms of the seed it records (to drop the seed's copies after the last)."""

    def __init__(self, steps: Collection[int], wants: Callable[[Arm], bool], twin_folder: Callable[[int], RunFolder],
                 watched: Callable[[int], int]):
        self.steps, self.wants, self.twin_folder, self.watched = frozenset(steps), wants, twin_folder, watched
        self.twins: dict[int, dict[int, dict[str, torch.Tensor]]] = {}  # seed -> step -> the twin's weights
        self.rows: dict[tuple[int, str], list[tuple[int, float]]] = {}
        self.done: dict[int, int] = {}

    def looks(self, seed: int, arm: Arm) -> set[int]:
        return set(self.steps) if arm.is_twin or self.wants(arm) else set()

    def look(self, seed: int, arm: Arm, step: int, weights: Mapping[str, torch.Tensor]) -> None:
        if arm.is_twin:
            self.twins.setdefault(seed, {})[step] = {k: v.detach().clone() for k, v in weights.items()}
            return
        twin = self._twin(seed, step)
        if twin is not None:
            self.rows.setdefault((seed, arm.name), []).append((step, distance(weights, twin)))

    def _twin(self, seed: int, step: int) -> dict[str, torch.Tensor] | None:
        seen = self.twins.setdefault(seed, {})
        if step not in seen:
            where = self.twin_folder(seed)
            if not where.checkpoint(step).is_file():
                return None
            seen[step] = where.weights(step)
        return seen[step]

    def finished(self, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> None:
        if arm.is_twin or not self.wants(arm):
            return None
        rows = self.rows.pop((seed, arm.name), None)
        if rows is not None:  # trained here (not read back)
            write_parquet(where.distances, pd.DataFrame(sorted(rows), columns=COLUMNS))
        self.done[seed] = self.done.get(seed, 0) + 1
        if self.done[seed] >= self.watched(seed):
            self.twins.pop(seed, None)
        return None
