"""Memory anatomy of one training step: estimated from the config, measured from the tensors, side by side.

The categories follow the Hugging Face "model training anatomy" page (weights, optimizer states, gradients, saved
forward activations, temporary buffers, functionality-specific memory) with one more, `context`, for what the CUDA
driver and libraries hold before any tensor exists:

    weights      fp32 parameters + buffers (the master copy; 4 bytes/param in fp32 *and* in bf16/fp16 autocast)
    gradients    one fp32 `.grad` per trainable parameter (4 bytes/param)
    optimizer    AdamW exp_avg + exp_avg_sq (8 bytes/param) + one scalar `step` tensor per parameter tensor;
                 SGD momentum_buffer (4 bytes/param); 8-bit AdamW ~2 bytes/param (estimate only)
    activations  every tensor autograd saves for backward during the forward, counted once per storage
    temporary    the largest short-lived buffer outside the saved graph: logits gradients at the start of backward,
                 or the foreach optimizer's scratch at the step (they never coexist; the larger one is reported)
    context      CUDA context + library workspaces, measured (NVML used minus allocator reserved); 0 on CPU

Two choices to know about:
- Mixed precision (`precision="bf16"|"fp16"`) means what `Trainer(bf16=True)` does: fp32 parameters, autocast in
  the forward. The half-precision weight copies autocast makes are *saved for backward*, so they are counted under
  `activations` (term `amp_weight_copies`), not `weights`. The HF page's "6 bytes/param" is 4 (here: weights) + 2
  (here: inside activations). This keeps `weights` equal to the parameter tensors to the byte, and keeps the
  activation estimate comparable with `SavedActivationMeter`, which sees those copies as non-parameter storages.
- Activations are a per-layer formula in the spirit of Korthikanti et al. 2022, "Reducing Activation Recomputation
  in Large Transformer Models" (GPT layer: s*b*h*(34 + 5*a*s/h) bytes in fp16 with dropout). Their 34 assumes
  Megatron's GPT (LayerNorm, 4h GELU MLP, dropout everywhere, 1-byte masks). The HF models here save different
  things, measured with saved-tensor hooks on torch 2.13 / transformers 5.24 and written out term by term in
  `activation_terms`: RMSNorm saves its input, its normalized output and one rsqrt per token; a SwiGLU MLP saves
  gate, act(gate), up and their product (4 x tokens x intermediate); attention saves q, k, v, the output and a
  logsumexp per token and head; rotary saves one cos and one sin table for the whole model; no dropout masks when
  dropout is 0. The quadratic a*s^2 term exists only where a path materialises scores (eager: the softmax output
  per head). CPU/CUDA SDPA with an explicit mask runs a flash-style kernel that saves no scores but does save the
  (converted) mask once per layer: rows x s^2 elements, without a head dimension.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import torch

from demo_core.errors import DemoInputError

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporary", "context")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "adamw_8bit", "sgd")
ATTENTIONS = ("sdpa", "eager", "varlen", "flash_attention_2")

# Bytes of the compute dtype: autocast's half types are 2 bytes, fp32 is 4.
_COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# The residual stream, norms, rotary tables, softmax statistics and the loss stay fp32 under autocast
# (parameters are fp32, residual adds promote to fp32, log_softmax is an autocast fp32 op).
_FP32_BYTES = 4
_INT64_BYTES = 8

# The seed example of the HF "model training anatomy" page: bert-large-uncased, batch 4, seq 512, fp32, AdamW,
# on a 16 GB V100; nvidia-smi showed 14,949 MB of which ~1.3 GB was the CUDA context (CUDA 11, before lazy loading).
SEED_MEASURED_MB = 14_949
SEED_CONTEXT_MB_REPORTED = 1_300

# The blog's peak-memory claims for padding-free packing vs padding (relative change of the peak).
BLOG_PEAK_MEMORY_CHANGE = {"flan-like": -0.20, "orcamath-like": -0.06}


# --------------------------------------------------------------------------------------------------------------
# Model facts: read from the config, counted exactly on the meta device
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What the activation formula needs from a config (names as in the Korthikanti paper where they exist)."""

    model_type: str
    hidden: int  # h
    layers: int  # L
    heads: int  # a
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    norm: str  # "rmsnorm" | "layernorm"
    gated_mlp: bool  # gate/up/down (SwiGLU-style) vs fc/act/proj
    fused_qkv: bool  # one linear produces q, k and v (phi3 qkv_proj, gpt2 c_attn)
    fused_gate_up: bool  # phi3 gate_up_proj
    activation: str
    rotary: bool
    attention_dropout: float
    hidden_dropout: float
    embedding_dropout: float
    head: str  # "causal_lm" | "sequence_classification"
    num_labels: int


