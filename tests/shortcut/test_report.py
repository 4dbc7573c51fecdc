"""The sweep report: tables, statistics and figures from a synthetic summary/curves pair."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from seedlab.errors import SeedlabError
from seedlab.shortcut.report import write_report

EVAL_EPOCHS = np.arange(0, 210, 10)

# (layers, ratio) -> generalized seeds out of 10, shaped like the paper's headline
PAPER_LIKE = {(2, 0.5): 0, (2, 0.9): 7, (1, 0.5): 3, (1, 0.9): 0}


def make_sweep(
    out,
    outcomes: dict[tuple[int, float], int],
    *,
    seeds: int = 10,
    tasks=("sum2-max",),
    weight_decays=(0.1,),
    heads: int = 2,
    curves: bool = True,
):
    """Write summary.parquet (+ curves.parquet): ``outcomes[(layers, ratio)]`` seeds generalize per cell."""
    rows, crows = [], []
    member = 0
    for task in tasks:
        for wd in weight_decays:
            for (layers, ratio), k in outcomes.items():
                for seed in range(seeds):
                    gen = seed < k
                    gen_epoch = 50 + 10 * seed if gen else None
                    # at high weight decay every other generalizing seed loses it again
                    retained = gen and not (wd > 0.2 and seed % 2)
                    final_adv = 1.0 if retained else (0.8 if gen else 0.3 + 0.01 * seed)
                    rows.append(
                        dict(job=f"job-{layers}L", member=member, task=task, ratio=ratio, layers=layers, heads=heads,
                             weight_decay=wd, lr=1e-3, seed=seed, generalized=gen, gen_epoch=gen_epoch,
                             final_val_acc=1.0, final_adv_acc=final_adv, retained=retained, final_train_acc=1.0,
                             final_train_loss=0.01, peak_adv_acc=1.0 if gen else final_adv,
                             final_epoch=int(EVAL_EPOCHS[-1]))
                    )
                    for e in EVAL_EPOCHS:
                        val = min(1.0, e / 40)
                        adv = 1.0 if gen and e >= gen_epoch else 0.3
                        for split, acc in (("train", val), ("val", val), ("adv", adv)):
                            crows.append((f"job-{layers}L", member, int(e), split, acc, 1.0 - acc))
                    member += 1
    summary = pd.DataFrame(rows)
    summary["gen_epoch"] = summary["gen_epoch"].astype("Int64")
    out.mkdir(parents=True, exist_ok=True)
    summary.to_parquet(out / "summary.parquet", index=False)
    if curves:
        cdf = pd.DataFrame(crows, columns=["job", "member", "epoch", "split", "acc", "loss"])
        cdf.to_parquet(out / "curves.parquet", index=False)
    return summary


def referenced_pngs(text: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)


def test_headline_rates_and_paper_numbers(tmp_path):
    make_sweep(tmp_path, PAPER_LIKE)
    path = write_report(tmp_path)
    assert path == tmp_path / "report.md"
    text = path.read_text()
    # our cells, computed: 7/10 at 2L r=0.9, 3/10 at 1L r=0.5, with the paper's numbers beside them
    assert "70% [40–89] (7/10); *paper 77%*" in text
    assert "30% [11–60] (3/10); *paper 33%*" in text
    assert "0% [0–28] (0/10); *paper 0%*" in text
    assert "| **2L/2H** |" in text and "| **1L/2H** |" in text
    assert "r = 0.5" in text and "r = 0.9" in text
    # the opening answer is the flip test's decision, then the numbers behind it
    assert "40 members" in text
    assert text.split("\n\n")[1] == (
        "**Answer:** The flip is shown in sum2-max at weight decay 0.1: imbalance raises 2-layer models' odds of "
        "generalizing and lowers 1-layer models', by the report's pre-set test, the intersection-union test of the two "
        "logistic slopes, with p = 0.041 below its level of 0.05.")
    assert "**Each depth's rate from r = 0.5 to r = 0.9**" in text
    assert "2L 0% → 70%, p = 0.0031" in text and "1L 30% → 0%, p = 0.21" in text
    # statistics: Fisher contrasts and the logistic interaction
    assert "Fisher" in text and "0.5 vs 0.9" in text
    assert "dist:cap" in text and "method: firth-profile-lr, separated: True" in text
    # the flip: both simple slopes and the intersection-union test
    assert "| task | wd | heads | 1L slope | 2L slope | p (flip) | flip |" in text
    flip_row = next(line for line in text.splitlines() if line.startswith("| sum2-max | 0.1 | 2H |"))
    assert "| shown |" in flip_row  # then its fragility (test_fragility.py)
    # the rate at lower cut-offs: 1L r=0.5 members peak at 1.0 (3) or 0.3 + 0.01·seed (never >= 90%)
    cutoff = text.split("### How the rate depends on the cut-off", 1)[1]
    row = next(line for line in cutoff.splitlines() if line.startswith("| sum2-max | 0.1 | 1L/2H | 0.5 |"))
    assert row.count("30% [11–60]") == 5
    # read as a newcomer reads it: the answer, the headline table and its figures, then the long test tables
    order = ["**Answer:**", "**Question:**", "## Headline", "## Figures", "### Generalization rate vs spurious ratio",
             "### Transient generalization", "## Statistics", "### Between ratios", "## Mechanism"]
    assert [text.index(h) for h in order] == sorted(text.index(h) for h in order)


def test_a_flip_in_direction_only_is_not_called_shown(tmp_path):
    make_sweep(tmp_path, {(2, 0.5): 0, (2, 0.9): 7, (1, 0.5): 1, (1, 0.9): 0})
    text = write_report(tmp_path).read_text()
    assert text.split("\n\n")[1].startswith(
        "**Answer:** The flip, imbalance helping 2-layer models and hurting 1-layer ones, is not shown in sum2-max at "
        "weight decay 0.1: the report's pre-set test, the intersection-union test of the two logistic slopes, gives p = ")
    opening = text.split("## Headline")[0].lower()
    assert "in direction only" not in opening and "partly" not in opening
    flip_row = next(line for line in text.splitlines() if line.startswith("| sum2-max | 0.1 | 2H |"))
    assert "| not shown |" in flip_row


def test_every_referenced_figure_exists(tmp_path):
    make_sweep(tmp_path, PAPER_LIKE, weight_decays=(0.1, 0.4))
    text = write_report(tmp_path).read_text()
    pngs = referenced_pngs(text)
    assert set(pngs) == {"rate_vs_ratio.png", "curves.png", "gen_epoch.png", "transient.png", "aligned.png"}
    for name in pngs:
        f = tmp_path / name
        assert f.is_file() and f.stat().st_size > 1000, name
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a caption line after every figure
    for name in pngs:
        after = text.split(f"]({name})", 1)[1].lstrip("\n").splitlines()[0]
        assert after.startswith("*") and len(after) > 30
    # transient generalization counted per cell: at 0.4 the odd seeds lose it (3 of 7 in 2L r = 0.9, 1 of 3 in 1L r = 0.5)
    assert "| sum2-max | 0.4 | 2L/2H | 0.9 | 10 | 7 | 4 | 3 |" in text
    assert "| sum2-max | 0.4 | 1L/2H | 0.5 | 10 | 3 | 2 | 1 |" in text
    assert "| sum2-max | 0.1 | 2L/2H | 0.9 | 10 | 7 | 7 | 0 |" in text
    # two weight decays: one headline table each, paper numbers only for 0.1
    assert "### sum2-max, weight decay 0.1" in text and "### sum2-max, weight decay 0.4" in text
    table_04 = text.split("### sum2-max, weight decay 0.4", 1)[1].split("###", 1)[0]
    assert "paper" not in table_04 and "(7/10)" in table_04


def test_single_capacity_reports_interaction_message(tmp_path):
    make_sweep(tmp_path, {(2, 0.5): 2, (2, 0.9): 8})
    text = write_report(tmp_path).read_text()
    assert "80% [49–94] (8/10); *paper 77%*" in text
    assert "1L" not in text.split("## Headline", 1)[1].split("## Figures", 1)[0]  # the headline tables
    assert "not estimable — interaction_logit: dist:cap not identified" in text
    assert "**Answer:** The question cannot be answered in sum2-max at weight decay 0.1: it needs 1- and 2-layer models" in text
    for name in referenced_pngs(text):
        assert (tmp_path / name).stat().st_size > 0


def test_no_generalization_single_ratio_many_tasks_no_curves(tmp_path):
    tasks = ("sum2-max", "sum2-first", "sum3-max", "sum3-first")
    make_sweep(tmp_path, {(2, 0.9): 0, (1, 0.9): 0}, seeds=3, tasks=tasks, curves=False)
    text = write_report(tmp_path).read_text()
    for t in tasks:
        assert f"### {t}, weight decay 0.1" in text
    assert "0 of 24 members generalized" in text
    assert "Skipped: no member generalized" in text
    assert "Skipped: no curves.parquet" in text
    assert "No contrasts: every capacity was trained at a single ratio." in text
    assert "**Answer:** The question cannot be answered in sum2-max at weight decay 0.1" in text
    pngs = referenced_pngs(text)
    assert set(pngs) == {"rate_vs_ratio.png", "transient.png"}
    assert not (tmp_path / "gen_epoch.png").exists()


def test_missing_summary_is_a_seedlab_error(tmp_path):
    with pytest.raises(SeedlabError, match=r"no summary\.parquet \(run `seedlab shortcut sweep` first\)") as e:
        write_report(tmp_path)
    assert str(e.value).startswith(f"{tmp_path}: ")


def test_mechanism_section_from_a_real_sweep(tmp_path):
    """A tiny real sweep with gradient dynamics on: phases table and gradient figures in the report."""
    from seedlab.config import parse
    from seedlab.shortcut.config import SweepConfig
    from seedlab.shortcut.sweep import run_sweep

    cfg = parse(SweepConfig, {
        "data": {"length": 3, "n_train": 64, "n_val": 32, "n_adv": 32, "vocab": 8},
        "train": {"epochs": 6, "eval_every": 2, "gradients": {"enabled": True, "every": 3, "sample": 4}},
        "grid": {"ratio": [0.5, 0.9], "layers": [1, 2], "heads": [1], "seed": 2},
    })
    run_sweep(cfg, tmp_path, progress=False)
    text = write_report(tmp_path).read_text()
    assert "### Phases" in text and "| 2L/1H | 0.9 | 2 |" in text
    for png in ("grad_conflict.png", "grad_amplification.png"):
        assert f"({png})" in text and (tmp_path / png).stat().st_size > 1000
    # both conflict measures, lowest median → last, per depth and outcome at the top ratio
    assert "### Gradient conflict by outcome" in text
    assert "| model | generalized | members | cosine: lowest → last | pair_cosine: lowest → last |" in text
    assert re.search(r"\| 2L \| (yes|no) \| 2 \| -?[0-9.]+ → -?[0-9.]+( ✓)? \| -?[0-9.]+ → -?[0-9.]+( ✓)? \|", text)
    # the conflict within the shortcut head's parameters: no circuits.parquet here, so every head is used
    heads = pd.read_parquet(tmp_path / "gradients_heads.parquet")  # merged from the jobs, global member ids
    assert sorted(heads.member.unique()) == sorted(pd.read_parquet(tmp_path / "summary.parquet").member)
    section = text.split("### Gradient conflict within the shortcut head's parameters", 1)[1]
    assert "No circuits.parquet (`seedlab shortcut analyze DIR`), so no shortcut head is identified: every head is used." in section
    assert "| model | r | epoch | members | cosine (all parameters) | pair_cosine (all parameters) | cosine (shortcut head) |" in section
    assert re.search(r"\| 2L/1H \| 0\.9 \| 6 \| 2 \| -?[0-9.]+ \| -?[0-9.]+ \| -?[0-9.]+ \| -?[0-9.]+ \|", section)
    assert "In the data, " in section and "the paper's description in 2L at r = 0.9" in section


def _with_prefix(tmp_path, n_adv: int = 64):
    """PAPER_LIKE with an adv_prefix_max per member (n_adv when generalized) and the run's config."""
    summary = make_sweep(tmp_path, PAPER_LIKE)
    # the non-generalizing seeds of a cell: 40, 20, 10, 0, 0, ... leading adversarial rows right at best
    rank = summary.groupby(["layers", "ratio"])["generalized"].cumcount() - summary.groupby(["layers", "ratio"])["generalized"].transform("sum")
    prefix = np.where(summary.generalized, n_adv, rank.map({0: 40, 1: 20, 2: 10}).fillna(0)).astype(int)
    summary.assign(adv_prefix_max=prefix).to_parquet(tmp_path / "summary.parquet", index=False)
    (tmp_path / "config.yaml").write_text(f"data:\n  n_adv: {n_adv}\n")
    return summary.assign(adv_prefix_max=prefix)


