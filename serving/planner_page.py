"""The "Will it fit?" section of the page: the memory planner (demo_core/planner.py) for real model sizes.

`build_planner_section(demo)` creates the widgets and their wiring inside the page's active `gr.Blocks` and
registers the `/plan` API endpoint (named, typed and described parameters, as the other endpoints). The handlers
are plain functions: `plan_page` for the widgets, `plan_api` for gradio_client. Figures are matplotlib `Figure`
objects, never pyplot (a long-running server must not keep them in a registry).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Literal

import gradio as gr
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from demo_core.config import ESTIMATE_OPTIMIZER_NAMES, ESTIMATE_PRECISION_NAMES
from demo_core.data import BUILTIN_DATASETS
from demo_core.errors import DemoInputError
from demo_core.memory_measure import CATEGORIES
from demo_core.planner import (GIB, GPU_SIZES_GB, SHARDING_NAMES, DeviceEstimate, Plan, PlanRequest,
                               device_estimate, largest_fit_words, plan, shipped_configs)
from demo_core.plots import FIGURE_DPI, MEMORY_CATEGORY_COLORS, RESULT_WIDTH_IN, TITLE_CHARS_PER_IN, wrap_lines

from .api_docs import documented_api
from .errors import user_errors
from .layout import text_with_chips
from .page import WITH_PICTURE_WIDTH, figure_width_in

PlanPrecision = Literal[ESTIMATE_PRECISION_NAMES]  # type: ignore[valid-type]
PlanOptimizer = Literal[ESTIMATE_OPTIMIZER_NAMES]  # type: ignore[valid-type]
ShardName = Literal[SHARDING_NAMES]  # type: ignore[valid-type]
EQUAL_LENGTHS = "equal lengths"
DEFAULT_MODEL = "Llama-3.2-1B"  # full fine-tune at 8 x 2048: packed fits 40 GB, padded does not
# The section's inputs as the page opens, by `plan_page`'s parameter names (the widgets and the warm-up read them,
# so the plan the server computes ahead is the one a first visitor asks for).
PAGE_DEFAULTS = {"batch_size": 8, "seq_length": 2048, "dataset": "flan-like", "packed": False, "precision": "bf16",
                 "optimizer": "adamw", "lora_rank": 0, "qlora": False, "gradient_checkpointing": False, "gpus": 1,
                 "shard": "none", "gpu_gb": 80}
GPU_LINE_COLORS = {24: "#59a14f", 40: "#f28e2b", 80: "#e15759", 141: "#7a0019"}


def _request(model: str, batch_size, seq_length, dataset: str, packed: bool, precision: str, optimizer: str,
             lora_rank, qlora: bool, gradient_checkpointing: bool, gpus, shard: str, gpu_gb) -> PlanRequest:
    """A PlanRequest from page or API values. The page reads no local files: configs of presets, shipped models
    and cached hub ids only, built-in length profiles only (the CLI takes folders and files)."""
    model = (model or "").strip()
    if model and Path(model).expanduser().exists():
        raise DemoInputError("the page plans presets, shipped configs and cached hub ids; for a local folder use "
                             "`python -m demo_core plan --model PATH`")
    dataset = None if dataset in (None, "", EQUAL_LENGTHS) else dataset
    if dataset is not None and dataset not in BUILTIN_DATASETS:
        raise DemoInputError(f"choose a built-in length profile ({', '.join(BUILTIN_DATASETS)}) or equal lengths")
    return PlanRequest(model=model, batch_size=batch_size, seq_length=seq_length, dataset=dataset,
                       packed=bool(packed), precision=precision, optimizer=optimizer, lora_rank=lora_rank,
                       qlora=bool(qlora), gradient_checkpointing=bool(gradient_checkpointing), gpus=gpus,
                       shard=shard, gpu_gb=gpu_gb)


def plan_api(model: str = DEFAULT_MODEL, batch_size: int = 8, seq_length: int = 2048, dataset: str = "",
             packed: bool = False, precision: PlanPrecision = "bf16", optimizer: PlanOptimizer = "adamw",
             lora_rank: int = 0, qlora: bool = False, gradient_checkpointing: bool = False, gpus: int = 1,
             shard: ShardName = "none", gpu_gb: float = 80) -> dict[str, Any]:
    """Memory per device of a fine-tune, from the model's config alone: no weights, no training.

    Args:
        model: a shipped config of a real model (e.g. Llama-3.1-8B), a preset, or a hub id in the local cache
        batch_size: examples per device per step
        seq_length: tokens per example (the longest, when a length profile is given)
        dataset: "" for equal lengths, or a built-in length profile (flan-like, orcamath-like): the batch that needs
            the most memory is planned
        packed: padding-free packing (one row per batch) instead of padding
        precision: fp32, bf16/fp16 mixed precision (fp32 master weights), or pure bf16
        optimizer: the optimizer whose states are counted
        lora_rank: LoRA rank on the attention and MLP projections; 0 for a full fine-tune
        qlora: the frozen base weights in 4 bits (with lora_rank > 0)
        gradient_checkpointing: keep only each layer's input and recompute the layer in backward
        gpus: devices the run is spread over
        shard: none (DDP: full copies), zero1/zero2/zero3 or fsdp
        gpu_gb: the GPU size the largest batch size and sequence length are searched for

    Returns:
        per_device (category -> bytes), total_bytes (live tensors at the peak: max_memory_allocated),
        reserved_bytes (max_memory_reserved), device_used_bytes (nvidia-smi), margin_bytes and fit_basis (fits
        decided on device_used_bytes + margin_bytes), peak_moment, fits (GPU GB -> bool), max_batch_size,
        max_seq_length and scaling (padded vs packed device use per sequence length)
    """
    return plan(_request(model, batch_size, seq_length, dataset, packed, precision, optimizer, lora_rank, qlora,
                         gradient_checkpointing, gpus, shard, gpu_gb)).to_dict()


def plan_page(model: str, batch_size, seq_length, dataset: str, packed: bool, precision: str, optimizer: str,
              lora_rank, qlora: bool, gradient_checkpointing: bool, gpus, shard: str, gpu_gb,
              picture_px: float | None = None) -> tuple[str, Figure, Figure]:
    """(summary, stacked bars padded vs packed, sequence-length curve) for the widgets' values, the figures drawn
    for the width the page shows its pictures at (`picture_px`, as the run's figures)."""
    chosen, padded, packed = _plan_both_layouts(_request(
        model, batch_size, seq_length, dataset, packed, precision, optimizer, lora_rank, qlora,
        gradient_checkpointing, gpus, shard, gpu_gb))
    width_in = figure_width_in(picture_px, RESULT_WIDTH_IN)
    return (summary_markdown(chosen), bars_figure(padded, packed, chosen.request.packed, width_in),
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
            _plan_both_layouts(_request(model, **PAGE_DEFAULTS))

    thread = threading.Thread(target=plan_each, daemon=True, name="planner-warm-up")
    thread.start()
    return thread


def summary_markdown(result: Plan) -> str:
    device, request, fit_words = result.device, result.request, largest_fit_words(result.to_dict())
    fits = " · ".join(f"{gb} GB {'✅' if ok else '❌'}" for gb, ok in result.fits.items())
    training = (f"LoRA r={request.lora_rank}" + (" on a 4-bit base (QLoRA)" if request.qlora else "")
                if request.lora_rank else "full fine-tune")
    memory = device.memory
    lines = [
        f"**{request.model}**: {device.params / 1e9:.2f}B parameters, {device.trainable_params / 1e6:,.1f}M "
        f"trained ({training}); attention `{result.attention}`.",
        f"**Peak per device: {device.peak_bytes / GIB:,.1f} GiB** of live tensors at `{device.peak_moment}` "
        f"(max_memory_allocated); {memory.reserved.bytes / GIB:,.1f} GiB reserved by PyTorch's caching allocator "
        f"(max_memory_reserved); **{memory.device_used.bytes / GIB:,.1f} GiB used on the card** as nvidia-smi "
        f"shows it (+ CUDA context). Fits: {fits}.",
        f"Fits and the largest sizes are decided on the card's used memory plus a margin of "
        f"{memory.margin_bytes / GIB:,.1f} GiB. {fit_words[:1].upper()}{fit_words[1:]}.",
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
        used = device.memory.device_used.bytes / GIB  # what the fit is decided on: a mark above the live stack
        axes.hlines(used, position - 0.3, position + 0.3, colors="black", linewidth=1.5)
        axes.text(position, max(used, bottom), f"{bottom:,.1f} GiB live at {device.peak_moment}\n"
                  f"{used:,.1f} GiB on the card", ha="center", va="bottom", fontsize=8,
                  fontweight="bold" if chosen else "normal")
        tallest = max(tallest, bottom, used)
    axes.set_xticks([0, 1], ["padded", "packed (padding-free)"])
    axes.set_xlim(-0.6, 1.6)
    # Room for the 24 GB line once a plan is a quarter of it; a toy model's bars would vanish under it.
    axes.set_ylim(0, max(tallest * 1.3, 26.5 if tallest > 6 else 1.0))
    _gpu_lines(axes)
    axes.set_ylabel("GiB per device at the peak of a step")
    axes.legend(handles=[Patch(color=MEMORY_CATEGORY_COLORS[c], label=c) for c in CATEGORIES if c != "context"],
                fontsize=7, ncols=3, loc="upper left")  # the context is not a tensor: it is in the black mark
    axes.set_title(wrap_lines("Will it fit? Memory alive at the peak, per category\n(black mark: used on the card, "
                              "with allocator cache and CUDA context; dashed: common GPU sizes)",
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
    axes.set_ylabel("GiB used on the card per device")
    axes.legend(fontsize=7, loc="upper left")
    profile = result.request.dataset or "equal lengths"
    axes.set_title(wrap_lines(f"Memory against sequence length (batch size {result.request.batch_size}, {profile})\n"
                              f"vertical line: the length asked", int(width_in * TITLE_CHARS_PER_IN)), fontsize=10)
    return figure


FIGURE_TEXT = {
    "bars": "Stacked bars of the live memory per device of the planned fine-tune, padded beside packed, by category "
            "(weights, gradients, optimizer, activations, temporary), a black mark at the memory used on the card "
            "(with the allocator's cache and the CUDA context), and lines at 24, 40, 80 and 141 GB GPU sizes",
    "curve": "Memory used on the card per device against sequence length, padded and packed, with lines at common "
             "GPU sizes",
}


def build_planner_section(demo: gr.Blocks, picture_px: gr.Number) -> None:
    """The section's widgets and wiring, inside the page's `gr.Blocks`; also registers the `/plan` endpoint.
    `picture_px` is the page's hidden width of its pictures, which `WITH_PICTURE_WIDTH` fills in."""
    gr.Markdown("## 4 · Will it fit? Memory of a real fine-tune, without training\n"
                "The same estimate every run above checks against its measurement, for real model sizes: "
                "LoRA/QLoRA, 8-bit optimizers, gradient checkpointing, ZeRO/FSDP over several GPUs.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=320):
            model = text_with_chips(shipped_configs(), DEFAULT_MODEL, "Model", "a real model's shipped config "
                                    "below, a preset (tiny-llama, llama-1b, ...), or a hub id in the local cache",
                                    "plan-model")
            start = PAGE_DEFAULTS
            with gr.Row():
                batch_size = gr.Number(start["batch_size"], precision=0, minimum=1, label="Batch size per device")
                seq_length = gr.Number(start["seq_length"], precision=0, minimum=2, label="Sequence length")
            dataset = gr.Dropdown([EQUAL_LENGTHS, *BUILTIN_DATASETS], value=start["dataset"], label="Lengths",
                                  info="a length profile: the batch that needs the most memory is planned")
            packed = gr.Checkbox(start["packed"], label="Packed (padding-free)")
            with gr.Row():
                precision = gr.Dropdown(list(ESTIMATE_PRECISION_NAMES), value=start["precision"], label="Precision")
                optimizer = gr.Dropdown(list(ESTIMATE_OPTIMIZER_NAMES), value=start["optimizer"], label="Optimizer")
            with gr.Row():
                lora_rank = gr.Number(start["lora_rank"], precision=0, minimum=0, label="LoRA rank (0: full)")
                qlora = gr.Checkbox(start["qlora"], label="QLoRA (4-bit base)")
            checkpointing = gr.Checkbox(start["gradient_checkpointing"], label="Gradient checkpointing")
            with gr.Row():
                gpus = gr.Number(start["gpus"], precision=0, minimum=1, label="GPUs")
                shard = gr.Dropdown(list(SHARDING_NAMES), value=start["shard"], label="Sharding")
            gpu_gb = gr.Dropdown(list(GPU_SIZES_GB), value=start["gpu_gb"],
                                 label="GPU size for the largest batch and length (GB)")
            button = gr.Button("Will it fit?", variant="primary", elem_id="plan")
        with gr.Column(scale=3):
            summary = gr.Markdown("Choose a model and press **Will it fit?**", elem_id="plan-summary")
            with gr.Row():
                bars = gr.Plot(label=FIGURE_TEXT["bars"], show_label=False, elem_id="plan-bars", min_width=340)
                curve = gr.Plot(label=FIGURE_TEXT["curve"], show_label=False, elem_id="plan-curve", min_width=340)
    inputs = [model.box, batch_size, seq_length, dataset, packed, precision, optimizer, lora_rank, qlora,
              checkpointing, gpus, shard, gpu_gb]
    for choice, chip in model.chips.items():
        chip.click(lambda choice=choice: choice, outputs=model.box, queue=False, show_progress="hidden",
                   api_visibility="private")
    # No model runs and no training: it must not wait behind a training job, so it has its own group.
    gr.on([button.click, model.box.submit], user_errors(plan_page), inputs=[*inputs, picture_px],
          js=WITH_PICTURE_WIDTH, outputs=[summary, bars, curve], api_visibility="private", concurrency_id="plan",
          concurrency_limit=4)
    documented_api(demo, user_errors(plan_api), "plan", "plan", concurrency_id="plan", concurrency_limit=4)
