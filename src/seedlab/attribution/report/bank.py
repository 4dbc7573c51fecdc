"""``seedlab attribution report DIR``: ``DIR/report.md`` plus PNG figures beside it.

It reads as a newcomer reads: the answer first — until when the exact linear response carries
(h*), which estimator predicts the measured effect, at which horizons, beyond which baselines —
then the headline table (the within-seed correlations beside the row invariance and its ceiling) and the figures
(attribution/report/figures.py); then the design, its integrity checks and the size of the measured
effects; then the long tables: the across-seed track (beside the reliability of the seed-mean),
each estimator against each baseline, the decay between horizons, the linear-response horizon,
the sign agreement, the calibration of magnitudes, the correlations within each candidate kind
and, with pairs, additivity; last, what the estimators are. It only words and tabulates:
the bank's files are read by attribution/bank/rundir.py (:func:`~seedlab.attribution.bank.rundir.read_attributed`),
every number is computed by attribution/analyses/stats.py (:func:`~seedlab.attribution.analyses.stats.analyse`,
:func:`~seedlab.attribution.analyses.stats.design`, :func:`~seedlab.attribution.analyses.stats.integrity`),
horizon.py (:func:`~seedlab.attribution.analyses.horizon.linear_response`) and additivity.py
(:func:`~seedlab.attribution.analyses.additivity.summarise`), and the sections of the last two are worded
by report_horizon.py and report_additivity.py; a bank that removes rows of its own run (``loo``, ``groups``)
gets the leave-one-out and LDS section, computed by loo.py and lds.py and worded by report_lds.py.
"""

from __future__ import annotations

import math
from itertools import groupby
from pathlib import Path

import pandas as pd

from seedlab.attribution.analyses import additivity, horizon, stats

from seedlab.attribution.report import figures
from seedlab.attribution.bank.config import AttributeConfig
from seedlab.attribution.estimators.registry import ESTIMATORS
from seedlab.attribution.report.additivity import additivity_section
from seedlab.attribution.report.horizon import horizon_sentence, linear_response_section
from seedlab.attribution.bank.rundir import Attributed, read_attributed
from seedlab.config import parse
from seedlab.reporting import Report, figure_block, fmt_ci, fmt_num, fmt_p, md_table, pct
from seedlab.store import write_text
from seedlab.attribution.bank.kinds import KINDS


def write_report(root: str | Path) -> Path:
    """Write ``root/report.md`` and its figures; returns the report's path."""
    a = read_attributed(root)
    an = stats.analyse(a.df)
    tau = parse(AttributeConfig, a.config.get("attribute", {}), "attribute").h_star_rho
    lr = horizon.linear_response(a.df, threshold=tau)
    rep = Report()
    rep.add("# Attribution: influence estimates against measured single-row counterfactuals",
            *([horizon_sentence(lr, an.verdict)] if lr.ran else []), answer(an.verdict))
    rep.add("## Headline: within seed", WITHIN_HELP)
    for kind in dict.fromkeys(an.correlations.query_kind):
        rep.add(f"### {kind} queries", correlation_table(_of(an.correlations, "within", kind)))
    rep.add("## Figures")
    queries = a.df[a.df.candidate_kind != "control"].drop_duplicates("query_kind")["query"]  # the first of each kind
    for fig in [figures.correlation_figure(an.correlations, a.dir),
                *([figures.linear_response_figure(lr, a.dir)] if lr.ran else []),
                *(figures.scatter_figure(a.df, a.dir, q) for q in queries)]:
        rep.add(figure_block(fig))
    rep.add("## Design", intro(a, stats.design(a.df)))
    rep.add("## Integrity", integrity_text(stats.integrity(a.integrity, a.df)))
    rep.add("## The measured effects", effects_table(an.effects))
    rep.add("## Across seeds", ACROSS_HELP)
    for kind in dict.fromkeys(an.correlations.query_kind):
        rep.add(f"### {kind} queries", correlation_table(_of(an.correlations, "across", kind)))
    rep.add("## Against the baselines", versus_text(an.versus))
    rep.add("## Decay between horizons", decay_table(an.decay))
    rep.add(linear_response_section(lr, an.verdict))
    rep.add("## Sign agreement, weighted by |Δ L|", sign_table(an.sign))
    rep.add("## Magnitude", calibration_table(an.calibration))
    rep.add("## Within each candidate kind", by_kind_table(an.by_candidate_kind))
    if a.pairs is not None:  # a bank with pairs
        rep.add(additivity_section(additivity.summarise(a.pairs)))
    extra = size_and_chaos(a)
    if extra:
        rep.add(*extra)
    own_rows = removal_section(a)
    if own_rows:
        rep.add(own_rows)
    names = [e for e in dict.fromkeys(an.correlations.estimator) if e not in stats.REFERENCES]
    rep.add("## What the estimators are", estimator_text(a, names))
    return write_text(a.dir.report, rep.text())


