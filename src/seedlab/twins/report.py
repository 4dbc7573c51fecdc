"""``seedlab twins report DIR``: ``DIR/report.md`` plus PNG figures beside it.

Read top to bottom, the module follows the report: the answer in one sentence (each verdict word from its
test), at most a screen of numbers behind it (learned, more than an ordinary row in its place, lost, the nulls
in words, one example against a different seed), the figures (twins/figures.py, one function each), the paper's
numbers beside this run's, how the run was made (its pre-registration, integrity and exposure), then the
per-arm tables: the passages against the nulls, the paired statistics, the cross-passage matrix, the normalized
effects and the time course. The module only words and tabulates: every number it prints comes from
``twins.report_data.summarize`` (a :class:`~seedlab.twins.report_data.Summary`), the paper's own from
``twins.paper.PAPER``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.config import with_new_defaults
from seedlab.reporting import Report, figure_block, fmt_num, fmt_p, md_table, p_text
from seedlab.store import write_text
from seedlab.twins import figures, report_data, stats
from seedlab.twins.config import MeasureConfig
from seedlab.twins.rundir import Measured
from seedlab.twins.paper import PAPER, PAPER_BARRIER_OVER_MDE, PAPER_DISTANCE_MID_PCT
from seedlab.twins.report_data import Summary
from seedlab.twins.report_dose import dose_in_words, dose_record_table, dose_section, text_fraction_section, write_dose_tables
from seedlab.twins.variants import names, null_variant


def write_report(root: str | Path) -> Path:
    """Write ``root/report.md`` and its figures; returns the report's path. The answer in one sentence, at most a
    screen of numbers, the figures, the paper beside this run, how the run was made, then the per-arm tables."""
    d = Measured.read(root)
    s = report_data.summarize(d)
    rep = Report()
    rep.add("# Twins: a measured single-example counterfactual", answer(d, s), in_short(s), intro(d, s))
    rep.add("## Figures")
    for fig in (figures.path_figure(d), figures.loss_diff_figure(d), figures.distance_barrier_figure(d),
                figures.cka_figure(d), figures.passage_figure(d), figures.distance_course_figure(d)):
        rep.add(figure_block(fig))
    rep.add("## Headline: the paper's numbers beside this run's", headline(d, s))
    rep.add("## Pre-registration", preregistration(d))
    rep.add("## One row and nothing else: integrity and exposure", integrity(d), exposure(d, s))
    rep.add("## Is it the passage? Each passage beside the nulls", nulls_answer(s), null_sizes_table(s), nulls_table(s))
    if s.dose is not None:  # no arm recorded its dose (dose.json): no section, the report as before
        rep.add("## Is it the passage? Each arm against the ordinary rows' dose line", dose_section(s.dose),
                figure_block(figures.dose_figure(d, s.dose)), dose_record_table(s.dose), text_fraction_section(s.dose))
        write_dose_tables(d, s.dose)
    rep.add("## Learned, then lost? Each passage's own cross-entropy", learned_then_lost(s))
    rep.add("## Learned means *this* passage? The cross-passage matrix", passage_matrix(d, s))
    if s.gradmatch is not None:  # not computed (`seedlab twins gradmatch`): no section
        rep.add("## How alike the two fluent passages are (gradmatch)", gradmatch_table(s))
    rep.add("## Fabricated vs attested, every measure", fab_vs_att(s.comp))
    rep.add("## Normalized effects: one example vs a different seed", normalized_table(s))
    rep.add("## Barrier and distance over training", over_training_table(s))
    rep.add("## Time course", time_course_table(s, d))
    return write_text(d.dir.report, rep.text())


# ---------------------------------------------------------------- sections


def _p(row, col: str = "p_t") -> str:
    return p_text(row[col])


def _finding(f: report_data.PassageFinding) -> str:
    """One passage's clause of the answer: each verdict word from its test (report_data.PassageFinding)."""
    parts = []
    if f.learned_shown is not None:
        parts.append(f"was learned at s + 50 ({_p(f.learned)})" if f.learned_shown else
                     f"is not shown learned at s + 50 ({_p(f.learned)})")
    if f.beyond_ordinary_shown is not None:
        parts.append(f"its run predicts it better than a run with an ordinary row in its place does ({_p(f.beyond_ordinary)})"
                     if f.beyond_ordinary_shown else "its run is not shown to predict it better than a run with an "
                     f"ordinary row in its place ({_p(f.beyond_ordinary)})")
    if f.learned_shown and f.lost is not None:
        parts.append(f"it is lost by the end (one-sided {_p(f.end, 'lost_p_t')})" if f.lost else
                     f"it is not shown lost by the end (one-sided {_p(f.end, 'lost_p_t')})")
    if not parts:
        return f"{f.passage} has no test (fewer than 2 seeds)"
    return f"{f.passage} " + (parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1])


def answer(d: Measured, s: Summary) -> str:
    """The report's answer in one sentence: per passage condition, learned at s + 50, more than an ordinary row in
    its place, lost by the end; each word from its test (paired over seeds, α = 0.05), at this run's scale."""
    if not s.findings:
        return "*Nothing to answer yet: no passage condition measured against its twin.*"
    c = d.config
    scale = (f"GPT `{c['model']}`, {c['steps']:,} updates of {c['batch_size']} rows, one row at step {c['injection_step']}, "
             f"{s.injected_seeds} seeds")
    labels = sorted({f.learned["label"] for f in s.findings if f.learned is not None})
    label = f"; the passage CE pre-registered as {' / '.join(labels)}" if labels else ""
    return (f"**Answer** ({scale}; paired tests over seeds, α = 0.05{label}): "
            + "; ".join(_finding(f) for f in s.findings) + ".")


def _learned(f: report_data.PassageFinding) -> str:
    r = f.learned
    return f"{f.passage} {r['gain']:+.4f} nats ({_p(r)}: {'learned' if f.learned_shown else 'not shown learned'})"


