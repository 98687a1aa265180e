"""The page's widgets, in page order: the intro, the action bar, the inputs (left column, from the declared settings:
serving/widgets.py) and the views (right column). `app.py` builds the page from these and wires their events; nothing
here handles an event.
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from demo_core import Limits, RunConfig
from demo_core.settings import page_settings
from presentation import report
from serving import provenance, takehome
from serving.widgets import Form, settings_form

INTRO = """
# Packing Lab: padding vs padding-free packing, measured
Fine-tuning data has examples of very different lengths. The usual batch **pads** every example to the longest one;
the padding is computed and thrown away. **Padding-free packing** (`DataCollatorWithFlattening` in transformers)
puts the batch in one row and tells attention where each example starts (`position_ids` restart at 0,
`cu_seqlens`), so nothing is wasted and every example still only sees itself.
Pick a model, data and collators, then **Run**: each collator trains the same fresh model on the same examples for a
few real optimizer steps, and the page compares speed, loss and memory.
"""


def action_bar() -> SimpleNamespace:
    """Run, Stop, what Run will cost and the status: first in the page and the tab order, and sticky at the top of the
    window. Beside the buttons, one line says what Run will cost (`forecast`: time, peak memory and any warning,
    written by each preview), another what happened last (`status`); while a run trains, its progress bar takes the
    forecast's line. Run itself only asks (page.ASK_OR_RUN): a run whose preview warns (`ask`: long, or refused for
    its memory) opens `confirm` under the bar first, and the run starts from the hidden `start` button, which Run or
    "Run anyway" click."""
    ui = SimpleNamespace()
    with gr.Row(elem_id="action-bar", equal_height=True):
        ui.run_button = gr.Button("Run", variant="primary", elem_id="run", scale=0)
        ui.stop_button = gr.Button("Stop", variant="stop", elem_id="stop", scale=0)
        ui.forecast = gr.Markdown("", elem_id="forecast", container=False)
        ui.status = gr.Markdown("", elem_id="status", container=False)
        ui.progress = gr.Markdown("", elem_id="progress", container=False)
        ui.start = gr.Button("Start the run", visible="hidden", elem_id="start-run")
        with gr.Column(elem_id="confirm-run", variant="panel"):
            ui.ask = gr.Markdown("", elem_id="confirm-text", container=False)
            with gr.Row():
                ui.run_anyway = gr.Button("Run anyway", variant="primary", elem_id="run-anyway", size="sm", scale=0)
                ui.cancel = gr.Button("Cancel", elem_id="run-cancel", size="sm", scale=0)
    return ui


def upload_box() -> gr.File:
    return gr.File(label="Or upload .json / .jsonl (used instead; private to this tab, deleted after the run)",
                   file_types=[".json", ".jsonl"], type="filepath", elem_id="upload")


def settings_column(limits: Limits, defaults: RunConfig) -> Form:
    """The inputs (the page's left column): a widget per setting RunConfig declares for the page (serving/widgets.py),
    their ranges from the limits and their values the defaults; the upload box follows the dataset it replaces."""
    values = {item.name: getattr(defaults, item.name) for item in page_settings(type(defaults))}
    return settings_form(type(defaults), values, limits, enter_hint="Enter draws it",
                         extras={"upload": ("dataset", upload_box)})


# What each figure shows, for people who cannot see it: the plots' labels, which page.js makes their alt text.
FIGURE_TEXT = {
    "batch": "The first batch as each collator builds it: the padded grid with its padding in grey, the same examples "
             "flattened into one row with the cu_seqlens boundaries and position_ids restarting at 0, packed rows "
             "when bfd is selected, and the attention mask each path computes",
    "lengths": "Histogram of the example lengths in tokens, with mean, p50, p90 and p99 marked",
    "throughput": "Bar chart of real tokens per second per collator, each bar labelled with its speedup over padded, "
                  "a whisker for the middle half of its steps; a dashed line marks the ideal speedup by slots and a "
                  "dotted mark over each bar its work ideal, named in the legend under the chart",
    "loss": "Training loss per optimizer step, one line per collator; correct packing overlaps the padded line",
    "memory": "Stacked bars per collator of the memory alive at one moment of a training step, by category "
              "(weights, gradients, optimizer, activations, temporary; on a GPU the allocator's unsplit rest as "
              "other): the estimate (hatched) beside the measurement (solid) at the same moment, which the title "
              "names (on a GPU the step's peak, on a CPU the end of the forward), each pair labelled with the "
              "measured peak the results table shows and the estimate's error; the line under the bars says what the "
              "measurement is on this device",
    "anatomy": "Stacked bars of where the median profiled training step's time went per collator: by phase (forward, "
               "backward, optimizer, data) with the backward / forward ratio, and by operation (matmul, attention, "
               "normalization, element-wise, optimizer, data, other)",
}


GLANCE_MIN_PX = 300  # the narrowest each of the run's three figures is shown side by side; narrower, they wrap
LENGTHS_MIN_PX, COST_MIN_PX = 340, 320  # the histogram and the cost table beside it; narrower, the table wraps under


def views_column() -> SimpleNamespace:
    """The headline with the run's three figures (the first screen after a run, on a desktop), the batch before
    training, the results in detail and the history (the page's right column)."""
    ui = SimpleNamespace()
    ui.summary = gr.Markdown("Press **Run**: each collator trains for a few steps and its results appear here as "
                             "soon as it finishes.", elem_id="headline")
    # Hidden until a run has a result: before that the batch picture comes first. On a desktop the headline and
    # these three fill the first screen after a run; what they show and why come after them.
    with gr.Row(visible=False, elem_id="glance-figures") as ui.glance:
        ui.throughput_plot = gr.Plot(label=FIGURE_TEXT["throughput"], show_label=False, elem_id="throughput-plot",
                                     min_width=GLANCE_MIN_PX)
        ui.memory_plot = gr.Plot(label=FIGURE_TEXT["memory"], show_label=False, elem_id="memory-plot",
                                 min_width=GLANCE_MIN_PX)
        ui.loss_plot = gr.Plot(label=FIGURE_TEXT["loss"], show_label=False, elem_id="loss-plot",
                               min_width=GLANCE_MIN_PX)
    ui.results_source = gr.Markdown(provenance.run_line(provenance.NO_RUN), elem_id="results-source",
                                    elem_classes="shown-line")
    with gr.Accordion("Why each collator's numbers look the way they do", open=False, elem_id="headline-details"):
        ui.details = gr.Markdown(elem_id="details", min_height=0)
    # On a phone this column's items and the settings' share one column, and this section follows the model and the
    # dataset (page.css), so that the picture is within a screen of the settings.
    with gr.Column(elem_id="batch-section"):
        gr.Markdown("## 1 · The batch, before any training")
        ui.batch_source = gr.Markdown(provenance.preview_line(None, provenance.NO_RUN), elem_id="batch-source",
                                      elem_classes="shown-line")
        ui.batch_plot = gr.Plot(label=FIGURE_TEXT["batch"], show_label=False, elem_id="batch-plot")
    ui.trained_example = gr.Markdown(elem_id="trained-example", min_height=0)
    with gr.Row(equal_height=False):
        ui.lengths_plot = gr.Plot(label=FIGURE_TEXT["lengths"], show_label=False, elem_id="lengths-plot",
                                  min_width=LENGTHS_MIN_PX)
        # Narrower than this, the table's words would break letter by letter: it wraps under the histogram instead.
        with gr.Column(min_width=COST_MIN_PX):
            ui.cost = gr.Markdown(elem_id="cost", min_height=0)
    gr.Markdown("## 2 · The run in detail (same examples, same order, same initial weights)")
    ui.results = gr.Dataframe(headers=report.RESULT_HEADERS, label="Results per collator", interactive=False,
                              wrap=True, elem_id="results", pinned_columns=1)
    ui.contamination = gr.Dataframe(headers=report.CONTAMINATION_HEADERS, interactive=False, wrap=True,
                                    elem_id="contamination", label=report.CONTAMINATION_TITLE)
    # Time anatomy: the median profiled step per collator, and why the speedup misses its ideal. The figure's two panels
    # take the section's whole width (beside its words they were drawn at half size), the words follow it.
    ui.anatomy_plot = gr.Plot(label=FIGURE_TEXT["anatomy"], show_label=False, elem_id="anatomy-plot")
    ui.anatomy_text = gr.Markdown(elem_id="anatomy-text", min_height=0)
    with gr.Row():
        ui.json_file = gr.File(label="Run as JSON", interactive=False, min_width=240)
        ui.csv_file = gr.File(label="Results as CSV", interactive=False, min_width=240)
    ui.takehome = takehome.takehome_section()  # each collator's script, the report, the run's links
    gr.Markdown("## 3 · History (click a row to show that run and put its settings back in the inputs)")
    ui.history = gr.Dataframe(headers=report.HISTORY_HEADERS, interactive=False, elem_id="history", max_height=320,
                              wrap=True, pinned_columns=1)
    ui.delete_button = gr.Button("Delete the runs made in this tab", size="sm", elem_id="delete-runs")
    return ui