def size_and_chaos(a: Attributed) -> list[str]:
    """The size axis (a bank with row weights and unroll-tangent: attribution/analyses/size.py) and chaos (a bank with
    nudges: attribution/analyses/chaos.py), with the law's predictions where both are there, and their figure."""
    from seedlab.attribution.analyses import chaos, size
    from seedlab.attribution.report.size import chaos_section, size_figure, size_section

    out: list[str] = []
    ch = None
    if a.distances is not None and (a.distances.kind == KINDS["nudge"].name).any():
        ch = chaos.analyse(a.distances)
    sz = None
    if a.weighted is not None and (a.df.estimator == stats.TANGENT).any():
        sz = size.analyse(a.weighted, a.df, a.distances)
        out += ["\n".join(size_section(sz))]
    if ch is not None:
        out += ["\n".join(chaos_section(ch, chaos.compare({"this bank": (sz, ch)}) if sz is not None else None))]
    if sz is not None:
        out += [figure_block(size_figure(sz, ch, a.dir))]
    return out


def removal_section(a: Attributed) -> str | None:
    """The run's own rows (a bank with ``loo``, ``groups`` or ``trak``): leave-one-out by age (attribution/analyses/loo.py;
    with nudge runs, beside the nudges' own query effects: loo.py ``nudge_floor``) and the LDS beside the single rows
    (attribution/analyses/lds.py), each with the removals' retest on the nudged twin beside it (``ceiling``: loo.py
    ``ceiling``, lds.py ``single_ceiling``), and TRAK's LDS with its ceiling (``trak``: lds.py ``trak_analyse``,
    ``trak_ceiling``), worded by report_lds.py; None for a bank without them."""
    if a.loo is None and a.groups is None and a.trak is None:
        return None
    from seedlab.attribution.analyses import lds, loo
    from seedlab.attribution.report.lds import removals_section
    from seedlab.attribution.estimators.rowscores import read_scores

    scores = read_scores(a.dir.root)
    age = oldest = within = contrast = table = paired = floor = None
    single, missing = pd.DataFrame(columns=loo.COLUMNS), []
    if a.loo is not None:
        age, single = loo.analyse(a.loo, scores)
        oldest, within = loo.oldest(age, "metagrad"), loo.oldest(age, "metagrad", column="rho_within")
        missing = loo.unscored(a.loo, scores, "metagrad") if scores is not None else []
        if a.nudges is not None:
            floor = loo.nudge_floor(loo.beside_nudges(a.loo, a.nudges, a.config["injection_step"]))
    if a.groups is not None and a.group_rows is not None:
        table, paired = lds.analyse_paired(a.groups, a.group_rows, scores)
        contrast = lds.contrast(table, single)
    loo_ceiling = loo.ceiling(a.retest)[0] if a.retest is not None else None
    lds_ceiling = lds.single_ceiling(a.retest) if a.retest is not None else None
    trak = trak_ceiling = None
    if a.trak is not None and a.trak_rows is not None:
        trak, trak_ceiling = lds.trak_analyse(a.trak, a.trak_rows, scores)[0], lds.trak_ceiling(a.trak)
    return removals_section(age, oldest, contrast, table, missing, paired, within, floor, loo_ceiling, lds_ceiling,
                            trak, trak_ceiling)


