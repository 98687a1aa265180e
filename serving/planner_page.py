"""The "Will it fit, and how fast?" section of the page: the memory planner (demo_core/memory/planner.py) for real
model sizes, with each collator's predicted speed on the chosen GPU (demo_core/throughput/planning.py).

`build_planner_section(demo)` creates the widgets (one per setting `PlanRequest` declares for the page) and their
wiring inside the page's active `gr.Blocks` and registers the `/plan` API endpoint (named, typed and described
parameters derived from the declaration, as the other endpoints). The handlers are plain functions that take the
settings by name: `plan_page` for the widgets, `plan_api` for gradio_client. The summary and the figures are drawn
by presentation/plan_text.py, plan_views.py, speed_text.py and speed_views.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import gradio as gr

from demo_core import (
    BUILTIN_DATASETS,
    EQUAL_LENGTHS,
    DemoInputError,
    DeviceEstimate,
    Plan,
    PlanRequest,
    device_estimate,
    planned,
    shipped_configs,
)
from demo_core.memory import probe as activation_probe
from demo_core.settings import page_settings
from presentation.plan_text import plan_document, summary_markdown
from presentation.plan_views import bars_figure, scaling_figure
from presentation.plots import RESULT_WIDTH_IN
from presentation.speed_views import time_per_token_figure
from serving.api_docs import documented_api, settings_endpoint
from serving.errors import user_errors
from serving.in_flight import REQUESTS
from serving.page import WITH_SCREEN, Screen
from serving.widgets import settings_form

if TYPE_CHECKING:  # the figures are presentation's; the page only places them
    from matplotlib.figure import Figure

DEFAULT_MODEL = "Llama-3.2-1B"  # full fine-tune at 8 x 2048: packed fits 40 GB, padded does not
# The section's inputs as the page opens, by setting name: the declared defaults (PlanRequest), on a question packing
# answers (the widgets and the warm-up read them, so the plan the server computes ahead is the one a first visitor
# asks for).
PAGE_DEFAULTS = {**{item.name: item.default for item in page_settings(PlanRequest)}, "model": DEFAULT_MODEL,
                 "dataset": "flan-like"}
API_DEFAULTS = PlanRequest(model=DEFAULT_MODEL)


class PlanViews(NamedTuple):
    summary: str
    bars: Figure  # stacked bars padded vs packed
    curve: Figure  # memory against sequence length
    speed: Figure  # per collator, time per 1,000 real tokens by part on the chosen GPU


def _request(**settings) -> PlanRequest:
    """A PlanRequest from page or API values, by name. The page reads no local files: configs of presets, shipped
    models and cached hub ids only, built-in length profiles only (the CLI takes folders and files)."""
    model = (settings.get("model") or "").strip()
    if model and Path(model).expanduser().exists():
        raise DemoInputError("the page plans presets, shipped configs and cached hub ids; for a local folder use "
                             "`python -m demo_core plan --model PATH`")
    dataset = settings.get("dataset")
    dataset = None if dataset in (None, "", EQUAL_LENGTHS) else dataset
    if dataset is not None and dataset not in BUILTIN_DATASETS:
        raise DemoInputError(f"choose a built-in length profile ({', '.join(BUILTIN_DATASETS)}) or equal lengths")
    return PlanRequest(**{**settings, "model": model, "dataset": dataset})


def plan_api(**settings) -> dict[str, Any]:
    """Memory per device of a fine-tune, from the model's config alone: no weights, no training.

    Returns:
        per_device (category -> bytes), total_bytes (live tensors at the peak: max_memory_allocated),
        reserved_bytes (max_memory_reserved), device_used_bytes (nvidia-smi), margin_bytes and fit_basis (fits
        decided on device_used_bytes + margin_bytes), peak_moment, fits (GPU GB -> bool), max_batch_size,
        max_seq_length and scaling (padded vs packed device use per sequence length); throughput: on `gpu_type`
        (an A100 80GB when none is given), per collator real tokens/s per GPU, seconds per optimizer step, speedup
        over padded with its range, and the step's breakdown by part
    """
    return plan_document(planned(_request(**settings)))


def plan_page(*, screen: Screen = Screen(), **settings) -> PlanViews:
    """The summary and the two figures for the widgets' values, the figures drawn for the screen the page shows them
    on (as the run's figures)."""
    chosen, padded, packed = _plan_both_layouts(_request(**settings))
    width_in = screen.width_in(RESULT_WIDTH_IN)
    bars = bars_figure(padded, packed, chosen.request.packed, width_in, dpi=screen.dpi)
    # The speed figure spans the section's column (the two above share it): drawn for the column's whole width.
    speed = time_per_token_figure(chosen.throughput, chosen.request.gpus, screen.width_in(), dpi=screen.dpi)
    return PlanViews(summary_markdown(chosen), bars, scaling_figure(chosen, width_in, dpi=screen.dpi), speed)


def _plan_both_layouts(request: PlanRequest) -> tuple[Plan, DeviceEstimate, DeviceEstimate]:
    """The asked plan with its throughput, and the estimates padded and packed (the plan's own and the other
    layout's) it is shown beside."""
    chosen = planned(request)  # validates it
    other = device_estimate(dataclasses.replace(chosen.request, packed=not chosen.request.packed))
    padded, packed = (other, chosen.device) if chosen.request.packed else (chosen.device, other)
    return chosen, padded, packed


# The training modes a server plans ahead for every model chip, after each chip's opening question: the common LoRA
# and QLoRA questions, at rank 16 (the rank docs/MEMORY.md's LoRA plans and the page's tests ask about). A probe
# fit is keyed on its settings (memory/probe_model.py ProbeSpec: LoRA's rank, the 4-bit base, checkpointing, the
# batch's layout), so each mode is planned at the page's lengths and at `/plan`'s equal lengths, the layouts a first
# question meets.
WARM_UP_TRAINING = ({"lora_rank": 16, "qlora": False}, {"lora_rank": 16, "qlora": True})
# How much the server plans ahead at start-up: "all" (the opening questions, then the LoRA and QLoRA ones: about
# 215 CPU seconds, docs/MEMORY.md), "opening" (the opening questions only: about 23; what the tests' servers use) or
# "off".
WARM_UP_ENV = "PACKING_LAB_PLANNER_WARMUP"
WARM_UP_SCOPES = ("all", "opening", "off")
# The LoRA phase's niceness (Linux, this thread only): its fits only ever use a core nothing else wants.
LORA_WARM_UP_NICENESS = 19

logger = logging.getLogger("packing_lab.app")


def warm_up_scope() -> str:
    """The warm-up's scope from `PACKING_LAB_PLANNER_WARMUP` (default "all"); any other value is refused at start-up."""
    scope = os.environ.get(WARM_UP_ENV, "all").strip().lower() or "all"
    if scope not in WARM_UP_SCOPES:
        raise DemoInputError(f"{WARM_UP_ENV} must be one of {', '.join(WARM_UP_SCOPES)}, got {scope!r}")
    return scope


def _warm_up_models() -> list[str]:
    return [DEFAULT_MODEL, *(model for model in shipped_configs() if model != DEFAULT_MODEL)]


def opening_questions() -> list[dict[str, Any]]:
    """The section's opening question for the default model, then for every model chip."""
    return [{**PAGE_DEFAULTS, "model": model} for model in _warm_up_models()]


def lora_questions(models: list[str] | None = None) -> list[dict[str, Any]]:
    """Each model's (default: every chip's) questions in each of WARM_UP_TRAINING's modes, at the page's other
    settings and at equal lengths."""
    return [{**PAGE_DEFAULTS, "model": model, **training, "dataset": dataset}
            for training in WARM_UP_TRAINING for model in models or _warm_up_models()
            for dataset in (PAGE_DEFAULTS["dataset"], None)]


def warm_up(questions: list[dict[str, Any]], before_each_fit: Callable[[], None] | None = None) -> None:
    """Plans each question as `plan_page` does, without drawing the figures, so that its probe fits are cached when a
    visitor asks it; `before_each_fit` runs before each fit this computes (the LoRA phase waits there for an idle
    server)."""
    with activation_probe.before_each_fit(before_each_fit):
        for settings in questions:
            _plan_both_layouts(_request(**settings))


def _lower_this_threads_priority() -> None:
    if sys.platform.startswith("linux"):  # elsewhere the call takes a process id: it would renice the whole server
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(current, LORA_WARM_UP_NICENESS))


