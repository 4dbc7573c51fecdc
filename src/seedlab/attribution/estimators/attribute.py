"""``seedlab attribution attribute DIR``: every estimator's prediction of every measured effect.

Per seed, from the twin's own files (attribution/bank/run.py; the estimators and their definitions:
attribution/estimators/builtin.py, attribution/estimators/registry.py):

- at θ_s, the kept prefix — ``sgd``, ``adam``, ``adam-linear``, ``tracin``, ``cosine``,
  ``adam-cosine``, the baselines (``random``, ``loss``, ``gradnorm``, ``length``) and plug-ins
  at θ_s (``package.module:function`` of (model, case, grads)): its weights, and (the adam family)
  the AdamW state *before* the injected update (moments and step counts); ``lr`` the rate of step s
  (lm/schedule.py ``lr_of``), the trainer's gradient clip, ``random``'s seed the training seed. The
  same number is set beside the measured effect of every horizon (its agreement at later horizons
  asks how much of the first step's effect survives). ``tracin`` is TracIn's sum over the
  candidate's visits, and it was visited once: the term at s.
- horizon-aware plug-ins (a function of ``ctx``: attribution/estimators/plugins.py) — called once per horizon
  h with the same inputs and h, the twin's weights loaded on request (``bank.dir.twin(seed).weights``);
  a horizon the plug-in declares and the bank lacks is refused before any work.
- ``tracin-cp`` (a variant) — TracIn-CP over the twin's saved checkpoints: at horizon h the sum
  over the saved steps t with s ≤ t < h of the one-checkpoint term at θ_t with the rate of step
  t; the terms after s are for visits that never happened.
- ``unroll`` (and its readout and tangent; attribution/estimators/unroll.py) and ``metagrad`` (the same linearisation in
  reverse mode, attribution/estimators/metagrad.py) — the twin replayed from the kept prefix and checked against its
  hashes; unroll pushes every candidate's exact change at s forward, metagrad pulls every query's adjoint back
  to s + 1 (one backward pass from the last horizon) and takes its inner product with the same change.
  ``metagrad-trunc`` (a variant) is metagrad at the horizons at most ``attribute.metagrad_window`` updates after s
  (bit for bit) and 0 at the later ones, whose adjoints it does not take.
- ``ekfac``, ``kfac`` — influence functions with kronfluence's curvature, and ``trak`` (TRAK through
  traker); ``attribute.influence_at: horizon`` evaluates them at the twin's weights at each horizon
  h (the model whose loss is predicted), ``injection`` once at θ_s (h = s). The curvature (trak:
  the training set of its ΦᵀΦ, beside the replaced row and the candidates) is fitted on
  ``attribute.fit_rows`` rows (default 256) drawn without replacement, seeded by (seed, h), from
  the training batches of steps 0 .. h (lm/batches.py: the twin's data up to the evaluated
  weights; all of them when they are fewer) — not on the one batch of step s. A ``fit_rows`` above the corpus's training rows
  (its train split's tokens // (block_size + 1)) is refused before any work.

Every estimator sees the same case: the ordinary batch of (seed, s), row ``injection_row``, the
finished candidates, and as queries every candidate's own text (its ``self`` query) and every
query row and probe. ``attribution.parquet`` (one row per seed × candidate × query × horizon ×
estimator) has the columns

    seed, candidate, query, horizon, measured, measured_replicate, estimator, estimator_label,
    estimate, candidate_kind, query_kind, after, label, unit

(``measured_replicate``: measure.collect's column when the bank has it, else NaN;
``estimator_label``: estimator, variant, baseline or plug-in, registry.py ``Estimator.label``) and
``attribution.json`` the estimators run, their wall time per seed (the estimators at θ_s share one
set of cached gradients, so the first of them pays for it: time one alone with
benchmarks/attribution_bank.py), and the settings. ``settings``
(the command's ``--set attribute.KEY=VALUE``) override the bank's ``attribute`` section for this
run only (config.json is not changed).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from seedlab.attribution.bank.config import AttributeConfig, AttributionConfig
from seedlab.attribution.estimators.builtin import Case, Gradients
from seedlab.attribution.bank.measure import collect
from seedlab.attribution.estimators.metagrad import TRUNCATED, metagrad, replay_check
from seedlab.attribution.estimators.plugins import check_horizons
from seedlab.attribution.estimators.registry import ESTIMATORS, HINTS, available, get_estimator, run
from seedlab.attribution.bank.rundir import Bank, open_bank
from seedlab.attribution.bank.texts import SELF
from seedlab.attribution.estimators.unroll import responses
from seedlab.config import apply_overrides, parse
from seedlab.errors import SeedlabError, in_seed
from seedlab.forks.prefix import first_difference, read_prefix
from seedlab.lm.batches import batch_indices
from seedlab.lm.determinism import nondeterminism_is_an_error, settle
from seedlab.lm.distributed import World
from seedlab.lm.schedule import lr_of
from seedlab.lm.trainer import Trainer
from seedlab.progress import Bar
from seedlab.store import tensor_hashes, write_json, write_parquet

#: what runs when neither the command nor the config names estimators (those installed); the
#: variants adam-linear and tracin-cp, kfac and plug-ins run when named
DEFAULT = ("sgd", "adam", "tracin", "cosine", "adam-cosine", "ekfac", "trak", "random", "loss", "gradnorm", "length")
CHECKPOINTS = ("tracin-cp",)  # over the twin's checkpoints
INFLUENCE = ("ekfac", "kfac", "trak")  # at the horizons' weights (or θ_s), fitted on fit_set rows
TRAJECTORY = ("unroll", "unroll-readout", "unroll-tangent")  # the swap carried through the twin's replayed steps
# (attribution/estimators/unroll.py): every one of them named is computed in one replay
METAGRAD = "metagrad"  # the same linearisation in reverse mode (attribution/estimators/metagrad.py): one backward pass per seed
COLUMNS = ["seed", "candidate", "query", "horizon", "measured", "measured_replicate", "estimator", "estimator_label",
           "estimate", "candidate_kind", "query_kind", "after", "label", "unit"]


def choose_estimators(cfg: AttributionConfig, names: Sequence[str] | None = None) -> list[str]:
    """The estimators to run: ``names`` (the command's), else the config's, else :data:`DEFAULT`
    (those installed; a note on stderr for the rest). A named estimator that does not exist, is
    not installed, or is a plug-in that does not load or asks for a horizon the bank lacks is a
    one-line error (naming the extra that installs a missing library)."""
    chosen = list(dict.fromkeys(names or cfg.attribute.estimators or ()))
    if chosen:
        for n in chosen:
            e = get_estimator(n)
            if "optimizer" in e.needs and cfg.optimizer == "sgd":
                raise SeedlabError(f"estimators: {n} needs an AdamW step's state, and this bank was trained with "
                                   "optimizer: sgd")
            check_horizons(n, e.wants, cfg)  # a plug-in's declared horizons: the bank must have them
        return chosen
    have = set(available())
    for n in DEFAULT:
        if n not in have:
            lib = ESTIMATORS[n].library
            print(f"note: estimator {n!r} skipped: {lib} is not installed ({HINTS[lib]})", file=sys.stderr)
    return [n for n in DEFAULT if n in have and not ("optimizer" in ESTIMATORS[n].needs and cfg.optimizer == "sgd")]


def with_settings(bank: Bank, settings: Sequence[str]) -> Bank:
    """``bank`` with its ``attribute`` section overridden by ``settings`` (``attribute.KEY=VALUE``,
    the command's ``--set``), validated; and ``fit_rows`` checked against the corpus."""
    cfg = bank.cfg
    if settings:
        bad = [s for s in settings if not s.startswith("attribute.")]
        if bad:
            raise SeedlabError(f"--set: attribute takes attribute.KEY=VALUE only (the bank's design is fixed), got {bad[0]!r}")
        data = apply_overrides({"attribute": cfg.attribute.model_dump()}, list(settings))
        cfg = cfg.model_copy(update={"attribute": parse(AttributeConfig, data["attribute"], "attribute")})
    rows = len(bank.inputs.corpus.train) // (bank.inputs.gcfg.block_size + 1)
    if cfg.attribute.fit_rows > rows:
        raise SeedlabError(f"attribute.fit_rows: {cfg.attribute.fit_rows} is more than the corpus's {rows} training "
                           f"rows (its train split's tokens // (block_size + 1))")
    return Bank(bank.dir, cfg, bank.inputs)


def attribute(root: str | Path, *, estimators: Sequence[str] | None = None, device: str = "auto",
              progress: bool = True, settings: Sequence[str] = (), jobs: int = 1, add: bool = False) -> pd.DataFrame:
    """Run the estimators on every seed of a bank and write attribution.parquet beside it (module doc).
    ``jobs`` > 1: that many seeds at once, each in a process of its own on one thread (the same numbers).
    ``add``: keep the other estimators' rows of an attribution.parquet already there (these estimators'
    rows are replaced), e.g. to add ``unroll`` to the defaults without running them again."""
    if jobs < 1:
        raise SeedlabError(f"--jobs: at least 1, got {jobs}")
    bank = with_settings(open_bank(root), settings)
    names = choose_estimators(bank.cfg, estimators)  # before any work: bad names write nothing
    dev = World().device(device)
    settle(dev, 1 if jobs > 1 else bank.cfg.threads)  # threads; on CUDA the cuBLAS workspace before the first matmul
    measured = collect(bank)
    if "measured_replicate" not in measured:
        measured = measured.assign(measured_replicate=np.nan)
    seeds = sorted(int(k) for k in measured.seed.unique())
    specs = [(str(bank.root), seed, names, str(dev), tuple(settings)) for seed in seeds]
    with Bar("attribute", len(seeds) * len(names), "estimators", enabled=progress) as bar:
        if jobs > 1:
            from seedlab.executors import run_tallied

            done = run_tallied(attribute_seed, specs, bar.advance, lambda seed: len(names), jobs)
        else:
            done = [seed_estimates(bank, seed, names, dev, bar) for seed in seeds]
    est = pd.concat([frame for frame, _ in done], ignore_index=True)
    seconds = {n: {str(seed): t[n] for seed, (_, t) in zip(seeds, done)} for n in names}
    df = measured.merge(est, on=["seed", "candidate", "query", "horizon"], how="inner", validate="1:m")[COLUMNS]
    if add and bank.dir.attribution.exists():
        old, before = pd.read_parquet(bank.dir.attribution), json.loads(bank.dir.attribution_json.read_text())
        kept = [n for n in before["estimators"] if n not in names]
        df = pd.concat([old[old.estimator.isin(kept)], df], ignore_index=True)
        seconds = {n: before["seconds"][n] for n in kept} | seconds
        names = kept + names
    write_parquet(bank.dir.attribution, df)
    a = bank.cfg.attribute
    write_json(bank.dir.attribution_json, {
        "estimators": names, "labels": {n: get_estimator(n).label for n in names}, "seeds": seeds, "seconds": seconds,
        "device": str(dev), "jobs": jobs, "influence_at": a.influence_at, "damping": a.damping, "modules": a.modules,
        "train_rows": a.train_rows, "fit_rows": a.fit_rows, "tracin_steps": tracin_steps(bank.cfg),
        "metagrad_window": a.metagrad_window,
    })
    return df


def attribute_seed(spec: tuple[str, int, list[str], str, tuple[str, ...]]) -> tuple[pd.DataFrame, dict[str, float]]:
    """One seed's estimates in a process of its own (``attribute --jobs``): the bank read back with the
    same settings, one thread, each estimator done reported to the caller's bar (executors.py ``Reporter``); a
    failure is one line naming the seed."""
    from seedlab.executors import Reporter

    root, seed, names, device, settings = spec
    try:
        bank = with_settings(open_bank(root), settings)
        dev = World().device(device)
        settle(dev, 1)
        return seed_estimates(bank, seed, names, dev, Reporter(seed))
    except Exception as err:  # one line, whatever it was
        raise in_seed(seed, err) from None


def seed_estimates(bank: Bank, seed: int, names: list[str], dev, bar: Bar | None) -> tuple[pd.DataFrame, dict[str, float]]:
    """:func:`estimates_of_seed` with its wall times, kronfluence's gc kept cheap and nondeterminism an error."""
    seconds: dict[str, dict[str, float]] = {n: {} for n in names}
    gc.freeze()  # kronfluence runs gc.collect() a dozen times per analysis: what lives now need not be walked each time
    try:
        with nondeterminism_is_an_error():
            frame = estimates_of_seed(bank, seed, names, dev, seconds, bar)
    finally:
        gc.unfreeze()
    return frame, {n: seconds[n][str(seed)] for n in names}


def tracin_steps(cfg: AttributionConfig) -> list[int]:
    """The twin checkpoints TracIn-CP sums over (before the last horizon)."""
    last = max(cfg.horizon_steps())
    return [t for t in cfg.twin_steps() if t < last]


def estimates_of_seed(bank: Bank, seed: int, names: list[str], device, seconds: dict, bar: Bar | None) -> pd.DataFrame:
    """Every estimator on one seed's case: a long frame (seed, candidate, query, horizon, estimator,
    estimator_label, estimate, unit)."""
    cfg, inputs = bank.cfg, bank.inputs
    s = cfg.injection_step
    trainer = Trainer(cfg.model_copy(update={"device": str(device)}), inputs.gcfg, seed, inputs.corpus.train)
    read_prefix(trainer, bank.dir.prefix(seed), s)  # θ_s and the optimizer before step s, every tensor's hash checked
    cands = {n: t.tokens for n, t in bank.finished_candidates(seed).items()}
    queries = (dict(cands) if cfg.queries.own else {}) | {n: t.tokens for n, t in inputs.queries.items()}
    x, y = inputs.ordinary_batch(seed)
    case = Case.of(x, y, cfg.injection_row, cands, queries, inputs.pad_id)
    horizons = list(cfg.horizon_steps())
    twin = bank.dir.twin(seed)
    grads = Gradients(trainer.model, case, micro_batch=cfg.micro_batch)  # shared at θ_s: the first user pays
    frames, replayed = [], {}
    for name in names:
        if bar is not None:
            bar.update(note=f"seed {seed}: {name}")
        t0 = time.perf_counter()
        if name in CHECKPOINTS:
            terms = {t: run(name, trainer.model, case, checkpoints=[(twin.weights(t), lr_of(cfg, t))],
                            micro_batch=cfg.micro_batch) for t in tracin_steps(cfg)}
            by_h = {h: sum((terms[t] for t in terms if t < h), np.zeros((len(cands), len(queries)))) for h in horizons}
        elif name in INFLUENCE:
            by_h = influence_by_horizon(name, trainer, case, bank, seed, horizons)
        elif name in TRAJECTORY:
            if name not in replayed:  # the first of them named: all of them named, one replay
                replayed.update(responses(grads, trainer, horizons, chunk=cfg.attribute.unroll_chunk,
                                       check=twin_check(bank, seed, horizons),
                                       outputs=[n for n in names if n in TRAJECTORY]))
            by_h = replayed[name]
        elif name == METAGRAD:
            by_h = metagrad(grads, trainer, horizons, check=replay_check(bank, seed, horizons))
        elif name == TRUNCATED:  # metagrad up to s + W, 0 later (no adjoint taken there)
            by_h = metagrad(grads, trainer, horizons, window=cfg.attribute.metagrad_window,
                            check=replay_check(bank, seed, horizons))
        elif get_estimator(name).per_horizon:  # a horizon-aware plug-in: its Context at each horizon (plugins.py)
            by_h = {h: run(name, trainer.model, case, grads=grads, lr=trainer.lr, optimizer=trainer.opt,
                           grad_clip=cfg.grad_clip, seed=seed, step=s, horizon=h, twin=twin.weights)
                    for h in horizons}
        else:
            v = run(name, trainer.model, case, grads=grads, lr=trainer.lr, optimizer=trainer.opt,
                    grad_clip=cfg.grad_clip, seed=seed, micro_batch=cfg.micro_batch)
            by_h = dict.fromkeys(horizons, v)
        seconds[name][str(seed)] = time.perf_counter() - t0
        e = get_estimator(name)
        frames.append(_long(by_h, case, cfg.queries.own, inputs.queries).assign(
            seed=seed, estimator=name, estimator_label=e.label, unit=e.unit))
        if bar is not None:
            bar.advance()
    return pd.concat(frames, ignore_index=True)


def twin_check(bank: Bank, seed: int, horizons: Sequence[int]):
    """``check(t, weights)`` for unroll's replay: the replayed twin's weights must hash as the bank's
    twin at every step its manifest holds (else the Jacobians would be taken along another run). A
    horizon without the twin's hashes (nothing to check the replay against there) is refused first."""
    manifest = bank.dir.twin(seed).read_manifest()
    missing = [h for h in horizons if str(h) not in manifest]
    if missing:
        raise SeedlabError(f"seed {seed}: unroll cannot reach step {missing[0]}: the twin saved no weights there "
                           f"(its steps: {', '.join(sorted(manifest, key=int))})")

    def check(t: int, weights: dict) -> None:
        want = manifest.get(str(t))
        bad = None if want is None else first_difference(want, tensor_hashes(weights))
        if bad is not None:
            raise SeedlabError(f"seed {seed}: the twin replayed for unroll differs from the bank's twin at step {t} "
                               f"in tensor {bad!r} (another torch, device or thread count than the bank's? see "
                               "environment.json)")

    return check


def fit_set(bank: Bank, seed: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows (x, y) [M, T] the influence curvature is fitted on at weights after h updates:
    ``attribute.fit_rows`` rows drawn without replacement (``default_rng([seed, h])``) from the
    training batches of steps 0 .. h of this seed (lm/batches.py), all of them when they are fewer."""
    cfg, tokens, T = bank.cfg, bank.inputs.corpus.train, bank.inputs.gcfg.block_size
    offsets = np.concatenate([batch_indices(seed, t, n_tokens=len(tokens), batch_size=cfg.batch_size, block_size=T)
                              for t in range(h + 1)])
    n = min(cfg.attribute.fit_rows, len(offsets))
    pick = np.sort(np.random.default_rng([seed, h]).choice(len(offsets), size=n, replace=False))
    rows = torch.from_numpy(np.stack([np.asarray(tokens[o : o + T + 1], dtype=np.int64) for o in offsets[pick]]))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def influence_by_horizon(name: str, trainer: Trainer, case: Case, bank: Bank, seed: int,
                         horizons: list[int]) -> dict[int, np.ndarray]:
    """EK-FAC / K-FAC: at the twin's weights of every horizon, or once at θ_s (``influence_at``),
    the curvature fitted on :func:`fit_set` of that step."""
    from seedlab.attribution.estimators.influence import InfluenceOptions

    a, twin = bank.cfg.attribute, bank.dir.twin(seed)
    opts = {"damping": a.damping, "modules": a.modules, "train_rows": a.train_rows}
    if a.influence_at == "injection":
        s = bank.cfg.injection_step
        return dict.fromkeys(horizons, run(name, trainer.model, case,
                                           influence=InfluenceOptions(**opts, fit=fit_set(bank, seed, s))))
    return {h: run(name, trainer.model, case,
                   influence=InfluenceOptions(**opts, fit=fit_set(bank, seed, h), weights=twin.weights(h)))
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
