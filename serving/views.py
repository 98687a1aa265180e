"""A preview's and a run's views as the page shows them: figures drawn for the screen they are shown on (the browser
says how wide the views column is and how many device pixels a CSS pixel has: `serving.page.Screen`), tables,
downloads, the headline.

Each returns `{component: value}` for the views column `ui` (serving/layout.py `views_column`): a handler merges
them into the one dict it yields, and Gradio leaves every other output as it is.
"""

from __future__ import annotations

import gradio as gr

from presentation import batch_picture as picture
from presentation import before_run, headline, plots, report
from serving import downloads, takehome
from serving.layout import GLANCE_MIN_PX
from serving.page import Screen

# The run's three figures share a row under the headline (GLANCE_MIN_PX wide at least); a phone stacks them.
GLANCE_FIGURES = 3


def batch_picture(preview: dict, screen: Screen):
    return picture.batch_figure(preview, screen.width_in(), dpi=screen.dpi)


def lengths_views(ui, preview: dict, screen: Screen) -> dict:
    """What trains (the first example, its trained parts marked), the lengths histogram and the cost table of a
    preview."""
    width_in = screen.width_in(plots.LENGTHS_WIDTH_IN)
    return {ui.trained_example: before_run.trained_example(preview),
            ui.lengths_plot: plots.lengths_figure(preview, width_in, dpi=screen.dpi),
            ui.cost: report.cost_markdown(preview)}


def forecast_views(bar, preview: dict) -> dict:
    """Beside Run (the action bar `bar`): what Run will cost, and what it asks before a long or refused run."""
    return {bar.forecast: before_run.forecast_line(preview), bar.ask: before_run.question(preview)}


def preview_views(ui, preview: dict, screen: Screen) -> dict:
    """The batch picture, what trains, the lengths histogram and the cost table of a preview."""
    return {ui.batch_plot: batch_picture(preview, screen), **lengths_views(ui, preview, screen)}


def result_figures(ui, document: dict, screen: Screen) -> dict:
    """Throughput, memory and loss of a run, finished or not, in the row under the headline (shown from the first
    result on)."""
    width_in = screen.width_in(plots.RESULT_WIDTH_IN, GLANCE_FIGURES, GLANCE_MIN_PX)
    return {ui.glance: gr.Row(visible=True),
            ui.throughput_plot: plots.throughput_figure(document, width_in, dpi=screen.dpi),
            ui.memory_plot: plots.memory_figure(document, width_in, dpi=screen.dpi),
            ui.loss_plot: plots.loss_figure(document, width_in, dpi=screen.dpi)}


def anatomy_views(ui, document: dict, screen: Screen) -> dict:
    """The time anatomy figure and its words, of a run finished or not."""
    # The figure spans the views column: drawn narrower, a browser stretches it to the column (soft on a 2x screen).
    figure = plots.anatomy_figure(document, screen.width_in(picture.BATCH_MAX_IN), dpi=screen.dpi)
    return {ui.anatomy_plot: figure, ui.anatomy_text: report.anatomy_markdown(document)}


def headline_views(ui, document: dict, status: str, attention_why: str | None = None) -> dict:
    """The headline (`status`, then the big numbers) and, folded under it, why each collator's numbers look so."""
    return {ui.summary: headline.headline(document, status),
            ui.details: headline.detail_markdown(document, attention_why)}


def training_views(ui, document: dict, done: int, of: int, attention_why: str | None, screen: Screen) -> dict:
    """The views after `done` of `of` collators finished: the headline so far, figures, table and time anatomy."""
    return {**headline_views(ui, document, f"### Training: {done} of {of} collators done", attention_why),
            **result_figures(ui, document, screen), ui.results: report.results_table(document),
            **anatomy_views(ui, document, screen)}


def result_views(ui, document: dict, name: str, screen: Screen) -> dict:
    """Every result view of a finished run but its headline: its figures, tables, downloads, time anatomy and
    scripts (the links and the report: takehome.shown_views)."""
    json_path, csv_path = downloads.write(document, name)
    return {**result_figures(ui, document, screen), ui.results: report.results_table(document),
            ui.contamination: gr.Dataframe(report.contamination_table(document),
                                           label=report.contamination_title(document)),
            ui.json_file: json_path, ui.csv_file: csv_path, **anatomy_views(ui, document, screen),
            **takehome.code_views(ui.takehome, document)}


def preview_outputs(ui) -> list:
    """The components a preview fills in the views column."""
    return [ui.batch_plot, ui.trained_example, ui.lengths_plot, ui.cost]


def forecast_outputs(bar) -> list:
    """The components a preview fills in the action bar."""
    return [bar.forecast, bar.ask]


def result_outputs(ui) -> list:
    """The components a run's results fill (the headline's `summary` aside): outputs of every event that shows or
    clears a run."""
    return [ui.glance, ui.throughput_plot, ui.loss_plot, ui.memory_plot, ui.details, ui.results, ui.contamination,
            ui.json_file, ui.csv_file, ui.anatomy_plot, ui.anatomy_text, *takehome.outputs(ui.takehome)]


def no_results(ui) -> dict:
    """The result views of no run: a new run empties the previous one's (it stays in the history), so that nothing
    on the page belongs to another run; the figures' row is hidden until there is something in it."""
    return {**dict.fromkeys(result_outputs(ui)), ui.glance: gr.Row(visible=False),
            ui.contamination: gr.Dataframe(None, label=report.CONTAMINATION_TITLE), ui.anatomy_text: "",
            ui.details: "", **takehome.no_views(ui.takehome)}
