"""``seedlab twins measure DIR``: every condition against its twin, and twins of different seeds.

For each seed k and injected condition c (against the twin of the same seed) at the final step:

- **barrier**      the interpolation loss barrier on held-out tokens (seedlab/measures/weights.py), α grid from the config;
                   ``rise_mid`` is the signed rise above the chord at α = 0.5 (negative on a convex path,
                   where the barrier itself is 0, so differences between conditions stay visible);
- **heldout_ce**   held-out cross-entropy of c, of the twin, and the difference c − twin (nats/token);
- **distance**     Euclidean distance of the weights, overall and per layer (``dist.<group>``);
- **cka**          linear CKA per layer (``cka.blocks.<l>``: the residual stream after block l) on a probe batch;
- **passage_ce**   the cross-entropy of c's own passage under c and under the twin, at s + 50 and at the end
                   (NaN for a condition without a text of its own: a null acting through the gradient or the
                   weights, twins/variants.py; a row-weight arm ``<arm>@w<w>``'s own passage is ``<arm>``'s text,
                   twins/dose.py ``own_text``). checkpoints.parquet at the injection step holds every own text's CE
                   at s (the twin's and the arm's weights are bitwise equal there): the ordinary rows' included,
                   what the dose–response divides each drop by (twins/dose.py).

``passages.parquet`` is the cross-passage matrix: at every saved step, every condition's and its
twin's CE on every passage (both fluent passages, the random characters, each ordinary row), so
"learned" can be read as *this* passage (the own-passage drop beside the drop on the other passages).

The same barrier / distance / CKA / held-out CE between the twins of every pair of seeds are the
baselines (``kind = "seed"``). At every saved step t >= s ``checkpoints.parquet`` also has, for c
against the twin of its seed, the distance, both held-out CEs, both passage CEs, and the barrier
and ``rise_mid`` on the same held-out rows and α grid (the time course; at the injection step the
weights are bitwise identical and both are 0 without evaluating; at the final step they are the
values of measures.parquet). ``timecourse.parquet`` has the per-step training-loss difference
c − twin, and ``paths.parquet`` the loss along each final interpolation.

The seed-vs-seed rows also have ``distance_aligned``: the same distance after the second seed's twin
is permuted to the first's (the residual stream's features, and per layer the heads and MLP neurons, lm/align.py), the part of the gauge
freedom that permutations remove (``measures.weights.aligned_distance``); NaN on the other rows.

The held-out rows (``measure.heldout_rows``, the first ``measure.probe_rows`` of them the CKA probe) are drawn
from the held-out split before its reserved slice, where the ordinary rows come from (twins/heldout.py): no
ordinary row is among the targets it is judged on.

Cost: a path of K grid points costs K − 2 held-out evaluations (its end losses are the two
models' held-out CEs, already measured), per pair and per checkpoint after the injection.

Files (all written only when measuring succeeds; where: twins/rundir.py): measures.parquet (one row
per seed × condition plus the seed-vs-seed rows, the table the report and other tools read),
checkpoints.parquet, timecourse.parquet, paths.parquet, measures.json (settings, what was missing,
the outcomes used). ``twins.rundir.Measured`` reads them back (the report and its figures).
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.distributed import World
from seedlab.lm.model import GPT
from seedlab.progress import Bar
from seedlab.store import write_json, write_parquet
from seedlab.measures.cka import linear_cka
from seedlab.measures.text import text_ce
from seedlab.measures.weights import aligned_distance, barrier_curve, identical, loss_path, weight_distance
from seedlab.twins.config import TwinsConfig
from seedlab.twins.dose import own_text
from seedlab.twins.heldout import evaluation_rows
from seedlab.twins.rundir import PASSAGE_COLUMNS, Run, open_run


class Evaluator:
    """One GPT whose weights are swapped in; held-out CE, passage CE and residual streams."""

    def __init__(self, run: Run, device: torch.device):
        m, g = run.cfg.measure, run.gcfg
        self.device, self.eval_rows = device, m.eval_rows
        self.model = GPT(g).to(device).eval()
        self.x, self.y = evaluation_rows(run.corpus.heldout, m.seed, m.heldout_rows, g.block_size)  # not the reserved slice
        self.probe = self.x[: m.probe_rows]
        self.shapes = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}

    def load(self, state: dict[str, torch.Tensor], name: str) -> None:
        for k, shape in self.shapes.items():
            if k not in state or tuple(state[k].shape) != shape:
                got = tuple(state[k].shape) if k in state else "missing"
                raise SeedlabError(f"{name}: tensor {k!r} is {got}, the run's model needs {shape} (mismatched model shapes)")
        self.model.load_state_dict(state)

    @torch.no_grad()
    def heldout_ce(self) -> float:
        """Mean cross-entropy (nats/token) over the held-out rows."""
        total = 0.0
        for i in range(0, len(self.x), self.eval_rows):
            x, y = self.x[i : i + self.eval_rows], self.y[i : i + self.eval_rows]
            _, loss = self.model(x.to(self.device), y.to(self.device))
            total += float(loss) * len(x)
        return total / len(self.x)

    def passage_ce(self, ids: list[int]) -> float:
        """The passage's mean CE under the loaded model: the model's own (float32) loss on it."""
        return text_ce(self.model, ids, dtype=torch.float32)

    @torch.no_grad()
    def residuals(self) -> list[torch.Tensor]:
        return [r.cpu() for r in self.model.residuals(self.probe.to(self.device))]

    def path(self, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], alphas: list[float],
             ends: tuple[float, float] | None = None) -> np.ndarray:
        """Held-out CE at each α of the straight line from ``a`` (α = 0) to ``b`` (α = 1); ``ends``:
        the held-out CEs of a and b when already measured (not evaluated again)."""
        return loss_path(self._heldout_ce_of, a, b, alphas, ends)

    def _heldout_ce_of(self, state: dict[str, torch.Tensor]) -> float:
        self.model.load_state_dict(state)
        return self.heldout_ce()


def measure(root: str | Path, *, corpus: str | Path | None = None, device: str = "auto", progress: bool = True) -> dict[str, pd.DataFrame]:
    """Measure what is there; warn about what is missing; raise when nothing can be measured.

    Memory does not grow with the number of seeds: at any time at most two weight sets read from
    disk (a run and the one it is compared with), one interpolated set and two probe batches'
    residual streams are held; the seed-vs-seed baselines read each twin's final weights again
    (verified reads) instead of keeping every seed's."""
    t0 = time.perf_counter()
    run = open_run(root, corpus)
    plan = Plan.of(run)
    for what in run.missing:
        print(f"warning: missing {what} (not finished); measuring the rest", file=sys.stderr)
    ev = Evaluator(run, World().device(device))
    with Bar("measure", plan.evaluations(_path_evals(run.cfg.measure.alphas)), "evals", enabled=progress) as bar:
        found = Comparisons(run, ev, bar)
        twin_final_ce = {k: found.seed(k, plan.conditions(k), plan.steps) for k in plan.seeds}
        found.seed_pairs(plan.seed_pairs, twin_final_ce)
    checkpoints = pd.DataFrame(found.checkpoints)
    out = {
        "measures": _with_passage_ce(pd.DataFrame(found.measures), checkpoints, named_steps(run.cfg)),
        "checkpoints": checkpoints,
        "timecourse": _timecourse(run, plan.pairs),
        "paths": pd.DataFrame(found.paths),
        "passages": pd.DataFrame(found.passages, columns=PASSAGE_COLUMNS),
    }
    for name, df in out.items():
        write_parquet(run.dir.measure_table(name), df)
    write_json(run.dir.measures_json, {
        "missing": run.missing, "measured_pairs": len(plan.pairs), "seed_pairs": len(plan.seed_pairs),
        "preregistration": run.cfg.preregistration(), "device": str(ev.device), "seconds": round(time.perf_counter() - t0, 1),
        "steps": named_steps(run.cfg),
    })
    return out


