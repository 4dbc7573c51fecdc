"""Additivity: is the effect of two rows at once the sum of their single-row effects?

Group benchmarks (the linear datamodeling score, LDS) score an attribution method by summing its
per-example estimates over a subset and correlating the sums with retrained models: they assume
that effects add. The bank tests that one example at a time. A *pair* (``candidates.pairs``, arm
``pair.<first>..<second>``) carries c₁ in row r (``injection_row``) and c₂ in row r′
(``replicate_row``) of the batch of s. Per seed, query q and horizon h::

    measured_pair   = L_q(pair run)        − L_q(twin)      Δ(c₁@r and c₂@r′)
    measured_first  = L_q(c₁'s run)        − L_q(twin)      Δ(c₁@r): the candidate run
    measured_second = L_q(c₂'s replicate)  − L_q(twin)      Δ(c₂@r′): the replicate run
    sum             = measured_first + measured_second
    interaction     = measured_pair − sum                   0 when the effects add

The pair and the sum replace the same two rows (r and r′), so the row each candidate displaces
cancels; what is left is the interaction of the two changes through training. The batch's
gradient at s is exactly additive in the rows; AdamW's update (√v̂) and every later step are not.
Only the *shared* queries are compared (held-out rows and probes): c₁'s run does not evaluate
c₂'s text nor c₂'s replicate c₁'s, so a candidate's own text has no sum (the pair run records
both texts all the same).

**The control.** ``swapped`` = Δ(c₁@r′) + Δ(c₂@r) (c₁'s replicate, c₂'s candidate run): the same
two candidates and the same two displaced rows, each candidate in the other row. To first order
in the batch's change it equals ``sum`` — and so does ``measured_pair`` — so the distance of
``swapped`` from ``sum`` is what second-order effects do to single-row measurements that
linearity says are the same, at the pair's own scale. (Δ(c@r) against Δ(c@r′) is no such
control: to first order they differ by the displaced rows' own effects, a term shared by the
candidates but not by the queries, so pooled over queries its slope and relative difference
measure the rows, not the non-linearity.) ``first_other_row`` = Δ(c₁@r′) and
``second_other_row`` = Δ(c₂@r) are kept for that comparison too.

:func:`additivity` summarises per query kind and horizon, within each seed over pairs × queries
and then the mean over seeds: Pearson and Spearman of ``measured_pair`` against ``sum``, the OLS
slope of ``measured_pair`` on ``sum`` (1: additive; below 1: the pair does less than its parts),
and the median relative interaction |measured_pair − sum| / (|measured_first| + |measured_second|);
the same numbers with ``swapped`` in place of ``measured_pair``, and their differences. Intervals:
percentile intervals of seeded bootstrap resamples of the pairs (one set of resamples for every
number, so the differences are paired). Pairs with the own-row control are left out of the
numbers: with it in row r the pair is bitwise the second's replicate (interaction exactly 0,
checked by the bank), which says the injection is exact, not that effects add.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.attribution.measure import beside_twin, finished_twins, warn_missing
from seedlab.attribution.rundir import Bank, BankDir, ForkFolder, open_bank
from seedlab.attribution.texts import OWN_ROW, replicate
from seedlab.reporting import fmt_num, md_table
from seedlab.stats import bootstrap_interval, slope_along, spearman_along
from seedlab.store import write_parquet

COLUMNS = ["seed", "pair", "first", "second", "first_kind", "second_kind", "query", "query_kind", "horizon", "after",
           "label", "measured_pair", "measured_first", "measured_second", "sum", "interaction", "first_other_row",
           "second_other_row", "swapped"]
METRICS = ("pearson", "spearman", "slope", "interaction")
PAIR, SWAPPED, DIFF = "pair", "swapped", "pair − swapped"
ALL = "all"  # every shared query, when there are several kinds
ALPHA = 0.05
RESAMPLES = 2000
SEED = 0
_BLOCK = 1_000_000  # values gathered per bootstrap chunk (memory)


def collect_pairs(bank: Bank, *, warn: bool = True) -> pd.DataFrame:
    """additivity.parquet's frame (columns :data:`COLUMNS`, module doc): one row per seed × pair ×
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
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)[COLUMNS]


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


