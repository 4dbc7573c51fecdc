"""``seedlab attribution report DIR``: ``DIR/report.md`` plus PNG figures beside it.

Read top to bottom, the module follows the report: the design and its integrity checks, the size
of the measured effects, each estimator's agreement with them per horizon beside the noise
ceiling (tables), how close each estimator gets to the ceiling and whether its agreement falls
with the horizon (sentences computed from the intervals: a difference is stated only when the
95% intervals do not overlap), then the figures (attribution/figures.py). Every number comes from
the bank's files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from seedlab.attribution import figures, stats
from seedlab.attribution.registry import ESTIMATORS
from seedlab.attribution.rundir import BankDir
from seedlab.errors import SeedlabError
from seedlab.reporting import Report, figure_block, fmt_num, md_table, pct
from seedlab.store import write_text


@dataclass
class Attributed:
    """What a bank folder holds once attributed."""

    dir: BankDir
    df: pd.DataFrame  # attribution.parquet
    config: dict
    integrity: dict
    meta: dict  # attribution.json


def load(root: str | Path) -> Attributed:
    rd = BankDir(Path(root))
    config = rd.read_config()
    if not rd.attribution.is_file():
        raise SeedlabError(f"{rd.root}: no attribution.parquet (run `seedlab attribution attribute {rd.root}` first)")
    integrity = json.loads(rd.integrity.read_text()) if rd.integrity.is_file() else {}
    meta = json.loads(rd.attribution_json.read_text()) if rd.attribution_json.is_file() else {}
    return Attributed(rd, pd.read_parquet(rd.attribution), config, integrity, meta)


def write_report(root: str | Path) -> Path:
    """Write ``root/report.md`` and its figures; returns the report's path."""
    a = load(root)
    summ = stats.summary(a.df)
    rep = Report()
    rep.add("# Attribution: influence estimates against measured single-row counterfactuals", intro(a))
    rep.add("## Integrity", integrity_text(a))
    rep.add("## The measured effects", effects_table(a.df))
    rep.add("## Agreement with the measured effects", AGREEMENT_HELP)
    for kind in dict.fromkeys(summ.query_kind):
        rep.add(f"### {kind} queries", agreement_table(summ, kind), "Sign agreement (mean over seeds):",
                agreement_table(summ, kind, "sign"))
    rep.add("## How close each estimator gets to the ceiling", closeness(summ))
    rep.add("## Figures")
    kinds = list(dict.fromkeys(a.df.query_kind))
    for fig in [*(figures.scatter_figure(a.df, a.dir, k) for k in kinds), figures.correlation_figure(summ, a.dir),
                figures.correlation_figure(summ, a.dir, "pearson")]:
        rep.add(figure_block(fig))
    rep.add("## What the estimators are", estimator_text(a))
    return write_text(a.dir.report, rep.text())


AGREEMENT_HELP = (
    "Per seed, every estimator's estimates are correlated with the measured effects across candidates, for each "
    "query, then averaged over the queries of a kind; the table gives the mean over seeds with its 95% t interval "
    "(clipped to [−1, 1]) and, in parentheses, the mean as a fraction of the noise ceiling's at the same horizon. "
    "The **ceiling** row is one seed's measured effects against another seed's (the same candidates and queries; "
    "every pair of seeds): how far a candidate's effect is determined by the candidate at all. Within a seed the "
    "measured effect has no noise (its runs are deterministic: the replica control), so the ceiling's shortfall is "
    "seed-to-seed variation — another initialisation, data order and replaced row. An estimator computed from the "
    "seed's own state can therefore exceed it (above 100%): it then tracks that seed's effects better than another "
    "seed's measurement does; no fraction is given where the ceiling is not positive. The one-step "
    "estimators (sgd, adam, cosine) give the same number at every horizon; tracin sums over the twin's checkpoints "
    "before the horizon; ekfac/kfac are evaluated at the twin's weights of the horizon (or at θ_s, see below).")