def named_steps(cfg: TwinsConfig) -> dict[str, int]:
    """The steps the measures are named by: the injection s, s + 50 (or the end, if sooner), the mid-point, the end."""
    return {"injection": cfg.injection_step, "s50": min(cfg.injection_step + 50, cfg.steps), "mid": cfg.mid, "final": cfg.steps}


def _path_evals(alphas: list[float]) -> int:
    """Held-out evaluations of one interpolation path: its end losses are the two models' own, already measured."""
    return sum(0.0 < a < 1.0 for a in alphas)


@dataclass
class Plan:
    """What the finished runs of a folder allow to compare: a condition needs its seed's twin, a
    baseline two seeds' twins."""

    seeds: list[int]  # seeds whose twin finished
    pairs: list[tuple[int, str]]  # (seed, injected condition): finished, and so is the seed's twin
    seed_pairs: list[tuple[int, int]]  # every two of those seeds, in combinations order
    steps: list[int]  # the saved steps from the injection on; the last is the end

    @classmethod
    def of(cls, run: Run) -> Plan:
        cfg = run.cfg
        seeds = [k for k in cfg.seeds if (k, "twin") in run.finished]
        pairs = [(k, c) for k in seeds for c in cfg.arm_names if c != "twin" and (k, c) in run.finished]
        seed_pairs = list(itertools.combinations(seeds, 2))
        if not pairs and not seed_pairs:
            raise SeedlabError(f"{run.root}: nothing to measure (finished runs: {sorted(run.finished) or 'none'}; "
                               "a condition needs its seed's twin, a baseline two seeds' twins)")
        return cls(seeds, pairs, seed_pairs, [t for t in cfg.checkpoint_steps() if t >= cfg.injection_step])

    def conditions(self, seed: int) -> list[str]:
        """The injected conditions measured against ``seed``'s twin."""
        return [c for k, c in self.pairs if k == seed]

    def evaluations(self, per_path: int) -> int:
        """The progress bar's total: a twin's held-out CE per seed and step, and each path's inner points
        (a condition's path at every step after the injection, and one per seed pair)."""
        after = len(self.steps) - 1  # the first is the injection step, where the weights are identical
        return len(self.seeds) * len(self.steps) + (len(self.pairs) * after + len(self.seed_pairs)) * per_path


