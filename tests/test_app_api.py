"""The app's API through `gradio_client` against a launched server, plus the run history store and Stop.

The comparison is kept small (128 samples, 10 steps) so the file runs in well under a minute on 2 cores; the
numbers it checks do not depend on size: padding-free packing has no padding, trains to the same losses as padding,
and on FLAN-like lengths is faster.
"""

import json
import types

import pytest
from gradio_client import Client

import demo_core
from presentation import report
from serving import provenance
from serving.api_docs import PreviewDocument, RunDocument, RunSummary
from serving.history import RunHistory

SMALL_RUN = dict(samples=128, steps=10, batch_size=8)


@pytest.fixture(scope="module")
def client(lab_app):
    return Client(lab_app.demo.local_url, verbose=False)


def test_api_exposes_compare_preview_history_runs_links_and_plan_only(client):
    endpoints = client.view_api(return_format="dict", print_info=False)
    assert set(endpoints["named_endpoints"]) == {"/compare", "/preview", "/history", "/run", "/delete_runs",
                                                 "/share", "/shared", "/unshare", "/plan"}
    assert not endpoints["unnamed_endpoints"]
    for name in ("/compare", "/preview"):
        parameters = endpoints["named_endpoints"][name]["parameters"]
        # Today's twelve keep their order (positional calls keep working); new ones come after, with defaults.
        assert [p["parameter_name"] for p in parameters][:12] == [
            "model", "dataset", "samples", "collators", "steps", "batch_size", "attention", "seed", "max_length",
            "precision", "optimizer", "dataset_file"]
        assert all(p["parameter_has_default"] for p in parameters)
        assert parameters[11]["python_type"]["type"] == "None | filepath"  # a file, sent with handle_file
    assert not endpoints["named_endpoints"]["/history"]["parameters"]
    assert [p["parameter_name"] for p in endpoints["named_endpoints"]["/delete_runs"]["parameters"]] == ["run_ids"]
    for name, parameter in (("/run", "run_id"), ("/share", "run_id"), ("/shared", "token"), ("/unshare", "token")):
        assert [p["parameter_name"] for p in endpoints["named_endpoints"][name]["parameters"]] == [parameter]


def test_the_api_page_names_types_and_describes_every_parameter_and_return(client):
    endpoints = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    for endpoint in endpoints.values():
        for parameter in endpoint["parameters"]:
            # Gradio's own default is the position ("1st") and an empty description.
            assert parameter["label"] == parameter["parameter_name"]
            assert len(parameter["python_type"]["description"]) > 20, parameter
        [returned] = endpoint["returns"]
        assert returned["python_type"]["type"] != "Any" and len(returned["python_type"]["description"]) > 10
    attention = next(p for p in endpoints["/compare"]["parameters"] if p["parameter_name"] == "attention")
    assert attention["python_type"]["type"] == f"Literal[{', '.join(repr(a) for a in demo_core.ATTENTION_NAMES)}]"
    assert endpoints["/compare"]["returns"][0]["python_type"]["type"].startswith("dict(config: dict(str, Any), ")
    assert endpoints["/history"]["returns"][0]["python_type"]["type"].startswith("list[dict(run_id: str, ")
    text = client.view_api(return_format="str", print_info=False)
    assert 'api_name="/compare") -> document' in text and "collators: str" in text and "padded,flatten" in text


def test_positional_calls_of_the_original_nine_arguments_still_work(client):
    numbers = client.predict("tiny-llama", "orcamath-like", 12, "padded,flatten", 2, 4, "auto", 3, 512,
                             api_name="/preview")
    assert (numbers["config"]["dataset"], numbers["config"]["max_length"], numbers["config"]["precision"]) == \
        ("orcamath-like", 512, "auto")
    numbers = client.predict("tiny-llama", "orcamath-like", 12, "padded", 2, 4, "auto", 3, 512, "fp32", "sgd",
                             api_name="/preview")
    assert (numbers["config"]["precision"], numbers["config"]["optimizer"]) == ("fp32", "sgd")
    assert set(numbers) == set(PreviewDocument.__annotations__)  # the type the API page shows is the real one


def test_plan_answers_without_training(client):
    plan = client.predict(model="Qwen2.5-0.5B", batch_size=4, seq_length=1024, dataset="orcamath-like", packed=True,
                          api_name="/plan")
    assert {"per_device", "total_bytes", "peak_moment", "fits", "max_batch_size", "max_seq_length"} <= set(plan)
    assert plan["fits"]["80"] and plan["max_batch_size"] >= 4