def test_rate_against_the_adversarial_split_size(tmp_path):
    from seedlab.stats import wilson

    _with_prefix(tmp_path)
    text = write_report(tmp_path).read_text()
    section = text.split("### How the rate depends on the adversarial split's size", 1)[1].split("\n## ", 1)[0]
    assert "m = n_adv = 64" in section and "`data.n_adv` raised" in section and "easier criterion" in section
    assert "| task | wd | model | r | m = 16 | m = 32 | m = 64 |" in section
    # 2L r = 0.9: 7 generalized + prefixes 40, 20, 10 -> 9/10 at m = 16, 8/10 at m = 32, 7/10 at m = 64 (the headline)
    cells = lambda *ks: " | ".join(f"{10 * k}% [{100 * wilson(k, 10)[0]:.0f}–{100 * wilson(k, 10)[1]:.0f}]" for k in ks)
    assert f"| sum2-max | 0.1 | 2L/2H | 0.9 | {cells(9, 8, 7)} |" in section
    assert cells(7) == "70% [40–89]"  # m = n_adv is the headline cell
    # 2L r = 0.5: nobody generalized, prefixes 40, 20, 10, 0, ... -> 2/10, 1/10, 0/10
    assert f"| sum2-max | 0.1 | 2L/2H | 0.5 | {cells(2, 1, 0)} |" in section


