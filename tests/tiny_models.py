"""Tiny random-init models and batches for the memory tests: configs from transformers' config classes, batches as
the padding and flattening collators build them, and the saved bytes of one forward as SavedActivationMeter sees it."""

from __future__ import annotations

import dataclasses

import torch
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import demo_core.attention.varlen  # noqa: F401  (registers the varlen attention)
from demo_core.memory.measure import SavedActivationMeter

VOCAB = 384


def family_config(family: str, hidden: int = 128, layers: int = 2, intermediate: int = 256):
    """A tiny config of `family`, passing only the fields its config class has (GQA where it exists), dropout off:
    dropout masks are random tensors that a fixed estimate cannot equal byte for byte."""
    cls = CONFIG_MAPPING[family]
    fields = {f.name for f in dataclasses.fields(cls)} | set(cls.attribute_map)
    wanted = dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=hidden // 4, vocab_size=VOCAB, max_position_embeddings=2048,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = cls(**{name: value for name, value in wanted.items() if name in fields})
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    return config


def build(config, attention: str = "sdpa") -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    model.train()
    return model


def padded_batch(lengths: list[int], seed: int = 0) -> dict:
    """Right-padded to the longest, with the attention mask and -100 labels on padding."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=generator)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def packed_batch(lengths: list[int], seed: int = 0) -> dict:
    """One row, positions restarting per example, the first label of each example -100 (DataCollatorWithFlattening)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (1, sum(lengths)), generator=generator)
    labels = ids.clone()
    labels[0, torch.tensor([0, *lengths[:-1]]).cumsum(0)] = -100
    return {"input_ids": ids, "position_ids": torch.cat([torch.arange(n) for n in lengths])[None], "labels": labels}


def segment_lengths(total: int, seed: int = 0, low: int = 8, high: int = 48) -> list[int]:
    """Random example lengths in [low, high) adding up to `total`."""
    generator = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(int(torch.randint(low, high, (1,), generator=generator)))
    lengths[-1] -= sum(lengths) - total
    if lengths[-1] < 2:
        lengths[-2] += lengths.pop()
    return lengths


def saved_bytes(model: torch.nn.Module, batch: dict, precision: str = "fp32") -> int:
    """What autograd saves in one forward (loss included), fp32 or under CPU bf16 autocast."""
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with SavedActivationMeter(model) as meter, autocast:
        model(**batch, use_cache=False)
    return meter.saved_bytes