def test_compare_with_defaults_gives_sane_numbers(client, lab_app):
    document = client.predict(**SMALL_RUN, api_name="/compare")
    assert {"config", "dataset_stats", "results", "comparison"} <= set(document)
    assert document["config"]["model"] == "tiny-llama" and document["config"]["dataset"] == "flan-like"
    results = {result["collator"]: result for result in document["results"]}
    assert list(results) == ["padded", "flatten"]
    assert results["flatten"]["pad_fraction"] == 0.0
    assert results["padded"]["pad_fraction"] > 0.3  # FLAN-like lengths: most padded slots are padding
    flatten = document["comparison"]["flatten"]
    assert flatten["speedup_vs_padded"] > 1.0, flatten
    assert flatten["max_abs_loss_diff_vs_padded"] <= 1e-4
    assert results["padded"]["losses"] == pytest.approx(results["flatten"]["losses"], abs=1e-4)
    saved = lab_app.HISTORY.entries()[-1]
    assert saved.document["results"] == document["results"]  # every completed run is kept
    assert set(document) == set(RunDocument.__annotations__)  # the type the API page shows is the real one
    assert set(client.predict(api_name="/history")[-1]) == set(RunSummary.__annotations__)


def test_preview_matches_the_engine(client):
    sent = client.predict(samples=64, collators="padded,flatten,bfd", api_name="/preview")
    config = demo_core.RunConfig(samples=64, collators=("padded", "flatten", "bfd"))
    expected = json.loads(json.dumps(demo_core.preview(config, limits=demo_core.Limits.from_env())))
    for document in (sent, expected):  # what a preview measures: how long collating took, the free memory now
        for batch in document["batches"].values():
            batch.pop("collate_s")
        document["memory_guard"].pop("available_bytes")
    assert sent == expected
    assert sent["batches"]["flatten"]["pad_fraction"] == 0.0
    assert sent["cost"]["attention_scores_varlen"] < sent["cost"]["attention_scores_padded"]


@pytest.mark.parametrize("arguments, message", [
    (dict(samples="many"), "samples must be a whole number"),
    (dict(collators="padded,zip"), "unknown collator 'zip'"),
    (dict(dataset="/etc/passwd"), "outside the folders this app may read"),
    (dict(model="/etc"), "outside the folders this app may read"),
])
def test_bad_input_is_one_clear_message_and_the_app_keeps_serving(client, arguments, message):
    with pytest.raises(Exception) as raised:
        client.predict(**arguments, api_name="/preview")
    text = str(raised.value)
    assert message in text
    assert "Traceback" not in text and "root:" not in text  # no stack, no file contents
    assert client.predict(samples=16, api_name="/preview")["dataset_stats"]["count"] == 16


def click_stop_at_the_first_step(lab_app, request):
    """The page's progress callback, clicking Stop (the page's Stop handler) once the first step is reported (the
    progress text counts each collator's steps: "padded 1/200 · flatten 0/200")."""
    clicked = []

    def progress(fraction, desc=""):
        if "1/200" in desc and not clicked:
            clicked.append(desc)
            assert lab_app.request_stop(request) == "Stopping after the current step…"
    return progress


def test_stop_ends_the_run_early_and_saves_it_labelled_partial(lab_app):
    request = types.SimpleNamespace(session_hash="stop-test")
    assert lab_app.request_stop(request) == "Nothing is running in this tab."
    run = lab_app.run_page(request, click_stop_at_the_first_step(lab_app, request), samples=64, steps=200,
                           batch_size=4)
    *updates, final = run  # runs to the end: Stop makes that a few steps, not 2 x 200
    # After the Stop the page's next update is the run's end: no collator's partial views (four figures each) drawn
    # and sent on the way, so that the run ends on the page soon after the Stop (benchmarks/stop_latency.py --page).
    assert len(updates) == 1 and updates[0][lab_app.UI.bar.status].startswith("Training…")
    summary, history_rows = final[lab_app.UI.views.summary], final[lab_app.UI.views.history]
    assert summary.startswith("### Stopped")
    saved = lab_app.HISTORY.entries()[-1].document
    assert saved["partial"] and saved["results"][0]["steps"] < 200 and saved["stop_reason"] == "stop"
    assert history_rows[0][report.HISTORY_HEADERS.index("status")] == "stopped (partial)"


def test_page_progress_counts_every_collators_steps_as_they_take_turns(lab_app):
    calls = []
    run = lab_app.run_page(types.SimpleNamespace(session_hash="progress-test"),
                           lambda fraction, desc=None: calls.append((fraction, desc)), samples=16, steps=3, batch_size=4)
    *_, final = run
    steps_seen = [done for (done, total), desc in calls if total == 6]
    assert steps_seen == sorted(steps_seen) and max(steps_seen) == 6  # never backwards, and to the end
    assert "padded 2/3 · flatten 1/3" in [desc for _, desc in calls]  # interleaved: padded's step 2 before flatten's
    # The anatomy's words, next to its figure.
    assert "Backward / forward time" in final[lab_app.UI.views.anatomy_text]