def _of(corr: pd.DataFrame, track: str, kind: str) -> pd.DataFrame:
    return corr[(corr.track == track) & (corr.query_kind == kind)]


QUERY_TEXT = {"self": "the candidates' own text", "heldout": "held-out rows", "probe": "the probes"}

WITHIN_HELP = (
    "Per seed, query and horizon: the Spearman correlation across candidates between an estimate and the measured "
    "effect, averaged over the queries of a kind and then over seeds. Within a seed the measured effect is exact (its "
    "runs are deterministic), so the reference is not seed noise but the **row invariance** ρ_rep: Spearman(Δ(c@r), "
    "Δ(c@r′)), the same candidate measured at another row r′ of the same batch — the test–retest reliability of the "
    "target across the row it replaces (shown where the bank measured replicates). In parentheses its **ceiling** "
    "√ρ_rep: a predictor that ranks a candidate the same whichever row it replaces (every estimator at θ_s) cannot "
    "correlate with the measured effect beyond it (the attenuation bound; a ceiling, not a floor). Nor is ρ_rep < 1 "
    "noise: to first order Δ(c@r) − Δ(c@r′) is the same constant for every candidate, so what lowers it is the swap's "
    "non-linearity, the same cause that makes the exact linear response miss. Cells: ρ [95% bootstrap interval over "
    "candidates] ±jackknife SE over seeds. Baselines in italics: the registry's baselines and *kind* (the leave-one-out mean "
    "effect of the seed's other candidates of the same kind). The estimators at θ_s (sgd, adam, adam-linear, tracin "
    "— its one term at s, the candidate's only visit —, cosine, adam-cosine, the baselines and plug-ins) give the "
    "same number at every horizon; the variant tracin-cp sums over the twin's checkpoints before the horizon (terms "
    "for visits that never happened); ekfac/kfac/trak are "
    "evaluated at the twin's weights of the horizon (or at θ_s, see below).")

ACROSS_HELP = (
    "What is common to seeds: the Spearman correlation across candidates between the seed-mean estimate and the "
    "seed-mean measured effect, per query and horizon, averaged over the queries of a kind. The reference is the "
    "**reliability** R of the seed-mean measured effect (Spearman–Brown from the mean correlation r̄ between two "
    "seeds' measured effects over k seeds: R = k·r̄ / (1 + (k − 1)·r̄)); √R, in parentheses, is the correlation of the "
    "seed-mean with its common part — what a perfect predictor of what seeds share would reach.")


def answer(verdict: pd.DataFrame) -> str:
    """The first paragraph: per query kind, over runs of horizons with the same verdict (within
    seed), the estimator that predicts the measured effect beyond every baseline, or that none does."""
    lines = []
    for kind, g in verdict[verdict.track == "within"].groupby("query_kind", sort=False):
        runs = [list(run) for _, run in groupby(g.sort_values("horizon").itertuples(), key=lambda r: r.winner)]
        text = "; ".join(_verdict_run(run, QUERY_TEXT.get(kind, kind)) for run in runs)
        lines.append(f"**{kind} queries.** {text[0].upper()}{text[1:]}.")
    if not lines:
        return "Nothing to compare."
    return "\n\n".join(lines) + (
        "\n\n*An estimator predicts when the 95% bootstrap interval (resampled candidates) of its within-seed "
        "Spearman lies above 0 and that of its difference from each baseline's (the same resamples) lies above 0; "
        "numbers at the first and last horizon of each stretch.*")


def _at(run: list, fmt) -> str:
    """``fmt(r)`` at the run's horizon, or at its first and last (each named)."""
    return fmt(run[0]) if len(run) == 1 else " … ".join(f"{fmt(r)} at {r.label}" for r in (run[0], run[-1]))


