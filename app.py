"""Packing Lab: a Gradio page over the `demo_core` engine. UI only: widgets -> engine calls -> figures and tables.

Run `python app.py` (127.0.0.1:7860 by default; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT move it). API endpoints for
`gradio_client`: `/compare` (train and return the engine's JSON document) and `/preview` (the numbers before training),
both taking the settings RunConfig declares for the API, in their declared order (model, dataset, samples,
collators, steps, batch_size, attention, seed, max_length, precision, optimizer, dataset_file, ...); `/history` (the
saved runs this client may see, one summary each), `/run`, `/delete_runs`, `/share`, `/shared` and `/unshare` (links to
a run: serving/sharing.py), and `/plan` (the memory planner, serving/planner_page.py).

What serving many visitors needs (sessions, uploads, the GPU worker, runs and their history, links) and the page's
parts (layout, widgets, look, views) live in `serving/`, listed in docs/CONTRIBUTING.md; the figures, tables and
sentences are drawn by `presentation/` from the engine's numbers. Settings come from the environment, checked at
start-up (`serving/operator_settings.py`); local model and data paths typed into the page or the API must lie under
the allowed roots (default: the data dir); finished runs are kept in `<PACKING_LAB_DATA_DIR>/history.jsonl`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline by default: set before gradio is imported

import gradio as gr  # noqa: E402

import demo_core  # noqa: E402
from demo_core import RunConfig  # noqa: E402
from demo_core.settings import capped_defaults  # noqa: E402
from presentation import headline  # noqa: E402
from serving import (gpu, history_view, layout, operator_settings, page, planner_page, provenance, runs,  # noqa: E402
                     takehome, uploads, views)
from serving.api_docs import (DATASET_FILE, PreviewDocument, RunDocument, RunSummary, SharedLink,  # noqa: E402
                              documented_api, settings_endpoint)
from serving.errors import user_errors  # noqa: E402
from serving.history import HistoryEntry, RunHistory, data_dir  # noqa: E402
from serving.inputs import config_from_document, prepare as prepare_from_inputs  # noqa: E402
from serving.page import Screen  # noqa: E402
from serving.sessions import Session  # noqa: E402
from serving.sharing import SharedRuns  # noqa: E402
from serving.stop import TIME_BUDGET  # noqa: E402
from serving.uploads import Upload  # noqa: E402

LIMITS = operator_settings.checked_limits()  # a bad setting stops the server here: `error: ...`, exit 2
HISTORY = RunHistory(data_dir())
SHARES = SharedRuns(data_dir())  # read-only copies of runs, opened by their links (serving/sharing.py)
# The engine's defaults, lowered to the configured caps so that a run with defaults is always allowed.
DEFAULTS = capped_defaults(RunConfig, LIMITS)


def prepare_inputs(upload: Upload | None, **settings) -> demo_core.Prepared:
    return prepare_from_inputs(LIMITS, upload, **settings)


def preview_of(run: demo_core.Prepared | RunConfig) -> dict:
    """The preview, its predicted time from the seconds per token slot of the runs saved here (duration.py)."""
    return demo_core.preview(run, limits=LIMITS, earlier_runs=(entry.document for entry in HISTORY.entries()))


# ----------------------------------------------------------------------------------------------------------------
# Handlers: the page's settings arrive by name (`inputs_kwargs`, one per declared setting), and each returns or yields
# `{component: value}` for what it changes (the components are the page's, `UI`, built below). Those that draw
# figures take the browser's `screen` (serving.page.Screen: the views column's width and its pixel density).
# ----------------------------------------------------------------------------------------------------------------

@user_errors
def show_preview(*, upload=None, shown: dict | None = None, screen: dict | None = None, **settings):
    """Sends the batch picture as soon as it is drawn (the view people wait for), then the histogram and costs.
    Values the picture already shows (a box left without a change) are not drawn again."""
    inputs, screen = {**settings, "upload": upload}, Screen.of(screen)
    if provenance.is_shown(shown, inputs):
        yield {UI.shown_preview: gr.skip()}
        return
    preview = preview_of(prepare_inputs(Upload.from_value(upload), **settings))
    yield {UI.views.batch_plot: views.batch_picture(preview, screen), **views.forecast_views(UI.bar, preview),
           UI.shown_preview: provenance.preview_shown(preview["config"], inputs)}
    yield views.lengths_views(UI.views, preview, screen)


def preview_failed(*, upload=None, shown: dict | None = None, **settings) -> dict:
    """The current inputs could not be drawn: the line over the picture says it still shows the previous ones."""
    return provenance.preview_failed(shown, {**settings, "upload": upload})


def begin_run() -> dict:
    """Run was clicked: until the run ends the button is off (a click is never silently ignored) and the previous
    run's views are cleared."""
    return {UI.bar.run_button: gr.Button(interactive=False), UI.bar.status: "", UI.views.summary: "### Training…",
            **views.no_results(UI.views), UI.shown_run: provenance.run_started()}