def _first(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def model_shape(config: Any) -> ModelShape:
    """Read the dimensions of any causal-LM config (llama, mistral, qwen2, gemma, phi3, granite, gpt2) or BERT."""
    model_type = getattr(config, "model_type", "") or ""
    hidden = int(_first(config, "hidden_size", "n_embd", "d_model"))
    layers = int(_first(config, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_first(config, "num_attention_heads", "n_head"))
    kv_heads = int(_first(config, "num_key_value_heads", default=heads))
    head_dim = int(_first(config, "head_dim", default=hidden // heads))
    intermediate = int(_first(config, "intermediate_size", "n_inner", default=4 * hidden))
    vocab = int(config.vocab_size)
    layernorm_types = {"gpt2", "bert", "gpt_neox", "opt", "gptj", "phi"}
    norm = "layernorm" if model_type in layernorm_types else "rmsnorm"
    gated = model_type not in layernorm_types
    activation = str(_first(config, "hidden_activation", "hidden_act", "activation_function", default="silu"))
    dropout = lambda *names: float(_first(config, *names, default=0.0) or 0.0)  # noqa: E731
    is_bert = model_type == "bert"
    return ModelShape(
        model_type=model_type,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        norm=norm,
        gated_mlp=gated,
        fused_qkv=model_type in {"phi3", "gpt2"},
        fused_gate_up=model_type == "phi3",
        activation=activation,
        rotary=model_type not in {"gpt2", "bert", "opt"},
        attention_dropout=dropout("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"),
        hidden_dropout=dropout("resid_pdrop", "hidden_dropout_prob", "hidden_dropout"),
        embedding_dropout=dropout("embd_pdrop", "hidden_dropout_prob") if model_type in {"gpt2", "bert"} else 0.0,
        head="sequence_classification" if is_bert else "causal_lm",
        num_labels=int(getattr(config, "num_labels", 2)) if is_bert else 0,
    )


@dataclass(frozen=True)
class ParamFacts:
    """Exact counts from the model built on the meta device (no memory, no weights downloaded)."""

    params: int  # unique parameter elements (tied weights once)
    param_tensors: int  # unique parameter tensors (one AdamW `step` each)
    buffer_bytes: int  # registered buffers (rotary inv_freq, ...), live next to the weights
    linear_weight_params: int  # elements of matmul weights autocast copies to half precision
    tensor_numels: tuple[int, ...]  # per parameter tensor, for 8-bit AdamW's small-tensor rule


def _build_meta_model(config: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    with torch.device("meta"):
        if getattr(config, "model_type", "") == "bert":
            # The seed example trains AutoModelForSequenceClassification (random binary labels).
            return AutoModelForSequenceClassification.from_config(config)
        return AutoModelForCausalLM.from_config(config)


_PARAM_FACTS_CACHE: dict[tuple[str, str], ParamFacts] = {}


def param_facts(config: Any) -> ParamFacts:
    """Exact parameter/buffer counts of the model this config builds on the meta device (cached per config)."""
    key = (type(config).__name__, config.to_json_string(use_diff=False))
    if key in _PARAM_FACTS_CACHE:
        return _PARAM_FACTS_CACHE[key]
    model = _build_meta_model(config)
    params = list(model.parameters())  # .parameters() yields a tied weight once
    linear_ids: set[int] = set()
    linear_elems = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        # nn.Linear and transformers' Conv1D (gpt2) are the matmuls autocast runs in half precision; embeddings
        # and norms are not, so their weights are never copied.
        if isinstance(weight, torch.nn.Parameter) and type(module).__name__ in {"Linear", "Conv1D"}:
            if id(weight) not in linear_ids:
                linear_ids.add(id(weight))
                linear_elems += weight.numel()
    facts = ParamFacts(
        params=sum(p.numel() for p in params),
        param_tensors=len(params),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        linear_weight_params=linear_elems,
        tensor_numels=tuple(p.numel() for p in params),
    )
    _PARAM_FACTS_CACHE[key] = facts
    return facts


# --------------------------------------------------------------------------------------------------------------
# Estimate
# --------------------------------------------------------------------------------------------------------------

# Tensors an MLP activation saves, in units of tokens x intermediate, *including its input*. Measured:
# silu/gelu/gelu(tanh)/relu save one; gpt2's "gelu_new" is a Python composite (0.5*x*(1+tanh(...))) that saves four.
_ACTIVATION_SAVED = {"silu": 1, "swish": 1, "gelu": 1, "gelu_pytorch_tanh": 1, "relu": 1, "gelu_new": 4,
                     "gelu_fast": 3, "quick_gelu": 2}


@dataclass
class MemoryEstimate:
    categories: dict[str, int]  # the six CATEGORIES, bytes
    activation_terms: dict[str, int]  # what makes up `activations`, bytes
    temporary_terms: dict[str, int]  # what makes up `temporary`, bytes
    peak_by_moment: dict[str, int]  # estimated live bytes at each moment of a step (context included)
    tokens: int  # token slots the model computes on (B*S padded, real tokens packed)
    params: int
    notes: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return max(self.peak_by_moment.values())

    @property
    def peak_moment(self) -> str:
        return max(self.peak_by_moment, key=self.peak_by_moment.get)


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise DemoInputError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def activation_terms(
    shape: ModelShape,
    facts: ParamFacts,
    *,
    batch_size: int,
    seq_len: int,
    real_tokens: int | None = None,
    packed: bool = False,
    precision: str = "fp32",
    attention: str = "sdpa",
    gradient_checkpointing: bool = False,
    segment_lengths: Sequence[int] | None = None,
    device_type: str = "cpu",
    varlen_materializes_scores: bool = False,
) -> dict[str, int]:
    """Bytes saved for backward, term by term (the sum is the `activations` category).

    Token count T: padded -> batch_size*seq_len (pad slots are computed and saved like real ones); packed -> the
    real tokens in the packed row(s). Per decoder layer (c = compute bytes, 4 fp32 / 2 autocast; r = 4):
      norms           2 x (input T*h*r + output T*h*c-or-r + per-token statistics)
      attention in    T*h*c per distinct q/k/v input (1 in fp32; under autocast each projection casts its own copy)
      q, k, v, out    T*(a + 2*kv' + a)*d*c, kv' = a when the kv heads are repeated (eager, sdpa with a mask)
      logsumexp       T*a*4 (flash-style kernels: sdpa, varlen, flash_attention_2)
      scores          eager: rows*a*s^2*4 softmax output (+ a half copy under autocast, + dropout mask/output)
      sdpa mask       sdpa with a mask: rows*s^2*c per layer (the kernel converts the bool mask and keeps it)
      o_proj in       eager: T*a*d*c (a fresh transpose copy); flash-style kernels hand back a layout whose
                      transpose is already contiguous, so it is the saved output itself
      MLP             gated: T*h*c (x2 under autocast) + 4*T*i*c; plain: T*h*c + (act + 1)*T*i*c
      dropout masks   when p > 0: T*h per hidden dropout (4 bytes on CPU, 1 on CUDA)
    Once per model: token ids (T*8), rotary cos+sin, final norm, lm_head input, log_softmax output (T*V*4) and
    labels; under autocast the half copies of every matmul weight (`amp_weight_copies`).
    The quadratic term uses s^2 per row for padded batches; for packed rows it is (sum s_i)^2 on sdpa/eager
    (dense block-diagonal mask) and sum s_i^2 on varlen/flash_attention_2 -- and on those the kernels save no
    scores at all, so it only counts when `varlen_materializes_scores` says the varlen path falls back to math.
    """
    h, L, a, d = shape.hidden, shape.layers, shape.heads, shape.head_dim
    i, V = shape.intermediate, shape.vocab
    c = _COMPUTE_BYTES[precision]
    amp = precision != "fp32"
    r = _FP32_BYTES

    if packed:
        if segment_lengths is not None:
            seg = [int(s) for s in segment_lengths if int(s) > 0]
            T = real_tokens if real_tokens is not None else sum(seg)
        else:
            T = real_tokens if real_tokens is not None else batch_size * seq_len
            seg = [T]
        rows = 1
        row_len = T
        pos_len = T  # position_ids (1, T) restart per segment -> cos/sin for every packed position
    else:
        T = batch_size * seq_len
        seg = [seq_len] * batch_size
        rows = batch_size
        row_len = seq_len
        pos_len = seq_len  # position_ids (1, S) broadcast over the batch
    has_padding = (not packed) and real_tokens is not None and real_tokens < batch_size * seq_len
    # transformers builds an explicit mask for sdpa/eager when there is padding or packing; without either it
    # calls SDPA with is_causal=True and no mask.
    dense_mask = attention in ("sdpa", "eager") and (packed or has_padding)
    if shape.head == "sequence_classification":
        dense_mask = attention in ("sdpa", "eager")  # BERT always passes its extended mask
    flash_style = attention in ("varlen", "flash_attention_2") or (attention == "sdpa" and shape.attention_dropout == 0)
    dropout_mask_bytes = 1 if device_type == "cuda" else 4  # CUDA fused dropout keeps a bool mask; CPU a float one

    terms: dict[str, int] = {}

    def add(name: str, nbytes: float) -> None:
        terms[name] = terms.get(name, 0) + int(nbytes)

    # -- once per model --------------------------------------------------------------------------------------
    add("embedding_ids", T * _INT64_BYTES)
    if shape.model_type == "gpt2":
        add("embedding_ids", pos_len * _INT64_BYTES)  # wpe looks up position ids
    if shape.embedding_dropout > 0:
        add("dropout_masks", T * h * dropout_mask_bytes)
    if shape.model_type == "gemma":
        add("embedding_ids", _FP32_BYTES)  # the sqrt(hidden) normalizer is a 0-d tensor the scaling mul saves
    if shape.rotary:
        add("rotary_cos_sin", 2 * pos_len * d * _FP32_BYTES)

    # -- per layer ---------------------------------------------------------------------------------------------
    def norm_bytes() -> int:
        # RMSNorm: input (pow), normalized x*rsqrt (for the weight mul), rsqrt per token. LayerNorm: input,
        # mean and rstd per token. The norm *output* is the next matmul's input, counted there.
        if shape.norm == "rmsnorm":
            # Gemma multiplies by (1 + weight) computed afresh in every norm: one more h-sized fp32 tensor.
            return T * h * r * 2 + T * _FP32_BYTES + (h * _FP32_BYTES if shape.model_type == "gemma" else 0)
        return T * h * r + 2 * T * _FP32_BYTES

    def linear_inputs(count_if_amp: int) -> int:
        # fp32: several projections read the same norm output (one storage). Autocast casts the input once per op.
        return T * h * (count_if_amp * c if amp else r)

    kv_saved = a if (attention == "eager" or dense_mask or not flash_style) else shape.kv_heads
    if shape.model_type == "gpt2":
        kv_saved = a
    per_layer: dict[str, int] = {}

    def add_layer(name: str, nbytes: float) -> None:
        per_layer[name] = per_layer.get(name, 0) + int(nbytes)

    add_layer("norms", 2 * norm_bytes())
    add_layer("attention_input", linear_inputs(1 if shape.fused_qkv else 3))
    add_layer("q_k_v", T * (a + 2 * kv_saved) * d * c)
    quad_rows = [row_len] * rows if packed else seg
    if packed and attention in ("varlen", "flash_attention_2"):
        quad_rows = seg
    score_elems = sum(s * s for s in quad_rows)  # per head
    if attention == "eager" or (attention == "sdpa" and not flash_style):
        # softmax output in fp32 (HF eager: softmax(dtype=float32)); autocast then feeds a half copy to p@v.
        add_layer("attention_scores", score_elems * a * _FP32_BYTES)
        if amp:
            add_layer("attention_scores", score_elems * a * c)
        if shape.attention_dropout > 0:
            add_layer("attention_scores", score_elems * a * (dropout_mask_bytes + c))
        add_layer("attention_output", T * a * d * c)  # transpose(1, 2).contiguous() before o_proj
        if shape.model_type == "gpt2" and rows == 1 and attention == "sdpa":
            # gpt2's math-path SDPA: with one row, v reaches the kernel as a view of c_attn's fused q|k|v output,
            # so the whole 3h-wide storage stays alive (with more rows the reshape copies v alone). Measured.
            add_layer("q_k_v", 2 * T * h * c)
    else:
        add_layer("attention_output", T * a * d * c)
        add_layer("attention_logsumexp", T * a * _FP32_BYTES)
        if shape.model_type == "phi3":
            # phi3's partial-rotary cat() hands SDPA a (B, a, S, d)-contiguous query, so the output's
            # transpose(1, 2) is not contiguous and o_proj gets a fresh copy. Measured.
            add_layer("attention_output", T * a * d * c)
        if dense_mask and attention == "sdpa":
            add_layer("sdpa_mask", score_elems * c)
        if attention in ("varlen", "flash_attention_2") and varlen_materializes_scores:
            add_layer("attention_scores", score_elems * a * _FP32_BYTES)
    if shape.hidden_dropout > 0:
        add_layer("dropout_masks", 2 * T * h * dropout_mask_bytes)

    act_saved = _ACTIVATION_SAVED.get(shape.activation, 1)
    if shape.gated_mlp:
        add_layer("mlp", linear_inputs(1 if shape.fused_gate_up else 2))
        # act input (= gate out) + act internals + act out + up out + (act*up) for down_proj
        add_layer("mlp", (act_saved + 3) * T * i * c)
    else:
        add_layer("mlp", linear_inputs(1))
        add_layer("mlp", (act_saved + 1) * T * i * c)

    layer_total = sum(per_layer.values())
    if gradient_checkpointing:
        # HF checkpointing keeps each layer's input (the fp32 residual stream) and recomputes one layer at a time
        # during backward, so one layer's full set is alive on top of the checkpoints at the peak.
        add("checkpointed_layer_inputs", L * T * h * r)
        add("recomputed_layer", layer_total)
    else:
        for name, nbytes in per_layer.items():
            add(name, L * nbytes)

    # -- head ---------------------------------------------------------------------------------------------------
    if shape.head == "causal_lm":
        if shape.norm == "rmsnorm" or shape.model_type == "gpt2":
            add("final_norm", norm_bytes())
        add("lm_head_input", linear_inputs(1))
        # HF's loss upcasts logits and cross_entropy's log_softmax keeps its fp32 output for backward.
        add("logits_log_softmax", T * V * _FP32_BYTES)
        # HF pads labels by one column and shifts; with a single row the shifted labels stay a view of the
        # padded (T + 1)-long storage, with more rows they are copied to T. Plus the 0-d total_weight.
        add("labels", (T + (1 if rows == 1 else 0)) * _INT64_BYTES + _FP32_BYTES)
    else:
        add("embedding_norm", norm_bytes())
        add("embedding_ids", 2 * T * _INT64_BYTES)  # position and token type ids
        # The pooler reads hidden[:, 0], a view that keeps the whole last-layer output alive; then tanh output,
        # dropout mask and the classifier input per sequence.
        add("pooler_classifier", T * h * r + 3 * batch_size * h * c + batch_size * shape.num_labels * _FP32_BYTES)
    if amp:
        add("amp_weight_copies", facts.linear_weight_params * c)
    return terms


def _optimizer_state_bytes(optimizer: str, facts: ParamFacts, trainable_params: int, trainable_tensors: int) -> int:
    if optimizer == "adamw":
        # exp_avg + exp_avg_sq in fp32, plus torch's per-parameter scalar `step` tensor (fp32, 4 bytes each; it
        # lives on the host unless the optimizer is fused/capturable, but it is optimizer state all the same).
        return 8 * trainable_params + 4 * trainable_tensors
    if optimizer == "sgd":
        return 4 * trainable_params  # momentum_buffer
    # bitsandbytes 8-bit AdamW: two uint8 states + one fp32 absmax per 2048-element block; tensors under 4096
    # elements stay 32-bit (its min_8bit_size). Estimate only: bitsandbytes is not installed here.
    total = 0
    numels = facts.tensor_numels if trainable_params == facts.params else (trainable_params,)
    for n in numels:
        total += 2 * n + 8 * math.ceil(n / 2048) if n >= 4096 else 8 * n
    return total


def estimate_memory_detail(
    config: Any,
    *,
    batch_size: int,
    seq_len: int,
    real_tokens: int | None = None,
    packed: bool = False,
    precision: str = "fp32",
    optimizer: str = "adamw",
    attention: str = "sdpa",
    gradient_checkpointing: bool = False,
    segment_lengths: Sequence[int] | None = None,
    trainable_params: int | None = None,
    trainable_tensors: int | None = None,
    context_bytes: int | None = None,
    device_type: str = "cpu",
    varlen_materializes_scores: bool = False,
) -> MemoryEstimate:
    """`estimate_memory` with the terms behind each category and the peak per moment of the step."""
    _check_choice("precision", precision, PRECISIONS)
    _check_choice("optimizer", optimizer, OPTIMIZERS)
    _check_choice("attention", attention, ATTENTIONS)
    if batch_size < 1 or seq_len < 1:
        raise DemoInputError("batch_size and seq_len must be at least 1")
    shape = model_shape(config)
    facts = param_facts(config)
    n_train = facts.params if trainable_params is None else int(trainable_params)
    n_train_tensors = facts.param_tensors if trainable_tensors is None else int(trainable_tensors)

    act = activation_terms(
        shape, facts, batch_size=batch_size, seq_len=seq_len, real_tokens=real_tokens, packed=packed,
        precision=precision, attention=attention, gradient_checkpointing=gradient_checkpointing,
        segment_lengths=segment_lengths, device_type=device_type,
        varlen_materializes_scores=varlen_materializes_scores,
    )
    tokens = (real_tokens if real_tokens is not None else (sum(segment_lengths) if segment_lengths else
              batch_size * seq_len)) if packed else batch_size * seq_len
    c = _COMPUTE_BYTES[precision]
    out_width = shape.vocab if shape.head == "causal_lm" else shape.num_labels
    temporary_terms = {
        # Start of backward: nll_loss's gradient and log_softmax's gradient, both T x V fp32, plus the half copy
        # for the logits under autocast.
        "logits_gradients": tokens * out_width * (2 * _FP32_BYTES + (c if precision != "fp32" else 0)),
        # torch AdamW's foreach path (the default on CUDA) allocates sqrt(exp_avg_sq) for the whole group (4 B/param);
        # the single-tensor path (CPU) one parameter at a time. SGD and 8-bit AdamW update in place.
        "optimizer_step": (
            4 * (n_train if device_type == "cuda" else max(facts.tensor_numels, default=0))
            if optimizer == "adamw" else 0
        ),
    }
    categories = {
        "weights": 4 * facts.params + facts.buffer_bytes,
        "gradients": 4 * n_train,
        "optimizer": _optimizer_state_bytes(optimizer, facts, n_train, n_train_tensors),
        "activations": sum(act.values()),
        "temporary": max(temporary_terms.values()),
        "context": int(context_bytes or 0),
    }
    base = categories["weights"] + categories["optimizer"] + categories["context"]
    peak_by_moment = {
        # Trainer zeroes gradients with set_to_none, so none exist during the forward of step >= 2.
        "forward_end": base + categories["activations"],
        "backward_start": base + categories["activations"] + temporary_terms["logits_gradients"],
        "optimizer_step": base + categories["gradients"] + temporary_terms["optimizer_step"],
    }
    notes = []
    if attention in ("varlen", "flash_attention_2") and not varlen_materializes_scores:
        notes.append("varlen/flash kernels save a logsumexp per token, no scores: no quadratic memory term")
    if precision != "fp32":
        notes.append("half-precision weight copies are counted in activations (amp_weight_copies)")
    return MemoryEstimate(categories, act, temporary_terms, peak_by_moment, tokens, facts.params, notes)


def estimate_memory(config: Any, **kwargs: Any) -> dict[str, int]:
    """Estimated bytes per category (`CATEGORIES`) for one training step; see `estimate_memory_detail`.

    Keyword arguments: batch_size, seq_len, real_tokens=None, packed=False, precision="fp32"|"bf16"|"fp16",
    optimizer="adamw"|"adamw_8bit"|"sgd", attention="sdpa"|"eager"|"varlen"|"flash_attention_2",
    gradient_checkpointing=False, segment_lengths=None, trainable_params=None, context_bytes=None,
    device_type="cpu"|"cuda", varlen_materializes_scores=False.
    """
    return estimate_memory_detail(config, **kwargs).categories


# --------------------------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------------------------


def _storage_key(t: torch.Tensor) -> tuple[str, int, int]:
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr(), storage.nbytes())


def _unwrap_optimizer(optimizer: Any) -> Any:
    # accelerate's AcceleratedOptimizer (what Trainer holds) wraps the torch optimizer in `.optimizer`.
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def tensor_bytes_by_category(model: torch.nn.Module, optimizer: Any = None) -> dict[str, int]:
    """Exact bytes of weights (parameters + buffers), gradients and optimizer state, each storage counted once."""
    seen: set[tuple[str, int, int]] = set()

    def total(tensors: Iterable[torch.Tensor]) -> int:
        nbytes = 0
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            key = _storage_key(t)
            if key[1] == 0 and t.device.type != "meta":
                continue
            if key in seen:
                continue
            seen.add(key)
            nbytes += key[2]
        return nbytes

    params = list(model.parameters())
    weights = total(list(params) + list(model.buffers()))
    gradients = total(p.grad for p in params if p.grad is not None)
    opt = _unwrap_optimizer(optimizer)
    state_tensors: list[torch.Tensor] = []
    if opt is not None:
        for state in opt.state.values():
            state_tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return {"weights": weights, "gradients": gradients, "optimizer": total(state_tensors)}


class SavedActivationMeter:
    """Counts the bytes autograd saves for backward while active, one count per storage, parameters excluded.

    Use as a context manager around the forward (and loss), or `attach(model)` to have it switch on in a forward
    pre-hook and off in the forward hook of every call (the loss of HF models is computed inside forward).
    The pack hook returns the tensor itself, so numerics and lifetimes are unchanged; the meter keeps only
    (device, data_ptr, nbytes) keys, never a reference. A view of a parameter (weight.t() for a matmul) shares the
    parameter's storage and is excluded; autocast's half copies of weights are new storages and are counted.
    Caveat: a storage freed *during* the forward and reused at the same address with the same size by a later saved
    tensor would be counted once; saved tensors stay alive until backward, so this needs an unsaved graph branch.
    """

    def __init__(self, model: torch.nn.Module | None = None):
        self.model = model
        self.saved_bytes = 0
        self.saved_tensors = 0
        self.max_saved_bytes = 0
        self.history: list[int] = []  # saved_bytes of each metered forward, in order
        self._keys: set[tuple[str, int, int]] = set()
        self._param_ptrs: set[tuple[str, int]] = set()
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._handles: list[Any] = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if (key[0], key[1]) not in self._param_ptrs and key not in self._keys:
            self._keys.add(key)
            self.saved_bytes += key[2]
            self.saved_tensors += 1
        return t

    def start(self) -> None:
        """Begin a new count (resets saved_bytes) and install the hooks."""
        if self._hooks is not None:
            return
        self._param_ptrs = (
            {(str(p.device), p.untyped_storage().data_ptr()) for p in self.model.parameters()}
            if self.model is not None else set()
        )
        self._keys = set()
        self.saved_bytes = 0
        self.saved_tensors = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()

    def stop(self) -> int:
        """Remove the hooks, record this forward's total and return it."""
        if self._hooks is None:
            return self.saved_bytes
        self._hooks.__exit__(None, None, None)
        self._hooks = None
        self._keys = set()  # drop the keys; only the totals are kept
        self.history.append(self.saved_bytes)
        self.max_saved_bytes = max(self.max_saved_bytes, self.saved_bytes)
        return self.saved_bytes

    def __enter__(self) -> "SavedActivationMeter":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def attach(self, model: torch.nn.Module | None = None, on_forward_end: Any = None) -> "SavedActivationMeter":
        """Meter every forward of `model` (pre-hook starts, forward hook stops). `detach()` removes the hooks.

        `on_forward_end(saved_bytes)` runs right after each forward, e.g. `lambda _: peaks.mark("forward_end")`.
        """
        model = model if model is not None else self.model
        if self.model is None:
            self.model = model

        def _end(*_: Any) -> None:
            saved = self.stop()
            if on_forward_end is not None:
                on_forward_end(saved)

        self._handles.append(model.register_forward_pre_hook(lambda *_: self.start()))
        self._handles.append(model.register_forward_hook(_end))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.stop()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _nvml_memory(cuda_index: int) -> dict[str, int | None] | None:
    """NVML's view of the device: used bytes on the whole device and, if visible, this process's bytes.

    Returns None when NVML is unavailable (no package, no driver: NVMLError_LibraryNotFound, ...).
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = None
        try:
            # NVML numbers devices physically; torch numbers them after CUDA_VISIBLE_DEVICES. The UUID matches both.
            uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # older torch without .uuid, MIG UUIDs, ...: fall back to the index
            handle = pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        process_bytes = None
        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    process_bytes = int(proc.usedGpuMemory)
        except pynvml.NVMLError:
            process_bytes = None  # containers often hide other PIDs; keep the device total
        return {"device_used_bytes": int(info.used), "device_total_bytes": int(info.total),
                "process_used_bytes": process_bytes}
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def device_memory_snapshot(device: Any = None) -> dict[str, Any]:
    """What the device says about memory right now (nothing hard-coded).

    CUDA: allocated / max allocated (live tensors), reserved / max reserved (the caching allocator's pool), NVML
    used bytes for the device and this process, and `context_bytes` = NVML process (or device) used - reserved:
    the CUDA context and library workspaces that no tensor accounts for. CPU: the process RSS via psutil.
    """
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    snapshot: dict[str, Any] = {"device": str(dev), "kind": dev.type}
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        reserved = int(torch.cuda.memory_reserved(index))
        snapshot.update(
            allocated_bytes=int(torch.cuda.memory_allocated(index)),
            max_allocated_bytes=int(torch.cuda.max_memory_allocated(index)),
            reserved_bytes=reserved,
            max_reserved_bytes=int(torch.cuda.max_memory_reserved(index)),
        )
        nvml = _nvml_memory(index)
        snapshot["nvml_device_used_bytes"] = nvml["device_used_bytes"] if nvml else None
        snapshot["nvml_process_used_bytes"] = nvml["process_used_bytes"] if nvml else None
        used = None
        if nvml:
            # Prefer this process's own figure; the device total also includes other processes.
            used = nvml["process_used_bytes"] if nvml["process_used_bytes"] is not None else nvml["device_used_bytes"]
        snapshot["context_source"] = (
            None if used is None else ("nvml_process" if nvml["process_used_bytes"] is not None else "nvml_device")
        )
        snapshot["context_bytes"] = max(0, used - reserved) if used is not None else None
        return snapshot
    try:
        import psutil

        snapshot["rss_bytes"] = int(psutil.Process().memory_info().rss)
    except ImportError:
        snapshot["rss_bytes"] = None
    snapshot["context_bytes"] = 0
    return snapshot


class PhasePeaks:
    """Peak bytes per moment of a step: `mark(moment)` closes the phase that ended at that moment.

    CUDA: max_memory_allocated since the previous mark (the peak stats are reset at each mark).
    CPU: there is no per-phase allocator peak; the phase value is the process RSS at the mark.
    """

    def __init__(self, device: Any = None):
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        self.peaks: dict[str, int] = {}

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def mark(self, moment: str) -> int:
        if self.device.type == "cuda":
            value = int(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            value = int(device_memory_snapshot(self.device).get("rss_bytes") or 0)
        self.peaks[moment] = max(self.peaks.get(moment, 0), value)
        return value

    @property
    def peak_bytes(self) -> int | None:
        return max(self.peaks.values()) if self.peaks else None

    @property
    def peak_moment(self) -> str | None:
        return max(self.peaks, key=self.peaks.get) if self.peaks else None


def memory_report(
    estimate: Mapping[str, int],
    measured: Mapping[str, int | None],
    peak_bytes: int | None = None,
    peak_moment: str | None = None,
) -> dict[str, Any]:
    """Estimate and measurement per category, with the signed relative error (estimate - measured) / measured."""
    est = {cat: int(estimate.get(cat, 0)) for cat in CATEGORIES}
    meas = {cat: (None if measured.get(cat) is None else int(measured[cat])) for cat in CATEGORIES}
    error: dict[str, float | None] = {}
    for cat in CATEGORIES:
        m = meas[cat]
        if m is None:
            error[cat] = None
        elif m == 0:
            error[cat] = 0.0 if est[cat] == 0 else None  # a relative error against zero means nothing
        else:
            error[cat] = (est[cat] - m) / m
    return {"estimate": est, "measured": meas, "error": error, "peak_bytes": peak_bytes, "peak_moment": peak_moment}


def measured_categories(
    model: torch.nn.Module, optimizer: Any = None, meter: SavedActivationMeter | None = None,
    snapshot: Mapping[str, Any] | None = None,
) -> dict[str, int | None]:
    """The measured side of `memory_report`: tensor sums, the meter's largest forward, the snapshot's context."""
    measured: dict[str, int | None] = dict(tensor_bytes_by_category(model, optimizer))
    measured["activations"] = meter.max_saved_bytes if meter is not None and meter.history else None
    measured["temporary"] = None  # only an allocator timeline (CUDA peaks per phase) shows temporaries
    measured["context"] = snapshot.get("context_bytes") if snapshot else None
    return measured


# --------------------------------------------------------------------------------------------------------------
# What-if, comparisons, the seed example
# --------------------------------------------------------------------------------------------------------------


def what_if_grid(
    config: Any,
    *,
    batch_sizes: Sequence[int],
    seq_lens: Sequence[int],
    precisions: Sequence[str] = ("fp32",),
    optimizers: Sequence[str] = ("adamw",),
    attentions: Sequence[str] = ("sdpa",),
    packed: Sequence[bool] = (False,),
    gradient_checkpointing: Sequence[bool] = (False,),
    context_bytes: int | None = None,
    device_type: str = "cpu",
) -> list[dict[str, Any]]:
    """One row per combination: the settings, the six categories, the total and the estimated peak. Runs nothing."""
    rows = []
    for b in batch_sizes:
        for s in seq_lens:
            for precision in precisions:
                for opt in optimizers:
                    for attn in attentions:
                        for is_packed in packed:
                            for ckpt in gradient_checkpointing:
                                est = estimate_memory_detail(
                                    config, batch_size=b, seq_len=s, packed=is_packed, precision=precision,
                                    optimizer=opt, attention=attn, gradient_checkpointing=ckpt,
                                    context_bytes=context_bytes, device_type=device_type,
                                )
                                rows.append({
                                    "batch_size": b, "seq_len": s, "precision": precision, "optimizer": opt,
                                    "attention": attn, "packed": is_packed, "gradient_checkpointing": ckpt,
                                    **{f"{k}_bytes": v for k, v in est.categories.items()},
                                    "total_bytes": sum(est.categories.values()),
                                    "peak_bytes": est.peak_bytes, "peak_moment": est.peak_moment,
                                })
    return rows


def _get(result: Any, name: str) -> Any:
    return result.get(name) if isinstance(result, Mapping) else getattr(result, name, None)


def compare_peaks(results: Sequence[Any], baseline: str = "padded") -> dict[str, dict[str, Any]]:
    """Each collator's peak memory and its relative change against the baseline collator's peak.

    `results` are result dicts/objects with `collator` and `peak_memory_bytes`. The blog reports -20% (FLAN) and
    -6% (OrcaMath) peak memory with packing (`BLOG_PEAK_MEMORY_CHANGE`); `change_vs_padded` is the same quantity.
    """
    peaks = {_get(r, "collator"): _get(r, "peak_memory_bytes") for r in results}
    base = peaks.get(baseline)
    out = {}
    for name, peak in peaks.items():
        change = (peak / base - 1.0) if (peak is not None and base) else None
        out[name] = {"peak_memory_bytes": peak, "change_vs_padded": change,
                     "ratio_vs_padded": None if change is None else 1.0 + change}
    return out


def bert_large_config() -> Any:
    """bert-large-uncased's shape, built offline (BertConfig() defaults are bert-base)."""
    from transformers import BertConfig

    return BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                      vocab_size=30522, num_labels=2)


def seed_example_estimate(context_bytes: int | None = None) -> dict[str, Any]:
    """The HF anatomy page's seed run, estimated: bert-large-uncased, batch 4, seq 512, fp32, AdamW, eager, V100.

    The page measured 14,949 MB with nvidia-smi. The estimate of live tensors is smaller; the gap is what no tensor
    formula sees: the CUDA context (~1.3 GB on that CUDA 11 setup, loaded eagerly; pass `context_bytes` if you
    measured one), the caching allocator's reserved-but-free blocks (fragmentation; reserved >= allocated),
    cuBLAS/cuDNN workspaces, and the run had already done earlier steps, so nvidia-smi shows the pool's high-water
    mark rather than one step's peak. See docs/MEMORY.md.
    """
    config = bert_large_config()
    est = estimate_memory_detail(
        config, batch_size=4, seq_len=512, precision="fp32", optimizer="adamw", attention="eager",
        context_bytes=context_bytes if context_bytes is not None else SEED_CONTEXT_MB_REPORTED * 2**20,
        device_type="cuda",
    )
    total = sum(est.categories.values())
    measured_bytes = SEED_MEASURED_MB * 2**20
    return {
        "params": est.params,
        "categories": est.categories,
        "activation_terms": est.activation_terms,
        "peak_by_moment": est.peak_by_moment,
        "sum_of_categories_bytes": total,
        "peak_bytes": est.peak_bytes,
        "peak_moment": est.peak_moment,
        "seed_measured_bytes": measured_bytes,
        "unexplained_bytes": measured_bytes - est.peak_bytes,
    }
