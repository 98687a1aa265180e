"""The step-time model on this CPU against real CPU bursts: predicted vs measured speedup of flatten over padded.

    python benchmarks/throughput_cpu.py                       # the table in docs/THROUGHPUT.md (minutes on 2 cores)
    python benchmarks/throughput_cpu.py --runs tiny-llama:flan-like:8 --steps 10

This CPU's rates are measured once (demo_core/throughput/cpu_rates.py), then for each preset x dataset x batch size
the engine prepares the run, the model predicts each collator's speedup from the run's own batches, and
`run_comparison` trains padded and flatten step by step in turn (the engine's paired timing) and measures it. All in
one process, so both see the same machine; CPU timing on a shared machine still swings, so read the ratio
predicted / measured, and the measured range the engine reports beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo_core import RunConfig, prepare, run_comparison  # noqa: E402
from demo_core.throughput.cpu_rates import measure_cpu_rates  # noqa: E402
from demo_core.throughput.run_prediction import predicted_speedups  # noqa: E402

DEFAULT_RUNS = ("tiny-llama:flan-like:8", "tiny-llama:orcamath-like:8", "tiny-qwen2:flan-like:8",
                "tiny-gpt2:flan-like:8", "tiny-llama:flan-like:16", "small-llama:flan-like:8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, help="model:dataset:batch_size")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    started = time.perf_counter()
    rates = measure_cpu_rates(threads=1)
    print(f"rates ({time.perf_counter() - started:.2f} s): matmul {rates.matmul_flops / 1e9:.1f} GFLOP/s, half at "
          f"{rates.matmul_half_tokens:.0f} tokens; attention {rates.attention_flops / 1e9:.1f} GFLOP/s; element-wise "
          f"{rates.memory_bytes_per_s / 1e9:.1f} GB/s; {rates.seconds_per_op * 1e6:.1f} us per op")
    print("| model | dataset | batch | slots ideal | predicted | measured (range) | predicted / measured |")
    print("|---|---|---|---|---|---|---|")
    for run in args.runs:
        model, dataset, batch = run.split(":")
        prepared = prepare(RunConfig(model=model, dataset=dataset, batch_size=int(batch), steps=args.steps,
                                     samples=args.samples, collators=("padded", "flatten")))
        predicted = predicted_speedups(prepared.resolved, prepared.source.config,
                                       [len(ids) for ids in prepared.examples], rates)["flatten"]
        entry = run_comparison(prepared).to_dict()["comparison"]["flatten"]
        measured, low_high = entry["speedup_vs_padded"], entry["speedup_range"]
        print(f"| {model} | {dataset} | {batch} | {entry['ideal_speedup']:.2f}x | {predicted:.2f}x | {measured:.2f}x "
              f"({low_high[0]:.2f}-{low_high[1]:.2f}x) | {predicted / measured:.2f} |", flush=True)


if __name__ == "__main__":
    main()
