"""What a reader of a figure sees: the texts matplotlib draws, and those the page would cut at the figure's edge."""

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

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
