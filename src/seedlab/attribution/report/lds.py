"""The report's sections on the run's own rows: leave-one-out by age (beside the nudges' floor) and the
LDS beside the single rows. Render only: loo.py (:func:`~seedlab.attribution.analyses.loo.analyse`,
:func:`~seedlab.attribution.analyses.loo.oldest`, :func:`~seedlab.attribution.analyses.loo.nudge_floor`) and
lds.py (:func:`~seedlab.attribution.analyses.lds.analyse`, :func:`~seedlab.attribution.analyses.lds.contrast`) compute every number;
:func:`removals_section` words them. Everything here is exploratory unless a pre-registration names it (nothing in a
bank records one, so the report passes none).
"""

from __future__ import annotations

import math

import pandas as pd

from seedlab.reporting import fmt_ci, fmt_num, md_table

TITLE = "## The run's own rows: leave-one-out by age, and groups (LDS)"
LOO_HELP = (
    "Row i of the batch of step t removed from the twin's own run (its loss weight set to 0, no text in its place: "
    "the batch loss Σ_{j≠i} ℓ_j / N with N = B·T unchanged), the run trained on to every horizon h > t; measured "
    "Δ L_q = L_q(without the row) − L_q(twin) on every query. Its **age** at h is h − t. Each estimator predicts the "
    "same Δ: **metagrad** −∂L_q(θ_h)/∂w_{t,i} (the exact first order through the replayed run; a removal is Δw = −1), "
    "the others as attribution/estimators/rowscores.py defines them. Cells: per seed the Spearman over every (row, query) of the "
    "cell, the mean over seeds [95% bootstrap interval: seeds, then rows within each drawn seed]. Exploratory.")
CAL_HELP = (
    "Calibration of the estimators in nats/token: the OLS slope of measured on predicted over every (seed, row, "
    "query) and the median ratio measured / predicted, with the same resamples' intervals (1: the prediction has "
    "the effect's scale).")
LDS_HELP = (
    "Random subsets of α of the R rows of steps s .. end − 1 removed at once (one run each), measured at the end. An "
    "estimator's prediction for a subset is the sum of its rows' values (the additive datamodel). **LDS**: per seed "
    "and query the Spearman over subsets of predicted against measured, the mean over queries, then over seeds "
    "[95% bootstrap interval: seeds, then subsets within each drawn seed] ±jackknife SE over seeds. Beside it the "
    "same estimator's **single-row ρ**: every leave-one-out row at the end pooled (Spearman over (step, row, query) "
    "per seed, the mean over seeds). *Predicts*: the interval lies above 0. Exploratory.")
#: the published fine-tuning LDS (not our measurement), with its primary source and setting
PUBLISHED = ("For comparison, from bergson's examples/compare_wikitext/README.md (GPT-2 fine-tuned on WikiText for 4 "
             "epochs; the LDS over 100 subsets that each drop 1 % of the training chunks, retrained at one seed, so a "
             "single-model LDS too; a different setting — fine-tuning, not pre-training, another model and subset "
             "count — and not measured here): MAGIC 0.93, EK-FAC 0.45, TRAK (projection 32) 0.22, gradient cosine 0.02.")


def _ci(r, k: str = "rho") -> str:
    return fmt_ci(r[k], r[f"{k}_low"], r[f"{k}_high"])


def _num(r, k: str) -> str:
    v = r[k]
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{fmt_num(v)} [{fmt_num(r[f'{k}_low'])}, {fmt_num(r[f'{k}_high'])}]"


def _kind(table: pd.DataFrame) -> str | None:
    kinds = list(dict.fromkeys(table.query_kind)) if len(table) else []
    return "all" if "all" in kinds else (kinds[0] if kinds else None)


WITHIN_HELP = (
    "The same cells ranked **within each query** (loo.py ``rho_within``): per seed and query the Spearman over the "
    "cell's rows, the mean over queries, then over seeds [the same resamples' interval]. The pooled ρ above also "
    "rewards knowing only how much a query moves under any removal; this one only knowing which rows matter.")


RETEST_NAME = "ceiling: retest (nudged twin)"