def _beyond(f: report_data.PassageFinding) -> str:
    parts = []
    if f.beyond_ordinary is not None:
        r = f.beyond_ordinary
        parts.append(f"{r['diff']:+.4f} nats beyond the ordinary rows' drop ({_p(r)})")
    if f.beyond_other is not None:
        r = f.beyond_other
        parts.append(f"{r['diff']:+.4f} beyond its drop on the other fluent passage ({_p(r)})")
    return f"{f.passage}: " + ", ".join(parts)


def _nulls_in_words(s: Summary) -> str:
    """"Is it the passage?" without its table: what was tested and what was found."""
    f, seeds = s.null_family, s.null_seeds
    passages = list(dict.fromkeys(v.passage for v in s.null_verdicts))
    nulls = list(dict.fromkeys(v.null for v in s.null_verdicts))
    measures = list(dict.fromkeys(m for v in s.null_verdicts for m in s.nulls[(s.nulls.kind == "end") & (s.nulls.passage == v.passage)
                                                                             & (s.nulls.null == v.null)].measure))
    tested = (f"{_each(len(passages), 'passage condition')} against {_each(len(nulls), 'null')} "
              f"({', '.join(null_variant(n).said for n in nulls)}) on {_each(len(measures), 'end-of-run measure', each='the')} "
              f"({', '.join(NULL_NAMES.get(m, m) for m in measures)}): two-sided paired t over {seeds} seeds, Holm-corrected "
              f"over the section's {f.tests} tests"
              + (f"; equal to the ordinary rows only where a TOST shows it within ±{s.ordinary_margin:g} × their own effect"
                 if s.ordinary_margin is not None else "; no equivalence test (no margin pre-registered)"))
    differs = [f"{v.passage} from {null_variant(v.null).said} on " + ", ".join(NULL_NAMES.get(m, m) for m in v.differ.measure)
               for v in s.null_verdicts if len(v.differ)]
    same = [f"{v.passage} on " + ", ".join(NULL_NAMES.get(m, m) for m in v.equivalent.measure)
            for v in s.null_verdicts if v.null == stats.ORDINARY_ROWS and len(v.equivalent)]
    found = ("no passage differs from any null on any measure" if not differs else
             "a difference is shown for " + "; ".join(differs))
    if s.ordinary_margin is not None:
        found += (", and no passage is shown equal to the ordinary rows on any measure" if not same else
                  "; shown equal to the ordinary rows: " + "; ".join(same))
    return f"Tested: {tested}. Found: {found}."


def _each(n: int, noun: str, each: str = "each of the") -> str:
    """"each of the 3 nulls", "the null" (one)."""
    return f"the {noun}" if n == 1 else f"{each} {n} {noun}s"


def in_short(s: Summary) -> str:
    """At most a screen of numbers behind the answer, each as the sections below print it: learned at s + 50, more
    than an ordinary row in its place (the study's lead result) and on this passage only, lost by the end, the nulls
    in words, and how far one example moves the run against a different seed."""
    lines = []
    found = s.findings
    if any(f.learned is not None for f in found):
        lines.append("- **Learned?** At s + 50, the twin's CE on the passage minus the run's own (positive: the run that "
                     "saw it predicts it better; mean over seeds, two-sided paired t): "
                     + "; ".join(_learned(f) for f in found if f.learned is not None) + ".")
    beyond = [f for f in found if f.beyond_ordinary is not None or f.beyond_other is not None]
    if beyond:
        lines.append("- **This passage, more than any row?** At s + 50, per seed, the passage's own CE drop (twin − run) "
                     "against the drop a run with an ordinary held-out row in its place shows on the same passage, and "
                     "against its own drop on the other fluent passage (paired t): " + "; ".join(_beyond(f) for f in beyond) + ".")
    ends = [f for f in found if f.end is not None]
    if ends:
        lines.append(f"- **Then lost?** Tested per seed: is less than {s.lost_frac:g} × the s + 50 effect left at the end "
                     "(one-sided paired t)? " + "; ".join(f"{f.passage}: {stats.verdict(f.end)}" for f in ends) + ".")
    if s.null_verdicts:
        lines.append("- **Is it the passage?** " + _nulls_in_words(s))
    if s.dose is not None and len(s.dose.residuals):
        lines.append("- **On the ordinary rows' dose line?** " + dose_in_words(s.dose))
    h = s.headline
    if h.barrier_pct is not None:
        lines.append(f"- **One example vs a different seed:** the fluent passages move the barrier by {_pct(h.barrier_pct)} "
                     f"and the weights by {_pct(h.distance_pct)} of what a different seed does (the paper: "
                     f"{PAPER['barrier_pct']}% and {PAPER['distance_pct']}%).")
    if not lines:
        return ""
    return "**In short** (the tables and tests behind each line follow):\n\n" + "\n".join(lines)


def intro(d: Measured, s: Summary) -> str:
    c, seeds = d.config, s.seeds
    lines = [
        (f"Model `{c['model']}`, {c['steps']:,} steps of {c['batch_size']} rows, one row replaced at step "
        f"{c['injection_step']} (row {c['injection_row']}). Seeds measured: {', '.join(map(str, seeds)) or 'none'}; "
        f"conditions: {', '.join(s.conditions) or 'none'}, each against the twin of its seed. "
        f"Steps below are optimizer updates completed: s = {d.steps['injection']}, s + 50 = {d.steps['s50']}, "
        f"mid-point = {d.steps['mid']}, end = {d.steps['final']}. Precision {c.get('precision', 'fp32')}"
        + (" (bf16: not shown interchangeable with fp32's effect sizes: docs/results/precision.md, \"Does precision change the "
           "science?\")." if c.get("precision") == "bf16" else ".")),
    ]
    if d.meta["missing"]:
        lines.append(f"**Not measured (runs not finished):** {', '.join(d.meta['missing'])}.")
    n = s.injected_seeds
    if n < 8:
        lines.append(f"With {n} seeds the paired tests have little power (the paper used 8): read the minimum "
                     "detectable effects (MDE) before reading a p-value.")
    return "\n\n".join(lines)


