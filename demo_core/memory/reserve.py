"""What a card holds beyond the live tensors: the caching allocator's reserve, and the device's used memory.

memory_estimate.py counts live tensors, what `torch.cuda.max_memory_allocated` reports. A card that runs out of
memory runs out of what the process holds, which is more:

    reserved     what `torch.cuda.max_memory_reserved` reports: PyTorch's caching allocator keeps freed blocks for
                 reuse and serves requests from segments it obtained from CUDA in fixed sizes
                 (c10/cuda/CUDACachingAllocator.cpp; the PyTorch devlog "When does fragmentation occur in the CUDA
                 caching allocator?", E. Yang, 2026):
                   - every request is rounded up to 512 bytes;
                   - requests of 1 MiB or less share 2 MiB segments (the small pool);
                   - requests between 1 and 10 MiB are cut from 20 MiB segments;
                   - larger requests get a segment of their own, rounded up to 2 MiB;
                   - blocks of different segments never merge, so memory freed in one phase of a step (the
                     activations, in backward) serves the next phase's requests only where they fit.
                 reserved = live tensors at the peak + the segments' rounding of the tensors a step keeps
                 (weights, gradients, optimizer states: their sizes are exact) + segments freed earlier in the step
                 that the peak's requests are too large to reuse (stranded: with gradient checkpointing, the last
                 layer's forward buffers, when the full logits' blocks come after them) + cuBLAS / cuBLASLt workspaces
                 (allocated through the same allocator, no tensor of the model) + the cache's slack: freed blocks
                 later requests could not use and the rounding of what a step allocates and frees, as published
                 runs measured it (PUBLISHED_RESERVE_GAPS, GMLAKE_AVERAGE_FRAGMENTATION, PUBLISHED_SHARDED_SLACK).
    device used  what nvidia-smi reports for the process: reserved + the CUDA context (driver, loaded kernels) +
                 NCCL's buffers when several GPUs communicate (NCCL allocates them outside PyTorch's allocator).

Each number comes with its range (the spread of the published measurements behind it); the planner decides "fits" on
the top of the device-used range: `device_used_bytes + margin_bytes`. Not modelled: `expandable_segments:True`
(PYTORCH_CUDA_ALLOC_CONF), which maps memory in pages into one segment per stream and so removes the segment
boundaries; with it the reserve is usually smaller, so these numbers err on the safe side.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Iterable

MIB = 2 ** 20
GIB = 2 ** 30

# c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize, kSmallSize, kSmallBuffer, kLargeBuffer, kMinLargeAlloc, kRoundLarge
BLOCK_ROUNDING_BYTES = 512
SMALL_REQUEST_BYTES = 1 * MIB
SMALL_SEGMENT_BYTES = 2 * MIB
MIDDLE_SEGMENT_BYTES = 20 * MIB
LARGE_REQUEST_BYTES = 10 * MIB
LARGE_ROUNDING_BYTES = 2 * MIB
# cuBLAS workspace: 8,519,680 bytes per handle and stream, cut from a 20 MiB segment (PyTorch's CUBLAS_WORKSPACE_CONFIG
# default :4096:2:16:8, as a memory snapshot shows it: discuss.pytorch.org "torch.cuda.memory_snapshot() shows an
# unexpected 8519680B memory allocation"); cuBLASLt workspace up to 32 MiB on Hopper, 4 MiB on large Ampere
# (pytorch/pytorch#120925). Reserved and allocated, but no tensor of the model.
LIBRARY_WORKSPACE_BYTES = MIDDLE_SEGMENT_BYTES + 32 * MIB
DDP_BUCKET_BYTES = 25 * MIB  # torch DistributedDataParallel's bucket_cap_mb default


@dataclasses.dataclass(frozen=True)
class Measured:
    """A published number and where it comes from."""

    bytes: float
    source: str  # public URL
    setting: str  # what was measured, as the source states it


# Published pairs of (max_memory_reserved - max_memory_allocated) from one run, in GiB as reported. Every public pair
# found; the settings each source states. One process per GPU, one stream (no sharding).
PUBLISHED_RESERVE_GAPS: tuple[Measured, ...] = tuple(
    Measured(gap * GIB, url, setting) for gap, url, setting in (
        (12.939453125 - 12.559592724, "https://github.com/huggingface/peft/issues/1469",
         "bert-base-uncased, full fine-tune (torchtune's get_memory_stats, peak reserved - peak allocated)"),
        (1.697265625 - 1.030846596, "https://github.com/huggingface/peft/issues/1469", "bert-base-uncased, last layer"),
        (8.607421875 - 8.230915070, "https://github.com/huggingface/peft/issues/1469", "bert-base-uncased, custom LoRA"),
        (10.443359375 - 10.005623817, "https://github.com/huggingface/peft/issues/1469", "bert-base-uncased, peft LoRA"),
        (3.007812500 - 2.525867462, "https://github.com/huggingface/peft/issues/1469", "BERT with ESM's config, full"),
        (0.529296875 - 0.300243855, "https://github.com/huggingface/peft/issues/1469", "BERT, ESM config, last layer"),
        (1.982421875 - 1.774550915, "https://github.com/huggingface/peft/issues/1469", "BERT, ESM config, custom LoRA"),
        (2.408203125 - 2.172459126, "https://github.com/huggingface/peft/issues/1469", "BERT, ESM config, peft LoRA"),
        (5.683593750 - 5.124853611, "https://github.com/huggingface/peft/issues/1469", "esm-8m, full fine-tune"),
        (1.9453125 - 0.7242832183837891, "https://github.com/huggingface/peft/issues/1469",
         "facebook/esm2_t6_8M_UR50D, peft's LoRA sequence-classification notebook (batches padded per batch)"),
        (3.33984375 - 1.5451140403747559, "https://github.com/huggingface/peft/issues/1469",
         "bert-base-uncased, the same notebook"),
    ))

# GMLake (Guo et al., ASPLOS 2024, arXiv:2401.08156): over eight LLMs fine-tuned on A100-80GB with LoRA,
# recomputation, offloading and ZeRO, the caching allocator's fragmentation, (reserved - allocated) / reserved, is 15%
# on average and up to 33%. The average, as a share of the bytes a step allocates and frees (0.15 / 0.85), is the top
# of the one-stream range when that exceeds the largest measured gap: large steps churn large blocks.
GMLAKE_AVERAGE_FRAGMENTATION = Measured(0.15, "https://arxiv.org/abs/2401.08156",
                                        "PyTorch's caching allocator, eight LLMs, A100-80GB: average fragmentation")

# FSDP all-gathers each layer's full weights on its own stream; blocks freed on one stream are not reused by another
# until synchronised, and the gathered layers come and go every layer: the reserve grows with what is allocated and
# freed during the step. Published pairs (peak reserved, peak active) from meta-llama/llama-cookbook PR #41: Llama-2-7B,
# LoRA, pure bf16, FSDP over 4 x A100 40GB; as fractions of the bytes beyond the sharded state (3.14 GiB per GPU).
_FSDP_SHARDED_STATE_GIB = 13.5 / 4
PUBLISHED_SHARDED_SLACK: tuple[Measured, ...] = tuple(
    Measured((reserved - active) / (active - _FSDP_SHARDED_STATE_GIB), "https://github.com/meta-llama/llama-cookbook/pull/41",
             setting)
    for reserved, active, setting in (
        (32.67, 25.86, "limit_all_gathers=False"),
        (27.36, 20.20, "limit_all_gathers=True"),
        (19.36, 15.22, "limit_all_gathers=True, logits not kept alive"),
    ))

# The CUDA context of one process, as nvidia-smi counts it beyond the allocator's reserve. CUDA >= 11.7 loads kernels
# lazily (PyTorch sets CUDA_MODULE_LOADING=LAZY since 1.13, pytorch/pytorch#86509); before, all at once.
CUDA_CONTEXT_BYTES = {
    "lazy": (Measured(287_047_680, "https://github.com/pytorch/pytorch/pull/86509",
                      "CUDA 11.7, lazy loading, after one small tensor"),
             Measured(426 * MIB, "https://github.com/unslothai/unsloth-zoo/pull/1053",
                      "PyTorch 2.10 + CUDA 13.0, RTX 6000 Ada, context only"),
             Measured(666_632_192, "https://github.com/pytorch/pytorch/pull/86509",
                      "the same machine with CUDA_MODULE_LOADING=DEFAULT: every kernel loaded, what lazy loading "
                      "reaches at most once a run has used them")),
    "eager": (Measured(666_632_192, "https://github.com/pytorch/pytorch/pull/86509",
                       "CUDA 11.7, CUDA_MODULE_LOADING=DEFAULT"),
              Measured(1343 * MIB, "https://huggingface.co/docs/transformers/v4.27.2/en/perf_train_gpu_one",
                       "Tesla V100 16GB, CUDA 11.2 driver, torch.ones((1, 1)).to('cuda')")),
}
CUDA_MODULE_LOADING_NAMES = tuple(CUDA_CONTEXT_BYTES)
# NCCL's buffers per process for the one communicator data parallelism uses (allocated by NCCL, not PyTorch):
# NVIDIA/nccl#964 (4 x A100 NVLink, PyTorch, one 4 MB all-reduce): 544 MB for a group of 2 GPUs, 688 MB for 3-4;
# NVIDIA/nccl#864: about 1.6 GB for one communicator after an all-reduce (the high end of the range).
NCCL_BYTES = {2: 544 * MIB, "more": 688 * MIB}
NCCL_HIGH_BYTES = 1.6e9


@dataclasses.dataclass(frozen=True)
class Span:
    """A predicted number with the range the measurements behind it allow."""

    bytes: int
    low: int
    high: int


def _round_up(n: float, unit: int) -> int:
    return int(math.ceil(n / unit) * unit)


def segment_bytes(blocks: Iterable[tuple[int, int]]) -> int:
    """Bytes of the segments the caching allocator holds for `blocks` ((bytes, count) pairs), all alive at once and
    allocated from an empty pool: small blocks packed into 2 MiB segments, 1-10 MiB blocks into 20 MiB segments (as
    many of one size as fit), larger ones each in its own segment rounded up to 2 MiB."""
    small = 0
    total = 0
    for nbytes, count in blocks:
        if nbytes <= 0 or count <= 0:
            continue
        rounded = _round_up(nbytes, BLOCK_ROUNDING_BYTES)
        if rounded <= SMALL_REQUEST_BYTES:
            small += rounded * count
        elif rounded < LARGE_REQUEST_BYTES:
            per_segment = MIDDLE_SEGMENT_BYTES // rounded
            total += math.ceil(count / per_segment) * MIDDLE_SEGMENT_BYTES
        else:
            total += _round_up(rounded, LARGE_ROUNDING_BYTES) * count
    return total + _round_up(small, SMALL_SEGMENT_BYTES)


def block_rounding_bytes(blocks: list[tuple[int, int]]) -> int:
    """What the segments hold beyond the blocks themselves (never negative)."""
    return max(0, segment_bytes(blocks) - sum(nbytes * count for nbytes, count in blocks))


def _low_mid_high(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def cache_slack(transient_bytes: int, sharded_streams: bool) -> Span:
    """Freed blocks the cache keeps that the step's later requests could not use, as measured (PUBLISHED_*).

    One stream: a gap of its own size whatever the step's size (0.21 to 1.8 GiB over eleven published runs, a
    third of a GiB to half a GiB for runs of 1 to 13 GiB), up to GMLake's average fragmentation of the bytes the
    step churns for large steps; sharded weights gathered on another stream (FSDP, ZeRO-3): a share of the bytes
    beyond the sharded state (0.30 to 0.43 of them). `transient_bytes`: what the step allocates and frees."""
    if sharded_streams:
        low, mid, high = (share * transient_bytes for share in
                          _low_mid_high([m.bytes for m in PUBLISHED_SHARDED_SLACK]))
    else:
        low, mid, high = _low_mid_high([m.bytes for m in PUBLISHED_RESERVE_GAPS])
        share = GMLAKE_AVERAGE_FRAGMENTATION.bytes
        high = max(high, share / (1 - share) * transient_bytes)
    return Span(int(mid), int(low), int(high))


def context_span(module_loading: str) -> Span:
    """A typical CUDA context when none is measured: the published figures for that loading mode."""
    figures = [m.bytes for m in CUDA_CONTEXT_BYTES[module_loading]]
    if module_loading == "eager":  # the V100 figure is the one training measured; the other a bare context
        return Span(int(max(figures)), int(min(figures)), int(max(figures)))
    low, mid, high = _low_mid_high(figures)
    return Span(int(mid), int(low), int(high))


def nccl_span(gpus: int) -> Span:
    if gpus < 2:
        return Span(0, 0, 0)
    typical = NCCL_BYTES[2] if gpus == 2 else NCCL_BYTES["more"]
    return Span(typical, typical, int(max(NCCL_HIGH_BYTES, typical)))


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """The three numbers of a plan, each for what it predicts, with the terms and ranges behind them."""

    allocated_bytes: int  # live tensors at the peak: torch.cuda.max_memory_allocated
    reserved: Span  # torch.cuda.max_memory_reserved
    device_used: Span  # nvidia-smi's used memory for the process
    reserve_terms: dict[str, int]  # block_rounding, library_workspaces, cache_slack
    device_terms: dict[str, int]  # reserved, cuda_context, nccl
    context_source: str  # "measured" | "given" | "typical (lazy|eager module loading)"

    @property
    def margin_bytes(self) -> int:
        """How far above `device_used_bytes` the measurements allow it to be: what a fit must leave free."""
        return self.device_used.high - self.device_used.bytes


def device_memory(allocated_bytes: int, blocks: list[tuple[int, int]], transient_bytes: int, sharded_streams: bool,
                  gpus: int, context: Span, context_source: str, stranded_bytes: int = 0) -> DeviceMemory:
    """Reserved and device-used memory around `allocated_bytes` (the live peak), whose live blocks are `blocks`
    ((bytes, count)) and of which `transient_bytes` are allocated and freed within each step. `stranded_bytes`:
    segments freed earlier in the step that the peak's own requests are too large to reuse (they stay reserved
    beside the new segments those requests need)."""
    rounding = block_rounding_bytes(blocks)
    slack = cache_slack(transient_bytes, sharded_streams)
    fixed = allocated_bytes + rounding + LIBRARY_WORKSPACE_BYTES + stranded_bytes
    reserved = Span(fixed + slack.bytes, fixed + slack.low, fixed + slack.high)
    nccl = nccl_span(gpus)
    device_used = Span(reserved.bytes + context.bytes + nccl.bytes, reserved.low + context.low + nccl.low,
                       reserved.high + context.high + nccl.high)
    return DeviceMemory(
        allocated_bytes, reserved, device_used,
        {"block_rounding": rounding, "library_workspaces": LIBRARY_WORKSPACE_BYTES, "cache_slack": slack.bytes,
         "stranded_segments": stranded_bytes},
        {"reserved": reserved.bytes, "cuda_context": context.bytes, "nccl": nccl.bytes}, context_source)
