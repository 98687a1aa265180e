"""LoRA as peft lays it out: which linear layers it adapts, the adapter shapes, and its forward for the memory probe.

The bursts train with peft itself (lora_burst.py); the planner and its probe only need peft's matching rule (a module
name or its last dotted parts, or "all-linear" = every linear layer but the output layer), its adapter shapes
(A: rank x in, B: out x rank) and what its forward computes, so that autograd saves what it would save under peft.
tests/test_lora.py holds the estimate built on this to real peft bursts, category by category.
"""

from __future__ import annotations

import torch


def linear_in_out(module: torch.nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a matmul layer: nn.Linear, or transformers' Conv1D (gpt2), whose weight is (in, out)."""
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D":
        return tuple(module.weight.shape)
    return None


def is_lora_target(name: str, is_output_layer: bool, targets: tuple[str, ...]) -> bool:
    """peft's matching (`check_target_module_exists` for a list of names): a target is the module's name or its last
    dotted parts ("q_proj", "self_attn.q_proj"); or "all-linear" (every linear layer but the output layer)."""
    if "all-linear" in targets:
        return not is_output_layer
    return any(name == target or name.endswith(f".{target}") for target in targets)


def lora_target_names(model: torch.nn.Module, targets: tuple[str, ...]) -> list[str]:
    """Names of the modules of `model` that LoRA adapts."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, module in model.named_modules()
            if linear_in_out(module) is not None and is_lora_target(name, module is output, targets)]


class _LoraLinear(torch.nn.Module):
    """peft's LoRA forward without dropout: base(x) + lora_B(lora_A(x)) * alpha / rank, the base frozen, the adapters
    in `dtype` (fp32 is peft's autocast_adapter_dtype default over a half base; the base's own dtype when that is
    turned off), the input cast to their dtype and the sum cast back to the base's."""

    def __init__(self, base: torch.nn.Module, rank: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        in_features, out_features = linear_in_out(base)
        self.base = base
        self.lora_A = torch.nn.Linear(in_features, rank, bias=False, dtype=dtype)
        self.lora_B = torch.nn.Linear(rank, out_features, bias=False, dtype=dtype)

    # peft's LoRA layer exposes its base layer's weight and bias: a Mamba-2 mixer reads `out_proj.weight` in training
    # (for mamba-ssm's fused kernel; without it the fallback returns nothing and the unfused path runs)
    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x):
        result = self.base(x)
        adapted = self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * 2.0
        return (result + adapted).to(result.dtype)


def apply_lora(model: torch.nn.Module, rank: int, targets: tuple[str, ...],
               dtype: torch.dtype = torch.float32) -> None:
    """Freeze `model` and wrap its targeted linear layers in place, as peft's get_peft_model does (adapters in
    `dtype`)."""
    names = lora_target_names(model, targets)
    model.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _LoraLinear(getattr(parent, child), rank, dtype))