def warm_up_in_background(scope: str | None = None) -> threading.Thread:
    """Plans ahead in one daemon thread when the server starts, as far as `scope` (default: `warm_up_scope()`) says: a
    model's first answer under a setting fits its activation probes (about a second on an idle 2-core CPU, see
    docs/MEMORY.md), and this moves those seconds from a visitor's click to the server's start-up.

    First the opening questions, at the server's priority (a first visitor asks them within seconds); then, with
    "all", the LoRA and QLoRA questions at the lowest priority, each fit waiting until no request is being served
    (serving/in_flight.py), so that a visitor never waits behind them. Other settings (another LoRA rank,
    checkpointing off, another precision) still fit their probes on first use."""
    scope = warm_up_scope() if scope is None else scope

    def plan_ahead() -> None:
        if scope == "off":
            return
        started = time.perf_counter()
        warm_up(opening_questions())
        logger.info("planner warm-up: opening questions planned in %.0f s", time.perf_counter() - started)
        if scope == "all":
            _lower_this_threads_priority()
            started = time.perf_counter()
            warm_up(lora_questions(), before_each_fit=REQUESTS.wait_until_idle)
            logger.info("planner warm-up: LoRA and QLoRA questions planned in %.0f s", time.perf_counter() - started)

    thread = threading.Thread(target=plan_ahead, daemon=True, name="planner-warm-up")
    thread.start()
    return thread


