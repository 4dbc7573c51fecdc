"""The leaderboard across banks and exports: every estimator × every bank × every metric the analyses compute, each
with the interval its analyses module computes, the ceiling where the bank measured one, and each estimator's cost.
Compute only; attribution/report/leaderboard.py renders it (a markdown table, a CSV, a figure).

**Sources** (:func:`read_source`). A bank folder (``seedlab attribution bank``), an export (``seedlab attribution
export``: every file checked against its manifest first — the caller passes benchmark.py's ``verify``) or a score
folder (``seedlab attribution score``: an attributed bank's top; the records a score folder does not copy —
inputs.json, training.json, rowscores.json, metagrad.json — are read from the folder it scored, where that is still
there). Tables only: no corpus, no torch. A path that is none of them, or a source with nothing scored, is a
one-line error.

**Comparable designs** (:func:`check_comparable`). A row compares one estimator across banks, so the sources must
share what defines the rows: the model and its block size, the corpus (its splits' hashes), the candidates and the
queries (their token ids; where inputs.json is missing, their config). Rows per batch B, the rates, the schedule
(steps, s, horizons), the seeds and which removals were run may differ: B, lr and steps label the bank's column
(:func:`labels`, with any other of these that differs between the sources). Otherwise one line naming the sources
and the fields that differ.

**Metrics** (:data:`METRICS`; per source × estimator × query kind × where):

- :data:`SINGLE` per horizon: stats.py ``correlations``' within-seed ρ — per seed, query and horizon the Spearman over
  candidates, the mean over the kind's queries, then over seeds — with its percentile interval over bootstrap
  resamples of the candidates (the bank report's headline; the kind baseline included). Its ceiling: the row
  invariance ρ_rep (``retest``: the same candidate's effect from another row of the batch, the bank's replicate
  rows) and √ρ_rep (``value``; its interval the √ of ρ_rep's ends, as horizon.py's ``ceiling``);
- :data:`LOO` per age band at the end of the run: loo.py's ρ within queries — per seed and query the Spearman over
  the removed rows, the mean over queries, then over seeds; joint bootstrap over seeds, then rows — the field's
  leave-one-out (remove one training row, train to the end, read every query), of the rows whose age at the end
  (end − t) lies in the band: loo.py ``pooled`` over those steps (a band of one step: its ``by_age`` cell);
- :data:`LDS` per α at the end: lds.py's LDS (MAGIC's single-model LDS: random α-subsets of the rows after s removed
  from one deterministic run; per seed and query the Spearman over subsets, the mean over queries, then over
  seeds; joint bootstrap over seeds, then subsets);
- :data:`TRAK_LDS` per α_keep at the end: lds.py's TRAK LDS (subsets that keep α_keep of the rows after s, each
  retrained from the prefix and its effects averaged over the retrainings; the same Spearman and resamples), where
  the bank has trak.parquet (lds.py ``both`` computes both kinds);
- the ceilings of LOO and of both LDS kinds (a row with ``estimator`` :data:`CEILING`): ``value`` the √ of a
  test–retest ρ with its interval's ends through √, the ρ itself in ``retest`` — LOO: the removals measured again on
  the nudged twin (retest.parquet) scored as an estimator in the same cells and resamples (loo.py ``retest_pairs``);
  the single-model LDS: the LDS of the subsets' retest on the nudged twin (lds.py ``single_ceiling``); TRAK's LDS:
  the Spearman–Brown reliability of the mean of its retrainings (lds.py ``trak_ceiling``); ``note`` =
  :data:`NOT_MEASURED` where the bank has no such retest (and for single rows without replicate rows);
- :data:`COST_SWAPS`, :data:`COST_ROWS`: each estimator's wall seconds per seed as its command recorded them
  (attribution.json: the estimators of single-row swaps, the first estimator at θ_s paying for the gradients they
  share; rowscores.json and metagrad.json: the estimators of training rows, one computed in another's pass costing
  that pass), ``per_run``: those seconds over one training run's (training.json ``seconds_per_run``: the bank's
  own training rate; NaN where it is not recorded), and of the training rows ``detail``: the rows × queries ×
  horizons the seconds bought (:func:`row_cover`; metagrad's one pass serves every query, the others pay per
  horizon), since those differ between estimators and a cost is only comparable over the same work.

**Standings** (:func:`standings`): per source × metric × query kind × where, the estimator with the highest point
value (references and the ceiling aside), whether its interval lies above every other estimator's (``separated``)
and which estimators' intervals overlap its own (``tied``). Nothing here tests a difference: separated intervals are
a conservative reading of the intervals already computed, and overlapping ones say no more than "not shown apart".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.attribution.analyses import lds, loo, stats
from seedlab.attribution.bank.rundir import BankDir, ExportDir, ScoreDir
from seedlab.errors import SeedlabError

SINGLE, LOO, LDS, TRAK_LDS = "single-row ρ", "LOO ρ", "LDS (single model)", "LDS (TRAK-style)"
METRICS = (SINGLE, LOO, LDS, TRAK_LDS)
COST_SWAPS, COST_ROWS = "seconds per seed: swaps", "seconds per seed: rows"
COSTS = (COST_SWAPS, COST_ROWS)
CEILING = "ceiling"  # the estimator column of a ceiling row
NOT_MEASURED = "not measured"
ROLES = ("ceiling", "estimator", "variant", "plug-in", "reference", "baseline")
#: the upper ends of the age bands (updates between the removed row's visit and the end); the last band is open
BANDS = (1, 10, 50, 100)
#: what defines a row: the sources must agree on these (:func:`check_comparable`)
REQUIRED = ("model", "block_size", "corpus", "candidates", "queries")
#: what may differ; B, lr and steps always label a column, the others where they differ between sources
LABELLED = (("batch_size", "B {}"), ("peak_lr", "lr {:g}"), ("end", "{} steps"))
EXTRA = (("injection_step", "s {}"), ("optimizer", "{}"), ("injection_row", "row {}"), ("precision", "{}"),
         ("seeds", "seeds {}"))
COLUMNS = ["column", "source", "kind", "estimator", "role", "metric", "query_kind", "setting", "order", "value", "low",
           "high", "retest", "retest_low", "retest_high", "note", "detail", "seeds", "n", "seconds", "per_run"]
STANDINGS = ["column", "metric", "query_kind", "setting", "order", "leader", "value", "low", "high", "separated", "tied",
             "competitors"]


# ---------------------------------------------------------------- the sources


@dataclass
class Source:
    """One bank, export or score folder as the leaderboard reads it (:func:`read_source`)."""

    path: Path
    kind: str  # "bank", "export" or "score"
    config: dict  # config.json
    inputs: dict | None  # inputs.json (the corpus's hashes, the texts' token ids); None where there is none
    df: pd.DataFrame | None  # attribution.parquet: the single-row swaps' estimates beside the measured effects
    meta: dict  # attribution.json ({} when absent)
    loo: pd.DataFrame | None  # loo.parquet
    groups: pd.DataFrame | None  # groups.parquet
    group_rows: pd.DataFrame | None  # group_rows.parquet
    scores: pd.DataFrame | None  # the training rows' scores (rowscores.py ``read_scores``: rowscores and metagrad)
    row_seconds: dict  # {seed: {estimator: seconds}}: rowscores.json's, metagrad.json's as "metagrad"
    training: dict | None  # training.json (the bank's own training clock); None where not recorded
    extra: dict = field(default_factory=dict)  # the tables later stages add (retest, trak, trak_rows), where present

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def end(self) -> int:
        """The last update trained: the "end" horizon."""
        return int(self.config.get("stop") or self.config["steps"])

    def design(self, key: str):
        return self.end if key == "end" else self.config.get(key)


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _parquet(path: Path) -> pd.DataFrame | None:
    return pd.read_parquet(path) if path.is_file() else None


def read_source(path: str | Path, verify: Callable[[Path], dict] | None = None) -> Source:
    """A bank, an export (``verify``: checked against its manifest first) or a score folder, as tables (module doc);
    anything else, or a folder with nothing scored, is a one-line error."""
    from seedlab.attribution.estimators.rowscores import read_scores

    root = Path(path)
    if not root.is_dir():
        raise SeedlabError(f"{root}: no such folder (give banks, exports or score folders: seedlab attribution bank, "
                           "export, score)")
    if ExportDir(root).manifest.is_file():
        if verify is not None:
            verify(root)
        kind = "export"
    elif BankDir(root).config.is_file():
        kind = "bank"
    else:
        raise SeedlabError(f"{root}: neither a bank nor an export (no config.json, no manifest.json; give a folder of "
                           "seedlab attribution bank, export or score)")
    rd = BankDir(root)
    meta = _json(rd.attribution_json) or {}
    if kind == "bank" and ("source" in meta or ScoreDir(root).correlations.is_file()):
        kind = "score"
    # a score folder copies config, integrity and the tables; the other records are its source's
    elsewhere = Path(meta.get("source", {}).get("path", "")) if kind == "score" else None
    homes = [rd] + ([BankDir(elsewhere)] if elsewhere is not None and elsewhere.is_dir() else [])

    def record(name: str) -> dict | None:
        return next((r for r in (_json(getattr(h, name)) for h in homes) if r is not None), None)

    row_seconds: dict = {str(k): dict(v) for k, v in (record("rowscores_json") or {}).get("seconds", {}).items()}
    for seed, r in (record("metagrad_json") or {}).get("seeds", {}).items():
        row_seconds.setdefault(str(seed), {})["metagrad"] = r["seconds"]
    extra = {name: frame for name in ("retest", "trak", "trak_rows") for frame in [_parquet(getattr(rd, name))]
             if frame is not None}
    src = Source(root, kind, rd.read_config(), record("inputs"), _parquet(rd.attribution), meta, _parquet(rd.loo),
                 _parquet(rd.groups), _parquet(rd.group_rows), read_scores(root), row_seconds, record("training"),
                 extra)
    if src.df is None and src.scores is None:
        raise SeedlabError(f"{root}: nothing scored yet (no attribution.parquet, rowscores.parquet or metagrad.parquet): "
                           f"run seedlab attribution attribute {root} (or rowscores, metagrad) first")
    return src


def _texts(src: Source, which: str):
    """The candidates' or queries' identity: their names and token ids (inputs.json), else their config."""
    if src.inputs is not None and which in src.inputs:
        return [(t["name"], tuple(t["tokens"])) for t in src.inputs[which]]
    cfg = dict(src.config.get(which) or {})
    keep = ("file", "heldout", "seed") if which == "candidates" else ("own", "heldout", "probes")
    return {k: cfg.get(k) for k in keep}


def _identity(src: Source, key: str):
    if key == "corpus":
        if src.inputs is not None and "corpus_sha256" in src.inputs:
            return src.inputs["corpus_sha256"], src.inputs.get("eot_id")
        return src.config.get("corpus")
    if key in ("candidates", "queries"):
        return _texts(src, key)
    return src.config.get(key)


def check_comparable(sources: Sequence[Source]) -> None:
    """Every source against the first on :data:`REQUIRED` (module doc); a one-line error naming the first pair that
    differs and every field in which it does."""
    first = sources[0]
    for other in sources[1:]:
        bad = [k for k in REQUIRED if _identity(first, k) != _identity(other, k)]
        if bad:
            raise SeedlabError(
                f"leaderboard: {first.path} and {other.path} are not comparable: they differ in {', '.join(bad)} (a row "
                "compares one estimator across banks, so the model, block size, corpus, candidates and queries must be "
                "the same; B, lr and steps may differ: they label the columns)")


def _fmt(template: str, v) -> str:
    if isinstance(v, list):
        v = f"{v[0]}–{v[-1]}" if v and v == list(range(v[0], v[-1] + 1)) else ", ".join(map(str, v))
    return template.format(v)


def labels(sources: Sequence[Source]) -> list[str]:
    """Each source's column label: its B, lr and steps, any other design field that differs between the sources
    (:data:`EXTRA`), and, where two labels would still be equal, the folder's name."""
    differ = [(k, t) for k, t in EXTRA if len({json.dumps(s.design(k), sort_keys=True) for s in sources}) > 1]
    out = [", ".join(_fmt(t, s.design(k)) for k, t in (*LABELLED, *differ)) for s in sources]
    return [f"{label} · {s.name}" if out.count(label) > 1 else label for label, s in zip(out, sources)]


