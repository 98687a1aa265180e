"""The step-time model on this machine's CPU: a short micro-benchmark of its rates, this CPU as a device priced at
them, and what the CPU's varlen path computes per bucket of segments (run_prediction.py prices a run with them).

`measure_cpu_rates` (well under 2 s, in the engine's thread count, fp32 as CPU bursts train):
- matmul FLOP/s of (T x hidden) @ (hidden x 4 hidden) at a few token counts T: the fastest is the peak, and the
  token count where the rate halves is fitted from the smaller ones (rate = peak x T / (T + T_half));
- causal SDPA FLOP/s over a bucket of segments, as the varlen path runs them on a CPU (attention.py);
- element-wise bandwidth: bytes an add over activation-sized tensors reads and writes per second;
- per-op overhead: a forward and backward through a chain of one-element ops, over the aten ops it dispatches (the
  dispatcher, autograd's graph and engine: what every op of a training step pays whatever its size).
The run is then priced by the same `Costing` as a GPU, with these as the device's rates (all efficiencies 1: they
are measured rates) and no host/device overlap (a CPU thread dispatches and computes in turn).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch

from demo_core.gpus import Device
from demo_core.isolation import torch_threads
from demo_core.segments import bucket_shapes
from demo_core.throughput.ops import counted_ops
from demo_core.throughput.step_time import Efficiencies

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
MEASURE_ROUNDS = 9
OP_CHAIN_LENGTH = 50  # one-element ops in the per-op micro-benchmark's chain (forward; its backward as many again)


@dataclasses.dataclass(frozen=True)
class CpuRates:
    matmul_flops: float  # peak, at the largest token count
    matmul_half_tokens: float
    attention_flops: float
    memory_bytes_per_s: float
    seconds_per_op: float
    threads: int


def _fastest_seconds(works: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Each work's fastest time over `rounds` rounds that time every work once, in turn: noise on a shared machine
    only adds time, and interleaving lets every work meet the same quiet moments."""
    for work in works.values():
        work()  # warm-up: allocations, first-call dispatch
    best = dict.fromkeys(works, float("inf"))
    for _ in range(rounds):
        for name, work in works.items():
            started = time.perf_counter()
            work()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def _op_chain(leaf: torch.Tensor) -> None:
    value = leaf
    for _ in range(OP_CHAIN_LENGTH):
        value = value * 1.0001 + 0.5
    value.sum().backward()


def measure_cpu_rates(threads: int | None = 1) -> CpuRates:
    """This CPU's rates in `threads` threads (None: torch's default)."""
    # fp32 named on every tensor: CPU bursts train in fp32, and a probe fit in another thread may have set torch's
    # process-wide default dtype to fp16 for a moment (the planner's warm-up beside a visitor's first run)
    fp32 = torch.float32
    with torch_threads(threads):
        leaf = torch.ones(1, requires_grad=True, dtype=fp32)
        chain_ops = counted_ops(lambda: _op_chain(leaf))
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(MATMUL_WIDTH, 4 * MATMUL_WIDTH, generator=generator, dtype=fp32)
        activations = {tokens: torch.randn(tokens, MATMUL_WIDTH, generator=generator, dtype=fp32)
                       for tokens in MATMUL_TOKENS}
        segments, heads, length, dim = SDPA_SHAPE
        query = torch.randn(segments, heads, length, dim, generator=generator, dtype=fp32)
        left = torch.randn(ELEMENTWISE_ELEMENTS, generator=generator, dtype=fp32)
        right, out = torch.randn_like(left), torch.empty_like(left)
        with torch.no_grad():
            works = {"chain": lambda: _op_chain(leaf),
                     **{tokens: (lambda x=x: x @ weight) for tokens, x in activations.items()},
                     "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(query, query, query,
                                                                                      is_causal=True),
                     "add": lambda: torch.add(left, right, out=out)}
            with torch.enable_grad():
                chain_s = _fastest_seconds({"chain": works.pop("chain")}, MEASURE_ROUNDS)["chain"]
            seconds = _fastest_seconds(works, MEASURE_ROUNDS)
        per_op_s = chain_s / chain_ops
        # the op's own dispatch is priced as an op: the rate is the arithmetic's
        rates = {tokens: 2 * tokens * MATMUL_WIDTH * 4 * MATMUL_WIDTH / max(seconds[tokens] - per_op_s, 1e-9)
                 for tokens in MATMUL_TOKENS}
        peak_tokens = max(rates, key=rates.get)
        peak = rates[peak_tokens]
        # rate(T) = peak x T / (T + T_half)  =>  T_half = T x (peak / rate - 1), averaged over the sizes below the
        # fastest one. A larger size that ran slower was interrupted (a longer product meets more of a shared
        # machine's other work): it says nothing of the GEMM.
        halves = [tokens * (peak / rate - 1) for tokens, rate in rates.items() if tokens < peak_tokens]
        attention_flops = 4 * heads * dim * segments * length * (length + 1) / 2 / seconds["sdpa"]
        return CpuRates(peak, sum(halves) / len(halves) if halves else 0.0, attention_flops,
                        3 * 4 * ELEMENTWISE_ELEMENTS / seconds["add"], per_op_s, torch.get_num_threads())


def cpu_device(rates: CpuRates) -> tuple[Device, Efficiencies]:
    """This CPU as a device of the step-time model, and the efficiencies that make its measured rates the rates."""
    device = Device("cpu", f"this CPU ({rates.threads} thread{'s' if rates.threads > 1 else ''})", None,
                    rates.matmul_flops, None, rates.matmul_flops, rates.memory_bytes_per_s, 0.0, "pcie", 0.0,
                    "measured by demo_core/throughput/cpu_rates.py", host_overlaps=False)
    ridge_tokens = rates.matmul_flops / rates.memory_bytes_per_s
    return device, Efficiencies(matmul_efficiency=1.0,
                                matmul_half_tokens_per_ridge=rates.matmul_half_tokens / ridge_tokens,
                                attention_efficiency=rates.attention_flops / rates.matmul_flops, memory_efficiency=1.0,
                                dequant_efficiency=1.0, sharded_dequant_efficiency=1.0, comm_efficiency=1.0,
                                host_s_per_op=rates.seconds_per_op,
                                step_fixed_s=CPU_STEP_FIXED_S)


def bucket_pairs(segments: list[int]) -> float:
    """Score pairs the CPU varlen path computes: causal SDPA per bucket, each segment padded to its bucket's longest."""
    return sum(count * length * (length + 1) / 2 for count, length in bucket_shapes(segments))


def bucket_ops(segments: list[int]) -> int:
    return OPS_PER_ATTENTION_BUCKET * len(bucket_shapes(segments))
