"""Packing Lab: a Gradio page over the `demo_core` engine. UI only: widgets -> engine calls -> figures and tables.

Run `python app.py` (127.0.0.1:7860 by default; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT move it). API endpoints for
`gradio_client`: `/compare` (train and return the engine's JSON document) and `/preview` (the numbers before training),
both taking (model, dataset, samples, collators, steps, batch_size, attention, seed, max_length, precision, optimizer,
dataset_file); `/history` (the saved runs this client may see, one summary each), `/delete_runs`, and
`/plan` (the memory planner, serving/planner_page.py).

What serving many visitors needs lives in `serving/`: who made a run (`sessions`), uploads that stay the uploader's
and are deleted after their run (`uploads`), the GPU part of a run shaped for ZeroGPU's forked worker (`gpu`) and its
time plan and saving (`runs`); so do the page's parts: its widgets (`layout`), look (`page`), views (`views`) and the
line that says which settings each section shows (`provenance`). Limits come from the environment
(`demo_core.Limits.from_env()`); local model and data paths typed into the page or the API must lie under
PACKING_LAB_ALLOWED_ROOTS (default: the data dir); finished runs are kept in `<PACKING_LAB_DATA_DIR>/history.jsonl`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline by default: set before gradio is imported

import gradio as gr  # noqa: E402

import demo_core  # noqa: E402
from demo_core import Limits, RunConfig, RunHistory, data_dir, report  # noqa: E402
from demo_core.stop import TIME_BUDGET  # noqa: E402
from serving import gpu, history_view, layout, page, planner_page, provenance, runs, uploads, views  # noqa: E402
from serving.api_docs import (AttentionName, OptimizerName, PrecisionName, PreviewDocument, RunDocument,  # noqa: E402
                              RunSummary, documented_api, with_settings_args)
from serving.errors import user_errors  # noqa: E402
from serving.inputs import config_from_document, prepare as prepare_from_inputs  # noqa: E402
from serving.sessions import Session  # noqa: E402
from serving.uploads import Upload  # noqa: E402

LIMITS = Limits.from_env()
HISTORY = RunHistory(data_dir())
# The engine's defaults, lowered to the configured caps so that a run with defaults is always allowed.
DEFAULTS = RunConfig(samples=min(RunConfig.samples, LIMITS.max_samples), steps=min(RunConfig.steps, LIMITS.max_steps),
                     batch_size=min(RunConfig.batch_size, LIMITS.max_batch_size),
                     max_length=min(RunConfig.max_length, LIMITS.max_length))


def prepare_inputs(upload: Upload | None, *fields) -> demo_core.Prepared:
    """fields: model, dataset, samples, collators, steps, batch_size, attention, seed, max_length, precision,
    optimizer."""
    return prepare_from_inputs(LIMITS, upload, *fields)


# ----------------------------------------------------------------------------------------------------------------
# Handlers
# ----------------------------------------------------------------------------------------------------------------

@user_errors
def show_preview(model, dataset, upload, samples, collators, steps, batch_size, attention, precision, optimizer, seed,
                 max_length, shown: dict | None = None, picture_px: float | None = None):
    """Sends the batch picture as soon as it is drawn (the view people wait for), then the histogram and costs.
    Values the picture already shows (a box left without a change) are not drawn again."""
    inputs = [model, dataset, upload, samples, collators, steps, batch_size, attention, precision, optimizer, seed,
              max_length]
    if provenance.is_shown(shown, inputs):
        yield (gr.skip(),) * 4
        return
    preview = demo_core.preview(prepare_inputs(Upload.from_value(upload), model, dataset, samples, collators, steps,
                                               batch_size, attention, seed, max_length, precision, optimizer))
    shown = provenance.preview_shown(preview["config"], inputs)
    yield views.batch_picture(preview, picture_px), gr.skip(), gr.skip(), shown
    yield gr.skip(), *views.lengths_views(preview, picture_px), gr.skip()


def preview_failed(*inputs_and_shown) -> dict:
    """The current inputs could not be drawn: the line over the picture says it still shows the previous ones."""
    *inputs, shown = inputs_and_shown
    return provenance.preview_failed(shown, inputs)


def begin_run() -> tuple:
    """Run was clicked: until the run ends the button is off (a click is never silently ignored) and the previous
    run's views are cleared."""
    return (gr.Button(interactive=False), "", "### Training…", *views.NO_RESULTS, provenance.run_started())


