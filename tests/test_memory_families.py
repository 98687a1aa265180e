"""The activation estimate against bytes measured on real tiny models, for many decoder families (CPU).

Each family's config is built from its transformers config class at a tiny size (hidden 128, 2 layers) that none of
the estimator's small probe models uses, so a match means the fit carries over to other widths and token shapes.
Run `pytest -s tests/test_memory_families.py` to see the table.
"""

from __future__ import annotations

import pytest

from demo_core.memory.estimate import estimate_memory_detail
from demo_core.memory.step import StepShape, TrainingSettings

from tiny_models import build, family_config, packed_batch, padded_batch, saved_bytes

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma", "gemma3_text", "phi3", "granite", "gpt2",
            "starcoder2", "stablelm", "cohere", "smollm3", "gpt_neox", "phi", "mixtral", "qwen3_moe", "opt"]
PADDED_LENGTHS = [64, 21, 47, 33]
PACKED_LENGTHS = [40, 17, 60, 33, 50]


# Tiny forwards: OpenMP's hand-off costs more than the work on a busy machine (the probe runs this way too).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


CASES = [(family, attention, layout, precision) for family in FAMILIES
         for attention, precision in (("sdpa", "fp32"), ("sdpa", "bf16"), ("varlen", "fp32"))
         for layout in ("padded", "packed")]


@pytest.mark.parametrize("family, attention, layout, precision", CASES)
def test_activation_estimate_matches_saved_tensors_across_families(family, attention, layout, precision):
    config = family_config(family)
    packed = layout == "packed"
    batch = packed_batch(PACKED_LENGTHS) if packed else padded_batch(PADDED_LENGTHS)
    measured = saved_bytes(build(config, attention), batch, precision)
    step = StepShape.packed_row(PACKED_LENGTHS) if packed else StepShape.padded(PADDED_LENGTHS)
    estimate = estimate_memory_detail(config, step, TrainingSettings(precision=precision, attention=attention))
    estimated = estimate.categories["activations"]
    error = (estimated - measured) / measured
    print(f"{family:12s} {attention:6s} {layout:6s} {precision}  est {estimated:>10,}  meas {measured:>10,}  "
          f"err {100 * error:+.3f}%")
    assert estimated == measured, (family, attention, layout, precision, estimated, measured)  # to the byte
