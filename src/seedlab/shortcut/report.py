"""The report of a sweep (or one ensemble run): ``report.md`` plus PNG figures beside it.

Read top to bottom, the module follows the report: the answer in one sentence whose verdict is
the flip test's decision, one screen of the numbers behind it (the test, each depth's rates, how
robust the verdicts are, what ran, the evaluation cadence), the headline tables laid out like the
paper's, every figure (:mod:`seedlab.shortcut.figures`), the pre-registration when there is one,
then the long tables of statistics (Fisher tests between ratios, the logistic capacity × ratio
interaction, the rate against the accuracy cut-off and against the adversarial split's size, the
cadence), the mechanism (phases, gradient conflict over all parameters and within the shortcut
head's, circuits), and last the per-member tables. The folder's files are
read by :mod:`seedlab.shortcut.rundir`; every verdict is decided in :mod:`seedlab.shortcut.stats` and every
table computed in :mod:`seedlab.shortcut.report_data`; this module only words and tabulates them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from seedlab.reporting import Report, figure_block, fmt_num, fmt_p, md_table, num_or_dash, p_text, pct
from seedlab.shortcut import figures, report_data, stats
from seedlab.shortcut.circuit_data import SHORTCUT_FINGERPRINT
from seedlab.shortcut.circuits_report import aligned_roles_figure, circuits_section, roles_section
from seedlab.shortcut.figures import cap_label, fmt_ratio
from seedlab.shortcut.rundir import (
    Preregistration,
    RunDir,
    SweepDir,
    adv_split_size,
    generalized_definitions,
    open_folder,
    read_preregistration,
    read_summary,
    read_table,
    saturated_loss,
    train_cadence,
)
from seedlab.shortcut.stats import GROUP, PAPER_TASK, PAPER_WD
from seedlab.shortcut.report_data import SHOWN_EPOCHS
from seedlab.store import write_text


def write_report(run_dir: str | Path) -> Path:
    """Write the folder's ``report.md`` and its figures; returns the report's path."""
    folder = open_folder(run_dir)
    summary = read_summary(folder)
    rates = stats.rate_cells(summary)
    cadence = train_cadence(folder)
    prereg = read_preregistration(folder) if isinstance(folder, SweepDir) else None
    flip = stats.flip_answer(summary)
    rep = Report()
    rep.add("# Shortcut saturation: sweep report")
    rep.add(answer_sentence(flip), key_numbers(summary, flip, isinstance(folder, SweepDir), definition(folder, summary),
                                               cadence, prereg is not None))
    rep.add("## Headline: generalization rate", headline_note())
    for (task, wd), cells in rates.groupby(GROUP, sort=True):
        rep.add(headline_table(task, wd, cells))
    circuits, patching = read_table(folder, "circuits"), read_table(folder, "patching")
    rep.add("## Figures")
    rep.add(figure_block(figures.rate_vs_ratio_figure(summary, rates, folder)))
    rep.add(figure_block(figures.curves_figure(summary, folder, flip.task, flip.weight_decay)))
    rep.add(figure_block(figures.gen_epoch_figure(summary, folder)))
    rep.add(figure_block(figures.transient_figure(summary, folder)), transient_counts(summary))
    rep.add(figure_block(figures.aligned_figure(summary, folder)))
    for fig in [*figures.gradient_figures(summary, folder), *figures.circuit_figures(summary, folder),
                aligned_roles_figure(summary, circuits, folder)]:
        rep.add(figure_block(fig))
    if prereg is not None:
        rep.add("## Pre-registration: a confirmatory sweep", preregistration_section(prereg))
    rep.add("## Statistics", ratio_contrasts_section(summary), interaction_section(summary), threshold_section(summary),
            split_size_section(summary, adv_split_size(folder)), cadence_section(summary, folder, cadence))
    rep.add("## Mechanism", "### Phases", phases_table(summary))
    rep.add(gradient_tables(summary, folder))
    rep.add(head_conflict_section(summary, folder))
    rep.add(circuits_section(summary, circuits, patching))
    if circuits is not None and not circuits.empty:
        rep.add("## Per-member tables", roles_section(summary, circuits))
    return write_text(folder.report_path, rep.text())


# ---------------------------------------------------------------- formats


def rate_text(rate: float, lo: float, hi: float) -> str:
    """'70% [40–89]': a rate with its 95% interval."""
    return f"{pct(rate)} [{100 * lo:.0f}–{100 * hi:.0f}]"


def fragility_text(f: dict) -> str:
    """A Fisher verdict's :func:`seedlab.stats.fisher_fragility`: 'fragility 3' (p < 0.05), 'reverse fragility 2'
    (p >= 0.05), or what no table of these sizes can do."""
    if f["fragility"] is None:
        return "no change can reverse it" if f["significant"] else "no change can make it significant"
    return f"{'' if f['significant'] else 'reverse '}fragility {f['fragility']}"


def changes_text(changes: tuple) -> str:
    """'1L at r=0.9: 2 more generalized; 2L at r=0.5: 1 fewer': the changes of a :class:`stats.FlipFragility`."""
    return "; ".join(f"{layers}L at r={'/'.join(fmt_ratio(r) for r in ratios)}: {abs(m)} {'more' if m > 0 else 'fewer'} "
                     "generalized" for layers, ratios, m in changes)


def flip_fragility_text(f: stats.FlipFragility) -> str:
    """The flip verdict's fragility in words: how many changed outcomes reverse it, which, and p_flip after them."""
    if not f.reached:
        return f"fragility >{f.max_changes}: no {f.max_changes} or fewer changed outcomes reverse this verdict"
    after = "leaves the slopes not estimable" if f.p_after is None else f"moves the flip's p to {fmt_p(f.p_after)}"
    n = f.fragility
    whose = "member's outcome" if n == 1 else "members' outcomes"
    return (f"fragility {n}: changing {n} {whose} — {changes_text(f.changes)} — "
            f"{after}, and the flip would {'not ' * f.shown}be shown")