def end_run() -> gr.Button:
    return gr.Button(interactive=True)  # done, or stopped


def run_failed(run: dict) -> tuple:
    """The run raised (its message is on screen): Run comes back, and section 2's line says so."""
    return end_run(), "The run did not finish: see the message.", provenance.run_failed(run)


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
             max_length, request: gr.Request, progress=gr.Progress(), picture_px: float | None = None):
    """Prepares the run once and draws its batch, then trains (on ZeroGPU: in the GPU worker) and yields the views
    after each collator; the last yield adds the history row and empties the upload box (the file is deleted)."""
    started = time.perf_counter()
    session, file = Session.of(request), Upload.from_value(upload)
    # Running from the click on: a Stop while the run is prepared or its batch drawn ends it before training
    # (the marker would otherwise only exist once training starts, and Stop would say nothing runs).
    with session.running():
        prepared = prepare_inputs(file, model, dataset, samples, collators, steps, batch_size, attention, seed,
                                  max_length, precision, optimizer)
        job = runs.plan(prepared, HISTORY, LIMITS, session.stop_marker, file)
        inputs = [model, dataset, upload, samples, collators, steps, batch_size, attention, precision, optimizer, seed,
                  max_length]
        preview = demo_core.preview(prepared)
        config, steps, collator_count = preview["config"], prepared.config.steps, len(prepared.specs)
        yield ("Training… Stop ends it after the current step.", gr.skip(), *views.preview_views(preview, picture_px),
               *[gr.skip()] * 9, provenance.preview_shown(config, inputs),
               provenance.run_training(config, 0, collator_count), gr.skip(), gr.skip())
        total_steps = collator_count * steps
        # Steps done per collator: on a CPU the collators take turns step by step, so their steps arrive interleaved
        # and their results all at the end; the progress bar counts every collator's steps.
        steps_done = dict.fromkeys((spec.name for spec in prepared.specs), 0)
        with contextlib.closing(runs.train_and_save(job, HISTORY, session, file)) as events:
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
                    lines = report.collator_lines(partial, preview["attention_why"])
                    summary = "\n".join(f"- {line}" for line in lines)
                    yield (gr.skip(), f"### Training: {done} of {collator_count} collators done\n{summary}",
                           *[gr.skip()] * 3, *views.result_figures(partial, picture_px), report.results_table(partial),
                           *[gr.skip()] * 3, *views.anatomy_views(partial, picture_px), gr.skip(),
                           provenance.run_training(config, done, collator_count), gr.skip(), gr.skip())
                else:
                    entry = payload[0]
    if entry is None:  # stopped before its first step: while it was prepared, or waited for the GPU
        yield ("Stopped before the first step: nothing to save.", "### Stopped before the first step",
               *[gr.skip()] * 13, provenance.run_empty(), gr.skip(), gr.skip() if file is None else None)
        return
    yield (_saved_status(entry, job, file),
           report.headline(entry.document, time.perf_counter() - started, preview["attention_why"]),
           *[gr.skip()] * 3, *views.result_views(entry.document, entry.run_id, picture_px), gr.skip(),
           provenance.run_saved(entry.run_id, entry.saved_at, entry.document), history_table(request),
           gr.skip() if file is None else None)


def request_stop(request: gr.Request) -> str:
    if not Session.of(request).request_stop():
        return "Nothing is running in this tab."
    return "Stopping after the current step…"


# The widgets a history click writes a run's settings back into, in the page's order.
WIDGET_SETTINGS = ("model", "dataset", "samples", "collators", "steps", "batch_size", "attention", "precision",
                   "optimizer", "seed", "max_length")