def test_split_sizes_are_powers_of_two_then_n_adv():
    from seedlab.shortcut.stats import split_sizes

    assert split_sizes(2048) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert split_sizes(300) == [16, 32, 64, 128, 256, 300] and split_sizes(16) == [16] and split_sizes(10) == [10]


def test_split_size_section_of_an_old_run_asks_for_a_rerun(tmp_path):
    make_sweep(tmp_path, PAPER_LIKE)  # a summary without adv_prefix_max
    text = write_report(tmp_path).read_text()
    section = text.split("### How the rate depends on the adversarial split's size", 1)[1].split("\n#", 1)[0]
    assert "Needs summary.parquet's `adv_prefix_max` column, which runs from an older seedlab lack: train them again." in section


def test_shortcut_head_rule():
    """The head with the highest shortcut fingerprint averaged over checkpoints: QK rho with token value for max
    tasks, attention on position 0 for first tasks; MLP rows (head -1) never count."""
    from seedlab.shortcut.circuit_data import shortcut_heads

    summary = pd.DataFrame({"member": [0, 1, 2], "task": ["sum2-max", "sum3-first", "sum2-max"]})
    rows = []
    for member in (0, 1):
        for epoch in (0, 100):
            for layer, head, rho, pos0 in [(0, 0, 0.1, 0.9), (0, 1, 0.5, 0.1), (1, 0, 0.6 if epoch else 0.3, 0.2),
                                           (1, -1, 0.99, 0.99)]:
                rows.append({"member": member, "epoch": epoch, "layer": layer, "head": head, "qk_rho_value": rho,
                             "attn_pos0": pos0})
    got = shortcut_heads(summary, pd.DataFrame(rows))
    # member 0 (max): means 0.1, 0.5, 0.45 -> L0H1; member 1 (first): attn_pos0 0.9 -> L0H0; member 2: no circuits
    assert got.to_dict("records") == [{"member": 0, "layer": 0, "head": 1}, {"member": 1, "layer": 0, "head": 0}]
    assert shortcut_heads(summary, None).empty


