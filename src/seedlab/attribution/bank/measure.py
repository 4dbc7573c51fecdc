"""Measured effects: Δ L_query = L_query(candidate's run) − L_query(twin), at every horizon.

The bank (attribution/bank/run.py) evaluates :func:`seedlab.measures.text.text_ce` — a text's mean
next-token cross-entropy, nats/token — while it trains, at every horizon: the twin on every text
(all candidates and all queries), each candidate's run on its own text and the queries. So no
candidate weights are stored, and

    measured(seed, c, q, h) = L_q(θ_c at h) − L_q(θ_twin at h)

with q = ``self`` for c's own text (self-influence: negative when the run learned it) and every
query row and probe. A candidate equal to the replaced row trains bitwise the twin's run, so its
measured effect is exactly 0 (the same floats subtracted). ``measured.parquet`` (one row per
seed × candidate × query × horizon) has the columns

    seed, candidate, candidate_kind, query, query_kind, horizon, after, label, measured, loss, twin_loss,
    measured_replicate

(``horizon``: updates completed; ``after``: horizon − s; ``label``: s+1, s+50, mid, end; ``loss`` /
``twin_loss``: the two L_query; ``measured_replicate``: the same Δ of the candidate's replicate —
its text in row ``candidates.replicate_row`` instead, against the same twin — NaN when the bank has
none). Unfinished runs are left out with a warning (an unfinished replicate: NaN).

With ``candidates.pairs`` the bank also gets ``additivity.parquet`` (:func:`write_additivity`,
columns :data:`PAIR_COLUMNS`): each pair's Δ beside the sum of its two single-row Δs, per seed ×
pair × shared query × horizon (what each column means, and what is computed from it:
attribution/analyses/additivity.py).

With ``loo`` / ``groups`` (attribution/bank/removals.py: rows of the twin's own batches removed) the bank also gets
``loo.parquet`` (:data:`LOO_COLUMNS`: per seed × removed (step, row) × query × horizon after the step,
measured = L_q(run without the row) − L_q(twin), ``age`` = horizon − step), ``groups.parquet``
(:data:`GROUP_COLUMNS`: per seed × α × subset × query × horizon, the subset's measured Δ L_q; ``removed_before``:
how many of its rows lie before the horizon) and ``group_rows.parquet`` (:data:`GROUP_ROW_COLUMNS`: the rows of
every subset): :func:`write_removals`. A removal run has no text of its own: it is measured on the queries only.

With ``ceiling`` (every leave-one-out row and the first group subsets again on the nudged twin, removals.py) the bank
also gets ``retest.parquet`` (:data:`RETEST_COLUMNS`: per seed × repeated removal × query × horizon, ``measured`` =
L_q(removal run) − L_q(twin) as loo.parquet and groups.parquet have it, beside ``retest`` = L_q(retest run) −
L_q(nudged twin), both runs forked alike and differing from their references by the same rows; ``removal`` loo or
group, its step and row or its α and subset, the other pair −1/NaN; leave-one-out rows at the horizons after their
step only). With ``trak`` (TRAK's retained subsets, removals.py) it gets ``trak.parquet`` (:data:`TRAK_COLUMNS`: per
seed × α_keep × subset × retraining × query × horizon, measured = L_q(retraining) − L_q(twin); every retraining is
set against the plain twin, so the mean over retrainings differs from TRAK's mean output by one constant per query and
horizon, which no rank over subsets sees) and ``trak_rows.parquet`` (:data:`TRAK_ROW_COLUMNS`: the rows each subset
*removed*, the rows of steps s .. end − 1 it does not keep: what an estimator's prediction sums, attribution/analyses/lds.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.attribution.bank.rundir import Bank, ForkFolder, open_bank
from seedlab.attribution.bank.texts import SELF, replicate
from seedlab.errors import SeedlabError
from seedlab.store import write_parquet

COLUMNS = ["seed", "candidate", "candidate_kind", "query", "query_kind", "horizon", "after", "label", "measured",
           "loss", "twin_loss", "measured_replicate"]
PAIR_COLUMNS = ["seed", "pair", "first", "second", "first_kind", "second_kind", "query", "query_kind", "horizon",
                "after", "label", "measured_pair", "measured_first", "measured_second", "sum", "interaction",
                "first_other_row", "second_other_row", "swapped"]


def collect(bank: Bank, *, warn: bool = True) -> pd.DataFrame:
    """The measured effects of every finished candidate run against its seed's twin."""
    cfg, rd = bank.cfg, bank.dir
    replicates = cfg.candidates.replicate_row is not None
    frames, missing = [], []
    for seed, twin in finished_twins(bank, missing, "candidates"):
        for name, text in bank.inputs.candidates_of(seed).items():
            where = rd.candidate(seed, name)
            if not where.finished:
                missing.append(f"seed {seed} {name}")
                continue
            own = beside_twin(where, twin, seed)
            again = rd.replicate_of(seed, name)
            if replicates and again.finished:
                r = beside_twin(again, twin, seed).assign(measured_replicate=lambda f: f.loss - f.twin_loss)
                own = own.merge(r[["step", "text", "measured_replicate"]], on=["step", "text"], how="left", validate="1:1")
            else:
                if replicates:
                    missing.append(f"seed {seed} {replicate(name)}")
                own["measured_replicate"] = np.nan
            frames.append(candidate_rows(bank, seed, name, text.kind, own).assign(measured_replicate=own.measured_replicate))
    if warn:
        warn_missing(missing, "measuring the rest")
    if not frames:
        raise SeedlabError(f"{bank.root}: no finished candidate run with its twin (run `seedlab attribution bank` to finish it)")
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def finished_twins(bank: Bank, missing: list[str], what: str) -> Iterator[tuple[int, pd.DataFrame]]:
    """Each seed whose twin finished, with the twin's (step, text, twin_loss); an unfinished twin is
    noted in ``missing`` (with its ``what``, which cannot be measured without it)."""
    for seed in bank.cfg.seeds:
        twin = bank.dir.twin(seed)
        if not twin.finished:
            missing.append(f"seed {seed} twin (and its {what})")
            continue
        yield seed, pd.read_parquet(twin.queries).rename(columns={"loss": "twin_loss"})


