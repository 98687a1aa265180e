"""The probe's tiny copy of a model: the same config class with its widths (head_dim, hidden size, intermediate
sizes, vocabulary) replaced by small values and two decoder layers per kind of layer, everything else as the real
model has it (head counts, rotary fraction, norms, biases, activation, MoE expert counts), built with what changes
what autograd saves (`ProbeSpec`: layout, precision, attention, checkpointing, LoRA, TRL's fused head).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from demo_core.caches import LRU
from demo_core.isolation import exclusive
from demo_core.memory.heads import decoder_layers, head_dim, model_class_for
from demo_core.memory.parameters import layer_structure, param_facts
from demo_core.models.lora import apply_lora
from demo_core.precision import PRECISIONS

# Config fields the probe shrinks when present as integers; every other field keeps its real value, so it is exact
# by construction (only slower when large).
_WIDTH_FIELDS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size",
                 "n_inner")


# Fields named like widths that are not (a sliding window equal to the hidden size stays a window).
_NOT_WIDTHS = ("hidden_size", "vocab_size", "sliding_window", "max_position_embeddings", "max_window_layers")


_VOCAB_POINTS = (64, 96)  # probe vocabulary sizes: base and bumped


_WIDTH_POINTS = (24, 40)  # multiples of 8: a bf16 row of them is 16-byte aligned, as grouped GEMMs (MoE) require


_HIDDEN_POINTS = (40, 56)  # only when hidden size is not heads x head_dim (explicit head_dim)
_HIDDEN_BUMP = 16  # the bumped hidden point's distance from the base, at least (rounded up to the config's multiple)


# Head counts of linear-attention and SSM layers (gated delta nets: Qwen3-Next, Qwen3.5, Olmo-Hybrid; Kimi delta
# attention: the Bailing hybrid; Mamba-2 with its own head width: NemotronH), shrunk like widths: every tensor such a
# layer saves holds one head axis or none, so its bytes are affine in the count; the value heads follow the key heads
# at the real model's ratio (each key head serves that many value heads). Real counts (16 and 32 in Qwen3-Next, 32 in
# Bailing, 128 in NemotronH) with real head widths (64-128) make a probe forward of its chunked scan cost hundreds of
# MB (a Bailing plan took over 10 minutes, 96 s shrunk; NemotronH over 5 minutes).
_HEAD_COUNT_WIDTHS = {"linear_num_key_heads": ("linear_num_value_heads",), "linear_num_heads": (),
                      "mamba_num_heads": ()}


def _head_count_points(config: Any, name: str) -> tuple[int, int]:
    """Probe counts of a head-count field. Kimi delta attention's start at two: fitted from one head, a tiny Bailing
    model's packed batch was 3 KB off in 24 MB; from two, exact to the byte (tests/test_memory_hybrids.py). Mamba-2's
    heads are shared out among its groups, so its counts are multiples of the group count."""
    if name == "mamba_num_heads":
        groups = int(getattr(config, "n_groups", 1) or 1)
        return groups, 2 * groups
    return (2, 4) if name == "linear_num_heads" else (1, 2)


# Chunked scans (Mamba-2's SSD in Bamba, Falcon-H1, GraniteMoeHybrid, Zamba2, NemotronH; the gated delta rule) pad each
# sequence to whole chunks and keep per-chunk tensors: their bytes follow the padded length S' = ceil(S / c) * c, the
# chunk count n = S' / c (the states at chunk boundaries; n^2 for the decay between chunks) and S' * c (the c x c
# blocks inside each chunk), beside the unpadded S of everything around the scan. A chunk size the config sets is
# varied over three small sizes (masks of c x c need three to be told apart from c and 1); one fixed in the scan
# function's signature (transformers' `torch_chunk_gated_delta_rule`, chunk_size=64) is probed at its real size,
# over token counts that cross chunk boundaries.
_CHUNK_FIELDS = ("mamba_chunk_size", "chunk_size")
_CHUNK_POINTS = (4, 8, 6)  # base, bumped, third


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
    """Everything besides sizes that changes what autograd saves."""

    layout: str  # "packed": one row, positions restart per segment; "masked": rows with a padding mask; "rows": none
    single_row: bool  # batch of one row (a batch of several rows is fitted over 2 and 3 rows)
    precision: str  # fp32 | bf16 | fp16 (autocast over fp32 weights) | pure-bf16 (bf16 weights, no autocast)
    attention: str  # attn_implementation the probe runs: sdpa, eager or ATTENTION_KERNEL_EXCLUDED
    checkpointing: bool
    lora_rank: int = 0  # 0: every parameter trains
    lora_targets: tuple[str, ...] = ("all-linear",)
    fused_lm_head: bool = False  # TRL SFTTrainer's loss: log-probs from the LM head in chunks, no full logits
    half_weights: bool = False  # bf16/fp16 autocast over weights loaded in the half dtype (not fp32 masters)
    adapter_dtype: str = "fp32"  # LoRA adapters: "fp32" (peft's autocast_adapter_dtype) or "base" (the weights')
    cuda_autocast: bool = False  # autocast as CUDA runs it: its float32 ops (layer_norm, softmax, ...) upcast


def _rotary_fraction(config: Any) -> float:
    """The fraction of head_dim that rotary embeddings rotate (partial rotary in phi, stablelm, gpt-neox, glm)."""
    rope = getattr(config, "rope_parameters", None) or {}
    for value in (rope.get("partial_rotary_factor") if isinstance(rope, dict) else None,
                  getattr(config, "partial_rotary_factor", None), getattr(config, "rotary_pct", None)):
        if value:
            return float(value)
    return 1.0


def _probe_head_dims(config: Any) -> tuple[int, int]:
    """Two small head dims whose rotary part is a whole, even number of channels (rotate_half halves it)."""
    fraction = _rotary_fraction(config)
    for base in range(8, 129, 8):
        rotary = base * fraction
        if rotary == int(rotary) and int(rotary) % 2 == 0:
            return base, 2 * base
    raise ValueError(f"no small head_dim gives a whole rotary width for partial rotary factor {fraction}")


def _rebuilt(config: Any, values: dict[str, Any]) -> Any:
    """The config class built from `values`. transformers 5 validates its configs as huggingface_hub's strict
    dataclasses; a rejected combination of values is a ValueError like any other config's."""
    try:
        return type(config).from_dict(values)
    except StrictDataclassError as error:
        raise ValueError(str(error).strip().splitlines()[-1].strip()) from error