@dataclass
class Twin:
    """A seed's twin at one step, as each condition is compared with it."""

    state: dict[str, torch.Tensor]
    heldout_ce: float
    passage_ce: dict[str, float]  # text (a passage condition's, or an ordinary row's) -> its CE under the twin
    residuals: list[torch.Tensor] | None  # the probe batch's residual streams (at the end, for CKA)


class Comparisons:
    """The rows of measures, checkpoints and paths, in the order they are measured: per seed, per
    checkpoint, per condition; then the seed pairs. Each method measures one of those levels."""

    def __init__(self, run: Run, ev: Evaluator, bar: Bar):
        self.run, self.ev, self.bar = run, ev, bar
        self.alphas, self.final = run.cfg.measure.alphas, run.cfg.steps
        self.measures: list[dict] = []
        self.checkpoints: list[dict] = []
        self.passages: list[dict] = []  # the cross-passage matrix: every condition's CE on every passage, every step
        self.paths: list[dict] = []

    def seed(self, k: int, conds: list[str], steps: list[int]) -> float:
        """Every condition of seed ``k`` against its twin at each of ``steps``; returns the twin's final held-out CE."""
        for t in steps:
            twin_ce = self.checkpoint(k, t, conds)
            self.bar.step(f"seed {k}: step {t}")
        return twin_ce  # the last step is the end

    def checkpoint(self, k: int, t: int, conds: list[str]) -> float:
        """Every condition of seed ``k`` against its twin at step ``t``; returns the twin's held-out CE
        (the weights read here are let go on return)."""
        twin = self.twin(k, t, conds)
        for c in conds:
            self.condition(k, c, t, twin)
        return twin.heldout_ce

    def twin(self, k: int, t: int, conds: list[str]) -> Twin:
        """Seed ``k``'s twin at step ``t``: its weights, its held-out CE, the CE of every passage and,
        at the end, its residual streams."""
        state = self.run.weights(k, "twin", t)
        self.ev.load(state, f"seed {k} twin step {t}")
        ce = self.ev.heldout_ce()
        return Twin(state, ce, self.texts_ce(k), self.ev.residuals() if t == self.final and conds else None)

    def texts_ce(self, k: int) -> dict[str, float]:
        """The CE of every passage seed ``k`` injects (the run's passage conditions' texts and the ordinary rows: its
        own, when each seed draws its own, twins/rundir.py ``Run.texts``) under the loaded model."""
        return {name: self.ev.passage_ce(ids) for name, ids in self.run.texts(k).items()}

    def condition(self, k: int, c: str, t: int, twin: Twin) -> None:
        """Condition ``c`` of seed ``k`` against its twin at step ``t``: its checkpoints row and, at the end,
        its measures row, whose path gives the checkpoint's barrier too."""
        state = self.run.weights(k, c, t)
        self.ev.load(state, f"seed {k} {c} step {t}")
        ce, texts = self.ev.heldout_ce(), self.texts_ce(k)
        self.passages += [{"seed": k, "condition": c, "step": t, "text": name, "ce": v, "twin_ce": twin.passage_ce[name],
                           "diff": v - twin.passage_ce[name]} for name, v in texts.items()]
        text = own_text(c, texts)  # a row-weight arm <arm>@w<w> injects <arm>'s text
        own = texts[text] if text is not None else np.nan  # a null of the gradient or weights channel has no passage of its own
        if t == self.final:
            row = self.compare(state, twin.state, ce, twin.heldout_ce, twin.residuals,
                               kind="injected", seed=k, condition=c, seed_b=k, condition_b="twin", step=t)
            self.measures.append(row)
            barrier, rise, dist = row["barrier"], row["rise_mid"], row["distance"]
        else:
            barrier, rise = self.barrier(state, twin.state, ce, twin.heldout_ce)
            dist = weight_distance(state, twin.state)["all"]
        self.checkpoints.append({
            "seed": k, "condition": c, "step": t, "distance": dist, "heldout_ce": ce, "twin_heldout_ce": twin.heldout_ce,
            "passage_ce": own, "twin_passage_ce": twin.passage_ce[text] if text is not None else np.nan, "barrier": barrier,
            "rise_mid": rise,
        })

    def seed_pairs(self, pairs: list[tuple[int, int]], twin_final_ce: dict[int, float]) -> None:
        """The twins of every two seeds at the end (``kind = "seed"``). Pairs in combinations order share
        their first seed in runs: its weights are read once per run, the other seed's once per pair."""
        first, state = None, None
        for a, b in pairs:
            if first != a:
                state = None  # let the last first seed's weights go before reading the next
                first, state = a, self.run.weights(a, "twin", self.final)
            self.seed_pair(a, state, b, twin_final_ce)

    def seed_pair(self, a: int, state_a: dict[str, torch.Tensor], b: int, twin_final_ce: dict[int, float]) -> None:
        """The twin of seed ``a`` (weights ``state_a``) against the twin of seed ``b`` at the end; also the
        distance to ``b``'s twin aligned to ``a``'s (``distance_aligned``, the same ``weight_distance``)."""
        state_b = self.run.weights(b, "twin", self.final)
        self.ev.load(state_b, f"seed {b} twin")
        res_b = self.ev.residuals()
        self.ev.load(state_a, f"seed {a} twin")
        row = self.compare(state_a, state_b, twin_final_ce[a], twin_final_ce[b], res_b,
                           kind="seed", seed=a, condition="twin", seed_b=b, condition_b="twin", step=self.final)
        row["distance_aligned"] = aligned_distance(state_a, state_b, self.run.gcfg)
        self.measures.append(row)

    def barrier(self, a: dict, b: dict, ce_a: float, ce_b: float) -> tuple[float, float]:
        """(barrier, rise at α = 0.5) between ``a`` and ``b`` on the held-out rows, their own CEs as the path's ends.
        Bitwise-identical weights (every pair at the injection step) are not evaluated: their path is
        one point, so both are 0 exactly."""
        if identical(a, b):
            return 0.0, 0.0
        rise = barrier_curve(self.alphas, self.ev.path(a, b, self.alphas, ends=(ce_a, ce_b)))
        self.bar.advance(_path_evals(self.alphas))
        return float(rise.max()), float(np.interp(0.5, self.alphas, rise))

    def compare(self, a: dict, b: dict, ce_a: float, ce_b: float, res_b: list[torch.Tensor], **key) -> dict:
        """Barrier, held-out CE, distance and CKA of ``a`` (loaded in the evaluator) against ``b``; the path's
        points go to ``paths``."""
        alphas = self.alphas
        res_a = self.ev.residuals()
        losses = self.ev.path(a, b, alphas, ends=(ce_a, ce_b))
        rise = barrier_curve(alphas, losses)
        self.paths += [{**key, "alpha": al, "loss": lo, "rise": r} for al, lo, r in zip(alphas, losses, rise)]
        self.bar.advance(_path_evals(alphas))
        dist = weight_distance(a, b)
        return {
            **key, "barrier": float(rise.max()), "rise_mid": float(np.interp(0.5, alphas, rise)),
            "heldout_ce": ce_a, "heldout_ce_b": ce_b, "heldout_ce_diff": ce_a - ce_b,
            "distance": dist.pop("all"), **{f"dist.{g}": v for g, v in dist.items()},
            **{f"cka.blocks.{i}": linear_cka(x, y) for i, (x, y) in enumerate(zip(res_a, res_b))},
        }