def est_text(x: float, lo: float, hi: float) -> str:
    """'1.5 [-3.9, 6.8]': an estimate and its 95% interval, rounded to the interval's precision (two significant digits
    of its half-width), so an estimate that rounds to zero reads 0, not 7e-15; :func:`fmt_num` for each where the
    interval is missing, infinite or of no width."""
    if any(v is None or not math.isfinite(v) for v in (x, lo, hi)) or hi <= lo:
        return fmt_num(x) + ("" if lo is None or math.isnan(lo) else f" [{fmt_num(lo)}, {fmt_num(hi)}]")
    digits = min(6, max(0, 1 - math.floor(math.log10((hi - lo) / 2))))

    def at(v: float) -> str:
        s = f"{v:.{digits}f}"
        return "0" if float(s) == 0 else s

    return f"{at(x)} [{at(lo)}, {at(hi)}]"


def cadence_text(cad: dict | None) -> str:
    """The evaluation cadence and precision of the run or sweep (:func:`train_cadence`)."""
    if cad is None:
        return "**Cadence:** unknown — the folder has no config.yaml or sweep.yaml."
    adv = (f"the adversarial split alone also every {cad['adv_every']} epochs (`train.adv_every`)"
           if cad["adv_every"] else "the adversarial split only at those evaluations (`train.adv_every` null)")
    return (f"**Cadence:** evaluations every {cad['eval_every']} epochs (`train.eval_every`), {adv}, so a member counts as "
            f"generalized only if it is at 100% at one of those checks; precision {cad['precision']} (`train.precision`).")


def cell_label(task: str, wd: float, layers: int, heads: int, ratio: float) -> list[str]:
    """A cell's first columns in the per-cell tables: task, weight decay, model, r."""
    return [task, f"{wd:g}", cap_label(layers, heads), fmt_ratio(ratio)]


# ---------------------------------------------------------------- opening paragraph


def definition(folder: RunDir | SweepDir, summary: pd.DataFrame) -> str:
    """What ``generalized`` meant when the folder's jobs (those in ``summary``) were trained
    (:func:`seedlab.shortcut.rundir.generalized_definitions`): one definition, or each with its job count when they
    differ."""
    jobs = sorted(summary["job"].unique()) if isinstance(folder, SweepDir) else []
    counts = report_data.definition_counts(generalized_definitions(folder, jobs))
    if len(counts) == 1:
        return counts[0][0]
    return "; ".join(f"{d} in {n} job{'s' * (n != 1)}" for d, n in counts)


def answer_sentence(a: stats.Answer) -> str:
    """The report's first line: the answer in one plain sentence, its verdict the flip test's decision
    (:func:`seedlab.shortcut.stats.flip_verdict`): "shown" only where the test rejects."""
    where = f"in {a.task} at weight decay {a.weight_decay:g}"
    claim = "imbalance helping 2-layer models and hurting 1-layer ones,"
    if a.empty is not None:
        layers, ratio = a.empty
        return (f"**Answer:** The question cannot be answered {where}: it has no {layers}-layer members at "
                f"r = {fmt_ratio(ratio)}.")
    if not a.determinable:
        return (f"**Answer:** The question cannot be answered {where}: it needs 1- and 2-layer models at a balanced and "
                "an imbalanced ratio.")
    if a.slopes is None:
        return f"**Answer:** The flip, {claim} is not shown {where}: its test cannot run, because {a.untestable}."
    p = p_text(a.slopes["p_flip"])
    if a.verdict == "shown":
        return (f"**Answer:** The flip is shown {where}: imbalance raises 2-layer models' odds of generalizing and lowers "
                f"1-layer models', by the report's pre-set test, the intersection-union test of the two logistic slopes, "
                f"with {p} below its level of 0.05.")
    return (f"**Answer:** The flip, {claim} is not shown {where}: the report's pre-set test, the intersection-union "
            f"test of the two logistic slopes, gives {p}, not below its level of 0.05.")


