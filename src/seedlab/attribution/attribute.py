"""``seedlab attribution attribute DIR``: every estimator's prediction of every measured effect.

Per seed, from the twin's own files (attribution/bank.py; the registry: attribution/registry.py):

- ``sgd``, ``adam``, ``cosine`` — at θ_s, the kept prefix: its weights, and (``adam``) the AdamW
  state *before* the injected update (moments and step counts: the preconditioner actually used);
  ``lr`` the rate of step s (lm/schedule.py ``lr_of``), the trainer's gradient clip. A one-step
  prediction: the same number is set beside the measured effect of every horizon (its agreement
  at later horizons asks how much of the first step's effect survives).
- ``tracin`` — TracIn-CP over the twin's saved checkpoints: at horizon h the sum over the saved
  steps t with s ≤ t < h of the registry's one-checkpoint term at θ_t with the rate of step t
  (Pruthi et al.: each checkpoint weighted by its learning rate). At h = s + 1 that is the
  unclipped one-step SGD estimate.
- ``ekfac``, ``kfac`` — influence functions with kronfluence's curvature, fitted on the ordinary
  batch of step s; ``attribute.influence_at: horizon`` evaluates them at the twin's weights at
  each horizon (the model whose loss is predicted), ``injection`` once at θ_s.

Every estimator sees the same case: the ordinary batch of (seed, s), row ``injection_row``, the
finished candidates, and as queries every candidate's own text (its ``self`` query) and every
query row and probe. ``attribution.parquet`` (one row per seed × candidate × query × horizon ×
estimator) has the columns

    seed, candidate, query, horizon, measured, estimator, estimate,
    candidate_kind, query_kind, after, label, unit

and ``attribution.json`` the estimators run, their wall time per seed, and the settings.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.attribution.config import AttributionConfig
from seedlab.attribution.estimators import Case
from seedlab.attribution.measure import collect
from seedlab.attribution.registry import ESTIMATORS, INSTALL_HINT, available, get_estimator, run
from seedlab.attribution.rundir import Bank, open_bank
from seedlab.attribution.texts import SELF
from seedlab.errors import SeedlabError
from seedlab.lm.determinism import nondeterminism_is_an_error, settle
from seedlab.lm.distributed import World
from seedlab.lm.schedule import lr_of
from seedlab.lm.trainer import Trainer
from seedlab.progress import Bar
from seedlab.store import write_json, write_parquet

#: what runs when neither the command nor the config names estimators (those installed)
DEFAULT = ("sgd", "adam", "tracin", "cosine", "ekfac")
AT_INJECTION = ("sgd", "adam", "cosine")
COLUMNS = ["seed", "candidate", "query", "horizon", "measured", "estimator", "estimate", "candidate_kind",
           "query_kind", "after", "label", "unit"]


def choose_estimators(cfg: AttributionConfig, names: Sequence[str] | None = None) -> list[str]:
    """The estimators to run: ``names`` (the command's), else the config's, else :data:`DEFAULT`
    (those installed; a note on stderr for the rest). A named estimator that does not exist or
    is not installed is a one-line error naming the extra that installs it."""
    chosen = list(dict.fromkeys(names or cfg.attribute.estimators or ()))
    if chosen:
        for n in chosen:
            get_estimator(n)
        if cfg.optimizer == "sgd" and "adam" in chosen:
            raise SeedlabError("estimators: adam predicts an AdamW step, and this bank was trained with optimizer: sgd")
        return chosen
    have = set(available())
    for n in DEFAULT:
        if n not in have:
            print(f"note: estimator {n!r} skipped: {ESTIMATORS[n].library} is not installed ({INSTALL_HINT})", file=sys.stderr)
    return [n for n in DEFAULT if n in have and not (n == "adam" and cfg.optimizer == "sgd")]


def attribute(root: str | Path, *, estimators: Sequence[str] | None = None, device: str = "auto",
              progress: bool = True) -> pd.DataFrame:
    """Run the estimators on every seed of a bank and write attribution.parquet beside it (module doc)."""
    bank = open_bank(root)
    names = choose_estimators(bank.cfg, estimators)  # before any work: bad names write nothing
    dev = World().device(device)
    settle(dev, bank.cfg.threads)  # threads; on CUDA the cuBLAS workspace before the first matmul (lm/determinism.py)
    measured = collect(bank)
    seeds = sorted(int(k) for k in measured.seed.unique())
    seconds: dict[str, dict[str, float]] = {n: {} for n in names}
    frames = []
    gc.freeze()  # kronfluence runs gc.collect() a dozen times per analysis: what lives now need not be walked each time
    try:
        with Bar("attribute", len(seeds) * len(names), "estimators", enabled=progress) as bar, \
                nondeterminism_is_an_error():
            for seed in seeds:
                frames.append(estimates_of_seed(bank, seed, names, dev, seconds, bar))
    finally:
        gc.unfreeze()
    est = pd.concat(frames, ignore_index=True)
    df = measured.merge(est, on=["seed", "candidate", "query", "horizon"], how="inner", validate="1:m")[COLUMNS]
    write_parquet(bank.dir.attribution, df)
    a = bank.cfg.attribute
    write_json(bank.dir.attribution_json, {
        "estimators": names, "seeds": seeds, "seconds": seconds, "device": str(dev),
        "influence_at": a.influence_at, "damping": a.damping, "modules": a.modules, "train_rows": a.train_rows,
        "tracin_steps": tracin_steps(bank.cfg),
    })
    return df


def tracin_steps(cfg: AttributionConfig) -> list[int]:
    """The twin checkpoints TracIn sums over (before the last horizon)."""
    last = max(cfg.horizon_steps())
    return [t for t in cfg.twin_steps() if t < last]


def estimates_of_seed(bank: Bank, seed: int, names: list[str], device, seconds: dict, bar: Bar) -> pd.DataFrame:
    """Every estimator on one seed's case: a long frame (seed, candidate, query, horizon, estimator, estimate, unit)."""
    cfg, inputs = bank.cfg, bank.inputs
    s = cfg.injection_step
    trainer = Trainer(cfg.model_copy(update={"device": str(device)}), inputs.gcfg, seed, inputs.corpus.train)
    trainer.load_state(bank.dir.prefix(seed))  # θ_s and the optimizer before step s, every tensor's hash checked
    if trainer.step != s:
        raise SeedlabError(f"{bank.dir.prefix(seed)}: holds step {trainer.step}, not the injection step {s}")
    cands = {n: t.tokens for n, t in bank.finished_candidates(seed).items()}
    queries = (dict(cands) if cfg.queries.own else {}) | {n: t.tokens for n, t in inputs.queries.items()}
    x, y = inputs.ordinary_batch(seed)
    case = Case.of(x, y, cfg.injection_row, cands, queries, inputs.pad_id)
    horizons = list(cfg.horizon_steps())
    twin = bank.dir.twin(seed)
    frames = []
    for name in names:
        bar.update(note=f"seed {seed}: {name}")
        t0 = time.perf_counter()
        if name in AT_INJECTION:
            v = run(name, trainer.model, case, lr=trainer.lr, optimizer=trainer.opt, grad_clip=cfg.grad_clip,
                    micro_batch=cfg.micro_batch)
            by_h = dict.fromkeys(horizons, v)
        elif name == "tracin":
            terms = {t: run("tracin", trainer.model, case, checkpoints=[(twin.weights(t), lr_of(cfg, t))],
                            micro_batch=cfg.micro_batch) for t in tracin_steps(cfg)}
            by_h = {h: sum((terms[t] for t in terms if t < h), np.zeros((len(cands), len(queries)))) for h in horizons}
        else:
            by_h = influence_by_horizon(name, trainer, case, cfg, twin, horizons)
        seconds[name][str(seed)] = time.perf_counter() - t0
        frames.append(_long(by_h, case, cfg.queries.own, inputs.queries).assign(seed=seed, estimator=name,
                                                                                unit=ESTIMATORS[name].unit))
        bar.advance()
    return pd.concat(frames, ignore_index=True)


def influence_by_horizon(name: str, trainer: Trainer, case: Case, cfg: AttributionConfig, twin,
                         horizons: list[int]) -> dict[int, np.ndarray]:
    """EK-FAC / K-FAC: at the twin's weights of every horizon, or once at θ_s (``influence_at``)."""
    from seedlab.attribution.influence import InfluenceOptions

    a = cfg.attribute
    opts = {"damping": a.damping, "modules": a.modules, "train_rows": a.train_rows}
    if a.influence_at == "injection":
        return dict.fromkeys(horizons, run(name, trainer.model, case, influence=InfluenceOptions(**opts)))
    return {h: run(name, trainer.model, case, influence=InfluenceOptions(**opts, weights=twin.weights(h)))
            for h in horizons}


def _long(by_h: dict[int, np.ndarray], case: Case, own: bool, queries: dict) -> pd.DataFrame:
    """[candidates × case queries] per horizon -> rows (candidate, query, horizon, estimate); a
    candidate's own text is its ``self`` query, the query rows and probes keep their names."""
    col = {q: j for j, q in enumerate(case.queries)}
    rows = []
    for h, v in by_h.items():
        for i, c in enumerate(case.candidates):
            if own:
                rows.append((c, SELF, h, float(v[i, col[c]])))
            rows.extend((c, q, h, float(v[i, col[q]])) for q in queries)
    return pd.DataFrame(rows, columns=["candidate", "query", "horizon", "estimate"])
