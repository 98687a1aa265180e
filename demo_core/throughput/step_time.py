"""A training step's time from its parts, for each collator's real batches, on a named GPU (or this CPU).

Per micro-batch on one GPU (T = token slots computed: B x L_max padded, Σl packed):
  matmul        2 x weights x T per pass (forward, input gradient, weight gradient unless the base is frozen, a
                second forward under gradient checkpointing) at peak x matmul_efficiency x M / (M + M_half), M the
                rows of the GEMM: T for dense weights, T x k / E for each routed expert of a mixture of experts (a
                grouped GEMM over few tokens reads its weights for little arithmetic), M_half =
                matmul_half_tokens_per_ridge x (peak / bandwidth), the roofline's ridge point.
  attention     4 x (heads x head_dim) x score pairs x attention layers per forward, 3.5 forwards' worth with
                FlashAttention's backward (+1 recomputed): pairs per segment for flash_attention_2 / varlen (rounded
                up to the kernel's 128x128 tiles on a GPU), B x L_max² padded and (Σl)² packed for sdpa / eager (a
                mask over the whole row), at peak x attention_efficiency.
  ssm           a hybrid's state-space layers: their chunked scan (facts.py) over every token slot, 3 forwards'
                worth with the backward (+1 recomputed), at peak x ssm_efficiency.
  memory-bound  norms, element-wise ops, rotary, the loss over the vocabulary, the experts' token permutation, LoRA's
                skinny adapter GEMMs (they read a layer's input again for a rank-r product), FlashAttention's unpad /
                pad of a padded batch: bytes moved per token slot (counted below) over bandwidth x memory_efficiency,
                x (T + M_half) / T as the GEMMs: a kernel over few tokens does not fill the GPU either.
  dequantize    QLoRA: each 4-bit weight unpacked to bf16 before every pass that uses it, over bandwidth x
                dequant_efficiency (sharded_dequant_efficiency when FSDP / ZeRO-3 shards the 4-bit base over several
                GPUs): per micro-batch, whatever its tokens.
  kernels       every operation's kernel costs the GPU kernel_s_per_op beyond its work (launch latency, the ramp
                and tail of its grid): operations per micro-batch (counted on the model's own code, ops.py) x it.
  host          the eager dispatcher's time per operation x the same count: on a GPU it overlaps the kernels and
                costs only where it is longer than they are (small models, few tokens); on a CPU the same thread
                does both, so it adds up.
  sharded comm  FSDP / ZeRO-3: every micro-batch all-gathers the weights twice (forward, backward) and
                reduce-scatters the gradients: ring bytes over the link x comm_efficiency, of which comm_overlap x
                the micro-batch's compute hides the rest.
Per optimizer step: the optimizer (bytes its implementation moves per trainable weight, over bandwidth x
memory_efficiency), the gradient all-reduce of unsharded data parallelism (2(N-1)/N x gradient bytes over the ring,
hidden behind the last backward as far as comm_overlap allows), and step_fixed_s. With several GPUs every
micro-batch waits for the slowest GPU's. Packing shrinks matmul, ssm, memory-bound and (sdpa / eager) attention; it
cannot shrink the optimizer, the all-reduce, the weight gathers, dequantization or the fixed cost, which is why
those cap its speedup.
"""

from __future__ import annotations

import dataclasses
import math

from demo_core.gpus import Device, ring_bytes_per_s_each_way
from demo_core.throughput.batches import MicroBatch, Step
from demo_core.throughput.facts import OPTIMIZER_SHARDING, PER_MICRO_BATCH_SHARDING, ModelFacts, RunSettings