def key_numbers(summary: pd.DataFrame, a: stats.Answer, is_sweep: bool, generalized: str, cadence: dict | None,
                preregistered: bool) -> str:
    """The numbers behind the answer, one screen: the question, the test, each depth's rates, transience, what ran,
    the cadence; ``generalized``: what the jobs counted as generalized (:func:`definition`)."""
    out = ["**Question:** does imbalance help a 2-layer model and hurt a 1-layer one? The paper's claim is a flip: "
           "distance from chance lowers a 1-layer model's log-odds of generalizing and raises a 2-layer model's. The "
           "test needs both logistic slopes of `generalized ~ dist * cap`, each one-sided at 0.05.", ""]
    if a.determinable:
        bal, imb = a.ratios
        group = f"{a.task}, weight decay {a.weight_decay:g}, heads pooled"
        if a.slopes is not None:
            s = a.slopes

            def slope(c: str) -> str:
                est = est_text(s[c]["estimate"], s[c]["ci_low"], s[c]["ci_high"])
                return f"{c} slope {est}, one-sided {p_text(s[c]['p_one_sided'])}"

            fragile = flip_fragility_text(a.flip_fragility) if a.flip_fragility else ""
            fragile = f" {fragile[:1].upper()}{fragile[1:]}." if fragile else ""
            out.append(f"- **The test**, in {group}: {slope('1L')}; {slope('2L')}; the flip's p is the larger, "
                       f"{fmt_p(s['p_flip'])}: {a.verdict}.{fragile}")
        moves = "; ".join(f"{layers}L {pct(m.balanced)} → {pct(m.imbalanced)}, {p_text(m.p)}, one-sided "
                          f"{p_text(m.p_one_sided)}, {fragility_text(m.fragility)}" for layers, m in a.moves.items())
        out.append(f"- **Each depth's rate from r = {fmt_ratio(bal)} to r = {fmt_ratio(imb)}**, in the same members, "
                   f"with Fisher's exact test two-sided and one-sided toward the paper's direction: {moves}.")
        if a.transient:
            out.append(f"- **Transient:**{transience_note(a)}")
    o = report_data.overview(summary)
    caps = ", ".join(sorted({cap_label(layers, heads) for layers, heads in o["capacities"]}))
    tasks, jobs, n = o["tasks"], o["jobs"], o["members"]
    config = "; its config is `sweep.yaml`" if is_sweep else ""
    out.append(f"- **The run:** {n} members in {jobs} job{'s' * (jobs != 1)} over {len(tasks)} "
               f"task{'s' * (len(tasks) != 1)}, {', '.join(tasks)}; capacities {caps}; ratios r = "
               f"{', '.join(fmt_ratio(r) for r in o['ratios'])}; weight decay {', '.join(f'{w:g}' for w in o['weight_decays'])}"
               f"{config}. {o['generalized']} of {n} members generalized, meaning {generalized}.")
    out.append(f"- {cadence_text(cadence)}")
    if preregistered:
        out.append("- **Pre-registered:** its hypotheses and decision rules are quoted whole under \"Pre-registration\".")
    out += ["", "*Fragility*: how many members' outcomes, generalized or not, would have to change to reverse a verdict "
            "at the 0.05 level; *reverse fragility*: to make a non-significant one significant."]
    return "\n".join(out)


def preregistration_section(rec: Preregistration) -> str:
    """The pre-registration kept in the sweep folder (``--preregistration``), quoted whole, with its hash."""
    state = "unchanged since" if rec.intact else "**edited since: its SHA-256 no longer matches**"
    quoted = "\n".join(f"> {line}" if line else ">" for line in rec.text.splitlines())
    return (f"This sweep was pre-registered: `preregistration.md` was copied from `{rec.source}` at {rec.written_utc} "
            f"UTC, before its first member was trained (SHA-256 `{rec.sha256[:12]}`, {state}). Its hypotheses and "
            "decision rules are quoted below; the statistics that follow are the tests it names, so read this sweep as "
            "confirmatory, apart from any exploration that chose its protocol.\n\n" + quoted)


