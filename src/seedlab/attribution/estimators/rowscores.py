"""Estimators of a *training row's* effect: what removing row (t, i) of the twin's own run does to L_q(θ_h), for the
rows the bank's removal arms touch (attribution/bank/removals.py ``rows_of``: the leave-one-out rows, and with groups every
row of the steps s .. end − 1) — the predictions the leave-one-out (attribution/analyses/loo.py) and the LDS (attribution/analyses/lds.py)
are scored on. ``seedlab attribution rowscores BANK`` writes them to rowscores.parquet (:data:`COLUMNS`).

**Which estimators can score an arbitrary training row at an arbitrary step.** Most of the bank's estimators
(attribution/estimators/builtin.py) are functions of one swap at s: the row's gradient difference δ_c at θ_s and AdamW's state
before step s (sgd, adam, adam-linear, tracin's one term, cosine, adam-cosine, the baselines), and unroll carries the
change of *that* step forward. A row of another step t is another case (its θ_t, its AdamW state, the moments carried
to h): they do not apply as they are. What does:

===========  ==========================================================================================  ==========
name         value: the predicted Δ L_q(θ_h) of removing row (t, i) (positive: the query's loss rises)      unit
===========  ==========================================================================================  ==========
metagrad     −∂L_q(θ_h)/∂w_{t,i} at w = 1 (attribution/estimators/metagrad.py; a removal is Δw = −1): the exact first  nats/token
             order through the twin's replayed run; read from metagrad.parquet, not computed here
tracin       TracIn's one term for the row's one visit (Pruthi et al. 2020, §3): +lr_t·⟨∇L_q(θ_t),          nats/token
             ∇ℓ_i(θ_t)⟩ / N at the weights the row was trained at (the twin replayed and hash-checked);
             no clip, no Adam, no propagation: the same number at every horizon after t
grad-dot     ⟨∇L_q(θ_h), ∇ℓ_i(θ_h)⟩ / N at the twin's weights of the horizon (one model, no projection, no  score
             kernel: TRAK-like without its (ΦᵀΦ)⁻¹, the field's "gradient dot product")
grad-cosine  cos(∇L_q(θ_h), ∇ℓ_i(θ_h)) (the field's gradient-cosine baseline)                            cosine
ekfac        +⟨∇L_q, (F + λ)⁻¹ ∇ℓ_i⟩ / D at the twin's weights at the end (kronfluence's pairwise scores,   nats/token
             F fitted on attribute.fit_rows rows of steps 0 .. end as attribute's ekfac is; D = B, or
             attribute.train_rows): the influence function of removing the row, as the field computes it
             for groups by summing per-row scores; the end horizon only (its cost: one score per row)
trak         +τ(q, z) = φ(q)ᵀ (ΦᵀΦ)⁻¹ φ(z) · Q_z (TRAK, Park et al. 2023, one model, through traker exactly  score
             as influence.py's ``trak``: margin gradients, a seeded Gaussian projection, traker's scale)
             at the twin's weights at the end; Φ's training set is the rows themselves, as the field
             fits it for groups: the attribute.fit_rows rows ekfac fits F on, then every row scored (a
             scored row drawn among the fit rows is in Φ twice, as ``trak``'s replaced row is). τ > 0
             says training on z lowers q's loss, so removing it raises it: +τ (``trak``'s swap is
             −(τ(q, c) − τ(q, r)): the candidate added, the row removed); the end horizon only
metagrad-    metagrad's value where the row is at most W = attribute.metagrad_window updates older than   nats/token
trunc        the horizon (h − t ≤ W; 10, the linear horizon measured at B 8), 0 for an older row: one
             truncated backward pass (metagrad.py ``truncated_rows``: each horizon's adjoint carried back W
             steps; inside W bitwise metagrad.parquet's values). A variant: run when named
===========  ==========================================================================================  ==========

ℓ_i is row i's CE sum over its T targets and N = B·T (the trainer's loss, lm/trainer.py); ∇L_q the query's mean CE
gradient, all in eval mode, float64 (attribution/estimators/builtin.py's ``Gradients``; trak: traker's float32, on the CPU,
whatever ``device`` says). A group's prediction is the sum of its rows' values (lds.py): the additive model every
group attribution assumes (TRAK's LDS sums τ so). ``grad-dot`` is TRAK's one-model, unprojected, kernel-free core.

Cost per seed (R rows, Q queries, H horizons, B rows a batch): tracin replays the twin from step 0 (rows before s)
or from the prefix, and takes Q + B one-row gradients at each row step; grad-dot and grad-cosine take Q + R gradients
per horizon (one pass gives both); ekfac fits the curvature once and scores R rows; trak featurizes M + R rows (M
the fit rows) and the Q queries once, on the CPU (the p × k projection held: 4·p·k bytes, k = (M + R) // 2 ≤ 2048).

The table above is registered once, as registry.py ``ROW_ESTIMATORS`` (names, units, libraries). Beside it,
training-rows plug-ins (``--estimator package.module:function``, ``function(rows)``: attribution/estimators/plugins.py
``Rows``) run at their declared horizons: the dattri adapter's attributors (attribution/dattri_adapter.py
``rows.<name>``) are such plug-ins. The same loop
(:func:`seed_rowscores`) scores an export (``seedlab attribution score --row-estimator``), its rows' tokens read from
the export's removed rows.

``--add`` (``add=True``) keeps the estimators of a rowscores.parquet already there that were not asked for and
replaces those that were (rowscores.json's estimators and seconds merged likewise).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from seedlab.attribution.bank import removals
from seedlab.attribution.bank.rundir import Bank, open_bank
from seedlab.attribution.estimators.registry import ROW_ESTIMATORS, get_row_estimator
from seedlab.errors import SeedlabError, in_seed
from seedlab.store import write_json, write_parquet

if TYPE_CHECKING:  # torch is imported where the gradients are taken: the report reads row scores without it
    import torch

COLUMNS = ["seed", "estimator", "query", "horizon", "step", "row", "value", "unit"]
#: the estimators computed here, as registered once in registry.py ``ROW_ESTIMATORS`` (metagrad's values come from
#: metagrad.parquet: :func:`metagrad_scores`); training-rows plug-ins (``package.module:function``) run beside them
ESTIMATORS = tuple(ROW_ESTIMATORS)
UNITS = {"metagrad": "nats/token", **{n: e.unit for n, e in ROW_ESTIMATORS.items()}}
#: the optional library an estimator needs: its import name (the key of registry.py's install hints)
LIBRARIES = {n: e.library for n, e in ROW_ESTIMATORS.items() if e.library is not None}


def choose(names: Sequence[str] | None) -> list[str]:
    """The estimators asked for (None: every one whose library is installed, the variants — metagrad-trunc — left to
    be named); an unknown name is a one-line error, and so is a plug-in that does not load or is not of the
    training-rows form (registry.py ``row_plugin``)."""
    if names:
        bad = [n for n in names if n not in ESTIMATORS and ":" not in n]
        if bad:
            more = " (metagrad's rows come from `seedlab attribution metagrad`)" if "metagrad" in bad else ""
            raise SeedlabError(f"--estimator: must be among {', '.join(ESTIMATORS)} (or a training-rows plug-in "
                               f"package.module:function), got {bad[0]!r}{more}")
        for name in names:
            _library(name)
        return list(dict.fromkeys(names))
    out = []
    for name in ESTIMATORS:
        if ROW_ESTIMATORS[name].label == "variant":
            continue
        try:
            _library(name)
        except SeedlabError:
            continue
        out.append(name)
    return out


def _library(name: str) -> None:
    """A one-line error when ``name`` needs a library (:data:`LIBRARIES`) that is not installed, or is a plug-in
    that does not load as a training-rows estimator."""
    get_row_estimator(name)


def bank_rowscores(root: str | Path, *, estimators: Sequence[str] | None = None, device: str = "auto",
                   progress: bool = True, add: bool = False, jobs: int = 1) -> pd.DataFrame:
    """``seedlab attribution rowscores BANK``: every removal row's value (module doc) for every estimator, query
    and horizon after the row's step, every seed whose twin finished; written to rowscores.parquet and
    rowscores.json (the seconds per seed and estimator). Every input is checked before any work: a bank without
    ``loo`` or ``groups``, an unknown estimator, no finished twin — one line, nothing written. ``add``: keep the
    other estimators' rows of a rowscores.parquet already there (these estimators' rows are replaced), e.g.
    ``--estimator trak --add`` on a bank scored before; the frame returned is then the merged one. ``jobs`` > 1:
    that many seeds at once, each in a process of its own on one thread (the same numbers; each seed's seconds its
    own process's)."""
    from seedlab.lm.determinism import nondeterminism_is_an_error, settle
    from seedlab.lm.distributed import World
    from seedlab.progress import Bar

    if jobs < 1:
        raise SeedlabError(f"--jobs: at least 1, got {jobs}")
    bank = open_bank(root)
    cfg = bank.cfg
    if cfg.loo is None and cfg.groups is None and cfg.trak is None:
        raise SeedlabError(f"{bank.root}: the bank removes no rows (no loo, groups or trak section): nothing to score")
    names = choose(estimators)
    seeds = [seed for seed in cfg.seeds if bank.dir.twin(seed).finished]
    if not seeds:
        raise SeedlabError(f"{bank.root}: no seed's twin has finished (run `seedlab attribution bank` first)")
    rows = removals.rows_of(cfg)
    hs = sorted(cfg.horizon_steps())
    from seedlab.attribution.estimators.metagrad import replay_check

    checks = {seed: replay_check(bank, seed, hs) for seed in seeds}
    dev = World().device(device)
    settle(dev, 1 if jobs > 1 else cfg.threads)
    with Bar("rowscores", len(seeds) * len(names), "scores", enabled=progress) as bar:
        if jobs > 1:
            from seedlab.executors import run_tallied

            specs = [(str(bank.root), seed, names, str(dev)) for seed in seeds]
            done = run_tallied(rowscores_seed, specs, bar.advance, lambda seed: len(names), jobs)
        else:
            with nondeterminism_is_an_error():
                done = [seed_rowscores(bank, seed, names, rows, hs, dev, checks[seed], bar) for seed in seeds]
    df = pd.concat([f for f, _ in done], ignore_index=True)[COLUMNS]
    seconds = {str(seed): t for seed, (_, t) in zip(seeds, done)}
    if add and bank.dir.rowscores.is_file() and bank.dir.rowscores_json.is_file():
        df, names, seconds = _merged(bank, df, names, seconds)
    write_parquet(bank.dir.rowscores, df)
    write_json(bank.dir.rowscores_json, {"estimators": names, "rows": len(rows), "horizons": hs,
                                                         "device": str(dev), "seconds": seconds})
    return df


def rowscores_seed(spec: tuple[str, int, list[str], str]) -> tuple[pd.DataFrame, dict[str, float]]:
    """One seed of ``rowscores --jobs`` in a process of its own: the bank read back, one thread, the replay checked
    as in the caller, its progress reported to the caller's bar (executors.py ``Reporter``); a failure is one line
    naming the seed."""
    from seedlab.attribution.estimators.metagrad import replay_check
    from seedlab.executors import Reporter
    from seedlab.lm.determinism import nondeterminism_is_an_error, settle
    from seedlab.lm.distributed import World

    root, seed, names, device = spec
    try:
        bank = open_bank(root)
        dev = World().device(device)
        settle(dev, 1)
        hs = sorted(bank.cfg.horizon_steps())
        with nondeterminism_is_an_error():
            return seed_rowscores(bank, seed, names, removals.rows_of(bank.cfg), hs, dev, replay_check(bank, seed, hs),
                                  Reporter(seed))
    except Exception as err:  # one line, whatever it was
        raise in_seed(seed, err) from None


def seed_rowscores(bank: Bank, seed: int, names: Sequence[str], rows: list[tuple[int, int]], horizons: list[int],
                   device, check=None, bar=None) -> tuple[pd.DataFrame, dict[str, float]]:
    """Every estimator of ``names`` (built-ins and training-rows plug-ins, :func:`choose`d) on the ``rows`` of one
    seed at the ``horizons``: the long frame (:data:`COLUMNS`) and each estimator's seconds. The one loop behind
    ``seedlab attribution rowscores`` and ``seedlab attribution score --row-estimator`` (a bank or an export: the
    rows' tokens come from the export's removed rows where it has them, :func:`_row_tensors`). ``check``: the
    twin's replay check (metagrad.py ``replay_check``; made here when tracin needs it and none is given)."""
    frames, seconds = [], {}
    for name in names:
        if bar is not None:
            bar.update(note=f"seed {seed} {name}")
        t0 = time.perf_counter()
        if name == "tracin":
            if check is None:
                from seedlab.attribution.estimators.metagrad import replay_check

                check = replay_check(bank, seed, horizons)
            f = tracin_scores(bank, seed, rows, horizons, device, check)
        elif name == "metagrad-trunc":  # metagrad.py imports torch: here, when it runs
            from seedlab.attribution.estimators.metagrad import replay_check, truncated_rows

            if check is None:
                check = replay_check(bank, seed, horizons)
            f = truncated_rows(bank, seed, rows, horizons, device, check)
        elif name == "ekfac":
            f = ekfac_scores(bank, seed, rows, device)
        elif name == "trak":
            f = trak_scores(bank, seed, rows)
        elif name in ("grad-dot", "grad-cosine"):
            f = None
            shared = ROW_ESTIMATORS["grad-cosine"].shares
            if name == shared or shared not in names:  # one pass gives both
                f = gradient_scores(bank, seed, rows, horizons, device)
                f = f[f.estimator.isin(names)]
        else:
            f = plugin_scores(bank, seed, get_row_estimator(name), rows, horizons)
        if f is not None:
            frames.append(f)
        seconds[name] = time.perf_counter() - t0
        if bar is not None:
            bar.advance()
    return pd.concat(frames, ignore_index=True)[COLUMNS], seconds


def _merged(bank: Bank, df: pd.DataFrame, names: list[str], seconds: dict[str, dict[str, float]]
            ) -> tuple[pd.DataFrame, list[str], dict[str, dict[str, float]]]:
    """``add``: the estimators already in rowscores.parquet that were not asked for kept (their rows and seconds as
    they are), those asked for replaced."""
    import json

    old, before = pd.read_parquet(bank.dir.rowscores), json.loads(bank.dir.rowscores_json.read_text())
    kept = [n for n in before["estimators"] if n not in names]
    df = pd.concat([old[old.estimator.isin(kept)][COLUMNS], df], ignore_index=True)
    merged = {seed: {n: t for n, t in times.items() if n in kept} for seed, times in before["seconds"].items()}
    for seed, times in seconds.items():
        merged[seed] = merged.get(seed, {}) | times
    return df, kept + names, merged


# --------------------------------------------------------------------------- gradients


def _queries(bank: Bank) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.tokens) for n, t in bank.inputs.queries.items()}


