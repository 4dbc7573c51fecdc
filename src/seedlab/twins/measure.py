"""``seedlab twins measure DIR``: every condition against its twin, and twins of different seeds.

For each seed k and injected condition c (against the twin of the same seed) at the final step:

- **barrier**      the interpolation loss barrier on held-out tokens (twins/metrics.py), α grid from the config;
                   ``rise_mid`` is the signed rise above the chord at α = 0.5 (negative on a convex path,
                   where the barrier itself is 0, so differences between conditions stay visible);
- **heldout_ce**   held-out cross-entropy of c, of the twin, and the difference c − twin (nats/token);
- **distance**     Euclidean distance of the weights, overall and per layer (``dist.<group>``);
- **cka**          linear CKA per layer (``cka.blocks.<l>``: the residual stream after block l) on a probe batch;
- **passage_ce**   the cross-entropy of c's own passage under c and under the twin, at s + 50 and at the end.

The same barrier / distance / CKA / held-out CE between the twins of every pair of seeds are the
baselines (``kind = "seed"``). At every saved step t >= s ``checkpoints.parquet`` also has, for c
against the twin of its seed, the distance, both held-out CEs, both passage CEs, and the barrier
and ``rise_mid`` on the same held-out rows and α grid (the time course; at the injection step the
weights are bitwise identical and both are 0 without evaluating; at the final step they are the
values of measures.parquet). ``timecourse.parquet`` has the per-step training-loss difference
c − twin, and ``paths.parquet`` the loss along each final interpolation.

Cost: a path of K grid points costs K − 2 held-out evaluations (its end losses are the two
models' held-out CEs, already measured), per pair and per checkpoint after the injection.

Files (all written only when measuring succeeds; where: twins/rundir.py): measures.parquet (one row
per seed × condition plus the seed-vs-seed rows, the table the report and other tools read),
checkpoints.parquet, timecourse.parquet, paths.parquet, measures.json (settings, what was missing,
the outcomes used).
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import get_batch
from seedlab.lm.distributed import World
from seedlab.lm.model import GPT
from seedlab.progress import Bar
from seedlab.store import write_json, write_parquet
from seedlab.twins.metrics import barrier_curve, identical, linear_cka, loss_path, weight_distance
from seedlab.twins.rundir import Run, open_run


class Evaluator:
    """One GPT whose weights are swapped in; held-out CE, passage CE and residual streams."""

    def __init__(self, run: Run, device: torch.device):
        m, g = run.cfg.measure, run.gcfg
        self.device, self.eval_rows = device, m.eval_rows
        self.model = GPT(g).to(device).eval()
        self.x, self.y = get_batch(run.corpus.heldout, m.seed, 0, m.heldout_rows, g.block_size)
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

    @torch.no_grad()
    def passage_ce(self, ids: list[int]) -> float:
        p = torch.tensor(ids, dtype=torch.int64, device=self.device)[None]
        return float(self.model(p[:, :-1], p[:, 1:])[1])

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
    cfg, s = run.cfg, run.cfg.injection_step
    final, s50 = cfg.steps, min(s + 50, cfg.steps)
    seeds = [k for k in cfg.seeds if (k, "twin") in run.finished]
    pairs = [(k, c) for k in seeds for c in cfg.conditions if c != "twin" and (k, c) in run.finished]
    seed_pairs = list(itertools.combinations(seeds, 2))
    if not pairs and not seed_pairs:
        raise SeedlabError(f"{run.root}: nothing to measure (finished runs: {sorted(run.finished) or 'none'}; "
                           "a condition needs its seed's twin, a baseline two seeds' twins)")
    for what in run.missing:
        print(f"warning: missing {what} (not finished); measuring the rest", file=sys.stderr)

    ev = Evaluator(run, World().device(device))
    alphas = cfg.measure.alphas
    inner = sum(0.0 < a < 1.0 for a in alphas)  # evaluations per path: its end losses are known
    ckpt_steps = [t for t in cfg.checkpoint_steps() if t >= s]
    rows, ckpt_rows, path_rows = [], [], []
    work = len(seeds) * len(ckpt_steps) + (len(pairs) * sum(t > s for t in ckpt_steps) + len(seed_pairs)) * inner
    twin_final_ce: dict[int, float] = {}  # seed -> its twin's final held-out CE (a number per seed, no weights)
    with Bar("measure", work, "evals", enabled=progress) as bar:
        for k in seeds:
            conds = [c for kk, c in pairs if kk == k]
            for t in ckpt_steps:
                twin = run.weights(k, "twin", t)
                ev.load(twin, f"seed {k} twin step {t}")
                twin_ce = ev.heldout_ce()
                twin_pce = {c: ev.passage_ce(run.passages[c]) for c in conds}
                twin_res = ev.residuals() if t == final and conds else None
                if t == final:
                    twin_final_ce[k] = twin_ce
                for c in conds:
                    state = run.weights(k, c, t)
                    ev.load(state, f"seed {k} {c} step {t}")
                    ce, pce = ev.heldout_ce(), ev.passage_ce(run.passages[c])
                    if t == final:  # the full comparison; its path gives the checkpoint's barrier too
                        row = _compare(ev, state, twin, ce, twin_ce, twin_res, alphas, path_rows, bar,
                                       kind="injected", seed=k, condition=c, seed_b=k, condition_b="twin", step=t)
                        rows.append(row)
                        barrier_t, rise_t, dist = row["barrier"], row["rise_mid"], row["distance"]
                    else:
                        barrier_t, rise_t = _barrier(ev, state, twin, ce, twin_ce, alphas, bar)
                        dist = weight_distance(state, twin)["all"]
                    ckpt_rows.append({
                        "seed": k, "condition": c, "step": t, "distance": dist, "heldout_ce": ce, "twin_heldout_ce": twin_ce,
                        "passage_ce": pce, "twin_passage_ce": twin_pce[c], "barrier": barrier_t, "rise_mid": rise_t,
                    })
                    del state
                del twin, twin_res
                bar.update(note=f"seed {k}: step {t}")
                bar.advance()
        held = (None, None)  # (seed, its twin's final weights): the first of a pair, kept while it repeats
        for a, b in seed_pairs:
            sb = run.weights(b, "twin", final)
            ev.load(sb, f"seed {b} twin")
            res_b = ev.residuals()
            if held[0] != a:
                held = (None, None)
                held = (a, run.weights(a, "twin", final))
            ev.load(held[1], f"seed {a} twin")
            rows.append(_compare(ev, held[1], sb, twin_final_ce[a], twin_final_ce[b], res_b, alphas, path_rows, bar,
                                 kind="seed", seed=a, condition="twin", seed_b=b, condition_b="twin", step=final))
            del sb, res_b
        del held

    measures = pd.DataFrame(rows)
    checkpoints = pd.DataFrame(ckpt_rows)
    if len(checkpoints):  # passage CE at s + 50 and at the end, beside each pair's row
        for tag, t in (("s50", s50), ("final", final)):
            at = checkpoints[checkpoints.step == t].set_index(["seed", "condition"])
            key = pd.MultiIndex.from_frame(measures[["seed", "condition"]])
            measures[f"passage_ce_{tag}"] = at["passage_ce"].reindex(key).to_numpy()
            measures[f"twin_passage_ce_{tag}"] = at["twin_passage_ce"].reindex(key).to_numpy()
    out = {
        "measures": measures,
        "checkpoints": checkpoints,
        "timecourse": _timecourse(run, pairs),
        "paths": pd.DataFrame(path_rows),
    }
    for name, df in out.items():
        write_parquet(run.dir.measure_table(name), df)
    write_json(run.dir.measures_json, {
        "missing": run.missing, "measured_pairs": len(pairs), "seed_pairs": len(seed_pairs),
        "preregistration": cfg.preregistration(), "device": str(ev.device), "seconds": round(time.perf_counter() - t0, 1),
        "steps": {"injection": s, "s50": s50, "mid": cfg.mid, "final": final},
    })
    return out


def _barrier(ev: Evaluator, a: dict, b: dict, ce_a: float, ce_b: float, alphas: list[float], bar: Bar) -> tuple[float, float]:
    """(barrier, rise at α = 0.5) between ``a`` and ``b`` on the held-out rows, their own CEs as the path's ends.
    Bitwise-identical weights (every pair at the injection step) are not evaluated: their path is
    one point, so both are 0 exactly."""
    if identical(a, b):
        return 0.0, 0.0
    rise = barrier_curve(alphas, ev.path(a, b, alphas, ends=(ce_a, ce_b)))
    bar.advance(sum(0.0 < al < 1.0 for al in alphas))
    return float(rise.max()), float(np.interp(0.5, alphas, rise))


def _compare(ev: Evaluator, a: dict, b: dict, ce_a: float, ce_b: float, res_b: list[torch.Tensor],
             alphas: list[float], path_rows: list, bar: Bar, **key) -> dict:
    """Barrier, held-out CE, distance and CKA of ``a`` (loaded in ``ev``) against ``b``."""
    res_a = ev.residuals()
    losses = ev.path(a, b, alphas, ends=(ce_a, ce_b))
    rise = barrier_curve(alphas, losses)
    path_rows += [{**key, "alpha": al, "loss": lo, "rise": r} for al, lo, r in zip(alphas, losses, rise)]
    bar.advance(sum(0.0 < al < 1.0 for al in alphas))
    dist = weight_distance(a, b)
    return {
        **key, "barrier": float(rise.max()), "rise_mid": float(np.interp(0.5, alphas, rise)),
        "heldout_ce": ce_a, "heldout_ce_b": ce_b, "heldout_ce_diff": ce_a - ce_b,
        "distance": dist.pop("all"), **{f"dist.{g}": v for g, v in dist.items()},
        **{f"cka.blocks.{i}": linear_cka(x, y) for i, (x, y) in enumerate(zip(res_a, res_b))},
    }


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