def _verdict_run(run: list, what: str) -> str:
    when = f"at {run[0].label}" if len(run) == 1 else f"from {run[0].label} to {run[-1].label}"
    invariance = ("" if all(math.isnan(r.reference) for r in run)
                  else f"; row invariance {_at(run, lambda r: f'{fmt_ci(r.reference)} (ceiling {fmt_ci(r.ceiling)})')}")
    rival = ("no baseline in this bank" if run[0].best_baseline is None
             else f"best baseline: {_at(run, lambda r: f'{r.best_baseline} {fmt_ci(r.baseline_rho)}')}")
    if run[0].winner:
        others = list(dict.fromkeys(e for r in run for e in r.others))
        return (f"{when}, **{run[0].winner}** predicts the effect on {what} beyond every baseline (within-seed "
                f"Spearman {_at(run, lambda r: fmt_ci(r.rho, r.low, r.high))}{invariance}; {rival})"
                + (f" (also: {', '.join(others)})" if others else ""))
    if run[0].best is None:
        return f"{when}, no estimator to compare"

    def best(r) -> str:
        return f"{r.best} {fmt_ci(r.rho, r.low, r.high)} not above {' and '.join(r.unbeaten) or '0'}"

    return (f"{when}, no estimator predicts the effect on {what} beyond every baseline (best estimator: "
            f"{_at(run, best)}{invariance}; {rival})")


def intro(a: Attributed, d: stats.Design) -> str:
    c = a.config
    s = c["injection_step"]
    return (f"Bank `{a.dir.root}`: model `{c['model']}`, {len(d.seeds)} seed(s) "
            f"({', '.join(map(str, d.seeds))}), batches of {c['batch_size']} rows, optimizer "
            f"{c['optimizer']} (peak lr {c['peak_lr']:g}), trained to update {c.get('stop') or c['steps']} of a "
            f"{c['steps']}-update schedule. Row {c['injection_row']} of the batch of step {s} is replaced by each "
            f"candidate in turn: {', '.join(f'{n} {k}' for k, n in d.candidates.items())}. Queries: "
            + ("each candidate's own text (self), " if d.self_queries else "")
            + f"{', '.join(f'{n} {k}' for k, n in d.queries.items())}. Horizons (updates completed): "
            + ", ".join(f"{label} = {h}" for label, h in d.horizons)
            + f". Estimators: {', '.join(d.estimators)}. Precision {c.get('precision', 'fp32')}.")


def integrity_text(i: stats.Integrity) -> str:
    lines = [("Every run of a seed is forked from one copy of its shared prefix, so all are identical at the injection "
              "step by construction.")]
    if i.replica_seeds:
        n, first, last = i.replica_steps
        lines.append(f"Replica control (seed {', '.join(i.replica_seeds)}): the twin trained again from the prefix was "
                     f"bitwise equal to the twin at every saved step ({n} steps, {first} .. {last}): training after "
                     "the injection is deterministic, so each measured effect is the row's alone.")
    if i.stacked is not None:
        lines.append(stacked_text(i.stacked))
    if i.own_row_seeds:
        lines.append(f"Own-row control (seed {', '.join(i.own_row_seeds)}): replacing the row by itself gave runs "
                     f"bitwise equal to the twin; measured effect exactly 0 at every horizon: "
                     f"{'yes' if i.control_measured_zero else 'NO'}; every estimate exactly 0: "
                     f"{'yes' if i.control_estimates_zero else 'NO'}.")
    return "\n\n".join(lines)


def stacked_text(st: dict) -> str:
    """How the runs trained in stacks, and whether a stacked run is bitwise its solo run (the solo check)."""
    where = f" (the replica control at position {st['replica_position']})" if st["replica_position"] else ""
    line = (f"The runs trained in stacks of up to {st['arm_batch']} (forks/stacked.py: several runs, of one seed and of "
            f"others, in one set of tensors){where}.")
    solo = st["solo_check"]
    if solo is None:
        return line + " No solo check ran."
    if solo["bitwise_equal_to_solo"]:
        return line + (f" Solo check: the first seed's twin trained alone to step {solo['step']} was bitwise the stacked "
                       "twin: every run is, bit for bit, the run the serial loop trains.")
    far = f" (max |Δw| = {solo['max_abs_difference']:.3g})" if "max_abs_difference" in solo else ""
    return line + (f" Solo check: the first seed's twin trained alone to step {solo['step']} was NOT bitwise the stacked "
                   f"twin{far}: the stack's kernels round differently from the solo run's, so the runs are the serial loop's "
                   "to float tolerance only; differences between runs of the bank are still the rows' alone (the replica "
                   "control holds inside the stack).")


