"""A check any study's tests run on the matplotlib figures its report draws (importable as ``figcheck``).

:func:`problems` lists what a newcomer would trip over in one ``matplotlib.figure.Figure``:

- a legend entry with nothing drawn in its style (a proxy handle for an arm that draws nothing);
- two labels of one legend drawn alike (same colour, line style, marker and hatch), or one label drawn in
  two styles across the figure's legends;
- data outside its axis (any finite point of a line, scatter, bar, error bar or image beyond the axis limits,
  or a reference line such as ``axvline`` off the axis);
- a visible panel with no data in it (reference lines alone do not count), two panels with one title, or a
  title wider than its panel (drawn with Agg, as the reports save it);
- an aspect ratio a page cannot hold (width / height outside ``aspect``, 1:3 to 3:1 by default).

:func:`check` raises with all of them. :func:`capture` records the figures a report module saves (by file
name) while the report is written, so a test can run :func:`check` on each; :func:`legend_styles` gives each
label's style, to compare one condition's colour across figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import Collection, LineCollection, PathCollection
from matplotlib.colors import to_hex, to_rgba
from matplotlib.container import ErrorbarContainer
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

ASPECT = (1 / 3, 3.0)  # width / height a page holds
_NO_LINE = ("None", "none", "", " ", None)


# ---------------------------------------------------------------- what an artist looks like


def _colors(artist) -> set[str]:
    """Every colour the artist shows (hex, alpha ignored; fully transparent colours left out)."""
    raw = []
    if isinstance(artist, Line2D):
        if artist.get_linestyle() not in _NO_LINE:
            raw.append(artist.get_color())
        if artist.get_marker() not in _NO_LINE:
            raw += [artist.get_markerfacecolor(), artist.get_markeredgecolor()]
    elif isinstance(artist, Collection):
        raw += list(artist.get_facecolors()) + list(artist.get_edgecolors())
    elif isinstance(artist, Patch):
        raw += [artist.get_facecolor(), artist.get_edgecolor()]
    out = set()
    for c in raw:
        if isinstance(c, str) and c.lower() == "none":
            continue
        rgba = to_rgba(c)
        if rgba[3] > 0:
            out.add(to_hex(rgba, keep_alpha=False))
    return out


def _main_color(artist) -> str | None:
    """The one colour that names the artist's condition: a line's colour, a marker's face (its edge when hollow),
    a collection's or patch's face (its edge when hollow)."""
    if isinstance(artist, Line2D):
        if artist.get_linestyle() not in _NO_LINE:
            return to_hex(artist.get_color(), keep_alpha=False)
        face = artist.get_markerfacecolor()
        use = artist.get_markeredgecolor() if isinstance(face, str) and face.lower() == "none" else face
        return to_hex(use, keep_alpha=False)
    if isinstance(artist, Collection):
        faces = [c for c in artist.get_facecolors() if c[3] > 0]
        edges = [c for c in artist.get_edgecolors() if c[3] > 0]
        pick = faces or edges
        return to_hex(pick[0], keep_alpha=False) if pick else None
    if isinstance(artist, Patch):
        face = to_rgba(artist.get_facecolor())
        return to_hex(face if face[3] > 0 else artist.get_edgecolor(), keep_alpha=False)
    return None


def _unwrap(handle):
    """An error bar's legend handle stands for its data line (colour, line style and marker)."""
    if isinstance(handle, ErrorbarContainer):
        return handle.lines[0] if handle.lines[0] is not None else handle.lines[2][0]
    return handle


def style(handle) -> tuple:
    """(colour, line style, marker, hatch) of a legend handle; None where the handle has no such property."""
    h = _unwrap(handle)
    ls = marker = hatch = None
    if isinstance(h, Line2D):
        ls = None if h.get_linestyle() in _NO_LINE else h.get_linestyle()
        marker = None if h.get_marker() in _NO_LINE else str(h.get_marker())
    if isinstance(h, Patch):
        hatch = h.get_hatch() or None
    return (_main_color(h), ls, marker, hatch)


# ---------------------------------------------------------------- what is drawn where


def _panels(fig) -> list[Axes]:
    """The figure's visible axes, colour bars left out."""
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


def _artists(ax: Axes) -> list:
    return [a for a in (*ax.lines, *ax.collections, *ax.patches, *ax.images) if a.get_visible()]