def end_run() -> gr.Button:
    return gr.Button(interactive=True)  # done, or stopped


def run_failed(run: dict) -> dict:
    """The run raised (its message is on screen): Run comes back, and section 2's line says so."""
    return {UI.bar.run_button: end_run(), UI.bar.status: "The run did not finish: see the message.",
            UI.shown_run: provenance.run_failed(run)}


def _saved_status(entry: HistoryEntry, job: gpu.TrainingJob, upload: Upload | None) -> str:
    status = f"Saved as run {entry.run_id} in the history below."
    if entry.document.get("stop_reason") == TIME_BUDGET:
        status += (f" It stopped itself at its time budget ({job.budget_s:.0f} s) and kept what it had: use fewer "
                   "steps or collators to finish.")
    if upload is not None:
        status += f" {upload.name} was deleted from the server; this run is listed in this tab only."
    return status


def _collator_done(preview: dict, partial: dict, done: int, of: int, screen: Screen) -> dict:
    """The views after `done` of `of` collators finished: the headline so far, figures, table and time anatomy."""
    return {**views.training_views(UI.views, partial, done, of, preview["attention_why"], screen),
            UI.shown_run: provenance.run_training(preview["config"], done, of)}


@user_errors
def run_page(request: gr.Request, progress=gr.Progress(), *, upload=None, screen: dict | None = None, **settings):
    """Prepares the run once and draws its batch, then trains (on ZeroGPU: in the GPU worker) and yields the views
    after each collator; the last yield adds the history row and empties the upload box (the file is deleted)."""
    started = time.perf_counter()
    session, file, screen = Session.of(request), Upload.from_value(upload), Screen.of(screen)
    emptied_upload = {} if file is None else {UI.upload: None}
    # Running from the click on: a Stop while the run is prepared or its batch drawn ends it before training
    # (the marker would otherwise only exist once training starts, and Stop would say nothing runs).
    with session.running():
        prepared = prepare_inputs(file, **settings)
        job = runs.plan(prepared, HISTORY, LIMITS, session.stop_marker, file)
        preview = preview_of(prepared)
        config, steps, collator_count = preview["config"], prepared.config.steps, len(prepared.specs)
        yield {UI.bar.status: "Training… Stop ends it after the current step.",
               **views.preview_views(UI.views, preview, screen), **views.forecast_views(UI.bar, preview),
               UI.shown_preview: provenance.preview_shown(config, {**settings, "upload": upload}),
               UI.shown_run: provenance.run_training(config, 0, collator_count)}
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
                    done = len(payload[0]["results"])
                    progress((sum(steps_done.values()), total_steps),
                             desc="contamination check" if done == collator_count else "next collator")
                    yield _collator_done(preview, payload[0], done, collator_count, screen)
                else:
                    entry = payload[0]
    if entry is None:  # stopped before its first step: while it was prepared, or waited for the GPU
        yield {UI.bar.status: "Stopped before the first step: nothing to save.",
               UI.views.summary: "### Stopped before the first step", UI.shown_run: provenance.run_empty(),
               **emptied_upload}
        return
    status = headline.status_line(entry.document, time.perf_counter() - started)
    yield {UI.bar.status: _saved_status(entry, job, file),
           **views.headline_views(UI.views, entry.document, status, preview["attention_why"]),
           **views.result_views(UI.views, entry.document, entry.run_id, screen),
           **takehome.shown_views(UI.views.takehome, request, entry.run_id),
           UI.shown_run: provenance.run_saved(entry.run_id, entry.saved_at, entry.document),
           UI.views.history: history_table(request), **emptied_upload}