def loo_table(table: pd.DataFrame, column: str = "rho", ceiling: pd.DataFrame | None = None) -> str:
    """``column`` (``rho`` or ``rho_within``) by (t, h): rows the ages, columns the estimators; with ``ceiling``
    (loo.py ``ceiling``'s per-cell table) its retest of the same cell in a last column."""
    kind = _kind(table)
    g = table[table.query_kind == kind]
    cells = g.drop_duplicates(["step", "horizon"]).sort_values(["age", "step"])
    names = list(dict.fromkeys(g.estimator))
    c_of = None
    if ceiling is not None and len(ceiling):
        c_of = ceiling[ceiling.query_kind == kind].set_index(["step", "horizon"])
    rows = []
    for c in cells.itertuples():
        here = g[(g.step == c.step) & (g.horizon == c.horizon)].set_index("estimator")
        row = [str(c.age), str(c.step), f"{c.label} ({c.horizon})", fmt_num(c.mean_abs),
               *(_ci(here.loc[e], column) if e in here.index else "" for e in names)]
        if c_of is not None:
            key = (int(c.step), int(c.horizon))
            row.append(_ci(c_of.loc[key], column.replace("rho", "retest")) if key in c_of.index else "")
        rows.append(row)
    n = g.iloc[0]
    return (f"{kind} queries; {n.seeds} seed(s), {n.rows} row(s) a step, {n.queries} quer"
            f"{'y' if n.queries == 1 else 'ies'}.\n\n"
            + md_table(["age h − t", "step t", "horizon h", "mean abs Δ L", *names,
                        *([RETEST_NAME] if c_of is not None else [])], rows))


def calibration_table(table: pd.DataFrame) -> str:
    kind = _kind(table)
    g = table[(table.query_kind == kind) & (table.unit == "nats/token")].sort_values(["estimator", "age", "step"])
    if not len(g):
        return "No estimator in nats/token."
    rows = [[r.estimator, str(r.age), str(r.step), f"{r.label} ({r.horizon})", _num(r._asdict(), "slope"),
             _num(r._asdict(), "ratio")] for r in g.itertuples()]
    return md_table(["estimator", "age", "step t", "horizon h", "slope", "median ratio"], rows)


def age_sentence(oldest: dict, estimator: str = "metagrad", within: bool = False) -> str:
    """loo.py ``oldest``'s answer in words (``within``: ``oldest`` read on ``rho_within``)."""
    what = ("which rows matter for each query (ρ within queries, interval above 0)" if within else
            "the leave-one-out effect (ρ interval above 0)")
    short = "which rows matter for each query" if within else "the leave-one-out effect"
    if not oldest["ages"]:
        return f"No leave-one-out row was scored by {estimator}."
    if oldest["first_miss"] is None:
        return (f"At the end, {estimator}'s exact first order predicts {what} at every age measured "
                f"({', '.join(map(str, oldest['ages']))} updates).")
    if not oldest["predicts"]:
        return (f"At the end, {estimator}'s exact first order does not predict {short} even at the youngest age "
                f"measured ({oldest['first_miss']} updates).")
    return (f"At the end, {estimator}'s exact first order predicts {what} up to age {oldest['predicts'][-1]} and no "
            f"longer at age {oldest['first_miss']} (ages measured: {', '.join(map(str, oldest['ages']))}).")


FLOOR_TITLE = "### Leave-one-out beside the nudges' floor"
FLOOR_HELP = (
    "What this controls for: a removal's Δ L_q is only readable as the row's own effect if it lies far above what a "
    "perturbation with no data change produces along the same chaotic dynamics. The bank's nudge arms (one ulp of "
    "one weight element at s, no row changed; the arms λ is fitted on) are measured on the same queries at the same "
    "horizons: per horizon h, |Δ L_q| = |L_q(nudged run at h) − L_q(twin at h)| over every nudge, query and seed, "
    "beside the leave-one-out rows' |Δ L_q| at h (every step t < h, then each step). A one-ulp nudge is far smaller "
    "than a removal's kick to the weights, so this is a **floor** (what chaos alone makes of the smallest possible "
    "difference), not a size-matched null: a removal far above it is not chaos acting on nothing, but this does not "
    "show that its effect is the row's content rather than the size of its kick. Ratio: the removals' median / the "
    "nudges' median [95% bootstrap interval: the seeds with replacement, a drawn seed's nudges and removals "
    "together]; then the share of removals at or below the nudges' largest |Δ|, and the smallest per-seed ratio "
    "(its seed), since chaos differs between seeds. Exploratory.")


