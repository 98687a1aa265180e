"""The memory estimate next to published numbers: the tables of docs/MEMORY.md ("Published measurements").

    python benchmarks/memory_published.py

1. The HF "model training anatomy" page: bert-large-uncased, batch 4 x 512, fp32 AdamW on a V100, 14,949 MB.
2. transformers PR #31629 (DataCollatorWithFlattening): Llama-2-7B on OrcaMath, FSDP over 8 GPUs, peak memory
   22,305 MB padded -> 20,950 MB packed. The PR does not give batch size, length, precision or checkpointing, so
   the planner runs a few plausible settings and the comparable number is the relative change.
3. Korthikanti et al. 2022 (Megatron): activations per layer s*b*h*(34 + 5*a*s/h) bytes (16-bit, dropout on), or
   34*s*b*h without the attention scores (flash attention / selective recomputation), at the Llama-2-7B shape,
   against this estimate's per-layer bytes for the same shape.
Runs nothing on a GPU and trains nothing: every number is the estimator's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo_core.memory_estimate import (SEED_MEASURED_MB, StepShape, TrainingSettings,  # noqa: E402
                                       estimate_memory_detail, seed_example_estimate)
from demo_core.planner import PlanRequest, load_config, plan  # noqa: E402

MB = 2 ** 20  # MiB, as torch and nvidia-smi count
PR_31629_MB = {"padded": 22_305, "packed": 20_950}


def seed_table() -> list[str]:
    seed = seed_example_estimate()
    rows = [f"| {category} | {value / MB:,.0f} |" for category, value in seed["categories"].items()]
    return ["| category | MiB |", "|---|---|", *rows,
            f"| estimated peak ({seed['peak_moment']}) | {seed['peak_bytes'] / MB:,.0f} |",
            f"| measured (nvidia-smi, the anatomy page) | {SEED_MEASURED_MB:,} |",
            f"| estimate - measured | {(seed['peak_bytes'] / MB - SEED_MEASURED_MB):+,.0f} "
            f"({seed['peak_bytes'] / MB / SEED_MEASURED_MB - 1:+.1%}) |"]


def pr_31629_table() -> list[str]:
    rows = ["| per-device batch | max length | checkpointing | padded MiB | packed MiB | change |",
            "|---|---|---|---|---|---|"]
    for batch_size, seq_length, checkpointing in ((4, 1024, False), (8, 1024, False), (8, 1024, True),
                                                  (16, 2048, True)):
        peaks = {}
        for packed in (False, True):
            request = PlanRequest(model="Llama-2-7b-hf", dataset="orcamath-like", samples=2048, packed=packed,
                                  batch_size=batch_size, seq_length=seq_length, precision="bf16",
                                  attention="flash_attention_2", gradient_checkpointing=checkpointing, gpus=8,
                                  shard="fsdp")
            peaks[packed] = plan(request).device.peak_bytes / MB
        rows.append(f"| {batch_size} | {seq_length} | {'yes' if checkpointing else 'no'} | {peaks[False]:,.0f} | "
                    f"{peaks[True]:,.0f} | {peaks[True] / peaks[False] - 1:+.1%} |")
    published = PR_31629_MB["packed"] / PR_31629_MB["padded"] - 1
    rows.append(f"| PR #31629 (settings not given) | | | {PR_31629_MB['padded']:,} | {PR_31629_MB['packed']:,} | "
                f"{published:+.1%} |")
    return rows


def korthikanti_table() -> list[str]:
    config = load_config("Llama-2-7b-hf")
    h, a, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    rows = ["| s x b | Korthikanti, scores kept | Korthikanti, no scores | this estimate, sdpa | "
            "this estimate, flash (CUDA) |",
            "|---|---|---|---|---|"]
    for s, b in ((2048, 1), (4096, 1)):
        full = s * b * h * (34 + 5 * a * s / h)
        no_scores = 34 * s * b * h
        ours = {}
        for attention in ("sdpa", "flash_attention_2"):
            settings = TrainingSettings(precision="bf16", attention=attention, device_type="cuda")
            terms = estimate_memory_detail(config, StepShape(b, s), settings).activation_terms
            per_layer = sum(v for k, v in terms.items() if k.startswith("layers.") or k.startswith("attention_"))
            ours[attention] = per_layer / layers
        rows.append(f"| {s} x {b} | {full / MB:,.0f} MiB | {no_scores / MB:,.0f} MiB | {ours['sdpa'] / MB:,.0f} MiB | "
                    f"{ours['flash_attention_2'] / MB:,.0f} MiB |")
    return rows


if __name__ == "__main__":
    for title, table in (("bert-large seed (HF anatomy page)", seed_table),
                         ("Llama-2-7B, OrcaMath, FSDP x 8 (transformers PR #31629)", pr_31629_table),
                         ("Activations per layer, Llama-2-7B shape, bf16", korthikanti_table)):
        print(f"\n{title}\n")
        print("\n".join(table()))