def hidden_points(config: Any) -> tuple[int, int]:
    """Probe hidden sizes for a config whose hidden size is its own width (not heads x head_dim). Some config classes
    still require it to be a multiple of the attention head count (DeepSeek-V2's MLA, which never splits the hidden
    size into heads, validates it in transformers 5): then the smallest such multiples at or past the usual points."""
    values = _values(config)
    try:
        for size in _HIDDEN_POINTS:
            _rebuilt(config, {**values, "hidden_size": size})
        return _HIDDEN_POINTS
    except ValueError:
        step = int(getattr(config, "num_attention_heads", 0) or 0)
        if step <= 0:
            raise
    base = -(-_HIDDEN_POINTS[0] // step) * step
    return base, base + -(-_HIDDEN_BUMP // step) * step


def _values(config: Any) -> dict[str, Any]:
    """The config's fields as its class takes them (to_dict writes an infinite float as a JSON-safe dict)."""
    return {name: getattr(config, name, value) for name, value in config.to_dict().items()}


# Per model config, a set of a few field names (or one flag): working them out builds the config class again once per
# integer field (~0.1 s for a big config), and the probe asks for each probe point. 64 configs, as param_facts keeps.
_DERIVED: LRU = LRU(max_entries=64)
_HEAD_DIM_IS_A_WIDTH: LRU = LRU(max_entries=64)


def _key(config: Any) -> tuple[str, str]:
    return type(config).__name__, config.to_json_string(use_diff=False)


def derived_fields(config: Any) -> frozenset[str]:
    """Integer fields the config class derives when it is built (a None or "auto" default, or set in its
    __post_init__), whose real values it reproduces from the other fields: left out of the probe's config, they are
    derived again from the probe's small values (a Mamba-2 head width from the hidden size, Zamba2's attention
    widths, DeepSeek's query head width from its rotary and non-rotary parts), so the small model is consistent."""
    if not dataclasses.is_dataclass(config):
        return frozenset()
    key = _key(config)
    known = _DERIVED.get(key)
    if known is not None:
        return known
    values = _values(config)
    defaults = {field.name: field.default for field in dataclasses.fields(config)}
    derived = set()
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if name in defaults and defaults[name] not in (None, "auto"):
            continue
        try:
            again = _rebuilt(config, {k: v for k, v in values.items() if k != name})
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
        if getattr(again, name, None) == value:
            derived.add(name)
    known = _DERIVED[key] = frozenset(derived)
    return known


def _head_dim_is_a_width(config: Any) -> bool:
    """head_dim is shrunk unless the config derives it from another field of its own (DeepSeek's MLA: head_dim is
    the rotary part of the query heads, qk_rope_head_dim, beside kv_lora_rank, q_lora_rank and the non-rotary part,
    which all keep their real values): shrunk alone it would disagree with that field."""
    key = _key(config)
    known = _HEAD_DIM_IS_A_WIDTH.get(key)
    if known is None:
        known = _HEAD_DIM_IS_A_WIDTH[key] = "head_dim" not in derived_fields(config) or not _aliases(config)
    return known


def _aliases(config: Any) -> list[str]:
    """Other integer fields head_dim is derived from: changed, they change it (and the hidden size does not)."""
    values = _values(config)
    real = head_dim(config)
    found = []
    for name, value in values.items():
        if name == "head_dim" or value != real or isinstance(value, bool) or not isinstance(value, int):
            continue
        changed = {k: v for k, v in values.items() if k != "head_dim"}
        changed[name] = value * 2
        try:
            if getattr(_rebuilt(config, changed), "head_dim", None) == value * 2:
                found.append(name)
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return found


def hidden_is_tied(config: Any) -> bool:
    """Whether the hidden size is the attention heads x head_dim (never for a model without attention: Mamba-2's
    head_dim is its scan's)."""
    heads = getattr(config, "num_attention_heads", None)
    return bool(heads) and _head_dim_is_a_width(config) and config.hidden_size == heads * head_dim(config)


def width_names(config: Any) -> tuple[str, ...]:
    names = ["head_dim"] if _head_dim_is_a_width(config) else []
    names += [] if hidden_is_tied(config) else ["hidden_size"]
    names += [f for f in _WIDTH_FIELDS if isinstance(getattr(config, f, None), int)]
    # a head count is shrunk where the real one is at least the larger probe count (else it is probed as it is)
    names += [f for f in _HEAD_COUNT_WIDTHS if isinstance(getattr(config, f, None), int)
              and getattr(config, f) >= _head_count_points(config, f)[1]]
    return tuple(names + ["vocab_size"])


def chunk_field(config: Any) -> str | None:
    """The config field that sets a chunked scan's chunk size, if the config has one."""
    return next((name for name in _CHUNK_FIELDS if isinstance(getattr(config, name, None), int)
                 and not isinstance(getattr(config, name), bool)), None)


def fixed_chunk(config: Any) -> int | None:
    """A chunk size fixed in the signature of a scan function of the model's own module (no config field sets it)."""
    try:
        module = sys.modules.get(model_class_for(config)._model_mapping[type(config)].__module__)
    except KeyError:  # no model class of this head for the config (the build reports it)
        return None
    sizes = []
    for value in vars(module).values() if module else ():
        target = getattr(value, "__wrapped__", value)
        if not inspect.isfunction(target):
            continue
        parameter = inspect.signature(target).parameters.get("chunk_size")
        if parameter is not None and isinstance(parameter.default, int) and not isinstance(parameter.default, bool):
            sizes.append(parameter.default)
    return min(sizes) if sizes else None


def real_chunk(config: Any) -> int | None:
    field = chunk_field(config)
    return int(getattr(config, field)) if field else fixed_chunk(config)


def point_chunk(config: Any, widths: dict[str, int]) -> int | None:
    """The chunk size the probe model of `widths` scans with (None: no chunked scan)."""
    field = chunk_field(config)
    return widths[field] if field else fixed_chunk(config)


def real_width(config: Any, name: str) -> int:
    return head_dim(config) if name == "head_dim" else int(getattr(config, name))


def _widths_alone(config: Any, names: tuple[str, ...]) -> list[dict[str, int]]:
    """Base point, one point per width bumped alone (in `names` order), and every width bumped."""
    low_d, high_d = _probe_head_dims(config)
    choices = {"head_dim": (low_d, high_d), "vocab_size": _VOCAB_POINTS}
    if "hidden_size" in names:
        choices["hidden_size"] = hidden_points(config)
    choices.update({name: _head_count_points(config, name) for name in _HEAD_COUNT_WIDTHS if name in names})
    choices.update({name: _WIDTH_POINTS for name in names if name not in choices})
    base = {name: choices[name][0] for name in names}
    return [base] + [{**base, name: choices[name][1]} for name in names] + [{name: choices[name][1] for name in names}]


def width_points(config: Any, names: tuple[str, ...]) -> list[dict[str, int]]:
    """Base point, one point per width bumped alone, and every width bumped (a check the fit must also meet); with a
    chunk size the config sets, each of them at three chunk sizes (it is no width: it enters the token counts, and
    how a width's bytes follow the chunk is only seen where both vary)."""
    points = _widths_alone(config, names)
    field = chunk_field(config)
    if field:  # the last point stays every width bumped, at the second chunk size
        sizes = (_CHUNK_POINTS[0], _CHUNK_POINTS[2], _CHUNK_POINTS[1])
        points = [{**point, field: size} for point in points for size in sizes]
    return points


def _per_layer_lists(config: Any) -> tuple[str, ...]:
    """Config lists with one entry per decoder layer. In a model of one or two layers a list that long is per layer
    only when its name says so (layer_types), not a config's other short lists (architectures, Mamba's
    time_step_limit, Falcon-H1's mlp_multipliers)."""
    layers = int(config.num_hidden_layers)
    return tuple(name for name, value in config.to_dict().items()
                 if isinstance(value, (list, tuple)) and len(value) == layers and (layers > 2 or "layer" in name))


def _index_lists(config: Any, lists: tuple[str, ...]) -> tuple[str, ...]:
    """Config lists of layer indices (Bamba's attn_layer_indices, LFM2's full_attn_idxs, Zamba2's hybrid_layer_ids):
    which layers are of a kind, by number."""
    layers = int(config.num_hidden_layers)
    return tuple(name for name, value in config.to_dict().items()
                 if name not in lists and isinstance(value, list) and value
                 and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in value)
                 and list(value) == sorted(set(value)) and any(word in name for word in ("layer", "idx", "ids")))


@dataclasses.dataclass(frozen=True)
class ProbeLayers:
    """Which real layers the probe model's layers copy, and how many real layers each stands for.

    A layer's kind is what it is built of (its parts' classes, from the real model built on the meta device: an
    attention layer, a Mamba mixer, a mixture of experts or a dense MLP) and its entries in the config's per-layer
    lists (layer_types, no_rope_layers, ...: a sliding-window layer is built like a full one). Two probe layers per
    kind, so that what several layers share (rotary tables, masks) shows up as shared. Under LoRA the model's first
    layer differs from the rest: its input needs no gradient (the embeddings are frozen), so autograd saves nothing
    there until the first adapter, not even the shared tables. The first kind then gets three probe layers: the first
    layer, counted once, and two more that stand for the other layers of that kind and still show what they share.

    The probe config copies the chosen layers' list entries and renumbers the index lists; where that does not build
    the chosen kinds (a config that places its layers by a rule: Jamba's periods, DeepSeek's first dense layers), the
    probe keeps the real model's first layers, as many as hold two of every kind (`prefix`).
    """

    lists: tuple[str, ...]  # per-layer config lists
    index_lists: tuple[str, ...]  # lists of layer numbers, renumbered for the copies
    copies: tuple[int, ...]  # per probe layer: the real layer it copies
    weights: tuple[float, ...]  # per probe layer: how many real layers it stands for
    kinds: tuple[int, ...]  # per probe layer: its kind
    prefix: bool = False  # the copies are the real model's first layers, index fields as they are

    @classmethod
    def of(cls, config: Any, lora: bool) -> "ProbeLayers":
        layers = int(config.num_hidden_layers)
        lists = _per_layer_lists(config)
        structures = param_facts(config).layer_structures
        signatures = [(structures[i], tuple(str(getattr(config, name)[i]) for name in lists)) for i in range(layers)]
        kind_of = {signature: kind for kind, signature in enumerate(dict.fromkeys(signatures))}
        copies, weights, kinds = [], [], []
        for signature, kind in kind_of.items():
            count = signatures.count(signature)
            share = [1.0, (count - 1) / 2, (count - 1) / 2] if kind == 0 and lora else [count / 2, count / 2]
            copies += [signatures.index(signature)] * len(share)
            weights += share
            kinds += [kind] * len(share)
        chosen = cls(lists, _index_lists(config, lists), tuple(copies), tuple(weights), tuple(kinds))
        if chosen._builds(config, structures):
            return chosen
        return cls._first_layers(signatures, kind_of, lora, lists)

    @classmethod
    def _first_layers(cls, signatures: list, kind_of: dict, lora: bool, lists: tuple[str, ...]) -> "ProbeLayers":
        """The real model's first layers, as many as hold two layers of every kind (three of the first under LoRA),
        or all of a kind when it has fewer; each stands for its share of its kind's real layers."""
        need = {kind: min(3 if kind == 0 and lora else 2, signatures.count(signature))
                for signature, kind in kind_of.items()}
        kinds: list[int] = []
        while any(kinds.count(kind) < wanted for kind, wanted in need.items()):
            kinds.append(kind_of[signatures[len(kinds)]])
        weights = []
        for position, kind in enumerate(kinds):
            count = sum(1 for s in signatures if kind_of[s] == kind)
            probes = kinds.count(kind)
            if kind == 0 and lora and probes > 1:  # the first layer once, the others of its kind shared
                weights.append(1.0 if position == 0 else (count - 1) / (probes - 1))
            else:
                weights.append(count / probes)
        return cls(lists, (), tuple(range(len(kinds))), tuple(weights), tuple(kinds), prefix=True)

    def _builds(self, config: Any, structures: tuple) -> bool:
        """Whether the probe config of these copies builds each copied layer's kind (on the meta device)."""
        small = probe_config(config, width_points(config, width_names(config))[0], self)
        with exclusive(), torch.device("meta"):
            model = model_class_for(small).from_config(small)
        built = [layer_structure(layer) for layer in decoder_layers(model, len(self.copies))]
        return built == [structures[i] for i in self.copies]


def probe_config(config: Any, widths: dict[str, int], layers: ProbeLayers) -> Any:
    """The small config: the probe point's widths, the chosen layers, and every field the class derives from them
    derived again; everything else as the real config has it."""
    values = _values(config)
    given: dict[str, Any] = {"num_hidden_layers": len(layers.copies)}
    for name in layers.lists:
        given[name] = [values[name][i] for i in layers.copies]
    for name in layers.index_lists:
        given[name] = [position for position, i in enumerate(layers.copies) if i in values[name]]
    given.update(_width_values(config, widths, values))
    # A width the config resolved to the hidden size (OPT's word_embed_proj_dim) follows the probe's hidden size:
    # left alone, the two would differ and add layers (OPT's project_in/out) the real model does not have.
    for name, value in values.items():
        if (name.endswith(("_dim", "_size")) and name not in given and name not in _NOT_WIDTHS
                and value == config.hidden_size):
            given[name] = given.get("hidden_size", config.hidden_size)
    # Special token ids of a real vocabulary would point outside the small one (padding_idx, ...).
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id"):
        if isinstance(values.get(name), int):
            given[name] = 0
        elif isinstance(values.get(name), list):
            given[name] = [0]
    given["use_cache"] = False
    dropped = rederived_fields(config) - set(given)
    return _rebuilt(config, {**{k: v for k, v in values.items() if k not in dropped}, **given})


def _width_values(config: Any, widths: dict[str, int], values: dict[str, Any]) -> dict[str, int]:
    """The config fields a probe point sets: its widths, the hidden size where it is heads x head_dim, and the value
    heads that follow a shrunk key-head count."""
    given = {}
    if hidden_is_tied(config):
        given["hidden_size"] = config.num_attention_heads * widths["head_dim"]
    for name, value in widths.items():
        if name in _HEAD_COUNT_WIDTHS:
            for follower in _HEAD_COUNT_WIDTHS[name]:
                if isinstance(values.get(follower), int):
                    given[follower] = value * values[follower] // values[name]
        if name != "head_dim" or "head_dim" in values:  # a stored field (some configs compute it in a property)
            given[name] = value
    return given


_REDERIVED: LRU = LRU(max_entries=64)


def rederived_fields(config: Any) -> frozenset[str]:
    """The derived fields (`derived_fields`) the probe derives again from its small widths: those the class derives
    in proportion to the widths, affinely, as Mamba-2's head width follows the hidden size (hidden x expand / heads,
    which its config validates). Proportional means the bumps add up (every width bumped moves the field by the sum
    of each bumped alone) and, extrapolated to the real widths, give its real value. Any other keeps its real value:
    - one derived through a ratio of widths: the OLMo hybrid's linear head widths are three quarters of the hidden
      size per key head; with both shrunk, its recurrent state (heads x key width x value width, per chunk) held
      hidden^2 / heads, which no bilinear fit holds (the released shape's fit missed by 21 MB; a tiny one's estimate
      was 3.4% low and reliable by every check);
    - one rounded: Zamba2's attention head width, 2 x hidden / heads, is not whole at every probe hidden size
      (5 heads: 20 KB low), or not even where rotary needs it (6 heads: the small config was refused). A field whose
      derivation breaks the small config keeps its real value, one at a time until every probe point builds."""
    key = _key(config)
    known = _REDERIVED.get(key)
    if known is not None:
        return known
    derived = derived_fields(config)
    names = width_names(config)
    values = _values(config)
    points = _widths_alone(config, names)  # base, each width bumped alone, every width bumped
    rederived = set(derived)
    built = _configs_at(config, points, values, rederived)
    while built is None and rederived:
        for name in sorted(rederived):
            built = _configs_at(config, points, values, rederived - {name})
            if built is not None:
                rederived.discard(name)
                break
        else:
            break
    if built is None:  # no field kept real helps: building the probe config reports why
        known = _REDERIVED[key] = derived
        return known
    proportional = set()
    for name in rederived:
        at = [getattr(point, name, None) for point in built]
        if not all(isinstance(value, int) for value in at):
            continue
        steps = [value - at[0] for value in at[1:-1]]
        extrapolated = at[0] + sum(step * (real_width(config, width) - points[0][width])
                                   / (points[1 + index][width] - points[0][width])
                                   for index, (width, step) in enumerate(zip(names, steps)))
        if at[-1] - at[0] == sum(steps) and abs(extrapolated - values[name]) < 1e-6:
            proportional.add(name)
    known = _REDERIVED[key] = frozenset(proportional)
    return known


def _configs_at(config: Any, points: list[dict[str, int]], values: dict[str, Any], rederived: set[str]
                ) -> list[Any] | None:
    """The config at each width point, `rederived` fields derived again by the class; None if one does not build."""
    kept = {k: v for k, v in values.items() if k not in rederived}
    try:
        return [_rebuilt(config, {**kept, **_width_values(config, point, values)}) for point in points]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def build_probe_model(config: Any, widths: dict[str, int], spec: ProbeSpec,
                       layers: ProbeLayers) -> torch.nn.Module:
    small = probe_config(config, widths, layers)
    # a half base (LoRA over weights loaded in bf16/fp16) stores 2 bytes a weight like pure bf16
    dtype = torch.bfloat16 if spec.half_weights else PRECISIONS[spec.precision].weight_dtype
    with exclusive(seed=0):  # the same weights at every call, and no one else's random stream or dtype moved
        model = model_class_for(config).from_config(small, attn_implementation=spec.attention, dtype=dtype)
    model.train()
    if spec.fused_lm_head:
        from trl.trainer.utils import add_fused_lm_head  # TRL patches the model's forward; before LoRA, as it says

        add_fused_lm_head(model)
    if spec.lora_rank:
        apply_lora(model, spec.lora_rank, spec.lora_targets, dtype if spec.adapter_dtype == "base" else torch.float32)
    if spec.checkpointing:
        model.activation_checkpointing_enable()  # Trainer's default: non-reentrant; the layer inputs are saved
    return model
