"""twins figures on the tiny real design: one colour per arm in every panel of every figure (the registry's,
figures.COLORS; each ordinary row a shade of its own), every figure passing the figure check (tests/figcheck.py:
legend entries drawn, no two alike, no data beyond an axis, no empty panel, an aspect ratio a page holds), and a
measure that is 0 everywhere named in the caption instead of drawn on a log axis."""

import figcheck
import pandas as pd
from helpers import copy_run
from matplotlib.colors import to_rgb

from seedlab.twins import figures
from seedlab.twins.config import CONDITIONS
from seedlab.twins.rundir import Measured

DRAW = (figures.path_figure, figures.loss_diff_figure, figures.distance_barrier_figure, figures.cka_figure,
        figures.passage_figure, figures.distance_course_figure)


def _drawn(d, monkeypatch):
    """Every figure of ``d``: {figure function name: (the matplotlib Figure or None, the Fig)}."""
    kept, save = {}, figures.save_figure

    def keep(fig, path):
        kept["fig"] = fig
        return save(fig, path)

    monkeypatch.setattr(figures, "save_figure", keep)
    out = {}
    for draw in DRAW:
        kept.clear()
        fig = draw(d)
        out[draw.__name__] = (kept.get("fig"), fig)
    return out


def _handle_color(h):
    if hasattr(h, "get_color"):  # a line
        return to_rgb(h.get_color())
    if hasattr(h, "lines"):  # an errorbar: its data line
        return to_rgb(h.lines[0].get_color())
    if hasattr(h, "patches"):  # bars: the first bar
        return to_rgb(h.patches[0].get_facecolor())
    return to_rgb(h.get_facecolor()[0])  # a scatter


def test_every_condition_has_one_colour_in_every_figure(design, tmp_path, monkeypatch):
    assert set(CONDITIONS) | {"seed"} == set(figures.COLORS)
    assert len({to_rgb(c) for c in figures.COLORS.values()}) == len(figures.COLORS)  # distinct
    d = Measured.read(copy_run(design, tmp_path))
    seen: dict[str, set] = {}
    for name, (fig, _) in _drawn(d, monkeypatch).items():
        if fig is None:
            continue
        for ax in fig.axes:
            for h, label in zip(*ax.get_legend_handles_labels()):
                cond = "seed" if label.startswith("different seed") else label.split(",")[0]
                seen.setdefault(cond, set()).add((_handle_color(h), name))
    assert {"fluent-fabricated", "fluent-attested", "nudge", "matched-gradient", "weight-kick", "ordinary-row.0",
            "ordinary-row.1", "seed"} <= set(seen)
    for cond, colors in seen.items():
        assert {c for c, _ in colors} == {to_rgb(figures.color(cond))}, (cond, colors)
    assert len({to_rgb(figures.color(c)) for c in seen}) == len(seen)  # no two arms share one (the ordinary rows neither)


def test_every_figure_passes_the_figure_check(design, tmp_path, monkeypatch):
    """Legend entries drawn (passage_ce lists no null without a text of its own), distinct, no data beyond an axis
    (the CKA on a log axis of 1 − CKA instead of bars clipped at 1), no empty panel, a page's aspect ratio."""
    d = Measured.read(copy_run(design, tmp_path))
    out = _drawn(d, monkeypatch)
    for name, (fig, _) in out.items():
        assert fig is not None, name
        figcheck.check(fig, name)
    labels = lambda name: {t for ax in out[name][0].axes if ax.get_legend() for t in (x.get_text() for x in ax.get_legend().texts)}
    assert labels("passage_figure") == {"fluent-fabricated", "fluent-attested", "ordinary-row.0", "ordinary-row.1"}
    assert "matched-gradient, nudge, weight-kick inject no text of their own" in out["passage_figure"][1].caption
    assert labels("path_figure") >= {"different seeds", "fluent-fabricated", "ordinary-row.0", "nudge"}


def test_a_barrier_of_zero_everywhere_is_said_not_drawn(design, tmp_path, monkeypatch):
    d = Measured.read(copy_run(design, tmp_path))
    d.measures.loc[d.measures.kind == "injected", "barrier"] = 0.0
    d.checkpoints["barrier"] = 0.0
    out = _drawn(d, monkeypatch)
    fig, f = out["distance_barrier_figure"]
    assert fig is None and f.path is None and "every injected run's barrier to its twin is exactly 0" in f.caption
    fig, f = out["distance_course_figure"]
    assert len(fig.axes) == 1 and "No barrier panel: the barrier to the twin is exactly 0 at every checkpoint" in f.caption
    one = d.checkpoints.condition == "nudge"  # one condition with a barrier: the panel is drawn, the others named
    d.checkpoints.loc[one, "barrier"] = pd.Series(1e-6, index=d.checkpoints.index)[one]
    fig, f = _drawn(d, monkeypatch)["distance_course_figure"]
    assert len(fig.axes) == 2 and "The barrier is exactly 0 for fluent-attested, fluent-fabricated" in f.caption