@user_errors
def show_history_run(selection: gr.SelectData, request: gr.Request, picture_px: float | None = None):
    """Redraws a run picked in the history table: its settings go back into the inputs (without training), its
    batch is redrawn when its data is still readable, and its results fill section 2."""
    entry = history_view.entry(HISTORY, Session.of(request), str(selection.row_value[0]))
    document, config = entry.document, entry.document["config"]
    settings = [config[name] for name in WIDGET_SETTINGS]
    attention_why, missing = None, None
    if entry.private:  # its dataset was an upload, deleted after the run: the dataset box keeps what it has
        settings[WIDGET_SETTINGS.index("dataset")] = gr.skip()
        missing = f"the batch of run {entry.run_id} cannot be redrawn: its uploaded file was deleted"
    else:
        try:
            preview = demo_core.preview(config_from_document(document), limits=LIMITS)
            batch, lengths, cost = views.preview_views(preview, picture_px)
            attention_why = preview["attention_why"]
        except demo_core.DemoInputError as error:  # e.g. a data file that has since been removed
            missing = f"the batch of run {entry.run_id} cannot be redrawn: {error}"
    if missing:
        batch, lengths, cost = None, None, f"*{missing[0].upper()}{missing[1:]}.*"
    model, dataset, *rest = settings  # the upload box, between them, is emptied: the run's data is its dataset
    return (f"*Run {entry.run_id} from the history*\n\n" + report.headline(document, attention_why=attention_why),
            model, dataset, None, *rest, batch, lengths, cost, provenance.preview_shown(config, None, missing),
            provenance.run_saved(entry.run_id, entry.saved_at, document),
            *views.result_views(document, entry.run_id, picture_px))


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

@with_settings_args
@user_errors
def compare(model: str = DEFAULTS.model, dataset: str = DEFAULTS.dataset, samples: int = DEFAULTS.samples,
            collators: str = ",".join(DEFAULTS.collators), steps: int = DEFAULTS.steps,
            batch_size: int = DEFAULTS.batch_size, attention: AttentionName = DEFAULTS.attention,
            seed: int = DEFAULTS.seed, max_length: int = DEFAULTS.max_length,
            precision: PrecisionName = DEFAULTS.precision, optimizer: OptimizerName = DEFAULTS.optimizer,
            dataset_file: gr.FileData | None = None, request: gr.Request = None) -> RunDocument:
    """Trains a short burst per collator, saves the run and returns it. An uploaded file is deleted from the server
    when the run ends.

    Returns:
        the run's JSON document (as `python -m demo_core compare --json` writes it): config, dataset_stats, results
        (one per collator), comparison (speedup, ideal speedup and loss difference vs padded per collator),
        ideal_speedup, contamination, environment, partial, and stop_reason (null, "stop" or "time budget")
    """
    session, file = Session.of(request), Upload.from_value(dataset_file)
    prepared = prepare_inputs(file, model, dataset, samples, collators, steps, batch_size, attention, seed,
                              max_length, precision, optimizer)
    job = runs.plan(prepared, HISTORY, LIMITS, session.stop_marker, file)
    with session.running():
        *_, (_, entry) = runs.train_and_save(job, HISTORY, session, file)
    if entry is None:  # its time budget was spent before the first step (a GPU that took long to come)
        raise demo_core.DemoInputError("the run stopped before its first step: nothing to return; try again")
    return entry.document