def preregistration(d: Measured) -> str:
    before, used = d.record("preregistration"), d.meta["preregistration"]
    order = {"primary": 0, "secondary": 1, "exploratory": 2}
    rows = sorted(([k, v] for k, v in used["outcomes"].items()), key=lambda r: (order.get(r[1], 3), r[0]))
    table = md_table(["outcome", "label"], rows)
    if before is None:
        return table + "\n\n**No preregistration.json in the run folder: the outcomes were not fixed before training.**"
    text = d.preregistration_text
    if text is not None:  # --preregistration: hypotheses and decision rules, quoted
        quoted = "\n".join("> " + line for line in text.splitlines())
        table = (f"Hypotheses and decision rules kept before the first step (preregistration.md, SHA-256 "
                 f"`{before.get('text_sha256', '?')[:12]}…`):\n\n{quoted}\n\n" + table)
    if before["hash"] == used["hash"]:
        return table + f"\n\nFixed before training (preregistration.json, hash `{before['hash']}`); unchanged since."
    added = sorted(set(used["measure"]) - set(before["measure"]))
    if before["outcomes"] == used["outcomes"] and with_new_defaults(MeasureConfig, before["measure"]) == used["measure"]:
        return table + (f"\n\nFixed before training (preregistration.json, hash `{before['hash']}`); unchanged since, "
                        f"except for measurement settings seedlab gained later, used at their defaults: {', '.join(added)}.")
    changed = [k for k in set(before["outcomes"]) | set(used["outcomes"]) if before["outcomes"].get(k) != used["outcomes"].get(k)]
    what = (f"outcome labels changed: {', '.join(sorted(changed))}" if changed else "measurement settings changed")
    return table + (f"\n\n**Changed after pre-registration** ({what}; hash `{before['hash']}` before training, "
                    f"`{used['hash']}` when measured). The labels above are the ones used now.")


def integrity(d: Measured) -> str:
    """What ``twins run`` showed about the counterfactual (integrity.json): how the conditions were shown
    identical at the injection step, and the replica control's bitwise comparison after it."""
    rec = d.record("integrity")
    if rec is None:
        return "**No integrity.json in the run folder** (trained by an older seedlab): the identity of the conditions before the injection and the determinism after it were not recorded."
    rows, replicas = [], []
    for seed, r in sorted(rec["seeds"].items(), key=lambda kv: int(kv[0])):
        rep = r.get("replica")
        if rep is not None:
            replicas.append(seed)
        rows.append([seed, r["identical_at_injection"],
                     "–" if rep is None else ("bitwise equal to the twin at steps " + ", ".join(map(str, rep["steps_compared"]))
                                              if rep["bitwise_equal_to_twin"] else "**differs from the twin**")])
    how = ("every condition of a seed was forked from one in-memory copy of its shared prefix, so the conditions are "
           "identical before the injection by construction (not by a check)" if rec["mode"] == "fork" else
           "every condition of a seed was trained from scratch to the injection step and the SHA-256 of every tensor "
           "was compared across conditions there")
    which = (f"seed {replicas[0]}" if len(replicas) == 1 else f"seeds {', '.join(replicas[:-1])} and {replicas[-1]}"
             if replicas else "no seed")
    return (f"Mode `{rec['mode']}`: {how}. The replica control ({which}) re-trains the twin "
            "after the injection step from the same prefix; its weights must be bitwise equal to the twin's at every saved "
            "step, which shows that training after the injection is deterministic on the hardware used, so every "
            "difference between an injected run and its twin comes from the one replaced row. The run stops (exit 2) "
            "on any mismatch, so a finished run can only show equality.\n\n"
            + md_table(["seed", "identical at the injection step", "replica control"], rows))


def _attestation(d: Measured) -> dict | None:
    """inputs.json's ``attestation`` (twins.passages.attestation), None when the run did not record it."""
    rec = d.record("inputs")
    return None if rec is None else (rec.get("attestation") or None)


def attestation_rows(d: Measured) -> list[list[str]]:
    """Headline rows: each fluent subject's whole-word occurrences in this run's training split beside the
    paper's ("Jimmie Nicol", 4 occurrences; "Gizmo Harrington", absent)."""
    att = _attestation(d)
    rows = []
    for cond, what, paper in (("fluent-attested", "attested", "4 (\"Jimmie Nicol\", \"present in the corpus\")"),
                              ("fluent-fabricated", "fabricated", "0 (\"Gizmo Harrington\", \"absent from the corpus\")")):
        name = f"{what} subject: whole-word occurrences in the training split"
        if att is None:
            if cond in d.config.get("subjects", {}):
                rows.append([name, paper, "not recorded (inputs.json predates it)"])
        elif cond in att:
            rows.append([name, paper, f"{att[cond]['occurrences']} (\"{att[cond]['subject']}\")"])
    return rows


def exposure(d: Measured, s: Summary) -> str:
    """Per attested passage: how often each seed's batches contained the passage's subject (inputs.json)."""
    att = _attestation(d)
    if not att:
        return "*No attestation in inputs.json (trained by an older seedlab): per-seed exposure was not recorded.*"
    inj = d.steps["injection"]
    conds = sorted(att)
    by_seed = {cond: {e["seed"]: e for e in att[cond].get("exposure", [])} for cond in conds}
    seeds = sorted({k for c in conds for k in by_seed[c]})
    cell = lambda e: "–" if e is None else f"{e['before']} / {e['at_injection']} / {e['after']}"
    rows = [[str(k), *(cell(by_seed[c].get(k)) for c in conds)] for k in seeds]
    head = [f"{c}: {att[c]['subject']} ({att[c]['occurrences']} in the training split)" for c in conds]
    paper = {c: PAPER["subjects"][c] for c in conds if c in PAPER["subjects"]}
    return ("**Exposure.** Whole-word occurrences of each passage's subject in the training split, and how many times "
            f"each seed's batches held one whole: before the injection step (steps 0 .. {s.last_before}) / in the ordinary batch "
            f"of step {inj} (every row, the one an injected passage replaces included) / after it. The twin and every "
            "injected run see the same rows except that one. An attested subject seen before the injection is prior "
            "knowledge the passage can reinforce; seen after it, a later reminder."
            + ("" if not paper else " The paper's subjects: " + "; ".join(
                f"{c}: {n} ({f'{k} occurrences in' if k else 'absent from'} its corpus)" for c, (n, k) in paper.items()) + ".")
            + "\n\n" + md_table(["seed", *head], rows))


