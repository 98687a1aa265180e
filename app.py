"""Packing Lab: a Gradio page over the `demo_core` engine. UI only: widgets -> engine calls -> figures and tables.

Run `python app.py` (127.0.0.1:7860 by default; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT move it). API endpoints for
`gradio_client`: `/compare` (train and return the engine's JSON document) and `/preview` (the numbers before training),
both taking (model, dataset, samples, collators, steps, batch_size, attention, seed, max_length, precision, optimizer,
dataset_file); `/history` (the saved runs this client may see, one summary each), `/delete_runs`, and
`/plan` (the memory planner, planner_page.py).

What serving many visitors needs lives in `serving/`: who made a run (`sessions`), uploads that stay the uploader's
and are deleted after their run (`uploads`), the GPU part of a run shaped for ZeroGPU's forked worker (`gpu`) and its
time plan and saving (`runs`). Limits come from the environment (`demo_core.Limits.from_env()`); local model and data
paths typed into the page or the API must lie under PACKING_LAB_ALLOWED_ROOTS (default: the data dir); finished runs
are kept in `<PACKING_LAB_DATA_DIR>/history.jsonl`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline by default: set before gradio is imported

import gradio as gr  # noqa: E402

import demo_core  # noqa: E402
from demo_core import (ATTENTION_NAMES, BUILTIN_DATASETS, COLLATORS, OPTIMIZER_NAMES, PRECISION_NAMES,  # noqa: E402
                       PRESETS, Limits, RunConfig, RunHistory, data_dir, plots, report)
from demo_core.stop import TIME_BUDGET  # noqa: E402
from serving import downloads, gpu, history_view, runs, uploads  # noqa: E402
from serving.errors import user_errors  # noqa: E402
from serving.inputs import config_from_document, prepare as prepare_from_inputs  # noqa: E402
from serving.sessions import Session  # noqa: E402
from serving.uploads import Upload  # noqa: E402
import planner_page  # noqa: E402

LIMITS = Limits.from_env()
HISTORY = RunHistory(data_dir())
# The engine's defaults, lowered to the configured caps so that a run with defaults is always allowed.
DEFAULTS = RunConfig(samples=min(RunConfig.samples, LIMITS.max_samples), steps=min(RunConfig.steps, LIMITS.max_steps),
                     batch_size=min(RunConfig.batch_size, LIMITS.max_batch_size),
                     max_length=min(RunConfig.max_length, LIMITS.max_length))


INTRO = """
# Packing Lab: padding vs padding-free packing, measured
Fine-tuning data has examples of very different lengths. The usual batch **pads** every example to the longest one;
the padding is computed and thrown away. **Padding-free packing** (`DataCollatorWithFlattening` in transformers)
puts the batch in one row and tells attention where each example starts (`position_ids` restart at 0,
`cu_seqlens`), so nothing is wasted and every example still only sees itself.
Pick a model, data and collators, then **Run**: each collator trains the same fresh model on the same examples for a
few real optimizer steps, and the page compares speed, loss and memory.
"""


def prepare_inputs(upload: Upload | None, *fields) -> demo_core.Prepared:
    """fields: model, dataset, samples, collators, steps, batch_size, attention, seed, max_length, precision,
    optimizer."""
    return prepare_from_inputs(LIMITS, upload, *fields)


# ----------------------------------------------------------------------------------------------------------------
# Handlers
# ----------------------------------------------------------------------------------------------------------------

def _preview_views(preview: dict) -> tuple:
    """(batch picture, lengths histogram, cost table) of a preview."""
    return plots.batch_figure(preview), plots.lengths_figure(preview), report.cost_markdown(preview)


@user_errors
def show_preview(model, dataset, upload, samples, collators, steps, batch_size, attention, precision, optimizer, seed,
                 max_length):
    """Sends the batch picture as soon as it is drawn (the view people wait for), then the histogram and costs."""
    preview = demo_core.preview(prepare_inputs(Upload.from_value(upload), model, dataset, samples, collators, steps,
                                               batch_size, attention, seed, max_length, precision, optimizer))
    yield plots.batch_figure(preview), gr.skip(), gr.skip()
    yield gr.skip(), plots.lengths_figure(preview), report.cost_markdown(preview)


def _result_views(document: dict, name: str) -> tuple:
    """(throughput, loss, memory, results table, contamination table, JSON file, CSV file, time anatomy figure and
    its words) of a finished run."""
    return (plots.throughput_figure(document), plots.loss_figure(document), plots.memory_figure(document),
            report.results_table(document), report.contamination_table(document), *downloads.write(document, name),
            plots.anatomy_figure(document), report.anatomy_markdown(document))


def _saved_status(entry: demo_core.HistoryEntry, job: gpu.TrainingJob, upload: Upload | None) -> str:
    status = f"Saved as run {entry.run_id} in the history below."
    if entry.document.get("stop_reason") == TIME_BUDGET:
        status += (f" It stopped itself at its time budget ({job.budget_s:.0f} s) and kept what it had: use fewer "
                   "steps or collators to finish.")
    if upload is not None:
        status += f" {upload.name} was deleted from the server; this run is listed in this tab only."
    return status


@user_errors
def run_page(model, dataset, upload, samples, collators, steps, batch_size, attention, precision, optimizer, seed,
             max_length, request: gr.Request, progress=gr.Progress()):
    """Prepares the run once and draws its batch, then trains (on ZeroGPU: in the GPU worker) and yields the views
    after each collator; the last yield adds the history row and empties the upload box (the file is deleted)."""
    started = time.perf_counter()
    session, file = Session.of(request), Upload.from_value(upload)
    prepared = prepare_inputs(file, model, dataset, samples, collators, steps, batch_size, attention, seed,
                              max_length, precision, optimizer)
    job = runs.plan(prepared, HISTORY, LIMITS, session.stop_marker, file)
    yield ("Training…", gr.skip(), *_preview_views(demo_core.preview(prepared)), *[gr.skip()] * 11)
    steps, collator_count = prepared.config.steps, len(prepared.specs)
    total_steps = collator_count * steps
    # Steps done per collator: on a CPU the collators take turns step by step, so their steps arrive interleaved
    # and their results all at the end; the progress bar counts every collator's steps.
    steps_done = dict.fromkeys((spec.name for spec in prepared.specs), 0)
    with session.running(), contextlib.closing(runs.train_and_save(job, HISTORY, session, file)) as events:
        progress((0, total_steps), desc="building the model and the first batch")
        for kind, *payload in events:
            if kind == gpu.STEP:
                name, step, _ = payload
                steps_done[name] = step
                progress((sum(steps_done.values()), total_steps),
                         desc=" · ".join(f"{name} {done}/{steps}" for name, done in steps_done.items()))
            elif kind == gpu.RESULT:
                partial = payload[0]
                done = len(partial["results"])
                progress((sum(steps_done.values()), total_steps),
                         desc="contamination check" if done == collator_count else "next collator")
                yield (f"Running: {done} of {collator_count} collators done…", *[gr.skip()] * 4,
                       plots.throughput_figure(partial), plots.loss_figure(partial), plots.memory_figure(partial),
                       report.results_table(partial), *[gr.skip()] * 3, plots.anatomy_figure(partial),
                       report.anatomy_markdown(partial), *[gr.skip()] * 2)
            else:
                entry = payload[0]
    if entry is None:  # stopped while it waited for the GPU
        yield "Stopped before the first step: nothing to save.", *[gr.skip()] * 14, gr.skip() if file is None else None
        return
    yield (_saved_status(entry, job, file), report.headline(entry.document, time.perf_counter() - started),
           *[gr.skip()] * 3, *_result_views(entry.document, entry.run_id), history_table(request),
           gr.skip() if file is None else None)


def request_stop(request: gr.Request) -> str:
    if not Session.of(request).request_stop():
        return "Nothing is running in this tab."
    return "Stopping after the current step…"


@user_errors
def show_history_run(selection: gr.SelectData, request: gr.Request):
    """Redraws a run picked in the history table: its results and, when its data is still readable, its batch."""
    entry = history_view.entry(HISTORY, Session.of(request), str(selection.row_value[0]))
    document = entry.document
    if entry.private:
        batch, lengths, cost = None, None, "*The batch picture cannot be redrawn: the uploaded file was deleted.*"
    else:
        try:
            batch, lengths, cost = _preview_views(demo_core.preview(config_from_document(document), limits=LIMITS))
        except demo_core.DemoInputError as error:  # e.g. a data file that has since been removed
            batch, lengths, cost = None, None, f"*The batch picture cannot be redrawn: {error}*"
    return (f"*History run {entry.run_id} ({entry.saved_at})*\n\n" + report.headline(document), batch, lengths, cost,
            *_result_views(document, entry.run_id))


def history_table(request: gr.Request) -> list[list]:
    return history_view.table(HISTORY, Session.of(request))


@user_errors
def delete_my_runs(request: gr.Request) -> tuple[str, list[list]]:
    deleted = history_view.delete(HISTORY, Session.of(request))
    status = f"Deleted {len(deleted)} run(s) made in this tab." if deleted else "This tab has made no runs."
    return status, history_table(request)


def forget_session(request: gr.Request) -> None:
    """The tab closed: nobody can list its private runs any more, so they are deleted (its shared runs stay)."""
    history_view.delete(HISTORY, Session.of(request), private_only=True)


# ----------------------------------------------------------------------------------------------------------------
# API endpoints (gradio_client): the signature is the API, so names and defaults are the documented ones
# ----------------------------------------------------------------------------------------------------------------

API_ARGS = """Args:
        model: a preset (tiny-llama, small-llama, llama-1b, ...), a hub id, or a local folder under the allowed roots
        dataset: flan-like, orcamath-like, a hub dataset id, or a .json/.jsonl file under the allowed roots
        samples: how many examples to draw from the dataset
        collators: comma-separated collator names, e.g. "padded,flatten"
        steps: optimizer steps per collator (step 1 is a warm-up, left out of the timings)
        batch_size: examples per step (for bfd and trl-bfd: packed rows)
        attention: auto, varlen, sdpa, eager or flash_attention_2
        seed: seed of the data order and of the initial weights
        max_length: longer examples are truncated to this many tokens
        precision: auto (bf16 on a GPU that has it, else fp32), fp32, bf16 or fp16
        optimizer: adamw or sgd
        dataset_file: a .json/.jsonl file used instead of dataset (gradio_client.handle_file), private to you"""


def with_api_args(endpoint):
    """Appends the shared parameter descriptions: Gradio reads a docstring's `Args:` for the API page."""
    endpoint.__doc__ = f"{endpoint.__doc__.rstrip()}\n\n    {API_ARGS}\n    "
    return endpoint