def test_a_run_click_prepares_its_run_once(lab_app, monkeypatch):
    # Loading the model source and tokenizing the data is a full reload for a hub model: once per click, and the
    # same preparation trains (off ZeroGPU; a ZeroGPU worker prepares its own, see test_zerogpu).
    prepared = []
    real_prepare = demo_core.prepare
    monkeypatch.setattr(demo_core, "prepare", lambda *args, **kwargs: prepared.append(real_prepare(*args, **kwargs))
                        or prepared[-1])
    trained = []
    real_run = demo_core.run_comparison
    monkeypatch.setattr(demo_core, "run_comparison",
                        lambda run, **kwargs: trained.append(run) or real_run(run, **kwargs))
    *_, final = lab_app.run_page(types.SimpleNamespace(session_hash="prepare-once"), lambda *args, **kwargs: None,
                                 samples=16, steps=3, batch_size=4)
    assert final[lab_app.UI.views.summary].startswith("### Done") and len(prepared) == 1 and trained == prepared


def test_stop_while_the_run_is_prepared_ends_it_before_training(lab_app):
    request = types.SimpleNamespace(session_hash="stop-early")
    run = lab_app.run_page(request, lambda *args, **kwargs: None, samples=16, steps=3, batch_size=4)
    next(run)  # the run is prepared and its batch drawn; training has not started
    assert lab_app.request_stop(request) == "Stopping after the current step…"
    *_, final = run
    assert final[lab_app.UI.views.summary] == "### Stopped before the first step"
    assert lab_app.request_stop(request) == "Nothing is running in this tab."


def test_history_survives_a_torn_last_line(tmp_path, caplog):
    history = RunHistory(tmp_path)
    history.append({"run": 1})
    history.append({"run": 2})
    with history.path.open("ab") as handle:  # a crash in the middle of the third write
        handle.write(b'{"run_id": "x", "saved_at": "2026-01-01T00:00:00+00:00", "docu')
    assert [entry.document for entry in history.entries()] == [{"run": 1}, {"run": 2}]
    assert "skipping unreadable line 3" in caplog.text
    history.append({"run": 3})  # starts on a fresh line instead of gluing onto the fragment
    assert [entry.document for entry in history.entries()] == [{"run": 1}, {"run": 2}, {"run": 3}]
    assert RunHistory(tmp_path).get(history.entries()[-1].run_id).document == {"run": 3}  # a new reader (restart)


def test_a_visitors_private_runs_are_listed_to_them_only_and_deleting_keeps_everyone_elses(tmp_path, caplog):
    history = RunHistory(tmp_path)
    private = history.append({"run": 1}, owner="visitor-a", private=True)
    shared = history.append({"run": 2}, owner="visitor-b")
    with history.path.open("ab") as handle:  # a torn line from a crash stays as it was
        handle.write(b'{"run_id": "torn"')
    also_mine = history.append({"run": 3}, owner="visitor-a")
    assert [entry.run_id for entry in history.visible_to("visitor-b")] == [shared.run_id, also_mine.run_id]
    assert [entry.run_id for entry in history.visible_to("visitor-a")] == [private.run_id, shared.run_id,
                                                                          also_mine.run_id]
    assert history.delete("visitor-a", {private.run_id}) == [private.run_id]
    assert history.delete("visitor-a") == [also_mine.run_id]
    assert [entry.document for entry in RunHistory(tmp_path).entries()] == [{"run": 2}]
    assert b'{"run_id": "torn"\n' in history.path.read_bytes()


def test_picking_a_history_row_redraws_that_run_and_puts_its_settings_back_in_the_inputs(lab_app):
    tiny = demo_core.RunConfig(samples=16, steps=2, batch_size=4, seed=5, optimizer="sgd",
                               collators=("padded", "naive-concat"))
    entry = lab_app.HISTORY.append(demo_core.run_comparison(tiny).to_dict())
    shown = lab_app.show_history_run(types.SimpleNamespace(row_value=[entry.run_id]),
                                     types.SimpleNamespace(session_hash="any visitor"))
    ui = lab_app.UI
    # The page's inputs, by setting, and the upload box (emptied).
    assert {name: shown[widget] for name, widget in ui.settings.widgets.items()} == {
        "model": "tiny-llama", "dataset": "flan-like", "samples": 16, "collators": ["padded", "naive-concat"],
        "steps": 2, "batch_size": 4, "attention": "auto", "precision": "auto", "optimizer": "sgd", "seed": 5,
        "max_length": tiny.max_length, "loss_on": "auto", "grad_accum": 1, "lora_rank": 0, "lora_targets": "all-linear",
        "gradient_checkpointing": "auto", "learning_rate": tiny.learning_rate}
    assert shown[ui.upload] is None
    assert shown[ui.views.batch_plot] is not None and "Before training" in shown[ui.views.cost]
    assert "naive-concat" in shown[ui.views.summary]
    assert shown[ui.views.anatomy_plot] is not None and "Backward / forward time" in shown[ui.views.anatomy_text]
    lines = provenance.lines(shown[ui.shown_preview], shown[ui.shown_run])
    assert entry.run_id in lines[1] and "Not the settings" not in lines[0]  # both sections show that run
    assert [row[0] for row in shown[ui.views.results]] == [result["collator"] for result in entry.document["results"]]
    assert json.loads(open(shown[ui.views.json_file]).read())["results"] == entry.document["results"]