def ordinary(df: pd.DataFrame) -> pd.DataFrame:
    """The pairs of two ordinary candidates (neither is the own-row control)."""
    return df[(df.first_kind != "control") & (df.second_kind != "control")]


# ---------------------------------------------------------------- the numbers


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r along the last axis, pairwise complete, from the two OLS slopes
    (``seedlab.stats.slope_along``): r² = b_yx · b_xy, with b_yx's sign. NaN where a side is constant."""
    b_yx, b_xy = slope_along(x, y), slope_along(y, x)
    with np.errstate(invalid="ignore"):
        return np.sign(b_yx) * np.sqrt(np.clip(b_yx * b_xy, 0.0, 1.0))


def _metrics(x: np.ndarray, y: np.ndarray, den: np.ndarray) -> dict[str, np.ndarray]:
    """Along the last axis (pairs × queries of one seed): Pearson and Spearman of y against x, the
    OLS slope of y on x, and the median of |y − x| / den (den > 0; else left out)."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: NaN
        rel = np.nanmedian(np.where(den > 0, np.abs(y - x) / den, np.nan), axis=-1)
    return {"pearson": _pearson(x, y), "spearman": spearman_along(x, y), "slope": slope_along(x, y),
            "interaction": rel}


def _seed_mean(per_seed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """[..., S] -> [...]: the mean over seeds (a seed without a value left out)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return {k: np.nanmean(v, axis=-1) for k, v in per_seed.items()}


def _numbers(pair: np.ndarray, total: np.ndarray, swapped: np.ndarray, den: np.ndarray) -> dict:
    """{comparison: {metric: [..., H]}} from arrays [..., H, S, C] (C: pairs × queries of a seed)."""
    p, s = _seed_mean(_metrics(total, pair, den)), _seed_mean(_metrics(total, swapped, den))
    return {PAIR: p, SWAPPED: s, DIFF: {m: p[m] - s[m] for m in METRICS}}