@dataclasses.dataclass(frozen=True)
class Efficiencies:
    """The model's named parameters: fractions of a device's datasheet rates that training reaches, and fixed costs.
    Defaults are the values calibrated on published GPU measurements (benchmarks/throughput_published.py; the
    calibration rows are named there and in docs/THROUGHPUT.md); the others are stated, with why, beside them."""

    matmul_efficiency: float = 0.90  # of dense peak, for GEMMs over many tokens (calibrated, at its bound)
    matmul_half_tokens_per_ridge: float = 2.0  # M_half in units of peak/bandwidth tokens (calibrated; the roofline
    #                                            puts it at 1 or more: below the ridge, reading weights bounds a GEMM)
    expert_matmul_efficiency: float = 0.27  # grouped expert GEMMs' rate over dense GEMMs' at equal rows (calibrated)
    attention_efficiency: float = 0.40  # FlashAttention-2 forward+backward (stated: FA2 paper reports 50-70% on long
    #                                     sequences; short instruction segments run lower)
    ssm_efficiency: float = 0.25  # Mamba2's scan kernels (stated: Triton kernels of a chunked scan, well below the
    #                               GEMMs' rate; a hybrid's scan is a small share of its step either way)
    memory_efficiency: float = 0.60  # of datasheet bandwidth, element-wise / optimizer traffic (stated)
    dequant_efficiency: float = 0.168  # of bandwidth, unpacking 4-bit weights (calibrated)
    sharded_dequant_efficiency: float = 0.0231  # the same for a 4-bit base FSDP / ZeRO-3 shards over several GPUs
    #                                            (calibrated: PEFT's unfused bitsandbytes / GPTQ layers under FSDP pay
    #                                            about 1.3 s per micro-batch of a 7B model on two A100s, whatever its
    #                                            tokens; fused kernels do not, and the model does not price those)
    comm_efficiency: float = 0.71  # of the link's one-way bandwidth, NCCL rings inside training (calibrated)
    comm_overlap: float = 0.90  # share of a micro-batch's compute its collectives can hide behind (calibrated)
    host_s_per_op: float = 8e-6  # eager dispatch + kernel launch per aten op on a GPU host (stated)
    kernel_s_per_op: float = 4e-6  # GPU time every kernel costs beyond its work: launch latency, ramp-up and tail of
    #                                a grid that does not fill the device (stated: 3-5 µs per kernel in PyTorch eager)
    step_fixed_s: float = 0.0281  # per optimizer step: Trainer bookkeeping, zero_grad, scheduler, data (calibrated)


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
# A state-space layer's own element-wise work on its inner width: the causal conv1d, the SiLU gate, the gated norm,
# forward and backward (Mamba2 block: conv, x/B/C split, D skip, z gate, RMSNorm).
SSM_ELEMENT_PASSES = 20
# A mixture of experts moves each token's hidden state to each of its k experts and back (gather, scatter, the
# routing weights' scale), forward and backward.
MOE_PERMUTE_ELEMENT_PASSES = 8
# LoRA per targeted layer and token: its input read for A, dropout, B's output, the scale and the add, forward and
# backward: about 10 passes over the layer's input plus output width (A: rank x in, B: out x rank).
LORA_ELEMENT_PASSES = 10
# FlashAttention on a padded batch gathers q, k, v to the real tokens and scatters the output back, forward and
# backward: 8 hidden-sized passes per layer over every token slot.
UNPAD_ELEMENT_PASSES = 8
# Aten ops per decoder layer (forward, backward) and per micro-batch outside the layers, counted with a
# TorchDispatchMode on tiny-llama (sdpa): the fallback where a model's own count cannot run here (ops.py). A LoRA
# adapter adds about 13 ops per targeted layer.
OPS_PER_LAYER_FORWARD = 77
OPS_PER_LAYER_BACKWARD = 142
OPS_PER_MICRO_BATCH = 66
OPS_PER_LORA_TARGET = 13
# Optimizer kernels per step: a fused or multi-tensor step launches a few dozen (per op, per chunk of tensors); a
# per-tensor loop launches about 12 per parameter tensor.
OPS_PER_OPTIMIZER_STEP = 20
OPS_PER_TENSOR_SINGLE_TENSOR = 12
QLORA_BYTES_PER_WEIGHT = 0.5 + 2  # read the 4-bit weight, write its bf16 copy (the GEMM's read is the GEMM's)
# Gradient clipping (Trainer's max_grad_norm=1): the norm reads every gradient, the scale reads and writes it.
CLIP_PASSES = 3
# Passes over the trainable weights' size each optimizer step makes (read or write of the weight, its gradient and
# each state), counted from torch.optim's kernels: the fused AdamW reads p, g, m, v and writes p, m, v; the
# multi-tensor and per-tensor AdamW run weight decay, lerp, mul, addcmul, sqrt, div, add and addcdiv as separate
# passes; SGD with momentum reads and writes its buffer and the weight; Adafactor's factored update about 15.
OPTIMIZER_PASSES = {("adamw", "fused"): 7, ("adamw", "foreach"): 20, ("adamw", "single-tensor"): 20,
                    ("sgd", "fused"): 5, ("sgd", "foreach"): 6, ("sgd", "single-tensor"): 6}
