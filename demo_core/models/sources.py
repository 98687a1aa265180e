"""Models: offline presets (random-init from config) and real checkpoints (hub id or local folder).

Presets are the blog's architectures at toy sizes so a CPU can train them in seconds. They share one offline
tokenizer with ByT5's ids: it needs no files and no training step, maps every UTF-8 byte to one token (so "tokens"
are bytes and lengths are predictable), `len(tokenizer)` = 384 sets the vocabulary size, and it carries a small chat
template (`CHAT_TEMPLATE`) so conversations render and mask offline.
Real checkpoints load through the Auto classes, never with `trust_remote_code`.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.loss.loss_utils import LOSS_MAPPING
from transformers.utils import logging as transformers_logging

from demo_core.errors import DemoInputError
from demo_core.isolation import exclusive
from demo_core.models import hub, hybrid_mixers

# A checkpoint is loaded once per collator and once by the pre-flight check: "Loading weights" bars on stderr would
# bury the CLI's one-line `error:` when that check refuses the model.
transformers_logging.disable_progress_bar()

BYTE_VOCAB_SIZE = 384  # ByT5's ids: 3 specials, 256 bytes, 125 extra ids

# Sizes: "tiny" ≈ 0.5–1M parameters (the CPU default), "small" ≈ 4–10M, "1b" the Llama-3.2-1B shape (GPU only).
_SIZES = {
    "tiny": dict(hidden=128, layers=2, heads=4, kv_heads=2, ffn=512),
    "small": dict(hidden=256, layers=4, heads=8, kv_heads=4, ffn=1024),
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192),
}


def _family_config(family: str, size: dict, vocab_size: int, max_positions: int) -> PretrainedConfig:
    """One config per architecture; fields set explicitly where a family's default would break a toy model."""
    hidden, layers, heads, kv_heads, ffn = (size[k] for k in ("hidden", "layers", "heads", "kv_heads", "ffn"))
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        max_position_embeddings=max_positions,
        pad_token_id=0,  # ByT5's pad id; some families default to an id outside a 384-token vocabulary
        bos_token_id=None,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    if family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if family == "mistral":
        from transformers import MistralConfig

        return MistralConfig(**common, sliding_window=None)  # no window: every path then computes the same thing
    if family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**common)
    if family == "gemma":
        from transformers import GemmaConfig

        return GemmaConfig(**common, head_dim=hidden // heads)  # Gemma defaults head_dim to 256
    if family == "phi3":
        from transformers import Phi3Config

        return Phi3Config(**common, original_max_position_embeddings=max_positions)
    if family == "granite":
        from transformers import GraniteConfig

        return GraniteConfig(**common)
    if family == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(
            vocab_size=vocab_size,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=ffn,
            n_positions=max_positions,
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=1,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    raise KeyError(family)


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    family: str
    size: str
    vocab_size: int = BYTE_VOCAB_SIZE
    max_positions: int = 8192

    def config(self) -> PretrainedConfig:
        config = _family_config(self.family, _SIZES[self.size], self.vocab_size, self.max_positions)
        # Dropout off everywhere: two collators must see identical numerics for their losses to be comparable.
        for field in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
            if hasattr(config, field):
                setattr(config, field, 0.0)
        return config


PRESETS: dict[str, Preset] = {}
for _family in ("llama", "mistral", "qwen2", "gemma", "phi3", "granite"):
    PRESETS[f"tiny-{_family}"] = Preset(f"tiny-{_family}", _family, "tiny")
# GPT-2 learns absolute positions: a table of 8192 rows would be most of a toy model, so it stops at 2048.
PRESETS["tiny-gpt2"] = Preset("tiny-gpt2", "gpt2", "tiny", max_positions=2048)
for _family in ("llama", "mistral", "qwen2", "gemma"):
    PRESETS[f"small-{_family}"] = Preset(f"small-{_family}", _family, "small")
# The Llama-3.2-1B shape (vocabulary 128,256 so memory matches the real model), random-init, for GPU runs.
PRESETS["llama-1b"] = Preset("llama-1b", "llama", "1b", vocab_size=128_256)


# Packing Lab's chat template: the presets' byte tokenizer has none of its own, and a tokenizer without one gets it
# for conversations (data.py says so in a note). Short role headers (every byte is a token here); each assistant
# turn's text, its tool calls and the end-of-sequence token sit inside {% generation %} ... {% endgeneration %}, so
# `apply_chat_template(..., return_assistant_tokens_mask=True)` marks exactly what assistant-only loss trains, the
# stop token included (TRL's `is_chat_template_stop_token_trained` holds). Rendered:
#   <|system|>\nBe brief.\n<|user|>\nWhat is 2+2?\n<|assistant|>\n4</s>\n
CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|tools|>\\n' + (tools | tojson) + '\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|assistant|>\\n' }}"
    "{%- generation %}"
    "{%- if message.reasoning_content %}{{- '<think>' + message.reasoning_content + '</think>' }}{%- endif %}"
    "{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set function = call.function if call.function is defined else call %}"
    "{{- '<tool_call>' + ({'name': function.name, 'arguments': function.arguments} | tojson) + '</tool_call>' }}"
    "{%- endfor %}"
    "{{- eos_token }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|' + message.role + '|>\\n' + message.content + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)


def byte_tokenizer() -> PreTrainedTokenizerBase:
    """ByT5's ids (0 <pad>, 1 </s>, 2 <unk>, byte b -> b + 3, 125 extra ids), built with the `tokenizers` library.

    A fast tokenizer rather than transformers' Python `ByT5Tokenizer`: only a fast one maps characters to tokens,
    which `apply_chat_template(return_assistant_tokens_mask=True)` needs. Every byte is its own token (a byte-level
    BPE with no merges). Unlike ByT5Tokenizer it appends no `</s>` by itself: the data appends it as TRL does.
    Built in ~2 ms.
    """
    byte_chars = bytes_to_unicode()  # the printable stand-in for each byte that byte-level tokenizers use
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{byte_chars[byte]: byte + 3 for byte in range(256)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        extra_special_tokens=[f"<extra_id_{index}>" for index in range(BYTE_VOCAB_SIZE - 259)],
    )
    tokenizer.padding_side = "right"
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclasses.dataclass
class ModelSource:
    """What a run needs to build identical fresh models, one per collator."""

    name: str
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    is_preset: bool
    _build: Callable[[str, torch.dtype], torch.nn.Module]

    @property
    def family(self) -> str:
        return self.config.model_type

    def build(self, attn_implementation: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
        """A fresh model; presets are seeded so every collator starts from the same weights. The build holds the
        process's torch state (isolation.exclusive): its weights come from `seed` alone, whatever other threads
        draw meanwhile, and it moves no one else's generator or default dtype."""
        with exclusive(seed):
            model = self._build(attn_implementation, dtype)
        # transformers derives `loss_type` from the class name, so GPT2LMHeadModel (an "LMHeadModel", not a
        # "ForCausalLM") gets None; its loss still falls back to ForCausalLMLoss, but Trainer then counts
        # `num_items_in_batch` over unshifted labels, one token too many per padded example: a padded step's loss
        # was divided by Σ(len) instead of Σ(len - 1) (tiny-gpt2: Δloss 5e-2 vs flatten from step 1). Every model
        # here is a causal LM, so name its loss for what it computes.
        if model.loss_type not in LOSS_MAPPING:
            model.loss_type = "ForCausalLM"
        # Linear-attention, short-convolution and SSM mixers run per example in packed rows (hybrid_mixers.py).
        hybrid_mixers.install(model)
        return model


# Where vision-language checkpoints keep their language model: transformers 5's layout ("model.language_model.",
# "lm_head.") and the earlier one ("language_model.model.", "language_model.lm_head."), as the text model names them.
LANGUAGE_MODEL_KEYS = {r"^model\.language_model\.": "model.", r"^language_model\.model\.": "model.",
                       r"^language_model\.lm_head\.": "lm_head."}


def trained_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config of the model that trains: a vision-language checkpoint trains its language model on text when
    transformers builds that model as a causal LM on its own (Qwen3.5's releases, Mistral 3, LLaVA, SmolVLM,
    Gemma 3, LFM2-VL...); a config that is a causal LM itself is kept; any other is refused in one sentence."""
    causal_lms = AutoModelForCausalLM._model_mapping
    text = config.get_text_config()
    if text is not config and type(text) in causal_lms:
        text = copy.deepcopy(text)
        if "tie_word_embeddings" in config.to_diff_dict():  # the composite ties its head (Mistral 3), not its text part
            text.tie_word_embeddings = config.tie_word_embeddings
        return text
    if type(config) in causal_lms:
        return config
    raise DemoInputError(f"{config.model_type} is a vision-language model whose language model "
                         f"({type(text).__name__}) transformers builds only inside it, not as a causal LM on its own: "
                         f"its text model cannot be trained here")


def config_source(name: str, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> ModelSource:
    """Random-init models of one config (the presets; tests build families the same way)."""
    config = trained_config(config)

    def build(attn_implementation: str, dtype: torch.dtype) -> torch.nn.Module:
        # from_config keeps the config object and sets its attention on it: without a copy, building a second model
        # with another attention would switch the first one too.
        return AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=attn_implementation,
                                                dtype=dtype)

    return ModelSource(name, config, tokenizer, True, build)


def _preset_source(preset: Preset) -> ModelSource:
    return config_source(preset.name, preset.config(), byte_tokenizer())


def _hub_target(name: str) -> bool:
    """For a name that is no folder here: whether only the local cache may be read (the hub cannot be reached).
    Refuses, with the reason, a name that is no hub id, or one the hub cannot give and the cache does not have."""
    if not hub.is_hub_id(name):
        raise DemoInputError(f"cannot load model {name!r}: no folder of that name here, and not a preset "
                             f"({', '.join(PRESETS)}) or a hub id (owner/name)")
    reason = hub.offline_reason()
    if reason is None:
        hub.config_file(name)  # fetched alone first: a missing, gated or config-less repository says which
    elif not hub.is_cached(name):
        raise DemoInputError(f"cannot load model {name!r}: {hub.not_cached(name, reason)}; the presets work "
                             f"offline: {', '.join(PRESETS)}")
    return reason is not None


def _pretrained_source(name_or_path: str) -> ModelSource:
    """A hub id or a local folder with config.json, weights and a tokenizer."""
    local = Path(name_or_path).expanduser()
    if local.exists() and not local.is_dir():
        raise DemoInputError(f"model path {name_or_path!r} is a file; give a folder with config.json and weights")
    if local.is_dir() and not (local / "config.json").is_file():
        raise DemoInputError(f"model folder {name_or_path!r} has no config.json: it is not a model folder")
    target = str(local) if local.is_dir() else name_or_path
    try:
        local_only = local.is_dir() or _hub_target(name_or_path)
    except DemoInputError as error:
        message = str(error)
        raise DemoInputError(message if message.startswith("cannot load model") else
                             f"cannot load model {name_or_path!r}: {message}") from None
    try:
        raw = AutoConfig.from_pretrained(target, trust_remote_code=False, local_files_only=local_only)
        tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=False, local_files_only=local_only)
    except (OSError, ValueError) as error:
        if "custom code" in str(error):  # auto_map to the model's own Python files: never run (trust_remote_code)
            raise DemoInputError(
                f"model {name_or_path!r} needs its own Python code to load (auto_map), and this app never runs "
                f"code that comes with a model (trust_remote_code is off); use a model transformers supports natively"
            ) from None
        where = "its folder" if local.is_dir() else "the local cache" if local_only else "the hub"
        raise DemoInputError(f"cannot load model {name_or_path!r}: its config or tokenizer could not be read from "
                             f"{where} ({type(error).__name__})") from None
    config = trained_config(raw)  # its own refusal, outside the except above
    loader = AutoModelForCausalLM._model_mapping.get(type(raw), None)
    own_class = loader is not None and isinstance(config, loader.config_class)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"

    def build(attn_implementation: str, dtype: torch.dtype) -> torch.nn.Module:
        options = dict(attn_implementation=attn_implementation, dtype=dtype, trust_remote_code=False,
                       local_files_only=local_only)
        if not own_class:  # the language model of a vision-language checkpoint, from where such checkpoints keep it
            options.update(config=config, key_mapping=LANGUAGE_MODEL_KEYS, output_loading_info=True)
        try:
            loaded = AutoModelForCausalLM.from_pretrained(target, **options)
        except (OSError, ValueError) as error:
            raise DemoInputError(f"cannot load weights of {name_or_path!r}: {error}".splitlines()[0]) from None
        if own_class:  # a causal LM, or a composite transformers loads as its language model itself (Qwen3.5)
            return loaded
        model, loading = loaded
        if loading["missing_keys"]:
            raise DemoInputError(f"cannot load the language model of {name_or_path!r}: {len(loading['missing_keys'])} "
                                 f"of its weights are not where vision-language checkpoints keep them (e.g. "
                                 f"{sorted(loading['missing_keys'])[0]})")
        return model

    return ModelSource(name_or_path, config, tokenizer, False, build)


def load_model_source(name_or_path: str) -> ModelSource:
    if name_or_path in PRESETS:
        return _preset_source(PRESETS[name_or_path])
    return _pretrained_source(name_or_path)


def max_positions(config: PretrainedConfig) -> int | None:
    """The longest sequence the model's position scheme supports (None when the config does not say)."""
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def accepts_position_ids(config: PretrainedConfig) -> bool:
    """Padding-free packing restarts positions per example through `position_ids`; models without it can't pack."""
    import inspect

    model_class = AutoModelForCausalLM._model_mapping[type(config)]
    return "position_ids" in inspect.signature(model_class.forward).parameters