def request_stop(request: gr.Request) -> str:
    if not Session.of(request).request_stop():
        return "Nothing is running in this tab."
    return "Stopping after the current step…"


@user_errors
def show_history_run(selection: gr.SelectData, request: gr.Request, *, screen: dict | None = None) -> dict:
    """Redraws a run picked in the history table: its settings go back into the inputs (without training), its
    batch is redrawn when its data is still readable, and its results fill section 2."""
    entry = history_view.entry(HISTORY, Session.of(request), str(selection.row_value[0]))
    document, config, screen = entry.document, entry.document["config"], Screen.of(screen)
    settings = provenance.settings_of(config)
    shown, attention_why, missing = {}, None, None
    if entry.private:  # its dataset was an upload, deleted after the run: the dataset box keeps what it has
        del settings["dataset"]
        missing = f"the batch of run {entry.run_id} cannot be redrawn: its uploaded file was deleted"
    else:
        try:
            preview = preview_of(config_from_document(document))
            shown = {**views.preview_views(UI.views, preview, screen), **views.forecast_views(UI.bar, preview)}
            attention_why = preview["attention_why"]
        except demo_core.DemoInputError as error:  # e.g. a data file that has since been removed
            missing = f"the batch of run {entry.run_id} cannot be redrawn: {error}"
    if missing:
        shown = {**dict.fromkeys([*views.preview_outputs(UI.views), *views.forecast_outputs(UI.bar)]),
                 UI.views.cost: f"*{missing[0].upper()}{missing[1:]}.*"}
    status = f"*Run {entry.run_id} from the history*\n\n{headline.status_line(document)}"
    return {**views.headline_views(UI.views, document, status, attention_why), **UI.settings.shown(settings),
            UI.upload: None,  # emptied: the run's data is its dataset
            **shown, UI.shown_preview: provenance.preview_shown(config, None, missing),
            UI.shown_run: provenance.run_saved(entry.run_id, entry.saved_at, document),
            **views.result_views(UI.views, document, entry.run_id, screen),
            **takehome.shown_views(UI.views.takehome, request, entry.run_id)}


@user_errors
def open_link(request: gr.Request, *, screen: dict | None = None) -> dict:
    """A page opened at a run's link (`?run=<id>`, `?shared=<token>`: takehome.linked_run) shows that run; the inputs
    keep their values, and the line over the results says which settings made the run."""
    linked = takehome.linked_run(HISTORY, SHARES, request)
    if linked is None:  # an empty dict would read as one value for 28 outputs: name one output, unchanged
        return {UI.shown_run: gr.skip()}
    document = linked.document
    return {**views.headline_views(UI.views, document, f"{linked.status}\n\n{headline.status_line(document)}"),
            **views.result_views(UI.views, document, linked.name, Screen.of(screen)),
            **takehome.shown_views(UI.views.takehome, request, linked.run_id, linked.token),
            UI.shown_run: provenance.run_saved(linked.run_id, linked.saved_at, document)}


@user_errors
def download_report(shown: dict | None, include_examples: bool, request: gr.Request) -> dict:
    return takehome.report_views(UI.views.takehome, HISTORY, SHARES, Session.of(request), shown, include_examples)


@user_errors
def share_shown(shown: dict | None, request: gr.Request) -> dict:
    link = takehome.share(HISTORY, SHARES, Session.of(request), (shown or {}).get("run_id") or "")
    return {**takehome.shared_views(UI.views.takehome, request, shown, link),
            UI.bar.status: "Shared: anyone with the link sees a read-only copy of this run (without an uploaded "
                           "dataset's text) until you revoke it."}


@user_errors
def revoke_shown(shown: dict | None, request: gr.Request) -> dict:
    takehome.revoke(SHARES, Session.of(request), (shown or {}).get("shared") or "")
    return {**takehome.revoked_views(UI.views.takehome, request, shown),
            UI.bar.status: "Revoked: the shared link opens nothing now."}


def history_table(request: gr.Request) -> list[list]:
    return history_view.table(HISTORY, Session.of(request))


@user_errors
def delete_my_runs(request: gr.Request) -> dict:
    deleted = history_view.delete(HISTORY, Session.of(request))
    status = f"Deleted {len(deleted)} run(s) made in this tab." if deleted else "This tab has made no runs."
    return {UI.bar.status: status, UI.views.history: history_table(request)}