def _points(artist, ax: Axes) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(x, y) of the artist's finite data in data coordinates; None for a coordinate not in data units (the
    axes-fraction side of ``axvline``), (None, None) for an artist not placed in data units."""
    tr = artist.get_transform()
    if isinstance(artist, AxesImage):
        x0, x1, y0, y1 = artist.get_extent()
        return np.array([x0, x1], float), np.array([y0, y1], float)
    if isinstance(artist, Line2D):
        xy = np.asarray(artist.get_xydata(), float).reshape(-1, 2)
    elif isinstance(artist, PathCollection):
        if artist.get_offset_transform() is not ax.transData:
            return None, None
        xy, tr = np.asarray(artist.get_offsets(), float).reshape(-1, 2), ax.transData
    elif isinstance(artist, Collection):
        paths = artist.get_paths()
        xy = np.concatenate([p.vertices for p in paths]) if paths else np.empty((0, 2))
    elif isinstance(artist, Rectangle):  # bars, heatmap cells: the corners, in the units the patch was placed in
        x, y, w, h = artist.get_x(), artist.get_y(), artist.get_width(), artist.get_height()
        xy, tr = np.array([[x, y], [x + w, y + h]], float), artist.get_data_transform()
    else:
        return None, None
    xy = xy[np.isfinite(xy).all(axis=1)] if len(xy) else xy
    # by identity: a fresh axes' blended transforms equal transData in value
    if tr is ax.transData:
        return xy[:, 0], xy[:, 1]
    if tr is ax.get_xaxis_transform():
        return xy[:, 0], None
    if tr is ax.get_yaxis_transform():
        return None, xy[:, 1]
    return None, None


def _has_data(artist, ax: Axes) -> bool:
    """Whether the artist draws data (in data units on both axes, at least one finite point)."""
    x, y = _points(artist, ax)
    return x is not None and y is not None and len(x) > 0


def _drawn(artist, ax: Axes) -> bool:
    """Whether the artist shows anything: data, or a reference line with a finite position."""
    x, y = _points(artist, ax)
    return any(v is not None and len(v) > 0 for v in (x, y))


def _matches(entry: tuple, artist) -> bool:
    """Whether a drawn artist looks like a legend entry's style (colour; line style and marker where both have one;
    hatch)."""
    color, ls, marker, hatch = entry
    if color is None or color not in _colors(artist):
        return False
    if ls is not None and isinstance(artist, Line2D) and artist.get_linestyle() != ls:
        return False
    if ls is not None and not isinstance(artist, Line2D | LineCollection):
        return False
    if marker is not None and isinstance(artist, Line2D) and str(artist.get_marker()) != marker:
        return False
    if marker is not None and not isinstance(artist, Line2D | PathCollection):
        return False
    return hatch is None or (isinstance(artist, Patch) and artist.get_hatch() == hatch)


# ---------------------------------------------------------------- legends


def legend_entries(fig) -> list[tuple[str, object, list[Axes]]]:
    """Every legend entry of the figure: (label, its handle, the panels it speaks for: its own axes, or every
    panel for a figure legend). An axes legend's handle is the artist it was made from where that is known."""
    out = []
    legends = [(ax.get_legend(), [ax]) for ax in fig.axes if ax.get_legend() is not None]
    legends += [(lg, _panels(fig)) for lg in fig.legends]
    for legend, scope in legends:
        originals = {}
        if len(scope) == 1:
            for h, lab in zip(*scope[0].get_legend_handles_labels(), strict=True):
                originals.setdefault(lab, h)
        for h, text in zip(legend.legend_handles, legend.texts, strict=True):
            label = text.get_text()
            out.append((label, originals.get(label, h), scope))
    return out


def legend_styles(fig) -> dict[str, set[tuple]]:
    """label -> the set of its styles (:func:`style`) over the figure's legends."""
    out: dict[str, set[tuple]] = {}
    for label, handle, _ in legend_entries(fig):
        out.setdefault(label, set()).add(style(handle))
    return out


# ---------------------------------------------------------------- the check