def additivity(df: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> pd.DataFrame:
    """Per query kind (and :data:`ALL` with several kinds) × comparison × horizon, over the ordinary
    pairs of additivity.parquet's frame: every metric of :data:`METRICS` (module doc) within each
    seed over pairs × queries, the mean over seeds, and its bootstrap interval over pairs
    (``<metric>_low``, ``<metric>_high``; ``resamples`` seeded by ``seed``). ``comparison``:
    :data:`PAIR` (measured_pair against sum), :data:`SWAPPED` (swapped against sum, the control)
    and :data:`DIFF` (their difference, on the same resamples). Also ``label, after, seeds, pairs,
    queries``. Empty when no ordinary pair is left."""
    d = ordinary(df)
    cols = ["query_kind", "comparison", "horizon", "label", "after",
            *(f"{m}{s}" for m in METRICS for s in ("", "_low", "_high")), "seeds", "pairs", "queries"]
    if not len(d):
        return pd.DataFrame(columns=cols)
    hs = sorted(int(h) for h in d.horizon.unique())
    seeds = sorted(int(s) for s in d.seed.unique())
    pairs = list(dict.fromkeys(d.pair))
    at = {int(r.horizon): (r.label, int(r.after)) for r in d.drop_duplicates("horizon").itertuples()}
    kinds = list(dict.fromkeys(d.query_kind))
    groups = {k: d[d.query_kind == k] for k in kinds} | ({ALL: d} if len(kinds) > 1 else {})
    idx = np.random.default_rng(seed).integers(0, len(pairs), size=(resamples, len(pairs)))
    rows = []
    for kind, g in groups.items():
        queries = list(dict.fromkeys(g["query"]))
        full = pd.MultiIndex.from_product([hs, seeds, pairs, queries])
        shape = (len(hs), len(seeds), len(pairs), len(queries))

        def grid(col: str, g=g, full=full, shape=shape) -> np.ndarray:
            return g.set_index(["horizon", "seed", "pair", "query"])[col].reindex(full).to_numpy(float).reshape(shape)

        arrays = [grid("measured_pair"), grid("sum"), grid("swapped"),
                  np.abs(grid("measured_first")) + np.abs(grid("measured_second"))]
        flat = [a.reshape(*shape[:2], -1) for a in arrays]
        point = _numbers(*flat)
        chunk = max(1, _BLOCK // max(arrays[0].size, 1))
        parts = []
        for i in range(0, resamples, chunk):
            draw = [np.moveaxis(np.take(a, idx[i:i + chunk], axis=2), 2, 0) for a in arrays]  # [b, H, S, P, Q]
            parts.append(_numbers(*(a.reshape(*a.shape[:3], -1) for a in draw)))
        boot = {c: {m: np.concatenate([p[c][m] for p in parts]) for m in METRICS} for c in point}
        for comparison in (PAIR, SWAPPED, DIFF):
            intervals = {m: bootstrap_interval(boot[comparison][m], alpha) for m in METRICS}
            for i, h in enumerate(hs):
                row = {"query_kind": kind, "comparison": comparison, "horizon": h, "label": at[h][0], "after": at[h][1]}
                for m in METRICS:
                    row |= {m: float(point[comparison][m][i]), f"{m}_low": float(intervals[m][0][i]),
                            f"{m}_high": float(intervals[m][1][i])}
                rows.append(row | {"seeds": len(seeds), "pairs": len(pairs), "queries": len(queries)})
    return pd.DataFrame(rows, columns=cols)


# ---------------------------------------------------------------- the report's section

TITLE = "## Additivity: two rows at once"
NAMES = {"pearson": "Pearson", "spearman": "Spearman", "slope": "slope (1: additive)",
         "interaction": "median relative interaction"}
HELP = (
    "A pair carries two candidates in one batch, c₁ in row r and c₂ in row r′; its effect Δ(c₁ and c₂) is set against "
    "Δ(c₁ at r) + Δ(c₂ at r′) (the candidate run and the replicate, which displace the same two rows) on the shared "
    "queries (a candidate's own text is not measured by the other's run). Per seed over pairs × queries, then the mean "
    "over seeds: Pearson and Spearman of the pair's Δ against the sum, the OLS slope of the pair's Δ on the sum, and the "
    "median of |Δ(pair) − sum| / (|Δ(c₁)| + |Δ(c₂)|). **swapped**, the control: the same numbers for Δ(c₁ at r′) + "
    "Δ(c₂ at r) against the sum — equal to it to first order, as the pair is — i.e. how far two single-row "
    "measurements that linearity calls equal move apart. **pair − swapped**: the difference (positive interaction: "
    "the pair departs from additivity more than swapping rows does). Cells: value [95% bootstrap interval over pairs].")


def _cell(r, m: str) -> str:
    v, lo, hi = r[m], r[f"{m}_low"], r[f"{m}_high"]
    if math.isnan(v):
        return "n/a"
    return fmt_num(v) + ("" if math.isnan(lo) else f" [{fmt_num(lo)}, {fmt_num(hi)}]")


def _table(g: pd.DataFrame) -> str:
    hs = g.drop_duplicates("horizon").sort_values("horizon")
    rows = []
    for m in METRICS:
        for c in (PAIR, SWAPPED, DIFF):
            gc = g[g.comparison == c].set_index("horizon")
            rows.append([NAMES[m] if c == PAIR else "", c, *(_cell(gc.loc[h], m) for h in hs.horizon)])
    n = g.iloc[0]
    return (f"{n.seeds} seed(s), {n.pairs} pair(s), {n.queries} quer{'y' if n.queries == 1 else 'ies'}.\n\n"
            + md_table(["", "comparison", *(f"{r.label} ({r.horizon})" for r in hs.itertuples())], rows))


def _span(g: pd.DataFrame, m: str) -> str:
    """The metric at the first horizon, and at the last when there are several."""
    first, last = g.iloc[0], g.iloc[-1]
    if len(g) == 1:
        return f"{fmt_num(first[m])} at {first.label}"
    return f"{fmt_num(first[m])} at {first.label} … {fmt_num(last[m])} at {last.label}"


def answer(stats: pd.DataFrame) -> str:
    """The one-sentence answer: over every shared query, the median relative interaction of the
    pair beside the swapped control, and where the difference's interval lies above 0."""
    kind = ALL if (stats.query_kind == ALL).any() else stats.query_kind.iloc[0]
    g = stats[stats.query_kind == kind].sort_values("horizon")
    pair, swapped, diff = (g[g.comparison == c] for c in (PAIR, SWAPPED, DIFF))
    above = list(diff[diff.interaction_low > 0].label)
    verdict = ("not clearly more than the two candidates swapping rows moves the sum (the 95% interval of the "
               "difference reaches 0 at every horizon)" if not above else
               "more than the two candidates swapping rows moves the sum, at every horizon" if len(above) == len(diff)
               else f"more than the two candidates swapping rows moves the sum at {', '.join(above)}, not clearly "
                    "more at the other horizons")
    what = "the shared queries" if kind == ALL else f"the {kind} queries"
    n = g.iloc[0]
    return (f"Over {n.pairs} pair(s) and {n.seeds} seed(s), a pair's effect on {what} departs from the sum of its two "
            f"single-row effects by a median relative interaction |Δ(pair) − sum| / (|Δ(c₁)| + |Δ(c₂)|) of "
            f"{_span(pair, 'interaction')} (against {_span(swapped, 'interaction')} for the sum with the two "
            f"candidates' rows swapped; slope of the pair's Δ on the sum {_span(pair, 'slope')}): {verdict}.")


def additivity_section(frame_or_root: pd.DataFrame | str | Path, *, resamples: int = RESAMPLES, seed: int = SEED,
                       alpha: float = ALPHA) -> str:
    """The report's section (markdown, its own ``##`` title first): the one-sentence answer, the
    exact own-row pairs, then per query kind the table of :func:`additivity` by horizon.
    ``frame_or_root``: additivity.parquet's frame, or a bank folder; a folder without
    additivity.parquet (a bank without pairs) gives "" (nothing to add)."""
    if isinstance(frame_or_root, pd.DataFrame):
        df = frame_or_root
    else:
        path = BankDir(Path(frame_or_root)).additivity
        if not path.is_file():
            return ""
        df = pd.read_parquet(path)
    if not len(df):
        return f"{TITLE}\n\nNo pair run finished: nothing to compare."
    out = [TITLE]
    stats = additivity(df, resamples=resamples, seed=seed, alpha=alpha)
    out.append(answer(stats) if len(stats) else "Every pair holds the own-row control: no ordinary pair to compare.")
    own = df[df["first"] == OWN_ROW]
    if len(own):
        exact = bool((own.interaction == 0).all() and (own.measured_first == 0).all())
        out.append(f"Own-row pairs ({', '.join(dict.fromkeys(own.pair))}): with row r replaced by itself the pair is "
                   f"its second's replicate, so Δ(pair) = Δ(c₂ at r′) and the interaction is exactly 0 at every seed, "
                   f"query and horizon: {'yes' if exact else 'NO'}.")
    if len(stats):
        out.append(HELP)
        for kind, g in stats.groupby("query_kind", sort=False):
            out.append(f"### {'every shared query' if kind == ALL else f'{kind} queries'}\n\n{_table(g)}")
    return "\n\n".join(out)
