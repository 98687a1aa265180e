"""A preview's and a run's views as the page shows them: figures drawn for the width the page shows them at (the
browser says how wide the batch picture is: `serving.page.WITH_PICTURE_WIDTH`), tables, downloads.

Each returns `{component: value}` for the views column `ui` (serving/layout.py `views_column`): a handler merges
them into the one dict it yields, and Gradio leaves every other output as it is.
"""

from __future__ import annotations

import gradio as gr

from presentation import batch_picture as picture, plots, report

from . import downloads, page


def batch_picture(preview: dict, picture_px: float | None):
    return picture.batch_figure(preview, page.figure_width_in(picture_px))


def lengths_views(ui, preview: dict, picture_px: float | None) -> dict:
    """The lengths histogram and the cost table of a preview."""
    return {ui.lengths_plot: plots.lengths_figure(preview, page.figure_width_in(picture_px, plots.LENGTHS_WIDTH_IN)),
            ui.cost: report.cost_markdown(preview)}


def preview_views(ui, preview: dict, picture_px: float | None) -> dict:
    """The batch picture, the lengths histogram and the cost table of a preview."""
    return {ui.batch_plot: batch_picture(preview, picture_px), **lengths_views(ui, preview, picture_px)}


def result_figures(ui, document: dict, picture_px: float | None) -> dict:
    """Throughput, loss and memory of a run, finished or not."""
    width_in = page.figure_width_in(picture_px, plots.RESULT_WIDTH_IN)
    return {ui.throughput_plot: plots.throughput_figure(document, width_in),
            ui.loss_plot: plots.loss_figure(document, width_in), ui.memory_plot: plots.memory_figure(document, width_in)}


def anatomy_views(ui, document: dict, picture_px: float | None) -> dict:
    """The time anatomy figure and its words, of a run finished or not."""
    return {ui.anatomy_plot: plots.anatomy_figure(document, page.figure_width_in(picture_px, plots.ANATOMY_WIDTH_IN)),
            ui.anatomy_text: report.anatomy_markdown(document)}


def result_views(ui, document: dict, name: str, picture_px: float | None) -> dict:
    """Every result view of a finished run: its figures, tables, downloads and time anatomy."""
    json_path, csv_path = downloads.write(document, name)
    return {**result_figures(ui, document, picture_px), ui.results: report.results_table(document),
            ui.contamination: gr.Dataframe(report.contamination_table(document),
                                           label=report.contamination_title(document)),
            ui.json_file: json_path, ui.csv_file: csv_path, **anatomy_views(ui, document, picture_px)}


def preview_outputs(ui) -> list:
    """The components a preview fills."""
    return [ui.batch_plot, ui.lengths_plot, ui.cost]


def result_outputs(ui) -> list:
    """The components a run's results fill: outputs of every event that shows or clears a run."""
    return [ui.throughput_plot, ui.loss_plot, ui.memory_plot, ui.results, ui.contamination, ui.json_file, ui.csv_file,
            ui.anatomy_plot, ui.anatomy_text]


def no_results(ui) -> dict:
    """The result views of no run: a new run empties the previous one's (it stays in the history), so that nothing
    on the page belongs to another run."""
    return {**dict.fromkeys(result_outputs(ui)), ui.contamination: gr.Dataframe(None, label=report.CONTAMINATION_TITLE),
            ui.anatomy_text: ""}
