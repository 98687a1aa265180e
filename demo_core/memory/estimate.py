"""Memory of one training step, estimated from a model config: every category of memory_measure.py, without training.

The categories follow the Hugging Face "model training anatomy" page, plus the CUDA context:

    weights      parameters + buffers: 4 bytes/param (fp32, and fp32 master weights under bf16/fp16 autocast),
                 2 in pure bf16; QLoRA's frozen 4-bit linear weights 0.516 (NF4 + double-quantized constants)
    gradients    one `.grad` per trainable parameter, in the parameter's dtype
    optimizer    AdamW exp_avg + exp_avg_sq + a scalar `step` per tensor; SGD momentum_buffer; bitsandbytes 8-bit
                 AdamW two uint8 states + an fp32 absmax per 256-element block; Adafactor factored second moments
    activations  what autograd saves for backward, fitted per architecture by memory/probe.py from tiny copies
                 of the model, plus the formulas below for what the probe leaves out
    temporary    the largest short-lived buffer: the loss head's gradients at the start of backward (full logits, or
                 a chunked head's tiles and fp32 accumulators), the optimizer's scratch at the step (foreach: a copy
                 of every state; single-tensor: of the largest; fused: none), or (gradient checkpointing) one
                 layer recomputed during backward
    context      CUDA context + library workspaces: measured, passed in as `context_bytes`; 0 on CPU (the planner
                 adds the context, the allocator's reserve and NCCL around the live tensors: memory_reserve.py)

Two choices to know about:
- Mixed precision (`precision="bf16"|"fp16"`) is `Trainer(bf16=True)`: autocast in the forward, over fp32
  parameters by default, or over parameters loaded in the half dtype (`half_weights`: how LoRA users load the frozen
  base, `from_pretrained(dtype=torch.bfloat16)`). Autocast's half copies of fp32 weights are saved for backward, so
  they count under `activations` (`amp_weight_copies`), not `weights` (the HF page's "6 bytes/param" is 4 here + 2
  there): `weights` stays equal to the parameter tensors and the activations comparable with
  `SavedActivationMeter`, which sees the copies as non-parameter storages.
- The kernel of `varlen` / `flash_attention_2` is a formula (`attention_kernel_terms`): it follows the segment
  lengths, which the probe's fit cannot see. The rest comes from the model's own code (memory/probe.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from demo_core.config import PER_SEGMENT_ATTENTION
from demo_core.memory.parameters import (
    ModelShape,
    Trainable,
    model_shape,
    optimizer_state_bytes,
    param_facts,
    trainable,
    weight_bytes,
)
from demo_core.memory.probe import probed_activations
from demo_core.memory.probe_model import ProbeSpec
from demo_core.memory.probe_recorder import ATTENTION_KERNEL_EXCLUDED
from demo_core.memory.step import StepShape, TrainingSettings
from demo_core.precision import PRECISIONS
from demo_core.segments import bucket_shapes

_FP32_BYTES = 4
_INT64_BYTES = 8
# TRL's chunked log-prob kernel (trl/kernels/chunked_logprob.py): tiles of 4096 tokens x 32768 vocabulary entries.
_CHUNKED_HEAD_TOKENS = 4096
_CHUNKED_HEAD_VOCAB = 32768

# The seed example of the HF "model training anatomy" page: bert-large-uncased, batch 4, seq 512, fp32, AdamW,
# on a 16 GB V100; nvidia-smi showed 14,949 MB of which ~1.3 GB was the CUDA context (CUDA 11, before lazy loading).
SEED_MEASURED_MB = 14_949
SEED_CONTEXT_MB_REPORTED = 1_300


# ---- what is estimated ------------------------------------------------------------------------------------------


# ---- model facts: read from the config, counted exactly on the meta device --------------------------------------


# ---- activations ------------------------------------------------------------------------------------------------

def _probe_spec(step: StepShape, settings: TrainingSettings, checkpointing: bool) -> ProbeSpec:
    layout = "packed" if step.packed else ("masked" if step.has_padding else "rows")
    kernel_by_formula = settings.attention in PER_SEGMENT_ATTENTION
    return ProbeSpec(
        layout=layout, single_row=step.rows == 1, precision=settings.precision,
        attention=ATTENTION_KERNEL_EXCLUDED if kernel_by_formula else settings.attention,
        checkpointing=checkpointing, lora_rank=settings.lora_rank,
        lora_targets=tuple(settings.lora_targets) if settings.lora_rank else ("all-linear",),
        fused_lm_head=settings.loss == "trl-fused",
        half_weights=settings.half_weights,
        adapter_dtype=settings.adapter_dtype if settings.lora_rank else "fp32",
        cuda_autocast=settings.device_type == "cuda" and PRECISIONS[settings.precision].autocast,
    )


def attention_kernel_terms(shape: ModelShape, step: StepShape, settings: TrainingSettings,
                           heads: tuple[int, int], layers: int) -> dict[str, int]:
    """What the varlen / flash_attention_2 kernel saves, per layer x `layers`, plus its index tensors once.

    `heads` = (query heads, key/value heads) as the model hands them to the kernel, and `layers` the layers whose
    kernel saves anything (LoRA's first layer may not: nothing before it needs a gradient); the probe observes both.
    CUDA in half precision (PyTorch's varlen_attn, flash-attn): q, k, v over the real tokens (kv heads unrepeated)
    and a logsumexp per token and head; with padding also the output over the real tokens and the index of the real
    tokens (without padding the output itself is o_proj's input, which the probe counts).
    Elsewhere (attention.py's CPU path): SDPA per bucket of similar-length segments, each padded to the bucket's
    longest: gathered q, k, v, the output and its logsumexp per bucket, the concatenated real outputs; and the gather,
    keep and scatter indices once per forward (every layer reuses them). Measured with saved-tensor hooks.
    """
    c = PRECISIONS[settings.precision].compute_bytes
    segments = step.attention_segments()
    real = sum(segments)
    (q_heads, kv_heads), d = heads, shape.head_dim
    flash = settings.attention == "flash_attention_2" or (
        settings.device_type == "cuda" and PRECISIONS[settings.precision].half_compute)
    if flash:
        output = real * q_heads * d * c if step.has_padding else 0
        per_layer = real * (q_heads + 2 * kv_heads) * d * c + real * q_heads * _FP32_BYTES + output
        shared = _INT64_BYTES * real if step.has_padding and layers else 0  # gather/scatter index of real tokens
        return {"attention_kernel": layers * per_layer, "attention_kernel_indices": shared}
    buckets = bucket_shapes(segments)
    padded_slots = sum(n * length for n, length in buckets)
    per_layer = (padded_slots * ((2 * q_heads + 2 * kv_heads) * d * c + q_heads * _FP32_BYTES)
                 + real * q_heads * d * c)
    return {"attention_kernel": layers * per_layer,
            "attention_kernel_indices": _INT64_BYTES * (padded_slots + 2 * real) if layers else 0}


def _weight_copy_bytes(config: Any, settings: TrainingSettings) -> int:
    """Autocast's half copies of the fp32 matmul weights, saved for backward (frozen ones too: the input gradient
    needs them). Weights loaded in the half dtype are used as they are; QLoRA's 4-bit weights are dequantized again
    in backward instead. fp32 LoRA adapters are copied like any fp32 weight."""
    if not PRECISIONS[settings.precision].autocast:
        return 0
    facts = param_facts(config)
    copied = 0
    if not settings.half_weights:
        copied = facts.matmul_weight_params - (facts.quantizable_params if settings.quantized_base else 0)
    if settings.lora_rank and settings.adapter_param_bytes == _FP32_BYTES:
        copied += trainable(config, settings).params
    return copied * PRECISIONS[settings.precision].compute_bytes


def activation_terms(config: Any, step: StepShape, settings: TrainingSettings
                     ) -> tuple[dict[str, int], int, list, bool]:
    """(bytes saved for backward term by term, one recomputed layer's bytes, notes, whether the fit is reliable).

    The sum of the terms is the `activations` category: what is alive at the end of the forward. With gradient
    checkpointing that is each layer's input plus the once-per-model tensors; one layer is recomputed at a time
    during backward, which the second value gives (a `temporary`).
    """
    shape = model_shape(config)
    mask_bytes = 1 if settings.device_type == "cuda" else 4  # CUDA's fused dropout keeps a bool mask, CPU a float
    probed = probed_activations(
        config, _probe_spec(step, settings, settings.gradient_checkpointing), step.rows, step.seq_len, mask_bytes)
    terms, notes, reliable = probed.terms, list(probed.notes), probed.reliable
    kernel = (attention_kernel_terms(shape, step, settings, probed.kernel_heads, probed.kernel_layers)
              if probed.kernel_heads else {})
    recomputed = 0
    if settings.gradient_checkpointing:
        # Inside a checkpointed layer nothing is saved, the kernel's tensors included; one layer at a time is
        # recomputed in backward with everything the forward without checkpointing saves.
        full = probed_activations(
            config, _probe_spec(step, settings, checkpointing=False), step.rows, step.seq_len, mask_bytes)
        recomputed = full.largest_layer_bytes + kernel.get("attention_kernel", 0) // max(probed.kernel_layers, 1)
        notes += [note for note in full.notes if note not in notes]
        reliable = reliable and full.reliable
    else:
        terms.update(kernel)
    terms["amp_weight_copies"] = _weight_copy_bytes(config, settings)
    return {name: nbytes for name, nbytes in terms.items() if nbytes}, recomputed, notes, reliable


# ---- states, temporaries, peaks ---------------------------------------------------------------------------------


def chunked_head_backward_bytes(shape: ModelShape, step: StepShape, settings: TrainingSettings) -> int:
    """TRL's chunked LM head in backward (trl/kernels/chunked_logprob.py, CUDA path): the fp32 gradient of the
    hidden states for every token, one (4096 tokens x 32768 vocabulary) tile in the compute dtype with its hidden
    chunk and weight chunk cast to it, and, when the head trains (a full fine-tune), an fp32 gradient of the whole
    head weight, cast to the weight's dtype at the end; the hidden-state gradient is cast back likewise."""
    c, hidden = PRECISIONS[settings.precision].compute_bytes, shape.hidden_size
    weight_bytes_each = settings.base_param_bytes  # the head's weight; the hidden states share its dtype
    tokens = step.token_slots
    tile_tokens, tile_vocab = min(tokens, _CHUNKED_HEAD_TOKENS), min(shape.output_width, _CHUNKED_HEAD_VOCAB)
    total = tokens * hidden * _FP32_BYTES + tile_tokens * tile_vocab * c
    if weight_bytes_each != c:  # under autocast over fp32 weights: the hidden chunk and the weight chunk cast down
        total += (tile_tokens + tile_vocab) * hidden * c
    if weight_bytes_each != _FP32_BYTES:  # the fp32 accumulator cast back to the hidden states' dtype
        total += tokens * hidden * weight_bytes_each
    if not settings.lora_rank:
        head = shape.output_width * hidden
        total += head * _FP32_BYTES + (head * weight_bytes_each if weight_bytes_each != _FP32_BYTES else 0)
    return total


def optimizer_step_bytes(settings: TrainingSettings, train: Trainable) -> int:
    """Scratch of the optimizer step. torch AdamW: foreach computes sqrt(exp_avg_sq) for every tensor at once; the
    single-tensor loop for one tensor at a time (sqrt and its division alive together: twice the tensor); fused
    works in place (Trainer's default optim since torch 2.8). SGD, 8-bit AdamW and Adafactor update in place."""
    if settings.optimizer != "adamw" or settings.optimizer_impl == "fused":
        return 0
    if settings.optimizer_impl == "foreach":
        return train.bytes_per_param * train.params
    largest_tensor = max((math.prod(dims) for dims in train.tensor_shapes), default=0)
    return 2 * train.bytes_per_param * largest_tensor


def temporary_terms(shape: ModelShape, step: StepShape, settings: TrainingSettings, train: Trainable,
                    recomputed_layer_bytes: int) -> dict[str, int]:
    outputs = step.rows if shape.classifier else step.token_slots
    precision = PRECISIONS[settings.precision]
    half_logits = precision.compute_bytes if precision.half_compute else 0
    return {
        # Start of backward: nll_loss's and log_softmax's gradients, both fp32 (HF's loss upcasts the logits), plus
        # the gradient of the half-precision logits when the forward ran in half precision. TRL's fused head works
        # through the logits a tile at a time: no full-size gradient, its own buffers instead.
        "logits_gradients": (chunked_head_backward_bytes(shape, step, settings) if settings.loss == "trl-fused" else
                             outputs * shape.output_width * (2 * _FP32_BYTES + half_logits)),
        "optimizer_step": optimizer_step_bytes(settings, train),
        "recomputed_layer": recomputed_layer_bytes,
    }


def live_by_moment(categories: dict[str, int], temporaries: dict[str, int],
                   gradients_kept: bool = False) -> dict[str, dict[str, int]]:
    """What is alive at each moment of a step, per category (context included). Trainer zeroes gradients with
    set_to_none, so none exist during the forward of step 2 onward; at the optimizer step they all do and the
    activations are gone. `gradients_kept`: they live through every moment (the micro-batches after the first of an
    accumulated step, or zero_grad(set_to_none=False), torch's default before 2.0)."""
    held = {category: categories[category] for category in ("weights", "optimizer", "context")}
    if gradients_kept:
        held["gradients"] = categories["gradients"]
    forward = {**held, "activations": categories["activations"]}
    live = {
        "forward_end": forward,
        "backward_start": {**forward, "temporary": temporaries.get("logits_gradients", 0)},
        "optimizer_step": {**held, "gradients": categories["gradients"],
                           "temporary": temporaries.get("optimizer_step", 0)},
    }
    if temporaries.get("recomputed_layer"):
        # Conservative: the head's saved tensors are already freed when the first layer is recomputed.
        live["backward_recompute"] = {**forward, "temporary": temporaries["recomputed_layer"]}
    return live


def peaks_by_moment(categories: dict[str, int], temporaries: dict[str, int],
                    gradients_kept: bool = False) -> dict[str, int]:
    """Live bytes at each moment of a step (see `live_by_moment`)."""
    return {moment: sum(parts.values())
            for moment, parts in live_by_moment(categories, temporaries, gradients_kept).items()}


class StepPeak:
    """The step's peak: the largest of its moments' live bytes (`peak_by_moment`), and which moment that is."""

    peak_by_moment: dict[str, int]

    @property
    def peak_bytes(self) -> int:
        return max(self.peak_by_moment.values())

    @property
    def peak_moment(self) -> str:
        return max(self.peak_by_moment, key=self.peak_by_moment.get)


@dataclasses.dataclass
class MemoryEstimate(StepPeak):
    categories: dict[str, int]  # the six CATEGORIES, bytes
    activation_terms: dict[str, int]  # what makes up `activations`, bytes
    temporary_terms: dict[str, int]  # what makes up `temporary`, bytes
    peak_by_moment: dict[str, int]  # estimated live bytes at each moment of a step (context included)
    tokens: int  # token slots the model computes on (B*S padded, real tokens packed)
    params: int
    trainable_params: int
    notes: list[str] = dataclasses.field(default_factory=list)
    reliable: bool = True  # False: a fitted term missed its check (see notes); the planner refuses such an estimate


def estimate_memory_detail(config: Any, step: StepShape, settings: TrainingSettings = TrainingSettings()
                           ) -> MemoryEstimate:
    """Every category of one training step, with the terms behind them and the peak per moment of the step."""
    shape = model_shape(config)
    if settings.loss == "trl-fused" and not shape.causal_lm:
        raise ValueError("a chunked LM-head loss computes next-token log-probabilities: causal language models only")
    train = trainable(config, settings)
    activations, recomputed, notes, reliable = activation_terms(config, step, settings)
    temporaries = temporary_terms(shape, step, settings, train, recomputed)
    categories = {
        "weights": weight_bytes(config, settings),
        "gradients": train.bytes_per_param * train.params,
        "optimizer": optimizer_state_bytes(settings.optimizer, train),
        "activations": sum(activations.values()),
        "temporary": max(temporaries.values()),
        "context": int(settings.context_bytes or 0),
    }
    if settings.attention in PER_SEGMENT_ATTENTION:
        notes.append("varlen/flash kernels save a logsumexp per token, no scores: no quadratic memory term")
    if PRECISIONS[settings.precision].autocast and activations.get("amp_weight_copies"):
        notes.append("half-precision weight copies are counted in activations (amp_weight_copies)")
    negative = [name for name, nbytes in {**categories, **activations, **temporaries}.items() if nbytes < 0]
    if negative:
        notes.append(f"negative estimates: {', '.join(negative)}")
    return MemoryEstimate(categories, activations, temporaries,
                          peaks_by_moment(categories, temporaries, settings.gradients_kept), step.token_slots,
                          param_facts(config).params, train.params, notes, reliable and not negative)


def estimate_memory(config: Any, step: StepShape, settings: TrainingSettings = TrainingSettings()) -> dict[str, int]:
    """Estimated bytes per category (`CATEGORIES`) for one training step; see `estimate_memory_detail`."""
    return estimate_memory_detail(config, step, settings).categories


# ---- what-if and the seed example ---------------------------------------------------------------------------

def what_if_grid(config: Any, *, batch_sizes: Sequence[int], seq_lens: Sequence[int],
                 settings: Sequence[TrainingSettings] = (TrainingSettings(),),
                 packed: Sequence[bool] = (False,)) -> list[dict[str, Any]]:
    """One row per combination: the settings, the six categories, the total and the estimated peak. Runs nothing.

    A packed row holds batch_size examples of seq_len tokens back to back."""
    rows = []
    for b, s, option, is_packed in ((b, s, o, p) for b in batch_sizes for s in seq_lens for o in settings
                                    for p in packed):
        step = StepShape.packed_row([s] * b) if is_packed else StepShape(b, s)
        est = estimate_memory_detail(config, step, option)
        rows.append({"batch_size": b, "seq_len": s, "packed": is_packed, **dataclasses.asdict(option),
                     **{f"{k}_bytes": v for k, v in est.categories.items()},
                     "total_bytes": sum(est.categories.values()),
                     "peak_bytes": est.peak_bytes, "peak_moment": est.peak_moment})
    return rows


def bert_large_config() -> Any:
    """bert-large-uncased's shape with a 2-label classifier head, built offline (BertConfig() is bert-base)."""
    from transformers import BertConfig

    return BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                      vocab_size=30522, num_labels=2, architectures=["BertForSequenceClassification"])


def seed_example_estimate(context_bytes: int | None = None) -> dict[str, Any]:
    """The HF anatomy page's seed run, estimated: bert-large-uncased, batch 4, seq 512, fp32, AdamW, eager, V100.

    The page measured 14,949 MB with nvidia-smi. The estimate of live tensors is smaller; the gap is what no tensor
    formula sees: the CUDA context (~1.3 GB on that CUDA 11 setup, loaded eagerly; pass `context_bytes` if you
    measured one), the caching allocator's reserved-but-free blocks (fragmentation; reserved >= allocated),
    cuBLAS/cuDNN workspaces, and the run had already done earlier steps, so nvidia-smi shows the pool's high-water
    mark rather than one step's peak. See docs/MEMORY.md.
    """
    settings = TrainingSettings(  # that Trainer's AdamW was transformers' own, a loop over the parameters
        precision="fp32", optimizer="adamw", attention="eager", device_type="cuda", optimizer_impl="single-tensor",
        context_bytes=context_bytes if context_bytes is not None else SEED_CONTEXT_MB_REPORTED * 2**20)
    est = estimate_memory_detail(bert_large_config(), StepShape(4, 512), settings)
    measured_bytes = SEED_MEASURED_MB * 2**20
    return {
        "params": est.params,
        "categories": est.categories,
        "activation_terms": est.activation_terms,
        "peak_by_moment": est.peak_by_moment,
        "sum_of_categories_bytes": sum(est.categories.values()),
        "peak_bytes": est.peak_bytes,
        "peak_moment": est.peak_moment,
        "seed_measured_bytes": measured_bytes,
        "unexplained_bytes": measured_bytes - est.peak_bytes,
    }
