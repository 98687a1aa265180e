"""Memory of one training step, estimated from a model config: every category of memory_measure.py, without training.

The categories follow the Hugging Face "model training anatomy" page, plus the CUDA context:

    weights      parameters + buffers: 4 bytes/param (fp32, and fp32 master weights under bf16/fp16 autocast),
                 2 in pure bf16; QLoRA's frozen 4-bit linear weights 0.516 (NF4 + double-quantized constants)
    gradients    one `.grad` per trainable parameter, in the parameter's dtype
    optimizer    AdamW exp_avg + exp_avg_sq + a scalar `step` per tensor; SGD momentum_buffer; bitsandbytes 8-bit
                 AdamW two uint8 states + an fp32 absmax per 256-element block; Adafactor factored second moments
    activations  what autograd saves for backward, fitted per architecture by activation_probe.py from tiny copies
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
  lengths, which the probe's fit cannot see. The rest comes from the model's own code (activation_probe.py).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Sequence

import torch

from demo_core.memory import probe as activation_probe
from demo_core.models import lora
from demo_core.isolation import exclusive
from demo_core.attention.varlen import bucket_shapes
from demo_core.config import ESTIMATE_ATTENTION_NAMES, ESTIMATE_OPTIMIZER_NAMES, PER_SEGMENT_ATTENTION
from demo_core.precision import ESTIMATE_PRECISION_NAMES, PRECISIONS

_FP32_BYTES = 4
_INT64_BYTES = 8
ADAPTER_DTYPE_NAMES = ("fp32", "base")
OPTIMIZER_IMPL_NAMES = ("fused", "foreach", "single-tensor")
LOSS_NAMES = ("model", "trl-fused")
# TRL's chunked log-prob kernel (trl/kernels/chunked_logprob.py): tiles of 4096 tokens x 32768 vocabulary entries.
_CHUNKED_HEAD_TOKENS = 4096
_CHUNKED_HEAD_VOCAB = 32768
# QLoRA (Dettmers et al. 2023): NF4 weights (4 bits) with one absmax per 64 weights, itself quantized to 8 bits
# with one fp32 constant per 256 absmaxes ("double quantization": 8/64 + 32/(64*256) = 0.127 bits per weight).
QLORA_BYTES_PER_PARAM = (4 + 8 / 64 + 32 / (64 * 256)) / 8
# bitsandbytes' blockwise 8-bit optimizers: one fp32 absmax per 256 elements and state; tensors under 4096
# elements (its min_8bit_size) keep 32-bit states.
_ADAM8BIT_BLOCK = 256
_ADAM8BIT_MIN_SIZE = 4096

# The seed example of the HF "model training anatomy" page: bert-large-uncased, batch 4, seq 512, fp32, AdamW,
# on a 16 GB V100; nvidia-smi showed 14,949 MB of which ~1.3 GB was the CUDA context (CUDA 11, before lazy loading).
SEED_MEASURED_MB = 14_949
SEED_CONTEXT_MB_REPORTED = 1_300


# ---- what is estimated ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepShape:
    """The batch of one optimizer step.

    Padded: `batch_size` rows of `seq_len` slots, `real_tokens` of them real (None: all), `segment_lengths` the rows'
    real lengths when known (the varlen kernel buckets by them). Packed: one row holding the examples back to back,
    `segment_lengths` their lengths, positions restarting at each; `seq_len` is the row's length.
    """

    batch_size: int
    seq_len: int
    real_tokens: int | None = None
    packed: bool = False
    segment_lengths: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.batch_size < 1 or self.seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be at least 1, got {self.batch_size} x {self.seq_len}")

    @classmethod
    def padded(cls, lengths: Sequence[int]) -> "StepShape":
        """Examples padded to the longest one."""
        return cls(len(lengths), max(lengths), sum(lengths), segment_lengths=tuple(lengths))

    @classmethod
    def packed_row(cls, lengths: Sequence[int]) -> "StepShape":
        """Examples in one padding-free row, positions restarting per example."""
        return cls(1, sum(lengths), sum(lengths), packed=True, segment_lengths=tuple(lengths))

    @property
    def rows(self) -> int:
        return 1 if self.packed else self.batch_size

    @property
    def token_slots(self) -> int:
        """Positions the model computes on: every slot of a padded batch, the packed row's tokens."""
        return self.seq_len if self.packed else self.batch_size * self.seq_len

    @property
    def has_padding(self) -> bool:
        return not self.packed and self.real_tokens is not None and self.real_tokens < self.token_slots

    def attention_segments(self) -> list[int]:
        """What attention attends within: the packed examples, or each row's real tokens."""
        if self.segment_lengths:
            return [int(n) for n in self.segment_lengths if n > 0]
        if self.packed:
            return [self.seq_len]
        real = self.real_tokens if self.real_tokens is not None else self.token_slots
        return [real // self.batch_size] * self.batch_size  # rows' lengths unknown: even split


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """How the step trains. Names as in config.py's ESTIMATE_* lists; checked where users type them (RunConfig,
    the planner), so a bad value here is a programming error."""

    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast, fp32 weights) | pure-bf16
    optimizer: str = "adamw"  # adamw | sgd (momentum) | adamw_8bit | adafactor
    attention: str = "sdpa"  # sdpa | eager | varlen | flash_attention_2
    gradient_checkpointing: bool = False
    device_type: str = "cpu"  # cpu | cuda
    context_bytes: int | None = None  # measured CUDA context, if any
    lora_rank: int = 0  # 0: full fine-tune
    lora_targets: tuple[str, ...] = ("all-linear",)
    quantized_base: bool = False  # QLoRA: the frozen linear weights in 4-bit NF4
    loss: str = "model"  # "model": the model's own loss (Trainer); "trl-fused": TRL SFTTrainer's chunked LM head
    half_weights: bool = False  # bf16/fp16: parameters loaded in the half dtype, autocast over them (no fp32 copy)
    adapter_dtype: str = "fp32"  # LoRA adapters in fp32 (peft's default) or in the base weights' dtype
    optimizer_impl: str = "fused"  # fused (Trainer's adamw_torch_fused), foreach, single-tensor (a per-tensor loop)
    gradients_kept: bool = False  # gradients live through forward and backward (accumulation, set_to_none=False)

    def __post_init__(self):
        for name, allowed in (("precision", ESTIMATE_PRECISION_NAMES), ("optimizer", ESTIMATE_OPTIMIZER_NAMES),
                              ("attention", ESTIMATE_ATTENTION_NAMES), ("device_type", ("cpu", "cuda")),
                              ("loss", LOSS_NAMES), ("adapter_dtype", ADAPTER_DTYPE_NAMES),
                              ("optimizer_impl", OPTIMIZER_IMPL_NAMES)):
            _check_choice(name, getattr(self, name), allowed)
        if self.quantized_base and not self.lora_rank:
            raise ValueError("a quantized base trains through LoRA adapters: give lora_rank")
        if self.half_weights and not PRECISIONS[self.precision].autocast:
            raise ValueError("half_weights is autocast over half-precision weights: precision bf16 or fp16")

    @property
    def base_param_bytes(self) -> int:
        """Bytes per parameter of the loaded model: fp32 masters, or the half dtype (pure bf16, half_weights)."""
        return 2 if self.half_weights else PRECISIONS[self.precision].weight_bytes

    @property
    def adapter_param_bytes(self) -> int:
        return _FP32_BYTES if self.adapter_dtype == "fp32" else self.base_param_bytes


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


