"""The decisions of docs/preregistration/twins-dose.md on a measured (and reported) run of the preset
twins/dose-b16-lr5e-3: dose-b16's design at peak lr 5e-3 on fresh seeds 5000-5007 (confirmatory).

Everything is computed from the run's own tables by twins/dose.py (``dose.summarize``): the distance's ordinary-rows
line (per seed an OLS line of log10 distance on log10 dose through the seed's ordinary arms), each arm's per-seed
residual from its own seed's line, the line's per-seed slopes. Three tests, one family, Holm at a family-wise 0.05
(over the tests decided); each p from t distributions on n − 1 degrees of freedom, n the seeds:

| id | statistic | confirmed when (Holm-adjusted p < 0.05) |
|---|---|---|
| D1 | fluent-fabricated's mean log10 residual r̄ (weight 1) | TOST: both H0 r̄ ≤ −log10 1.25 and H0 r̄ ≥ +log10 1.25 rejected; p = the larger of the two one-sided p (the 90 % t interval inside [log10 0.8, log10 1.25]) |
| D2 | weight-kick's mean log10 residual | one-sided t: H0 r̄ ≥ 0 rejected (below the line) |
| D3 | the line's exponent b̄ (mean of the per-seed slopes) | both H0 b̄ ≤ 0 and H0 b̄ ≥ 1.5 rejected; p = the larger of the two one-sided p |

A test is **undecided** (no p, no share of the family) when its statistic cannot be computed: no arm recorded a dose,
the distance has no line or is not on log10–log10 scales (dose.py's rule), the arm (or the line) is not on every seed
of the run's design. Undecided is not failed, and a failed test stays failed.

    python experiments/twins_dose_prereg.py runs/dose-confirm [--json FILE] [--out FILE.md] [--exploratory]

writes the verdict to RUN/dose-prereg-verdict.json (``--json`` elsewhere) and prints the table. A run that is not the
pre-registered design (its seeds, peak_lr, min_lr) is refused unless ``--exploratory``, which labels every number
exploratory (the check on runs/dose-b16, seeds 0-3, the cell the hypotheses came from). :func:`decide` computes from a
``dose.DoseResponse`` (tested in tests/twins/test_dose_prereg.py on synthetic tables); :func:`main` reads the run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

PREREGISTRATION = "docs/preregistration/twins-dose.md"
PRESET = "twins/dose-b16-lr5e-3"
FAMILY = 0.05  # Holm's family-wise error rate
MEASURE = "distance"  # the end measure every test reads (the weight distance to the twin at the end)
SCALE = "log-log"  # the fit every test reads; on another scale the tests are undecided
PASSAGE = "fluent-fabricated"  # D1: the passage at row weight 1
KICK = "weight-kick"  # D2
MARGIN = math.log10(1.25)  # D1: ±log10 1.25 (log10 0.8 = −log10 1.25): the passage within x0.8 .. x1.25 of its line
EXPONENT = (0.0, 1.5)  # D3: the exponent's bounds, both excluded
#: the pre-registered design: dose-b16 with these (every other field dose-b16's; the preset twins/dose-b16-lr5e-3)
DESIGN = {"seeds": [5000, 5001, 5002, 5003, 5004, 5005, 5006, 5007], "peak_lr": 5e-3, "min_lr": 5e-4}
VERDICT = "dose-prereg-verdict.json"  # written into the run folder
COLUMNS = ["id", "hypothesis", "statistic", "value", "factor", "low90", "high90", "n", "p", "holm_p", "threshold",
           "confirmed", "note"]


# ---------------------------------------------------------------- the statistics


def _mean_se(values) -> tuple[float, float, int]:
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan, n


def p_below(values, bound: float) -> float:
    """One-sided one-sample t-test's p of H0 mean ≥ ``bound`` against H1 mean < ``bound``."""
    m, se, n = _mean_se(values)
    if n < 2:
        return math.nan
    if se == 0:
        return 0.0 if m < bound else 1.0
    return float(sps.t.cdf((m - bound) / se, n - 1))


def p_above(values, bound: float) -> float:
    """One-sided one-sample t-test's p of H0 mean ≤ ``bound`` against H1 mean > ``bound``."""
    return p_below(-np.asarray(values, dtype=np.float64), -bound)


