"""What every study's report is made of: markdown blocks, number formats, tables and figures.

Figures are drawn on a ``matplotlib.figure.Figure`` (no pyplot, so no global state) and
rendered with Agg; each is a PNG beside the report, linked with a caption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Report:
    """What the sections hand to the final markdown: text blocks in order."""

    blocks: list[str] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        self.blocks.append("\n\n".join(line.rstrip() for line in lines))

    def text(self) -> str:
        return "\n\n".join(b.rstrip() for b in self.blocks) + "\n"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def fmt_p(p: float) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    return "<0.0001" if p < 1e-4 else f"{p:.2g}"


def p_text(p: float) -> str:
    """``p = 0.03`` or ``p < 0.0001``, for prose."""
    t = fmt_p(p)
    return f"p {t[0]} {t[1:]}" if t.startswith("<") else f"p = {t}"


def fmt_num(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return f"{x:.3g}"


def fmt_ci(x: float, low: float = math.nan, high: float = math.nan) -> str:
    """``0.78 [0.71, 0.82]`` (two decimals: correlations), the interval left out when absent; n/a for NaN."""
    if math.isnan(x):
        return "n/a"
    return f"{x:.2f}" + ("" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]")


def fmt_num_ci(x: float, low: float = math.nan, high: float = math.nan) -> str:
    """``0.0312 [0.0291, 0.0334]`` (three significant digits, :func:`fmt_num`); the interval left out when absent."""
    if x is None or math.isnan(x):
        return "n/a"
    return fmt_num(x) + ("" if low is None or math.isnan(low) else f" [{fmt_num(low)}, {fmt_num(high)}]")


def level(alpha: float) -> str:
    """An interval's confidence level: alpha 0.05 -> ``95%``."""
    return f"{100 * (1 - alpha):g}%"


def yes_no(v) -> str:
    """``yes``, ``no``, or ``n/a`` for None/NaN."""
    return "n/a" if v is None or v != v else "yes" if v else "no"


def md_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    """:func:`md_table` as lines, with a blank line after it."""
    return [*md_table(header, rows).split("\n"), ""]


def num_or_dash(x: float) -> str:
    """A number (:func:`fmt_num`), or — where there is none (NaN, None)."""
    return "—" if x is None or x != x else fmt_num(float(x))


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


@dataclass
class Fig:
    """A figure written beside the report (path None when skipped, with the reason as caption)."""

    title: str
    path: Path | None
    caption: str


def figure_block(fig: Fig) -> str:
    if fig.path is None:
        return f"### {fig.title}\n\n*Skipped: {fig.caption}*"
    return f"### {fig.title}\n\n![{fig.title}]({fig.path.name})\n\n*{fig.caption}*"


def new_figure(nrows: int, ncols: int, w: float = 4.0, h: float = 3.2):
    from matplotlib.figure import Figure  # no pyplot: no global state, renders with Agg

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    return fig, axes


def save_figure(fig, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path