def _query_grads(model, queries: dict[str, tuple[int, ...]], micro_batch: int | None) -> torch.Tensor:
    """[Q, P] float64: ∇L_q (mean CE) of every query at ``model``'s weights (estimators.py ``Gradients.query``)."""
    import torch

    from seedlab.attribution.estimators.builtin import Gradients

    g = Gradients(model, SimpleNamespace(queries=queries), micro_batch=micro_batch)
    return torch.stack([g.query(q) for q in queries])


def _row_grads(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[n, P] float64: ∇ℓ_i, each row's CE sum over its targets, one row at a time (eval mode)."""
    import torch

    from seedlab.attribution.estimators.builtin import _eval
    from seedlab.lm.determinism import deterministic
    from seedlab.lm.gradients import ce_sum_grad

    device = next(model.parameters()).device
    out = []
    with _eval(model), deterministic(device):
        for i in range(x.shape[0]):
            g, _ = ce_sum_grad(model, x[i:i + 1], y[i:i + 1], torch.ones(1, x.shape[1], dtype=torch.bool), 1)
            out.append(g)
    return torch.stack(out)


def _batch(bank: Bank, seed: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    from seedlab.lm.batches import get_batch

    return get_batch(bank.inputs.corpus.train, seed, t, bank.cfg.batch_size, bank.inputs.gcfg.block_size)


def _row_tensors(bank: Bank, seed: int, rows: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) [len(rows), T] of the training rows (t, i), in order: an export's removed rows where it carries them
    (its ``removed_rows(seed)``: attribution/benchmark.py), else each step's batch drawn once from the corpus."""
    import torch

    kept = getattr(bank, "removed_rows", None)
    if kept is not None and (have := kept(seed)) is not None:
        index = {r: j for j, r in enumerate(have[0])}
        missing = [r for r in rows if r not in index]
        if not missing:
            pick = torch.tensor([index[r] for r in rows], dtype=torch.int64)
            return have[1][pick], have[2][pick]
    batches = {t: _batch(bank, seed, t) for t in dict.fromkeys(t for t, _ in rows)}
    return (torch.stack([batches[t][0][i] for t, i in rows]), torch.stack([batches[t][1][i] for t, i in rows]))


def _long(seed: int, estimator: str, queries: list[str], h: int, rows: list[tuple[int, int]], values: np.ndarray,
          unit: str | None = None) -> pd.DataFrame:
    """values [rows, queries] as rowscores.parquet's long frame."""
    R, Q = values.shape
    return pd.DataFrame({"seed": seed, "estimator": estimator, "query": np.tile(np.asarray(queries, dtype=object), R),
                         "horizon": h, "step": np.repeat([t for t, _ in rows], Q), "row": np.repeat([i for _, i in rows], Q),
                         "value": values.reshape(-1), "unit": unit or UNITS[estimator]})


def plugin_scores(bank: Bank, seed: int, e, rows: list[tuple[int, int]], horizons: list[int]) -> pd.DataFrame:
    """A training-rows plug-in (registry.py ``RowEstimator`` with ``fn``) at each of its horizons (its declared
    ones, else every horizon), on the rows trained before it (plugins.py :class:`~.plugins.Rows`); a result of
    another shape is a one-line error."""
    import torch

    from seedlab.attribution.estimators.plugins import Rows
    from seedlab.lm.model import GPT
    from seedlab.lm.schedule import lr_of

    cfg = bank.cfg
    where = [h for h in horizons if not e.horizons or h in _steps_of(cfg, e.horizons)]
    steps, read = twin_weights(bank, seed)
    queries = _queries(bank)
    frames = []
    for h in where:
        before = [(t, i) for t, i in rows if t < h]
        if not before:
            continue
        x, y = _row_tensors(bank, seed, before)
        ctx = Rows(seed, cfg.injection_step, h, cfg.end, tuple(t for t, _ in before), tuple(i for _, i in before),
                   x, y, dict(queries), bank.inputs.pad_id, cfg.batch_size, cfg.batch_size * bank.inputs.gcfg.block_size,
                   tuple(steps), lambda t: lr_of(cfg, t), read, lambda: GPT(bank.inputs.gcfg), str(bank.root))
        out = e.fn(ctx)
        out = np.asarray(out.detach().cpu().double() if isinstance(out, torch.Tensor) else out, dtype=np.float64)
        if out.shape != (len(before), len(queries)):
            raise SeedlabError(f"estimator {e.name!r}: returned shape {out.shape}, not (rows, queries) = "
                               f"{(len(before), len(queries))}")
        frames.append(_long(seed, e.name, list(queries), h, before, out, e.unit))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def _steps_of(cfg, horizons) -> set[int]:
    """A plug-in's declared horizons (config terms: updates after s, "mid", "end") as steps."""
    return {cfg.end if h == "end" else cfg.mid if h == "mid" else cfg.injection_step + int(h) for h in horizons}


def twin_weights(bank: Bank, seed: int) -> tuple[list[int], object]:
    """(steps, read): every step at which the twin's weights of ``seed`` can be read — its saved checkpoints, and an
    export's weights at the removed rows' steps (its ``removed_weights(seed)``) — and ``read(step)``, the state dict
    with every tensor's hash checked."""
    twin = bank.dir.twin(seed)
    folders = {int(t): twin for t in twin.read_manifest() if twin.checkpoint(int(t)).is_file()}
    extra = getattr(bank, "removed_weights", None)
    if extra is not None and (more := extra(seed)) is not None:
        for t in more.read_manifest():
            if more.checkpoint(int(t)).is_file():
                folders.setdefault(int(t), more)
    return sorted(folders), lambda t: folders[int(t)].weights(int(t))


def replayed_weights(bank: Bank, seed: int, steps: Sequence[int], device, check) -> dict[int, dict[str, torch.Tensor]]:
    """The twin's weights after each of ``steps`` updates, replayed as :func:`tracin_scores` replays it (from step 0
    when a step is before s, else from the kept prefix) and checked at every step (``check(t, trainer)``: metagrad.py
    ``replay_check``): ``{t: state dict on the CPU}``."""
    out: dict[int, dict[str, torch.Tensor]] = {}

    def visit(trainer) -> None:
        check(trainer.step, trainer)
        if trainer.step in want:
            out[trainer.step] = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}

    want = set(int(t) for t in steps)
    if want:
        _replay(bank, seed, want, device, visit)
    return out


def _replay(bank: Bank, seed: int, stops: set[int], device, visit) -> None:
    """The twin of ``seed`` replayed to max(``stops``) (from step 0 when a stop is before s, else from the prefix),
    ``visit(trainer)`` at every stop and at every step the twin saved on the way."""
    from seedlab.forks.prefix import advance_to, read_prefix
    from seedlab.lm.trainer import Trainer

    cfg, s = bank.cfg, bank.cfg.injection_step
    tr = Trainer(cfg.model_copy(update={"device": str(device)}), bank.inputs.gcfg, seed, bank.inputs.corpus.train)
    if min(stops) >= s:
        read_prefix(tr, bank.dir.prefix(seed), s)
    manifest_steps = {int(k) for k in bank.dir.twin(seed).read_manifest()}
    last = max(stops)
    advance_to(tr, last, stops=set(stops) | {t for t in manifest_steps if t <= last}, visit=visit)


def tracin_scores(bank: Bank, seed: int, rows: list[tuple[int, int]], horizons: list[int], device, check
                  ) -> pd.DataFrame:
    """``tracin`` (module doc): the twin replayed (from step 0 when a row is older than s, else from the kept
    prefix; ``check(t, trainer)`` at every step: metagrad.py ``replay_check``), and at every row step t the value
    +lr_t·⟨∇L_q(θ_t), ∇ℓ_i(θ_t)⟩ / N, repeated at every horizon after t."""
    cfg, queries = bank.cfg, _queries(bank)
    by_step: dict[int, list[int]] = {}
    for t, i in rows:
        by_step.setdefault(t, []).append(i)
    N = cfg.batch_size * bank.inputs.gcfg.block_size
    frames = []

    def visit(trainer) -> None:
        t = trainer.step
        check(t, trainer)
        if t not in by_step:
            return
        x, y = _batch(bank, seed, t)
        idx = by_step[t]
        G = _row_grads(trainer.model, x[idx], y[idx])  # [n, P]
        Gq = _query_grads(trainer.model, queries, cfg.micro_batch)  # [Q, P]
        values = (trainer.lr * (G @ Gq.T) / N).cpu().numpy()
        for h in horizons:
            if h > t:
                frames.append(_long(seed, "tracin", list(queries), h, [(t, i) for i in idx], values))

    _replay(bank, seed, set(by_step), device, visit)
    return pd.concat(frames, ignore_index=True)


def gradient_scores(bank: Bank, seed: int, rows: list[tuple[int, int]], horizons: list[int], device) -> pd.DataFrame:
    """``grad-dot`` and ``grad-cosine`` (module doc) at the twin's saved weights of every horizon, for the rows
    before it."""
    import copy

    from seedlab.lm.model import GPT

    cfg, queries = bank.cfg, _queries(bank)
    model = GPT(bank.inputs.gcfg).to(device)
    N = cfg.batch_size * bank.inputs.gcfg.block_size
    frames = []
    batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for h in horizons:
        before = [(t, i) for t, i in rows if t < h]
        if not before:
            continue
        model.load_state_dict(bank.dir.twin(seed).weights(h))
        work = copy.deepcopy(model)
        Gq = _query_grads(work, queries, cfg.micro_batch)
        qn = Gq.norm(dim=1)
        dots, cosines = np.zeros((len(before), len(queries))), np.zeros((len(before), len(queries)))
        for j, (t, i) in enumerate(before):
            if t not in batches:
                batches[t] = _batch(bank, seed, t)
            x, y = batches[t]
            g = _row_grads(work, x[i:i + 1], y[i:i + 1])[0]
            d = Gq @ g
            dots[j] = (d / N).cpu().numpy()
            cosines[j] = (d / (qn * g.norm()).clamp_min(1e-300)).cpu().numpy()
        frames += [_long(seed, "grad-dot", list(queries), h, before, dots),
                   _long(seed, "grad-cosine", list(queries), h, before, cosines)]
    return pd.concat(frames, ignore_index=True)


def ekfac_scores(bank: Bank, seed: int, rows: list[tuple[int, int]], device) -> pd.DataFrame:
    """``ekfac`` (module doc): kronfluence's pairwise scores at the twin's weights at the end, for every row."""
    import torch

    from seedlab.attribution.estimators.attribute import fit_set
    from seedlab.attribution.estimators.influence import _rows, gpt_task, kronfluence_scores, query_rows, tracked_modules
    from seedlab.lm.model import GPT

    cfg, queries, end = bank.cfg, _queries(bank), bank.cfg.end
    a = cfg.attribute
    model = GPT(bank.inputs.gcfg).to(device)
    model.load_state_dict(bank.dir.twin(seed).weights(end))
    fx, fy = fit_set(bank, seed, end)
    X, Y = _row_tensors(bank, seed, rows)
    qx, qy, qm = query_rows(queries, 0)  # padded with token 0 after each text (masked)
    task = gpt_task(tracked_modules(model, a.modules))
    scores = kronfluence_scores(model, task, _rows(fx, fy, torch.ones(fx.shape, dtype=torch.bool)), _rows(qx, qy, qm),
                                _rows(X, Y, torch.ones(X.shape, dtype=torch.bool)), strategy="ekfac",
                                damping=a.damping)  # [Q, R]
    D = a.train_rows or cfg.batch_size
    return _long(seed, "ekfac", list(queries), end, rows, scores.T / D)


def trak_scores(bank: Bank, seed: int, rows: list[tuple[int, int]]) -> pd.DataFrame:
    """``trak`` (module doc): traker's τ(q, z) at the twin's weights at the end (influence.py ``trak_tau``, on the
    CPU, as ``trak`` computes it: P seeded 0, proj_dim half the training rows, at most 2048), Φ fitted on the
    :func:`~seedlab.attribution.estimators.attribute.fit_set` rows of the end, then every row scored."""
    import torch

    from seedlab.attribution.estimators.attribute import fit_set
    from seedlab.attribution.estimators.influence import InfluenceOptions, query_rows, trak_tau
    from seedlab.lm.model import GPT

    queries, end = _queries(bank), bank.cfg.end
    model = GPT(bank.inputs.gcfg)
    model.load_state_dict(bank.dir.twin(seed).weights(end))
    fx, fy = fit_set(bank, seed, end)
    rx, ry = _row_tensors(bank, seed, rows)
    X, Y = torch.cat([fx, rx]), torch.cat([fy, ry])
    o = InfluenceOptions()  # attribute's trak: its defaults (seed 0, proj_dim None, fit_batch 8)
    tau = trak_tau(model, (X, Y, torch.ones(X.shape, dtype=torch.bool)), query_rows(queries, bank.inputs.pad_id),
                   proj_dim=o.proj_dim, seed=o.seed, fit_batch=o.fit_batch)  # [M + R, Q]
    return _long(seed, "trak", list(queries), end, rows, tau[len(fx):])


# --------------------------------------------------------------------------- reading them back


def metagrad_scores(metagrad: pd.DataFrame) -> pd.DataFrame:
    """metagrad.parquet as row scores (:data:`COLUMNS`): value = −∂L_q(θ_h)/∂w_{t,i}, a removal's first order."""
    return metagrad.assign(estimator="metagrad", value=-metagrad["value"], unit=UNITS["metagrad"])[COLUMNS]


def read_scores(root: str | Path) -> pd.DataFrame | None:
    """Every row score of a bank folder: metagrad.parquet's (as :func:`metagrad_scores`) and rowscores.parquet's;
    None when it has neither."""
    from seedlab.attribution.bank.rundir import BankDir

    rd = BankDir(Path(root))
    parts = []
    if rd.metagrad.is_file():
        parts.append(metagrad_scores(pd.read_parquet(rd.metagrad)))
    if rd.rowscores.is_file():
        parts.append(pd.read_parquet(rd.rowscores)[COLUMNS])
    return pd.concat(parts, ignore_index=True) if parts else None