def effects_table(e: pd.DataFrame) -> str:
    rows = [[r.query_kind, f"{r.label} ({r.horizon})", fmt_num(r.mean_abs), fmt_num(r.median_abs), pct(r.negative),
             str(r.n)] for r in e.itertuples()]
    return ("Δ L = L_query(run with the candidate) − L_query(twin), nats/token; negative: the candidate lowered the "
            "query's loss.\n\n" + md_table(["queries", "horizon", "mean |Δ L|", "median |Δ L|", "negative", "n"], rows))


def _horizons(g: pd.DataFrame, prefix: str = "") -> tuple[list, list[str]]:
    hs = g.drop_duplicates(f"{prefix}horizon").sort_values(f"{prefix}horizon")
    return list(hs[f"{prefix}horizon"]), [f"{r[f'{prefix}label']} ({r[f'{prefix}horizon']})" for _, r in hs.iterrows()]


def _name(e: str, baseline: bool) -> str:
    return f"**{e}**" if e in stats.REFERENCES else (f"*{e}*" if baseline else e)


def _grid(g: pd.DataFrame, cell, prefix: str = "") -> str:
    """Estimators (rows: estimators, baselines, references) × horizons (columns) of ``g``, ``cell(row)`` per cell."""
    hs, header = _horizons(g, prefix)
    order = g.assign(o=g.baseline.astype(int) + 2 * g.estimator.isin(stats.REFERENCES)).drop_duplicates("estimator")
    rows = []
    for r in order.sort_values("o", kind="stable").itertuples():
        ge = g[g.estimator == r.estimator].set_index(f"{prefix}horizon")
        rows.append([_name(r.estimator, r.baseline), *(cell(ge.loc[h]) if h in ge.index else "" for h in hs)])
    return md_table(["estimator", *header], rows)


def _corr_cell(r: pd.Series) -> str:
    se = "" if math.isnan(r.se_seeds) else f" ±{r.se_seeds:.2f}"
    name = "ceiling √ρ_rep" if r.estimator == stats.ROW_INVARIANCE else "√R"
    bound = "" if math.isnan(r.bound) else f" ({name} {r.bound:.2f})"
    return fmt_ci(r.rho, r.low, r.high) + se + bound


def correlation_table(g: pd.DataFrame) -> str:
    """One track's correlations for one query kind (and candidate set)."""
    n = g.iloc[0]
    return (f"{n.seeds} seeds, {n.candidates} candidates, {n.queries} quer{'y' if n.queries == 1 else 'ies'}.\n\n"
            + _grid(g, _corr_cell))


def versus_text(vs: pd.DataFrame) -> str:
    v = vs[vs.track == "within"]
    if not len(v):
        return "No baseline estimator in this bank."
    out = ["Within seed: per estimator and horizon, the baselines whose Spearman it does **not** clearly exceed (the "
           "95% bootstrap interval of the difference reaches 0 or below), with the difference; *all* = it exceeds "
           "every "
           "baseline."]
    for kind, g in v.groupby("query_kind", sort=False):
        def cell(r: pd.DataFrame) -> str:
            lost = r[r.low <= 0]
            return "all" if not len(lost) else "; ".join(
                f"{x.against} {fmt_ci(x.diff, x.low, x.high)}" for x in lost.itertuples())
        hs, header = _horizons(g)
        rows = [[e, *(cell(ge[ge.horizon == h]) for h in hs)] for e, ge in g.groupby("estimator", sort=False)]
        out.append(f"### {kind} queries\n\n" + md_table(["estimator", *header], rows))
    return "\n\n".join(out)