@with_api_args
@user_errors
def compare(model: str = DEFAULTS.model, dataset: str = DEFAULTS.dataset, samples: int = DEFAULTS.samples,
            collators: str = ",".join(DEFAULTS.collators), steps: int = DEFAULTS.steps,
            batch_size: int = DEFAULTS.batch_size, attention: str = DEFAULTS.attention,
            seed: int = DEFAULTS.seed, max_length: int = DEFAULTS.max_length, precision: str = DEFAULTS.precision,
            optimizer: str = DEFAULTS.optimizer, dataset_file: gr.FileData | None = None,
            request: gr.Request = None) -> dict:
    """Trains a short burst per collator, saves the run and returns the engine's JSON document (config,
    dataset_stats, results, comparison, contamination, environment, and stop_reason: null, "stop" or "time budget").
    An uploaded file is deleted from the server when the run ends."""
    session, file = Session.of(request), Upload.from_value(dataset_file)
    prepared = prepare_inputs(file, model, dataset, samples, collators, steps, batch_size, attention, seed,
                              max_length, precision, optimizer)
    job = runs.plan(prepared, HISTORY, LIMITS, session.stop_marker, file)
    with session.running():
        *_, (_, entry) = runs.train_and_save(job, HISTORY, session, file)
    if entry is None:  # its time budget was spent before the first step (a GPU that took long to come)
        raise demo_core.DemoInputError("the run stopped before its first step: nothing to return; try again")
    return entry.document