def transience_note(a: stats.Answer) -> str:
    """A sentence for the answer when most generalizing members of its group lost the rule again by the end."""
    if not a.transient:
        return ""
    k, kept = a.kept
    return (f" Most of this generalization is transient: {kept} of the {k} members that reached 100% kept it to the "
            "end, per cell under \"Transient generalization\", so the rates count passing hits.")


# ---------------------------------------------------------------- headline tables


def headline_note() -> str:
    return (
        "Cells: rate [95% Wilson interval] (generalized/seeds). Where the paper reports the cell "
        f"({PAPER_TASK}, weight decay {PAPER_WD:g}), its number follows as *paper N%*."
    )


def headline_table(task: str, wd: float, cells: pd.DataFrame) -> str:
    """Rows = capacities (2L first, as in the paper), columns = ratios present (:func:`report_data.headline`)."""
    h = report_data.headline(task, wd, cells)
    rows = [[f"**{cap_label(layers, heads)}**", *(cell_text(*h.cells[layers, heads, r]) for r in h.ratios)]
            for layers, heads in h.capacities]
    header = ["model"] + [f"r = {fmt_ratio(r)}" for r in h.ratios]
    return f"### {task}, weight decay {wd:g}\n\n" + md_table(header, rows)


def cell_text(c: pd.Series | None, paper: int | None) -> str:
    ours = "—" if c is None else f"{rate_text(c['rate'], c['lo'], c['hi'])} ({int(c['k'])}/{int(c['n'])})"
    return ours if paper is None else f"{ours}; *paper {paper}%*"


# ---------------------------------------------------------------- statistics

def ratio_contrasts_section(summary: pd.DataFrame) -> str:
    head = "### Between ratios, within each capacity (Fisher's exact test)"
    con = report_data.contrast_table(summary)
    if con.empty:
        return f"{head}\n\nNo contrasts: every capacity was trained at a single ratio."
    note = ("Two-sided p, not adjusted for the number of pairs. *Fragility*: how many members' outcomes (generalized or "
            "not) would have to change, in either ratio and either direction, to reverse the verdict at the 0.05 level: "
            "for p < 0.05 the fewest that make p >= 0.05 (the fragility index, Walsh et al. 2014), for p >= 0.05 the fewest "
            "that make p < 0.05 (*reverse*; — where no table of these sizes is significant). A verdict with fragility 1 or "
            "2 hangs on one or two seeds.")
    rows = [
        [
            c.task,
            cap_label(c.layers, c.heads),
            f"{c.weight_decay:g}",
            f"{fmt_ratio(c.ratio_a)} vs {fmt_ratio(c.ratio_b)}",
            f"{pct(c.rate_a)} vs {pct(c.rate_b)}",
            fmt_num(float(c.odds_ratio)),
            fmt_p(float(c.p)),
            "—" if pd.isna(c.fragility) else f"{int(c.fragility)}{' (reverse)' if c.reverse else ''}",
        ]
        for c in con.itertuples(index=False)
    ]
    header = ["task", "model", "wd", "r (a vs b)", "rate", "odds ratio a/b", "p", "fragility"]
    return f"{head}\n\n{note}\n\n" + md_table(header, rows)


def interval(res: dict) -> str:
    """'estimate [ci_low, ci_high]' of a fitted coefficient (:func:`est_text`)."""
    return est_text(res["estimate"], res["ci_low"], res["ci_high"])


