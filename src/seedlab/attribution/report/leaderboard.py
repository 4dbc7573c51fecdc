"""``seedlab attribution leaderboard``'s table, words and figure: what attribution/analyses/leaderboard.py computed
across banks and exports, rendered — ``leaderboard.md`` (the banks, the table with every interval and ceiling, who
leads each column and whether its interval is apart from the others', the figure, the other query kinds),
``leaderboard-table.csv`` (the whole long table) and ``leaderboard-grid.png`` (a dot and its interval per estimator
and bank, a panel per column). It computes nothing: every number is the analyses module's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from seedlab.attribution.analyses.leaderboard import (CEILING, COST_ROWS, COST_SWAPS, LDS, LOO, METRICS, NOT_MEASURED,
                                                      SINGLE, TRAK_LDS, Board)
from seedlab.attribution.bank.rundir import LeaderboardDir
from seedlab.reporting import Fig, figure_block, fmt_ci, fmt_num, level, md_table, save_figure
from seedlab.store import atomic_write, write_text

DASH = "—"  # the bank has no such number (not run, or not scored)
HEAD = {SINGLE: "ρ {}", LOO: "LOO {}", LDS: "LDS {}", TRAK_LDS: "TRAK LDS {}"}
KIND_TEXT = {"self": "the candidates' own text", "heldout": "held-out rows", "probe": "probes",
             "all": "every query kind pooled"}
#: what the ceiling is the √ of, per metric (in parentheses beside it)
RETEST_NAME = {SINGLE: "ρ_rep", LOO: "retest", LDS: "retest", TRAK_LDS: "reliability"}
ROLE_ORDER = {"ceiling": 0, "estimator": 1, "variant": 1, "plug-in": 1, "reference": 2, "baseline": 3}


def _help(b: Board) -> str:
    lv = level(b.alpha)
    return (
        f"Cells: the value [{lv} interval] as the analyses modules compute it; {DASH}: the bank has no such number "
        "(not run, or not scored); n/a: scored, but the correlation is undefined there (the estimate is constant "
        "over what it ranks, as truncated metagrad's 0 for every row older than its window). **ρ h** (single rows): per seed, query and horizon h the Spearman over candidates "
        "between the estimate and the measured effect of swapping one row at s, the mean over the kind's queries, "
        "then over seeds (the bank report's headline, within seed; bootstrap over candidates). **LOO age a** "
        "(leave-one-out): one training row removed and the run trained to the end, read on every query; per seed "
        "and query the Spearman over the removed rows of the band's age at the end (end − t), the mean over "
        "queries, then over seeds (loo.py's ρ within queries; bootstrap over seeds, then rows). **LDS α** (the "
        "single-model LDS, MAGIC's): random subsets of α of the rows after s removed from one deterministic run, "
        "a subset's prediction the sum of its rows'; per seed and query the Spearman over subsets, the mean over "
        "queries, then over seeds (lds.py; bootstrap over seeds, then subsets). **TRAK LDS keep k** (TRAK's: "
        "random subsets keeping k of the rows after s, each retrained from the prefix a few times — the later "
        "retrainings nudged at s, the training seed here — and its effects averaged; a subset's prediction the sum "
        "of its removed rows'; the same Spearman and bootstrap): where the bank has it. **ceiling** (test–retest of "
        "the target): for single rows √ρ_rep [its interval] (ρ_rep, the row invariance: the same candidate's effect "
        "from another row of the batch) — no predictor that ranks a candidate the same whichever row it replaces "
        "correlates beyond it; for leave-one-out and the single-model LDS √ of the retest (the same rows removed "
        "again from the twin nudged by one ulp at s, its effects correlated with the twin's as the metric "
        "correlates an estimator's), for the TRAK LDS √ of its retrainings' reliability (their test–retest stepped "
        f"up to their mean); *{NOT_MEASURED}* where the bank has no such retest. **Cost**: each estimator's wall "
        "seconds per seed as its command recorded them (the estimators at θ_s share one set of gradients, which the "
        "first of them pays for; a training-rows estimator computed in another's pass costs that pass) and, in "
        "parentheses, "
        "that many training runs of the bank (its own training clock, training.json; none where not recorded). "
        "Estimators in italics are baselines, in bold references (never a column's leader). Exploratory unless a "
        "pre-registration names the number.")


def _name(e: str, role: str) -> str:
    if role == "ceiling":
        return "**ceiling** (test–retest)"
    return f"*{e}*" if role == "baseline" else f"**{e}**" if role == "reference" else e


def _cell(r) -> str:
    if r is None:
        return DASH
    if r.note:
        return r.note
    if r.metric in (COST_SWAPS, COST_ROWS):
        run = "" if math.isnan(r.per_run) else f" ({fmt_num(r.per_run)}×)"
        return f"{fmt_num(r.seconds)} s{run}"
    text = fmt_ci(r.value, r.low, r.high)
    if r.role != "ceiling" or math.isnan(r.retest):
        return text
    return f"{text} ({RETEST_NAME.get(r.metric, 'retest')} {fmt_ci(r.retest)})"


def _columns(t: pd.DataFrame, kinds: dict[str, str | None]) -> list[tuple[str, str, str]]:
    """(metric, query kind, where) of every column of the section, in the metrics' order, then by where."""
    out = []
    for m in METRICS:
        kind = kinds.get("single" if m == SINGLE else "rows")
        g = t[(t.metric == m) & (t.query_kind == kind)] if kind is not None else t.iloc[:0]
        for at, _ in g.groupby("setting", sort=False).order.min().sort_values(kind="stable").items():
            out.append((m, kind, at))
    return out