# ---------------------------------------------------------------- the metrics


def _row(column: str, src: Source, **kw) -> dict:
    return {"column": column, "source": str(src.path), "kind": src.kind, **kw}


def _role(name: str, label: str | None = None, *, rows: bool = False) -> str:
    """What an estimator is in the table: a baseline, a reference (of the single-row swaps: the row invariance and
    the exact responses, never a leader; of the training rows nothing is: metagrad is MAGIC's attributor there), or
    its registry label (estimator, variant, plug-in)."""
    if stats.is_baseline(name):
        return "baseline"
    if not rows and stats.is_reference(name):
        return "reference"
    return label if label in ROLES else "estimator"


def _root(v: float) -> float:
    """√max(v, 0) (a monotone map: the √ of an interval's ends is the interval of the √; horizon.py's ceiling)."""
    return math.sqrt(max(v, 0.0)) if not math.isnan(v) else math.nan


def single_rows(src: Source, column: str, *, resamples: int, seed: int, alpha: float) -> list[dict]:
    """:data:`SINGLE` and its ceiling (module doc), from the source's attribution.parquet."""
    if src.df is None or not len(src.df):
        return []
    corr, _ = stats.correlations(stats.Arrays.of(stats.with_kind_baseline(src.df)), resamples, seed, alpha)
    corr = corr[corr.track == "within"]
    label = src.df.drop_duplicates("estimator").set_index("estimator").estimator_label.to_dict() \
        if "estimator_label" in src.df else {}
    out = []
    for r in corr.itertuples():
        at = {"metric": SINGLE, "query_kind": r.query_kind, "setting": r.label, "order": float(r.after),
              "detail": f"horizon {r.label} ({r.horizon} updates)", "seeds": int(r.seeds), "n": int(r.candidates)}
        if r.estimator == stats.ROW_INVARIANCE:
            out.append(_row(column, src, estimator=CEILING, role="ceiling", value=r.bound, low=_root(r.low),
                            high=_root(r.high), retest=r.rho, retest_low=r.low, retest_high=r.high, **at))
        else:
            out.append(_row(column, src, estimator=r.estimator, role=_role(r.estimator, label.get(r.estimator)),
                            value=r.rho, low=r.low, high=r.high, **at))
    if stats.ROW_INVARIANCE not in set(corr.estimator):  # no replicate rows: the ceiling not measured
        for (kind, h, after), _g in corr.groupby(["query_kind", "label", "after"], sort=False):
            out.append(_row(column, src, estimator=CEILING, role="ceiling", metric=SINGLE, query_kind=kind, setting=h,
                            order=float(after), note=NOT_MEASURED))
    return out


