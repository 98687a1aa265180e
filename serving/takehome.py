"""What a visitor takes home from a run, under its results on the page: each collator's script (a `gr.Code` with
copy and download buttons), the report (one HTML file that opens offline, and the same as Markdown with its PNGs in
a zip), and links (the run's own URL, `?run=<id>`; "Share" for a read-only copy anyone with its link can open,
`?shared=<token>`, and its revocation). Components and views here; app.py wires their events.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import gradio as gr

from demo_core import COLLATORS, DemoInputError
from presentation import run_report
from serving import history_view
from serving.downloads import DOWNLOAD_DIR
from serving.history import RunHistory
from serving.sessions import Session
from serving.sharing import RUN_PARAMETER, SHARED_PARAMETER, SharedRuns

CODE_INTRO = ("Each collator's burst as the script a fine-tuner writes (transformers' `Trainer`, TRL's `SFTTrainer`, "
              "peft's `LoraConfig`): the diff between two of them is the change to make. "
              "`python -m demo_core compare ... --emit-code DIR` writes them with the initial weights and the data "
              "they read; each prints its per-step losses, the burst's.")
NO_CODE = "*This run was saved before runs carried their code.*"
REVOKED = "this shared link was revoked, or never existed"
NO_RUN = "no run is shown: run one, or pick one in the history"
# The page's URL follows the run it shows (`?run=<id>`), or keeps the shared link it was opened with.
FOLLOW_RUN = """(link) => {
  if (link && link.run_id && !link.token) history.replaceState(null, "", "?run=" + encodeURIComponent(link.run_id));
  return [];
}"""


def takehome_section() -> SimpleNamespace:
    """The section's components, hidden parts shown once a run is."""
    ui = SimpleNamespace()
    gr.Markdown("## Take it home: the run as code, a report, a link")
    ui.code_intro = gr.Markdown(CODE_INTRO, elem_id="code-intro")
    ui.codes = {name: gr.Code(language="python", label=f"train_{name}.py", interactive=False, visible=False,
                              elem_id=f"code-{name}", max_lines=24, buttons=["copy", "download"],
                              wrap_lines=True)  # a phone's column wraps a line instead of hiding it sideways
                for name in COLLATORS}
    with gr.Row(equal_height=True):
        ui.include_examples = gr.Checkbox(False, label="Include the examples' text (of an uploaded dataset)",
                                          elem_id="include-examples", scale=2)
        ui.report_button = gr.Button("Download report", elem_id="report-button", scale=1)
    with gr.Row():
        ui.report_html = gr.File(label="Report (HTML, opens offline)", interactive=False, min_width=240)
        ui.report_zip = gr.File(label="Report as Markdown with its figures (zip)", interactive=False, min_width=240)
    with gr.Row(equal_height=True):
        ui.share_button = gr.Button("Share", elem_id="share-button", scale=0)
        ui.revoke_button = gr.Button("Revoke the shared link", elem_id="revoke-button", scale=0, visible=False)
        ui.link = gr.Textbox(label="Link to this run", interactive=False, buttons=["copy"], elem_id="run-link",
                             scale=3)
    # What the section shows: {"run_id", "token" (a shared copy's), "shared" (the token this tab made)} or None.
    ui.shown = gr.State(None)
    return ui


def code_views(ui, document: dict) -> dict:
    """Each of the run's collators' scripts, the others hidden."""
    code = {result["collator"]: result.get("code") for result in document.get("results", [])}
    views = {component: gr.Code(value=code.get(name), visible=bool(code.get(name)))
             for name, component in ui.codes.items()}
    return {**views, ui.code_intro: CODE_INTRO if any(code.values()) else NO_CODE}


def shown_views(ui, request: gr.Request | None, run_id: str, token: str | None = None) -> dict:
    """The section for one run: its link, no report yet, Share for a run of the history (a shared copy is not
    shared again)."""
    link = link_of(request, f"?{SHARED_PARAMETER}={token}" if token else f"?{RUN_PARAMETER}={run_id}")
    return {ui.shown: {"run_id": run_id, "token": token, "shared": None}, ui.link: link,
            ui.report_html: None, ui.report_zip: None, ui.share_button: gr.Button(visible=token is None),
            ui.revoke_button: gr.Button(visible=False)}


def no_views(ui) -> dict:
    return {**{component: gr.Code(value=None, visible=False) for component in ui.codes.values()},
            ui.code_intro: CODE_INTRO, ui.shown: None, ui.link: "", ui.report_html: None, ui.report_zip: None,
            ui.share_button: gr.Button(visible=True), ui.revoke_button: gr.Button(visible=False)}


def outputs(ui) -> list:
    """What showing or clearing a run writes here."""
    return [*ui.codes.values(), ui.code_intro, ui.shown, ui.link, ui.report_html, ui.report_zip, ui.share_button,
            ui.revoke_button]