def _among(t: pd.DataFrame, keys) -> pd.Series:
    """Which rows of ``t`` lie at one of ``keys``: (metric, query kind, setting)."""
    keys = set(keys)
    return pd.Series([k in keys for k in zip(t.metric, t.query_kind, t.setting)], index=t.index, dtype=bool)


def _estimators(t: pd.DataFrame) -> list[tuple[str, str]]:
    """(estimator, role) in the table's order: the ceiling, the estimators, the references, the baselines."""
    first = t.drop_duplicates("estimator")
    first = first.assign(o=first.role.map(ROLE_ORDER).fillna(1))
    return [(r.estimator, r.role) for r in first.sort_values("o", kind="stable").itertuples()]


def board_table(b: Board, kinds: dict[str, str | None], costs: bool) -> str:
    """One table: a row per estimator × bank (the ceiling first), a column per metric × where of ``kinds``' query
    kinds (and, with ``costs``, the two cost columns)."""
    t = b.table
    cols = _columns(t, kinds)
    cost = [c for c in (COST_SWAPS, COST_ROWS) if costs and (t.metric == c).any()]
    sel = t[_among(t, cols) | t.metric.isin(cost)]
    cells = {(r.estimator, r.column, r.metric, r.query_kind, r.setting): r for r in sel.itertuples()}
    rows = []
    for e, role in _estimators(sel):
        first = True
        for c in b.columns:
            mine = [cells.get((e, c, m, k, at)) for m, k, at in cols] + [cells.get((e, c, m, "", "")) for m in cost]
            if all(x is None for x in mine):
                continue
            rows.append([_name(e, role) if first else "", c, *map(_cell, mine)])
            first = False
    header = ["estimator", "bank", *(HEAD[m].format(at) for m, _, at in cols),
              *("swaps: s per seed (× run)" if m == COST_SWAPS else "rows: s per seed (× run)" for m in cost)]
    return md_table(header, rows) if rows else "Nothing scored for these query kinds."


def cost_notes(b: Board) -> str:
    """What each training-rows estimator's cost covers, per bank (the analyses' ``detail``): the work differs between
    estimators, so the cost column compares like for like only where these agree."""
    t = b.table[(b.table.metric == COST_ROWS) & (b.table.detail.fillna("") != "")]
    if not len(t):
        return ""
    lines = []
    for e, g in t.groupby("estimator", sort=False):
        per = "; ".join(f"{r.column}: {r.detail}" for r in g.itertuples())
        lines.append(f"- {e} — {per}")
    return ("What a training-rows cost covers (one seed; the rows × queries × horizons scored). metagrad's one "
            "reverse pass serves every query at once; one query at one horizon beside one training run, like for "
            "like, is in docs/benchmarks.md.\n\n" + "\n".join(lines))


def _what(kinds: dict[str, str | None]) -> str:
    parts = []
    if kinds.get("single"):
        parts.append(f"single rows on {KIND_TEXT.get(kinds['single'], kinds['single'])}")
    if kinds.get("rows"):
        parts.append(f"removals on {KIND_TEXT.get(kinds['rows'], kinds['rows'])}")
    return "; ".join(parts)