def band_of(age: float, bands: Sequence[int] = BANDS) -> tuple[int, str]:
    """An age's band: (its index, its label: "1", "2–10", ..., "> 100")."""
    lo = 1
    for i, hi in enumerate(bands):
        if age <= hi:
            return i, (str(hi) if lo == hi else f"{lo}–{hi}")
        lo = hi + 1
    return len(bands), f"> {bands[-1]}"


def _ceiling_row(column: str, src: Source, metric: str, kind: str, setting: str, order: float, retest: float,
                 low: float, high: float, detail: str) -> dict:
    """A ceiling cell: √ of a test–retest ρ (its interval's ends through √, an end ≤ 0 to 0), the ρ beside it;
    :data:`NOT_MEASURED` where there is none."""
    if math.isnan(retest):
        return _row(column, src, estimator=CEILING, role="ceiling", metric=metric, query_kind=kind, setting=setting,
                    order=order, note=NOT_MEASURED)
    return _row(column, src, estimator=CEILING, role="ceiling", metric=metric, query_kind=kind, setting=setting,
                order=order, value=_root(retest), low=_root(low), high=_root(high), retest=retest, retest_low=low,
                retest_high=high, detail=detail)


def loo_rows(src: Source, column: str, *, bands: Sequence[int], resamples: int, seed: int,
             alpha: float) -> list[dict]:
    """:data:`LOO` per age band at the end (module doc), from loo.parquet and the row scores; the ceiling from
    retest.parquet's leave-one-out rows (loo.py ``retest_pairs``: the removal measured again on the nudged twin,
    scored as an estimator in the same cells and resamples), else :data:`NOT_MEASURED`."""
    if src.loo is None or src.scores is None or not len(src.loo):
        return []
    j = loo.joined(src.loo, src.scores)
    j = j[j.horizon == j.horizon.max()]
    if not len(j):
        return []
    end = int(j.horizon.iloc[0])
    retest = src.extra.get("retest")
    r = loo.retest_pairs(retest) if retest is not None and len(retest) else pd.DataFrame(columns=["step", "horizon"])
    r = r[r.horizon == end]
    steps: dict[tuple[int, str], list[int]] = {}
    for t in sorted(j.step.unique()):
        steps.setdefault(band_of(end - t, bands), []).append(int(t))
    out = []
    kw = {"resamples": resamples, "seed": seed, "alpha": alpha}
    for (i, band), ts in sorted(steps.items()):
        cells = loo.pooled(j[j.step.isin(ts)], **kw)
        ages = ", ".join(f"{end - t} (t = {t})" for t in ts)
        for c in cells.itertuples():
            out.append(_row(column, src, estimator=c.estimator, role=_role(c.estimator, rows=True), metric=LOO,
                            query_kind=c.query_kind, setting=f"age {band}", order=float(i), value=c.rho_within,
                            low=c.rho_within_low, high=c.rho_within_high, detail=f"ages {ages} at {c.label}",
                            seeds=int(c.seeds), n=int(c.rows)))
        rb = r[r.step.isin(ts)]
        ceil = (loo.pooled(rb, **kw).set_index("query_kind") if len(rb) and set(rb.step) == set(ts)
                else pd.DataFrame())
        for kind in dict.fromkeys(cells.query_kind):
            c = ceil.loc[kind] if kind in ceil.index else None
            out.append(_ceiling_row(column, src, LOO, kind, f"age {band}", float(i),
                                    math.nan if c is None else float(c.rho_within),
                                    math.nan if c is None else float(c.rho_within_low),
                                    math.nan if c is None else float(c.rho_within_high),
                                    "" if c is None else f"retest on the nudged twin, {int(c.rows)} rows"))
    return out


