"""Contamination check: does packing change what the model computes for each example?

For one batch, runs each example alone, then the `flatten` row and the `naive-concat` row, and reports per example
the largest |Δlogit| against the example alone. Correct packing stays at float rounding (≈1e-6 in fp32); naive
concatenation lets later examples attend to earlier ones and moves logits by O(1).

It runs after training, as an illustration: the guarantee itself is the pre-flight check (preflight.py), made before
anything trains. So this check never fails a finished run: the examples are cut to what the model's positions can
hold as one naive-concat row. When that leaves fewer than two examples (long examples, a short position table, a
batch of one) there is nothing to mix, and a model that cannot compute these rows (a hybrid trained padded-only, a
row that runs out of memory) has nothing to show: both come back as "not checked" with the reason, never as a
clean 0.0 for naive concatenation.
"""

from __future__ import annotations

import logging

import torch

from demo_core.attention import hybrid_hazard
from demo_core.collators import FlattenCollator, NaiveConcatCollator, RecordingCollator
from demo_core.isolation import exclusive
from demo_core.models import hybrid_mixers
from demo_core.models.sources import ModelSource, max_positions

logger = logging.getLogger(__name__)


@torch.no_grad()
def _packed_logits(model, collator: RecordingCollator, examples: list[list[int]], device: str) -> torch.Tensor:
    batch = collator([{"input_ids": ids} for ids in examples])
    inputs = {key: value.to(device) if torch.is_tensor(value) else value
              for key, value in batch.items() if key != "labels"}
    return model(**inputs, use_cache=False).logits[0].float()


def fitting_examples(examples: list[list[int]], positions: int | None) -> list[list[int]]:
    """The leading examples whose concatenation fits the model's positions (naive-concat numbers them straight on;
    learned absolute positions, e.g. GPT-2's 2048, have no row past the end). At least the first one."""
    if positions is None:
        return examples
    kept, total = [], 0
    for ids in examples:
        total += len(ids)
        if kept and total > positions:
            break
        kept.append(ids)
    return kept


@torch.no_grad()
def _rows(source: ModelSource, attention: str, examples: list[list[int]], device: str, seed: int) -> list[dict]:
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
    if hybrid_mixers.installed_on(model) is not None:
        # The row above ran the hybrid's mixers per example: beside it, what plain padding-free packing computes with
        # the mixers transformers ships (a position_ids-only row; hybrid_hazard.py has the keyed one too).
        hazard = {reading.layout: reading for reading in hybrid_hazard.measure_hazard(model, examples, device)}
        for row, difference in zip(rows, hazard["position_ids"].max_abs_logit_diff_per_example or ()):
            row["flatten_without_per_example_mixers_max_abs_logit_diff"] = difference
    return rows


def why_not_comparable(examples: list[list[int]], fitting: list[list[int]], positions: int | None) -> str | None:
    """Why `fitting` (the leading examples that fit one row) cannot show contamination, or None when it can."""
    if len(fitting) >= 2:
        return None
    if len(examples) < 2:
        return "the batch holds a single example, so a packed row has no other example to mix into it"
    return (f"only the first of {len(examples)} examples fits in the model's {positions:,} positions as one row "
            f"({len(examples[0]):,} + {len(examples[1]):,} tokens do not), and contamination needs two side by side")


def contamination_check(source: ModelSource, attention: str, examples: list[list[int]], device: str,
                        seed: int) -> tuple[list[dict], str | None]:
    """(per example: max |Δlogit| of the flatten and naive-concat rows against the example alone; why not, when
    nothing was checked). The rows are computed holding the process's torch state (isolation.exclusive)."""
    positions = max_positions(source.config)
    fitting = fitting_examples(examples, positions)
    reason = why_not_comparable(examples, fitting, positions)
    if reason is not None:
        return [], reason
    try:
        with exclusive(seed):
            return _rows(source, attention, fitting, device, seed), None
    except Exception as error:  # e.g. a hybrid model trained padded-only has no packed row to show
        logger.warning("contamination check skipped: %s: %s", type(error).__name__, error)
        return [], f"the model could not compute these rows ({type(error).__name__}; the server log has the rest)"
