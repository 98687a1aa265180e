"""A visitor's uploaded data stays theirs: two `gradio_client` clients on one server, as two visitors of a Space.

A uploads a private .jsonl and runs; B must not see A's file name, its server path or its content anywhere B can
reach (the history, documents, downloads, the file route), while A still sees and redraws its run; the uploaded file
is gone from the server once the run ends. Runs are tiny (16 samples, 2 steps, batch 4).
"""

import hashlib
import json
import logging
import types
import uuid
from pathlib import Path

import gradio as gr
import httpx
import pytest
from gradio_client import Client, handle_file

import demo_core
from serving import inputs, uploads
from serving.errors import as_ui_error

TINY = dict(samples=16, steps=2, batch_size=4, collators="padded,flatten")
SECRET = "private-customer-record-4711"


def private_file(folder: Path, name: str) -> Path:
    """A file whose content no other test or earlier run on this machine has uploaded (Gradio's upload folder keys
    files by content, and a refused upload stays there until the cache sweep)."""
    path, marker = folder / name, uuid.uuid4().hex
    path.write_text("\n".join(json.dumps({"text": f"{SECRET} {marker} {i} " + "word " * (5 + i % 9)})
                              for i in range(24)))
    return path


def files_holding(content: bytes) -> list[Path]:
    """Every file under Gradio's upload folder with exactly this content."""
    digest = hashlib.sha256(content).hexdigest()
    return [path for path in uploads.upload_folder().rglob("*")
            if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest]


