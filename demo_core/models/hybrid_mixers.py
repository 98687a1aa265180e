"""Per-example mixers: exact padding-free packing for linear-attention, short-convolution and SSM hybrids.

A hybrid's token mixers that are not attention carry state along the sequence: a short causal convolution's window
(LFM2), a convolution plus a recurrent state (gated delta nets: Qwen3.5, Qwen3-Next, OLMo hybrid; Mamba-2: Bamba,
Falcon-H1, Zamba2, GraniteMoeHybrid; Mamba-1: Jamba) or a decayed key-value state (MiniMax's lightning attention).
In a flattened row, transformers' PyTorch fallbacks of these layers run that state straight across the boundary
into the next example. With `cu_seq_lens`/`seq_idx` in the batch the fallbacks of the convolution, gated delta rule
and Mamba-2 scan raise instead (transformers' `use_kernel_func_from_hub_with_fallback`); Jamba's and MiniMax's
mixers never read those keys, and mix either way.

`install(model)` makes them exact: each known mixer's forward is replaced by one that, in a packed forward, runs
the original forward per example and puts the outputs back where the examples lie. The examples of one forward go
in buckets of similar length (attention.py's buckets: within 25% or 16 tokens of the longest), each right-padded to
its longest, one call per bucket. Every one of these mixers is causal (the conv pads on the left, the scans run
forwards), so an example's outputs never see the padding after it, as attention.py's buckets argue for causal
attention; each call starts from a zero state and an empty window, which is what each example alone gets. A
forward that is not packed (a padded batch, one example per row) calls the original forward untouched, its padding
mask and cache included.

Where the boundaries come from: a forward pre-hook on the model that owns the decoder layers reads that forward's
`position_ids`, `cu_seq_lens_q` and 2-D `attention_mask`, and the mixers turn them into segments with
`attention.find_segments` (the rule transformers and varlen attention use: a new example wherever the position does
not continue by one), once per forward. The mixers themselves never see `position_ids`, and the decoder layer of
some families does not either (GraniteMoeHybrid's), so the hook sits on the model. What it read stays until the next
forward: activation checkpointing recomputes a layer's forward in backward without re-running the model's hooks
(transformers 5.24 checkpoints `forward`, not `__call__`), and finds the same boundaries. So one backward must
follow each packed forward before the next forward (what Trainer and TRL do).

With a varlen kernel installed (flash-linear-attention, causal-conv1d, mamba-ssm: not on this machine), a packed
row of real tokens goes to the original forward in one call instead, with the keys those kernels read:
`cu_seq_lens_q` (int32, examples + 1; transformers hands it to flash-linear-attention's `chunk_gated_delta_rule` as
`cu_seqlens`) and `seq_idx` (int32, (1, tokens): each token's example; causal-conv1d's `causal_conv1d_fn` and
mamba-ssm's `mamba_split_conv1d_scan_combined` / `mamba_chunk_scan_combined` keep examples apart with it). Those
keys are computed here from the same segments, whatever the collator sent. Jamba's Mamba-1 kernels (`mamba_inner_fn`,
`selective_scan_fn`) take neither key and MiniMax's lightning attention has no kernel: they always loop.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
from typing import Callable

import torch
from transformers import PreTrainedModel

from demo_core.segments import Segments, find_segments

# The keys a packed batch carries for varlen kernels: the per-example loop drops them, since transformers' PyTorch
# fallbacks raise on `cu_seqlens`/`seq_idx` and the loop has already kept the examples apart; and the whole row's
# `position_ids`, which only MiniMax's lightning attention receives (and never reads).
_PACKING_KEYS = frozenset({"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx",
                           "position_ids"})


@dataclasses.dataclass(frozen=True)
class MixerKind:
    """One kind of sequence mixer: the functions of its modeling module that must all be package kernels for the
    varlen path (empty: no varlen kernel exists, always loop), and the keys those kernels read."""

    name: str
    kernels: tuple[str, ...]
    varlen_keys: tuple[str, ...]


GATED_DELTA_NET = MixerKind("gated delta net", ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"),
                            ("cu_seq_lens_q", "seq_idx"))
SHORT_CONVOLUTION = MixerKind("short convolution", ("causal_conv1d_fn",), ("seq_idx",))
MAMBA2 = MixerKind("Mamba-2", ("causal_conv1d_fn", "mamba2_split_conv1d_scan_combined", "mamba2_chunk_scan"),
                   ("seq_idx",))
MAMBA1 = MixerKind("Mamba-1", (), ())
LIGHTNING_ATTENTION = MixerKind("lightning attention", (), ())
# The Bailing hybrid hands its layer's keyword arguments to flash-linear-attention's `chunk_kda` as they come, and no
# test here pins which varlen key that kernel reads: its packed rows always take the per-example loop.
KIMI_DELTA_ATTENTION = MixerKind("Kimi delta attention", (), ())

# Mixer classes by name, as transformers 5.24 defines them in transformers.models.<type>.modeling_<type>.
MIXERS: dict[str, MixerKind] = {
    "Qwen3_5GatedDeltaNet": GATED_DELTA_NET,
    "Qwen3_5MoeGatedDeltaNet": GATED_DELTA_NET,
    "Qwen3NextGatedDeltaNet": GATED_DELTA_NET,
    "OlmoHybridGatedDeltaNet": GATED_DELTA_NET,
    "Lfm2ShortConv": SHORT_CONVOLUTION,
    "Lfm2MoeShortConv": SHORT_CONVOLUTION,
    "BambaMixer": MAMBA2,
    "FalconH1Mixer": MAMBA2,
    "Zamba2MambaMixer": MAMBA2,
    "GraniteMoeHybridMambaLayer": MAMBA2,
    "JambaMambaMixer": MAMBA1,
    "MiniMaxLightningAttention": LIGHTNING_ATTENTION,
    "BailingHybridDeltaAttention": KIMI_DELTA_ATTENTION,
}


# ---- the segments of one forward -----------------------------------------------------------------------------------

def _text_positions(position_ids: torch.Tensor | None) -> torch.Tensor | None:
    """(batch, seq) positions whose restarts mark examples. Qwen3.5's text model also takes (4, batch, seq): the text
    row first, then the three M-RoPE rows, which do not count one per token over images; with only those three rows
    there is no row to read packing from (transformers' own masks then see none either)."""
    if position_ids is None or position_ids.dim() == 2:
        return position_ids
    if position_ids.dim() == 3 and position_ids.shape[0] == 4:
        return position_ids[0]
    return None


def packed_segments(batch: int, seq_len: int, device: torch.device, position_ids=None, cu_seq_lens=None,
                    attention_mask=None) -> Segments | None:
    """The examples of a packed batch (attention.find_segments), or None when every row holds one example (a
    padded batch, a single example): then nothing crosses a boundary and the mixers run as transformers wrote them."""
    positions = _text_positions(position_ids)
    padding = attention_mask if torch.is_tensor(attention_mask) and attention_mask.dim() == 2 else None
    cu_seq_lens = cu_seq_lens if batch == 1 else None  # collators send it for one flattened row only
    restarts = positions is not None and bool((positions[..., 1:] != positions[..., :-1] + 1).any())
    if not restarts and (cu_seq_lens is None or cu_seq_lens.numel() <= 2):
        return None
    segments = find_segments(batch, seq_len, device, padding, positions, cu_seq_lens)
    rows_with_tokens = batch if padding is None else int(padding.bool().any(dim=1).sum())
    return segments if len(segments.lengths) > rows_with_tokens else None


def varlen_keys(segments: Segments) -> dict[str, torch.Tensor]:
    """The keys varlen kernels read for one packed row, as transformers' `DataCollatorWithFlattening` builds them:
    `cu_seq_lens_q` (int32, examples + 1) and `seq_idx` (int32, (1, tokens), each token's example)."""
    lengths = torch.tensor(segments.lengths, device=segments.cu_seqlens.device)
    example = torch.arange(len(segments.lengths), dtype=torch.int32, device=lengths.device)
    return {"cu_seq_lens_q": segments.cu_seqlens, "seq_idx": example.repeat_interleave(lengths)[None]}


@functools.lru_cache(maxsize=None)
def _forward_signature(module_class: type) -> tuple[inspect.Signature, str | None]:
    """A module class's forward signature (its first parameter the module) and the name of its **kwargs."""
    signature = inspect.signature(module_class.forward)
    var_keyword = next((name for name, parameter in signature.parameters.items()
                        if parameter.kind is inspect.Parameter.VAR_KEYWORD), None)
    return signature, var_keyword


def _arguments(module: torch.nn.Module, args, kwargs, partial: bool = False) -> tuple[dict, dict]:
    """(named arguments, the **kwargs ones) of one call of `module`'s forward."""
    signature, var_keyword = _forward_signature(type(module))
    bind = signature.bind_partial if partial else signature.bind
    arguments = dict(bind(module, *args, **kwargs).arguments)
    arguments.pop(next(iter(signature.parameters)))  # the module itself
    return arguments, arguments.pop(var_keyword, {}) if var_keyword else {}


class _Boundaries:
    """The packing keys of the latest forward of one model, shared by its mixers; segments found once per forward.

    Not reset after the forward: activation checkpointing's recompute in backward needs them (module docstring)."""

    def __init__(self):
        self._keys: tuple = (None, None, None)
        self._cached: tuple | None = None  # ((batch, seq_len, device), segments)

    def read(self, module, args, kwargs) -> None:
        """Forward pre-hook of the model that owns the decoder layers."""
        arguments, extra = _arguments(module, args, kwargs, partial=True)
        self._keys = (arguments.get("position_ids"), extra.get("cu_seq_lens_q"), arguments.get("attention_mask"))
        self._cached = None

    def segments(self, hidden_states: torch.Tensor) -> Segments | None:
        shape = (hidden_states.shape[0], hidden_states.shape[1], hidden_states.device)
        if self._cached is None or self._cached[0] != shape:
            position_ids, cu_seq_lens, attention_mask = self._keys
            self._cached = (shape, packed_segments(*shape, position_ids, cu_seq_lens, attention_mask))
        return self._cached[1]


# ---- the mixer forward --------------------------------------------------------------------------------------------

def _is_package_kernel(function: Callable) -> bool:
    """Whether transformers bound this function to a package's kernel rather than its PyTorch fallback.

    `use_kernel_func_from_hub_with_fallback` decides once, at import, and keeps the answer in its wrapper's closure
    as `is_new_implementation`; a function wrapped any other way reads as no kernel, so the exact loop runs."""
    free_names = getattr(getattr(function, "__code__", None), "co_freevars", ())
    if "is_new_implementation" not in free_names:
        return False
    return bool(function.__closure__[free_names.index("is_new_implementation")].cell_contents)


@functools.lru_cache(maxsize=None)
def kernels_ready(mixer_class: type) -> bool:
    """Whether every kernel this mixer's varlen path needs is a package kernel here."""
    kind = MIXERS[mixer_class.__name__]
    modeling = sys.modules[mixer_class.__module__]
    return bool(kind.kernels) and all(_is_package_kernel(getattr(modeling, name, None)) for name in kind.kernels)


def _per_bucket(original: Callable, hidden_states: torch.Tensor, segments: Segments, call_arguments: dict):
    """The original forward once per bucket of similar-length examples, outputs scattered back to their tokens
    (zeros on padding slots, which no real token reads)."""
    batch, seq_len, hidden_size = hidden_states.shape
    tokens = hidden_states.reshape(batch * seq_len, hidden_size)
    kept, extra_outputs = [], 0
    for bucket in segments.buckets:
        out = original(hidden_states=tokens[bucket.gather_index], **call_arguments)
        if isinstance(out, tuple):  # lightning attention also returns its final state, which the layer discards
            out, extra_outputs = out[0], len(out) - 1
        n, length, out_size = out.shape
        kept.append(out.reshape(n * length, out_size).index_select(0, bucket.keep_index))
    kept = torch.cat(kept) if len(kept) > 1 else kept[0]
    if segments.all_real:  # every slot is written exactly once
        scattered = torch.empty_like(kept).index_copy(0, segments.bucket_destination, kept)
    else:
        scattered = kept.new_zeros(batch * seq_len, kept.shape[1]).index_copy(0, segments.bucket_destination, kept)
    out = scattered.view(batch, seq_len, -1)
    return (out, *[None] * extra_outputs) if extra_outputs else out


def _packed_forward(mixer: torch.nn.Module, *args, **kwargs):
    """The forward `install` gives a mixer (bound to it as a method, so a deep copy of the model binds its copy)."""
    original = type(mixer).forward
    arguments, extra = _arguments(mixer, args, kwargs)
    hidden_states = arguments.pop("hidden_states")
    segments = vars(mixer)[_BOUNDARIES_ATTRIBUTE].segments(hidden_states)
    if segments is None:
        return original(mixer, *args, **kwargs)
    # Training forwards: no cache to continue from or fill (the loop's calls do not share one row's state), no
    # padding mask (bucket padding sits after each example, where a causal mixer never looks).
    call_arguments = {**arguments, **{key: value for key, value in extra.items() if key not in _PACKING_KEYS},
                      "cache": None, "attention_mask": None}
    if "position_embeddings" in call_arguments:  # per-token tensors of the whole row; the lightning attention,
        call_arguments["position_embeddings"] = None  # the one mixer that takes them, never reads them
    if segments.all_real and hidden_states.shape[0] == 1 and kernels_ready(type(mixer)):
        keys = varlen_keys(segments)
        wanted = {key: keys[key] for key in MIXERS[type(mixer).__name__].varlen_keys}
        return original(mixer, hidden_states=hidden_states, **call_arguments, **wanted)
    return _per_bucket(functools.partial(original, mixer), hidden_states, segments, call_arguments)


# ---- installing -----------------------------------------------------------------------------------------------------

def mixer_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every mixer in the model that `install` knows."""
    return [(name, module) for name, module in model.named_modules() if type(module).__name__ in MIXERS]


def _owner(model: torch.nn.Module, mixer_name: str) -> torch.nn.Module:
    """The innermost PreTrainedModel around a mixer: the model that owns the decoder layers (e.g. Qwen3NextModel,
    or Qwen3.5's text model inside the multimodal one), whose forward gets the batch's packing keys."""
    parts = mixer_name.split(".")
    owners = [model.get_submodule(".".join(parts[:depth])) for depth in range(len(parts))]
    return [module for module in owners if isinstance(module, PreTrainedModel)][-1]


_INSTALLED_ATTRIBUTE = "_per_example_mixers"  # where a model keeps its `Installed`
_BOUNDARIES_ATTRIBUTE = "_packing_boundaries"  # where a mixer keeps its model's `_Boundaries`


@dataclasses.dataclass
class Installed:
    """What `install` changed on one model, to undo it (`remove`)."""

    model: torch.nn.Module = dataclasses.field(repr=False)
    mixers: list[torch.nn.Module]
    hooks: list

    def remove(self) -> None:
        vars(self.model).pop(_INSTALLED_ATTRIBUTE, None)
        for module in self.mixers:
            del module.forward  # the instance attribute; the class's forward shows through again
            delattr(module, _BOUNDARIES_ATTRIBUTE)
        for hook in self.hooks:
            hook.remove()
        self.mixers, self.hooks = [], []


def install(model: torch.nn.Module) -> Installed:
    """Makes every known mixer of `model` exact in packed rows (module docstring); a model without such mixers is
    left as it is. Installing twice changes nothing: the second call finds the first one's (`installed_on`)."""
    installed = installed_on(model)
    if installed is not None:
        return installed
    mixers, hooks, boundaries_of = [], [], {}
    for name, module in mixer_modules(model):
        owner = _owner(model, name)
        if id(owner) not in boundaries_of:
            boundaries_of[id(owner)] = _Boundaries()
            hooks.append(owner.register_forward_pre_hook(boundaries_of[id(owner)].read, with_kwargs=True))
        setattr(module, _BOUNDARIES_ATTRIBUTE, boundaries_of[id(owner)])
        module.forward = types.MethodType(_packed_forward, module)
        mixers.append(module)
    installed = Installed(model, mixers, hooks)
    if mixers:
        setattr(model, _INSTALLED_ATTRIBUTE, installed)
    return installed


def installed_on(model: torch.nn.Module) -> Installed | None:
    """What `install` changed on this model, or None (never installed, or removed since)."""
    return vars(model).get(_INSTALLED_ATTRIBUTE)
