"""Contamination check: does packing change what the model computes for each example?

For one batch, runs each example alone, then the `flatten` row and the `naive-concat` row, and reports per example
the largest |Δlogit| against the example alone. Correct packing stays at float rounding (≈1e-6 in fp32); naive
concatenation lets later examples attend to earlier ones and moves logits by O(1).
"""

from __future__ import annotations

import torch

from .collators import FlattenCollator, NaiveConcatCollator, RecordingCollator
from .models import ModelSource


@torch.no_grad()
def _packed_logits(model, collator: RecordingCollator, examples: list[list[int]], device: str) -> torch.Tensor:
    batch = collator([{"input_ids": ids} for ids in examples])
    inputs = {key: value.to(device) if torch.is_tensor(value) else value
              for key, value in batch.items() if key != "labels"}
    return model(**inputs, use_cache=False).logits[0].float()


@torch.no_grad()
def contamination_check(source: ModelSource, attention: str, examples: list[list[int]], device: str,
                        seed: int) -> list[dict]:
    model = source.build(attention, torch.float32, seed=seed).to(device).eval()
    flat = _packed_logits(model, FlattenCollator(source.tokenizer), examples, device)
    naive = _packed_logits(model, NaiveConcatCollator(source.tokenizer), examples, device)
    rows, start = [], 0
    for index, ids in enumerate(examples):
        alone = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0].float()
        end = start + len(ids)
        rows.append({
            "example": index,
            "length": len(ids),
            "flatten_max_abs_logit_diff": float((flat[start:end] - alone).abs().max()),
            "naive_concat_max_abs_logit_diff": float((naive[start:end] - alone).abs().max()),
        })
        start = end
    del model
    return rows