ADAFACTOR_PASSES = 15
# bitsandbytes' 8-bit AdamW: one fused kernel reads the weight and gradient and reads and writes two 1-byte states.
ADAMW_8BIT_STATE_BYTES = 4

PARTS = ("matmul", "attention", "ssm", "memory_bound", "dequantize", "kernels", "host_overhead", "sharded_comm",
         "optimizer", "gradient_sync", "fixed")
SHRINKS_WITH_PACKING = ("matmul", "attention", "ssm", "memory_bound")


@dataclasses.dataclass(frozen=True)
class Costing:
    """A model, a run and a device together, with the efficiencies to price them by."""

    facts: ModelFacts
    run: RunSettings
    device: Device
    efficiencies: Efficiencies = CALIBRATED
    # Aten ops of one micro-batch's forward and backward (ops.py); None: the Llama-layer counts above.
    ops_per_micro_batch: int | None = None
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

    def _matmul_s(self, flops: float, rows: float, efficiency: float = 1.0) -> float:
        """A GEMM of `rows` tokens: below the ridge it reads its weights for little arithmetic. `efficiency`: of the
        dense GEMMs' rate (a grouped expert GEMM's)."""
        if flops <= 0:
            return 0.0
        rate = self.peak_flops * self.efficiencies.matmul_efficiency * efficiency
        return flops / rate * (1 + self.half_tokens / rows)

    def compute_parts(self, micro: MicroBatch) -> dict[str, float]:
        """Seconds of device work one micro-batch costs on one GPU, by part."""
        facts, run, eff = self.facts, self.run, self.efficiencies
        slots = micro.token_slots
        forwards = self._forward_passes()
        passes = forwards + 1 + (1 if run.trains_base else 0)
        matmul_s = self._matmul_s(2 * slots * facts.dense_matmul_weights * passes, slots)
        if facts.experts:
            routed = slots * facts.experts_per_token / facts.experts  # tokens each expert's GEMM sees
            matmul_s += self._matmul_s(2 * routed * facts.expert_matmul_weights * passes, routed,
                                       eff.expert_matmul_efficiency)
        if run.lora_rank:
            matmul_s += self._matmul_s(2 * slots * facts.lora_weights * (forwards + 2), slots)
        attention_flops = (4 * facts.attention_width * self._pairs(micro) * facts.attention_layers
                           * (forwards + ATTENTION_BACKWARD_FORWARDS))
        ssm_flops = facts.ssm_flops_per_token * slots * facts.ssm_layers * (forwards + 2)
        share = (forwards + 2) / 3  # a recomputed forward adds its third of the traffic again
        elements = slots * share * (facts.layers * (HIDDEN_ELEMENT_PASSES * facts.hidden
                                                    + FFN_ELEMENT_PASSES * facts.ffn)
                                    + facts.ssm_layers * SSM_ELEMENT_PASSES * facts.ssm_width)
        if facts.experts:
            elements += slots * share * facts.layers * facts.experts_per_token * MOE_PERMUTE_ELEMENT_PASSES \
                * facts.hidden
        if run.lora_rank:
            elements += slots * share * LORA_ELEMENT_PASSES * facts.lora_weights / run.lora_rank
        if micro.layout == "padded" and run.per_segment_attention:
            elements += slots * facts.attention_layers * UNPAD_ELEMENT_PASSES * facts.hidden
        if not run.per_segment_attention and run.attention == "eager":  # scores materialised: write, softmax, grad
            elements += 4 * self._pairs(micro) * facts.heads * facts.attention_layers
        element_bytes = run.activation_bytes * elements + slots * facts.vocab * LOGIT_BYTES_PER_VOCAB
        bandwidth = self.device.memory_bytes_per_s
        dequant_s = 0.0
        if run.qlora:
            sharded = run.shard in PER_MICRO_BATCH_SHARDING and run.gpus > 1
            efficiency = eff.sharded_dequant_efficiency if sharded else eff.dequant_efficiency
            dequant_s = (facts.quantizable_weights * QLORA_BYTES_PER_WEIGHT * (forwards + 1)
                         / (bandwidth * efficiency))
        kernels_s = self.operations(micro) * eff.kernel_s_per_op if self.device.host_overlaps else 0.0
        return {"matmul": matmul_s, "attention": attention_flops / (self.peak_flops * eff.attention_efficiency),
                "ssm": ssm_flops / (self.peak_flops * eff.ssm_efficiency),
                "memory_bound": element_bytes / (bandwidth * eff.memory_efficiency) * (1 + self.half_tokens / slots),
                "dequantize": dequant_s,
                "kernels": kernels_s}

    def operations(self, micro: MicroBatch) -> int:
        """Aten operations one micro-batch dispatches: the model's own count (ops.py), or the Llama layer's."""
        facts, run = self.facts, self.run
        ops = self.ops_per_micro_batch
        if ops is None:
            ops = facts.layers * (OPS_PER_LAYER_FORWARD * self._forward_passes() + OPS_PER_LAYER_BACKWARD
                                  + OPS_PER_LORA_TARGET * facts.lora_targets_per_layer) + OPS_PER_MICRO_BATCH
        if self.segment_calls is not None and run.per_segment_attention:
            ops += facts.attention_layers * self.segment_calls(self._segments(micro))
        return ops

    def host_s(self, micro: MicroBatch) -> float:
        return self.operations(micro) * self.efficiencies.host_s_per_op

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

    def _optimizer_bytes_per_weight(self, weight_bytes: int) -> float:
        run = self.run
        if run.optimizer == "adamw_8bit":
            return weight_bytes * (2 + 1 + CLIP_PASSES) + ADAMW_8BIT_STATE_BYTES
        if run.optimizer == "adafactor":
            return weight_bytes * (ADAFACTOR_PASSES + CLIP_PASSES)
        return weight_bytes * (OPTIMIZER_PASSES[(run.optimizer, run.optimizer_impl)] + CLIP_PASSES)

    def step_parts(self, last_backward_s: float = 0.0) -> dict[str, float]:
        """Seconds per optimizer step that do not depend on the batch; the gradient all-reduce hides behind the last
        micro-batch's backward (`last_backward_s`) as far as comm_overlap allows."""
        run, eff = self.run, self.efficiencies
        trainable = self._trainable()
        weight_bytes = 4 if run.lora_rank else run.master_weight_bytes  # peft keeps adapters in fp32
        optimizer_bytes = trainable * self._optimizer_bytes_per_weight(weight_bytes)
        if run.shard in OPTIMIZER_SHARDING:
            optimizer_bytes /= run.gpus
        per_tensor = self.facts.parameter_tensors if run.optimizer_impl == "single-tensor" and not run.lora_rank else 0
        optimizer_s = (optimizer_bytes / (self.device.memory_bytes_per_s * eff.memory_efficiency)
                       + (OPS_PER_OPTIMIZER_STEP + OPS_PER_TENSOR_SINGLE_TENSOR * per_tensor) * eff.host_s_per_op)
        sync_s = 0.0 if run.shard in PER_MICRO_BATCH_SHARDING else self._ring_s(trainable * weight_bytes, 2)
        sync_s = max(0.0, sync_s - eff.comm_overlap * last_backward_s) if self.device.host_overlaps else sync_s
        return {"optimizer": optimizer_s, "gradient_sync": sync_s, "fixed": eff.step_fixed_s}

    def step_breakdown(self, step: Step) -> dict[str, float]:
        """Seconds of one optimizer step by part; every GPU waits for the slowest at each micro-batch."""
        totals = dict.fromkeys(PARTS, 0.0)
        comm = self.sharded_comm_s()
        overlap = self.efficiencies.comm_overlap
        last_backward_s = 0.0
        for round_ in range(len(step[0])):
            per_gpu = [self.compute_parts(rank_batches[round_]) for rank_batches in step]
            slowest = max(per_gpu, key=lambda parts: sum(parts.values()))
            host = max(self.host_s(rank_batches[round_]) for rank_batches in step)
            device_s = sum(slowest.values())
            for name, seconds in slowest.items():
                totals[name] += seconds
            if self.device.host_overlaps:
                totals["host_overhead"] += max(0.0, host - device_s)
                totals["sharded_comm"] += max(0.0, comm - overlap * max(device_s, host))
            else:
                totals["host_overhead"] += host
                totals["sharded_comm"] += comm
            # the backward is two of the three (or four, recomputing) forwards' worth of a micro-batch
            last_backward_s = device_s * 2 / (self._forward_passes() + 2)
        totals.update(self.step_parts(last_backward_s))
        return totals
