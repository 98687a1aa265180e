"""A memory plan in words: the sentences the page and the CLI share, the page's summary (`summary_markdown`: the model,
the peak per device, which GPU sizes it fits, the largest batch and length), the plan's JSON document (`plan --json`,
`/plan`) and the CLI's text. No figures here: the CLI prints a plan without importing a plotting library (plan_views.py draws
the page's figures)."""

from __future__ import annotations

from typing import Callable

from demo_core import GIB, Plan
from demo_core import MEMORY_CATEGORIES as CATEGORIES
from demo_core.config import resolved_checkpointing
from presentation.speed_text import throughput_lines, throughput_markdown


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


# What lowers a plan's memory, each with the test that the request has not made that change already. The tests read
# the request's resolved settings (PlanRequest.validated: checkpointing "auto" is on for LoRA), and resolve again
# what a document may still carry as "auto", so a hint never names a change its own request has made. QLoRA is named
# by what it changes over LoRA, a 4-bit base, with its setting's name: a request with LoRA on is not told "LoRA".
_CHANGES_THAT_NEED_LESS: tuple[tuple[str, Callable[[dict], bool]], ...] = (
    ("LoRA", lambda request: not request["lora_rank"]),
    ("a 4-bit base (qlora)", lambda request: bool(request["lora_rank"]) and not request["qlora"]),
    ("8-bit AdamW",  # an adapter's states are small: a full fine-tune's are what 8 bits shrink
     lambda request: request["optimizer"] in ("adamw", "sgd") and not request["lora_rank"]),
    ("gradient checkpointing",
     lambda request: not resolved_checkpointing(request["gradient_checkpointing"], request["lora_rank"])),
    ("sharding over more GPUs", lambda request: request["shard"] not in ("zero3", "fsdp")),
)


def changes_that_need_less(request: dict) -> list[str]:
    """What would lower a plan's memory that its request has not done already, in the order worth trying."""
    return [words for words, not_made in _CHANGES_THAT_NEED_LESS if not_made(request)]


def plan_document(result: Plan) -> dict:
    """A plan's JSON document (`plan --json`, `/plan`): the planner's numbers and the sentence on what fits are
    decided on (`fit_words`)."""
    document = result.to_dict()
    return {**document, "fit_words": fit_basis_words(document)}


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
    if "throughput" in document:
        lines += ["", *throughput_lines(document["throughput"], request["gpus"])]
    lines += [f"note: {note}" for note in document["notes"]]
    return "\n".join(lines)


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
    if result.throughput is not None:
        lines.append(throughput_markdown(result.throughput, request.gpus))
    notes = "\n".join(f"- {note}" for note in result.notes)
    return "\n\n".join(lines + ([notes] if notes else []))
