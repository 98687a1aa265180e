"""A memory plan (demo_core's planner) shown: its summary in markdown and its two figures, matplotlib `Figure` objects,
never pyplot (a long-running server must not keep them in a registry).

- `summary_markdown(plan)`: the model, the peak per device, which GPU sizes it fits, the largest batch and length;
- `bars_figure(padded, packed, ...)`: what is alive at each layout's peak, stacked by category, GPU sizes across;
- `scaling_figure(plan)`: the peak against the sequence length, padded and packed.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from demo_core import GIB, DeviceEstimate, Plan
from demo_core import MEMORY_CATEGORIES as CATEGORIES
from presentation.figure_text import TITLE_CHARS_PER_IN, BarLabel, axes_sizes_pt, stack_labels, top_for, wrap_lines
from presentation.plots import FIGURE_DPI, MEMORY_CATEGORY_COLORS, RESULT_WIDTH_IN

GPU_LINE_COLORS = {24: "#59a14f", 40: "#f28e2b", 80: "#e15759", 141: "#7a0019"}


def fit_basis_words(document: dict) -> str:
    """Which number a plan's fits were decided on and the margin kept, in words (the page and the CLI)."""
    return (f"fits are decided on the device's used memory as nvidia-smi shows it, "
            f"{document['device_used_bytes'] / GIB:,.2f} GiB, plus a margin of {document['margin_bytes'] / GIB:,.2f} "
            f"GiB (the spread of published allocator and CUDA-context measurements)")


def largest_fit_words(document: dict) -> str:
    """The largest batch size and sequence length that fit the asked GPU size, in words (the page and the CLI),
    saying so, with what to change, when not even one example or two tokens fit."""
    request, gpu = document["request"], f"{document['gpu_gb']:g} GB"
    batch = (f"largest batch size {document['max_batch_size']} at {request['seq_length']:,} tokens"
             if document["max_batch_size"] else f"not one example of {request['seq_length']:,} tokens fits")
    length = (f"longest sequence {document['max_seq_length']:,} tokens at batch size {request['batch_size']}"
              if document["max_seq_length"] else f"no length fits at batch size {request['batch_size']}")
    stuck = not (document["max_batch_size"] and document["max_seq_length"])
    changes = changes_that_need_less(request)
    hint = f" ({', '.join(changes[:-1])} or {changes[-1]} need less)" if stuck and len(changes) > 1 else (
        f" ({changes[0]} needs less)" if stuck and changes else "")
    return f"on {gpu}: {batch}; {length}{hint}"


def changes_that_need_less(request: dict) -> list[str]:
    """What would lower a plan's memory that its request has not done already."""
    changes = []
    if not request["lora_rank"]:
        changes.append("LoRA")
    elif not request["qlora"]:
        changes.append("QLoRA (a 4-bit base)")
    if request["optimizer"] in ("adamw", "sgd") and not request["lora_rank"]:  # adapters' states are small
        changes.append("8-bit AdamW")
    if not request["gradient_checkpointing"]:
        changes.append("gradient checkpointing")
    if request["shard"] not in ("zero3", "fsdp"):
        changes.append("sharding over more GPUs")
    return changes


def plan_document(result: Plan) -> dict:
    """A plan's JSON document (`plan --json`, `/plan`): the planner's numbers and the sentence on what fits are
    decided on (`fit_words`)."""
    document = result.to_dict()
    return {**document, "fit_words": fit_basis_words(document)}


