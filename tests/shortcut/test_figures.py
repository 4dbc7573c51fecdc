"""The figures the report writes pass the figure check (tests/figcheck.py), and keep the one colour map: a split, a
depth, a weight decay has one colour in every panel and figure, and the heads a palette of their own."""

from __future__ import annotations

import figcheck
import numpy as np
import pandas as pd
import pytest
from helpers import summary_of_cells
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from seedlab.reporting import new_figure
from seedlab.shortcut import circuits_report, figures, stats
from seedlab.shortcut.report import write_report
from seedlab.shortcut.rundir import SweepDir

#: every figure the report of a sweep with gradients and circuits writes
ALL = {"rate_vs_ratio.png", "curves.png", "gen_epoch.png", "transient.png", "aligned.png", "grad_conflict.png",
       "grad_amplification.png", "fingerprints.png", "ablation.png", "head_roles.png"}


def _colors(fig, label_part: str = "") -> dict[str, str]:
    """label -> its colour (hex) in the figure's legends, for the labels containing ``label_part``."""
    out = {}
    for label, styles in figcheck.legend_styles(fig).items():
        if label_part in label:
            (style,) = styles  # one label, one style across the figure
            out[label] = style[0]
    return out


def _render(folder, monkeypatch):
    figs = figcheck.capture(monkeypatch, figures, circuits_report)
    write_report(folder)
    return figs, folder


@pytest.fixture(scope="module")
def default_figures(tmp_path_factory, demo_sweep_writer):
    """The figures of the default demo sweep's report, drawn once for the tests that only read them."""
    folder = tmp_path_factory.mktemp("default") / "sweep"
    demo_sweep_writer(folder)
    with pytest.MonkeyPatch.context() as mp:
        return _render(folder, mp)


@pytest.fixture
def report_figures(demo_sweep, monkeypatch, default_figures):
    """``report_figures(outcomes=None, **kw)``: the figures the report of :func:`conftest.write_demo_sweep`'s folder
    draws, by file name, and the folder (the default sweep's drawn once for the module)."""

    def write(outcomes=None, **kw):
        if outcomes is None and not kw:
            return default_figures
        return _render(demo_sweep(outcomes, **kw), monkeypatch)

    return write


def test_every_figure_of_the_report_passes_the_figure_check(report_figures):
    figs, folder = report_figures()
    assert set(figs) == ALL and all((folder / name).is_file() for name in ALL)
    figcheck.check_all(figs)  # legends drawn, look-alike labels, clipping, empty panels, titles, aspect 1:3..3:1


def test_two_weight_decays_and_head_counts_pass_it_too(report_figures):
    outcomes = {(2, 0.5): 1, (2, 0.9): 3, (1, 0.5): 2, (1, 0.9): 0}
    figs, _ = report_figures(outcomes, seeds=4, heads=1, wd=0.4)
    figcheck.check_all(figs)


def test_one_palette_per_kind_of_condition(report_figures):
    figs, _ = report_figures()
    splits = {s: to_hex(c) for s, c in figures.SPLIT_COLORS.items()}
    depths = {to_hex(c) for c in figures.DEPTH_COLORS.values()}
    wds = {to_hex(c) for c in figures.WD_COLORS}
    heads = {to_hex(c) for c in figures.COMPONENT_COLORS}
    groups = [set(splits.values()), depths, wds, heads, {to_hex(figures.REFERENCE_COLOR)}]
    assert sum(map(len, groups)) == len(set().union(*groups))  # no colour means two kinds of things
    # a split: one colour in the curves and the aligned curves, and the legends say what its rows are, not an r
    for name in ("curves.png", "aligned.png"):
        got = _colors(figs[name])
        assert got == {"val: every row shortcut-consistent": splits["val"], "adv: every row anti-shortcut": splits["adv"]}
    assert "trained at r = 0.5" in " ".join(ax.get_title() for ax in figs["curves.png"].axes)
    # a head: one colour in the fingerprints and the head roles, from the heads' palette
    prints = {label.split()[0]: c for label, c in _colors(figs["fingerprints.png"], "H").items()}
    roles = _colors(figs["head_roles.png"], "H")
    assert roles == {h: prints[h] for h in roles} and set(roles.values()) <= heads
    assert len(set(roles.values())) == len(roles) == 4  # 2L/2H: four heads, four colours
    # a depth: one colour in the rate, conflict and amplification figures
    rate, conflict, amp = (_colors(figs[n]) for n in ("rate_vs_ratio.png", "grad_conflict.png", "grad_amplification.png"))
    for layers in (1, 2):
        want = to_hex(figures.depth_color(layers))
        assert rate[f"{layers}L/2H"] == conflict[f"{layers}L"] == amp[f"{layers}L"] == want