def _get(comp: pd.DataFrame, comparison: str, measure: str) -> pd.Series | None:
    row = comp[(comp.comparison == comparison) & (comp.measure == measure)]
    return row.iloc[0] if len(row) else None


def _p_both(r) -> str:
    """Both p-values of a comparison row, each named by its test."""
    return f"{p_text(r['p_t'])} (paired t), {fmt_p(r['p_perm'])} (sign-flip{'' if r['perm_exact'] else ', MC'})"


def headline(d: Measured, s: Summary) -> str:
    comp, h = s.comp, s.headline
    rows = []
    for cond in ("fluent-fabricated", "fluent-attested"):
        res = _get(comp, f"{cond} vs twin, own passage at s + 50", "passage_ce_s50")
        if res is not None:
            rows.append([f"passage learned at s + 50 ({cond}): twin − injected CE",
                         f"{PAPER['gain_s50'][cond]:.4f} nats, p < 1e-4 (test not stated)", f"{res['gain']:.4f} nats, {_p_both(res)}"])
        res = _get(comp, f"{cond} vs twin, own passage at end", "passage_ce_final")
        if res is not None:
            rows.append([f"passage at the end ({cond})", f"p = {PAPER['p_final'][cond]} (not significant; no test of a loss or MDE stated)",
                         f"{res['gain']:.4f} nats, {_p_both(res)}; MDE {fmt_num(res['mde'])}{lost_text(res)}"])
    res = _get(comp, "fabricated vs attested", "barrier")
    if res is not None:
        diff, p, mde = PAPER["barrier_fab_att"]
        rows.append(["barrier, fabricated − attested", f"{diff:+.5f}, p = {p}, MDE {mde} ({PAPER_BARRIER_OVER_MDE:.2f}× MDE)",
                     f"{res['diff']:+.5f}, {_p_both(res)}, MDE {fmt_num(res['mde'])} ({fmt_num(res['diff_over_mde'])}× MDE)"])
    if h.barrier_pct is not None:
        rows.append(["barrier shift, % of inter-seed barrier", f"{PAPER['barrier_pct']}%", _pct(h.barrier_pct)])
        rows.append(["distance, % of inter-seed distance", f"{PAPER['distance_pct']}%", _pct(h.distance_pct)])
        rows.append(["distance, % of inter-seed distance after weight matching (lm/align.py)",
                     "not measured (the 44.1% is \"a lower bound\")", _pct_aligned(h.distance_aligned_pct, h.aligned_measured)])
    if h.distance_mid_pct is not None:
        rows.append(["distance at mid-point / at the end", f"{PAPER_DISTANCE_MID_PCT:.0f}%", f"{h.distance_mid_pct:.0f}%"])
        if h.barrier_max_pct is not None:
            rows.append(["barrier to the twin at any checkpoint, % of inter-seed barrier at the end", "stays small",
                         f"at most {_pct(h.barrier_max_pct)}"])
        rows.append(["loss difference peaks, steps after injection; peak / smoothed trough just after",
                     f"~{PAPER['peak_after']}; ~100× (smoothing not stated)",
                     f"{h.peak_after:.0f}; " + ", ".join(f"{fmt_num(r)}× ({k}-step window)" for k, r in h.peak_ratios)])
    rows += attestation_rows(d)
    n = h.seeds
    note = ("Fluent conditions pooled where the paper pools them; the CPU scale changes the absolute numbers "
            "(model, corpus and steps are far smaller), so compare directions and orders of magnitude. "
            "Every p is named by its test: the two-sided paired t-test over seeds, or the exact sign-flip "
            "permutation test (MC: Monte Carlo)"
            + (f", which cannot go below 2/2^{n} = {h.sign_flip_floor:.2g} with {n} seeds, so the paper's "
               "p < 1e-4 with 8 seeds can only come from a parametric test such as the t-test" if n else "")
            + f". \"Not significant\" is not \"lost\": an end effect counts as lost only when, seed by seed, it is shown "
            f"smaller than {s.lost_frac:g} × the same seed's effect at s + 50 (one-sided paired t-test), see below.")
    return md_table(["", "paper", "this run"], rows) + "\n\n" + note


def _pct(v: float) -> str:
    """A percentage (twins.stats.percent): one decimal, or two significant digits below 1% (0.017%, not 0.0%)."""
    if not np.isfinite(v):
        return "n/a (no seed pair)"
    return f"{v:.1f}%" if abs(v) >= 1 or v == 0 else f"{v:.2g}%"


def _stat_rows(rows: pd.DataFrame, name) -> list[list[str]]:
    return [[name(r), r["label"], str(r["n"]), f"{r['mean_a']:.4g}", f"{r['mean_b']:.4g}", f"{r['diff']:+.4g}",
             f"[{fmt_num(r['ci_low'])}, {fmt_num(r['ci_high'])}]", fmt_p(r["p_t"]),
             fmt_p(r["p_perm"]) + ("" if r["perm_exact"] else " (MC)") + f" (≥ {r['p_perm_min']:.2g})",
             fmt_num(r["mde"])] for _, r in rows.iterrows()]


HEAD = ["", "label", "n", "mean a", "mean b", "a − b", "95% CI (t)", "p (paired t)", "p (exact sign-flip; its floor)", "MDE (80%, paired t)"]
TESTS = ("p (paired t): two-sided paired t-test over seeds. p (exact sign-flip): two-sided permutation test "
         "over all 2ⁿ sign patterns of the per-seed differences (MC: Monte Carlo when n > 20); it cannot go below "
         "its floor 2/2ⁿ, so a smaller p can only be the t-test's.")