@with_settings_args
@user_errors
def preview(model: str = DEFAULTS.model, dataset: str = DEFAULTS.dataset, samples: int = DEFAULTS.samples,
            collators: str = ",".join(DEFAULTS.collators), steps: int = DEFAULTS.steps,
            batch_size: int = DEFAULTS.batch_size, attention: AttentionName = DEFAULTS.attention,
            seed: int = DEFAULTS.seed, max_length: int = DEFAULTS.max_length,
            precision: PrecisionName = DEFAULTS.precision, optimizer: OptimizerName = DEFAULTS.optimizer,
            dataset_file: gr.FileData | None = None) -> PreviewDocument:
    """The numbers before any training, from the data alone.

    Returns:
        config, dataset_stats (length statistics), lengths (every example's), attention (the path that would run,
        attention_why), device, batches (the first batch under each collator: lengths, cu_seqlens, position_ids,
        labels, shape, pad_fraction) and cost (pad fraction, ideal speedup, attention score counts, optimizer steps)
    """
    return demo_core.preview(prepare_inputs(Upload.from_value(dataset_file), model, dataset, samples, collators,
                                            steps, batch_size, attention, seed, max_length, precision, optimizer))


def saved_runs(request: gr.Request = None) -> list[RunSummary]:
    """The saved runs this client may see, oldest first: everyone's shared runs and this client's private ones (made
    on its uploaded files). The history file survives restarts; a line torn by a crash is skipped with a warning in
    the server log.

    Returns:
        one summary per run: run_id, saved_at, model, dataset, samples (the examples it used), collators, steps,
        batch_size, seed, max_length, attention, best_speedup, partial, private, and yours (made by this client: it
        may delete it)
    """
    return history_view.summaries(HISTORY, Session.of(request))


@user_errors
def delete_runs(run_ids: str = "", request: gr.Request = None) -> list[str]:
    """Deletes runs this client made from the history, for every viewer.

    Args:
        run_ids: comma-separated run ids (those /history lists with yours = true), or empty for all of them

    Returns:
        the run ids deleted
    """
    wanted = {part.strip() for part in run_ids.split(",") if part.strip()}
    return history_view.delete(HISTORY, Session.of(request), wanted or None)


# ----------------------------------------------------------------------------------------------------------------
# The page
# ----------------------------------------------------------------------------------------------------------------


def build_demo() -> gr.Blocks:
    # delete_cache: Gradio sweeps the files it holds for this app (uploads nobody ran, served copies of downloads).
    with gr.Blocks(title="Packing Lab", delete_cache=uploads.sweep_schedule(), fill_width=True) as demo:
        gr.Markdown(layout.INTRO)
        bar = layout.action_bar()
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                inputs = layout.settings_column(LIMITS, DEFAULTS)
            with gr.Column(scale=3):
                views = layout.views_column()
        # What each section shows (serving.provenance), and the batch picture's width (set by WITH_PICTURE_WIDTH).
        shown_preview, shown_run = gr.State(None), gr.State(provenance.NO_RUN)
        picture_px = gr.Number(visible=False)
        planner_page.build_planner_section(demo, picture_px)
        _wire(demo, bar, inputs, views, shown_preview, shown_run, picture_px)
    # One training job at a time: every training event shares the "training" group under this default limit.
    demo.queue(default_concurrency_limit=1)
    return demo