def intro(a: Attributed) -> str:
    c, df = a.config, a.df
    s = c["injection_step"]
    cands = df[df.candidate_kind != "control"].drop_duplicates(["candidate"]).candidate_kind.value_counts()
    queries = df[df.query_kind != "self"].drop_duplicates(["query"]).query_kind.value_counts()
    hs = df.drop_duplicates("horizon").sort_values("horizon")
    return (f"Bank `{a.dir.root}`: model `{c['model']}`, {len(df.seed.unique())} seed(s) "
            f"({', '.join(map(str, sorted(df.seed.unique())))}), batches of {c['batch_size']} rows, optimizer "
            f"{c['optimizer']} (peak lr {c['peak_lr']:g}), trained to update {c.get('stop') or c['steps']} of a "
            f"{c['steps']}-update schedule. Row {c['injection_row']} of the batch of step {s} is replaced by each "
            f"candidate in turn: {', '.join(f'{n} {k}' for k, n in cands.items())}. Queries: "
            + ("each candidate's own text (self), " if (df.query_kind == "self").any() else "")
            + f"{', '.join(f'{n} {k}' for k, n in queries.items())}. Horizons (updates completed): "
            + ", ".join(f"{r.label} = {r.horizon}" for r in hs.itertuples())
            + f". Estimators: {', '.join(dict.fromkeys(df.estimator))}.")


def integrity_text(a: Attributed) -> str:
    seeds = a.integrity.get("seeds", {})
    rep = [k for k, v in seeds.items() if "replica" in v]
    own = [k for k, v in seeds.items() if "own_row" in v]
    lines = [("Every run of a seed is forked from one copy of its shared prefix, so all are identical at the injection "
              "step by construction.")]
    if rep:
        steps = seeds[rep[0]]["replica"]["steps_compared"]
        lines.append(f"Replica control (seed {', '.join(rep)}): the twin trained again from the prefix was bitwise equal "
                     f"to the twin at every saved step ({len(steps)} steps, {steps[0]} .. {steps[-1]}): training after "
                     "the injection is deterministic, so each measured effect is the row's alone.")
    if own:
        ctrl = a.df[a.df.candidate_kind == "control"]
        zero = bool(len(ctrl)) and bool((ctrl.measured == 0).all())
        est0 = bool(len(ctrl)) and bool((ctrl.estimate == 0).all())
        lines.append(f"Own-row control (seed {', '.join(own)}): replacing the row by itself gave runs bitwise equal to "
                     f"the twin; measured effect exactly 0 at every horizon: {'yes' if zero else 'NO'}; every estimate "
                     f"exactly 0: {'yes' if est0 else 'NO'}.")
    return "\n\n".join(lines)


def effects_table(df: pd.DataFrame) -> str:
    e = stats.effects(df)
    rows = [[r.query_kind, f"{r.label} ({r.horizon})", fmt_num(r.mean_abs), fmt_num(r.median_abs), pct(r.negative),
             str(r.n)] for r in e.itertuples()]
    return ("Δ L = L_query(run with the candidate) − L_query(twin), nats/token; negative: the candidate lowered the "
            "query's loss.\n\n" + md_table(["queries", "horizon", "mean |Δ L|", "median |Δ L|", "negative", "n"], rows))


def _ci(r, k: str) -> str:
    if math.isnan(r[k]):
        return "n/a"
    lo, hi = r[f"{k}_low"], r[f"{k}_high"]
    band = "" if math.isnan(lo) else f" [{max(lo, -1):.2f}, {min(hi, 1):.2f}]"
    return f"{r[k]:.2f}{band}"


def agreement_table(summ: pd.DataFrame, kind: str, what: str = "spearman") -> str:
    g = summ[summ.query_kind == kind]
    hs = g.drop_duplicates("horizon").sort_values("horizon")
    header = ["estimator", *(f"{r.label} ({r.horizon})" for r in hs.itertuples())]
    order = [stats.CEILING, *(e for e in dict.fromkeys(g.estimator) if e != stats.CEILING)]
    rows = []
    for e in order:
        ge = g[g.estimator == e].set_index("horizon")
        cells = []
        for h in hs.horizon:
            if h not in ge.index:
                cells.append("")
                continue
            r = ge.loc[h]
            frac = r.get(f"{what}_of_ceiling", math.nan)
            extra = "" if e == stats.CEILING or what == "sign" or math.isnan(frac) else f" ({pct(frac)})"
            cells.append(_ci(r, what) + extra)
        rows.append([f"**{e}**" if e == stats.CEILING else e, *cells])
    return md_table(header, rows)