def null_what(group: str) -> str:
    """What a null compared under ``group`` is, in words (its registered description, twins/variants.py)."""
    return null_variant(group).description


#: measures.parquet columns the nulls are compared on, as the report names them
NULL_NAMES = {"barrier": "barrier", "rise_mid": "rise at α = 0.5", "heldout_ce_diff": "held-out CE − twin's",
              "distance": "distance to the twin", "cka_mean": "CKA with the twin", "tc_mean_absdiff": "mean |Δ training loss|"}


def family_text(s: Summary) -> str:
    """How many p-values "Is it the passage?" holds and how they were corrected, from the rows tested."""
    f = s.null_family
    eq = (f", and {f.equivalence} equivalence tests (TOST) against the ordinary rows" if f.equivalence else
          ", and no equivalence test (no margin pre-registered)" if s.ordinary_margin is None else "")
    return (f"{f.tests} tests in this section: {f.end} difference tests at the end, {f.checkpoint} at the checkpoints"
            f"{eq}. Every paired t-test and TOST p-value is Holm-corrected within the section as one family of "
            f"{f.tests} (\"Holm\" columns); the sign-flip p's of the {f.perm} difference hypotheses are Holm-corrected "
            "among themselves. A difference or an equivalence is stated only where its Holm-adjusted p < 0.05.")


def nulls_answer(s: Summary) -> str:
    """The first answer: does each passage condition differ from the ordinary rows, from gradient noise and a
    weight kick of its size and from a nudge — on how many of the end measures (two-sided paired t, Holm over the
    section), and which; against the ordinary rows, on which it is shown equivalent (TOST, Holm)."""
    if not s.null_verdicts:
        return ("*No passage condition and null arm measured on the same seeds (add "
                + ", ".join(f"`{n}`" for n in names("null")) + " to `conditions`).*")
    parts: dict[str, list[str]] = {}
    for v in s.null_verdicts:
        which = ", ".join(f"{NULL_NAMES[r.measure]} {r['diff']:+.3g} (Holm p = {fmt_p(r.p_t_holm)})" for _, r in v.differ.iterrows())
        said = (f"differs on {len(v.differ)} of {v.tests} measures — {which}" if len(v.differ)
                else f"no difference shown on any of {v.tests} measures")
        if v.null == stats.ORDINARY_ROWS:
            same = ", ".join(NULL_NAMES[r.measure] for _, r in v.equivalent.iterrows())
            said += ("; equivalent (TOST) on " + same if same else
                     "; equivalent on none (not shown)" if s.ordinary_margin is not None else "; equivalence not shown (no margin)")
        parts.setdefault(v.passage, []).append(f"from {null_what(v.null)}: {said}")
    lines = [f"- **{p}** " + "; ".join(ps) + "." for p, ps in parts.items()]
    margin = (f"its effect within ±{s.ordinary_margin:g} × the ordinary rows' own effect, seed by seed (measure.ordinary_margin, "
              "pre-registered)" if s.ordinary_margin is not None else
              "**not shown**: the pre-registration holds no margin (measure.ordinary_margin), so no equivalence is claimed")
    return ("At the end of the run, each passage condition against each null, seed by seed (passage − null, each "
            f"against its own seed's twin; {s.null_seeds} seeds; two-sided paired t-tests). The ordinary rows are a "
            "distribution: per seed the passage is compared with the mean of that seed's ordinary rows (and ranked among "
            f"them); \"equal to the ordinary rows\" is said only where a TOST shows {margin}. " + family_text(s)
            + "\n\n" + "\n".join(lines)
            + "\n\nA difference that a null shows as well is not the passage's: an effect the ordinary rows have is any "
            "row's; one the gradient noise has is a perturbation of that size's acting as a row acts; one only the weight "
            "kick has is a kick's; one the nudge has is chaos. No difference shown is not equality: only the TOST says that.")


def null_sizes_table(s: Summary) -> str:
    """Whether each gradient-channel null is the passage's size in each channel it acts through (stats.null_sizes)."""
    t = s.null_sizes
    if not len(t):
        return ""
    cells = [[f"`{r.condition}`", str(r.seeds), f"{r.grad_ratio:.3g}",
              f"{r.update_ratio:.3g} ({r.update_min:.3g} .. {r.update_max:.3g})",
              "n/a" if not np.isfinite(r.cosine) else f"{r.cosine:+.3f}"] for r in t.itertuples()]
    return ("**Are the gradient nulls the passage's size?** At s, per seed, each null's raw-gradient delta over the "
            "passage's batch-gradient difference, and its update at s over the passage's (‖θ_{s+1} − θ_{s+1}(twin)‖, "
            "both from that seed's θ_s; median (min .. max) over seeds); cos(δ, Δg) where recorded. AdamW divides each "
            "coordinate by √v: an isotropic direction of the gradient's norm lands on coordinates the passage barely "
            "touches, where v is small, and moves the weights more than the passage does (update ratio > 1); the sign "
            "null keeps the passage's size in every coordinate (same δ², so the same second moment) and removes only its "
            "direction.\n\n"
            + md_table(["null", "seeds", "gradient norm / passage's", "update at s / passage's", "cos(δ, Δg)"], cells))