@with_api_args
@user_errors
def preview(model: str = DEFAULTS.model, dataset: str = DEFAULTS.dataset, samples: int = DEFAULTS.samples,
            collators: str = ",".join(DEFAULTS.collators), steps: int = DEFAULTS.steps,
            batch_size: int = DEFAULTS.batch_size, attention: str = DEFAULTS.attention,
            seed: int = DEFAULTS.seed, max_length: int = DEFAULTS.max_length, precision: str = DEFAULTS.precision,
            optimizer: str = DEFAULTS.optimizer, dataset_file: gr.FileData | None = None) -> dict:
    """The numbers before any training: length statistics, the first batch under each collator (lengths,
    cu_seqlens, position_ids, labels, shape, pad_fraction) and the cost preview (`cost`)."""
    return demo_core.preview(prepare_inputs(Upload.from_value(dataset_file), model, dataset, samples, collators,
                                            steps, batch_size, attention, seed, max_length, precision, optimizer))


def saved_runs(request: gr.Request = None) -> list[dict]:
    """The saved runs this client may see, oldest first: everyone's shared runs and this client's private ones (made
    on its uploaded files). One summary each: run_id, saved_at, model, dataset, samples, collators, steps, batch_size,
    seed, max_length, attention, best_speedup, partial, private, and yours (made by this client: it may delete it).
    The history file survives restarts; a line torn by a crash is skipped with a warning in the server log."""
    return history_view.summaries(HISTORY, Session.of(request))