def test_conflict_verdict_is_computed_from_the_medians():
    from seedlab.shortcut.report import conflict_verdict

    epochs = [0, 50, 100]
    med = pd.DataFrame({
        "task": "sum2-max", "weight_decay": 0.1, "layers": [2] * 3 + [1] * 3, "heads": 1, "ratio": 0.9,
        "epoch": epochs * 2, "members": 4,
        "cosine": [-0.4, 0.3, 0.9, -0.4, -0.4, -0.4],  # overshoots to +0.9: no
        "pair_cosine": [-0.2, -0.1, -0.05, -0.2, -0.2, -0.2],  # -0.2 -> -0.05: yes
        "head_cosine": [-0.5, -0.3, -0.2, 0, 0, 0],  # -0.5 -> -0.2: yes
        "head_pair_cosine": [0.1, 0.05, 0.0, 0, 0, 0],  # starts positive: no
    })
    text = conflict_verdict(med)
    assert text.startswith("In the data, `pair_cosine (all parameters)` and `cosine (shortcut head)` match the paper's "
                           "description in 2L at r = 0.9")
    assert "`cosine (all parameters)` 2L/1H -0.4 → 0.9" in text
    flat = med.assign(pair_cosine=-0.2, head_cosine=0.3)
    assert conflict_verdict(flat).startswith("In the data, none of the measures matches")
    assert conflict_verdict(med[med.layers == 1]).startswith("No 2-layer cell")
    # positive at random initialization, negative once the shortcut is learned, then toward 0: matches
    late = med.assign(cosine=[0.4, -0.4, -0.1, 0, 0, 0])
    assert "`cosine (all parameters)` and `pair_cosine (all parameters)` and `cosine (shortcut head)` match" in conflict_verdict(late)
    # the most negative value at the last measurement has not resolved: no
    still = med.assign(pair_cosine=[0.2, -0.1, -0.3, 0, 0, 0])
    assert "`pair_cosine (all parameters)`" not in conflict_verdict(still).split(" match")[0]


