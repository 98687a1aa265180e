"""The loss-parity guarantee: every collator that claims it trains every preset exactly like padding.

10 optimizer steps from the same weights on the same examples in the same order: the per-step losses of `flatten`
and `trl-padding-free` (TRL's SFTTrainer) stay within 1e-4 of `padded` on all 7 tiny presets, on the attention
`auto` picks here (varlen). Short examples (max length 48) and batches of 3 keep each preset to a few seconds.
"""

import pytest

from demo_core import COLLATORS, RunConfig, run_comparison
from demo_core.collators import BASELINE
from demo_core.models.sources import PRESETS

TINY_PRESETS = [name for name in PRESETS if name.startswith("tiny-")]
# Every collator the registry says trains like padded (today flatten and trl-padding-free).
PARITY_COLLATORS = tuple(name for name, spec in COLLATORS.items() if spec.loss_parity and name != BASELINE)
STEPS = 10
TOLERANCE = 1e-4
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_every_tiny_preset_and_parity_claim_is_covered():
    assert {"flatten", "trl-padding-free"} <= set(PARITY_COLLATORS)
    assert TINY_PRESETS == ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-gemma", "tiny-phi3", "tiny-granite",
                            "tiny-gpt2"]


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_collators_that_claim_parity_match_padded_losses_for_10_steps(preset):
    config = RunConfig(model=preset, dataset="flan-like", samples=STEPS * 3, collators=("padded", *PARITY_COLLATORS),
                       steps=STEPS, batch_size=3, max_length=48, device="cpu", precision="fp32")
    document = run_comparison(config).to_dict()
    padded, *packed = document["results"]
    assert len(padded["losses"]) == STEPS
    for result in packed:
        assert result["step_real_tokens"] == padded["step_real_tokens"], result["collator"]  # the same batches
        differences = [abs(a - b) for a, b in zip(padded["losses"], result["losses"])]
        assert len(differences) == STEPS and max(differences) < TOLERANCE, (result["collator"], differences)
