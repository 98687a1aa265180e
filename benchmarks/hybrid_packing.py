"""Hybrids with per-example mixers: how exact, what plain padding-free does without them, what the loop costs.

For each family of tests/hybrid_families.py (the tiny random hybrids tests/test_hybrid_packing.py checks), in fp32 on
the CPU, one intra-op thread:
  with fix           max |Δlogit| of each example in the engine's flatten row vs the example alone on eager, over the
                     logit scale (preflight's measure), per-example mixers installed
  without fix        the same with transformers' mixers (hybrid_hazard.measure_hazard): position_ids only, and with
                     TRL padding_free's keys (cu_seq_lens, seq_idx), where most fallbacks raise
  padded ms          forward + backward of the batch right-padded (the mixers' original path)
  packed ms          forward + backward of the flattened row with the per-example loop
  one-call ms        the same row through each mixer once (transformers' mixers: contaminated, but what a varlen
                     kernel's single call costs here); loop overhead = packed / one-call
The batch: `--examples` flan-like examples (data.builtin_records, byte tokens, cut at --max-length); each time is
the fastest of `--repeats`, since noise on a shared machine only adds time.

    python benchmarks/hybrid_packing.py                         # prints the markdown table
    python benchmarks/hybrid_packing.py --doc docs/HYBRID_PACKING.md   # rewrites the table between its markers
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from demo_core.attention import hybrid_hazard  # noqa: E402
from demo_core.attention.varlen import VARLEN  # noqa: E402
from demo_core.collators import FlattenCollator, PaddedCollator  # noqa: E402
from demo_core.data import loading as data  # noqa: E402
from demo_core.models import hybrid_mixers  # noqa: E402
from demo_core.models.sources import byte_tokenizer  # noqa: E402

from hybrid_families import HYBRID_FAMILIES  # noqa: E402

BEGIN, END = "<!-- hybrid-packing:begin -->", "<!-- hybrid-packing:end -->"
EXACT_LENGTHS = (13, 6, 10)


def _model(family, attn_implementation: str) -> torch.nn.Module:
    transformers.set_seed(0)
    return transformers.AutoModelForCausalLM.from_config(family.make_config(), attn_implementation=attn_implementation)


def _examples(lengths) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, 384, (n,), generator=generator).tolist() for n in lengths]


def _without_labels(batch: dict) -> dict:
    return {key: value for key, value in batch.items() if key != "labels"}


@torch.no_grad()
def exactness(family) -> tuple[float, list[hybrid_hazard.LayoutHazard]]:
    """(max relative |Δlogit| of the flatten row with the fix, the hazard readings without it)."""
    examples = _examples(EXACT_LENGTHS)
    reference = _model(family, "eager").eval()
    alone = [reference(input_ids=torch.tensor([ids]), use_cache=False).logits[0] for ids in examples]
    model = _model(family, VARLEN).eval()
    hybrid_mixers.install(model)
    batch = _without_labels(FlattenCollator(byte_tokenizer())([{"input_ids": ids} for ids in examples]))
    pieces = torch.split(model(**batch, use_cache=False).logits[0], list(EXACT_LENGTHS))
    scale = max(1.0, max(float(logits.abs().max()) for logits in alone))
    with_fix = max(float((piece - ref).abs().max()) for piece, ref in zip(pieces, alone)) / scale
    return with_fix, hybrid_hazard.measure_hazard(model, examples)


def _step_s(model, batch: dict, repeats: int) -> float:
    """Fastest forward + backward of `batch` over `repeats` (one untimed warm-up first)."""
    times = []
    for repeat in range(repeats + 1):
        start = time.perf_counter()
        model(**batch, use_cache=False).loss.backward()
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        if repeat:
            times.append(elapsed)
    return min(times)


def costs(family, examples: list[list[int]], repeats: int) -> dict[str, float]:
    tokenizer = byte_tokenizer()
    features = [{"input_ids": ids} for ids in examples]
    model = _model(family, VARLEN).train()
    padded = _step_s(model, PaddedCollator(tokenizer)(features), repeats)
    flat = FlattenCollator(tokenizer)(features)
    one_call = _step_s(model, {key: flat[key] for key in ("input_ids", "position_ids", "labels")}, repeats)
    hybrid_mixers.install(model)
    packed = _step_s(model, flat, repeats)
    return {"padded_s": padded, "packed_s": packed, "one_call_s": one_call}


def _hazard_cell(reading: hybrid_hazard.LayoutHazard) -> str:
    if reading.error is not None:
        return "raises ValueError" if reading.error.startswith("ValueError") else reading.error.split(":")[0]
    return f"{reading.max_abs_logit_diff / reading.logit_scale:.1e}"


def row(family, examples, repeats) -> list[str]:
    with_fix, hazard = exactness(family)
    readings = {reading.layout: reading for reading in hazard}
    cost = costs(family, examples, repeats)
    return [family.name, family.feature, f"{with_fix:.1e}", _hazard_cell(readings["position_ids"]),
            _hazard_cell(readings["trl_padding_free"]), f"{cost['padded_s'] * 1e3:.0f}",
            f"{cost['packed_s'] * 1e3:.0f}", f"{cost['one_call_s'] * 1e3:.0f}",
            f"{cost['padded_s'] / cost['packed_s']:.2f}×", f"{cost['packed_s'] / cost['one_call_s']:.2f}×"]


def table(examples, repeats) -> str:
    lines = ["| family | mixer | \\|Δlogit\\| with fix | without fix, position_ids "
             "| without fix, TRL padding_free keys | padded ms | packed ms (loop) | one-call ms | padded / packed "
             "| loop / one call |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row(family, examples, repeats)) + " |" for family in HYBRID_FAMILIES]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=8, help="flan-like examples in the timed batch")
    parser.add_argument("--max-length", type=int, default=512, help="examples are cut to this many byte tokens")
    parser.add_argument("--repeats", type=int, default=5, help="timed forward + backward passes per layout")
    parser.add_argument("--doc", type=Path, help="rewrite the table between the markers in this file")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models: per-op overhead, not compute
    tokenizer = byte_tokenizer()
    examples = [tokenizer(record["text"])["input_ids"][: args.max_length]
                for record in data.builtin_records("flan-like", args.examples, seed=0)]
    lengths = sorted(len(ids) for ids in examples)
    text = (f"transformers {transformers.__version__}, torch {torch.__version__}, fp32, CPU, 1 thread; timed batch: "
            f"{len(examples)} flan-like examples of {lengths[0]}-{lengths[-1]} byte tokens ({sum(lengths):,} real, "
            f"{len(lengths) * lengths[-1]:,} padded slots); `python benchmarks/hybrid_packing.py --doc "
            f"docs/HYBRID_PACKING.md`\n\n{table(examples, args.repeats)}")
    if args.doc is None:
        print(text)
        return
    document = args.doc.read_text()
    if BEGIN not in document or END not in document:
        raise SystemExit(f"{args.doc} has no {BEGIN} ... {END} markers")
    head, rest = document.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    args.doc.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