def test_rate_axis_fits_the_ratios_run(report_figures):
    figs, _ = report_figures()
    ax = figs["rate_vs_ratio.png"].axes[0]
    lo, hi = ax.get_xlim()
    assert 0.4 <= lo < 0.5 and 0.9 < hi <= 1.0  # 0.5 and 0.9 (chance at 0.5) with a margin, not 0..1
    np.testing.assert_allclose(ax.get_xticks(), [0.5, 0.9])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.5", "0.9"]


def test_an_absent_component_is_not_drawn_as_no_change(report_figures):
    figs, _ = report_figures()
    fig = figs["ablation.png"]
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    image = panels[0].images[0]
    white = to_hex(image.cmap(image.norm(0.0)))  # the colour of no change
    absent = [p for p in panels[0].patches if isinstance(p, Rectangle) and p.get_hatch()]
    assert len(absent) == 2 * 3  # the 1L rows lack L1H0, L1H1 and L1MLP
    assert {to_hex(p.get_facecolor()) for p in absent} == {to_hex(figures.ABSENT_COLOR)} != {white}
    labels = [t.get_text() for lg in fig.legends for t in lg.texts]
    assert labels == ["absent: the model has no such component"]
    assert all("no change" in ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>")


def test_head_roles_print_the_count_and_say_when_capped(report_figures):
    figs, _ = report_figures()
    titles = [ax.get_title() for ax in figs["head_roles.png"].axes if ax.get_visible()]
    # 1L: 14 members never generalized, 12 drawn; 2L: 5 generalized, all drawn
    assert any(t.startswith("1L/2H never generalized, first 12 of 14 members") for t in titles)
    assert any(t.startswith("2L/2H generalized, 5 members") for t in titles)
    assert not any("(12)" in t for t in titles)


def test_captions_describe_what_the_run_holds(demo_sweep):
    text = write_report(demo_sweep()).read_text()  # one task (max), one weight decay, one head count
    captions = "\n".join(line for line in text.split("## Statistics")[0].splitlines() if line.startswith("*"))
    for absent in ("0.4", "more heads", "first-element", "first tasks", "r = 1"):
        assert absent not in captions, absent
    assert "QK ρ with token value near 1" in captions
    text = write_report(demo_sweep(seeds=4, wd=0.4, heads=1)).read_text()
    assert "at high weight decay" not in text  # still one weight decay: 0.4 alone


def test_gradient_figures_colour_each_depth_alike(tmp_path, monkeypatch):
    summary = summary_of_cells([(2, 0.5, 0, 10), (2, 0.9, 7, 10), (1, 0.5, 3, 10), (1, 0.9, 0, 10)])
    summary = summary.drop(columns="heads").assign(heads=2, member=range(len(summary)))
    rows = [{"member": m.member, "epoch": e, "cosine": -0.1, "pair_cosine": -0.1, "loss_consistent": 0.01,
             "loss_anti": 1.0, "logit_grad_ratio": 10.0, "per_example_ratio": 3.0, "expected_ratio": 9.0}
            for m in summary.itertuples() for e in (0, 50)]
    pd.DataFrame(rows).to_parquet(tmp_path / "gradients.parquet", index=False)
    figs = figcheck.capture(monkeypatch, figures)
    folder = SweepDir(tmp_path)
    figures.rate_vs_ratio_figure(summary, stats.rate_cells(summary), folder)
    figures.gradient_figures(summary, folder)
    figcheck.check_all(figs)
    rate, conflict, amplification = (_colors(figs[n]) for n in ("rate_vs_ratio.png", "grad_conflict.png",
                                                                 "grad_amplification.png"))
    for layers in (1, 2):
        want = to_hex(figures.depth_color(layers))
        assert rate[f"{layers}L/2H"] == conflict[f"{layers}L"] == amplification[f"{layers}L"] == want


def test_weight_decays_and_heads_keep_their_colours():
    summary = pd.DataFrame({"weight_decay": [0.4, 0.1, 0.1]})
    assert figures.wd_colors(summary) == {0.1: figures.WD_COLORS[0], 0.4: figures.WD_COLORS[1]}
    colors = figures.COMPONENT_COLORS
    assert figures.component_colors(["L1H0", "L0H0", "L0H0"]) == {"L0H0": colors[0], "L1H0": colors[1]}


# ---------------------------------------------------------------- the figure check itself


def _good():
    fig, axes = new_figure(1, 2)
    for ax, title in zip(axes, ("left", "right"), strict=True):
        ax.plot([0, 1], [0, 1], color="tab:green", label="2L")
        ax.plot([0, 1], [1, 0], color="tab:purple", label="1L")
        ax.axvline(0.5, color="gray", ls="--", label="chance")
        ax.set_title(title)
        ax.legend()
    return fig, axes


def test_the_figure_check_passes_a_readable_figure():
    fig, _ = _good()
    assert figcheck.problems(fig) == []


def test_the_figure_check_finds_each_problem():
    fig, axes = _good()
    axes[0].plot([], [], color="tab:red", label="an arm that draws nothing")  # a proxy for nothing
    axes[0].legend()
    assert figcheck.problems(fig) == [
        "legend entry 'an arm that draws nothing': nothing drawn in its style ('#d62728', '-', None, None)"]

    fig, axes = _good()
    axes[1].plot([0, 1], [0.5, 0.5], color="tab:green", label="1L/4H")  # two labels drawn alike
    axes[1].legend()
    assert figcheck.problems(fig) == ["legend entries '2L' and '1L/4H' look alike: ('#2ca02c', '-', None, None)"]

    fig, axes = _good()
    axes[0].scatter([2.0], [0.5], color="tab:green")
    axes[0].set_xlim(0, 1)  # the scatter's x = 2 is off the axis
    axes[1].set_ylim(0, 0.9)
    got = figcheck.problems(fig)
    assert "left: PathCollection spans x 2..2 beyond the axis 0..1" in got
    assert "right: 2L spans y 0..1 beyond the axis 0..0.9" in got

    fig, axes = new_figure(1, 3, w=6.0, h=2.0)  # 18 x 2 in: a strip
    for ax in axes:
        ax.set_title("same")
    axes[0].axhline(0, color="gray")  # a reference line alone is not data
    axes[1].plot([0, 1], [0, 1])
    axes[2].add_patch(Rectangle((0, 0), 0.5, 0.5))
    got = figcheck.problems(fig)
    assert got[:3] == ["aspect 9.00 (width 18.0 in, height 2.0 in) outside 0.33..3.00", "two panels titled 'same'",
                       "same: no data drawn"]
    assert len(got) == 3

    fig, axes = _good()
    fig.legend(handles=[Patch(facecolor="#d9d9d9", hatch="///", label="absent"),
                        Line2D([], [], color="tab:green", label="2L")], loc="outside upper right")
    assert figcheck.problems(fig) == ["legend entry 'absent': nothing drawn in its style ('#d9d9d9', None, None, '///')"]
    axes[0].add_patch(Rectangle((0.2, 0.2), 0.1, 0.1, facecolor="#d9d9d9", hatch="///"))
    assert figcheck.problems(fig) == []