def summary_markdown(result: Plan) -> str:
    device, request, fit_words = result.device, result.request, largest_fit_words(result.to_dict())
    fits = " · ".join(f"{gb} GB: {'fits ✅' if ok else 'does not fit ❌'}" for gb, ok in result.fits.items())
    training = (f"LoRA r={request.lora_rank}" + (" on a 4-bit base (QLoRA)" if request.qlora else "")
                if request.lora_rank else "full fine-tune")
    memory = device.memory
    lines = [
        f"**{request.model}**: {device.params / 1e9:.2f}B parameters, {device.trainable_params / 1e6:,.1f}M "
        f"trained ({training}); attention `{result.attention}`.",
        f"**Peak per device: {device.peak_bytes / GIB:,.1f} GiB** of live tensors at `{device.peak_moment}` "
        f"(max_memory_allocated); {memory.reserved.bytes / GIB:,.1f} GiB reserved by PyTorch's caching allocator "
        f"(max_memory_reserved); **{memory.device_used.bytes / GIB:,.1f} GiB used on the card** as nvidia-smi "
        f"shows it (+ CUDA context). Per card size: {fits}.",
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


def _live_stack(axes, position: int, device: DeviceEstimate) -> float:
    """What is alive at the estimate's peak stacked by category at `position`, and the card's use as a black mark over
    it (what the fit is decided on); the taller of the two, in GiB."""
    bottom = 0.0
    for category in CATEGORIES:
        value = device.live_by_moment[device.peak_moment].get(category, 0) / GIB
        axes.bar(position, value, bottom=bottom, color=MEMORY_CATEGORY_COLORS[category], edgecolor="white",
                 linewidth=0.5, width=0.55)
        bottom += value
    used = device.memory.device_used.bytes / GIB
    axes.hlines(used, position - 0.3, position + 0.3, colors="black", linewidth=1.5)
    return max(bottom, used)


def _peak_labels(device: DeviceEstimate, chosen: bool) -> list[BarLabel]:
    """Over a bar, from the bottom up: the card's use (the black mark), then the live tensors at their peak moment;
    bold for the layout asked."""
    live = sum(device.live_by_moment[device.peak_moment].values()) / GIB
    return [BarLabel((f"{device.memory.device_used.bytes / GIB:,.1f} GiB on the card",), bold=chosen),
            BarLabel((f"{live:,.1f} GiB live at {device.peak_moment}",), bold=chosen, max_lines=3)]


def bars_figure(padded: DeviceEstimate, packed: DeviceEstimate, chosen_packed: bool,
                width_in: float = RESULT_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    """What is alive at each estimate's peak, stacked by category, with the common GPU sizes drawn across."""
    figure = Figure(figsize=(width_in, 4.6), dpi=dpi, layout="constrained")
    axes = figure.add_subplot()
    tops = [_live_stack(axes, position, device) for position, device in enumerate((padded, packed))]
    axes.set_xticks([0, 1], ["padded", "packed (padding-free)"])
    axes.set_xlim(-0.6, 1.6)
    axes.set_ylabel("GiB per device at the peak of a step")
    # Under the axes, where it covers no bar; the context is not a tensor: it is in the black mark.
    figure.legend(handles=[Patch(color=MEMORY_CATEGORY_COLORS[c], label=c) for c in CATEGORIES if c != "context"],
                  fontsize=7, ncols=3, loc="outside lower center", frameon=False)
    axes.set_title(wrap_lines("Will it fit? Memory alive at the peak, per category\n(black mark: used on the card, "
                              "with allocator cache and CUDA context; dashed: common GPU sizes)",
                              int(width_in * TITLE_CHARS_PER_IN)), fontsize=10)
    [(unit_pt, height_pt)] = axes_sizes_pt(figure)
    stacks = [(top, stack_labels(axes, position, top, _peak_labels(device, (position == 1) == chosen_packed),
                                 unit_pt - 4))
              for position, (top, device) in enumerate(zip(tops, (padded, packed)))]
    # Room for the 24 GB line once a plan is a quarter of it; a toy model's bars would vanish under it.
    axes.set_ylim(0, max(top_for(stacks, height_pt), 26.5 if max(tops) > 6 else 0.0))
    _gpu_lines(axes)
    return figure


def scaling_figure(result: Plan, width_in: float = RESULT_WIDTH_IN, *, dpi: float = FIGURE_DPI) -> Figure:
    """Peak per device against the sequence length, padded and packed, at the request's batch size."""
    figure = Figure(figsize=(width_in, 4.6), dpi=dpi, layout="constrained")
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


# ---- the CLI's text ------------------------------------------------------------------------------------------------

def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:,.2f}"


def format_plan(document: dict) -> str:
    """A plan document as the CLI prints it: the request, memory per device by category, the three numbers with
    what each predicts, which GPU sizes fit, the largest sizes and the curve over sequence lengths."""
    request = document["request"]
    lora = f", LoRA r={request['lora_rank']}" + (" (QLoRA 4-bit base)" if request["qlora"] else "") \
        if request["lora_rank"] else ", full fine-tune"
    batch = (f"{request['batch_size']} examples of {request['dataset']} cut to {request['seq_length']}"
             if request["dataset"] else f"{request['batch_size']} x {request['seq_length']} tokens")
    base = f"{request['base_dtype']} base" + (f", {request['adapter_dtype']} adapters" if request["lora_rank"] else "")
    lines = [
        f"{document['model']} ({document['config']} {document['model_head']}, {document['params'] / 1e9:.2f}B "
        f"params, {document['trainable_params'] / 1e6:,.1f}M trainable{lora})",
        f"batch {batch}, {'packed' if request['packed'] else 'padded'}, {request['precision']} ({base}), "
        f"{request['optimizer']} ({request['optimizer_impl']}), {request['loss']} loss, attention "
        f"{document['attention']}"
        + (", gradient checkpointing" if request["gradient_checkpointing"] else "")
        + (f", {request['grad_accum']} micro-batches per step" if request["grad_accum"] > 1 else "")
        + (f", {request['gpus']} GPUs ({request['shard']})" if request["gpus"] > 1 else ""),
        "",
        f"{'per device':<18}{'GiB':>8}",
    ]
    lines += [f"  {category:<16}{_gib(document['per_device'][category]):>8}" for category in CATEGORIES]
    low, high = document["device_used_range_bytes"]
    lines += [
        f"  {'live peak':<16}{_gib(document['total_bytes']):>8}  at {document['peak_moment']} "
        f"(max_memory_allocated)",
        f"  {'reserved':<16}{_gib(document['reserved_bytes']):>8}  (max_memory_reserved: + allocator rounding, "
        f"workspaces, cache" + (", stranded segments"
                                if document["reserve_terms"].get("stranded_segments") else "") + ")",
        f"  {'device used':<16}{_gib(document['device_used_bytes']):>8}  (nvidia-smi: + CUDA context, NCCL; "
        f"range {_gib(low)}-{_gib(high)})",
        "",
        "fits: " + "  ".join(f"{gb} GB {'yes' if ok else 'no'}" for gb, ok in document["fits"].items()),
        document["fit_words"],
        largest_fit_words(document),
        "",
        "seq length   padded GiB   packed GiB   (device used)",
    ]
    lines += [f"  {row['seq_length']:>9,}   {_gib(row['padded_bytes']):>10}   {_gib(row['packed_bytes']):>10}"
              for row in document["scaling"]]
    lines += [f"note: {note}" for note in document["notes"]]
    return "\n".join(lines)