def _where(metric: str, at: str) -> str:
    return HEAD[metric].format(at)


def standings_text(b: Board) -> str:
    """Per column of the headline (its query kinds), per bank: the leader by point value and whether its interval
    is apart from every other's, or which it overlaps (a tie at this resolution)."""
    s = b.standings
    lines = []
    for m, k, at in _columns(b.table, b.main):
        g = s[(s.metric == m) & (s.query_kind == k) & (s.setting == at)]
        parts = []
        for c in b.columns:
            r = g[g.column == c]
            if not len(r):
                continue
            r = r.iloc[0]
            head = f"{r.leader} {fmt_ci(r.value, r.low, r.high)}"
            if r.competitors == 1:
                parts.append(f"{c}: {head}, the only estimator scored")
            elif r.separated:
                parts.append(f"{c}: **{r.leader}** first, {fmt_ci(r.value, r.low, r.high)}, its interval above every "
                             "other estimator's")
            elif r.tied:
                parts.append(f"{c}: {head} has the highest point value but its interval overlaps "
                             f"{', '.join(r.tied)}'s: tied at this resolution")
            else:
                parts.append(f"{c}: {head} has the highest point value; no other interval reaches its lower end, but "
                             "not every other interval is defined")
        if parts:
            lines.append(f"- **{_where(m, at)}** — " + "; ".join(parts) + ".")
    if not lines:
        return "No column with two estimators to compare."
    return ("Who leads each column, by point value (references and the ceiling aside, baselines included): *first* only "
            "where its interval lies above every other estimator's in that bank; otherwise the estimators whose "
            "intervals overlap the leader's are named, a tie at this resolution. No test of a difference is made "
            "here.\n\n" + "\n".join(lines))


def banks_table(b: Board) -> str:
    rows = []
    for r in b.designs.itertuples():
        scored = ", ".join(n for n, have in (("swaps", r.swaps), ("leave-one-out", r.loo), ("groups", r.groups),
                                             ("TRAK subsets", r.trak), ("retests", r.retest)) if have)
        run = "not recorded" if math.isnan(r.run_seconds) else f"{fmt_num(r.run_seconds)} s"
        n = lambda v: DASH if isinstance(v, float) and math.isnan(v) else str(int(v))
        rows.append([r.column, f"`{r.source}`", r.kind, str(r.s), r.seeds, n(r.candidates), n(r.queries), scored, run])
    return md_table(["bank", "folder", "kind", "s", "seeds", "candidates", "queries", "measured", "one training run"],
                    rows)


def leaderboard_text(b: Board, figure: Fig) -> str:
    kinds = {f: sorted(set(b.table[b.table.metric.isin([SINGLE] if f == "single" else [LOO, LDS, TRAK_LDS])]
                               .query_kind) - {""}) for f in ("single", "rows")}
    out = [f"# Attribution leaderboard: {len(b.sources)} bank(s)",
           "Every estimator against every bank's measured effects, on the metrics the analyses compute, each beside "
           "the bank's own ceiling and the estimator's cost. One design (model, corpus, candidates, queries); the "
           "columns' banks differ in rows per batch B, rate and steps.",
           "## The banks", banks_table(b),
           f"## The table ({_what(b.main)})", _help(b), board_table(b, b.main, costs=True),
           *filter(None, [cost_notes(b)]),
           "## Who leads each column", standings_text(b),
           "## Figure", figure_block(figure)]
    for k in dict.fromkeys([*kinds["single"], *kinds["rows"]]):
        sel = {"single": k if k in kinds["single"] and k != b.main["single"] else None,
               "rows": k if k in kinds["rows"] and k != b.main["rows"] else None}
        if sel["single"] or sel["rows"]:
            out += [f"## {_what(sel)[0].upper()}{_what(sel)[1:]}", board_table(b, sel, costs=False)]
    out.append("The whole table, every query kind and the seeds and counts behind each cell: `leaderboard-table.csv`.")
    return "\n\n".join(out) + "\n"


# ---------------------------------------------------------------- the figure

MARKERS = ("o", "s", "^", "D", "v")
FAMILIES = ((SINGLE,), (LOO,), (LDS, TRAK_LDS))  # a line of panels each


