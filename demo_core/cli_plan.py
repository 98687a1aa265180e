"""`python -m demo_core plan ...`: will this fine-tune fit? Memory per device without training (planner.py).

cli.py registers it with `add_plan_parser(commands)` and dispatches "plan" to `run_plan(args)`; bad input raises
DemoInputError, which cli.py prints as one `error: ...` line with exit status 2, as for `compare`.
"""

from __future__ import annotations

from .config import ESTIMATE_ATTENTION_NAMES, ESTIMATE_OPTIMIZER_NAMES, ESTIMATE_PRECISION_NAMES
from .memory_measure import CATEGORIES
from .models import PRESETS
from .planner import (DEFAULT_CUDA_CONTEXT_GB, GIB, SHARDING_NAMES, PlanRequest, largest_fit_words, plan,
                      shipped_configs)
from .results import write_json


def add_plan_parser(commands) -> None:
    """The `plan` subcommand on cli.py's subparsers (their parser class turns argparse errors into DemoInputError)."""
    defaults = PlanRequest(model="")
    parser = commands.add_parser("plan", help="memory per device of a fine-tune, without training: does it fit?")
    parser.add_argument("--model", required=True, help=f"preset ({', '.join(PRESETS)}), shipped config "
                        f"({', '.join(shipped_configs())}), or a hub id / folder whose config.json is local")
    parser.add_argument("--batch-size", default=defaults.batch_size, help="examples per step and device")
    parser.add_argument("--seq-length", default=defaults.seq_length,
                        help="tokens per example; with --dataset, examples are cut to this length")
    parser.add_argument("--dataset", help="a length profile instead of equal lengths: flan-like, orcamath-like, a "
                        ".json/.jsonl file or a hub dataset id; the batch that needs the most memory is planned")
    parser.add_argument("--samples", default=defaults.samples, help="examples drawn for the length profile")
    parser.add_argument("--packed", action="store_true", help="padding-free: each batch in one row")
    parser.add_argument("--precision", default=defaults.precision, choices=ESTIMATE_PRECISION_NAMES,
                        help="bf16/fp16: autocast over fp32 weights (Trainer's bf16=True); pure-bf16: bf16 weights")
    parser.add_argument("--optimizer", default=defaults.optimizer, choices=ESTIMATE_OPTIMIZER_NAMES)
    parser.add_argument("--attention", default=defaults.attention, choices=("auto",) + ESTIMATE_ATTENTION_NAMES)
    parser.add_argument("--lora-rank", default=defaults.lora_rank, help="0: full fine-tune")
    parser.add_argument("--lora-targets", default=defaults.lora_targets,
                        help="comma list of module names (q_proj,v_proj,...) or all-linear")
    parser.add_argument("--qlora", action="store_true", help="4-bit NF4 base weights (needs --lora-rank)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--gpus", default=defaults.gpus)
    parser.add_argument("--shard", default=defaults.shard, choices=SHARDING_NAMES,
                        help="none: DDP; zero1/zero2/zero3/fsdp shard optimizer, + gradients, + weights")
    parser.add_argument("--device", default=defaults.device, choices=("cuda", "cpu"))
    parser.add_argument("--gpu-gb", default=defaults.gpu_gb, help="GPU size for the largest batch and length")
    parser.add_argument("--context-gb", default=None,
                        help=f"measured CUDA context per process (default on cuda: {DEFAULT_CUDA_CONTEXT_GB} GiB)")
    parser.add_argument("--seed", default=defaults.seed, help="for the length profile's sample")
    parser.add_argument("--json", metavar="PATH", help="write the plan here")


def run_plan(args) -> None:
    request = PlanRequest(
        model=args.model, batch_size=args.batch_size, seq_length=args.seq_length, dataset=args.dataset,
        samples=args.samples, packed=args.packed, precision=args.precision, optimizer=args.optimizer,
        attention=args.attention, gradient_checkpointing=args.gradient_checkpointing, lora_rank=args.lora_rank,
        lora_targets=args.lora_targets, qlora=args.qlora, gpus=args.gpus, shard=args.shard, device=args.device,
        gpu_gb=args.gpu_gb, context_gb=args.context_gb, seed=args.seed,
    )
    document = plan(request).to_dict()
    if args.json:
        write_json(document, args.json)
    print(format_plan(document))


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:,.2f}"


def format_plan(document: dict) -> str:
    request = document["request"]
    lora = f", LoRA r={request['lora_rank']}" + (" (QLoRA 4-bit base)" if request["qlora"] else "") \
        if request["lora_rank"] else ", full fine-tune"
    batch = (f"{request['batch_size']} examples of {request['dataset']} cut to {request['seq_length']}"
             if request["dataset"] else f"{request['batch_size']} x {request['seq_length']} tokens")
    lines = [
        f"{document['model']} ({document['config']}, {document['params'] / 1e9:.2f}B params, "
        f"{document['trainable_params'] / 1e6:,.1f}M trainable{lora})",
        f"batch {batch}, {'packed' if request['packed'] else 'padded'}, {request['precision']}, "
        f"{request['optimizer']}, attention {document['attention']}"
        + (", gradient checkpointing" if request["gradient_checkpointing"] else "")
        + (f", {request['gpus']} GPUs ({request['shard']})" if request["gpus"] > 1 else ""),
        "",
        f"{'per device':<18}{'GiB':>8}",
    ]
    lines += [f"  {category:<16}{_gib(document['per_device'][category]):>8}" for category in CATEGORIES]
    lines += [
        f"  {'peak':<16}{_gib(document['total_bytes']):>8}  at {document['peak_moment']}",
        "",
        "fits: " + "  ".join(f"{gb} GB {'yes' if ok else 'no'}" for gb, ok in document["fits"].items()),
        largest_fit_words(document),
        "",
        "seq length   padded GiB   packed GiB",
    ]
    lines += [f"  {row['seq_length']:>9,}   {_gib(row['padded_bytes']):>10}   {_gib(row['packed_bytes']):>10}"
              for row in document["scaling"]]
    lines += [f"note: {note}" for note in document["notes"]]
    return "\n".join(lines)

