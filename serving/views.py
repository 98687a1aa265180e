"""A preview's and a run's views as the page shows them: figures drawn for the width the page shows them at (the
browser says how wide the batch picture is: `serving.page.WITH_PICTURE_WIDTH`), tables, downloads.
"""

from __future__ import annotations

import gradio as gr

from demo_core import batch_picture as picture, plots, report

from . import downloads, page


def batch_picture(preview: dict, picture_px: float | None):
    return picture.batch_figure(preview, page.figure_width_in(picture_px))


def lengths_views(preview: dict, picture_px: float | None) -> tuple:
    """(lengths histogram, cost table) of a preview."""
    return (plots.lengths_figure(preview, page.figure_width_in(picture_px, plots.LENGTHS_WIDTH_IN)),
            report.cost_markdown(preview))


def preview_views(preview: dict, picture_px: float | None) -> tuple:
    """(batch picture, lengths histogram, cost table) of a preview."""
    return batch_picture(preview, picture_px), *lengths_views(preview, picture_px)


def result_figures(document: dict, picture_px: float | None) -> tuple:
    """(throughput, loss, memory) of a run, finished or not."""
    width_in = page.figure_width_in(picture_px, plots.RESULT_WIDTH_IN)
    return (plots.throughput_figure(document, width_in), plots.loss_figure(document, width_in),
            plots.memory_figure(document, width_in))


def anatomy_views(document: dict, picture_px: float | None) -> tuple:
    """(time anatomy figure, its words) of a run, finished or not."""
    return (plots.anatomy_figure(document, page.figure_width_in(picture_px, plots.ANATOMY_WIDTH_IN)),
            report.anatomy_markdown(document))


def result_views(document: dict, name: str, picture_px: float | None) -> tuple:
    """(throughput, loss, memory, results table, contamination table, JSON file, CSV file, time anatomy figure and
    its words) of a finished run."""
    return (*result_figures(document, picture_px), report.results_table(document),
            gr.Dataframe(report.contamination_table(document), label=report.contamination_title(document)),
            *downloads.write(document, name), *anatomy_views(document, picture_px))


# The result views of no run: a new run empties the previous one's (it stays in the history), so that nothing on the
# page belongs to another run.
NO_RESULTS = (None, None, None, None, gr.Dataframe(None, label=report.CONTAMINATION_TITLE), None, None, None, "")