def _with_passage_ce(measures: pd.DataFrame, checkpoints: pd.DataFrame, steps: dict[str, int]) -> pd.DataFrame:
    """The passage CEs at s + 50 and at the end (checkpoints rows) beside each condition's measures row."""
    if not len(checkpoints):
        return measures
    key = pd.MultiIndex.from_frame(measures[["seed", "condition"]])
    for tag in ("s50", "final"):
        at = checkpoints[checkpoints.step == steps[tag]].set_index(["seed", "condition"])
        measures[f"passage_ce_{tag}"] = at["passage_ce"].reindex(key).to_numpy()
        measures[f"twin_passage_ce_{tag}"] = at["twin_passage_ce"].reindex(key).to_numpy()
    return measures


def _timecourse(run: Run, pairs: list[tuple[int, str]]) -> pd.DataFrame:
    """Per-step training loss of each injected run, its twin's, and the difference (c − twin)."""
    frames = []
    for k, c in pairs:
        mine = pd.read_parquet(run.dir.condition(k, c).losses)
        twin = pd.read_parquet(run.dir.condition(k, "twin").losses)
        df = mine.merge(twin, on="step", suffixes=("", "_twin"))
        frames.append(df.assign(seed=k, condition=c, diff=df.loss - df.loss_twin))
    cols = ["seed", "condition", "step", "loss", "loss_twin", "diff"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)