def test_conflict_by_outcome_splits_members_and_marks_the_papers_shape(tmp_path):
    """Per depth and outcome at the top ratio: the per-epoch median's lowest value → its last, ✓ where it went
    negative and came back within half of that toward 0."""
    from seedlab.shortcut.report import gradient_tables
    from seedlab.shortcut.rundir import SweepDir

    summary = make_sweep(tmp_path, {(2, 0.9): 5, (1, 0.9): 0}, seeds=10).assign(shortcut_epoch=50)
    shape = {True: [0.4, -0.6, -0.2], False: [0.4, -0.6, -0.6]}  # generalized: resolves; not: stays negative
    rows = [{"member": m.member, "epoch": e, "cosine": c + 0.01 * (m.seed % 3 - 1), "pair_cosine": 0.5 * c,
             "per_example_ratio": 2.0, "expected_ratio": 9.0}
            for m in summary.itertuples() for e, c in zip((0, 50, 100), shape[bool(m.generalized)])]
    pd.DataFrame(rows).to_parquet(tmp_path / "gradients.parquet", index=False)
    text = gradient_tables(summary, SweepDir(tmp_path))
    assert "| 2L | yes | 5 | -0.6 → -0.2 ✓ | -0.3 → -0.1 ✓ |" in text
    assert "| 2L | no | 5 | -0.6 → -0.6 | -0.3 → -0.3 |" in text
    assert "| 1L | no | 10 | -0.6 → -0.6 | -0.3 → -0.3 |" in text
    assert "| 1L | yes |" not in text  # no 1L member generalized


def test_transient_generalization_per_cell_and_in_the_answer(tmp_path):
    """The transient table counts per cell; when most members that generalized lost it, the answer says so."""
    from seedlab.shortcut.report import transience_note, transient_counts
    from seedlab.shortcut.stats import flip_answer

    summary = make_sweep(tmp_path, PAPER_LIKE)
    table = transient_counts(summary)
    assert "| sum2-max | 0.1 | 2L/2H | 0.9 | 10 | 7 | 7 | 0 |" in table and "| sum2-max | 0.1 | 1L/2H | 0.5 | 10 | 3 | 3 | 0 |" in table
    assert transience_note(flip_answer(summary)) == ""  # every generalizing member kept it
    assert "**Transient:**" not in write_report(tmp_path).read_text()
    lost = summary.assign(retained=summary["generalized"] & (summary["seed"] == 0))  # one per cell kept it
    assert "| sum2-max | 0.1 | 2L/2H | 0.9 | 10 | 7 | 1 | 6 |" in transient_counts(lost)
    note = (" Most of this generalization is transient: 2 of the 10 members that reached 100% kept it to the end, per "
            "cell under \"Transient generalization\", so the rates count passing hits.")
    assert transience_note(flip_answer(lost)) == note
    lost.to_parquet(tmp_path / "summary.parquet", index=False)
    assert f"- **Transient:**{note}" in write_report(tmp_path).read_text()