def test_a_visitors_upload_is_theirs_alone_and_leaves_the_server_after_the_run(lab_app, tmp_path):
    source = private_file(tmp_path, "acme-payroll.jsonl")
    a, b = (Client(lab_app.demo.local_url, verbose=False) for _ in range(2))
    uploaded_before = set(lab_app.demo.upload_file_set)
    document = a.predict(**TINY, dataset_file=handle_file(str(source)), api_name="/compare")
    (upload_path,) = set(lab_app.demo.upload_file_set) - uploaded_before  # where Gradio kept A's file
    folder = str(uploads.upload_folder())

    # A's document names the file and its fingerprint, never where the server kept it.
    text = json.dumps(document)
    assert folder not in text and str(Path(upload_path).parent) not in text
    assert document["config"]["dataset"] == "acme-payroll.jsonl" == document["dataset_stats"]["name"]
    assert document["dataset_stats"]["file"] == {"name": "acme-payroll.jsonl", "size_bytes": source.stat().st_size,
                                                 "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}
    # The run ended: the file is gone from disk, and the route that served it serves nothing.
    assert not Path(upload_path).exists() and not files_holding(source.read_bytes())
    assert httpx.get(f"{lab_app.demo.local_url}gradio_api/file={upload_path}").status_code == 403
    probe = httpx.post(f"{lab_app.demo.local_url}gradio_api/upload", files={"files": ("probe.jsonl", b"{}")}).json()[0]
    assert httpx.get(f"{lab_app.demo.local_url}gradio_api/file={probe}").status_code == 200  # (it would have)

    # B: the history has neither the run nor the name; A's path gets B nothing, by either parameter.
    a_runs, b_runs = a.predict(api_name="/history"), b.predict(api_name="/history")
    mine = next(run for run in a_runs if run["run_id"] == lab_app.HISTORY.entries()[-1].run_id)
    assert (mine["dataset"], mine["private"], mine["yours"]) == ("acme-payroll.jsonl", True, True)
    b_text = json.dumps(b_runs)
    assert mine["run_id"] not in b_text and "acme-payroll" not in b_text and folder not in b_text
    with pytest.raises(Exception, match="outside the folders this app may read"):
        b.predict(samples=16, dataset=upload_path, api_name="/preview")
    raw = httpx.post(f"{lab_app.demo.local_url}gradio_api/call/preview",
                     json={"data": ["tiny-llama", "flan-like", 16, "padded", 2, 4, "auto", 0, 1024, "auto", "adamw",
                                    {"path": upload_path, "meta": {"_type": "gradio.FileData"}}]})
    answer = httpx.get(f"{lab_app.demo.local_url}gradio_api/call/preview/{raw.json()['event_id']}", timeout=60).text
    assert SECRET not in answer and "labels" not in answer

    # A redraws its run (results, downloads); B, naming A's run id, is told there is no such run.
    a_request, b_request = (types.SimpleNamespace(session_hash=client.session_hash) for client in (a, b))
    shown = lab_app.show_history_run(types.SimpleNamespace(row_value=[mine["run_id"]]), a_request)
    summary, json_path = shown[lab_app.UI.views.summary], shown[lab_app.UI.views.json_file]
    assert mine["run_id"] in summary and folder not in Path(json_path).read_text()
    with pytest.raises(gr.Error, match="no longer in the history"):
        lab_app.show_history_run(types.SimpleNamespace(row_value=[mine["run_id"]]), b_request)
    assert "acme-payroll" not in json.dumps(lab_app.history_table(b_request))

    # Only A may delete it; then it is gone for A too.
    with pytest.raises(Exception, match="is not one of yours"):
        b.predict(run_ids=mine["run_id"], api_name="/delete_runs")
    assert a.predict(run_ids=mine["run_id"], api_name="/delete_runs") == [mine["run_id"]]
    assert mine["run_id"] not in json.dumps(a.predict(api_name="/history"))
    assert all(entry.run_id != mine["run_id"] for entry in lab_app.HISTORY.entries())


def test_built_in_runs_stay_shared_between_visitors(lab_app):
    a, b = (Client(lab_app.demo.local_url, verbose=False) for _ in range(2))
    a.predict(**TINY, seed=11, api_name="/compare")
    run_id = lab_app.HISTORY.entries()[-1].run_id
    seen_by_b = {run["run_id"]: run for run in b.predict(api_name="/history")}
    assert (seen_by_b[run_id]["private"], seen_by_b[run_id]["yours"]) == (False, False)
    with pytest.raises(Exception, match="is not one of yours"):
        b.predict(run_ids=run_id, api_name="/delete_runs")


def test_the_page_empties_the_upload_box_and_a_closed_tab_takes_its_private_runs_along(lab_app, tmp_path):
    # The page's upload box hands the handler a path in Gradio's upload folder, as an upload does.
    folder = uploads.upload_folder() / f"test-{uuid.uuid4().hex}"  # a fresh folder, as every upload gets
    folder.mkdir(parents=True)
    upload = private_file(folder, "notes.jsonl")
    owner, other = types.SimpleNamespace(session_hash="tab-owner"), types.SimpleNamespace(session_hash="tab-other")
    *_, final = lab_app.run_page(owner, upload=str(upload), samples=16, steps=2, batch_size=4)
    ui = lab_app.UI
    status, rows, upload_box = final[ui.bar.status], final[ui.views.history], final[ui.upload]
    assert upload_box is None and not upload.exists() and "notes.jsonl was deleted from the server" in status
    run_id = lab_app.HISTORY.entries()[-1].run_id
    assert rows[0][0] == run_id and "(private to this tab)" in json.dumps(rows[0])
    assert run_id not in json.dumps(lab_app.history_table(other))
    with pytest.raises(gr.Error, match="no longer on the server"):  # the box still showing it after an error
        next(lab_app.show_preview(upload=str(upload), samples=16, collators=["padded"], steps=2, batch_size=4))
    lab_app.forget_session(owner)  # Gradio's unload: the tab closed
    assert all(entry.run_id != run_id for entry in lab_app.HISTORY.entries())


def test_an_unexpected_error_naming_an_upload_is_logged_without_its_path(caplog):
    path = uploads.upload_folder() / "0a1b2c3d" / "acme-payroll.jsonl"
    with caplog.at_level(logging.ERROR, logger="packing_lab.app"):
        try:
            raise OSError(13, "Permission denied", str(path))
        except OSError as error:
            message = str(as_ui_error(error))
    assert str(uploads.upload_folder()) not in caplog.text and "<upload>/acme-payroll.jsonl" in caplog.text
    assert "acme-payroll" not in message and "PermissionError" in message  # the visitor sees the type only


def test_a_file_over_the_upload_cap_gets_the_pages_message_through_the_api(lab_app, tmp_path, monkeypatch):
    monkeypatch.setattr(lab_app, "LIMITS", demo_core.Limits(max_upload_bytes=200))  # the engine's cap, read per call
    source = private_file(tmp_path, "big.jsonl")
    with pytest.raises(Exception, match=r"dataset file 'big.jsonl' is 0.0 MB; the limit is 0.0 MB"):
        Client(lab_app.demo.local_url, verbose=False).predict(**TINY, dataset_file=handle_file(str(source)),
                                                              api_name="/preview")


def test_the_upload_folder_is_never_readable_by_name_even_under_an_allowed_root(tmp_path, monkeypatch):
    folder = uploads.upload_folder()
    folder.mkdir(parents=True, exist_ok=True)
    visitor_a = private_file(folder, f"{uuid.uuid4().hex}.jsonl")  # where Gradio keeps an upload
    try:
        # An operator's roots that happen to contain Gradio's folder (a data dir under /tmp, say).
        monkeypatch.setenv(inputs.ALLOWED_ROOTS_ENV, str(folder.parent))
        with pytest.raises(demo_core.DemoInputError, match="outside the folders this app may read"):
            inputs.check_local_path(str(visitor_a), "dataset", (".json", ".jsonl"))
        inputs.check_local_path(str(private_file(tmp_path, "mine.jsonl")), "dataset")  # the root itself still reads
    finally:
        visitor_a.unlink()


def test_a_saved_runs_local_paths_are_held_to_todays_allowed_roots(tmp_path, monkeypatch):
    data = private_file(tmp_path, "then-allowed.jsonl")
    saved = {"config": {**demo_core.RunConfig(dataset=str(data)).to_dict(), "resolved_attention": "varlen"}}
    monkeypatch.setenv(inputs.ALLOWED_ROOTS_ENV, str(tmp_path))
    assert inputs.config_from_document(saved).dataset == str(data)
    monkeypatch.setenv(inputs.ALLOWED_ROOTS_ENV, str(tmp_path / "elsewhere"))  # the operator narrowed them since
    with pytest.raises(demo_core.DemoInputError, match="outside the folders this app may read"):
        inputs.config_from_document(saved)