def ordinary_table(s: Summary) -> str:
    """Each passage against the distribution of ordinary rows at the end: its rank among them per seed, the paired
    difference to their mean, and the equivalence test."""
    nulls = s.nulls
    rows = nulls[(nulls.kind == "end") & (nulls.null == stats.ORDINARY_ROWS)] if len(nulls) else nulls
    if not len(rows):
        return ""

    def verdict(r) -> str:
        if r["differs"]:
            return "differs"
        if r.get("equivalent") is True:
            return f"equivalent within ±{r['tost_margin']:g} × the ordinary rows' effect"
        return "not shown (no margin pre-registered)" if s.ordinary_margin is None else "not shown (neither)"

    cells = [[f"{r['passage']}: {NULL_NAMES[r['measure']]}", str(r["n"]), str(int(r["rank_k"])),
              f"{r['rank_mean']:.2f} of {int(r['rank_k']) + 1} (expected {r['rank_expected']:.2f})",
              f"{int(r['above_all'])} / {int(r['below_all'])}",
              f"{r['diff']:+.4g} [{fmt_num(r['ci_low'])}, {fmt_num(r['ci_high'])}]", fmt_p(r["p_t"]), fmt_p(r["p_t_holm"]),
              "n/a" if not np.isfinite(r["tost_bound"]) else f"±{fmt_num(r['tost_bound'])}",
              "n/a" if r.get("equivalent") is None else fmt_p(r["tost_p"]),
              "n/a" if r.get("equivalent") is None else fmt_p(r["tost_p_holm"]), verdict(r)] for _, r in rows.iterrows()]
    k = int(rows.rank_k.max())
    one = (" With one ordinary row there is no distribution: its rank says only which side the passage lies on."
           if k == 1 else "")
    return ("**The ordinary rows as a distribution.** Per seed, the passage's value beside its K ordinary rows' "
            "(each a different held-out stretch as long as the passage, in the injected row): its rank among the K + 1 "
            "values from the smallest (mean over seeds; (K + 2)/2 if it were one more ordinary row), the seeds where it "
            "lies above / below all of them, and the paired difference passage − the mean of the ordinary rows with its "
            "95% t interval and two-sided paired t-test (raw and Holm). Equivalence: two one-sided paired t-tests of "
            "d − b < 0 and d + b > 0 seed by seed, d = passage − ordinary mean, b = margin × the ordinary rows' own "
            "effect (|value|; 1 − CKA for the CKA), its mean in the measure's units shown; p = the larger of the two, "
            "raw and Holm." + one + "\n\n"
            + md_table(["passage: measure", "seeds", "K", "rank (mean over seeds)", "seeds above / below all",
                        "passage − ordinary mean [95% CI]", "p (paired t)", "p (paired t, Holm)", "margin (mean)",
                        "p (TOST)", "p (TOST, Holm)", "verdict"], cells))


def nulls_table(s: Summary) -> str:
    """Every passage − null comparison: every measure at the end, and the barrier and distance at every checkpoint,
    each p raw and Holm-adjusted over the section."""
    nulls = s.nulls
    if not len(nulls):
        return ""
    rows = nulls.sort_values(["passage", "null", "step"], kind="stable")
    name = lambda r: (f"{r['comparison']}: {NULL_NAMES.get(r['measure'], r['measure'])}"
                      + ("" if r["kind"] == "end" else f" at step {r['step']}"))
    cells = [[name(r), r["label"], str(r["n"]), f"{r['mean_a']:.4g}", f"{r['mean_b']:.4g}", f"{r['diff']:+.4g}",
              f"[{fmt_num(r['ci_low'])}, {fmt_num(r['ci_high'])}]", fmt_p(r["p_t"]), fmt_p(r["p_t_holm"]),
              fmt_p(r["p_perm"]) + ("" if r["perm_exact"] else " (MC)") + f" (≥ {r['p_perm_min']:.2g})",
              fmt_p(r["p_perm_holm"]), fmt_num(r["mde"])] for _, r in rows.iterrows()]
    return (ordinary_table(s) + "\n\n**Every comparison.** a = the passage condition, b = the null (each a difference "
            "from its own seed's twin, except the CKA with it; b of the ordinary rows: their mean per seed); " + TESTS
            + " Holm: adjusted over the section (" + family_text(s) + ")\n\n"
            + md_table(["", "label", "n", "mean a", "mean b", "a − b", "95% CI (t)", "p (paired t)", "p (paired t, Holm)",
                        "p (exact sign-flip; its floor)", "p (sign-flip, Holm)", "MDE (80%, paired t)"], cells))


def passage_matrix(d: Measured, s: Summary) -> str:
    """The cross-passage matrix (mean drop of each text's CE, twin − condition, per condition) at s + 50 and
    at the end; the specificity tests; the attested effect against each seed's exposure to its subject."""
    x = d.passages
    if not len(x):
        return "*Measured by an older seedlab: no passages.parquet (run `seedlab twins measure` again).*"
    texts = list(dict.fromkeys(x.text))
    out = ["Mean drop of each passage's CE (twin − condition, nats/token; positive: the run predicts the text "
           "better than its twin) — rows: the condition trained, columns: the text read."]
    for t, at in s.matrix.items():
        rows = [[c, *(f"{at.loc[c, tx]:+.4f}" if tx in at.columns and pd.notna(at.loc[c, tx]) else "n/a" for tx in texts)]
                for c in at.index]
        out.append(f"**At step {t}** ({'s + 50' if t == d.steps['s50'] else 'the end'}):\n\n" + md_table(["condition", *texts], rows))
    spec = s.specificity
    if len(spec):
        out.append("Paired over seeds: the own-passage drop against 0; against the drop on the other fluent "
                   "passage (**specificity**: what is learned of this text beyond what carries over to a text of the "
                   "same kind); against the ordinary rows' mean drop on the same passage (what injecting this text "
                   "adds over injecting an ordinary row). " + TESTS + "\n\n" + md_table(HEAD, _stat_rows(spec, lambda r: r["comparison"])))
    ex = s.exposure
    if len(ex):
        rows = [[str(int(r.seed)), fmt_num(r.exposure_before), f"{r['drop']:+.4f}"] for _, r in ex.iterrows()]
        rho = ex.rho.iloc[0]
        out.append("The attested passage's own drop at s + 50 against each seed's exposure to its subject before s "
                   "(whole occurrences in the seed's batches): " + (f"Spearman ρ = {rho:+.2f} ({p_text(ex.p.iloc[0])}, "
                   f"{len(ex)} seeds)." if pd.notna(rho) else "no correlation computed (fewer than 3 seeds, or no "
                   "variation in exposure or effect).") + "\n\n" + md_table(["seed", "exposure before s", "own drop at s + 50"], rows))
    return "\n\n".join(out)