@user_errors
def delete_runs(run_ids: str = "", request: gr.Request = None) -> list[str]:
    """Deletes runs this client made from the history, for every viewer, and returns their run ids.

    Args:
        run_ids: comma-separated run ids (those /history lists with yours = true), or empty for all of them
    """
    wanted = {part.strip() for part in run_ids.split(",") if part.strip()}
    return history_view.delete(HISTORY, Session.of(request), wanted or None)


# ----------------------------------------------------------------------------------------------------------------
# The page
# ----------------------------------------------------------------------------------------------------------------


def _settings_column() -> SimpleNamespace:
    """The inputs, Run and Stop, and the status line (built inside the page's left column)."""
    ui = SimpleNamespace()
    ui.model = gr.Dropdown(list(PRESETS), value=DEFAULTS.model, allow_custom_value=True, label="Model",
                           elem_id="model", info="a tiny random-init preset (trains on a CPU), or a hub id / local folder")
    ui.dataset = gr.Dropdown(list(BUILTIN_DATASETS), value=DEFAULTS.dataset, allow_custom_value=True,
                             label="Dataset", info="a built-in length profile, or a hub dataset id")
    ui.upload = gr.File(label="Or upload .json / .jsonl (used instead; private to this tab, deleted after the run)",
                        file_types=[".json", ".jsonl"], type="filepath", elem_id="upload")
    ui.samples = gr.Slider(1, LIMITS.max_samples, value=DEFAULTS.samples, step=1, label="Samples",
                           info="examples drawn from the dataset", elem_id="samples")
    ui.collators = gr.CheckboxGroup([(spec.label, name) for name, spec in COLLATORS.items()],
                                    value=list(DEFAULTS.collators), label="Collators to compare", elem_id="collators")
    ui.steps = gr.Slider(1, LIMITS.max_steps, value=DEFAULTS.steps, step=1, label="Steps per collator",
                         info="step 1 is warm-up and step 2 profiled: neither is timed", elem_id="steps")
    ui.batch_size = gr.Slider(1, LIMITS.max_batch_size, value=DEFAULTS.batch_size, step=1, label="Batch size",
                              info="examples per step (bfd: packed rows)", elem_id="batch-size")
    with gr.Accordion("More settings", open=False):
        ui.attention = gr.Dropdown(list(ATTENTION_NAMES), value=DEFAULTS.attention, label="Attention",
                                   info="auto: varlen (our per-example kernel) or flash-attn 2 on a GPU")
        ui.precision = gr.Dropdown(list(PRECISION_NAMES), value=DEFAULTS.precision, label="Precision",
                                   info="auto: bf16 on a GPU that has it, else fp32")
        ui.optimizer = gr.Dropdown(list(OPTIMIZER_NAMES), value=DEFAULTS.optimizer, label="Optimizer")
        ui.seed = gr.Number(DEFAULTS.seed, precision=0, label="Seed", minimum=0)
        ui.max_length = gr.Slider(2, LIMITS.max_length, value=DEFAULTS.max_length, step=1, label="Max length",
                                  info="longer examples are truncated")
    with gr.Row():
        ui.run_button = gr.Button("Run", variant="primary", elem_id="run")
        ui.stop_button = gr.Button("Stop", variant="stop", elem_id="stop")
    ui.status = gr.Markdown("Press **Run** to train.", elem_id="status", min_height=60)
    return ui