def _per_kind(df: pd.DataFrame, intro: str, cell, title=lambda kind, g: f"### {kind} queries", prefix: str = "") -> str:
    """``intro``, then one :func:`_grid` of ``cell`` per query kind under its ``title``."""
    return "\n\n".join([intro] + [f"{title(kind, g)}\n\n" + _grid(g, cell, *([prefix] if prefix else []))
                                  for kind, g in df.groupby("query_kind", sort=False)])


def decay_table(d: pd.DataFrame) -> str:
    if not len(d):
        return "Fewer than 2 seeds or one horizon: no decay to test."
    return _per_kind(
        d, "Per seed, the within-seed Spearman at the first horizon minus that at a later one, paired over seeds: mean "
        "difference (positive: the agreement decays) with its 95% t interval, the paired t-test's p and the "
        "sign-flip permutation test's p (its smallest possible value with n seeds is 2/2ⁿ).",
        lambda r: f"{fmt_ci(r['diff'], r.ci_low, r.ci_high)}, p_t {fmt_p(r.p_t)}, p_perm {fmt_p(r.p_perm)}",
        title=lambda kind, g: f"### {kind} queries (from {g.from_label.iloc[0]})", prefix="to_")


def sign_table(sign: pd.DataFrame) -> str:
    return _per_kind(
        sign, "Per seed, Σ|Δ|·[the estimate has Δ's sign] / Σ|Δ| over the (candidate, query) pairs of a kind "
        "(estimates of exactly 0 left out), then the mean over seeds with its 95% t interval; in parentheses the "
        "base rate: the same for always predicting the |Δ|-weighted majority sign.",
        lambda r: f"{fmt_ci(r['sign'], r.sign_low, r.sign_high)} (base {fmt_ci(r.base)})")


def calibration_table(cal: pd.DataFrame) -> str:
    if not len(cal):
        return "No estimator in nats/token."
    return _per_kind(
        cal.assign(baseline=False), "For the estimators in nats/token: the OLS slope of the measured effect on the "
        "estimate over every (seed, query, candidate) of a kind and the median ratio measured / estimate, each with its "
        "95% bootstrap interval over candidates (1: the estimate has the effect's scale).",
        lambda r: f"slope {fmt_num(r.slope)} [{fmt_num(r.low)}, {fmt_num(r.high)}]; ratio {fmt_num(r.ratio)} "
                  f"[{fmt_num(r.ratio_low)}, {fmt_num(r.ratio_high)}]")


def by_kind_table(bk: pd.DataFrame) -> str:
    if not len(bk):
        return f"No two candidate kinds with at least {stats.MIN_KIND} candidates each."
    out = ["The within-seed track restricted to the candidates of one kind (the kind baseline has nothing to say "
           "there): does an estimator rank candidates of the same kind, or only tell the kinds apart?"]
    for (ck, kind), g in bk[bk.track == "within"].groupby(["candidate_kind", "query_kind"], sort=False):
        out.append(f"### {ck} candidates, {kind} queries\n\n" + correlation_table(g))
    return "\n\n".join(out)


KIND_SUMMARY = ("baseline, derived here: the mean measured effect of the seed's other candidates of the same kind "
                "(same query and horizon; leave-one-out)")


def estimator_text(a: Attributed, names) -> str:
    secs = stats.seconds_per_seed(a.meta.get("seconds", {}))
    rows = []
    for e in names:
        spec = ESTIMATORS.get(e)
        rows.append([e, KIND_SUMMARY if e == stats.KIND else spec.summary if spec else "",
                     "every horizon" if e == stats.KIND else spec.horizon if spec else "",
                     fmt_num(secs[e]) if e in secs else "n/a"])
    where = a.meta.get("influence_at", "horizon")
    return (md_table(["estimator", "what it computes", "its own horizon", "seconds per seed"], rows) + "\n\n"
            f"EK-FAC/K-FAC were evaluated at {'the twin weights of each horizon' if where == 'horizon' else 'θ_s'} "
            "(kronfluence; the blocks' Linear modules only: embeddings, LayerNorms and the tied output head are not "
            "tracked). Correlations and sign agreement do not depend on an estimator's scale; a scatter's y axis does.")