def forget_session(request: gr.Request) -> None:
    """The tab closed: nobody can list its private runs any more, so they are deleted (its shared runs stay)."""
    history_view.delete(HISTORY, Session.of(request), private_only=True)


# ----------------------------------------------------------------------------------------------------------------
# API endpoints (gradio_client): the signature is the API, derived from RunConfig's declared settings (their `api`
# positions, types, defaults and help) plus the uploaded file (serving/api_docs.py `settings_endpoint`)
# ----------------------------------------------------------------------------------------------------------------

@user_errors
def compare(*, dataset_file: gr.FileData | None = None, request: gr.Request = None, **settings) -> RunDocument:
    """Trains a short burst per collator, saves the run and returns it. An uploaded file is deleted from the server
    when the run ends.

    Returns:
        the run's JSON document (as `python -m demo_core compare --json` writes it): config, dataset_stats, results
        (one per collator), comparison (speedup, ideal speedup and loss difference vs padded per collator),
        ideal_speedup, contamination, environment, partial, and stop_reason (null, "stop" or "time budget")
    """
    session, file = Session.of(request), Upload.from_value(dataset_file)
    prepared = prepare_inputs(file, **settings)
    job = runs.plan(prepared, HISTORY, LIMITS, session.stop_marker, file)
    with session.running():
        *_, (_, entry) = runs.train_and_save(job, HISTORY, session, file)
    if entry is None:  # its time budget was spent before the first step (a GPU that took long to come)
        raise demo_core.DemoInputError("the run stopped before its first step: nothing to return; try again")
    return entry.document


@user_errors
def preview(*, dataset_file: gr.FileData | None = None, request: gr.Request = None, **settings) -> PreviewDocument:
    """The numbers before any training, from the data alone.

    Returns:
        config, dataset_stats (length statistics), lengths (every example's), attention (the path that would run,
        attention_why), device, batches (the first batch under each collator: lengths, cu_seqlens, position_ids,
        labels, shape, pad_fraction) and cost (pad fraction, ideal speedup, attention score counts, optimizer steps)
    """
    return demo_core.preview(prepare_inputs(Upload.from_value(dataset_file), **settings))


