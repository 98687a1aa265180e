"""Which attention path works for which model and device, cheaply, from the config and the code (`capability`), and
the path a run takes (`resolve_attention`: auto is the first that works). Whether packing is then exact for this
model is the pre-flight check's question (preflight.py), answered with a forward pass."""

from __future__ import annotations

import functools

from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.utils import is_flash_attn_2_available

from demo_core.attention import kernels as torch_varlen
from demo_core.attention.varlen import VARLEN
from demo_core.errors import DemoInputError


@functools.lru_cache(maxsize=None)  # unbounded on purpose: one entry per config class transformers defines
def model_class(config_class: type):
    return AutoModelForCausalLM._model_mapping[config_class]


def routes_through_attention_interface(causal_lm_class: type) -> bool:
    """Whether the model's attention layers look their function up in transformers' AttentionInterface, the only
    way a registered attention such as varlen ever runs. transformers' own test for it (it reads the modeling
    source for `ALL_ATTENTION_FUNCTIONS.get_interface(`); the class flag `_supports_attention_backend` is missing on
    families that do route through it (stablelm)."""
    return causal_lm_class._can_set_attn_implementation()


def _varlen_on_device(device: str) -> str:
    if device != "cuda":
        return "Σs² cost: SDPA per bucket of similar-length segments"
    if torch_varlen.INSTALLED is None:
        return f"Σs² cost: SDPA per bucket of similar-length segments ({torch_varlen.absence_reason()})"
    return (f"Σs² cost: {torch_varlen.INSTALLED.describe()} in bf16/fp16; per-bucket SDPA in fp32 and for "
            f"attention sinks")


def capability(config: PretrainedConfig, attention: str, device: str) -> tuple[bool, str]:
    """(works, why) for one model family x attention path x device ("cpu" or "cuda").

    This reads the config and the code, cheaply; whether packing is then exact for this model is the pre-flight
    check's question (preflight.py), answered with a forward pass.
    """
    family = config.model_type
    try:
        causal_lm_class = model_class(type(config))
    except KeyError:
        return False, f"{family} is not a causal language model that transformers knows"
    if attention == "eager":
        return True, "reference implementation; packed rows get a dense (Σs)² block-diagonal mask"
    if attention == "sdpa":
        if not getattr(causal_lm_class, "_supports_sdpa", False):
            return False, f"{family} has no sdpa attention in transformers (e.g. Gemma 2's soft-capping)"
        return True, "packed rows get a dense (Σs)² block-diagonal mask: correct, can be slower than padding"
    if attention == VARLEN:
        if not routes_through_attention_interface(causal_lm_class):
            return False, (f"{family} computes attention in its own code, not through transformers' "
                           f"AttentionInterface, so varlen would never run")
        if getattr(config.get_text_config(), "attn_logit_softcapping", None):
            return False, f"{family} uses attention logit soft-capping, which varlen does not implement"
        return True, _varlen_on_device(device)
    if attention == "flash_attention_2":
        if device != "cuda":
            return False, "flash_attention_2 needs a CUDA GPU"
        if not is_flash_attn_2_available():
            return False, "flash_attention_2 needs the flash-attn package (pip install -r requirements-gpu.txt)"
        if not getattr(causal_lm_class, "_supports_flash_attn", False):
            return False, f"{family} has no flash_attention_2 support in transformers"
        return True, "the blog's path: Σs² cost with cu_seq_lens from the collator"
    return False, f"unknown attention {attention!r}"


AUTO_ORDER = ("flash_attention_2", VARLEN, "sdpa", "eager")


def resolve_attention(requested: str, config: PretrainedConfig, device: str) -> str:
    """The attention that will run: `auto` takes the first path that works here; a named one must work."""
    if requested == "auto":
        for candidate in AUTO_ORDER:
            if capability(config, candidate, device)[0]:
                return candidate
        raise DemoInputError(f"no attention path works for {config.model_type} on {device}")
    works, why = capability(config, requested, device)
    if not works:
        raise DemoInputError(f"attention {requested!r} is unavailable for {config.model_type} on {device}: {why}")
    return requested


def capability_table(configs: dict[str, PretrainedConfig], devices=("cpu", "cuda")) -> list[dict]:
    """Rows of (model, attention, device, works, why) for the CLI and the app."""
    return [
        {"model": name, "attention": attention, "device": device, "works": works, "why": why}
        for name, config in configs.items()
        for attention in AUTO_ORDER
        for device in devices
        for works, why in [capability(config, attention, device)]
    ]