def _views_column() -> SimpleNamespace:
    """The headline, the batch before training, the results and the history (the page's right column)."""
    ui = SimpleNamespace()
    ui.summary = gr.Markdown("Press **Run**: each collator trains for a few steps and its results appear below as "
                             "soon as it finishes.", elem_id="headline")
    gr.Markdown("## 1 · The batch, before any training")
    ui.batch_plot = gr.Plot(label="First batch under each collator, and the attention each path computes",
                            show_label=False, elem_id="batch-plot")
    with gr.Row():
        ui.lengths_plot = gr.Plot(label="Example lengths", show_label=False, elem_id="lengths-plot")
        ui.cost = gr.Markdown(elem_id="cost")
    gr.Markdown("## 2 · Training results (same examples, same order, same initial weights)")
    with gr.Row():
        ui.throughput_plot = gr.Plot(label="Throughput", show_label=False, elem_id="throughput-plot")
        ui.loss_plot = gr.Plot(label="Loss", show_label=False, elem_id="loss-plot")
    with gr.Row():
        ui.memory_plot = gr.Plot(label="Memory", show_label=False, elem_id="memory-plot")
        ui.contamination = gr.Dataframe(
            headers=report.CONTAMINATION_HEADERS, interactive=False, elem_id="contamination", wrap=True,
            label="Contamination check: logits of each example inside the packed row vs the example alone (≈1e-6 "
                  "is float rounding; naive concat moves them by O(1))")
    ui.results = gr.Dataframe(headers=report.RESULT_HEADERS, label="Results per collator", interactive=False,
                              wrap=True, elem_id="results")
    # ---- time anatomy (issue 13): one profiled step per collator, and why the speedup misses its ideal ----
    with gr.Row():
        ui.anatomy_plot = gr.Plot(label="Time anatomy", show_label=False, elem_id="anatomy-plot")
        ui.anatomy_text = gr.Markdown(elem_id="anatomy-text")
    with gr.Row():
        ui.json_file = gr.File(label="Run as JSON", interactive=False)
        ui.csv_file = gr.File(label="Results as CSV", interactive=False)
    gr.Markdown("## 3 · History (click a row to redraw that run)")
    ui.history = gr.Dataframe(headers=report.HISTORY_HEADERS, interactive=False, elem_id="history", max_height=320)
    ui.delete_button = gr.Button("Delete the runs made in this tab", size="sm", elem_id="delete-runs")
    return ui


