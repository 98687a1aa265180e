"""Packing Lab: a Gradio page over the `demo_core` engine. UI only: widgets -> engine calls -> figures and tables.

Run `python app.py` (127.0.0.1:7860 by default; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT move it). API endpoints for
`gradio_client`: `/compare` (train and return the engine's JSON document) and `/preview` (the numbers before training),
both taking (model, dataset, samples, collators, steps, batch_size, attention, seed, max_length), and `/history` (the
saved runs, one summary each).

Limits come from the environment (`demo_core.Limits.from_env()`); local model and data paths typed into the page or
the API must lie under PACKING_LAB_ALLOWED_ROOTS (default: the data dir and Gradio's upload folder); finished runs
are kept in `<PACKING_LAB_DATA_DIR>/history.jsonl`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import queue
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline by default: set before gradio is imported

import gradio as gr  # noqa: E402
from gradio.utils import get_upload_folder  # noqa: E402

import demo_core  # noqa: E402
from demo_core import (ATTENTION_NAMES, BUILTIN_DATASETS, COLLATORS, OPTIMIZER_NAMES, PRECISION_NAMES,  # noqa: E402
                       PRESETS, Limits, RunConfig, RunHistory, data_dir, plots, report)

try:  # ZeroGPU on Hugging Face Spaces: borrow a GPU for the duration of a call; a no-op anywhere else
    import spaces

    on_gpu = spaces.GPU(duration=120)
except ImportError:  # `spaces` is optional off Spaces

    def on_gpu(fn):
        return fn


logger = logging.getLogger("packing_lab.app")

LIMITS = Limits.from_env()
HISTORY = RunHistory(data_dir())
# The engine's defaults, lowered to the configured caps so that a run with defaults is always allowed.
DEFAULTS = RunConfig(samples=min(RunConfig.samples, LIMITS.max_samples), steps=min(RunConfig.steps, LIMITS.max_steps),
                     batch_size=min(RunConfig.batch_size, LIMITS.max_batch_size),
                     max_length=min(RunConfig.max_length, LIMITS.max_length))
DOWNLOAD_DIR = Path(tempfile.gettempdir()) / "packing-lab-downloads"  # Gradio serves files from the temp dir


INTRO = """
# Packing Lab: padding vs padding-free packing, measured
Fine-tuning data has examples of very different lengths. The usual batch **pads** every example to the longest one;
the padding is computed and thrown away. **Padding-free packing** (`DataCollatorWithFlattening` in transformers)
puts the batch in one row and tells attention where each example starts (`position_ids` restart at 0,
`cu_seqlens`), so nothing is wasted and every example still only sees itself.
Pick a model, data and collators, then **Run**: each collator trains the same fresh model on the same examples for a
few real optimizer steps, and the page compares speed, loss and memory.
"""


# ----------------------------------------------------------------------------------------------------------------
# Errors: every user mistake becomes one readable message; anything else is logged, never shown as a traceback
# ----------------------------------------------------------------------------------------------------------------


def _as_ui_error(error: Exception) -> gr.Error:
    if isinstance(error, gr.Error):
        return error
    if isinstance(error, demo_core.DemoInputError):
        return gr.Error(str(error), print_exception=False)
    logger.error("unexpected error", exc_info=error)
    return gr.Error(f"Something went wrong inside the app ({type(error).__name__}); the server log has the details.",
                    print_exception=False)


def user_errors(fn):
    """Wraps a handler (plain or generator) so that its exceptions reach the page as `gr.Error`."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def generator(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as error:
                raise _as_ui_error(error) from None
        return generator

    @functools.wraps(fn)
    def plain(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            raise _as_ui_error(error) from None
    return plain


# ----------------------------------------------------------------------------------------------------------------
# Inputs: local paths only under the allowed roots; a RunConfig from the widgets or the API
# ----------------------------------------------------------------------------------------------------------------


def allowed_roots() -> list[Path]:
    raw = os.environ.get("PACKING_LAB_ALLOWED_ROOTS")
    roots = [Path(part) for part in raw.split(os.pathsep) if part] if raw else [data_dir(), Path(get_upload_folder())]
    return [root.expanduser().resolve() for root in roots]


def check_local_path(value, what: str, file_suffixes: tuple[str, ...] = ()) -> None:
    """Refuses a local path outside the allowed roots. The engine reads a value as a path when it exists (or, for
    data, ends in .json/.jsonl), otherwise as a hub id; the same test here decides what needs checking."""
    if not isinstance(value, str) or not value.strip():
        return  # the engine's own validation names the empty field
    path = Path(value.strip()).expanduser()
    if not (path.exists() or path.suffix in file_suffixes):
        return
    resolved = path.resolve()  # follows symlinks, so a link inside a root cannot point outside it
    if not any(resolved.is_relative_to(root) for root in allowed_roots()):
        raise demo_core.DemoInputError(
            f"{what} path {value.strip()!r} is outside the folders this app may read; upload the file instead, or "
            f"ask the operator to add its folder to PACKING_LAB_ALLOWED_ROOTS")


def make_config(model, dataset, samples, collators, steps, batch_size, attention, seed, max_length=DEFAULTS.max_length,
                precision=DEFAULTS.precision, optimizer=DEFAULTS.optimizer, upload: str | None = None) -> RunConfig:
    """The one way the page and the API build a run. An uploaded file (already inside Gradio's upload folder) replaces
    the dataset field; everything else is validated by the engine (`RunConfig.validated`)."""
    check_local_path(model, "model")
    if not upload:
        check_local_path(dataset, "dataset", (".json", ".jsonl"))
    return RunConfig(model=model, dataset=upload or dataset, samples=samples, collators=collators, steps=steps,
                     batch_size=batch_size, attention=attention, seed=seed, max_length=max_length, precision=precision,
                     optimizer=optimizer)


def config_from_document(document: dict) -> RunConfig:
    names = {field.name for field in dataclasses.fields(RunConfig)}
    return RunConfig(**{key: value for key, value in document["config"].items() if key in names})


# ----------------------------------------------------------------------------------------------------------------
# Tables and downloads from a run document
# ----------------------------------------------------------------------------------------------------------------

def write_downloads(document: dict, name: str) -> tuple[str, str]:
    folder = DOWNLOAD_DIR / name
    folder.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = folder / f"packing-lab-{name}.json", folder / f"packing-lab-{name}.csv"
    demo_core.write_json(document, json_path)
    csv_path.write_text(report.results_csv(document))
    return str(json_path), str(csv_path)


def history_table() -> list[list]:
    return [report.history_row(summary) for summary in reversed(saved_runs())]  # newest first


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
    preview = demo_core.preview(make_config(model, dataset, samples, collators, steps, batch_size, attention, seed,
                                            max_length, precision, optimizer, upload=upload), limits=LIMITS)
    yield plots.batch_figure(preview), gr.skip(), gr.skip()
    yield gr.skip(), plots.lengths_figure(preview), report.cost_markdown(preview)


def _result_views(document: dict, name: str) -> tuple:
    """(throughput, loss, memory, results table, contamination table, JSON file, CSV file, time anatomy figure and
    its words) of a finished run."""
    return (plots.throughput_figure(document), plots.loss_figure(document), plots.memory_figure(document),
            report.results_table(document), report.contamination_table(document), *write_downloads(document, name),
            plots.anatomy_figure(document), report.anatomy_markdown(document))


# A Stop click finds the run of its own browser session here.
_STOP_EVENTS: dict[str, threading.Event] = {}


def _train_in_worker(prepared: demo_core.Prepared, stop_event: threading.Event, updates: queue.Queue) -> threading.Thread:
    """Trains in a thread that reports ("step", name, step), ("result", Result), ("done", Comparison) or ("error", e)."""
    def work():
        try:
            comparison = demo_core.run_comparison(
                prepared, stop_event=stop_event,
                progress=lambda name, step, _total: updates.put(("step", name, step)),
                on_result=lambda result: updates.put(("result", result)))
            updates.put(("done", comparison))
        except BaseException as error:  # handed to the handler thread, which reports it
            updates.put(("error", error))

    worker = threading.Thread(target=work, name="packing-lab-run", daemon=True)
    worker.start()
    return worker


@on_gpu
@user_errors
def run_page(model, dataset, upload, samples, collators, steps, batch_size, attention, precision, optimizer, seed,
             max_length, request: gr.Request, progress=gr.Progress()):
    """Prepares the run once: draws its batch, then trains in a worker thread and yields the views after each
    collator; the last yield adds the history row."""
    started = time.perf_counter()
    prepared = demo_core.prepare(make_config(model, dataset, samples, collators, steps, batch_size, attention, seed,
                                             max_length, precision, optimizer, upload=upload), limits=LIMITS)
    yield ("Training…", gr.skip(), *_preview_views(demo_core.preview(prepared)), *[gr.skip()] * 10)
    steps, collator_count = prepared.config.steps, len(prepared.specs)
    total_steps = collator_count * steps
    stop_event = threading.Event()
    _STOP_EVENTS[request.session_hash] = stop_event
    updates: queue.Queue = queue.Queue()
    worker = _train_in_worker(prepared, stop_event, updates)
    results = []
    # Steps done per collator: on a CPU the collators take turns step by step, so their steps arrive interleaved
    # and their results all at the end; the progress bar counts every collator's steps.
    steps_done = dict.fromkeys((spec.name for spec in prepared.specs), 0)
    try:
        progress((0, total_steps), desc="building the model and the first batch")
        while True:
            kind, *payload = updates.get()
            if kind == "step":
                name, step = payload
                steps_done[name] = step
                progress((sum(steps_done.values()), total_steps),
                         desc=" · ".join(f"{name} {done}/{steps}" for name, done in steps_done.items()))
            elif kind == "result":
                results.append(payload[0])
                progress((sum(steps_done.values()), total_steps),
                         desc="contamination check" if len(results) == collator_count else "next collator")
                partial = prepared.comparison(results).to_dict()
                yield (f"Running: {len(results)} of {collator_count} collators done…", *[gr.skip()] * 4,
                       plots.throughput_figure(partial), plots.loss_figure(partial), plots.memory_figure(partial),
                       report.results_table(partial), *[gr.skip()] * 3, plots.anatomy_figure(partial),
                       report.anatomy_markdown(partial), gr.skip())
            elif kind == "error":
                raise payload[0]
            else:
                document = payload[0].to_dict()
                break
    finally:
        stop_event.set()  # the page closed or errored mid-run: let the worker stop at its next step
        worker.join()  # one training job at a time: the queue slot frees only when the worker is done
        _STOP_EVENTS.pop(request.session_hash, None)
    entry = HISTORY.append(document)
    yield (f"Saved as run {entry.run_id} in the history below.",
           report.headline(document, time.perf_counter() - started), *[gr.skip()] * 3,
           *_result_views(document, entry.run_id), history_table())


def request_stop(request: gr.Request) -> str:
    event = _STOP_EVENTS.get(request.session_hash)
    if event is None:
        return "Nothing is running in this tab."
    event.set()
    return "Stopping after the current step…"


@user_errors
def show_history_run(selection: gr.SelectData):
    """Redraws a run picked in the history table: its results and, when its data is still readable, its batch."""
    entry = HISTORY.get(str(selection.row_value[0]))
    if entry is None:
        raise demo_core.DemoInputError("that run is no longer in the history file")
    document = entry.document
    try:
        batch, lengths, cost = _preview_views(demo_core.preview(config_from_document(document), limits=LIMITS))
    except demo_core.DemoInputError as error:  # e.g. an uploaded file Gradio has since cleaned up
        batch, lengths, cost = None, None, f"*The batch picture cannot be redrawn: {error}*"
    return (f"*History run {entry.run_id} ({entry.saved_at})*\n\n" + report.headline(document), batch, lengths, cost,
            *_result_views(document, entry.run_id))


# ----------------------------------------------------------------------------------------------------------------
# API endpoints (gradio_client): the signature is the API, so names and defaults are the documented ones
# ----------------------------------------------------------------------------------------------------------------


@on_gpu
@user_errors
def compare(model: str = DEFAULTS.model, dataset: str = DEFAULTS.dataset, samples: int = DEFAULTS.samples,
            collators: str = ",".join(DEFAULTS.collators), steps: int = DEFAULTS.steps,
            batch_size: int = DEFAULTS.batch_size, attention: str = DEFAULTS.attention,
            seed: int = DEFAULTS.seed, max_length: int = DEFAULTS.max_length) -> dict:
    """Trains a short burst per collator and returns the engine's JSON document (config, dataset_stats, results,
    comparison, contamination, environment). `collators` is a comma list, e.g. "padded,flatten"."""
    config = make_config(model, dataset, samples, collators, steps, batch_size, attention, seed, max_length)
    document = demo_core.run_comparison(config, limits=LIMITS).to_dict()
    HISTORY.append(document)
    return document


@user_errors
def preview(model: str = DEFAULTS.model, dataset: str = DEFAULTS.dataset, samples: int = DEFAULTS.samples,
            collators: str = ",".join(DEFAULTS.collators), steps: int = DEFAULTS.steps,
            batch_size: int = DEFAULTS.batch_size, attention: str = DEFAULTS.attention,
            seed: int = DEFAULTS.seed, max_length: int = DEFAULTS.max_length) -> dict:
    """The numbers before any training: length statistics, the first batch under each collator (lengths,
    cu_seqlens, position_ids, labels, shape, pad_fraction) and the cost preview (`cost`)."""
    return demo_core.preview(make_config(model, dataset, samples, collators, steps, batch_size, attention, seed,
                                         max_length), limits=LIMITS)


@user_errors
def saved_runs() -> list[dict]:
    """The saved runs, oldest first: one summary each (run_id, saved_at, model, dataset, samples, collators, steps,
    batch_size, seed, max_length, attention, best_speedup, partial). The history file survives restarts; a line
    torn by a crash is skipped with a warning in the server log."""
    return [report.run_summary(entry.run_id, entry.saved_at, entry.document) for entry in HISTORY.entries()]


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
    ui.upload = gr.File(label="Or upload .json / .jsonl (used instead)", file_types=[".json", ".jsonl"],
                        type="filepath")
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
    return ui


def build_demo() -> gr.Blocks:
    with gr.Blocks(title="Packing Lab") as demo:
        gr.Markdown(INTRO)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                inputs = _settings_column()
            with gr.Column(scale=3):
                views = _views_column()
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
            widget.change(**preview_options)  # always_last: dragging a slider redraws once it settles
        inputs.run_button.click(run_page, inputs=page_inputs, api_visibility="private", concurrency_id="training",
                                outputs=[inputs.status, views.summary, *preview_outputs, *result_outputs,
                                         views.history], show_progress_on=[inputs.status])
        inputs.stop_button.click(request_stop, outputs=inputs.status, api_visibility="private",
                                 concurrency_limit=None, concurrency_id="stop")
        # (every event in a concurrency group needs the group's limit: the lowest one given wins)
        views.history.select(show_history_run, outputs=[views.summary, *preview_outputs, *result_outputs],
                             api_visibility="private", concurrency_id="preview", concurrency_limit=4)
        gr.api(compare, api_name="compare", concurrency_id="training")
        gr.api(preview, api_name="preview", concurrency_id="preview", concurrency_limit=4)
        gr.api(saved_runs, api_name="history", concurrency_id="history", concurrency_limit=4)
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