FIGURE_TEXT = {
    "bars": "Stacked bars of the live memory per device of the planned fine-tune, padded beside packed, by category "
            "(weights, gradients, optimizer, activations, temporary), a black mark at the memory used on the card "
            "(with the allocator's cache and the CUDA context), and lines at 24, 40, 80 and 141 GB GPU sizes",
    "curve": "Memory used on the card per device against sequence length, padded and packed, with lines at common "
             "GPU sizes",
    "speed": "Horizontal bars, one per collator: predicted milliseconds per 1,000 real tokens on one GPU of the "
             "chosen type, split by part (matmuls, attention, memory-bound ops, optimizer, fixed costs...), the parts "
             "packing cannot shrink hatched, and each collator's speedup over padded at its bar's end",
}


def build_planner_section(demo: gr.Blocks, screen: gr.JSON) -> None:
    """The section's widgets (one per setting PlanRequest declares for the page) and wiring, inside the page's
    `gr.Blocks`; also registers the `/plan` endpoint (its parameters those PlanRequest declares for the API).
    `screen` is the page's hidden description of the screen its figures are shown on, which `WITH_SCREEN` fills in."""
    gr.Markdown("## 4 · Will it fit, and how fast? Memory and speed of a real fine-tune, without training\n"
                "The same estimate every run above checks against its measurement, for real model sizes: "
                "LoRA/QLoRA, 8-bit optimizers, gradient checkpointing, ZeRO/FSDP over several GPUs; and each "
                "collator's predicted tokens/s, step time and speedup on the GPU type you choose.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=320):
            form = settings_form(PlanRequest, PAGE_DEFAULTS, elem_prefix="plan-", enter_hint="Enter plans it")
            button = gr.Button("Will it fit, and how fast?", variant="primary", elem_id="plan")
        with gr.Column(scale=3):
            summary = gr.Markdown("Choose a model and press **Will it fit, and how fast?**", elem_id="plan-summary")
            with gr.Row():
                bars = gr.Plot(label=FIGURE_TEXT["bars"], show_label=False, elem_id="plan-bars", min_width=340)
                curve = gr.Plot(label=FIGURE_TEXT["curve"], show_label=False, elem_id="plan-curve", min_width=340)
            speed = gr.Plot(label=FIGURE_TEXT["speed"], show_label=False, elem_id="plan-speed", min_width=340)

    @user_errors
    def show_plan(*, screen: dict | None = None, **settings) -> dict:
        views = plan_page(screen=Screen.of(screen), **settings)
        return {summary: views.summary, bars: views.bars, curve: views.curve, speed: views.speed}

    for name, chips in form.chips.items():
        for choice, chip in chips.items():
            chip.click(lambda choice=choice: choice, outputs=form.widgets[name], queue=False, show_progress="hidden",
                       api_visibility="private")
    # No model runs and no training: it must not wait behind a training job, so it has its own group.
    gr.on([button.click, form.widgets["model"].submit], show_plan,
          inputs_kwargs={**form.widgets, "screen": screen}, js=WITH_SCREEN,
          outputs=[summary, bars, curve, speed], api_visibility="private", concurrency_id="plan", concurrency_limit=4)
    documented_api(demo, settings_endpoint(user_errors(plan_api), API_DEFAULTS), "plan", "plan",
                   concurrency_id="plan", concurrency_limit=4)
