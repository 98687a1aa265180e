"""The "Will it fit?" section of the page: the memory planner (demo_core/planner.py) for real model sizes.

`build_planner_section(demo)` creates the widgets (one per setting `PlanRequest` declares for the page) and their
wiring inside the page's active `gr.Blocks` and registers the `/plan` API endpoint (named, typed and described
parameters derived from the declaration, as the other endpoints). The handlers are plain functions that take the
settings by name: `plan_page` for the widgets, `plan_api` for gradio_client. Figures are matplotlib `Figure`
objects, never pyplot (a long-running server must not keep them in a registry).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, NamedTuple

import gradio as gr
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from demo_core.data import BUILTIN_DATASETS
from demo_core.errors import DemoInputError
from demo_core.memory_measure import CATEGORIES
from demo_core.planner import (EQUAL_LENGTHS, GIB, DeviceEstimate, Plan, PlanRequest, device_estimate,
                               largest_fit_words, plan, shipped_configs)
from presentation.plots import FIGURE_DPI, MEMORY_CATEGORY_COLORS, RESULT_WIDTH_IN, TITLE_CHARS_PER_IN, wrap_lines
from demo_core.settings import page_settings

from .api_docs import documented_api, settings_endpoint
from .errors import user_errors
from .page import WITH_PICTURE_WIDTH, figure_width_in
from .widgets import settings_form

DEFAULT_MODEL = "Llama-3.2-1B"  # full fine-tune at 8 x 2048: packed fits 40 GB, padded does not
# The section's inputs as the page opens, by setting name: the declared defaults (PlanRequest), on a question packing
# answers (the widgets and the warm-up read them, so the plan the server computes ahead is the one a first visitor
# asks for).
PAGE_DEFAULTS = {**{item.name: item.default for item in page_settings(PlanRequest)}, "model": DEFAULT_MODEL,
                 "dataset": "flan-like"}
API_DEFAULTS = PlanRequest(model=DEFAULT_MODEL)
GPU_LINE_COLORS = {24: "#59a14f", 40: "#f28e2b", 80: "#e15759", 141: "#7a0019"}


class PlanViews(NamedTuple):
    summary: str
    bars: Figure  # stacked bars padded vs packed
    curve: Figure  # memory against sequence length


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
        per_device (category -> bytes), total_bytes (the peak), peak_moment, fits (GPU GB -> bool), max_batch_size,
        max_seq_length and scaling (padded vs packed bytes per sequence length)
    """
    return plan(_request(**settings)).to_dict()


def plan_page(*, picture_px: float | None = None, **settings) -> PlanViews:
    """The summary and the two figures for the widgets' values, the figures drawn for the width the page shows its
    pictures at (`picture_px`, as the run's figures)."""
    chosen, padded, packed = _plan_both_layouts(_request(**settings))
    width_in = figure_width_in(picture_px, RESULT_WIDTH_IN)
    return PlanViews(summary_markdown(chosen), bars_figure(padded, packed, chosen.request.packed, width_in),
                     scaling_figure(chosen, width_in))


def _plan_both_layouts(request: PlanRequest) -> tuple[Plan, DeviceEstimate, DeviceEstimate]:
    """The asked plan, and the estimates padded and packed (the plan's own and the other layout's) it is shown
    beside."""
    chosen = plan(request)  # validates it
    other = device_estimate(dataclasses.replace(chosen.request, packed=not chosen.request.packed))
    padded, packed = (other, chosen.device) if chosen.request.packed else (chosen.device, other)
    return chosen, padded, packed


def warm_up_in_background() -> threading.Thread:
    """Plans the section's opening question in a daemon thread when the server starts, for the default model first,
    then for every model chip: a model's first answer fits its activation probes (about a second on an idle 2-core
    CPU, see docs/MEMORY.md), and this moves those seconds from a visitor's click to the server's start-up. Other
    settings (LoRA, checkpointing, another precision) still fit their probes on first use."""
    models = [DEFAULT_MODEL, *(model for model in shipped_configs() if model != DEFAULT_MODEL)]

    def plan_each() -> None:  # what `plan_page` computes, without drawing the figures
        for model in models:
            _plan_both_layouts(_request(**{**PAGE_DEFAULTS, "model": model}))

    thread = threading.Thread(target=plan_each, daemon=True, name="planner-warm-up")
    thread.start()
    return thread