def interaction_section(summary: pd.DataFrame) -> str:
    """The capacity × ratio interaction of a logistic model and the simple slopes, per task, weight decay and heads."""
    lines = [
        "### Capacity × ratio interaction (logistic regression)",
        "",
        "`generalized ~ dist * cap`, with dist = |r − chance| and cap = 1 for 2 layers, fitted per task, weight "
        "decay and head count. The dist:cap estimate is the extra change in log-odds per unit of dist for 2L over "
        "1L. A positive value says distance from chance helps 2L *more* than 1L; the paper's flip (it hurts 1L and "
        "helps 2L) needs both simple slopes, below.",
        "",
    ]
    if other := stats.depths_left_out(summary):
        lines += [f"Only 1- and 2-layer models enter these fits; the {', '.join(map(str, other))}-layer ones are left out.", ""]
    slope_rows = []
    for f in stats.interaction_fits(summary):
        name = f"- **{f['task']}, weight decay {f['weight_decay']:g}, {int(f['heads'])}H**: "
        if "error" in f:
            lines.append(name + f"not estimable — {f['error']}")
            continue
        res, sl, fr = f["fit"], f["slopes"], f["fragility"]
        lines.append(
            name
            + f"estimate {interval(res)} (95% CI), "
            f"{p_text(res['p'])}, n = {res['n']}, method: {res['method']}, separated: {res['separated']}"
        )
        slope_rows.append([
            f["task"], f"{f['weight_decay']:g}", f"{int(f['heads'])}H",
            *(f"{interval(sl[c])}, one-sided {fmt_p(sl[c]['p_one_sided'])}" for c in ("1L", "2L")),
            fmt_p(sl["p_flip"]), "shown" if sl["flip"] else "not shown",
            str(fr.fragility) if fr.reached else f">{fr.max_changes}",
        ])
    if slope_rows:
        lines += [
            "", "**The flip** (the paper's claim: the 1L slope is negative *and* the 2L slope positive). Simple slopes of "
            "log-odds per unit of dist from the same model (95% CI; one-sided p toward the paper's sign), and the "
            "intersection-union test of both (p = the larger one-sided p). *Fragility*: the fewest members' outcomes "
            "(generalized or not), in any of the cells and either direction, that would move p (flip) across 0.05 and so "
            f"reverse the verdict (each set of changes refitted; searched up to {stats.FLIP_FRAGILITY_MAX}):", "",
            md_table(["task", "wd", "heads", "1L slope", "2L slope", "p (flip)", "flip", "fragility"], slope_rows),
        ]
    return "\n".join(lines)


def threshold_section(summary: pd.DataFrame) -> str:
    """The generalization rate if "generalized" meant a peak adversarial accuracy >= t, for t from 90% to 100%."""
    if "peak_adv_acc" not in summary.columns:
        return ""
    note = (
        "### How the rate depends on the cut-off\n\nThe paper counts a member as generalized when its adversarial "
        "accuracy reaches 100% at some evaluation. With a few hundred adversarial rows one wrong row is a failure, so "
        "here is the rate had the cut-off been lower (peak adversarial accuracy over the evaluations >= t; 95% Wilson "
        "intervals). The evaluation cadence (`train.eval_every`) bounds how short a peak can be and still be seen."
    )
    criteria = stats.cutoff_criteria(summary)
    return note + "\n\n" + criteria_table(summary, {f"t = {100 * t:.0f}%": met for t, met in criteria.items()})


def split_size_section(summary: pd.DataFrame, n_adv: int | None) -> str:
    """The generalization rate had the adversarial split been its first m rows, for m from 16 to ``n_adv``."""
    head = "### How the rate depends on the adversarial split's size"
    if "adv_prefix_max" not in summary.columns or summary["adv_prefix_max"].isna().any():
        return f"{head}\n\n*Needs summary.parquet's `adv_prefix_max` column, which runs from an older seedlab lack: train them again.*"
    if n_adv is None:
        return f"{head}\n\n*Needs `data.n_adv` from the folder's config.yaml or sweep.yaml, which is missing.*"
    note = (
        f"{head}\n\nAt every check of the adversarial split (each evaluation, and every `train.adv_every` epochs when set), "
        "the *adv prefix* is the number of its leading rows that are all correct; summary.parquet's `adv_prefix_max` is "
        "its maximum over the checks. The rows are in random order, so the first m are a uniform sample of the split, and "
        "a member would have generalized on an adversarial split of m rows (with this run's training data) iff "
        "`adv_prefix_max` >= m. A smaller split is an easier criterion (fewer rows must all be right at once), so the rate "
        f"can only fall as m grows; the headline uses the whole split, m = n_adv = {n_adv}. Larger splits need a rerun "
        "with `data.n_adv` raised. 95% Wilson intervals."
    )
    criteria = stats.split_size_criteria(summary, n_adv)
    return note + "\n\n" + criteria_table(summary, {f"m = {m}": met for m, met in criteria.items()})


def criteria_table(summary: pd.DataFrame, criteria: dict[str, pd.Series]) -> str:
    """One row per cell (task, wd, capacity, r) and one column per criterion (named by its key): the share of the
    cell's members that meet it, with its 95% Wilson interval."""
    rows = [[*cell_label(*key), *(rate_text(*r) for r in rates)] for key, rates in report_data.criterion_rates(summary, criteria)]
    return md_table(["task", "wd", "model", "r", *criteria], rows)


# ---------------------------------------------------------------- tables beside the figures