def closeness(summ: pd.DataFrame) -> str:
    """Sentences: per query kind and estimator, its Spearman at the first and last horizon beside the
    ceiling, and whether it falls (only when the intervals do not overlap)."""
    out = []
    for kind, g in summ.groupby("query_kind", sort=False):
        ceil = g[g.estimator == stats.CEILING].set_index("horizon")
        parts = []
        for e, ge in g[g.estimator != stats.CEILING].groupby("estimator", sort=False):
            ge = ge.sort_values("horizon")
            first, last = ge.iloc[0], ge.iloc[-1]
            said = (f"**{e}**: Spearman {_ci(first, 'spearman')} at {first.label} "
                    f"({_of_ceiling(first, ceil.spearman.get(first.horizon, math.nan))}), {_ci(last, 'spearman')} at "
                    f"{last.label} ({_of_ceiling(last, ceil.spearman.get(last.horizon, math.nan))})")
            if len(ge) > 1:
                said += f"; {_change(first, last)}"
            parts.append(said + ".")
        best = g[g.estimator != stats.CEILING].sort_values("spearman", ascending=False).groupby("horizon").head(1)
        tops = "; ".join(f"{r.label}: {r.estimator} ({r.spearman:.2f})" for r in best.sort_values("horizon").itertuples())
        out.append(f"**{kind} queries.** " + " ".join(parts) + f" Highest mean Spearman per horizon — {tops} "
                   "(the intervals show whether the estimators differ).")
    return "\n\n".join(out) if out else "Nothing to compare."


def _of_ceiling(r: pd.Series, ceiling: float) -> str:
    if math.isnan(ceiling) or ceiling <= 0:
        return "the ceiling is not positive" if math.isnan(ceiling) else f"the ceiling, {ceiling:.2f}, is not positive"
    return f"{_frac(r)} of the ceiling {ceiling:.2f}"


def _frac(r) -> str:
    f = r["spearman_of_ceiling"] if isinstance(r, pd.Series) else r.spearman_of_ceiling
    return "n/a" if f is None or math.isnan(f) else pct(f)


def _change(first: pd.Series, last: pd.Series) -> str:
    """Whether agreement falls from the first to the last horizon, claimed only when the 95% intervals are apart."""
    if any(math.isnan(v) for v in (first.spearman_low, first.spearman_high, last.spearman_low, last.spearman_high)):
        return "too few seeds to say whether it changes with the horizon"
    if last.spearman_high < first.spearman_low:
        return "lower at the last horizon than at the first (the 95% intervals do not overlap)"
    if last.spearman_low > first.spearman_high:
        return "higher at the last horizon than at the first (the 95% intervals do not overlap)"
    return "the intervals at the first and last horizon overlap: no change is shown"


def estimator_text(a: Attributed) -> str:
    secs = a.meta.get("seconds", {})
    rows = []
    for e in dict.fromkeys(a.df.estimator):
        spec = ESTIMATORS.get(e)
        per = secs.get(e, {})
        rows.append([e, spec.summary if spec else "", spec.horizon if spec else "",
                     fmt_num(sum(per.values()) / len(per)) if per else "n/a"])
    where = a.meta.get("influence_at", "horizon")
    return (md_table(["estimator", "what it computes", "its own horizon", "seconds per seed"], rows) + "\n\n"
            f"EK-FAC/K-FAC were evaluated at {'the twin weights of each horizon' if where == 'horizon' else 'θ_s'} "
            "(kronfluence; the blocks' Linear modules only: embeddings, LayerNorms and the tied output head are not "
            "tracked). Correlations and sign agreement do not depend on an estimator's scale; a scatter's y axis does.")