def _wire(demo, bar, inputs, views, shown_preview, shown_run, picture_px) -> None:
    page_inputs = [inputs.model.box, inputs.dataset.box, inputs.upload, inputs.samples, inputs.collators, inputs.steps,
                   inputs.batch_size, inputs.attention, inputs.precision, inputs.optimizer, inputs.seed,
                   inputs.max_length]
    preview_outputs = [views.batch_plot, views.lengths_plot, views.cost]
    result_outputs = [views.throughput_plot, views.loss_plot, views.memory_plot, views.results, views.contamination,
                      views.json_file, views.csv_file, views.anatomy_plot, views.anatomy_text]
    # Previews are cheap (no model runs) and must not wait behind a training job, so they get their own group.
    # (every event in a concurrency group needs the group's limit: the lowest one given wins)
    in_preview_group = dict(concurrency_id="preview", concurrency_limit=4, api_visibility="private")
    # Bookkeeping that waits for nothing. Queued all the same: a State that an unqueued event sets fires no `change`.
    instant = dict(concurrency_limit=None, show_progress="hidden", api_visibility="private")
    preview_options = dict(fn=show_preview, inputs=[*page_inputs, shown_preview, picture_px],
                           js=page.WITH_PICTURE_WIDTH, outputs=[*preview_outputs, shown_preview],
                           trigger_mode="always_last", show_progress="minimal", **in_preview_group)
    # Only what a person does triggers a preview (`input`, Enter, leaving a box, a chip, an upload), never a value a
    # handler writes (a history click fills every input at once; that run's batch is drawn by the click itself).
    previews = gr.on([demo.load, inputs.model.box.submit, inputs.model.box.blur, inputs.dataset.box.submit,
                      inputs.dataset.box.blur, inputs.upload.upload, inputs.upload.clear, inputs.samples.input,
                      inputs.collators.input, inputs.steps.input, inputs.batch_size.input, inputs.attention.input,
                      inputs.precision.input, inputs.optimizer.input, inputs.seed.input, inputs.max_length.input],
                     **preview_options)
    previews.failure(preview_failed, inputs=[*page_inputs, shown_preview], outputs=shown_preview, **instant)
    for field in (inputs.model, inputs.dataset):
        for choice, chip in field.chips.items():
            chip.click(None, js=f"() => {json.dumps(choice)}", outputs=field.box).then(**preview_options)
    gr.on([shown_preview.change, shown_run.change], provenance.lines, inputs=[shown_preview, shown_run],
          outputs=[views.batch_source, views.results_source], queue=False, show_progress="hidden",
          api_visibility="private")
    demo.load(history_table, outputs=views.history, api_visibility="private")  # every load: survives restarts

    training = bar.run_button.click(begin_run, **instant,
                                    outputs=[bar.run_button, bar.status, views.summary, *result_outputs, shown_run])
    run = training.then(run_page, inputs=[*page_inputs, picture_px], js=page.WITH_PICTURE_WIDTH,
                        api_visibility="private", concurrency_id="training", show_progress_on=[bar.progress],
                        outputs=[bar.status, views.summary, *preview_outputs, *result_outputs, shown_preview,
                                 shown_run, views.history, inputs.upload])
    # Gradio 6.31's page follows a failed event with its `.failure` listeners only (not `.then`, whatever its docs
    # say), so each ending gives Run back on its own.
    run.success(end_run, outputs=bar.run_button, **instant)
    run.failure(run_failed, inputs=shown_run, outputs=[bar.run_button, bar.status, shown_run], **instant)
    bar.stop_button.click(request_stop, outputs=bar.status, api_visibility="private", concurrency_limit=None,
                          concurrency_id="stop")
    views.history.select(show_history_run, inputs=picture_px, js=page.WITH_PICTURE_WIDTH, **in_preview_group,
                         outputs=[views.summary, *page_inputs, *preview_outputs, shown_preview, shown_run,
                                  *result_outputs])
    views.delete_button.click(delete_my_runs, outputs=[bar.status, views.history], api_visibility="private",
                              concurrency_id="history", concurrency_limit=4)
    demo.unload(forget_session)
    documented_api(demo, compare, "compare", "document", concurrency_id="training")
    documented_api(demo, preview, "preview", "numbers", concurrency_id="preview", concurrency_limit=4)
    documented_api(demo, saved_runs, "history", "runs", concurrency_id="history", concurrency_limit=4)
    documented_api(demo, delete_runs, "delete_runs", "deleted", concurrency_id="history", concurrency_limit=4)


demo = build_demo()


def launch(**overrides):
    """Starts the server on the offline defaults; tests pass `prevent_thread_lock=True` and a free port."""
    port = os.environ.get("GRADIO_SERVER_PORT")
    options = dict(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   server_port=int(port) if port else None, share=False, show_error=False,
                   max_file_size=LIMITS.max_upload_bytes, theme=page.THEME,
                   css_paths=[page.CSS_PATH], js=page.JS)
    demo_core.initialize_profiler()  # the time anatomy profiles in worker threads: kineto must start in this one
    return demo.launch(**{**options, **overrides})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    planner_page.warm_up_in_background()
    launch()