def cadence_section(summary: pd.DataFrame, folder: RunDir | SweepDir, cad: dict | None) -> str:
    """With ``train.adv_every`` set: each cell's rate counted at every check and at the evaluations alone, and the flip
    test both ways (a sensitivity analysis of the cadence; training is the same either way). ``cad``: :func:`train_cadence`."""
    if not cad or not cad["adv_every"]:
        return ""
    curves = read_table(folder, "curves", columns=[c for c in ("job", "member", "epoch", "split", "acc")
                                                   if c != "job" or "job" in summary])
    if curves is None:
        return ""
    table, every, evals = report_data.cadence_rates(summary, curves)
    rows = [[*cell_label(t.task, t.weight_decay, t.layers, t.heads, t.ratio), str(t.members),
             f"{t.generalized} ({pct(t.rate)})", f"{t.at_evaluations} ({pct(t.rate_at_evaluations)})",
             str(t.added)] for t in table.itertuples(index=False)]
    flip = lambda s: "not estimable" if s is None else f"p (flip) = {fmt_p(s['p_flip'])}, {'shown' if s['flip'] else 'not shown'}"
    return (f"### Cadence: every {cad['adv_every']} epoch(s) vs the evaluations every {cad['eval_every']}\n\n"
            "The adversarial checks between evaluations are read-only, so the members trained the same either way; "
            "counting only the evaluations is the run at the sparser cadence.\n\n"
            + md_table(["task", "weight decay", "model", "r", "members", f"generalized (every {cad['adv_every']})",
                        f"at the evaluations (every {cad['eval_every']})", "added by the denser check"], rows)
            + f"\n\nThe flip test: {flip(every)} counting every check; {flip(evals)} counting the evaluations alone.")


def transient_counts(summary: pd.DataFrame) -> str:
    """Per cell: members, generalized at some point, and how many of those kept the rule to the end."""
    rows = [[*cell_label(t.task, t.weight_decay, t.layers, t.heads, t.ratio), str(t.members), str(t.generalized),
             str(t.retained), str(t.lost)] for t in report_data.transience(summary).itertuples(index=False)]
    return md_table(["task", "weight decay", "model", "r", "members", "generalized", "retained to the end",
                     "lost (transient)"], rows)


# ---------------------------------------------------------------- mechanism


def phases_table(summary: pd.DataFrame) -> str:
    """Median phase epochs per capacity x ratio (:func:`seedlab.shortcut.report_data.phase_medians`): the shortcut
    epoch over every member that learned it, then all three phases over the same members."""
    if "phase2_epoch" not in summary.columns:
        return "*No phase columns in summary.parquet (a sweep from an older seedlab).*"
    rows = [[cap_label(p.layers, p.heads), fmt_ratio(p.ratio), str(p.members), f"{num_or_dash(p.learned_median)} ({p.learned})",
             str(p.complete), *(num_or_dash(getattr(p, c)) for c in report_data.PHASES)]
            for p in report_data.phase_medians(summary).itertuples(index=False)]
    note = (
        "The epoch the shortcut is learned (validation >= 99%), the onset of phase 2 (adversarial accuracy rising from "
        "its trough while validation stays >= 99%) and the generalization epoch. The first median is over every member "
        "that learned the shortcut, their count beside it; the last three are medians over one set of members, those "
        "with all three phases: only members that generalized have a phase 2 onset. Over the same members the three "
        "read in order, as each member's do."
    )
    header = ["model", "r", "members", "shortcut learned: median (members)", "members with all three phases",
              "their shortcut learned", "their phase 2 onset", "their generalization"]
    return note + "\n\n" + md_table(header, rows)


def lowest_to_last(shape: stats.Shape) -> str:
    """A median conflict series as its lowest value → its last (the two numbers its resolves test compares)."""
    return f"{fmt_num(shape.lowest)} → {fmt_num(shape.last)}"


def shape_text(shape: stats.Shape | None) -> str:
    """A conflict series' cell in the by-outcome tables: lowest → last, ✓ where it resolves toward 0, — without one."""
    return "—" if shape is None else lowest_to_last(shape) + " ✓" * shape.resolves


#: the paper's "starts negative, resolves toward 0" as tested (:func:`stats.resolves_toward_zero`)
RESOLVES_RULE = (f"negative at some measurement and, at the last, risen by at least {stats.MIN_RISE:g} from its most "
                 "negative value and within half that value's size of 0")


def outcome_rows(outcomes: list[report_data.OutcomeConflict], *before: str) -> list[list[str]]:
    """One row per depth and outcome: model, generalized, the ``before`` cells, members, then each measure's shape."""
    return [[f"{o.layers}L", "yes" if o.generalized else "no", *before, str(o.members), *map(shape_text, o.shapes.values())]
            for o in outcomes]


def quartiles_text(a: tuple, space: str) -> str:
    """'a / b / c': a row of :func:`report_data.amplification`'s quartiles in one space ("logit" or "param")."""
    return " / ".join(num_or_dash(getattr(a, f"{space}_q{q}")) for q in report_data.QUARTILES)