def summary_markdown(result: Plan) -> str:
    device, request, fit_words = result.device, result.request, largest_fit_words(result.to_dict())
    fits = " · ".join(f"{gb} GB {'✅' if ok else '❌'}" for gb, ok in result.fits.items())
    training = (f"LoRA r={request.lora_rank}" + (" on a 4-bit base (QLoRA)" if request.qlora else "")
                if request.lora_rank else "full fine-tune")
    lines = [
        f"**{request.model}**: {device.params / 1e9:.2f}B parameters, {device.trainable_params / 1e6:,.1f}M "
        f"trained ({training}); attention `{result.attention}`.",
        f"**Peak per device: {device.peak_bytes / GIB:,.1f} GiB** at `{device.peak_moment}`. Fits: {fits}.",
        f"{fit_words[:1].upper()}{fit_words[1:]}.",
    ]
    notes = "\n".join(f"- {note}" for note in result.notes)
    return "\n\n".join(lines + ([notes] if notes else []))


def _gpu_lines(axes) -> None:
    """Dashed lines at the common GPU sizes that fall inside the axes, labelled on the right."""
    for gb, color in GPU_LINE_COLORS.items():
        if gb <= axes.get_ylim()[1]:
            axes.axhline(gb, color=color, linestyle="--", linewidth=1)
            axes.text(axes.get_xlim()[1], gb, f" {gb} GB", color=color, va="center", ha="left", fontsize=8)


