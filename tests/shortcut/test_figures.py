"""The figures' one colour map: a depth, a weight decay, a head has one colour in every panel and figure."""

from __future__ import annotations

import pandas as pd
from helpers import summary_of_cells
from matplotlib.collections import PathCollection
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer

from seedlab.shortcut import figures, stats
from seedlab.shortcut.rundir import SweepDir


def _drawn(monkeypatch) -> list:
    """The matplotlib figures the figure functions draw, in order (instead of writing them)."""
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: drawn.append(fig) or path)
    return drawn


def _legend_colors(fig) -> dict[str, str]:
    """label -> colour of every labelled line and collection in the figure's axes."""
    out = {}
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        for h, label in zip(handles, labels, strict=True):
            if isinstance(h, ErrorbarContainer):
                h = h.lines[0]
            color = h.get_facecolor()[0] if isinstance(h, PathCollection) else h.get_color()  # a scatter, a line
            out.setdefault(label, set()).add(to_hex(color))
    return out


def test_a_depth_has_one_colour_in_every_figure(tmp_path, monkeypatch):
    summary = summary_of_cells([(2, 0.5, 0, 10), (2, 0.9, 7, 10), (1, 0.5, 3, 10), (1, 0.9, 0, 10)])
    summary = summary.drop(columns="heads").assign(heads=2, member=range(len(summary)))
    rows = [{"member": m.member, "epoch": e, "cosine": -0.1, "pair_cosine": -0.1, "loss_consistent": 0.01,
             "loss_anti": 1.0, "logit_grad_ratio": 10.0, "per_example_ratio": 3.0, "expected_ratio": 9.0}
            for m in summary.itertuples() for e in (0, 50)]
    pd.DataFrame(rows).to_parquet(tmp_path / "gradients.parquet", index=False)
    drawn, folder = _drawn(monkeypatch), SweepDir(tmp_path)
    figures.rate_vs_ratio_figure(summary, stats.rate_cells(summary), folder)
    figures.gradient_figures(summary, folder)
    rate, conflict, amplification = map(_legend_colors, drawn)
    for layers in (1, 2):
        want = {to_hex(figures.depth_color(layers))}
        assert rate[f"{layers}L/2H"] == conflict[f"{layers}L"] == amplification[f"{layers}L"] == want
    assert figures.depth_color(1) != figures.depth_color(2)
    assert not {figures.depth_color(1), figures.depth_color(2)} & set(figures.SPLIT_COLORS.values())


def test_weight_decays_and_heads_keep_their_colours():
    summary = pd.DataFrame({"weight_decay": [0.4, 0.1, 0.1]})
    assert figures.wd_colors(summary) == {0.1: figures.WD_COLORS[0], 0.4: figures.WD_COLORS[1]}
    assert figures.component_colors(["L1H0", "L0H0", "L0H0"]) == {"L0H0": "C0", "L1H0": "C1"}