def table(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    """The frames one under another in ``columns``' order; an empty frame of those columns when there are none."""
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def warn_missing(missing: list[str], doing: str) -> None:
    """One warning per unfinished run (in order, once each), saying what is done without them."""
    for what in dict.fromkeys(missing):
        print(f"warning: missing {what} (not finished); {doing}", file=sys.stderr)


def beside_twin(where: ForkFolder, twin: pd.DataFrame, seed: int) -> pd.DataFrame:
    """A run's (step, text, loss) with the twin's loss of the same text at the same step (``twin_loss``)."""
    own = pd.read_parquet(where.queries).merge(twin, on=["step", "text"], how="left", validate="1:1")
    if own["twin_loss"].isna().any():
        raise SeedlabError(f"{where.path}: texts the twin of seed {seed} did not evaluate (a damaged bank)")
    return own


def candidate_rows(bank: Bank, seed: int, name: str, kind: str, own: pd.DataFrame) -> pd.DataFrame:
    """A candidate run's measured rows (``own``: its :func:`beside_twin` frame): its own text (query ``self``, with
    ``queries.own``) and every query, at every horizon, with Δ L_q = ``loss`` − ``twin_loss`` as ``measured``; the
    columns measured.parquet and weighted.parquet share (each adds its own)."""
    cfg, labels = bank.cfg, bank.cfg.horizon_steps()
    query_kind = {n: t.kind for n, t in bank.inputs.queries.items()}
    own = own[(own.text.eq(name) & cfg.queries.own) | own.text.isin(query_kind)]
    is_self = own.text.eq(name)
    return pd.DataFrame({
        "seed": seed, "candidate": name, "candidate_kind": kind,
        "query": own.text.where(~is_self, SELF), "query_kind": own.text.map(query_kind).where(~is_self, SELF),
        "horizon": own.step, "after": own.step - cfg.injection_step, "label": own.step.map(labels),
        "measured": own.loss - own.twin_loss, "loss": own.loss, "twin_loss": own.twin_loss})


def write_measured(root: str | Path) -> pd.DataFrame:
    """measured.parquet of a bank folder (see the module doc); returns it."""
    bank = open_bank(root)
    df = collect(bank)
    write_parquet(bank.dir.measured, df)
    return df


# ---------------------------------------------------------------- pairs


def collect_pairs(bank: Bank, *, warn: bool = True) -> pd.DataFrame:
    """additivity.parquet's frame (columns :data:`PAIR_COLUMNS`; what each means: attribution/analyses/additivity.py): one row per seed × pair ×
    shared query × horizon. A pair needs its own run, its first's candidate run and its second's
    replicate, finished; else it is left out with a warning. The control's runs (its first's
    replicate, its second's candidate run) unfinished: ``swapped`` NaN, with a warning."""
    cfg, rd = bank.cfg, bank.dir
    labels = cfg.horizon_steps()
    query_kind = {n: t.kind for n, t in bank.inputs.queries.items()}
    frames, missing = [], []
    for seed, twin in finished_twins(bank, missing, "pairs"):
        kinds = {n: t.kind for n, t in bank.inputs.candidates_of(seed).items()}
        for name, (first, second) in bank.inputs.pairs.items():
            runs = {"pair": (name, rd.run(seed, name)), "first": (first, rd.candidate(seed, first)),
                    "second": (replicate(second), rd.replicate_of(seed, second)),
                    "first_other": (replicate(first), rd.replicate_of(seed, first)),
                    "second_other": (second, rd.candidate(seed, second))}
            late = [arm for arm, where in runs.values() if not where.finished]
            missing.extend(f"seed {seed} {arm}" for arm in late)
            if any(runs[k][0] in late for k in ("pair", "first", "second")):
                continue
            eff = {k: _effect(where, twin, seed, query_kind) for k, (arm, where) in runs.items() if arm not in late}
            idx = eff["pair"].index
            v = {k: eff[k].reindex(idx).to_numpy() if k in eff else np.full(len(idx), np.nan) for k in runs}
            step, text = idx.get_level_values(0).to_numpy(), idx.get_level_values(1)
            frames.append(pd.DataFrame({
                "seed": seed, "pair": name, "first": first, "second": second, "first_kind": kinds[first],
                "second_kind": kinds[second], "query": text, "query_kind": text.map(query_kind), "horizon": step,
                "after": step - cfg.injection_step, "label": [labels[int(t)] for t in step],
                "measured_pair": v["pair"], "measured_first": v["first"], "measured_second": v["second"],
                "sum": v["first"] + v["second"], "interaction": v["pair"] - (v["first"] + v["second"]),
                "first_other_row": v["first_other"], "second_other_row": v["second_other"],
                "swapped": v["first_other"] + v["second_other"],
            }))
    if warn:
        warn_missing(missing, "additivity over the rest")
    return table(frames, PAIR_COLUMNS)


def write_additivity(root: str | Path) -> pd.DataFrame | None:
    """additivity.parquet of a bank folder with pairs (:func:`collect_pairs`); returns it (None: no pairs)."""
    bank = open_bank(root)
    if not bank.inputs.pairs:
        return None
    df = collect_pairs(bank)
    write_parquet(bank.dir.additivity, df)
    return df


def _effect(where: ForkFolder, twin: pd.DataFrame, seed: int, queries: dict[str, str]) -> pd.Series:
    """A finished run's Δ L_q = L_q(run) − L_q(twin) on the shared queries, indexed by (step, text)."""
    d = beside_twin(where, twin, seed)
    d = d[d.text.isin(queries)]
    return pd.Series((d.loss - d.twin_loss).to_numpy(), index=pd.MultiIndex.from_frame(d[["step", "text"]]))


# ---------------------------------------------------------------- row weights and distances

WEIGHTED_COLUMNS = ["seed", "candidate", "candidate_kind", "query", "query_kind", "horizon", "after", "label", "weight",
                    "measured"]
DISTANCE_COLUMNS = ["seed", "arm", "kind", "candidate", "weight", "step", "after", "distance"]
LOO_COLUMNS = ["seed", "step", "row", "query", "query_kind", "horizon", "label", "age", "measured", "loss", "twin_loss"]
GROUP_COLUMNS = ["seed", "alpha", "subset", "rows", "query", "query_kind", "horizon", "label", "removed_before",
                 "measured", "loss", "twin_loss"]
GROUP_ROW_COLUMNS = ["seed", "alpha", "subset", "step", "row"]
RETEST_COLUMNS = ["seed", "removal", "arm", "nudge", "step", "row", "alpha", "subset", "query", "query_kind", "horizon",
                  "label", "measured", "retest"]
TRAK_COLUMNS = ["seed", "keep", "subset", "retrain", "rows", "query", "query_kind", "horizon", "label", "removed_before",
                "measured", "loss", "twin_loss"]
TRAK_ROW_COLUMNS = ["seed", "keep", "subset", "step", "row"]


def collect_weighted(bank: Bank, *, warn: bool = True) -> pd.DataFrame:
    """weighted.parquet's frame (:data:`WEIGHTED_COLUMNS`): measured(seed, c, q, h, w) = L_q(c at loss weight w) −
    L_q(twin), for every weight of ``candidates.weights`` (w = 1: the candidate's own run, as in measured.parquet),
    on the candidate's own text (``self``) and every query. Unfinished runs are left out with a warning."""
    from seedlab.attribution.bank.texts import weighted

    cfg, rd = bank.cfg, bank.dir
    frames, missing = [], []
    for seed, twin in finished_twins(bank, missing, "weighted candidates"):
        for w in cfg.candidates.weights:
            for name, text in bank.inputs.candidates_of(seed).items():
                arm = name if w == 1.0 else weighted(w, name)
                where = rd.run(seed, arm)
                if not where.finished:
                    missing.append(f"seed {seed} {arm}")
                    continue
                frames.append(candidate_rows(bank, seed, name, text.kind, beside_twin(where, twin, seed)).assign(weight=float(w)))
    if warn:
        warn_missing(missing, "measuring the rest at their weights")
    return table(frames, WEIGHTED_COLUMNS)


def collect_distances(bank: Bank) -> pd.DataFrame:
    """distances.parquet's frame (:data:`DISTANCE_COLUMNS`): every finished run's ‖θ_run − θ_twin‖₂ per recorded
    step (forks/distances.py), with what the run is — its ``kind`` (attribution/bank/kinds.py); its
    ``candidate`` (None for pairs and nudges) and its loss ``weight`` (NaN for pairs and nudges)."""
    from seedlab.attribution.bank.arms import arms
    from seedlab.attribution.bank.kinds import kind_of
    from seedlab.attribution.bank.texts import candidate_of, weight_and_candidate

    frames = []
    for seed in bank.cfg.seeds:
        for arm in arms(bank.inputs, seed)[1:]:
            where = bank.dir.run(seed, arm.name)
            if not (where.finished and where.distances.is_file()):
                continue
            n = arm.name
            kind, one = kind_of(n).name, kind_of(n).candidate
            weight = float(weight_and_candidate(n)[0]) if kind == "weighted" else 1.0 if one else np.nan
            d = pd.read_parquet(where.distances)
            frames.append(d.assign(seed=seed, arm=n, kind=kind, candidate=candidate_of(n) if one else None,
                                   weight=weight, after=d.step - bank.cfg.injection_step))
    return table(frames, DISTANCE_COLUMNS)


def write_weighted(root: str | Path) -> pd.DataFrame | None:
    """weighted.parquet (candidates.weights beyond [1]) and distances.parquet of a bank folder; returns the first."""
    bank = open_bank(root)
    distances = collect_distances(bank)
    if len(distances):
        write_parquet(bank.dir.distances, distances)
    if len(bank.cfg.candidates.weights) < 2:
        return None
    df = collect_weighted(bank)
    write_parquet(bank.dir.weighted_measured, df)
    return df


# ---------------------------------------------------------------- removals: leave-one-out and groups


def _queries_beside_twin(bank: Bank, where: ForkFolder, twin: pd.DataFrame, seed: int) -> pd.DataFrame:
    """A removal run's (step, text, loss, twin_loss) on the bank's queries."""
    own = beside_twin(where, twin, seed)
    return own[own.text.isin(bank.inputs.queries)]


def collect_loo(bank: Bank, *, warn: bool = True) -> pd.DataFrame:
    """loo.parquet's frame (:data:`LOO_COLUMNS`): every finished leave-one-out run's Δ L_q against its seed's twin at
    every horizon after its step (at earlier horizons the run is the twin's, bit for bit). Unfinished runs are left
    out with a warning."""
    from seedlab.attribution.bank.removals import loo_name, loo_rows

    cfg, labels = bank.cfg, bank.cfg.horizon_steps()
    kinds = {n: t.kind for n, t in bank.inputs.queries.items()}
    frames, missing = [], []
    for seed, twin in finished_twins(bank, missing, "leave-one-out runs"):
        for t, i in loo_rows(cfg):
            where = bank.dir.run(seed, loo_name(t, i))
            if not where.finished:
                missing.append(f"seed {seed} {loo_name(t, i)}")
                continue
            d = _queries_beside_twin(bank, where, twin, seed)
            d = d[d.step > t]
            frames.append(pd.DataFrame({
                "seed": seed, "step": t, "row": i, "query": d.text, "query_kind": d.text.map(kinds),
                "horizon": d.step, "label": d.step.map(labels), "age": d.step - t, "measured": d.loss - d.twin_loss,
                "loss": d.loss, "twin_loss": d.twin_loss}))
    if warn:
        warn_missing(missing, "measuring the rest")
    return table(frames, LOO_COLUMNS)


def collect_groups(bank: Bank, *, warn: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """groups.parquet's and group_rows.parquet's frames (:data:`GROUP_COLUMNS`, :data:`GROUP_ROW_COLUMNS`): every
    finished group run's Δ L_q against its seed's twin at every horizon, and the rows of every subset of the design
    (finished or not). Unfinished runs are left out with a warning."""
    from seedlab.attribution.bank.removals import group_name, subsets

    cfg, labels = bank.cfg, bank.cfg.horizon_steps()
    kinds = {n: t.kind for n, t in bank.inputs.queries.items()}
    frames, rows, missing = [], [], []
    for seed in cfg.seeds:
        for (alpha, k), chosen in subsets(cfg, seed).items():
            rows.append(pd.DataFrame({"seed": seed, "alpha": float(alpha), "subset": k,
                                      "step": [t for t, _ in chosen], "row": [i for _, i in chosen]}))
    for seed, twin in finished_twins(bank, missing, "group runs"):
        for (alpha, k), chosen in subsets(cfg, seed).items():
            where = bank.dir.run(seed, group_name(alpha, k))
            if not where.finished:
                missing.append(f"seed {seed} {group_name(alpha, k)}")
                continue
            d = _queries_beside_twin(bank, where, twin, seed)
            steps = np.array([t for t, _ in chosen])
            frames.append(pd.DataFrame({
                "seed": seed, "alpha": float(alpha), "subset": k, "rows": len(chosen), "query": d.text,
                "query_kind": d.text.map(kinds), "horizon": d.step, "label": d.step.map(labels),
                "removed_before": [int((steps < h).sum()) for h in d.step], "measured": d.loss - d.twin_loss,
                "loss": d.loss, "twin_loss": d.twin_loss}))
    if warn:
        warn_missing(missing, "measuring the rest")
    effects = table(frames, GROUP_COLUMNS)
    members = table(rows, GROUP_ROW_COLUMNS)
    return effects, members


def collect_retest(bank: Bank, *, warn: bool = True) -> pd.DataFrame:
    """retest.parquet's frame (:data:`RETEST_COLUMNS`; module doc): every repeated removal whose run and retest finished,
    beside a finished twin and nudged twin of its seed; the rest left out with a warning."""
    from seedlab.attribution.bank.kinds import LOO
    from seedlab.attribution.bank.removals import ceiling_nudge, parse_group, parse_loo, retest_name, retested
    from seedlab.attribution.bank.texts import nudged

    cfg, labels = bank.cfg, bank.cfg.horizon_steps()
    tensor = ceiling_nudge(cfg)
    kinds = {n: t.kind for n, t in bank.inputs.queries.items()}
    frames, missing = [], []
    for seed, twin in finished_twins(bank, missing, "removals' retests"):
        where = bank.dir.run(seed, nudged(tensor))
        if not where.finished:
            missing.append(f"seed {seed} {nudged(tensor)} (the retests' nudged twin)")
            continue
        nudged_twin = pd.read_parquet(where.queries).rename(columns={"loss": "twin_loss"})
        for name, _, _ in retested(cfg, seed):
            runs = {"measured": (name, twin), "retest": (retest_name(name), nudged_twin)}
            late = [arm for arm, _ in runs.values() if not bank.dir.run(seed, arm).finished]
            if late:
                missing.extend(f"seed {seed} {arm}" for arm in late)
                continue
            d = {k: _queries_beside_twin(bank, bank.dir.run(seed, arm), ref, seed).set_index(["step", "text"])
                 for k, (arm, ref) in runs.items()}
            j = (d["measured"].loss - d["measured"].twin_loss).rename("measured").to_frame().join(
                (d["retest"].loss - d["retest"].twin_loss).rename("retest"), how="inner").reset_index()
            if name.startswith(LOO):
                (t, i), (alpha, k) = parse_loo(name), (np.nan, -1)
                j = j[j.step > t]
            else:
                (t, i), (alpha, k) = (-1, -1), parse_group(name)
            frames.append(pd.DataFrame({
                "seed": seed, "removal": "loo" if name.startswith(LOO) else "group", "arm": name, "nudge": tensor,
                "step": t, "row": i, "alpha": float(alpha), "subset": k, "query": j.text, "query_kind": j.text.map(kinds),
                "horizon": j.step, "label": j.step.map(labels), "measured": j.measured, "retest": j.retest}))
    if warn:
        warn_missing(missing, "measuring the rest")
    return table(frames, RETEST_COLUMNS)


def collect_trak(bank: Bank, *, warn: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """trak.parquet's and trak_rows.parquet's frames (:data:`TRAK_COLUMNS`, :data:`TRAK_ROW_COLUMNS`; module doc):
    every finished TRAK retraining's Δ L_q against its seed's twin at every horizon, and the rows every subset of the
    design removed (finished or not). Unfinished runs are left out with a warning."""
    from seedlab.attribution.bank.removals import trak_name, trak_removed

    cfg, labels = bank.cfg, bank.cfg.horizon_steps()
    kinds = {n: t.kind for n, t in bank.inputs.queries.items()}
    frames, rows, missing = [], [], []
    removed = {seed: trak_removed(cfg, seed) for seed in cfg.seeds}
    for seed in cfg.seeds:
        for (keep, k), chosen in removed[seed].items():
            rows.append(pd.DataFrame({"seed": seed, "keep": float(keep), "subset": k,
                                      "step": [t for t, _ in chosen], "row": [i for _, i in chosen]}))
    for seed, twin in finished_twins(bank, missing, "TRAK runs"):
        for (keep, k), chosen in removed[seed].items():
            steps = np.array([t for t, _ in chosen])
            for r in range(cfg.trak.retrains):
                where = bank.dir.run(seed, trak_name(keep, k, r))
                if not where.finished:
                    missing.append(f"seed {seed} {trak_name(keep, k, r)}")
                    continue
                d = _queries_beside_twin(bank, where, twin, seed)
                frames.append(pd.DataFrame({
                    "seed": seed, "keep": float(keep), "subset": k, "retrain": r, "rows": len(chosen), "query": d.text,
                    "query_kind": d.text.map(kinds), "horizon": d.step, "label": d.step.map(labels),
                    "removed_before": [int((steps < h).sum()) for h in d.step], "measured": d.loss - d.twin_loss,
                    "loss": d.loss, "twin_loss": d.twin_loss}))
    if warn:
        warn_missing(missing, "measuring the rest")
    effects = table(frames, TRAK_COLUMNS)
    members = table(rows, TRAK_ROW_COLUMNS)
    return effects, members


def write_removals(root: str | Path) -> dict[str, pd.DataFrame]:
    """loo.parquet (with ``loo``), groups.parquet and group_rows.parquet (with ``groups``), retest.parquet (with
    ``ceiling``), trak.parquet and trak_rows.parquet (with ``trak``) of a bank folder; returns the frames written by
    name ({} for a bank without removals)."""
    bank = open_bank(root)
    out: dict[str, pd.DataFrame] = {}
    if bank.cfg.loo is not None:
        out["loo"] = collect_loo(bank)
        write_parquet(bank.dir.loo, out["loo"])
    if bank.cfg.groups is not None:
        out["groups"], out["group_rows"] = collect_groups(bank)
        write_parquet(bank.dir.groups, out["groups"])
        write_parquet(bank.dir.group_rows, out["group_rows"])
    if bank.cfg.ceiling is not None:
        out["retest"] = collect_retest(bank)
        write_parquet(bank.dir.retest, out["retest"])
    if bank.cfg.trak is not None:
        out["trak"], out["trak_rows"] = collect_trak(bank)
        write_parquet(bank.dir.trak, out["trak"])
        write_parquet(bank.dir.trak_rows, out["trak_rows"])
    return out