def gradmatch_table(s: Summary) -> str:
    """``seedlab twins gradmatch``'s table for the run's own passages, per seed and their mean: how far
    apart the two fluent passages' full-batch gradient deltas (the paper's measure) and exact AdamW
    update differences are in size at s."""
    g = s.gradmatch
    if g is None:
        return "*Not computed: run `seedlab twins gradmatch` on this folder first (then the report again).*"
    if not len(g):
        return "*gradmatch.parquet has no row for the run's own passages.*"
    pct = lambda x: "n/a" if pd.isna(x) else f"{x:.3g}%"
    rows = [["mean" if pd.isna(r.seed) else str(int(r.seed)), pct(r.delta_pct), pct(r.update_pct), fmt_num(r.cosine)]
            for _, r in g.iterrows()]
    return ("The relative difference in size of the two fluent passages' effect on the step-s update, per seed "
            "(the paper matched its passages' gradient deltas within 0.14%): the full-batch gradient deltas, the "
            "exact AdamW update differences (what `seedlab twins match` matches by default), and the cosine of the "
            "deltas.\n\n" + md_table(["seed", "gradient deltas", "AdamW updates", "cosine of the deltas"], rows))


def learned_then_lost(s: Summary) -> str:
    rows = s.comp[s.comp.measure.isin(["passage_ce_s50", "passage_ce_final"])]
    if not len(rows):
        return "*No injected condition measured.*"
    text = ("a = the injected run's CE on its own passage, b = its twin's CE on the same passage (nats/token); "
            "negative a − b: the passage was learned. " + TESTS + "\n\n" + md_table(HEAD, _stat_rows(rows, lambda r: r["comparison"])))
    return text + "\n\n" + lost_table(rows, s.lost_frac)


def _has_lost_test(r) -> bool:
    return r.get("lost_p_t") is not None and not (r.get("lost") is None or (isinstance(r.get("lost"), float) and np.isnan(r["lost"])))


def lost_text(r) -> str:
    """The headline's words for the "lost" test of an end-of-run row: the mean of end − frac × s + 50
    effect over seeds, both one-sided p's and the verdict ("" without the test)."""
    if not _has_lost_test(r):
        return ""
    return (f"; end − {r['lost_frac']:g} × s + 50 effect, per seed: mean {r['lost_d']:+.4f}, one-sided "
            f"{p_text(r['lost_p_t'])} (paired t), {fmt_p(r['lost_p_perm'])} (sign-flip{'' if r['lost_perm_exact'] else ', MC'}; "
            f"≥ {r['lost_p_perm_min']:.2g}): **{stats.verdict(r)}**")


def lost_table(rows: pd.DataFrame, frac: float) -> str:
    """Per condition, at the end: the per-seed test of end − frac × s + 50 effect (twins.stats.lost_test),
    its MDE, and what it allows one to say."""
    end = rows[rows.measure == "passage_ce_final"]
    if not len(end):
        return ""
    cells = []
    for _, r in end.iterrows():
        cond = r["comparison"].split(" vs twin")[0]
        if not _has_lost_test(r):
            cells.append([cond, "n/a", f"{r['gain']:+.4f}", "n/a", "n/a", "n/a", "n/a", "n/a", stats.verdict(r)])
            continue
        cells.append([cond, f"{r['lost_s50']:+.4f}", f"{r['lost_end']:+.4f}", f"{r['lost_d']:+.4f}", fmt_num(r["lost_ci_high"]),
                      fmt_p(r["lost_p_t"]),
                      fmt_p(r["lost_p_perm"]) + ("" if r["lost_perm_exact"] else " (MC)") + f" (≥ {r['lost_p_perm_min']:.2g})",
                      fmt_num(r["lost_mde"]), stats.verdict(r)])
    tested = end[end.lost_p_perm_min.notna()] if "lost_p_perm_min" in end else end.iloc[:0]
    n = int(tested.lost_n.max()) if len(tested) else 0
    floor = float(tested.lost_p_perm_min.max()) if len(tested) else np.nan
    floor_text = (f"{floor:.2g} with this run's {n} seeds" + (": it cannot reach 0.05 here" if floor >= 0.05 else "")
                  if n else "no seeds tested")
    return ("**Is it lost?** Effect = twin − injected CE on the passage (nats/token, positive: learned). Here \"lost\" "
            f"means that the end effect is smaller than {frac:g} × the s + 50 effect (measure.equivalence_frac, default "
            f"{stats.DEFAULT_LOST_FRAC:g}), not that it is zero: per seed d = end effect − {frac:g} × s + 50 effect, "
            "and a one-sided test over seeds of H0: mean d ≥ 0 (at least that fraction is left) against H1: mean d < 0 "
            "(less is left). Both effects are measured on every seed, so the uncertainty of both enters d. Tests: the "
            "one-sided paired t-test, which decides the verdict (α = 0.05), and the exact one-sided sign-flip test, "
            f"the distribution-free check, which cannot go below its floor 1/2ⁿ ({floor_text}). Whether anything is left "
            "at all is the end row's two-sided paired t-test above "
            "(\"but not zero\"). A non-significant end effect alone does not say it is gone, and \"inconclusive\" is "
            "the answer when neither test shows anything; the MDE (80% power, one-sided paired t, α = 0.05) is the "
            "smallest shortfall of mean d below 0 the design detects.\n\n"
            + md_table(["condition", "effect at s + 50", "effect at end", f"end − {frac:g} × s + 50 (mean d)",
                        "95% upper bound of mean d", "p (one-sided paired t)", "p (one-sided exact sign-flip; its floor)",
                        "MDE (80%, one-sided t)", "verdict"], cells))


def fab_vs_att(comp: pd.DataFrame) -> str:
    rows = comp[comp.comparison == "fabricated vs attested"]
    if not len(rows):
        return "*Needs both fluent conditions measured on the same seeds.*"
    return ("a = fabricated, b = attested, paired by seed. MDE: the smallest true difference the design "
            "detects with 80% power at α = 0.05 (paired t). " + TESTS + "\n\n"
            + md_table(HEAD, _stat_rows(rows, lambda r: stats.MEASURES[r["measure"]][1])))


