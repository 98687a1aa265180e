"""A training step's time from its parts, for each collator's real batches, on a named GPU (or this CPU).

Per micro-batch on one GPU (T = token slots computed: B x L_max padded, Σl packed):
  matmul        2 x matmul weights x T per pass (forward, input gradient, weight gradient unless the base is frozen,
                a second forward under gradient checkpointing), plus the LoRA adapters' 3 passes, at
                peak x matmul_efficiency x T / (T + T_half): a GEMM over few tokens reads its weights for little
                arithmetic, so its efficiency halves at T_half = matmul_half_tokens_per_ridge x (peak / bandwidth).
  attention     4 x (heads x head_dim) x score pairs x layers per forward, 3.5 forwards' worth with FlashAttention's
                backward (+1 recomputed): pairs per segment for flash_attention_2 / varlen (rounded up to the
                kernel's 128x128 tiles on a GPU), B x L_max² padded and (Σl)² packed for sdpa / eager (a mask over
                the whole row), at peak x attention_efficiency.
  memory-bound  norms, element-wise ops, rotary, the loss over the vocabulary, FlashAttention's unpad / pad of a
                padded batch: bytes moved per token slot (counted below) over bandwidth x memory_efficiency.
  dequantize    QLoRA: each 4-bit weight unpacked to bf16 before every pass that uses it, over bandwidth x
                dequant_efficiency.
  host          the eager dispatcher's time per op x ops per micro-batch (counted on an HF Llama layer): on a GPU it
                overlaps the kernels and costs only where it is longer than they are (small models, few tokens).
  sharded comm  FSDP / ZeRO-3: every micro-batch all-gathers the weights twice (forward, backward) and
                reduce-scatters the gradients, overlapping compute; ring bytes over the link x comm_efficiency.
Per optimizer step: the optimizer (bytes of weights, gradients and state over bandwidth x memory_efficiency), the
gradient all-reduce of unsharded data parallelism (2(N-1)/N x gradient bytes over the ring), and step_fixed_s.
With several GPUs every micro-batch waits for the slowest GPU's. Packing shrinks matmul, memory-bound and (sdpa /
eager) attention; it cannot shrink the optimizer, the all-reduce, the weight gathers, dequantization or the fixed
cost, which is why those cap its speedup.
"""

from __future__ import annotations

import dataclasses
import math

from demo_core.throughput.batches import MicroBatch, Step
from demo_core.throughput.facts import OPTIMIZER_SHARDING, PER_MICRO_BATCH_SHARDING, ModelFacts, RunSettings
from demo_core.throughput.gpus import Device, ring_bytes_per_s_each_way


@dataclasses.dataclass(frozen=True)
class Efficiencies:
    """The model's named parameters: fractions of a device's datasheet rates that training reaches, and fixed costs.
    Defaults are the values calibrated on published GPU measurements (benchmarks/throughput_published.py; the
    calibration rows are named there and in docs/THROUGHPUT.md)."""

    matmul_efficiency: float = 0.754  # of dense peak, for GEMMs over many tokens (calibrated)
    matmul_half_tokens_per_ridge: float = 4.0  # T_half in units of peak/bandwidth tokens (calibrated)
    attention_efficiency: float = 0.40  # FlashAttention-2 forward+backward (stated: FA2 paper reports 50-70% on long
    #                                     sequences; short instruction segments run lower)
    memory_efficiency: float = 0.60  # of datasheet bandwidth, element-wise / optimizer traffic (stated)
    dequant_efficiency: float = 0.0616  # of bandwidth, unpacking 4-bit weights (calibrated)
    comm_efficiency: float = 0.546  # of the link's one-way bandwidth, NCCL rings inside training (calibrated)
    host_s_per_op: float = 8e-6  # eager dispatch + kernel launch per aten op on a GPU host (stated)
    step_fixed_s: float = 0.0448  # per optimizer step: Trainer bookkeeping, zero_grad, scheduler, data (calibrated)


CALIBRATED = Efficiencies()