def gradient_tables(summary: pd.DataFrame, folder: RunDir | SweepDir) -> str:
    """The conflict measures by outcome at the highest ratio, and amplification per capacity in the saturated window."""
    grads = read_table(folder, "gradients")
    if grads is None:
        return ""
    outcomes = report_data.conflict_by_outcome(summary, grads)
    threshold = saturated_loss(folder)
    amp = report_data.amplification(summary, grads, threshold)
    out = []
    if outcomes:
        measures = list(outcomes[0].shapes)
        out += ["### Gradient conflict by outcome",
                f"Members at r = {fmt_ratio(outcomes[0].ratio)} split by whether they generalized: the median over "
                "members at each measured epoch, its lowest value → its last. `cosine` compares the two groups' mean "
                "gradients; `pair_cosine` averages cos(g_i, g_j) over pairs of one consistent and one anti example. ✓: the "
                f"series matches the paper's description ({RESOLVES_RULE}); the paper says so of 2L models as they "
                "generalize. The next section restricts both measures to the shortcut head's parameters.", "",
                md_table(["model", "generalized", "members", *(f"{c}: lowest → last" for c in measures)],
                         outcome_rows(outcomes))]
    out += ["", "### Amplification per capacity"]
    if amp.empty:
        out.append("*No per-group losses in gradients.parquet (measured by an older seedlab), so no saturated window: "
                   "train again.*")
        return "\n".join(out)
    rows = [[a.task, cap_label(a.layers, a.heads), fmt_ratio(a.ratio), f"{a.saturated}/{a.members}",
             quartiles_text(a, "logit"), fmt_num(a.expected), quartiles_text(a, "param")] for a in amp.itertuples(index=False)]
    out += [f"The saturated window, as the paper defines saturation (loss ≈ 0 on the majority): the measured epochs at "
            f"which the majority group's mean training loss (the shortcut-consistent group at r ≥ 0.5, the anti-shortcut "
            f"one below) is below {threshold:g} nats (`train.gradients.saturated_loss`). Per member, the median over the "
            "window of the anti/consistent ratio of the mean gradient norm per example; quartiles over the members with "
            "a window. In logit space (the norm of ∂ℓ/∂logits = softmax − onehot) the ratio is comparable with a "
            "calibrated model's, which is measured there (r/(1−r) for two classes; shortcut/gradients.py); the "
            "parameter-space ratio (the norm of ∂ℓ/∂θ) also carries how each example's logit gradient maps back onto "
            "the weights. The paper's 9–17× is the 2L mechanism at r = 0.9.", "",
            md_table(["task", "model", "r", "members saturated", "logit space (25/50/75%)", "calibrated model",
                      "parameter space (25/50/75%)"], rows)]
    return "\n".join(out)


# ---------------------------------------------------------------- gradient conflict in the shortcut head's parameters

CONFLICT_NAMES = {"cosine": "cosine (all parameters)", "pair_cosine": "pair_cosine (all parameters)",
                  "head_cosine": "cosine (shortcut head)", "head_pair_cosine": "pair_cosine (shortcut head)"}


def conflict_verdict(med: pd.DataFrame) -> str:
    """Which conflict measures match "starts negative, resolves toward 0" in every 2L cell at the highest ratio."""
    checked = report_data.conflict_checks(med)
    if checked is None:
        return "No 2-layer cell: the paper's description (negative at first, toward 0 as 2L models generalize) cannot be checked."
    ratio, checks = checked
    match = [f"`{CONFLICT_NAMES[c.column]}`" for c in checks if c.matches]
    values = []
    for c in checks:
        ends = ", ".join(f"{cap_label(*cap)} {lowest_to_last(s)}" for cap, s in c.shapes.items() if s is not None)
        values.append(f"`{CONFLICT_NAMES[c.column]}` {ends}")
    which = f"{' and '.join(match)} match{'es' * (len(match) == 1)}" if match else "none of the measures matches"
    return (f"In the data, {which} the paper's description in 2L at r = {fmt_ratio(ratio)} (median {RESOLVES_RULE}). "
            f"Most negative → last median: {'; '.join(values)}.")