# ---- model facts: read from the config, counted exactly on the meta device --------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The few config facts the formulas need (everything else the probe reads from the model's code)."""

    layers: int
    head_dim: int
    hidden_size: int
    output_width: int  # vocabulary of a language model, labels of a classifier, 2 for span start/end
    classifier: bool  # one output per sequence (the anatomy page's BERT), not per token
    causal_lm: bool  # the only head a chunked LM-head loss applies to


def model_shape(config: Any) -> ModelShape:
    head = activation_probe.model_head(config)
    return ModelShape(
        layers=int(config.num_hidden_layers),
        head_dim=activation_probe.head_dim(config),
        hidden_size=int(config.hidden_size),
        output_width=head.output_width(config),
        classifier=not head.per_token,
        causal_lm=head.kind == "causal-lm",
    )


@dataclasses.dataclass(frozen=True)
class ParamFacts:
    """Exact counts from the model built on the meta device (no memory, no weights downloaded)."""

    params: int  # unique parameter elements (tied weights once)
    tensor_shapes: tuple[tuple[int, ...], ...]  # per unique parameter tensor
    buffer_bytes: int  # registered buffers (rotary inv_freq, ...), fp32 as built
    matmul_weight_params: int  # elements of 2-D weights used in matmuls (autocast copies them to half precision)
    quantizable_params: int  # matmul weights but the output layer's (what QLoRA stores in 4 bits)
    linear_layers: tuple[tuple[str, int, int, bool], ...]  # (name, in, out, is the output layer) of every matmul
    largest_layer_params: int  # one decoder layer's parameters (what ZeRO-3/FSDP gathers at a time)


