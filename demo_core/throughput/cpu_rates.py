"""The step-time model on this machine's CPU: a short micro-benchmark of its rates, and a prepared run's predicted
speedups of every collator over padded (what `predicted_speedup_vs_padded` beside a measured speedup would hold).

`measure_cpu_rates` (well under 2 s, in the engine's thread count, fp32 as CPU bursts train):
- matmul FLOP/s of (T x hidden) @ (hidden x 4 hidden) at a few token counts T: the largest is the peak, and the
  token count where the rate halves is fitted from the smaller ones (rate = peak x T / (T + T_half));
- causal SDPA FLOP/s over a bucket of segments, as the varlen path runs them on a CPU (attention.py);
- element-wise bandwidth: bytes an add over activation-sized tensors reads and writes per second;
- per-op overhead: the time of an op on a one-element tensor (the dispatcher, autograd bookkeeping aside).
The run is then priced by the same `Costing` as a GPU, with these as the device's rates (all efficiencies 1: they
are measured rates) and no host/device overlap (a CPU thread dispatches and computes in turn).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from demo_core.config import RunConfig
from demo_core.isolation import torch_threads
from demo_core.segments import bucket_shapes
from demo_core.throughput.facts import ModelFacts, RunSettings
from demo_core.throughput.gpus import Device
from demo_core.throughput.predict import price_collators
from demo_core.throughput.step_time import Costing, Efficiencies

# Token counts the matmul rate is measured at (rows of the GEMM): a tiny preset's micro-batch spans about 500-6,000.
MATMUL_TOKENS = (256, 1024, 4096)
MATMUL_WIDTH = 128  # the tiny presets' hidden size (their MLP is 4x): the shapes CPU bursts multiply
SDPA_SHAPE = (8, 4, 256, 32)  # segments, heads, segment length, head dim
ELEMENTWISE_ELEMENTS = 1 << 20  # 4 MiB per fp32 tensor: a micro-batch's activations, not the caches'
# The Trainer's own Python per optimizer step around the model and the optimizer (docs/RESULTS.md time anatomy:
# 'other' 2-5 ms on the 2-core VM); stated, not measured here.
CPU_STEP_FIXED_S = 0.003
# Ops the CPU varlen path adds per attention call it makes (one per bucket of similar lengths, per layer): gathers,
# transposes, SDPA and the scatter back, forward and backward.
OPS_PER_ATTENTION_BUCKET = 22


@dataclasses.dataclass(frozen=True)
class CpuRates:
    matmul_flops: float  # peak, at the largest token count
    matmul_half_tokens: float
    attention_flops: float
    memory_bytes_per_s: float
    seconds_per_op: float
    threads: int


def _best_seconds(work, repeats: int) -> float:
    work()  # warm-up: allocations, first-call dispatch
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def measure_cpu_rates(threads: int | None = 1) -> CpuRates:
    """This CPU's rates in `threads` threads (None: torch's default). The fastest of a few repeats: noise on a
    shared machine only adds time."""
    with torch.no_grad(), torch_threads(threads):
        generator = torch.Generator().manual_seed(0)
        scalar = torch.ones(1)
        per_op_s = _best_seconds(lambda: [scalar.add(1.0) for _ in range(200)], 5) / 200
        weight = torch.randn(MATMUL_WIDTH, 4 * MATMUL_WIDTH, generator=generator)
        rates = {}
        for tokens in MATMUL_TOKENS:
            activations = torch.randn(tokens, MATMUL_WIDTH, generator=generator)
            # the op's own dispatch is priced as an op: the rate is the arithmetic's
            seconds = max(_best_seconds(lambda: activations @ weight, 7) - per_op_s, 1e-9)
            rates[tokens] = 2 * tokens * MATMUL_WIDTH * 4 * MATMUL_WIDTH / seconds
        peak = max(rates.values())
        # rate(T) = peak x T / (T + T_half)  =>  T_half = T x (peak / rate - 1), averaged over the smaller sizes
        halves = [tokens * (peak / rate - 1) for tokens, rate in rates.items() if rate < peak]
        segments, heads, length, dim = SDPA_SHAPE
        query = torch.randn(segments, heads, length, dim, generator=generator)
        sdpa_s = _best_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(query, query, query,
                                                                                      is_causal=True), 3)
        attention_flops = 4 * heads * dim * segments * length * (length + 1) / 2 / sdpa_s
        left = torch.randn(ELEMENTWISE_ELEMENTS, generator=generator)
        right, out = torch.randn_like(left), torch.empty_like(left)
        add_s = _best_seconds(lambda: torch.add(left, right, out=out), 5)
        return CpuRates(peak, sum(halves) / len(halves) if halves else 0.0, attention_flops,
                        3 * 4 * ELEMENTWISE_ELEMENTS / add_s, per_op_s, torch.get_num_threads())


def cpu_device(rates: CpuRates) -> tuple[Device, Efficiencies]:
    """This CPU as a device of the step-time model, and the efficiencies that make its measured rates the rates."""
    device = Device("cpu", f"this CPU ({rates.threads} thread{'s' if rates.threads > 1 else ''})", None,
                    rates.matmul_flops, None, rates.matmul_flops, rates.memory_bytes_per_s, 0.0, "pcie", 0.0,
                    "measured by demo_core/throughput/cpu_rates.py", host_overlaps=False)
    ridge_tokens = rates.matmul_flops / rates.memory_bytes_per_s
    return device, Efficiencies(matmul_efficiency=1.0, matmul_half_tokens_per_ridge=rates.matmul_half_tokens / ridge_tokens,
                                attention_efficiency=rates.attention_flops / rates.matmul_flops, memory_efficiency=1.0,
                                dequant_efficiency=1.0, comm_efficiency=1.0, host_s_per_op=rates.seconds_per_op,
                                step_fixed_s=CPU_STEP_FIXED_S)


def _bucket_pairs(segments: list[int]) -> float:
    """Score pairs the CPU varlen path computes: causal SDPA per bucket, each segment padded to its bucket's longest."""
    return sum(count * length * (length + 1) / 2 for count, length in bucket_shapes(segments))