def test_fragility_one_sided_fisher_and_cadence_in_the_report(tmp_path):
    """Every verdict of the answer and the statistics carries its fragility (tests/shortcut/test_fragility.py checks
    the numbers by brute force); the one-sided Fisher p per depth sits next to the flip's p; the cadence is stated."""
    from scipy import stats as sps

    from seedlab.reporting import fmt_p, p_text
    from seedlab.shortcut.report import cadence_text
    from seedlab.shortcut.rundir import open_folder, train_cadence
    from seedlab.shortcut.stats import flip_fragility
    from seedlab.stats import fisher_fragility

    summary = make_sweep(tmp_path, PAPER_LIKE)
    (tmp_path / "config.yaml").write_text("train:\n  eval_every: 10\n  adv_every: 5\n  precision: bf16\n")
    text = write_report(tmp_path).read_text()
    assert ("**Cadence:** evaluations every 10 epochs (`train.eval_every`), the adversarial split alone also every 5 "
            "epochs (`train.adv_every`)") in text and "precision bf16 (`train.precision`)" in text
    assert "### Cadence: every 5 epoch(s) vs the evaluations every 10" in text  # the sensitivity table (test_stats)
    # the answer's Fisher verdicts: 0/10 -> 7/10 (2L) loses significance after 2 changes (1/10 vs 6/10), 3/10 -> 0/10
    # (1L) gains it after 2 (5/10 vs 0/10)
    assert fisher_fragility(7, 10, 0, 10)["fragility"] == 2 and fisher_fragility(0, 10, 3, 10)["fragility"] == 2
    # beside each depth's Fisher p: the exact one-sided Fisher p of its move the paper's way
    p2 = sps.fisher_exact([[7, 3], [0, 10]], alternative="greater").pvalue  # 2L: higher at r = 0.9
    p1 = sps.fisher_exact([[0, 10], [3, 7]], alternative="less").pvalue  # 1L: lower at r = 0.9
    assert f"2L 0% → 70%, p = 0.0031, one-sided {p_text(p2)}, fragility 2" in text
    assert f"1L 30% → 0%, p = 0.21, one-sided {p_text(p1)}, reverse fragility 2" in text
    assert "the flip's p is the larger, 0.041: shown." in text
    # the flip verdict's fragility: one fewer 1L member generalizing at r = 0.5 (3 -> 2 of 10) un-shows it
    f = flip_fragility(summary)
    assert f.shown and f.fragility == 1 and f.changes == ((1, (0.5,), -1),) and f.p_after >= 0.05
    assert (f"Fragility 1: changing 1 member's outcome — 1L at r=0.5: 1 fewer generalized — moves the flip's p to "
            f"{fmt_p(f.p_after)}, and the flip would not be shown") in text
    # the statistics: a fragility column in the contrasts and in the flip table
    assert "| p | fragility |" in text
    assert "| sum2-max | 2L/2H | 0.1 | 0.5 vs 0.9 | 0% vs 70% | 0 | 0.0031 | 2 |" in text
    assert "| sum2-max | 1L/2H | 0.1 | 0.5 vs 0.9 | 30% vs 0% | ∞ | 0.21 | 2 (reverse) |" in text
    flip_row = next(line for line in text.splitlines() if line.startswith("| sum2-max | 0.1 | 2H |"))
    assert flip_row.endswith("| shown | 1 |")
    # a config from before adv_every and precision were set: only at the evaluations, fp32; no config: unknown
    (tmp_path / "config.yaml").write_text("train:\n  eval_every: 20\n")
    line = cadence_text(train_cadence(open_folder(tmp_path)))
    assert "every 20 epochs (`train.eval_every`), the adversarial split only at those evaluations" in line
    assert "precision fp32 (`train.precision`)" in line
    (tmp_path / "config.yaml").unlink()
    assert "unknown" in cadence_text(train_cadence(open_folder(tmp_path)))


def test_amplification_in_the_saturated_window_in_both_spaces(tmp_path):
    """The window is set by train.gradients.saturated_loss from the folder's config (its default without one); the
    table shows the logit-space ratio beside the calibrated model's and the parameter-space ratio."""
    from seedlab.shortcut.report import gradient_tables
    from seedlab.shortcut.rundir import SweepDir

    summary = make_sweep(tmp_path, {(2, 0.9): 2}, seeds=4)
    losses = {0: 0.01, 50: 0.03, 100: 0.08}  # the consistent group's mean loss at each epoch
    rows = [{"member": m.member, "epoch": e, "cosine": -0.1, "pair_cosine": -0.1, "loss_consistent": lc, "loss_anti": 1.0,
             "logit_grad_ratio": 10.0 + e / 10 + m.seed, "per_example_ratio": 3.0 + m.seed, "expected_ratio": 9.0}
            for m in summary.itertuples() for e, lc in losses.items()]
    pd.DataFrame(rows).to_parquet(tmp_path / "gradients.parquet", index=False)
    header = "| task | model | r | members saturated | logit space (25/50/75%) | calibrated model | parameter space (25/50/75%) |"
    text = gradient_tables(summary, SweepDir(tmp_path))
    # default 0.05: epochs 0 and 50, so member medians 12.5 + seed (seeds 0..3) -> quartiles 13.25 / 14 / 14.75
    assert "is below 0.05 nats (`train.gradients.saturated_loss`)" in text and header in text
    assert "| sum2-max | 2L/2H | 0.9 | 4/4 | 13.2 / 14 / 14.8 | 9 | 3.75 / 4.5 / 5.25 |" in text
    (tmp_path / "sweep.yaml").write_text("train:\n  gradients: {enabled: true, saturated_loss: 0.02}\n")
    text = gradient_tables(summary, SweepDir(tmp_path))  # epoch 0 alone: 10 + seed
    assert "is below 0.02 nats" in text and "| sum2-max | 2L/2H | 0.9 | 4/4 | 10.8 / 11.5 / 12.2 | 9 | 3.75 / 4.5 / 5.25 |" in text
    (tmp_path / "sweep.yaml").write_text("train:\n  gradients: {saturated_loss: 0.005}\n")
    assert "| sum2-max | 2L/2H | 0.9 | 0/4 | — / — / — | 9 | — / — / — |" in gradient_tables(summary, SweepDir(tmp_path))