def link_of(request: gr.Request, query: str) -> str:
    """The page's own address with `query`, from the address the page was loaded at (the browser's Referer; an API
    client has none, and gets the query alone)."""
    page = (getattr(request, "headers", None) or {}).get("referer") or ""
    return page.split("?")[0].split("#")[0] + query


def write_report(document: dict, name: str, include_examples: bool) -> tuple[str, str]:
    """(HTML path, zip path) of a run's report, written with its other downloads (deleted with the run), one folder
    per variant: two visitors asking at once write the same bytes."""
    folder = DOWNLOAD_DIR / name / ("report-with-examples" if include_examples else "report")
    folder.mkdir(parents=True, exist_ok=True)
    html_path, zip_path = folder / f"packing-lab-{name}.html", folder / f"packing-lab-{name}-markdown.zip"
    title = f"Packing Lab run {name}"
    page, archive = run_report.report_files(document, include_examples, title)
    html_path.write_text(page)
    zip_path.write_bytes(archive)
    return str(html_path), str(zip_path)


# ---- what the handlers read -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LinkedRun:
    """The run a page's link opens."""

    document: dict
    run_id: str
    name: str  # its downloads' name
    saved_at: str
    status: str  # what the headline says of it
    token: str | None  # a shared copy's


def linked_run(history: RunHistory, shares: SharedRuns, request: gr.Request | None) -> LinkedRun | None:
    """`?run=<id>`: a run this visitor may see, as the history lists them (another visitor's private run is no run
    at all); `?shared=<token>`: a shared copy while its link lives; None for a page opened without either."""
    query = dict(getattr(request, "query_params", None) or {})
    token, run_id = query.get(SHARED_PARAMETER), query.get(RUN_PARAMETER)
    if token:
        shared = shares.open(token)
        if shared is None:
            raise DemoInputError(REVOKED)
        return LinkedRun(shared.document, shared.run_id, f"{shared.run_id}-shared", shared.shared_at,
                         f"*Run {shared.run_id}, shared with you: a read-only copy*", token)
    if run_id:
        entry = history_view.entry(history, Session.of(request), run_id)
        return LinkedRun(entry.document, entry.run_id, entry.run_id, entry.saved_at,
                         f"*Run {entry.run_id}, from its link*", None)
    return None


def shown_document(history: RunHistory, shares: SharedRuns, session: Session, shown: dict | None
                   ) -> tuple[dict, str, bool]:
    """(document, download name, whether its examples are an uploaded dataset's) of the run the section shows: a
    run this session may see, or a shared copy while its link lives."""
    if not shown:
        raise DemoInputError(NO_RUN)
    if shown.get("token"):
        shared = shares.open(shown["token"])
        if shared is None:
            raise DemoInputError(REVOKED)
        return shared.document, f"{shared.run_id}-shared", shared.private
    entry = history_view.entry(history, session, shown["run_id"])
    return entry.document, entry.run_id, entry.private


def share(history: RunHistory, shares: SharedRuns, session: Session, run_id: str) -> dict:
    """A shared copy of a run `session` may see: {"token", "query", "run_id"} (the /share endpoint's answer)."""
    if not run_id.strip():
        raise DemoInputError(NO_RUN)
    entry = history_view.entry(history, session, run_id.strip())
    token = shares.share(entry, session.key)
    return {"token": token, "query": f"?{SHARED_PARAMETER}={token}", "run_id": entry.run_id}


def revoke(shares: SharedRuns, session: Session, token: str) -> None:
    if not shares.revoke(token.strip(), session.key):
        raise DemoInputError("no shared link of yours has that token: only the browser tab or API client that "
                             "shared a run can revoke its link")


def shared_document(shares: SharedRuns, token: str) -> dict:
    found = shares.open(token.strip())
    if found is None:
        raise DemoInputError(REVOKED)
    return found.document


# ---- the section's answers to its buttons ----------------------------------------------------------------------

def report_views(ui, history: RunHistory, shares: SharedRuns, session: Session, shown: dict | None,
                 include_examples: bool) -> dict:
    """The report of the run shown, as HTML and as Markdown in a zip; an uploaded dataset's text only if asked."""
    document, name, uploaded = shown_document(history, shares, session, shown)
    html_path, zip_path = write_report(document, name, include_examples or not uploaded)
    return {ui.report_html: html_path, ui.report_zip: zip_path}


def shared_views(ui, request: gr.Request, shown: dict, link: dict) -> dict:
    return {ui.link: link_of(request, link["query"]), ui.shown: {**shown, "shared": link["token"]},
            ui.revoke_button: gr.Button(visible=True)}


def revoked_views(ui, request: gr.Request, shown: dict) -> dict:
    return {ui.link: link_of(request, f"?{RUN_PARAMETER}={shown['run_id']}"), ui.shown: {**shown, "shared": None},
            ui.revoke_button: gr.Button(visible=False)}
