"""The hazard per-example mixers remove: what plain padding-free packing computes on a hybrid without them.

For a model with linear-attention, short-convolution or SSM mixers (hybrid_mixers.MIXERS), one flattened row of the
examples runs with the mixers as transformers ships them, against each example alone, in two batch layouts:
- `position_ids` only (transformers' `DataCollatorWithFlattening` without flash kwargs): the state runs across the
  boundaries and each later example's logits move;
- `position_ids` with `cu_seq_lens_q/k`, `max_length_q/k` and `seq_idx`, the keys TRL's `padding_free=True` and this
  app's `flatten` collator send: the PyTorch fallbacks of the convolution, the gated delta rule and the Mamba-2 scan
  raise on them (transformers asks for the kernel package), Jamba's and MiniMax's mixers ignore them and mix.
The contamination check (contamination.py) adds the position_ids row's numbers to its rows, and the report shows the
largest beside flatten's; a layout the model does not run at all gives `None` and the error.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import DataCollatorWithFlattening

from demo_core.models import hybrid_mixers

_LAYOUT_KEYS = {
    "position_ids": ("input_ids", "position_ids"),
    "trl_padding_free": ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                         "max_length_k", "seq_idx"),
}


@dataclasses.dataclass(frozen=True)
class LayoutHazard:
    """One flattened layout without per-example mixers, against each example alone."""

    layout: str  # "position_ids" | "trl_padding_free"
    max_abs_logit_diff_per_example: tuple[float, ...] | None  # None: the model raised on this layout
    logit_scale: float  # the largest |logit| of the examples alone (1.0 at least, as preflight scales)
    error: str | None  # "ValueError: ..." (first line) when the model raised

    @property
    def max_abs_logit_diff(self) -> float | None:
        per_example = self.max_abs_logit_diff_per_example
        return None if per_example is None else max(per_example)


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


@torch.no_grad()
def measure_hazard(model: torch.nn.Module, examples: list[list[int]], device: str = "cpu") -> list[LayoutHazard]:
    """Per layout, max |Δlogit| of each example in one flattened row vs alone, with the model's mixers as
    transformers ships them (per-example mixers taken off for the measurement and put back after)."""
    installed = hybrid_mixers.installed_on(model)
    if installed is not None:
        installed.remove()
    try:
        alone = [model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0].float()
                 for ids in examples]
        scale = max(1.0, max(float(logits.abs().max()) for logits in alone))
        flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(
            [{"input_ids": ids} for ids in examples])
        readings = []
        for layout, keys in _LAYOUT_KEYS.items():
            inputs = {key: flat[key].to(device) if torch.is_tensor(flat[key]) else flat[key] for key in keys}
            try:
                packed = model(**inputs, use_cache=False).logits[0].float()
            except (ValueError, RuntimeError) as error:  # transformers' "can't keep packed sequences apart"
                readings.append(LayoutHazard(layout, None, scale, _first_line(error)))
                continue
            pieces = torch.split(packed, [len(ids) for ids in examples])
            diffs = tuple(float((piece - reference).abs().max()) for piece, reference in zip(pieces, alone))
            readings.append(LayoutHazard(layout, diffs, scale, None))
        return readings
    finally:
        if installed is not None:
            hybrid_mixers.install(model)