def test_head_conflict_against_the_other_heads(tmp_path):
    """With circuits.parquet: the shortcut head's conflict beside the mean of each member's other heads, generalizing
    and non-generalizing members apart, as shapes (✓ by the rule with its minimum rise) and mean [95% t interval]."""
    from seedlab.shortcut.report import est_text, head_conflict_section
    from seedlab.shortcut.rundir import SweepDir
    from seedlab.stats import mean_ci

    summary = make_sweep(tmp_path, {(2, 0.9): 2}, seeds=4, heads=2)
    epochs = (0, 50, 100)
    shortcut = {True: [0.2, -0.6, -0.1], False: [0.2, -0.6, -0.5]}  # in the shortcut head: resolves / persists
    rows, grows, crows = [], [], []
    for m in summary.itertuples():
        for i, e in enumerate(epochs):
            grows.append({"member": m.member, "epoch": e, "cosine": -0.1, "pair_cosine": -0.1})
            for layer, head in ((0, 0), (0, 1), (1, 0), (1, 1)):
                own = (layer, head) == (1, m.seed % 2)  # the shortcut head: L1H0 or L1H1
                c = shortcut[m.generalized][i] + 0.01 * m.seed if own else -0.05 + 0.01 * layer
                rows.append({"member": m.member, "epoch": e, "layer": layer, "head": head, "cosine": c, "pair_cosine": c / 2})
                crows.append({"member": m.member, "epoch": e, "layer": layer, "head": head,
                              "qk_rho_value": 0.9 if own else 0.1, "attn_pos0": 0.0})
    pd.DataFrame(grows).to_parquet(tmp_path / "gradients.parquet", index=False)
    heads = pd.DataFrame(rows)
    heads.to_parquet(tmp_path / "gradients_heads.parquet", index=False)
    pd.DataFrame(crows).to_parquet(tmp_path / "circuits.parquet", index=False)
    section = head_conflict_section(summary, SweepDir(tmp_path)).split("#### Against a control: the shortcut head and the other heads", 1)[1]
    assert "| model | generalized | head | members | cosine: lowest → last | pair_cosine: lowest → last |" in section
    # medians over members: generalized 0.205 -> -0.595 -> -0.095 in the shortcut head; the other heads flat
    assert "| 2L | yes | shortcut | 2 | -0.595 → -0.095 ✓ | -0.297 → -0.0475 ✓ |" in section
    assert "| 2L | no | shortcut | 2 | -0.575 → -0.475 |" in section
    assert "| 2L | yes | other | 2 | -0.0467 → -0.0467 |" in section  # (-0.05 - 0.05 - 0.04) / 3
    assert ("| model | r | generalized | epoch | members | cosine: shortcut head | cosine: other heads | "
            "pair_cosine: shortcut head | pair_cosine: other heads |") in section
    mean, lo, hi, _ = mean_ci([-0.1, -0.09])  # generalized seeds 0 and 1 at epoch 100
    assert f"| 2L/2H | 0.9 | yes | 100 | 2 | {est_text(mean, lo, hi)} | -0.0467 [-0.0467, -0.0467] |" in section
    assert est_text(mean, lo, hi) == "-0.095 [-0.159, -0.031]"  # three decimals: the half-width, 0.064, to two digits


def test_the_report_states_what_generalized_meant_when_the_jobs_trained(tmp_path):
    import json

    from seedlab.shortcut.report import definition
    from seedlab.shortcut.rundir import OLD_DEFINITION, SweepDir
    from seedlab.shortcut.train import GENERALIZED

    (tmp_path / "sweep.yaml").write_text("{}")
    for key, meta in (("a", {"seconds": 1}), ("b", {"generalized": GENERALIZED}), ("c", {"generalized": GENERALIZED})):
        (tmp_path / "jobs" / key).mkdir(parents=True)
        (tmp_path / "jobs" / key / "meta.json").write_text(json.dumps(meta))
    summary = pd.DataFrame({"job": ["a", "a", "b", "c"]})
    assert definition(SweepDir(tmp_path), summary) == f"{GENERALIZED} in 2 jobs; {OLD_DEFINITION} in 1 job"
    (tmp_path / "jobs" / "a" / "meta.json").write_text(json.dumps({"generalized": GENERALIZED}))
    assert definition(SweepDir(tmp_path), summary) == GENERALIZED and "validation accuracy >= 99%" in GENERALIZED