def bars_figure(padded: DeviceEstimate, packed: DeviceEstimate, chosen_packed: bool,
                width_in: float = RESULT_WIDTH_IN) -> Figure:
    """What is alive at each estimate's peak, stacked by category, with the common GPU sizes drawn across."""
    figure = Figure(figsize=(width_in, 4.6), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    tallest = 0.0
    for position, (label, device) in enumerate((("padded", padded), ("packed", packed))):
        live = device.live_by_moment[device.peak_moment]
        bottom = 0.0
        for category in CATEGORIES:
            value = live.get(category, 0) / GIB
            axes.bar(position, value, bottom=bottom, color=MEMORY_CATEGORY_COLORS[category], edgecolor="white",
                     linewidth=0.5, width=0.55)
            bottom += value
        chosen = (label == "packed") == chosen_packed
        axes.text(position, bottom, f"{bottom:,.1f} GiB\nat {device.peak_moment}", ha="center",
                  va="bottom", fontsize=8, fontweight="bold" if chosen else "normal")
        tallest = max(tallest, bottom)
    axes.set_xticks([0, 1], ["padded", "packed (padding-free)"])
    axes.set_xlim(-0.6, 1.6)
    # Room for the 24 GB line once a plan is a quarter of it; a toy model's bars would vanish under it.
    axes.set_ylim(0, max(tallest * 1.3, 26.5 if tallest > 6 else 1.0))
    _gpu_lines(axes)
    axes.set_ylabel("GiB per device at the peak of a step")
    axes.legend(handles=[Patch(color=MEMORY_CATEGORY_COLORS[c], label=c) for c in CATEGORIES], fontsize=7,
                ncols=3, loc="upper left")
    axes.set_title(wrap_lines("Will it fit? Memory alive at the peak, per category\n(dashed: common GPU sizes)",
                              int(width_in * TITLE_CHARS_PER_IN)), fontsize=10)
    return figure


def scaling_figure(result: Plan, width_in: float = RESULT_WIDTH_IN) -> Figure:
    """Peak per device against the sequence length, padded and packed, at the request's batch size."""
    figure = Figure(figsize=(width_in, 4.6), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    lengths = [row["seq_length"] for row in result.scaling]
    for key, label, style, color in (("padded_bytes", "padded", "-", "#8c8c8c"),
                                     ("packed_bytes", "packed (padding-free)", "--", "#4e79a7")):
        axes.plot(lengths, [row[key] / GIB for row in result.scaling], style, marker="o", markersize=3,
                  label=label, color=color)
    axes.set_xscale("log", base=2)
    top = max(max(row["padded_bytes"], row["packed_bytes"]) for row in result.scaling) / GIB
    axes.set_ylim(0, top * 1.15)
    axes.axvline(result.request.seq_length, color="black", linewidth=0.8)
    _gpu_lines(axes)
    # 10-pt axis labels fit about 11 characters per inch less the y axis' margin.
    axes.set_xlabel(wrap_lines("sequence length (tokens per example; a length profile is cut to it)",
                               int(width_in * 11) - 10))
    axes.set_ylabel("GiB per device at the peak")
    axes.legend(fontsize=7, loc="upper left")
    profile = result.request.dataset or "equal lengths"
    axes.set_title(wrap_lines(f"Memory against sequence length (batch size {result.request.batch_size}, {profile})\n"
                              f"vertical line: the length asked", int(width_in * TITLE_CHARS_PER_IN)), fontsize=10)
    return figure


FIGURE_TEXT = {
    "bars": "Stacked bars of the memory per device of the planned fine-tune, padded beside packed, by category "
            "(weights, gradients, optimizer, activations, temporary, CUDA context), with lines at 24, 40, 80 and "
            "141 GB GPU sizes",
    "curve": "Memory per device against sequence length, padded and packed, with lines at common GPU sizes",
}


def build_planner_section(demo: gr.Blocks, picture_px: gr.Number) -> None:
    """The section's widgets (one per setting PlanRequest declares for the page) and wiring, inside the page's
    `gr.Blocks`; also registers the `/plan` endpoint (its parameters those PlanRequest declares for the API).
    `picture_px` is the page's hidden width of its pictures, which `WITH_PICTURE_WIDTH` fills in."""
    gr.Markdown("## 4 · Will it fit? Memory of a real fine-tune, without training\n"
                "The same estimate every run above checks against its measurement, for real model sizes: "
                "LoRA/QLoRA, 8-bit optimizers, gradient checkpointing, ZeRO/FSDP over several GPUs.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=320):
            form = settings_form(PlanRequest, PAGE_DEFAULTS, elem_prefix="plan-", enter_hint="Enter plans it")
            button = gr.Button("Will it fit?", variant="primary", elem_id="plan")
        with gr.Column(scale=3):
            summary = gr.Markdown("Choose a model and press **Will it fit?**", elem_id="plan-summary")
            with gr.Row():
                bars = gr.Plot(label=FIGURE_TEXT["bars"], show_label=False, elem_id="plan-bars", min_width=340)
                curve = gr.Plot(label=FIGURE_TEXT["curve"], show_label=False, elem_id="plan-curve", min_width=340)

    @user_errors
    def show_plan(*, picture_px: float | None = None, **settings) -> dict:
        views = plan_page(picture_px=picture_px, **settings)
        return {summary: views.summary, bars: views.bars, curve: views.curve}

    for name, chips in form.chips.items():
        for choice, chip in chips.items():
            chip.click(lambda choice=choice: choice, outputs=form.widgets[name], queue=False, show_progress="hidden",
                       api_visibility="private")
    # No model runs and no training: it must not wait behind a training job, so it has its own group.
    gr.on([button.click, form.widgets["model"].submit], show_plan,
          inputs_kwargs={**form.widgets, "picture_px": picture_px}, js=WITH_PICTURE_WIDTH,
          outputs=[summary, bars, curve], api_visibility="private", concurrency_id="plan", concurrency_limit=4)
    documented_api(demo, settings_endpoint(user_errors(plan_api), API_DEFAULTS), "plan", "plan",
                   concurrency_id="plan", concurrency_limit=4)