_PARAM_FACTS_CACHE: dict[tuple[str, str], ParamFacts] = {}


def param_facts(config: Any) -> ParamFacts:
    """Exact parameter/buffer counts of the model this config builds on the meta device (cached per config)."""
    key = (type(config).__name__, config.to_json_string(use_diff=False))
    if key not in _PARAM_FACTS_CACHE:
        # Built in the config's own dtype, which transformers makes the process's default dtype while it builds: the
        # build holds the process's torch state, so a run training meanwhile never creates a tensor in it.
        with exclusive(), torch.device("meta"):
            model = activation_probe.model_class_for(config).from_config(config)
        params = list(model.parameters())  # .parameters() yields a tied weight once
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        linear: dict[int, tuple[int, bool]] = {}  # id(weight) -> (elements, is the output layer)
        layers = []
        for name, module in model.named_modules():
            if lora.linear_in_out(module) is not None:  # nn.Linear, transformers' Conv1D (gpt2)
                linear[id(module.weight)] = (module.weight.numel(), module is output)
                layers.append((name, *lora.linear_in_out(module), module is output))
        # Autocast copies every 2-D weight a matmul uses: linear layers, and routers that are plain parameters (MoE
        # gates). An embedding's weight is looked up, never copied, unless a linear layer shares it (tied lm_head).
        looked_up = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - set(linear)
        _PARAM_FACTS_CACHE[key] = ParamFacts(
            params=sum(p.numel() for p in params),
            tensor_shapes=tuple(tuple(p.shape) for p in params),
            buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
            matmul_weight_params=sum(p.numel() for p in params if p.dim() == 2 and id(p) not in looked_up),
            quantizable_params=sum(n for n, is_output in linear.values() if not is_output),
            linear_layers=tuple(layers),
            largest_layer_params=max(sum(p.numel() for p in layer.parameters()) for layer in
                                     activation_probe.decoder_layers(model, int(config.num_hidden_layers))),
        )
    return _PARAM_FACTS_CACHE[key]


def lora_adapter_shapes(config: Any, rank: int, targets: Sequence[str]) -> list[tuple[int, int]]:
    """Shapes of the LoRA A (rank x in) and B (out x rank) matrices peft adds to the targeted linear layers."""
    shapes = []
    for name, in_features, out_features, is_output in param_facts(config).linear_layers:
        if lora.is_lora_target(name, is_output, tuple(targets)):
            shapes += [(rank, in_features), (out_features, rank)]
    return shapes


@dataclasses.dataclass(frozen=True)
class Trainable:
    """What the optimizer updates: every parameter, or the LoRA adapters (fp32 by peft's default)."""

    params: int
    tensor_shapes: tuple[tuple[int, ...], ...]
    bytes_per_param: int


def trainable(config: Any, settings: TrainingSettings) -> Trainable:
    facts = param_facts(config)
    if not settings.lora_rank:
        return Trainable(facts.params, facts.tensor_shapes, settings.base_param_bytes)
    shapes = tuple(lora_adapter_shapes(config, settings.lora_rank, settings.lora_targets))
    return Trainable(sum(math.prod(s) for s in shapes), shapes, settings.adapter_param_bytes)


def weight_bytes(config: Any, settings: TrainingSettings) -> int:
    facts = param_facts(config)
    param_bytes = settings.base_param_bytes
    buffers = facts.buffer_bytes * param_bytes // _FP32_BYTES
    if not settings.lora_rank:
        return facts.params * param_bytes + buffers
    adapters = trainable(config, settings)
    if not settings.quantized_base:
        return facts.params * param_bytes + adapters.params * adapters.bytes_per_param + buffers
    # QLoRA keeps the rest of the frozen model (embeddings, norms, output layer) in the base dtype: the half dtype
    # as loaded, or fp32 after peft's prepare_model_for_kbit_training, which upcasts every non-4-bit parameter.
    quantized = facts.quantizable_params
    rest = (facts.params - quantized) * param_bytes
    return math.ceil(quantized * QLORA_BYTES_PER_PARAM) + rest + adapters.params * adapters.bytes_per_param + buffers


