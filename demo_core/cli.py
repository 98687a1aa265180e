"""`python -m demo_core compare ...`: the engine headless. Prints a table; `--json PATH` writes the document.

Bad input exits 2 with one line `error: ...` on stderr and no traceback (argparse's own errors included).
"""

from __future__ import annotations

import argparse
import sys

from . import distributed
from .attention import capability_table
from .cli_plan import add_plan_parser, run_plan
from .collators import collator_names
from .config import ATTENTION_NAMES, DEVICE_NAMES, OPTIMIZER_NAMES, PRECISION_NAMES, RunConfig
from .engine import run_comparison
from .errors import DemoInputError
from .models import PRESETS
from .report import format_report, text_table
from .results import write_json


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump: the contract for bad input
        raise DemoInputError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m demo_core", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    compare = commands.add_parser("compare", help="run a short training burst per collator and compare them")
    defaults = RunConfig()
    compare.add_argument("--model", default=defaults.model, help=f"preset ({', '.join(PRESETS)}), hub id or folder")
    compare.add_argument("--dataset", default=defaults.dataset, help="flan-like, orcamath-like, a .json/.jsonl file "
                         "or a hub dataset id")
    compare.add_argument("--samples", default=defaults.samples, help="examples to sample from the dataset")
    compare.add_argument("--collators", default=",".join(defaults.collators),
                         help=f"comma list of: {', '.join(collator_names())}")
    compare.add_argument("--steps", default=defaults.steps, help="optimizer steps per collator (step 1 is warm-up)")
    compare.add_argument("--batch-size", default=defaults.batch_size, help="examples per step (bfd: packed rows)")
    compare.add_argument("--attention", default=defaults.attention, choices=ATTENTION_NAMES)
    compare.add_argument("--seed", default=defaults.seed)
    compare.add_argument("--max-length", default=defaults.max_length, help="truncate examples to this many tokens")
    compare.add_argument("--precision", default=defaults.precision, choices=PRECISION_NAMES)
    compare.add_argument("--optimizer", default=defaults.optimizer, choices=OPTIMIZER_NAMES)
    compare.add_argument("--learning-rate", default=defaults.learning_rate, help="constant learning rate "
                         f"(default {defaults.learning_rate:g}; LoRA adapters usually train at 1e-4 to 1e-3)")
    compare.add_argument("--device", default=defaults.device, choices=DEVICE_NAMES)
    compare.add_argument("--gradient-checkpointing", action="store_true",
                         help="keep each layer's input only and recompute the layer in backward")
    compare.add_argument("--lora-rank", default=defaults.lora_rank, help="train LoRA adapters of this rank through "
                         "peft instead of every weight (0: full fine-tune)")
    compare.add_argument("--lora-targets", default=",".join(defaults.lora_targets),
                         help="comma list of module names LoRA adapts (e.g. q_proj,v_proj), or all-linear (every "
                         "linear layer but the output layer)")
    compare.add_argument("--qlora", action="store_true", help="LoRA on a 4-bit NF4 base (bitsandbytes, CUDA only)")
    compare.add_argument("--threads", default=None, help="CPU threads for training (default 1 on a CPU: with more, "
                         "every parallel operator waits for a thread the OS gave to other work, and a shared "
                         "machine's speedups swing 2x; on a dedicated machine, its core count)")
    compare.add_argument("--json", metavar="PATH", help="write the full result document here")
    caps = commands.add_parser("capabilities", help="which attention path works for which model family and device")
    caps.add_argument("--models", default="tiny-llama,tiny-mistral,tiny-qwen2,tiny-gemma,tiny-phi3,tiny-granite,tiny-gpt2")
    add_plan_parser(commands)
    return parser


def _compare(args) -> None:
    config = RunConfig(
        model=args.model, dataset=args.dataset, samples=args.samples, collators=args.collators, steps=args.steps,
        batch_size=args.batch_size, attention=args.attention, seed=args.seed, max_length=args.max_length,
        precision=args.precision, optimizer=args.optimizer, learning_rate=args.learning_rate, device=args.device,
        gradient_checkpointing=args.gradient_checkpointing, threads=args.threads, lora_rank=args.lora_rank,
        lora_targets=args.lora_targets, qlora=args.qlora,
    )
    document = run_comparison(config).to_dict()
    distributed.close()
    if not distributed.is_main_process():
        return  # under a launcher rank 0 reports for the whole group; the others exit 0 quietly
    if args.json:
        write_json(document, args.json)
    print(format_report(document))


def _capabilities(args) -> None:
    from .models import load_model_source

    configs = {name: load_model_source(name).config for name in args.models.split(",") if name}
    rows = [["model", "attention", "device", "works", "why"]]
    rows += [[r["model"], r["attention"], r["device"], "yes" if r["works"] else "no", r["why"]]
             for r in capability_table(configs)]
    print(text_table(rows))


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        {"compare": _compare, "capabilities": _capabilities, "plan": run_plan}[args.command](args)
    except DemoInputError as error:
        print(f"error: {error}", file=sys.stderr)
        distributed.wait_for_failing_ranks()  # under a launcher: let every rank print it before any exits
        return 2
    except OSError as error:  # e.g. --json into a folder that does not exist
        print(f"error: {error.strerror or error}: {error.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    return 0