# FlashAttention-2's work tiles: a causal segment of s tokens computes ceil(s/128) x (ceil(s/128) + 1) / 2 blocks of
# 128 x 128 scores (flash_attn's forward block sizes on A100/H100 for head dim 128).
ATTENTION_TILE = 128
# Backward of FlashAttention recomputes the scores: about 2.5 forwards (Dao, FlashAttention-2 paper, section 3.1.2).
ATTENTION_BACKWARD_FORWARDS = 2.5
# Memory-bound traffic per token slot and decoder layer, in activation-sized elements read or written, forward and
# backward together (counted from an HF Llama layer: two RMSNorms with their fp32 upcasts, rotary on q and k, two
# residual adds, layout copies around the attention kernel; SiLU x up on the MLP width), and the loss's traffic per
# vocabulary entry in bytes (bf16 logits, their fp32 upcast, log-softmax and its gradient).
HIDDEN_ELEMENT_PASSES = 135
FFN_ELEMENT_PASSES = 15
LOGIT_BYTES_PER_VOCAB = 30
# FlashAttention on a padded batch gathers q, k, v to the real tokens and scatters the output back, forward and
# backward: 8 hidden-sized passes per layer over every token slot.
UNPAD_ELEMENT_PASSES = 8
# Aten ops dispatched per decoder layer (forward, backward) and per micro-batch outside the layers, counted with a
# TorchDispatchMode on tiny-llama (sdpa): 77, 142 and 66. A LoRA adapter adds about 5 ops forward and 8 backward per
# targeted layer (dropout, A, B, scale, add); a fused optimizer step about 20.
OPS_PER_LAYER_FORWARD = 77
OPS_PER_LAYER_BACKWARD = 142
OPS_PER_MICRO_BATCH = 66
OPS_PER_LORA_TARGET = 13
OPS_PER_OPTIMIZER_STEP = 20
QLORA_BYTES_PER_WEIGHT = 0.5 + 2  # read the 4-bit weight, write its bf16 copy (the GEMM's read is the GEMM's)

PARTS = ("matmul", "attention", "memory_bound", "dequantize", "host_overhead", "sharded_comm", "optimizer",
         "gradient_sync", "fixed")
SHRINKS_WITH_PACKING = ("matmul", "attention", "memory_bound")