def state_tensor_sizes(config: Any, settings: TrainingSettings) -> dict[str, list[int]]:
    """Bytes of the tensors a step keeps, one entry per tensor, as the CUDA caching allocator is asked for them
    (memory_reserve.py rounds them into its segments): weights (QLoRA's 4-bit linear weights at their packed size),
    gradients and optimizer states."""
    facts = param_facts(config)
    base = settings.base_param_bytes
    quantized = collections.Counter((out_features, in_features) for _, in_features, out_features, is_output
                                    in facts.linear_layers if not is_output) if settings.quantized_base else {}
    weights = []
    for dims in facts.tensor_shapes:
        if quantized.get(dims):
            quantized[dims] -= 1
            weights.append(math.ceil(math.prod(dims) * QLORA_BYTES_PER_PARAM))
        else:
            weights.append(math.prod(dims) * base)
    train = trainable(config, settings)
    trained = [math.prod(dims) * train.bytes_per_param for dims in train.tensor_shapes]
    if settings.lora_rank:
        weights += trained
    states = {"adamw": 2, "sgd": 1}.get(settings.optimizer, 2)  # 8-bit and factored states: two per tensor too
    per_state = [size // (train.bytes_per_param if settings.optimizer in ("adamw_8bit", "adafactor") else 1)
                 for size in trained]
    return {"weights": weights, "gradients": trained, "optimizer": per_state * states}


# ---- activations ------------------------------------------------------------------------------------------------

def _probe_spec(step: StepShape, settings: TrainingSettings, checkpointing: bool) -> activation_probe.ProbeSpec:
    layout = "packed" if step.packed else ("masked" if step.has_padding else "rows")
    kernel_by_formula = settings.attention in PER_SEGMENT_ATTENTION
    return activation_probe.ProbeSpec(
        layout=layout, single_row=step.rows == 1, precision=settings.precision,
        attention=activation_probe.ATTENTION_KERNEL_EXCLUDED if kernel_by_formula else settings.attention,
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
    probed = activation_probe.probed_activations(
        config, _probe_spec(step, settings, settings.gradient_checkpointing), step.rows, step.seq_len, mask_bytes)
    terms, notes, reliable = probed.terms, list(probed.notes), probed.reliable
    kernel = (attention_kernel_terms(shape, step, settings, probed.kernel_heads, probed.kernel_layers)
              if probed.kernel_heads else {})
    recomputed = 0
    if settings.gradient_checkpointing:
        # Inside a checkpointed layer nothing is saved, the kernel's tensors included; one layer at a time is
        # recomputed in backward with everything the forward without checkpointing saves.
        full = activation_probe.probed_activations(
            config, _probe_spec(step, settings, checkpointing=False), step.rows, step.seq_len, mask_bytes)
        recomputed = full.largest_layer_bytes + kernel.get("attention_kernel", 0) // max(probed.kernel_layers, 1)
        notes += [note for note in full.notes if note not in notes]
        reliable = reliable and full.reliable
    else:
        terms.update(kernel)
    terms["amp_weight_copies"] = _weight_copy_bytes(config, settings)
    return {name: nbytes for name, nbytes in terms.items() if nbytes}, recomputed, notes, reliable


# ---- states, temporaries, peaks ---------------------------------------------------------------------------------

def optimizer_state_bytes(optimizer: str, train: Trainable) -> int:
    if optimizer == "adamw":
        # exp_avg + exp_avg_sq in the parameter dtype, plus torch's per-parameter scalar `step` tensor (fp32; on the
        # host unless the optimizer is fused/capturable, but optimizer state all the same).
        return 2 * train.bytes_per_param * train.params + _FP32_BYTES * len(train.tensor_shapes)
    if optimizer == "sgd":
        return train.bytes_per_param * train.params  # momentum_buffer
    if optimizer == "adafactor":
        # transformers' Adafactor (beta1=None): row and column second moments for tensors of 2+ dims, the full
        # second moment for vectors, and the parameter's RMS, which it keeps as a 0-d fp32 tensor.
        total = 0
        for dims in train.tensor_shapes:
            if len(dims) >= 2:
                total += math.prod(dims[:-1]) + math.prod(dims[:-2] + dims[-1:])
            else:
                total += math.prod(dims)
        return total * train.bytes_per_param + _FP32_BYTES * len(train.tensor_shapes)
    total = 0  # adamw_8bit
    for dims in train.tensor_shapes:
        n = math.prod(dims)
        if n >= _ADAM8BIT_MIN_SIZE:
            total += 2 * n + 2 * _FP32_BYTES * math.ceil(n / _ADAM8BIT_BLOCK)
        else:
            total += 2 * _FP32_BYTES * n
    return total


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