def _alpha(a: float) -> str:
    return f"α {100 * a:g} %"


def lds_rows(src: Source, column: str, *, resamples: int, seed: int, alpha: float) -> list[dict]:
    """:data:`LDS` per α and :data:`TRAK_LDS` per α_keep at the end (module doc): lds.py ``both`` of groups.parquet,
    trak.parquet and their rows against the row scores, each beside its ceiling (the single-model LDS: the subsets
    removed again from the nudged twin, retest.parquet; TRAK's: its retrainings' test–retest stepped up to their
    mean), else :data:`NOT_MEASURED`."""
    if src.scores is None:
        return []
    x = src.extra
    table = lds.both(src.groups, src.group_rows, x.get("trak"), x.get("trak_rows"), src.scores, x.get("retest"),
                     resamples=resamples, seed=seed, alpha=alpha)
    out = []
    for kind_of_lds, t in table.groupby("lds_kind", sort=False):
        t = t[t.horizon == t.horizon.max()]
        trak = kind_of_lds == lds.TRAK
        metric = TRAK_LDS if trak else LDS
        setting = (lambda r: f"keep {100 * r.keep:g} %") if trak else (lambda r: _alpha(r.alpha))
        for r in t.itertuples():
            kept = f", the mean of {r.retrains} retrainings" if trak else ""
            out.append(_row(column, src, estimator=r.estimator, role=_role(r.estimator, rows=True), metric=metric,
                            query_kind=r.query_kind, setting=setting(r), order=float(r.keep if trak else r.alpha),
                            value=r.lds, low=r.low, high=r.high,
                            detail=f"{r.subsets} subsets at {r.label}{kept}; coverage {r.coverage:.2f}",
                            seeds=int(r.seeds), n=int(r.subsets)))
        for _, g in t.groupby(["query_kind", "alpha"], sort=False):
            r = next(g.itertuples())
            what = (f"two retrainings' test–retest {_num(r.retest)}, stepped up to the mean of {r.retrains}"
                    if trak else f"retest on the nudged twin, {_num(r.retest_subsets)} subsets")
            out.append(_ceiling_row(column, src, metric, r.query_kind, setting(r), float(r.keep if trak else r.alpha),
                                    float(r.reliability), float(r.reliability_low), float(r.reliability_high), what))
    return out


