"""`python -m demo_core plan ...`: will this fine-tune fit? Memory per device without training (planner.py).

cli.py registers it with `add_plan_parser(commands)` and dispatches "plan" to `run_plan(args)`; bad input raises
DemoInputError, which cli.py prints as one `error: ...` line with exit status 2, as for `compare`.
"""

from __future__ import annotations

from demo_core.memory.measure import CATEGORIES
from demo_core.memory.planner import GIB, PlanRequest, largest_fit_words, plan
from demo_core.results import write_json
from demo_core.settings import add_arguments, from_arguments


def add_plan_parser(commands) -> None:
    """The `plan` subcommand on cli.py's subparsers (their parser class turns argparse errors into DemoInputError)."""
    parser = commands.add_parser("plan", help="memory per device of a fine-tune, without training: does it fit?")
    add_arguments(parser, PlanRequest)  # a flag per declared setting (planner.py, settings.py)
    parser.add_argument("--json", metavar="PATH", help="write the plan here")


def run_plan(args) -> None:
    request = from_arguments(PlanRequest, args)
    if request.device == "cuda" and request.context_gb is None:
        _initialise_cuda()  # so the plan measures this machine's context instead of assuming one
    document = plan(request).to_dict()
    if args.json:
        write_json(document, args.json)
    print(format_plan(document))


def _initialise_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:,.2f}"


def format_plan(document: dict) -> str:
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
        f"workspaces, cache)",
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