def p_between(values, low: float, high: float) -> float:
    """Two one-sided tests (intersection-union): the larger of p(mean > low) and p(mean < high); below α exactly
    when the two-sided 1 − 2α t interval lies inside (low, high)."""
    a, b = p_above(values, low), p_below(values, high)
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


def interval90(values) -> tuple[float, float]:
    """The 90 % t interval of the mean (the one the TOST at 0.05 reads), by twins/dose.py's ``t_interval``."""
    from seedlab.twins import dose

    ci = dose.t_interval(np.asarray(values, dtype=np.float64), alpha=0.10)
    return float(ci.low), float(ci.high)


def holm_decided(p: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values (twins/stats.py ``holm``) over the tests decided; an undecided test (NaN) takes no
    share of the family and stays NaN."""
    from seedlab.twins.stats import holm

    p = np.asarray(p, dtype=np.float64)
    out = np.full(len(p), np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = holm(p[ok])
    return out.tolist()


# ---------------------------------------------------------------- what the tests read of dose.py's tables


def seed_residuals(dr, condition: str, measure: str = MEASURE) -> pd.Series:
    """``condition``'s residual from its own seed's ordinary-rows line of ``measure`` on every fitted seed where it
    was measured (dose.py ``residuals``' unit, before the mean): log10 value − the seed's line at the arm's dose
    (on log10–log10 scales), indexed by seed. Its mean is the residual table's ``resid`` (checked by :func:`decide`)."""
    ln = dr.lines[measure]
    t = dr.table
    g = t[(t.condition == condition) & t.seed.isin(ln.seeds) & np.isfinite(t[measure])]
    if ln.scale == "log-log":
        g = g[(g[measure] > 0) & (g.dose > 0)]
    on = np.log10 if ln.scale == "log-log" else float
    values = [float(on(y)) - ln.at(int(s), x) for s, x, y in zip(g.seed, g.dose, g[measure])]
    return pd.Series(values, index=g.seed.astype(int).to_numpy(), name=condition, dtype=float)


def _why_not(dr, seeds: Sequence[int] | None) -> str | None:
    """Why no test can be decided on the run (None when the line is there)."""
    if dr is None:
        return "no arm recorded its dose at s (dose.json): nothing to fit"
    ln = dr.lines.get(MEASURE)
    if ln is None or not ln.fitted:
        return f"the {MEASURE} has no ordinary-rows line ({ln.note if ln is not None else 'not measured'})"
    if ln.scale != SCALE:
        return f"the {MEASURE}'s line is not on log10–log10 scales ({ln.rule})"
    if seeds is not None and sorted(ln.seeds) != sorted(seeds):
        missing = sorted(set(seeds) - set(ln.seeds))
        return f"the {MEASURE}'s line is not on every seed of the design (missing {missing}): no decision on a subset"
    return None


def _residual_test(dr, condition: str, seeds: Sequence[int] | None) -> tuple[pd.Series | None, str]:
    r = seed_residuals(dr, condition)
    want = sorted(seeds) if seeds is not None else sorted(dr.lines[MEASURE].seeds)
    if sorted(r.index) != want:
        return None, f"{condition} measured on seeds {sorted(r.index)}, the design's are {want}: no decision on a subset"
    row = dr.residuals[(dr.residuals.measure == MEASURE) & (dr.residuals.condition == condition)]
    if not len(row) or not math.isclose(float(row.resid.iloc[0]), float(r.mean()), rel_tol=1e-9, abs_tol=1e-12):
        raise RuntimeError(f"{condition}: the per-seed residuals' mean {r.mean()!r} is not dose.residuals' "
                           f"{row.resid.tolist()!r}: this script and twins/dose.py disagree")
    return r, ""


def decide(dr, seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """:data:`COLUMNS`, one row per test (module doc) from ``dr`` (``dose.summarize`` of the run, or
    ``dose.dose_response`` of a table; None: no dose recorded). ``seeds``: the design's seeds, every one of which a
    decided test must rest on (None: the line's). ``confirmed`` is None where the test is undecided."""
    why = _why_not(dr, seeds)
    rows = []
    hyp = {"D1": f"{PASSAGE}'s end distance is where its dose puts it on the ordinary rows' line (within ×0.8 .. ×1.25)",
           "D2": f"{KICK} (the passage's ‖Δθ_(s+1)‖ in the weights alone) ends below the ordinary rows' line",
           "D3": "the ordinary rows' distance exponent (mean of the per-seed slopes, log–log) lies in (0, 1.5)"}
    stat = {"D1": f"mean log10 residual of {PASSAGE} (weight 1) from its seed's line",
            "D2": f"mean log10 residual of {KICK} from its seed's line",
            "D3": "mean of the per-seed slopes of log10 distance on log10 dose (ordinary arms)"}
    thr = {"D1": f"−{MARGIN:.5f} < r̄ < {MARGIN:.5f} = log10 1.25 (TOST)", "D2": "r̄ < 0 (one-sided t)",
           "D3": f"{EXPONENT[0]:g} < b̄ < {EXPONENT[1]:g} (two one-sided t)"}
    for i in ("D1", "D2", "D3"):
        values, note = None, why or ""
        if why is None:
            if i == "D3":
                values = pd.Series(dr.lines[MEASURE].slopes, index=dr.lines[MEASURE].seeds)
            else:
                values, note = _residual_test(dr, PASSAGE if i == "D1" else KICK, seeds)
        if values is None:
            rows.append([i, hyp[i], stat[i], math.nan, math.nan, math.nan, math.nan, 0, math.nan, math.nan, thr[i],
                         None, note])
            continue
        v = values.to_numpy(dtype=float)
        p = p_between(v, -MARGIN, MARGIN) if i == "D1" else p_below(v, 0.0) if i == "D2" else p_between(v, *EXPONENT)
        lo, hi = interval90(v)
        m = float(v.mean())
        rows.append([i, hyp[i], stat[i], m, 10 ** m if i != "D3" else math.nan, lo, hi, len(v), p, math.nan, thr[i],
                     None, ""])
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["holm_p"] = holm_decided(out.p.tolist())
    out["confirmed"] = pd.Series([None if math.isnan(q) else bool(q < FAMILY) for q in out.holm_p], dtype=object)
    return out


def beside(dr) -> dict:
    """What is reported beside the decisions (no decision): the distance's line (its exponent's 95 % interval,
    scatter), every arm's distance residual as dose.py's table gives it (95 % interval, Holm over that table), and
    how often the passage's dose lay outside the ordinary rows' on a seed."""
    if dr is None:
        return {}
    lines = dr.line_rows.set_index("measure")
    res = dr.residuals[dr.residuals.measure == MEASURE]
    keep = ["condition", "role", "weight", "n", "outside", "dose", "value", "line", "resid", "low", "high", "p",
            "p_holm", "verdict"]
    return {"line": {k: _plain(v) for k, v in lines.loc[MEASURE].items()} if MEASURE in lines.index else None,
            "residuals": [{k: _plain(v) for k, v in r.items()} for r in res[keep].to_dict("records")]}


def _plain(v):
    if isinstance(v, (np.floating, float)):
        return None if math.isnan(v) else float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def render(d: pd.DataFrame, exploratory: bool = False) -> str:
    """The decisions as a markdown table (exploratory: the words say the numbers decide nothing)."""
    from seedlab.reporting import fmt_num, md_table

    words = ({True: "passes (exploratory)", False: "does not pass (exploratory)", None: "undecided"} if exploratory
             else {True: "**confirmed**", False: "**not confirmed**", None: "undecided"})
    rows = [[r.id, r.statistic, fmt_num(r.value), "" if math.isnan(r.factor) else f"×{r.factor:.3g}",
             "" if math.isnan(r.low90) else f"[{fmt_num(r.low90)}, {fmt_num(r.high90)}]", str(r.n), r.threshold,
             fmt_num(r.p), fmt_num(r.holm_p), words[r.confirmed] + (f" ({r.note})" if r.note else "")]
            for r in d.itertuples()]
    head = ("*Exploratory: not the pre-registered design; these numbers decide nothing.*\n\n" if exploratory else "")
    return head + md_table(["id", "statistic", "value", "as a factor", "90 % t interval", "seeds", "confirmed when",
                            "p", "Holm p", "verdict"], rows)


def render_beside(dr) -> str:
    """Reported beside (no decision): the distance's line and every arm's residual as twins/dose.py words it."""
    from seedlab.reporting import fmt_num, md_table

    b = beside(dr)
    if not b or b["line"] is None or not b["line"]["fitted"]:
        return "*Beside: no distance line.*"
    ln = b["line"]
    head = (f"Beside (no decision): the ordinary rows' distance line, exponent {fmt_num(ln['slope'])} "
            f"[{fmt_num(ln['slope_low'])}, {fmt_num(ln['slope_high'])}] (95 % t over {ln['seeds']} seeds, "
            f"{ln['points']} points, scatter {fmt_num(ln['scatter'])} in log10); every arm's residual as twins/dose.py's "
            "table gives it (95 % t interval, the two-sided p before the report's Holm over every measure's rows):")
    rows = [[f"`{r['condition']}`", r["role"], str(r["n"]), str(r["outside"]), fmt_num(r["value"]), fmt_num(r["line"]),
             "" if r["resid"] is None else f"×{10 ** r['resid']:.3g} [{10 ** r['low']:.3g}, {10 ** r['high']:.3g}]"
             if r["low"] is not None else "", fmt_num(r["p"]), r["verdict"]] for r in b["residuals"]]
    return head + "\n\n" + md_table(["arm", "role", "seeds", "dose outside the ordinary rows'", "distance",
                                      "the line at its dose", "factor [95 %]", "p (two-sided)", "words"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a measured run folder of the preset twins/dose-b16-lr5e-3")
    p.add_argument("--json", type=Path, help=f"the verdict's JSON (default RUN/{VERDICT})")
    p.add_argument("--out", type=Path, help="also write the table (markdown)")
    p.add_argument("--exploratory", action="store_true",
                   help="decide on a run that is not the pre-registered design, every number labelled exploratory")
    a = p.parse_args(argv)
    from seedlab.errors import SeedlabError
    from seedlab.twins import dose
    from seedlab.twins.rundir import DOSE_TABLES, Measured

    if not (a.run / "config.json").is_file():
        print(f"not a twins run folder: {a.run}", file=sys.stderr)
        return 2
    try:
        d = Measured.read(a.run)
    except SeedlabError as err:
        print(err, file=sys.stderr)
        return 2
    design = {k: d.config.get(k) for k in DESIGN}
    differs = {k: (design[k], DESIGN[k]) for k in DESIGN
               if (sorted(design[k] or []) != DESIGN[k] if k == "seeds" else not math.isclose(design[k] or 0, DESIGN[k]))}
    if differs and not a.exploratory:
        print(f"{a.run} is not the pre-registered design ({PRESET}): "
              + ", ".join(f"{k} {got} (pre-registered {want})" for k, (got, want) in differs.items())
              + "; --exploratory decides nothing but prints the numbers", file=sys.stderr)
        return 2
    dr = dose.summarize(d)
    table = decide(dr, seeds=sorted(d.config.get("seeds") or []) or None)
    unreported = [n for n in DOSE_TABLES if not d.dir.dose_table(n).is_file()]
    text = render(table, exploratory=bool(differs)) + "\n\n" + render_beside(dr)
    if unreported:
        text += f"\n\n*The run's report has not been written ({', '.join(f'dose-{n}.csv' for n in unreported)} absent); " \
                "the decisions above are computed from its measured tables all the same.*"
    print(text)
    record = {"preregistration": PREREGISTRATION, "preset": PRESET, "run": str(a.run),
              "design": design, "preregistered_design": not differs, "exploratory": bool(differs),
              "family_alpha": FAMILY, "holm": "over the tests decided (an undecided test takes no share)",
              "margin_log10": MARGIN, "exponent_bounds": list(EXPONENT),
              "tests": [{k: _plain(v) for k, v in r.items()} for r in table.to_dict("records")],
              "beside": beside(dr)}
    path = a.json or d.dir.root / VERDICT
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