def floor_table(f: pd.DataFrame) -> str:
    """loo.py ``nudge_floor``: a row per horizon (every leave-one-out step pooled), then per step."""
    rows = []
    for r in f.itertuples():
        every = r.step < 0
        rows.append([f"{r.label} ({r.horizon})" if every else "", f"every t < {r.horizon}" if every else
                     f"t = {r.step} (age {int(r.age)})", f"{fmt_num(r.nudge_median)} ({fmt_num(r.nudge_max)})",
                     fmt_num(r.removal_median), f"{fmt_num(r.ratio)} [{fmt_num(r.ratio_low)}, {fmt_num(r.ratio_high)}]",
                     f"{100 * r.below_max:.0f} %", f"{fmt_num(r.worst_seed_ratio)} (seed {r.worst_seed})"])
    n = f.iloc[0]
    return (f"{n.seeds} seed(s); {n.nudge_n} nudge values per horizon (the nudges are at s: their age at h is "
            "h − s).\n\n"
            + md_table(["horizon h", "removals", "nudges: median abs Δ L (max)", "removals: median abs Δ L",
                        "ratio removal / nudge", "removals ≤ nudges' max", "smallest seed's ratio"], rows))


def lds_table(c: pd.DataFrame, ceiling: pd.DataFrame | None = None) -> str:
    """The single-model LDS per estimator and α beside its single-row ρ; with ``ceiling`` (lds.py ``single_ceiling``
    at the end and the table's query kind) a last row: the retest of the same subsets on the nudged twin."""
    alphas = sorted(c.alpha.unique())
    rows = []
    for e, g in c.groupby("estimator", sort=True):
        g = g.set_index("alpha")
        one = g.iloc[0]
        single = "n/a" if math.isnan(one.single_rho) else fmt_ci(one.single_rho, one.single_low, one.single_high)
        rows.append([e, single, *(fmt_ci(g.loc[a].lds, g.loc[a].low, g.loc[a].high) if a in g.index else ""
                                  for a in alphas)])
    if ceiling is not None and len(ceiling):
        at = ceiling.set_index(ceiling.alpha.round(9))
        rows.append([RETEST_NAME, "", *(_retest_cell(at.loc[round(a, 9)]) if round(a, 9) in at.index else "n/a"
                                        for a in alphas)])
    return md_table(["estimator", "single-row ρ (end)", *(f"LDS α = {a:g}" for a in alphas)], rows)


def ceiling_table(c: pd.DataFrame) -> str:
    """loo.py ``ceiling``'s per-cell table alone (a bank not scored yet): the retest, pooled and within queries."""
    kind = _kind(c)
    g = c[c.query_kind == kind].assign(age=lambda f: f.horizon - f.step).sort_values(["age", "step"])
    rows = [[str(int(r.age)), str(int(r.step)), str(int(r.horizon)), _ci(r._asdict(), "retest"),
             _ci(r._asdict(), "retest_within")] for r in g.itertuples()]
    return (f"{kind} queries.\n\n" + md_table(["age h − t", "step t", "horizon h", "retest ρ pooled",
                                                   "retest ρ within queries"], rows))


def _retest_cell(r) -> str:
    """A ceiling's retest [interval] and its bound √ (lds.py ``CEILING``'s columns)."""
    return f"{fmt_ci(r.retest, r.retest_low, r.retest_high)}; bound {fmt_num(r.bound)} ({int(r.retest_subsets)} subsets)"


CEILING_HELP = (
    "**The ceiling.** Every leave-one-out row and the first group subsets were removed again from the *nudged twin* "
    "(the run nudged by one ulp at s, the bank's nudge arm) and measured against it, so each removal has a "
    "test–retest partner on a trajectory that differs from the twin's by the smallest possible difference, which "
    "chaos grows. The column and row named ceiling score that second measurement as an estimator of the first (the "
    "same cells and resamples): how far a removal's measured effect is the row's rather than its one trajectory's. "
    "Its bound, √retest, is the attenuation bound for a predictor of what both measurements share; it binds the "
    "estimators at θ_s, while metagrad replays the twin's own run and may pass it. Exploratory.")
TRAK_TITLE = "### TRAK LDS (retrained subsets, seed-averaged)"
TRAK_HELP = (
    "Random subsets that each **keep** a fraction α_keep of the rows of steps s .. end − 1 (the others removed), each "
    "retrained from the shared prefix at s several times — the first plain, each later one nudged by one ulp at s (the "
    "bank is deterministic after its prefix and a bank seed fixes the rows, so a nudge is the retraining's seed) — "
    "and the measured effect averaged over the retrainings (TRAK's LDS, Park et al. 2023). An estimator's prediction "
    "sums the values of the removed rows (it ranks the subsets as TRAK's sum over the kept rows does). Per seed and "
    "query the Spearman over subsets, the mean over queries, then seeds [95% bootstrap interval: seeds, then subsets]. "
    "Each run keeps the schedule and its steps (the removed rows' loss weight 0), not a shorter run on a smaller set. "
    "The last row is its ceiling: the retrainings' test–retest (Spearman over subsets between two retrainings), the "
    "Spearman–Brown reliability of their mean, and √ of it. Beside the single-model LDS above, not the same number. "
    "Exploratory.")