def _bucket_ops(segments: list[int]) -> int:
    return OPS_PER_ATTENTION_BUCKET * len(bucket_shapes(segments))


def predicted_speedups(run: RunConfig, model_config, lengths: list[int], rates: CpuRates | None = None
                       ) -> dict[str, float]:
    """Predicted speedup over padded of each collator of a resolved run (`RunConfig.resolved`) on this CPU, for its
    examples' `lengths` in their trained order."""
    rates = rates or measure_cpu_rates(run.threads)
    device, efficiencies = cpu_device(rates)
    attention = run.attention if run.attention in ("varlen", "sdpa", "eager") else "sdpa"
    settings = RunSettings(batch_size=run.micro_batch_size, grad_accum=run.grad_accum, precision="fp32",
                           attention=attention, lora_rank=run.lora_rank, qlora=False,
                           gradient_checkpointing=bool(run.gradient_checkpointing), max_length=run.max_length,
                           optimizer=run.optimizer)
    facts = ModelFacts.of(model_config, run.lora_rank, tuple(run.lora_targets))
    varlen = attention == "varlen"
    costing = Costing(facts, settings, device, efficiencies, segment_pairs=_bucket_pairs if varlen else None,
                      segment_calls=_bucket_ops if varlen else None)
    # The engine's own batches: the data in its trained order, the run's steps (step 1, a warm-up, is not timed)
    priced = price_collators(costing, lengths, run.collators, log_residual_range=(0.0, 0.0), seed=None,
                             max_steps=run.steps)
    return {name: entry["speedup_vs_padded"] for name, entry in priced.items()}