def normalized_table(s: Summary) -> str:
    norm = s.norm
    if not len(norm):
        return "*No injected condition measured.*"
    ok = report_data.aligned_measured(norm)
    rows = [[r.condition, str(r.n), f"{r.barrier:.4g}", f"{r.rise_mid:+.3g}", fmt_num(r.seed_barrier), _pct(r.barrier_pct),
             f"{r.distance:.4g}", fmt_num(r.seed_distance), _pct(r.distance_pct),
             fmt_num(r.seed_distance_aligned), _pct_aligned(r.distance_aligned_pct, ok)] for r in norm.itertuples()]
    return ("Barrier and distance to the twin (mean over seeds), and the same between twins of different seeds. "
            "The inter-seed distance is inflated by gauge freedom (rotated bases computing the same function), "
            "so the distance ratio is a lower bound, as in the paper. " + gauge_sentence(s) + "\n\n"
            + md_table(["condition", "seeds", "barrier", "rise at α=0.5", "seed barrier", "barrier %", "distance", "seed distance",
                        "distance %", "seed distance, aligned", "distance %, aligned"], rows))


def _pct_aligned(v: float, measured: bool) -> str:
    """A percentage of the aligned inter-seed distance; says so when measures.parquet predates it."""
    return _pct(v) if measured else "n/a (not measured: run `seedlab twins measure` again)"


def gauge_sentence(s: Summary) -> str:
    """Both inter-seed distances, raw and after weight matching, and what the matching removes."""
    norm = s.norm
    raw, al = (norm.seed_distance.iloc[0], norm.seed_distance_aligned.iloc[0]) if len(norm) else (np.nan, np.nan)
    if not np.isfinite(raw):
        return ""
    if not np.isfinite(al):
        return ("The aligned inter-seed distance was not measured (measures.parquet predates it): run "
                "`seedlab twins measure` again.")
    return (f"Measured: the inter-seed distance is {fmt_num(raw)} raw and {fmt_num(al)} ({_pct(s.aligned_share)} of it) after "
            "weight matching (lm/align.py): the second seed's twin permuted to the first's — the residual stream's features "
            "(one permutation through embeddings, every LayerNorm and every matrix that reads or writes the stream) "
            "alternating with each layer's attention heads and MLP neurons, by linear assignment as in Git Re-Basin's "
            "coordinate descent, until no permutation lowers the distance. Matching removes the permutation part of the "
            "gauge freedom, not rotations within a head, so the ratio against the aligned distance is still a lower "
            "bound, a tighter one.")


def over_training_table(s: Summary) -> str:
    ckpt = s.ckpt
    if ckpt is None or not len(ckpt):
        return "*No injected condition measured.*"
    if ckpt.barrier.isna().all():
        return "*checkpoints.parquet has no barrier column (measured by an older seedlab): run `seedlab twins measure` again.*"
    conds = list(dict.fromkeys(ckpt.condition))
    steps = sorted(set(ckpt.step))
    at = ckpt.set_index(["condition", "step"])
    rows = []
    for t in steps:
        cells = [str(t)]
        for c in conds:
            r = at.loc[(c, t)] if (c, t) in at.index else None
            cells.append("–" if r is None else f"{r.distance:.3g} / {r.barrier:.3g} ({_pct(r.barrier_pct)})")
        rows.append(cells)
    return ("At every saved step from the injection on, each injected run against its twin (mean over seeds): weight "
            "distance / interpolation barrier on the held-out rows (nats), and in brackets the barrier as % of the "
            "barrier between twins of different seeds at the end. At the injection step the weights are identical "
            "(both 0); the last row is the end of the run (measures.parquet). Figure: `distance_course.png`.\n\n"
            + md_table(["step", *conds], rows))


def time_course_table(s: Summary, d: Measured) -> str:
    course = s.course
    if not len(course):
        return "*No injected condition measured.*"
    rows = [[r.condition, str(r.peak_step), f"{r.peak:.3g}", str(r.trough_step), f"{r.trough:.3g}", fmt_num(r.peak_over_trough),
             f"{r.just_after:.3g}", fmt_num(r.peak_over_just_after), f"{r.final:.3g}",
             f"{100 * r.distance_mid_frac:.0f}%"] for r in course.itertuples()]
    k = d.settings.smooth_steps
    return (f"|training loss − twin's| per step after the injected batch, mean over seeds, smoothed by a centred rolling mean "
            f"over {k} steps (truncated at the ends). Peak: the largest smoothed value; trough: the smallest smoothed value "
            f"between step s + 1 and the peak (the paper's 'value just after injection'); 'first {d.settings.just_after_steps} "
            "steps': the unsmoothed mean of the steps right after the injected batch, for comparison.\n\n"
            + md_table(["condition", "peak step", "peak", "trough step", "trough", "peak / trough",
                        f"first {d.settings.just_after_steps} steps", "peak / first steps", "at the end", "distance at mid / end"], rows)
            + "\n\n" + window_table(s, d))


def window_table(s: Summary, d: Measured) -> str:
    """The peak / trough ratio under both window widths (measure.smooth_steps, measure.smooth_steps_alt)."""
    m, w = d.settings, s.windows
    if not len(w):
        return ""
    rows = [[r.condition, str(r.window), str(r.peak_step), f"{r.peak:.3g}", str(r.trough_step), f"{r.trough:.3g}",
             fmt_num(r.peak_over_trough)] for r in w.itertuples()]
    return (f"**The ratio under two smoothings.** The paper does not state how (or whether) it smoothed the curve, and "
            f"the ratio depends on it: a narrower window keeps more of the step-to-step noise, which tends to lower the "
            f"trough and raise the peak. Below, the same peak and trough under a {m.smooth_steps}-step and a {m.smooth_steps_alt}-step "
            "window (measure.smooth_steps, measure.smooth_steps_alt); the figure `loss_difference.png` shows the "
            "unsmoothed curve beside both.\n\n"
            + md_table(["condition", "window (steps)", "peak step", "peak", "trough step", "trough", "peak / trough"], rows))