def trak_table(table: pd.DataFrame, ceiling: pd.DataFrame | None) -> str:
    """lds.py ``trak_analyse``'s table at the end and main kind (rows the estimators, a column per α_keep), with
    ``ceiling`` (lds.py ``trak_ceiling``) as the last row."""
    kind = _kind(table) if len(table) else (_kind(ceiling) if ceiling is not None and len(ceiling) else None)
    t = table[(table.query_kind == kind) & (table.horizon == table.horizon.max())] if len(table) else table
    keeps = sorted(set(t.keep) if len(t) else set(ceiling.keep) if ceiling is not None else set())
    rows = []
    for e, g in (t.groupby("estimator", sort=True) if len(t) else []):
        g = g.set_index(g.keep.round(9))
        rows.append([e, *(fmt_ci(g.loc[round(k, 9)].lds, g.loc[round(k, 9)].low, g.loc[round(k, 9)].high)
                          if round(k, 9) in g.index else "" for k in keeps)])
    if ceiling is not None and len(ceiling):
        c = ceiling[(ceiling.query_kind == kind) & (ceiling.horizon == ceiling.horizon.max())]
        c = c.set_index(c.keep.round(9))
        cells = []
        for k in keeps:
            if round(k, 9) not in c.index:
                cells.append("n/a")
                continue
            r = c.loc[round(k, 9)]
            cells.append(f"retest {fmt_ci(r.retest, r.retest_low, r.retest_high)}; reliability of the mean of "
                         f"{int(r.retrains)} {fmt_num(r.reliability)}; bound {fmt_num(r.bound)}")
        rows.append(["ceiling: the retrainings", *cells])
    return md_table(["estimator", *(f"TRAK LDS α_keep = {k:g}" for k in keeps)], rows)


def contrast_sentence(c: pd.DataFrame) -> str:
    """Which estimators that fail on single rows succeed on groups, and at what α (lds.py ``contrast``)."""
    turned = c[(c.single_predicts == False) & c.group_predicts]  # noqa: E712 (None: no single-row ρ)
    both = c[(c.single_predicts == True) & c.group_predicts]  # noqa: E712
    parts = []
    for what, g in (("fail on single rows but succeed on groups", turned), ("predict both", both)):
        if len(g):
            names = [f"{e} (α = {', '.join(f'{a:g}' for a in ga.alpha)})" for e, ga in g.groupby("estimator")]
            parts.append(f"Estimators that {what}: {', '.join(names)}.")
    none = sorted(set(c.estimator) - set(c[c.group_predicts].estimator))
    if none:
        parts.append(f"No LDS interval above 0: {', '.join(none)}.")
    return " ".join(parts) or "No estimator to compare."


DIFF_HELP = (
    "Each estimator's LDS minus {ref}'s at the end, paired: the same resamples of seeds and subsets for both "
    "[95% interval] ±jackknife SE over seeds of the per-seed difference. Below 0: {ref} ranks the subsets better.")


def differences_table(d: pd.DataFrame) -> str:
    """lds.py ``differences`` at the end horizon and the main query kind: rows the estimators, columns the α."""
    kind = _kind(d)
    g = d[(d.query_kind == kind) & (d.horizon == d.horizon.max())]
    alphas = sorted(g.alpha.unique())
    rows = []
    for e, ge in g.groupby("estimator", sort=True):
        ge = ge.set_index("alpha")
        rows.append([e, *(f"{fmt_ci(ge.loc[a].difference, ge.loc[a].low, ge.loc[a].high)} ±{fmt_num(ge.loc[a].se_seeds)}"
                          if a in ge.index else "" for a in alphas)])
    return md_table(["estimator", *(f"LDS − {g.reference.iloc[0]}'s, α = {a:g}" for a in alphas)], rows)


