"""What a reader of a figure sees: the texts matplotlib draws, those the page would cut at the figure's edge, and
those drawn over each other."""

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text

from presentation.plots import FIGURE_DPI

PHONE_IN = 4.0  # a 390 px wide phone shows a figure ~326 px wide: the page asks for 4.1 in (serving.page)


def drawn_texts(figure: Figure) -> list:
    """The texts matplotlib draws (tick labels of ticks outside an axis' view exist but are not drawn)."""
    FigureCanvasAgg(figure).draw()
    skipped = set()
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            low, high = sorted(axis.get_view_interval())
            skipped |= {id(label) for tick in axis.get_major_ticks() if not low <= tick.get_loc() <= high
                        for label in (tick.label1, tick.label2)}
    return [text for text in figure.findobj(Text)
            if id(text) not in skipped and text.get_visible() and text.get_text().strip()]


def cut_off(figure: Figure) -> list[str]:
    """The texts that reach past the figure's edge, where the page cuts them."""
    texts, inside = drawn_texts(figure), figure.bbox.padded(1)
    extents = [text.get_window_extent(figure.canvas.get_renderer()) for text in texts]
    return [text.get_text() for text, extent in zip(texts, extents)
            if not (inside.contains(*extent.min) and inside.contains(*extent.max))]


def _corners(text: Text, renderer) -> np.ndarray:
    """The four corners of a text's own rectangle in pixels. A slanted tick label's window extent is the upright box
    around it, which meets its neighbour's box although the slanted texts themselves stay apart."""
    box, angle = text.get_window_extent(renderer), text.get_rotation()
    if angle % 180 == 0:
        return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    text.set_rotation(0)
    upright = text.get_window_extent(renderer)
    text.set_rotation(angle)
    # The rotated rectangle shares its centre with the box around it.
    half = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * [upright.width / 2, upright.height / 2]
    radians = np.deg2rad(angle)
    turn = np.array([[np.cos(radians), -np.sin(radians)], [np.sin(radians), np.cos(radians)]])
    return half @ turn.T + [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]


def _overprint(first: np.ndarray, second: np.ndarray, tolerance_px: float) -> bool:
    """Whether two rectangles (their corners) overlap by more than `tolerance_px` along every one of their edges'
    directions (two convex shapes are apart exactly when some such direction separates them)."""
    for corners in (first, second):
        for edge in (corners[1] - corners[0], corners[3] - corners[0]):
            direction = edge / np.linalg.norm(edge)
            a, b = first @ direction, second @ direction
            if min(a.max(), b.max()) - max(a.min(), b.min()) <= tolerance_px:
                return False
    return True


def overlapping(figure: Figure) -> list[tuple[str, str]]:
    """The pairs of drawn texts that overprint each other by more than a pixel of the page (FIGURE_DPI to the inch;
    a phone's picture has more of its own), which a reader cannot read. A legend lays out its own texts in rows, so
    pairs inside one legend are not checked (its texts against any other text are)."""
    texts = drawn_texts(figure)
    renderer = figure.canvas.get_renderer()
    owner = {id(text): id(legend) for legend in figure.findobj(Legend)  # the figure's, a panel's and an axes' legends
             for text in [*legend.get_texts(), legend.get_title()]}
    corners = [_corners(text, renderer) for text in texts]
    return [(texts[i].get_text(), texts[j].get_text())
            for i in range(len(texts)) for j in range(i + 1, len(texts))
            if not (id(texts[i]) in owner and owner[id(texts[i])] == owner.get(id(texts[j])))
            and _overprint(corners[i], corners[j], figure.dpi / FIGURE_DPI)]