@dataclasses.dataclass(frozen=True)
class Costing:
    """A model, a run and a device together, with the efficiencies to price them by."""

    facts: ModelFacts
    run: RunSettings
    device: Device
    efficiencies: Efficiencies = CALIBRATED
    # Attention score pairs a micro-batch computes under per-segment attention; None: FlashAttention's tiles. The
    # CPU path passes its own (bucketed SDPA, attention.bucket_shapes).
    segment_pairs: object = None
    # Ops the attention path adds per layer for a micro-batch's segments (the CPU varlen path: one SDPA per bucket)
    segment_calls: object = None

    @property
    def peak_flops(self) -> float:
        return self.device.peak_flops(self.run.precision)

    @property
    def half_tokens(self) -> float:
        return self.efficiencies.matmul_half_tokens_per_ridge * self.peak_flops / self.device.memory_bytes_per_s

    def _forward_passes(self) -> int:
        return 2 if self.run.gradient_checkpointing else 1

    @staticmethod
    def _segments(micro: MicroBatch) -> list[int]:
        return [sum(micro.lengths)] if micro.layout == "naive" else list(micro.lengths)

    def _pairs(self, micro: MicroBatch) -> float:
        if self.run.per_segment_attention:
            segments = self._segments(micro)
            if self.segment_pairs is not None:
                return self.segment_pairs(segments)
            blocks = [math.ceil(length / ATTENTION_TILE) for length in segments]
            return sum(ATTENTION_TILE ** 2 * count * (count + 1) / 2 for count in blocks)
        if micro.layout == "padded":  # a masked score matrix over every row's L_max² (no causal skipping)
            return len(micro.lengths) * max(micro.lengths) ** 2
        return sum(micro.lengths) ** 2  # one row with a block mask over all of it

    def compute_parts(self, micro: MicroBatch) -> dict[str, float]:
        """Seconds of device work one micro-batch costs on one GPU, by part."""
        facts, run, eff = self.facts, self.run, self.efficiencies
        slots = micro.token_slots
        forwards = self._forward_passes()
        base_passes = forwards + 1 + (1 if run.trains_base else 0)
        lora_passes = forwards + 2 if run.lora_rank else 0
        matmul_flops = 2 * slots * (facts.matmul_weights * base_passes + facts.lora_weights * lora_passes)
        matmul_s = matmul_flops / (self.peak_flops * eff.matmul_efficiency) * (1 + self.half_tokens / slots)
        attention_flops = (4 * facts.attention_width * self._pairs(micro) * facts.layers
                           * (forwards + ATTENTION_BACKWARD_FORWARDS))
        attention_s = attention_flops / (self.peak_flops * eff.attention_efficiency)
        share = (forwards + 2) / 3  # a recomputed forward adds its third of the traffic again
        element_bytes = run.activation_bytes * slots * facts.layers * share * (
            HIDDEN_ELEMENT_PASSES * facts.hidden + FFN_ELEMENT_PASSES * facts.ffn)
        if micro.layout == "padded" and run.per_segment_attention:
            element_bytes += run.activation_bytes * slots * facts.layers * UNPAD_ELEMENT_PASSES * facts.hidden
        if not run.per_segment_attention and run.attention == "eager":  # scores materialised: write, softmax, grad
            element_bytes += 4 * run.activation_bytes * self._pairs(micro) * facts.heads * facts.layers
        element_bytes += slots * facts.vocab * LOGIT_BYTES_PER_VOCAB
        bandwidth = self.device.memory_bytes_per_s
        dequant_s = 0.0
        if run.qlora:
            dequant_s = (facts.quantizable_weights * QLORA_BYTES_PER_WEIGHT * (forwards + 1)
                         / (bandwidth * eff.dequant_efficiency))
        return {"matmul": matmul_s, "attention": attention_s,
                "memory_bound": element_bytes / (bandwidth * eff.memory_efficiency), "dequantize": dequant_s}

    def host_s(self, micro: MicroBatch) -> float:
        facts, run = self.facts, self.run
        per_layer = (OPS_PER_LAYER_FORWARD * self._forward_passes() + OPS_PER_LAYER_BACKWARD
                     + OPS_PER_LORA_TARGET * facts.lora_targets_per_layer)
        if self.segment_calls is not None and run.per_segment_attention:
            per_layer += self.segment_calls(self._segments(micro))
        return (facts.layers * per_layer + OPS_PER_MICRO_BATCH) * self.efficiencies.host_s_per_op

    def _weight_bytes_on_the_wire(self) -> float:
        facts, run = self.facts, self.run
        if run.qlora:
            return facts.quantizable_weights * 0.5 + (facts.params - facts.quantizable_weights) * 2
        return facts.params * run.activation_bytes  # gathered in the compute dtype (FSDP mixed-precision policy)

    def _trainable(self) -> int:
        return self.facts.lora_weights if self.run.lora_rank else self.facts.params

    def _ring_s(self, bytes_each: float, factor: float) -> float:
        gpus = self.run.gpus
        if gpus == 1:
            return 0.0
        rate = ring_bytes_per_s_each_way(self.device, gpus) * self.efficiencies.comm_efficiency
        return factor * (gpus - 1) / gpus * bytes_each / rate

    def sharded_comm_s(self) -> float:
        """FSDP / ZeRO-3 traffic of one micro-batch: two weight all-gathers and a gradient reduce-scatter."""
        if self.run.shard not in PER_MICRO_BATCH_SHARDING:
            return 0.0
        gradient_bytes = self._trainable() * self.run.activation_bytes
        return self._ring_s(self._weight_bytes_on_the_wire(), 2) + self._ring_s(gradient_bytes, 1)

    def step_parts(self) -> dict[str, float]:
        """Seconds per optimizer step that do not depend on the batch."""
        run, eff = self.run, self.efficiencies
        trainable = self._trainable()
        weight_bytes = 4 if run.lora_rank else run.master_weight_bytes  # peft keeps adapters in fp32
        states = 2 if run.optimizer == "adamw" else 1
        # read + write the weights, read the gradients twice (norm clipping, update), read + write each state
        optimizer_bytes = trainable * weight_bytes * (2 + 2 + 2 * states)
        if run.shard in OPTIMIZER_SHARDING:
            optimizer_bytes /= run.gpus
        optimizer_s = (optimizer_bytes / (self.device.memory_bytes_per_s * eff.memory_efficiency)
                       + OPS_PER_OPTIMIZER_STEP * eff.host_s_per_op)
        sync_s = 0.0 if run.shard in PER_MICRO_BATCH_SHARDING else self._ring_s(trainable * weight_bytes, 2)
        return {"optimizer": optimizer_s, "gradient_sync": sync_s, "fixed": eff.step_fixed_s}

    def step_breakdown(self, step: Step) -> dict[str, float]:
        """Seconds of one optimizer step by part; every GPU waits for the slowest at each micro-batch."""
        totals = dict.fromkeys(PARTS, 0.0)
        comm = self.sharded_comm_s()
        for round_ in range(len(step[0])):
            per_gpu = [self.compute_parts(rank_batches[round_]) for rank_batches in step]
            slowest = max(per_gpu, key=lambda parts: sum(parts.values()))
            host = max(self.host_s(rank_batches[round_]) for rank_batches in step)
            device_s = sum(slowest.values())
            for name, seconds in slowest.items():
                totals[name] += seconds
            if self.device.host_overlaps:
                totals["host_overhead"] += max(0.0, host - device_s)
                totals["sharded_comm"] += max(0.0, comm - max(device_s, host))
            else:
                totals["host_overhead"] += host
                totals["sharded_comm"] += comm
        totals.update(self.step_parts())
        return totals