def saved_runs(request: gr.Request = None) -> list[RunSummary]:
    """The saved runs this client may see, oldest first: everyone's shared runs and this client's private ones (made
    on its uploaded files). The history file survives restarts; a line torn by a crash is skipped with a warning in
    the server log.

    Returns:
        one summary per run: run_id, saved_at, model, dataset, samples (the examples it used), collators, steps,
        batch_size, grad_accum, effective_batch_size (examples per optimizer step), batch (in words), seed,
        max_length, attention, best_speedup, partial, private, and yours (made by this client: it may delete it)
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


@user_errors
def saved_run(run_id: str, request: gr.Request = None) -> RunDocument:
    """A saved run's document, if this client may see it (as /history lists it); the page opens it at ?run=<id>.

    Args:
        run_id: a run id /history lists

    Returns:
        the run's JSON document, as /compare returned it
    """
    return history_view.entry(HISTORY, Session.of(request), run_id.strip()).document


@user_errors
def share(run_id: str, request: gr.Request = None) -> SharedLink:
    """Shares a run this client may see: a read-only copy that anyone with its token can open (/shared, or the page
    at ?shared=<token>), without the text of an uploaded dataset, until this client revokes it (/unshare).

    Args:
        run_id: a run id /history lists

    Returns:
        token (192 random bits, URL-safe), query ("?shared=<token>", to append to the page's address), run_id
    """
    return takehome.share(HISTORY, SHARES, Session.of(request), run_id)


@user_errors
def shared_run(token: str) -> RunDocument:
    """The read-only copy a shared link opens.

    Args:
        token: the token /share returned

    Returns:
        the run's JSON document, without the text of an uploaded dataset's examples
    """
    return takehome.shared_document(SHARES, token)


@user_errors
def unshare(token: str, request: gr.Request = None) -> bool:
    """Revokes a shared link this client made: it opens nothing from then on.

    Args:
        token: the token /share returned

    Returns:
        true once revoked
    """
    takehome.revoke(SHARES, Session.of(request), token)
    return True


# ---- The page ------------------------------------------------------------------------------------------------------


def build_demo(defaults: RunConfig = DEFAULTS) -> tuple[gr.Blocks, SimpleNamespace]:
    """The page and its components (`UI`: what the handlers write to), its inputs one per setting `defaults`'
    dataclass declares for the page, its /compare and /preview parameters one per setting declared for the API."""
    # delete_cache: Gradio sweeps the files it holds for this app (uploads nobody ran, served copies of downloads).
    with gr.Blocks(title="Packing Lab", delete_cache=uploads.sweep_schedule(), fill_width=True) as demo:
        gr.Markdown(layout.INTRO)
        ui = SimpleNamespace(bar=layout.action_bar())
        with gr.Row(equal_height=False, elem_id="main-row"):
            with gr.Column(scale=1, min_width=320, elem_id="settings"):
                ui.settings = layout.settings_column(LIMITS, defaults)
                ui.upload = ui.settings.extras["upload"]
            with gr.Column(scale=3, elem_id="views"):
                ui.views = layout.views_column()
        # What each section shows (serving.provenance), and the screen the figures are drawn for (set by WITH_SCREEN).
        ui.shown_preview, ui.shown_run = gr.State(None), gr.State(provenance.NO_RUN)
        ui.screen = gr.JSON(visible=False)
        planner_page.build_planner_section(demo, ui.screen)
        _wire(demo, ui)
        for endpoint, name, returns, options in (
                (compare, "compare", "document", dict(concurrency_id="training")),
                (preview, "preview", "numbers", dict(concurrency_id="preview", concurrency_limit=4))):
            documented_api(demo, settings_endpoint(endpoint, defaults, DATASET_FILE), name, returns, **options)
        documented_api(demo, saved_runs, "history", "runs", concurrency_id="history", concurrency_limit=4)
        documented_api(demo, delete_runs, "delete_runs", "deleted", concurrency_id="history", concurrency_limit=4)
        for endpoint, name, returns in ((saved_run, "run", "document"), (share, "share", "link"),
                                        (shared_run, "shared", "document"), (unshare, "unshare", "revoked")):
            documented_api(demo, endpoint, name, returns, concurrency_id="history", concurrency_limit=4)
    # One training job at a time: every training event shares the "training" group under this default limit.
    demo.queue(default_concurrency_limit=1)
    return demo, ui


def _wire(demo: gr.Blocks, ui: SimpleNamespace) -> None:
    bar, form, shown = ui.bar, ui.settings, ui.views
    # The page's settings by name (one widget per declared setting) and the upload box; the screen last, where
    # WITH_SCREEN puts it.
    page_inputs = {**form.widgets, "upload": ui.upload}
    result_outputs = views.result_outputs(shown)
    preview_outputs = [*views.preview_outputs(shown), *views.forecast_outputs(bar)]
    # Previews are cheap (no model runs) and must not wait behind a training job, so they get their own group.
    # (every event in a concurrency group needs the group's limit: the lowest one given wins)
    in_preview_group = dict(concurrency_id="preview", concurrency_limit=4, api_visibility="private")
    # Bookkeeping that waits for nothing. Queued all the same: a State that an unqueued event sets fires no `change`.
    instant = dict(concurrency_limit=None, show_progress="hidden", api_visibility="private")
    preview_options = dict(fn=show_preview, js=page.WITH_SCREEN, outputs=[*preview_outputs, ui.shown_preview],
                           inputs_kwargs={**page_inputs, "shown": ui.shown_preview, "screen": ui.screen},
                           trigger_mode="always_last", show_progress="minimal", **in_preview_group)
    # Only what a person does triggers a preview (`input`, Enter, leaving a box, a chip, an upload), never a value a
    # handler writes (a history click fills every input at once; that run's batch is drawn by the click itself).
    previews = gr.on([demo.load, *form.edits(), ui.upload.upload, ui.upload.clear], **preview_options)
    previews.failure(preview_failed, inputs_kwargs={**page_inputs, "shown": ui.shown_preview},
                     outputs=ui.shown_preview, **instant)
    for name, chips in form.chips.items():
        for choice, chip in chips.items():
            chip.click(None, js=f"() => {json.dumps(choice)}", outputs=form.widgets[name]).then(**preview_options)
    gr.on([ui.shown_preview.change, ui.shown_run.change], provenance.lines, inputs=[ui.shown_preview, ui.shown_run],
          outputs=[shown.batch_source, shown.results_source], queue=False, show_progress="hidden",
          api_visibility="private")
    demo.load(history_table, outputs=shown.history, api_visibility="private")  # every load: survives restarts

    # Run asks first when the preview warns (a long run, or one its memory would have refused): its click and the
    # answers are the browser's own (page.ASK_OR_RUN); the run starts from the hidden start button they click.
    bar.run_button.click(None, js=page.ASK_OR_RUN)
    bar.run_anyway.click(None, js=page.RUN_ANYWAY)
    bar.cancel.click(None, js=page.CANCEL_RUN)
    # A phone shows the settings first: the start takes the visitor to the headline, where the results will appear.
    training = bar.start.click(begin_run, js=page.TO_HEADLINE, **instant,
                                    outputs=[bar.run_button, bar.status, shown.summary, *result_outputs, ui.shown_run])
    run = training.then(run_page, inputs_kwargs={**page_inputs, "screen": ui.screen}, js=page.WITH_SCREEN,
                        api_visibility="private", concurrency_id="training", show_progress_on=[bar.progress],
                        outputs=[bar.status, shown.summary, *preview_outputs, *result_outputs, ui.shown_preview,
                                 ui.shown_run, shown.history, ui.upload])
    # Gradio 6.31's page follows a failed event with its `.failure` listeners only (not `.then`, whatever its docs
    # say), so each ending gives Run back on its own.
    run.success(end_run, outputs=bar.run_button, **instant)
    run.failure(run_failed, inputs=ui.shown_run, outputs=[bar.run_button, bar.status, ui.shown_run], **instant)
    bar.stop_button.click(request_stop, outputs=bar.status, api_visibility="private", concurrency_limit=None,
                          concurrency_id="stop")
    shown.history.select(show_history_run, inputs_kwargs={"screen": ui.screen}, js=page.WITH_SCREEN,
                         **in_preview_group,
                         outputs=[shown.summary, *form.widgets.values(), ui.upload, *preview_outputs,
                                  ui.shown_preview, ui.shown_run, *result_outputs])
    shown.delete_button.click(delete_my_runs, outputs=[bar.status, shown.history], api_visibility="private",
                              concurrency_id="history", concurrency_limit=4)
    _wire_takehome(demo, ui)
    demo.unload(forget_session)


def _wire_takehome(demo: gr.Blocks, ui: SimpleNamespace) -> None:
    """A run's link opens it on load; the report, Share and Revoke act on the run the section shows."""
    home, in_history_group = ui.views.takehome, dict(concurrency_id="history", concurrency_limit=4,
                                                     api_visibility="private")
    demo.load(open_link, inputs_kwargs={"screen": ui.screen}, js=page.WITH_SCREEN, **in_history_group,
              outputs=[ui.views.summary, ui.views.details, *views.result_outputs(ui.views), ui.shown_run])
    home.shown.change(None, inputs=home.shown, js=takehome.FOLLOW_RUN, queue=False, api_visibility="private")
    home.report_button.click(download_report, inputs=[home.shown, home.include_examples],
                             outputs=[home.report_html, home.report_zip], concurrency_id="report",
                             concurrency_limit=2, api_visibility="private")
    home.share_button.click(share_shown, inputs=home.shown, outputs=[home.link, home.shown, home.revoke_button,
                                                                      ui.bar.status], **in_history_group)
    home.revoke_button.click(revoke_shown, inputs=home.shown, outputs=[home.link, home.shown, home.revoke_button,
                                                                        ui.bar.status], **in_history_group)


demo, UI = build_demo()


def launch(**overrides):
    """Starts the server on the offline defaults; tests pass `prevent_thread_lock=True` and a free port."""
    port = os.environ.get("GRADIO_SERVER_PORT")
    options = dict(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   server_port=int(port) if port else None, share=False, show_error=False,
                   max_file_size=LIMITS.max_upload_bytes, theme=page.THEME, css_paths=[page.CSS_PATH], js=page.JS)
    demo_core.initialize_profiler()  # the time anatomy profiles in worker threads: kineto must start in this one
    return demo.launch(**{**options, **overrides})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    demo_core.freeze_start_up_objects()  # the modules and the page live as long as the server: no run's gc walks them
    planner_page.warm_up_in_background()
    launch()