def problems(fig, aspect: tuple[float, float] = ASPECT) -> list[str]:
    """Everything :func:`check` would raise about ``fig`` (module docstring), one line each."""
    out = []
    w, h = fig.get_size_inches()
    if not aspect[0] <= w / h <= aspect[1]:
        out.append(f"aspect {w / h:.2f} (width {w:.1f} in, height {h:.1f} in) outside {aspect[0]:.2f}..{aspect[1]:.2f}")
    titles = [ax.get_title() for ax in _panels(fig) if ax.get_title()]
    out += [f"two panels titled {t!r}" for t in sorted({t for t in titles if titles.count(t) > 1})]
    renderer = _renderer(fig)
    for i, ax in enumerate(_panels(fig)):
        name = ax.get_title() or f"panel {i}"
        if not any(_has_data(a, ax) for a in _artists(ax)):
            out.append(f"{name}: no data drawn")
        out += _clipped(ax, name)
        if ax.get_title():
            title, box = ax.title.get_window_extent(renderer), ax.get_window_extent(renderer)
            if title.width > 1.1 * box.width:
                out.append(f"{name}: title {title.width:.0f} px wide over a panel {box.width:.0f} px wide")
    seen: dict[str, tuple] = {}
    for label, handle, scope in legend_entries(fig):
        s = style(handle)
        own = _unwrap(handle)
        drawn_itself = any(own in _artists(ax) and _drawn(own, ax) for ax in scope)
        if not drawn_itself and not any(_matches(s, a) and _drawn(a, ax) for ax in scope for a in _artists(ax)):
            out.append(f"legend entry {label!r}: nothing drawn in its style {s}")
        if label in seen and seen[label] != s:
            out.append(f"legend entry {label!r}: drawn as {seen[label]} and as {s}")
        seen.setdefault(label, s)
    for lg in [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends):
        styles: dict[tuple, str] = {}
        for handle, text in zip(lg.legend_handles, lg.texts, strict=True):
            label = text.get_text()
            s = next((style(h) for lab, h, _ in legend_entries(fig) if lab == label), style(handle))
            if s in styles and styles[s] != label:
                out.append(f"legend entries {styles[s]!r} and {label!r} look alike: {s}")
            styles.setdefault(s, label)
    return out


def _renderer(fig):
    """The figure drawn (with Agg, as the reports save it, layout included), for the texts' sizes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _clipped(ax: Axes, name: str) -> list[str]:
    """The artists of one panel with data beyond its axis limits."""
    out = []
    for axis, lim, k in (("x", ax.get_xlim(), 0), ("y", ax.get_ylim(), 1)):
        lo, hi = min(lim), max(lim)
        tol = 1e-9 * max(hi - lo, 1e-12)
        for a in _artists(ax):
            v = _points(a, ax)[k]
            if v is None or not len(v):
                continue
            if v.min() < lo - tol or v.max() > hi + tol:
                what = a.get_label() if not str(a.get_label()).startswith("_") else type(a).__name__
                out.append(f"{name}: {what} spans {axis} {_num(v.min())}..{_num(v.max())} beyond the axis "
                           f"{_num(lo)}..{_num(hi)}")
    return out


def _num(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def check(fig, name: str = "figure", aspect: tuple[float, float] = ASPECT) -> None:
    """Raise AssertionError listing every problem of :func:`problems` (none: return)."""
    found = problems(fig, aspect)
    if found:
        raise AssertionError(f"{name}:\n  " + "\n  ".join(found))


def capture(monkeypatch, *modules) -> dict[str, object]:
    """Record every figure the modules save through their ``save_figure`` (by the file's name), still saving it:
    ``figs = capture(monkeypatch, figures, circuits_report)``, then write the report, then check ``figs``."""
    drawn: dict[str, object] = {}

    def wrap(save):
        def saving(fig, path):
            drawn[path.name] = fig
            return save(fig, path)

        return saving

    for module in modules:
        monkeypatch.setattr(module, "save_figure", wrap(module.save_figure))
    return drawn


def check_all(figs: dict[str, object], skip: Iterable[str] = ()) -> None:
    """:func:`check` every figure of :func:`capture`, raising once with every figure's problems."""
    found = {name: problems(fig) for name, fig in figs.items() if name not in set(skip)}
    bad = {name: p for name, p in found.items() if p}
    if bad:
        raise AssertionError("\n".join(f"{name}:\n  " + "\n  ".join(p) for name, p in bad.items()))
