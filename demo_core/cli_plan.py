"""`python -m demo_core plan ...`: will this fine-tune fit? Memory per device without training (planner.py).

cli.py registers it with `add_plan_parser(commands)` and dispatches "plan" to `run_plan(args)`; bad input raises
DemoInputError, which cli.py prints as one `error: ...` line with exit status 2, as for `compare`.
"""

from __future__ import annotations

import argparse

from .config import ESTIMATE_ATTENTION_NAMES, ESTIMATE_OPTIMIZER_NAMES, ESTIMATE_PRECISION_NAMES
from .memory_estimate import ADAPTER_DTYPE_NAMES
from .memory_measure import CATEGORIES
from .memory_reserve import CUDA_MODULE_LOADING_NAMES
from .models import PRESETS
from .planner import (BASE_DTYPE_NAMES, GIB, LOSS_NAMES, OPTIMIZER_IMPL_CHOICES, SHARDING_NAMES, PlanRequest,
                      largest_fit_words, plan, shipped_configs)
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
                        help="bf16/fp16: autocast (Trainer's bf16=True) over the --base-dtype weights; pure-bf16: "
                             "bf16 weights, gradients and optimizer state")
    parser.add_argument("--base-dtype", default=defaults.base_dtype, choices=BASE_DTYPE_NAMES,
                        help="the loaded weights under bf16/fp16: fp32 masters or half (loaded in bf16/fp16); "
                             "auto: half for LoRA/QLoRA, fp32 for a full fine-tune")
    parser.add_argument("--adapter-dtype", default=defaults.adapter_dtype, choices=ADAPTER_DTYPE_NAMES,
                        help="LoRA adapters in fp32 (peft's default) or in the base weights' dtype")
    parser.add_argument("--loss", default=defaults.loss, choices=LOSS_NAMES,
                        help="full: the model's loss over full logits; chunked: an LM-head loss in chunks (TRL "
                             "SFTTrainer, Liger, torchtune); auto: chunked for LoRA/QLoRA on a causal LM")
    parser.add_argument("--optimizer", default=defaults.optimizer, choices=ESTIMATE_OPTIMIZER_NAMES)
    parser.add_argument("--optimizer-impl", default=defaults.optimizer_impl, choices=OPTIMIZER_IMPL_CHOICES,
                        help="AdamW's step: fused (auto: Trainer's adamw_torch_fused, no scratch), foreach (a copy "
                             "of the states), single-tensor (a per-tensor loop)")
    parser.add_argument("--attention", default=defaults.attention, choices=("auto",) + ESTIMATE_ATTENTION_NAMES)
    parser.add_argument("--lora-rank", default=defaults.lora_rank, help="0: full fine-tune")
    parser.add_argument("--lora-targets", default=defaults.lora_targets,
                        help="comma list of module names (q_proj,v_proj,...) or all-linear")
    parser.add_argument("--qlora", action="store_true", help="4-bit NF4 base weights (needs --lora-rank)")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="default: on for LoRA/QLoRA (TRL's SFTTrainer), off for a full fine-tune")
    parser.add_argument("--grad-accum", default=defaults.grad_accum,
                        help="micro-batches per optimizer step (gradients live through the later forwards)")
    parser.add_argument("--keep-gradients", action="store_true",
                        help="zero_grad(set_to_none=False), torch < 2.0: gradients live through every step")
    parser.add_argument("--gpus", default=defaults.gpus)
    parser.add_argument("--shard", default=defaults.shard, choices=SHARDING_NAMES,
                        help="none: DDP; zero1/zero2/zero3/fsdp shard optimizer, + gradients, + weights; "
                             "fsdp-no-shard: FSDP's NO_SHARD (no DDP bucket copy)")
    parser.add_argument("--device", default=defaults.device, choices=("cuda", "cpu"))
    parser.add_argument("--gpu-gb", default=defaults.gpu_gb, help="GPU size for the largest batch and length")
    parser.add_argument("--context-gb", default=None,
                        help="measured CUDA context per process; default: measured on this machine's GPU, else the "
                             "published typical figure for --cuda-module-loading")
    parser.add_argument("--cuda-module-loading", default=defaults.cuda_module_loading,
                        choices=CUDA_MODULE_LOADING_NAMES,
                        help="the typical context when none is measured: lazy (CUDA >= 11.7, PyTorch's default) "
                             "or eager (older CUDA, CUDA_MODULE_LOADING=EAGER)")
    parser.add_argument("--seed", default=defaults.seed, help="for the length profile's sample")
    parser.add_argument("--json", metavar="PATH", help="write the plan here")


def run_plan(args) -> None:
    request = PlanRequest(
        model=args.model, batch_size=args.batch_size, seq_length=args.seq_length, dataset=args.dataset,
        samples=args.samples, packed=args.packed, precision=args.precision, optimizer=args.optimizer,
        attention=args.attention, gradient_checkpointing=args.gradient_checkpointing, lora_rank=args.lora_rank,
        lora_targets=args.lora_targets, qlora=args.qlora, gpus=args.gpus, shard=args.shard, device=args.device,
        gpu_gb=args.gpu_gb, context_gb=args.context_gb, seed=args.seed, base_dtype=args.base_dtype,
        adapter_dtype=args.adapter_dtype, loss=args.loss, optimizer_impl=args.optimizer_impl,
        grad_accum=args.grad_accum, keep_gradients=args.keep_gradients,
        cuda_module_loading=args.cuda_module_loading,
    )
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