def _style(j: int) -> tuple[str, str]:
    """Bank j's colour and marker (distinct for 50 banks)."""
    return f"C{j % 10}", MARKERS[(j // 10) % len(MARKERS)]


def grid_figure(b: Board, where: LeaderboardDir) -> tuple[Fig, object | None]:
    """A panel per column of the headline table (its query kinds), a line of panels per kind of metric (single rows,
    leave-one-out, the LDS): the line's estimators down, the value across, one dot and its interval per bank (a
    colour each), the ceiling on top where measured. Returns (the Fig, the matplotlib figure to save; None when
    there is nothing to draw)."""
    title = "Every estimator on every bank"
    t = b.table
    panels = [(m, k, at) for m, k, at in _columns(t, b.main)
              if t[(t.metric == m) & (t.query_kind == k) & (t.setting == at)].value.notna().any()]
    if not panels:
        return Fig(title, None, "no metric with a value to draw"), None
    from matplotlib.figure import Figure

    drawn = t[_among(t, panels) & t.value.notna()]
    families = [f for f in FAMILIES if any(m in f for m, _, _ in panels)]
    ncols = min(4, max(sum(m in f for m, _, _ in panels) for f in families))
    lines, names = [], {}  # lines: (family, its panels on the line)
    for f in families:
        mine = [p for p in panels if p[0] in f]
        names[f] = _estimators(drawn[drawn.metric.isin(f)])
        lines += [(f, mine[i:i + ncols]) for i in range(0, len(mine), ncols)]
    ratios = [0.24 * len(names[f]) + 0.9 for f, _ in lines]
    w, h = 1.6 + 2.9 * ncols, sum(ratios) + 0.7
    w, h = max(w, h / 3), max(h, w / 3)
    fig = Figure(figsize=(w, h), layout="constrained")
    grid = fig.subplots(len(lines), ncols, squeeze=False, gridspec_kw={"height_ratios": ratios})
    handles: dict[str, object] = {}
    n_src = len(b.columns)
    for (f, line), axes in zip(lines, grid):
        y = {e: i for i, (e, _) in enumerate(names[f])}
        for i, (ax, (m, k, at)) in enumerate(zip(axes, line)):
            g = drawn[(drawn.metric == m) & (drawn.query_kind == k) & (drawn.setting == at)]
            for j, c in enumerate(b.columns):
                gc = g[g.column == c]
                if not len(gc):
                    continue
                color, marker = _style(j)
                ys = [y[e] + (j - (n_src - 1) / 2) * 0.7 / n_src for e in gc.estimator]
                lo = (gc.value - gc.low).fillna(0).clip(lower=0)
                hi = (gc.high - gc.value).fillna(0).clip(lower=0)
                handles.setdefault(c, ax.errorbar(gc.value, ys, xerr=[lo, hi], fmt=marker, ms=4, color=color,
                                                  capsize=1.5, lw=0.9))
            ax.axvline(0, color="0.6", lw=0.6)
            ax.set(xlim=(-1.05, 1.05), ylim=(len(y) - 0.5, -0.5), title=f"{_where(m, at)} ({k})")
            ax.set_yticks(range(len(y)), [CEILING if role == "ceiling" else e for e, role in names[f]] if i == 0
                          else [])
            ax.title.set_fontsize(8)
            ax.tick_params(labelsize=7)
        for ax in axes[len(line):]:
            ax.set_visible(False)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(3, len(handles)),
               fontsize=7)
    caption = (f"Each dot is one estimator on one bank (colour), with its {level(b.alpha)} interval: the table's "
               f"headline columns ({_what(b.main)}), a line of panels per kind of metric; the top row of a line is "
               f"the bank's ceiling where it was measured (√ρ_rep for single rows; {NOT_MEASURED} otherwise, no "
               "dot). A row without a dot: the bank has no such number. The grey line is 0.")
    return Fig(title, where.figure("grid"), caption), fig


# ---------------------------------------------------------------- writing


def write_leaderboard(b: Board, out: str | Path) -> Path:
    """``out``/leaderboard.md, leaderboard-table.csv and leaderboard-grid.png (module doc); returns the markdown's
    path. Everything is rendered before the first file is written."""
    where = LeaderboardDir(Path(out))
    fig, drawing = grid_figure(b, where)
    text = leaderboard_text(b, fig)
    table = b.table.merge(b.designs[["column", "B", "lr", "steps", "s"]], on="column", how="left")
    where.root.mkdir(parents=True, exist_ok=True)
    if drawing is not None:
        save_figure(drawing, where.figure("grid"))
    atomic_write(where.table("table"), lambda p: table.to_csv(p, index=False))
    return write_text(where.report, text)
