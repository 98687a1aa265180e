"""Does padding-free packing win as much as the padding says it should? Paired timing in one process.

For each model x dataset x attention, `padded` and `flatten` train on the same batches from the same initial
weights, alternating step by step (AB, then BA on the repeat), so both see the same machine load; each step's time
is the fastest of its repeats, since noise on a shared machine only ever adds time. Reported per pair:
  pad fraction      padded slots that hold padding (timed steps)
  ideal speedup     padded slots / real tokens: the speedup if step time were proportional to slots
  measured speedup  the engine's (results.compare): trimmed mean time per token slot over the timed steps,
                    padded over flatten, on the fastest repeat of each step
  ratio to ideal    measured / ideal
  work ideal        padded FLOPs / flatten FLOPs under the engine's cost model (demo_core/work.py): unlike the
                    ideal it counts attention, which the padded baseline skips on padding too under varlen (as under
                    flash_attention_2), so it does not shrink with packing
  ratio to work     measured / work ideal
  collate share     batch building time / (batch building + step), flatten's and padded's
Step 1 is warm-up and left out, as in the engine's results; the optimizer is the engine's (fused AdamW). Writes
`packing_speed.md` and `packing_speed.json` under --out.

    python benchmarks/packing_speed.py --out /tmp/packing-speed            # the CPU table in docs/RESULTS.md
    python benchmarks/packing_speed.py --profile --models tiny-llama ...   # plus a torch.profiler table per step
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere in the checkout

from demo_core.attention.capability import capability  # noqa: E402
from demo_core.collators import collator_spec, make_collator  # noqa: E402
from demo_core.data import loading as data  # noqa: E402
from demo_core.models.sources import load_model_source  # noqa: E402
from demo_core.results import Result, compare  # noqa: E402
from demo_core.throughput.work import (  # noqa: E402
    WorkModel,
    ideal_speedup,  # noqa: E402
    step_flops,
)

COLLATORS = ("padded", "flatten")


class PairedRun:
    """One model + optimizer + collator, stepped on demand so two of them can alternate."""

    def __init__(self, source, collator: str, attention: str, device: str, seed: int, learning_rate: float):
        self.collator_name, self.device = collator, device
        self.model = source.build(attention, torch.float32, seed=seed).to(device).train()
        self.model.config.use_cache = False  # a cache turns packing detection off
        # The engine's optimizer (trainers.training_arguments: adamw_torch_fused).
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate, weight_decay=0.0, fused=True)
        self.collator = make_collator(collator, source.tokenizer)

    def _synchronize(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self, features: list[dict], precision: str) -> tuple[float, float, float]:
        """(loss, step seconds, collate seconds) for one optimizer step on these examples."""
        batch = self.collator(features)
        collate_s = self.collator.pending_stats.popleft().collate_s
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        self._synchronize()
        started = time.perf_counter()
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._synchronize()
        return float(loss.detach()), time.perf_counter() - started, collate_s


def run_pair(source, examples, attention: str, args, device: str) -> list[Result]:
    runs = [PairedRun(source, name, attention, device, args.seed, args.learning_rate) for name in COLLATORS]
    work = WorkModel.of(runs[0].model)
    records = {name: {"losses": [], "times": [], "collate": [], "real": [], "slots": [], "examples": [], "flops": []}
               for name in COLLATORS}
    for step in range(args.steps):
        features = [{"input_ids": ids} for ids in examples[step * args.batch_size:(step + 1) * args.batch_size]]
        best = {name: [float("inf"), float("inf")] for name in COLLATORS}
        for repeat in range(args.repeats):
            for run in runs if repeat % 2 == 0 else reversed(runs):
                loss, step_s, collate_s = run.step(features, args.precision)
                best[run.collator_name] = [min(best[run.collator_name][0], step_s),
                                           min(best[run.collator_name][1], collate_s)]
                if repeat == 0:  # both runs take the same optimizer steps, so first-repeat losses must agree
                    records[run.collator_name]["losses"].append(loss)
        lengths = [len(f["input_ids"]) for f in features]
        for name in COLLATORS:
            record, layout = records[name], collator_spec(name).layout
            record["times"].append(best[name][0])
            record["collate"].append(best[name][1])
            record["real"].append(sum(lengths))
            record["slots"].append(len(lengths) * max(lengths) if layout == "padded" else sum(lengths))
            record["examples"].append(len(lengths))
            record["flops"].append(step_flops(work, lengths, layout, attention))
    if args.profile:
        _profile(runs, examples, args, f"{source.name}-{attention}")
    return [
        Result(collator=name, attention=attention, device=device, precision=args.precision, steps=args.steps,
               losses=r["losses"], step_times_s=r["times"], step_real_tokens=r["real"], step_padded_slots=r["slots"],
               step_examples=r["examples"], step_collate_s=r["collate"], peak_memory_bytes=None, memory={},
               step_work_flops=r["flops"])
        for name, r in records.items()
    ]


def _profile(runs: list[PairedRun], examples, args, label: str) -> None:
    """Top operators of one more step per collator, written next to the table."""
    from torch.profiler import profile

    features = [{"input_ids": ids} for ids in examples[:args.batch_size]]
    for run in runs:
        with profile() as profiler:
            run.step(features, args.precision)
        table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
        path = Path(args.out) / f"profile-{label}-{run.collator_name}.txt"
        path.write_text(table)
        print(f"profile written: {path}")


def _row(model: str, dataset: str, attention: str, results: list[Result], ideal: float) -> dict:
    padded, flatten = results
    entry = compare(results, ideal)["flatten"]
    return {
        "model": model, "dataset": dataset, "attention": attention,
        "pad_fraction": padded.pad_fraction,
        "ideal_speedup": entry["ideal_speedup"],
        "measured_speedup": entry["speedup_vs_padded"],
        "speedup_range": entry["speedup_range"],
        "ratio_to_ideal": entry["ratio_to_ideal"],
        "work_ideal_speedup": entry["work_ideal_speedup"],
        "ratio_to_work_ideal": entry["ratio_to_work_ideal"],
        "collate_share_flatten": flatten.collate_time_share,
        "collate_share_padded": padded.collate_time_share,
        "padded_step_ms": 1000 * padded.step_time_median_s,
        "flatten_step_ms": 1000 * flatten.step_time_median_s,
        "max_abs_loss_diff": entry["max_abs_loss_diff_vs_padded"],
    }


def markdown(rows: list[dict]) -> str:
    header = ("| model | dataset | attention | pad fraction | ideal | measured | range | ratio to ideal | work ideal | "
              "ratio to work | collate share (flatten / padded) | step ms (padded / flatten) | max abs Δloss |")
    lines = [header, "|" + "---|" * 13]
    for r in rows:
        low, high = r["speedup_range"]
        lines.append(
            f"| {r['model']} | {r['dataset']} | {r['attention']} | {r['pad_fraction']:.1%} | "
            f"{r['ideal_speedup']:.2f}x | {r['measured_speedup']:.2f}x | {low:.2f}–{high:.2f}x | "
            f"{r['ratio_to_ideal']:.2f} | {r['work_ideal_speedup']:.2f}x | {r['ratio_to_work_ideal']:.2f} | "
            f"{r['collate_share_flatten']:.2%} / {r['collate_share_padded']:.2%} | "
            f"{r['padded_step_ms']:.0f} / {r['flatten_step_ms']:.0f} | {r['max_abs_loss_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-llama,small-llama")
    parser.add_argument("--datasets", default="flan-like,orcamath-like")
    parser.add_argument("--attentions", default="sdpa,varlen,flash_attention_2",
                        help="paths that cannot run here (capability table) are skipped with a note")
    parser.add_argument("--steps", type=int, default=7, help="steps per pair; the first is warm-up (at least 4: the "
                        "engine gives no speedup below 3 timed steps)")
    parser.add_argument("--repeats", type=int, default=2, help="timings per step per collator; the fastest counts")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--profile", action="store_true", help="also profile one step per collator")
    parser.add_argument("--out", default="runs/packing_speed")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    Path(args.out).mkdir(parents=True, exist_ok=True)
    started, load_before = time.perf_counter(), os.getloadavg()
    rows, skipped = [], []
    for model in args.models.split(","):
        source = load_model_source(model)
        for dataset in args.datasets.split(","):
            examples = data.load(dataset, source.tokenizer, args.steps * args.batch_size, args.seed,
                                 args.max_length).examples
            ideal = ideal_speedup(examples, args.batch_size, args.steps, profiled=[])  # no step profiled
            for attention in args.attentions.split(","):
                works, why = capability(source.config, attention, device)
                if not works:
                    skipped.append(f"{model} {attention} on {device}: {why}")
                    continue
                results = run_pair(source, examples, attention, args, device)
                rows.append(_row(model, dataset, attention, results, ideal))
                print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    environment = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": platform.machine(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]],
        "wall_s": time.perf_counter() - started,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
    }
    table = markdown(rows)
    notes = "".join(f"\n- skipped {line}" for line in dict.fromkeys(skipped))
    (Path(args.out) / "packing_speed.md").write_text(f"{table}\n{notes}\n")
    (Path(args.out) / "packing_speed.json").write_text(json.dumps({"environment": environment, "rows": rows,
                                                                   "skipped": skipped}, indent=2))
    print(f"\n{table}{notes}\n\n{json.dumps(environment)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
