"""Text in figures that never runs over other text: titles wrapped to the figure's width, and labels over bars fitted
to their bar's share of the width once the figure is laid out (`axes_sizes_pt`), the y axis ending where the tallest
bar's labels do (`top_for`). The run's figures (plots.py) and the planner's (plan_views.py) label their bars so.
"""

from __future__ import annotations

import dataclasses
import textwrap

from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path

TITLE_CHARS_PER_IN = 10  # characters per inch of width of a centred title at 10 pt


def wrap_lines(text: str, width: int) -> str:
    """Each line of `text` wrapped at `width` characters (the texts are written for a desktop's width)."""
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def text_width_pt(text: str, fontsize: float, bold: bool) -> float:
    """How wide a line is drawn, in points, measured on the font itself (the figure need not be drawn yet)."""
    font = FontProperties(size=fontsize, weight="bold" if bold else "normal")
    return text_to_path.get_text_width_height_descent(text, font, ismath=False)[0]


def wrapped_title(axes, text: str, width_in: float, fontsize: float) -> None:
    """A title wrapped to the figure's width (the texts are written for a desktop's)."""
    axes.set_title(wrap_lines(text, int(width_in * TITLE_CHARS_PER_IN * 10 / fontsize)), fontsize=fontsize)


LABEL_GAP_PT = 2.0  # between a bar (or its whisker) and its first label, and between stacked labels


LINE_HEIGHT = 1.25  # a text line's height in font sizes: matplotlib spaces lines by 1.2, the last has its descent


LABEL_PAD_PT = 1.0  # the white box behind a label, which hides the lines drawn across


@dataclasses.dataclass(frozen=True)
class BarLabel:
    """A text over a bar in the forms it may take, most complete first. The first that fits the bar's share of the
    width in `max_lines` lines is drawn; when none does, the last (or, when `optional`, nothing: the tables have
    every number, an overprinted label helps no one)."""

    forms: tuple[str, ...]
    fontsize: float = 8.0
    bold: bool = False
    color: str = "black"
    max_lines: int = 2
    optional: bool = False


def _break_words(text: str, width_pt: float, fontsize: float, bold: bool) -> list[str]:
    """`text` broken at its spaces into lines no wider than `width_pt`, a word wider than that on a line of its own."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_width_pt(f"{lines[-1]} {word}", fontsize, bold) <= width_pt:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def _fitted(label: BarLabel, width_pt: float) -> list[str] | None:
    """The lines of the first form of `label` that fits `width_pt` (see BarLabel), None when it is left out."""
    for form in label.forms:
        lines = _break_words(form, width_pt, label.fontsize, label.bold)
        if len(lines) <= label.max_lines and all(text_width_pt(line, label.fontsize, label.bold) <= width_pt
                                                 for line in lines):
            return lines
    return None if label.optional else _break_words(label.forms[-1], width_pt, label.fontsize, label.bold)


def axes_sizes_pt(figure: Figure) -> list[tuple[float, float]]:
    """Each axes' width per x unit (one bar's share) and height, in points, once the figure is laid out: labels are
    fitted to them. Constrained layout runs on demand as a draw runs it; the labels added after it lie inside the
    axes, so the draw lays the figure out the same again."""
    figure.get_layout_engine().execute(figure)
    points_per_px = 72 / figure.dpi
    return [(axes.bbox.width * points_per_px / (axes.get_xlim()[1] - axes.get_xlim()[0]),
             axes.bbox.height * points_per_px) for axes in figure.axes]


def stack_labels(axes, x: float, y: float, labels: list[BarLabel], width_pt: float) -> float:
    """`labels` stacked upwards from the data point (x, y), each fitted to `width_pt`; the points they take."""
    offset = LABEL_GAP_PT
    for label in labels:
        lines = _fitted(label, width_pt)
        if lines is None:
            continue
        axes.annotate("\n".join(lines), (x, y), xytext=(0, offset), textcoords="offset points", ha="center",
                      va="bottom", fontsize=label.fontsize, fontweight="bold" if label.bold else "normal",
                      color=label.color, bbox={"facecolor": "white", "edgecolor": "none", "pad": LABEL_PAD_PT})
        offset += len(lines) * label.fontsize * LINE_HEIGHT + 2 * LABEL_PAD_PT + LABEL_GAP_PT
    return offset


def top_for(stacks: list[tuple[float, float]], height_pt: float, floor: float = 0.0) -> float:
    """The y axis' top that fits every (bar top, points of labels over it) and `floor` (a line drawn across): the
    data plus the label room it needs, no more."""
    # A label stack over half the axes' height would leave the bars no room: the figure is then too small for them.
    tops = [top / (1 - min(0.5, room / height_pt)) for top, room in stacks]
    return max([floor, *tops]) or 1.0