def removals_section(age: pd.DataFrame | None, oldest: dict | None, contrast: pd.DataFrame | None,
                     lds: pd.DataFrame | None, missing: list[int] | None = None,
                     paired: pd.DataFrame | None = None, within: dict | None = None,
                     floor: pd.DataFrame | None = None, loo_ceiling: pd.DataFrame | None = None,
                     lds_ceiling: pd.DataFrame | None = None, trak: pd.DataFrame | None = None,
                     trak_ceiling: pd.DataFrame | None = None) -> str:
    """The section: the LOO tables (with ``age``, loo.py ``by_age``; ``oldest`` for metagrad; ``missing``, the
    leave-one-out steps metagrad scored no row of: loo.py ``unscored``) and the LDS table (with ``contrast``, lds.py
    ``contrast``; ``lds``, lds.py's full table, for the subset count; ``paired``, lds.py ``differences``; ``within``,
    loo.py ``oldest`` on ``rho_within``; ``floor``, loo.py ``nudge_floor``: the removals beside the nudges). With a
    ceiling: ``loo_ceiling`` (loo.py ``ceiling``'s per-cell table) a column beside the LOO tables, ``lds_ceiling``
    (lds.py ``single_ceiling`` at the end) a row of the LDS table; with TRAK's subsets: ``trak`` (lds.py
    ``trak_analyse``) and ``trak_ceiling`` (lds.py ``trak_ceiling``) their own table."""
    loo_ceiling = loo_ceiling if loo_ceiling is not None and len(loo_ceiling) else None
    if lds_ceiling is not None and len(lds_ceiling) and lds is not None and len(lds):
        lds_ceiling = lds_ceiling[(lds_ceiling.horizon == lds.horizon.max()) & (lds_ceiling.query_kind == _kind(lds))]
    lds_ceiling = lds_ceiling if lds_ceiling is not None and len(lds_ceiling) else None
    out = [TITLE]
    if age is not None:
        out.append("### Leave-one-out by age")
        if not len(age):
            out.append("The bank has leave-one-out runs but no row scores yet (run `seedlab attribution metagrad BANK "
                       "--t0 <the earliest step>` and `seedlab attribution rowscores BANK`).")
            if loo_ceiling is not None:
                out += [CEILING_HELP, ceiling_table(loo_ceiling)]
        else:
            gap = ([f"metagrad.parquet holds no row of step {', '.join(map(str, missing))}: run `seedlab attribution "
                    f"metagrad BANK --t0 {min(missing)}` (or earlier) for those rows."] if missing else [])
            out += [LOO_HELP, *([age_sentence(oldest)] if oldest is not None else []), *gap,
                    *([CEILING_HELP] if loo_ceiling is not None else []), loo_table(age, ceiling=loo_ceiling)]
            if "rho_within" in age and age.rho_within.notna().any():
                out += [WITHIN_HELP, *([age_sentence(within, within=True)] if within is not None else []),
                        loo_table(age, "rho_within", ceiling=loo_ceiling)]
            out += [CAL_HELP, calibration_table(age)]
    if floor is not None and len(floor):
        out += [FLOOR_TITLE, FLOOR_HELP, floor_table(floor)]
    if contrast is not None:
        out.append("### Groups: the linear datamodeling score")
        if not len(contrast):
            out.append("The bank has group runs but no row scores yet (run `seedlab attribution metagrad BANK` and "
                       "`seedlab attribution rowscores BANK`).")
        else:
            end = lds[(lds.horizon == lds.horizon.max()) & (lds.query_kind == _kind(lds))] if lds is not None else None
            n = end.iloc[0] if end is not None and len(end) else None
            size = "" if n is None else f"{n.seeds} seed(s), {n.subsets} subsets per α, {n.queries} queries. "
            out += [LDS_HELP, size + contrast_sentence(contrast),
                    *([CEILING_HELP] if lds_ceiling is not None and loo_ceiling is None else []),
                    lds_table(contrast, lds_ceiling)]
            if paired is not None and len(paired):
                out += [DIFF_HELP.format(ref=paired.reference.iloc[0]), differences_table(paired)]
            out.append(PUBLISHED)
    has_trak = trak is not None and len(trak)
    if has_trak or (trak_ceiling is not None and len(trak_ceiling)):
        out += [TRAK_TITLE, TRAK_HELP]
        if not has_trak:
            out.append("No row scores yet (run `seedlab attribution metagrad BANK` and `seedlab attribution "
                       "rowscores BANK`): the ceiling alone.")
        out.append(trak_table(trak if has_trak else pd.DataFrame(columns=["query_kind", "horizon", "keep"]),
                              trak_ceiling))
    return "\n\n".join(out)