def build_demo() -> gr.Blocks:
    # delete_cache: Gradio sweeps the files it holds for this app (uploads nobody ran, served copies of downloads).
    with gr.Blocks(title="Packing Lab", delete_cache=uploads.sweep_schedule()) as demo:
        gr.Markdown(INTRO)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                inputs = _settings_column()
            with gr.Column(scale=3):
                views = _views_column()
        planner_page.build_planner_section(user_errors)
        page_inputs = [inputs.model, inputs.dataset, inputs.upload, inputs.samples, inputs.collators, inputs.steps,
                       inputs.batch_size, inputs.attention, inputs.precision, inputs.optimizer, inputs.seed,
                       inputs.max_length]
        preview_outputs = [views.batch_plot, views.lengths_plot, views.cost]
        result_outputs = [views.throughput_plot, views.loss_plot, views.memory_plot, views.results,
                          views.contamination, views.json_file, views.csv_file, views.anatomy_plot, views.anatomy_text]
        # Previews are cheap (no model runs) and must not wait behind a training job, so they get their own group.
        preview_options = dict(fn=show_preview, inputs=page_inputs, outputs=preview_outputs, api_visibility="private",
                               concurrency_id="preview", concurrency_limit=4, trigger_mode="always_last",
                               show_progress="minimal")
        demo.load(**preview_options)
        # Read at every page load, so the table survives restarts.
        demo.load(history_table, outputs=views.history, api_visibility="private")
        for widget in page_inputs:
            if widget is not inputs.upload:
                widget.change(**preview_options)  # always_last: dragging a slider redraws once it settles
        # Only the visitor's own upload or clear: emptying the box after a run keeps the run's batch picture.
        gr.on([inputs.upload.upload, inputs.upload.clear], **preview_options)
        inputs.run_button.click(run_page, inputs=page_inputs, api_visibility="private", concurrency_id="training",
                                outputs=[inputs.status, views.summary, *preview_outputs, *result_outputs,
                                         views.history, inputs.upload], show_progress_on=[inputs.status])
        inputs.stop_button.click(request_stop, outputs=inputs.status, api_visibility="private",
                                 concurrency_limit=None, concurrency_id="stop")
        # (every event in a concurrency group needs the group's limit: the lowest one given wins)
        views.history.select(show_history_run, outputs=[views.summary, *preview_outputs, *result_outputs],
                             api_visibility="private", concurrency_id="preview", concurrency_limit=4)
        gr.api(compare, api_name="compare", concurrency_id="training")
        gr.api(preview, api_name="preview", concurrency_id="preview", concurrency_limit=4)
        views.delete_button.click(delete_my_runs, outputs=[inputs.status, views.history], api_visibility="private",
                                  concurrency_id="history", concurrency_limit=4)
        demo.unload(forget_session)
        gr.api(saved_runs, api_name="history", concurrency_id="history", concurrency_limit=4)
        gr.api(delete_runs, api_name="delete_runs", concurrency_id="history", concurrency_limit=4)
    # One training job at a time: every training event shares the "training" group under this default limit.
    demo.queue(default_concurrency_limit=1)
    return demo


demo = build_demo()

# Page fonts from the system, not Google Fonts: the page must load without internet.
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                       font_mono=["ui-monospace", "SFMono-Regular", "monospace"])


def launch(**overrides):
    """Starts the server on the offline defaults; tests pass `prevent_thread_lock=True` and a free port."""
    port = os.environ.get("GRADIO_SERVER_PORT")
    options = dict(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   server_port=int(port) if port else None, share=False, show_error=False,
                   max_file_size=LIMITS.max_upload_bytes, theme=THEME)
    demo_core.initialize_profiler()  # the time anatomy profiles in worker threads: kineto must start in this one
    return demo.launch(**{**options, **overrides})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    launch()
