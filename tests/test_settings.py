"""Settings are declared once (demo_core/settings.py): a new run setting is one field on RunConfig, and it reaches
the CLI (its flag and help), the page (a widget among the inputs the handlers read), the API (a described parameter
after today's), the provenance line, the resolved configuration every burst trains from, the memory plan of the run
when the planner takes it too, and the history's speed key when it changes speed, as test_registry.py shows for a new
collator."""

import dataclasses
import socket

import gradio as gr
import pytest
from gradio_client import Client

import demo_core
from commandline import main as cli
from demo_core import RunConfig
from demo_core.memory.plan_request import PlanRequest
from demo_core.settings import (
    Declaration,
    Widget,
    api_settings,
    capped_defaults,
    declared,
    page_settings,
    setting,
    shared_names,
)
from demo_core.training import duration, trainers
from serving import provenance

HELP = "steps of linear learning-rate warm-up before the timed steps"
# The one declaration: a field like any of RunConfig's, with the next free API position and page place.
NEXT_API = max(item.api for item in api_settings(RunConfig)) + 1
NEXT_PAGE = max(item.page.order for item in page_settings(RunConfig)) + 1
NEW = ("warmup_steps", int, setting(0, minimum=0, api=NEXT_API, page=Widget(NEXT_PAGE, more=True), help=HELP))


@pytest.fixture
def config_with_a_new_setting(monkeypatch):
    """RunConfig with one more declared field, where the CLI and the provenance line look RunConfig up (the page and
    the API are built from the defaults they are given)."""
    extended = dataclasses.make_dataclass("RunConfig", [NEW], bases=(RunConfig,), frozen=True)
    for module in (cli, provenance):
        monkeypatch.setattr(module, "RunConfig", extended)
    return extended


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_new_setting_reaches_the_cli_with_its_help_and_its_validation(config_with_a_new_setting, capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["compare", "--warmup-steps", "3"])
    assert cli.from_arguments(config_with_a_new_setting, args).validated().warmup_steps == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["compare", "--help"])
    assert f"--warmup-steps WARMUP_STEPS {HELP}" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["compare", "--warmup-steps", "-1"]) == 2  # the declared minimum, before anything loads
    assert capsys.readouterr().err.strip() == "error: warmup steps must be at least 0, got -1"


def test_a_new_setting_reaches_the_page_the_api_and_the_provenance_line(config_with_a_new_setting):
    import app

    defaults = capped_defaults(config_with_a_new_setting, app.LIMITS)
    demo, ui = app.build_demo(defaults)
    widget = ui.settings.widgets["warmup_steps"]
    assert isinstance(widget, gr.Number) and widget.label == "Warmup steps" and widget.info == HELP
    # Among the inputs of the events that read the settings: the preview, the Run click; and a history click writes it.
    events = {fn.name: fn for fn in demo.fns.values()}
    for name in ("show_preview", "run_page"):
        assert widget in events[name].inputs, name
    assert widget in events["show_history_run"].outputs

    demo.launch(prevent_thread_lock=True, server_port=_free_port(), quiet=True)
    try:
        endpoints = Client(demo.local_url, verbose=False).view_api(return_format="dict", print_info=False)
    finally:
        demo.close()
    for name in ("/compare", "/preview"):
        parameters = endpoints["named_endpoints"][name]["parameters"]
        names = [p["parameter_name"] for p in parameters]
        assert names[11] == "dataset_file" and names[-1] == "warmup_steps"  # after every earlier parameter
        new = parameters[-1]
        assert (new["python_type"], new["parameter_default"]) == ({"type": "int", "description": HELP}, 0)

    run = provenance.settings_of({**RunConfig().to_dict()})  # a run saved before the setting existed: its default
    picture = provenance.settings_of({**RunConfig().to_dict(), "warmup_steps": 3})
    assert provenance.describe(picture).endswith("warmup steps 3")
    assert provenance.differences(picture, run) == ["warmup steps 0 there, 3 here"]


@pytest.mark.parametrize("cls, taken", [(RunConfig, {11}), (PlanRequest, set())])
def test_every_field_is_declared_and_api_positions_leave_no_gap(cls, taken):
    assert all(item.help for item in declared(cls))  # declared() refuses a plain field
    # /compare and /preview: 11 is the dataset file; a new setting takes the next free position, never a used one.
    positions = sorted([item.api for item in api_settings(cls)] + list(taken))
    assert positions == list(range(len(positions)))
    assert len({item.page.order for item in page_settings(cls)}) == len(page_settings(cls))


def test_plan_keeps_its_documented_parameter_order():
    assert [item.name for item in api_settings(PlanRequest)][:13] == [
        "model", "batch_size", "seq_length", "dataset", "packed", "precision", "optimizer", "lora_rank", "qlora",
        "gradient_checkpointing", "gpus", "shard", "gpu_gb"]  # README's /plan


def test_defaults_are_lowered_to_the_caps_and_stay_valid():
    limits = demo_core.Limits(max_samples=64, max_steps=5, max_batch_size=4, max_length=128)
    defaults = capped_defaults(RunConfig, limits)
    assert (defaults.samples, defaults.steps, defaults.batch_size, defaults.max_length) == (64, 5, 4, 128)
    assert defaults.validated(limits) == defaults.validated(limits).validated(limits)


def test_a_new_setting_a_plan_shares_reaches_the_trainer_the_plan_and_the_speed_key(monkeypatch):
    shared = Declaration(0, minimum=0, speed=True, help=HELP)  # declared once, placed by both
    run_class = dataclasses.make_dataclass("RunConfig", [("warmup_steps", int, shared.placed(api=NEXT_API))],
                                           bases=(RunConfig,), frozen=True)
    plan_class = dataclasses.make_dataclass("PlanRequest", [("warmup_steps", int, shared.placed())],
                                            bases=(PlanRequest,), frozen=True)
    assert "warmup_steps" in shared_names(run_class, plan_class)
    seen = []
    real_arguments = trainers.training_arguments

    def arguments_seeing_the_run(run, *args, **kwargs):
        seen.append(run)
        return real_arguments(run, *args, **kwargs)

    monkeypatch.setattr(trainers, "training_arguments", arguments_seeing_the_run)
    prepared = demo_core.prepare(run_class(samples=8, steps=2, batch_size=4, warmup_steps=3))
    demo_core.run_comparison(prepared)
    assert [run.warmup_steps for run in seen] == [3, 3]  # what each collator's Trainer was built from
    assert plan_class.for_run(prepared.resolved, loss="full").validated().warmup_steps == 3

    monkeypatch.setattr(duration, "RunConfig", run_class)
    other = demo_core.prepare(run_class(samples=8, steps=2, batch_size=4, warmup_steps=0))
    assert duration.speed_key(prepared.document_config()) != duration.speed_key(other.document_config())
    assert duration.speed_key(other.document_config()) == duration.speed_key(
        {key: value for key, value in other.document_config().items() if key != "warmup_steps"})  # its default