def head_conflict_section(summary: pd.DataFrame, folder: RunDir | SweepDir) -> str:
    """The gradient conflict over all parameters and within the shortcut circuit's head, per capacity, ratio and epoch."""
    grads = read_table(folder, "gradients")
    if grads is None:
        return ""
    head = "### Gradient conflict within the shortcut head's parameters"
    per_head = read_table(folder, "gradients_heads")
    if per_head is None:
        return f"{head}\n\n*No gradients_heads.parquet (gradients measured by an older seedlab: train again).*"
    circuits = read_table(folder, "circuits")
    hc = report_data.head_conflict(summary, grads, per_head, circuits)
    task, wd = hc.task, hc.weight_decay
    if circuits is None:
        rule = "No circuits.parquet (`seedlab shortcut analyze DIR`), so no shortcut head is identified: every head is used."
    else:
        rule = ("Each member's shortcut head is the attention head with the highest shortcut fingerprint in "
                f"circuits.parquet, averaged over its checkpoints (`{SHORTCUT_FINGERPRINT['max']}` for max tasks, "
                f"`{SHORTCUT_FINGERPRINT['first']}` for first tasks).")
        if missing := hc.missing:
            rule += f" {missing} member{'s' * (missing != 1)} without circuits use every head."
    rows = [[cap_label(e.layers, e.heads), fmt_ratio(e.ratio), str(int(e.epoch)), str(int(e.members)),
             *(num_or_dash(getattr(e, c)) for c in report_data.CONFLICT)] for e in hc.shown.itertuples(index=False)]
    note = (
        f"{head}\n\nThe conflict between the shortcut-consistent and anti-shortcut groups' gradients "
        "(shortcut/gradients.py), over all parameters and restricted to the shortcut head's own parameters (its slices of "
        "W_Q, W_K, W_V, their biases and W_O). `cosine` compares the two groups' mean gradients; `pair_cosine` averages "
        "cos(g_i, g_j) over pairs of one consistent and one anti example. Why they can differ: once one rule fits both "
        "groups their mean gradients align (`cosine` → +1), while single examples' gradients in many dimensions stay "
        f"nearly orthogonal (`pair_cosine` → 0). {rule} In {task}, weight decay {wd:g}: median "
        f"over members per capacity, r and measured epoch ({SHOWN_EPOCHS} evenly spaced epochs shown per cell). "
        f"{conflict_verdict(hc.medians)}"
    )
    table = md_table(["model", "r", "epoch", "members", *(CONFLICT_NAMES[c] for c in report_data.CONFLICT)], rows)
    return "\n\n".join([note, table, head_control(summary, per_head, hc.chosen, task, wd)])


def ci_text(row: pd.Series | None, measure: str) -> str:
    """'-0.31 [-0.42, -0.2]': a mean with its 95% interval (the mean alone from one member), — without a value."""
    if row is None or pd.isna(row[measure]):
        return "—"
    return est_text(float(row[measure]), float(row[f"{measure}_lo"]), float(row[f"{measure}_hi"]))


def head_control(summary: pd.DataFrame, per_head: pd.DataFrame, chosen: pd.DataFrame, task: str, wd: float) -> str:
    """The conflict within the shortcut head against the same measures within the member's other heads (the control),
    generalizing and non-generalizing members apart: their shapes at the highest ratio and the means over members
    with 95% intervals per cell and measured epoch (:func:`report_data.head_control`)."""
    head = "#### Against a control: the shortcut head and the other heads"
    if chosen.empty:
        return f"{head}\n\n*Needs each member's shortcut head, from circuits.parquet (`seedlab shortcut analyze DIR`).*"
    by_role, epochs = report_data.head_control(summary, per_head, chosen, task, wd)
    shapes = [row for role, outcomes in by_role for row in outcome_rows(outcomes, role)]
    measures = list(report_data.HEAD_CONFLICT)
    rows = [[cap_label(layers, heads), fmt_ratio(r), "yes" if gen else "no", str(e.epoch), str(e.members),
             *(ci_text(e.at.get(role), m) for m in measures for role in report_data.HEAD_ROLES)]
            for e in epochs for (_, _, layers, heads, r, gen) in [e.cell]]
    note = (f"{head}\n\nIf the conflict the paper describes lives in the shortcut circuit, it should differ there from "
            "the member's other attention heads (the null): per member, the same measures restricted to each of its other "
            "heads and averaged over them (none in a one-head model, —). Members that generalized and members that did not "
            f"are apart; members without a shortcut head are left out. First the shapes at the highest r (median over "
            f"members; ✓: {RESOLVES_RULE}), then the mean over members with its 95% t interval per cell and measured "
            f"epoch ({SHOWN_EPOCHS} evenly spaced epochs shown), in {task}, weight decay {wd:g}.")
    return "\n\n".join([
        note,
        md_table(["model", "generalized", "head", "members", *(f"{c}: lowest → last" for c in measures)], shapes),
        md_table(["model", "r", "generalized", "epoch", "members",
                  *(f"{m}: {role} head{'s' * (role != report_data.HEAD_ROLES[0])}" for m in measures for role in report_data.HEAD_ROLES)],
                 rows)])