def _num(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def row_cover(scores: pd.DataFrame | None) -> dict[str, str]:
    """Per training-rows estimator, what one seed's recorded seconds bought: the rows × queries × horizons it scored
    (counted in its scores, the first seed's), so that costs over different work are not read as like for like —
    metagrad's one reverse pass serves every query at once (one query alone: docs/benchmarks.md), a row estimator
    scored at every horizon pays for each."""
    if scores is None or not len(scores):
        return {}
    one = scores[scores.seed == scores.seed.iloc[0]]
    out = {}
    for e, g in one.groupby("estimator", sort=False):
        rows, q, h = len(g[["step", "row"]].drop_duplicates()), g["query"].nunique(), g["horizon"].nunique()
        queries = f"{q} quer{'ies' if q != 1 else 'y'}"
        text = f"{rows:,} rows × {queries} × {h} horizon{'s' * (h != 1)}"
        if h > 1 and g.groupby(["step", "row", "query"]).value.nunique().max() == 1:
            text = f"{rows:,} rows × {queries}, one value repeated at its {h} horizons"  # tracin's one visit
        out[str(e)] = text + (", every query in one reverse pass" if e == "metagrad" else "")
    return out


def cost_rows(src: Source, column: str) -> list[dict]:
    """:data:`COST_SWAPS` and :data:`COST_ROWS` per estimator (module doc). A row estimator computed in another's
    pass (registry.py ``RowEstimator.shares``: grad-cosine in grad-dot's) costs that pass, recorded where the pass
    ran; ``detail`` says what the seconds cover (:func:`row_cover`)."""
    from seedlab.attribution.estimators.registry import ROW_ESTIMATORS

    run = float((src.training or {}).get("seconds_per_run", math.nan))
    swaps = {e: per for e, per in src.meta.get("seconds", {}).items() if per}
    rows: dict[str, dict[str, float]] = {}
    shared: dict[str, str] = {}
    for seed, times in src.row_seconds.items():
        for e, t in times.items():
            pass_of = getattr(ROW_ESTIMATORS.get(e), "shares", None)
            if pass_of in times:
                t, shared[e] = times[pass_of], pass_of
            rows.setdefault(e, {})[seed] = t
    cover = row_cover(src.scores)
    out = []
    for metric, timed in ((COST_SWAPS, swaps), (COST_ROWS, rows)):
        for e, per in stats.seconds_per_seed(timed).items():
            detail = ""
            if metric == COST_ROWS:
                detail = "; ".join(filter(None, [cover.get(e, ""),
                                                 f"one pass with {shared[e]}, its seconds" if e in shared else ""]))
            out.append(_row(column, src, estimator=e, role=_role(e, rows=metric == COST_ROWS), metric=metric,
                            query_kind="", setting="", order=0.0, seconds=per,
                            per_run=per / run if run > 0 else math.nan, seeds=len(timed[e]), detail=detail))
    return out


# ---------------------------------------------------------------- the board


@dataclass
class Board:
    """What :func:`board` computed (module doc)."""

    sources: list[Source]
    columns: list[str]  # each source's column label, in the sources' order
    designs: pd.DataFrame  # per source: column, source, kind, B, lr, steps, s, seeds, candidates, queries, training
    table: pd.DataFrame  # :data:`COLUMNS`
    standings: pd.DataFrame  # :data:`STANDINGS`
    main: dict[str, str | None]  # the query kind the headline reads: {"single": ..., "rows": ...}
    alpha: float
    bands: tuple[int, ...]


def designs(sources: Sequence[Source], columns: Sequence[str]) -> pd.DataFrame:
    """Per source what its column is: the folder, its kind, B, lr, steps, s, seeds, candidates and queries counted,
    its training clock (seconds per run; NaN: not recorded) and what it scored."""
    out = []
    for s, c in zip(sources, columns):
        ins = s.inputs or {}
        out.append({"column": c, "source": str(s.path), "kind": s.kind, "B": s.config.get("batch_size"),
                    "lr": s.config.get("peak_lr"), "steps": s.end, "s": s.config.get("injection_step"),
                    "seeds": ", ".join(map(str, s.config.get("seeds", []))),
                    "candidates": len(ins.get("candidates", [])) or math.nan,
                    "queries": len(ins.get("queries", [])) or math.nan,
                    "run_seconds": float((s.training or {}).get("seconds_per_run", math.nan)),
                    "swaps": s.df is not None, "loo": s.loo is not None, "groups": s.groups is not None,
                    "trak": "trak" in s.extra, "retest": "retest" in s.extra})
    return pd.DataFrame(out)


def _main(table: pd.DataFrame, metrics: Sequence[str], prefer: str) -> str | None:
    kinds = list(dict.fromkeys(table[table.metric.isin(metrics)].query_kind))
    return prefer if prefer in kinds else (kinds[0] if kinds else None)


def standings(table: pd.DataFrame) -> pd.DataFrame:
    """Per column × metric × query kind × where (module doc): the leader by point value, ``separated`` (its
    interval's lower end above every other's upper end), ``tied`` (the others whose intervals reach its lower
    end, by value), ``competitors`` (how many had a value)."""
    rows = []
    t = table[table.metric.isin(METRICS) & ~table.role.isin(("ceiling", "reference")) & table.value.notna()]
    for (c, m, k, at, order), g in t.groupby(["column", "metric", "query_kind", "setting", "order"], sort=False):
        g = g.sort_values("value", ascending=False, kind="stable")
        top, rest = g.iloc[0], g.iloc[1:]
        rows.append({"column": c, "metric": m, "query_kind": k, "setting": at, "order": order, "leader": top.estimator,
                     "value": top.value, "low": top.low, "high": top.high,
                     "separated": bool(len(rest)) and bool((rest.high < top.low).all()),
                     "tied": list(rest[rest.high >= top.low].estimator), "competitors": len(g)})
    return pd.DataFrame(rows, columns=STANDINGS)


def board(paths: Sequence[str | Path], *, verify: Callable[[Path], dict] | None = None, bands: Sequence[int] = BANDS,
          resamples: int = stats.RESAMPLES, seed: int = stats.SEED, alpha: float = stats.ALPHA) -> Board:
    """The leaderboard of ``paths`` (banks, exports, score folders: module doc): every source read and checked,
    and compared, before any number is computed."""
    if not paths:
        raise SeedlabError("leaderboard: name at least one bank or export")
    if not bands or list(bands) != sorted(set(bands)) or bands[0] < 1:
        raise SeedlabError(f"age bands: increasing upper ends of at least 1, got {list(bands)}")
    sources = [read_source(p, verify) for p in paths]
    check_comparable(sources)
    columns = labels(sources)
    rows: list[dict] = []
    kw = {"resamples": resamples, "seed": seed, "alpha": alpha}
    for s, c in zip(sources, columns):
        rows += single_rows(s, c, **kw) + loo_rows(s, c, bands=bands, **kw) + lds_rows(s, c, **kw) + cost_rows(s, c)
    table = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("value", "low", "high", "retest", "retest_low", "retest_high", "seconds", "per_run", "order"):
        table[col] = pd.to_numeric(table[col]).astype(np.float64)
    for col in ("note", "detail"):
        table[col] = table[col].fillna("")
    return Board(sources, columns, designs(sources, columns), table, standings(table),
                 {"single": _main(table, [SINGLE], "heldout"), "rows": _main(table, [LOO, LDS, TRAK_LDS], loo.ALL)},
                 alpha, tuple(bands))