def _depth(text: str) -> int:
    """The deepest nesting of parentheses in ``text``."""
    depth = deepest = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    return deepest


@pytest.mark.parametrize("outcomes, shown", [
    (PAPER_LIKE, True),
    ({(2, 0.5): 2, (2, 0.9): 3, (1, 0.5): 1, (1, 0.9): 1}, False),  # 2L up, 1L level: once "Partly"
    ({(2, 0.5): 0, (2, 0.9): 7, (1, 0.5): 1, (1, 0.9): 0}, False),  # both the paper's way, the test does not reject
    ({(2, 0.5): 0, (2, 0.9): 0, (1, 0.5): 0, (1, 0.9): 0}, False),  # nothing to test
])
def test_the_opening_is_the_tests_decision_in_one_plain_sentence(tmp_path, outcomes, shown):
    from seedlab.shortcut.stats import flip_answer

    summary = make_sweep(tmp_path, outcomes, seeds=8)
    text = write_report(tmp_path).read_text()
    opening = text.split("## Headline")[0]
    sentence = text.split("\n\n")[1]
    a = flip_answer(summary)
    assert a.verdict == ("shown" if shown else "not shown") and (a.slopes is not None and a.slopes["flip"]) == shown
    assert sentence.startswith("**Answer:** The flip") and sentence.count(". ") == 0 and sentence.endswith(".")
    assert (" is shown in sum2-max" in sentence) == shown and (" is not shown in sum2-max" in sentence) == (not shown)
    for word in ("partly", "in direction only", "yes:", "no:"):
        assert word not in opening.lower()
    assert _depth(opening) <= 1  # no nested parentheses
    assert len(opening) < 4000 and len(opening.splitlines()) < 20  # one screen
    if a.slopes is None:
        assert "its test cannot run, because none of its 32 1- and 2-layer members generalized." in sentence


def test_a_zero_estimate_prints_as_zero_at_its_intervals_precision():
    from seedlab.shortcut.report import est_text

    assert est_text(7.21e-15, -13.2, 13.2) == "0 [-13, 13]"
    assert est_text(1.61e-16, -7.41, 7.41) == "0 [-7.4, 7.4]"
    assert est_text(1.47, -3.9, 6.84) == "1.5 [-3.9, 6.8]"
    assert est_text(-0.0004, -0.0312, 0.0304) == "0 [-0.031, 0.030]"
    assert est_text(2.5, 1.0, float("inf")) == "2.5 [1, ∞]" and est_text(0.3, float("nan"), float("nan")) == "0.3"


def test_the_phases_are_medians_over_the_same_members(tmp_path):
    """Per member, shortcut <= phase 2 <= generalization; medians over different members need not keep that order."""
    summary = make_sweep(tmp_path, {(2, 0.9): 3, (1, 0.9): 0}, seeds=6)
    learned = {0: 100, 1: 100, 2: 100, 3: 10, 4: 10, 5: 10}  # the generalizing seeds (0-2) learned it late
    summary = summary.assign(shortcut_epoch=summary["seed"].map(learned),
                             phase2_epoch=pd.array([110 + 10 * s if g else None for s, g in
                                                    zip(summary["seed"], summary["generalized"])], dtype="Int64"),
                             gen_epoch=pd.array([150 + 10 * s if g else None for s, g in
                                                 zip(summary["seed"], summary["generalized"])], dtype="Int64"))
    summary.to_parquet(tmp_path / "summary.parquet", index=False)
    text = write_report(tmp_path).read_text()
    assert ("| model | r | members | shortcut learned: median (members) | members with all three phases | "
            "their shortcut learned | their phase 2 onset | their generalization |") in text
    # over all six members the shortcut's median is 55; over the three with all phases it is 100, before 120 and 160
    assert "| 2L/2H | 0.9 | 6 | 55 (6) | 3 | 100 | 120 | 160 |" in text
    assert "| 1L/2H | 0.9 | 6 | 55 (6) | 0 | — | — | — |" in text


def test_the_per_member_tables_come_last(demo_sweep):
    text = write_report(demo_sweep()).read_text()
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert heads == ["## Headline: generalization rate", "## Figures", "## Statistics", "## Mechanism",
                     "## Per-member tables"]
    last = text.split("## Per-member tables", 1)[1]
    assert last.lstrip().startswith("### Head roles through training") and "**Head roles per seed through training.**" in last
    assert "![" not in text.split("## Statistics", 1)[1]  # every figure comes before the tables
