"""Precision in one place: what each name means, for a run that trains and for an estimate that does not, as nanoGPT
resolves its `dtype` once into `ptdtype` and an autocast context (`train.py`) and torchtune maps names to dtypes in
one module (`training/precision.py`, `get_dtype`).

    fp32        fp32 weights, gradients, optimizer state and compute
    bf16, fp16  Trainer's `bf16=True` / `fp16=True`: fp32 weights (the master copy), gradients and optimizer state;
                the forward under `torch.autocast` in half precision, so activations are 2 bytes and autocast keeps
                half copies of the matmul weights for backward
    pure-bf16   bf16 weights, gradients and optimizer state, no fp32 copy and no autocast: estimated (the planner),
                never trained here
    auto        a run's choice per device (`resolve`): bf16 on a GPU that has it, else fp32

Every module that reads a precision name asks here: the trainer's flags, the memory estimate's bytes, the activation
probe's dtype and autocast, the results' slow-on-a-CPU flag, the choices the settings offer.
"""

from __future__ import annotations

import dataclasses

import torch

from demo_core.errors import DemoInputError


@dataclasses.dataclass(frozen=True)
class Precision:
    name: str
    weight_dtype: torch.dtype  # parameters, and so their gradients and AdamW's states
    compute_dtype: torch.dtype  # activations, and autocast's copies of the weights
    autocast: bool  # the forward runs under torch.autocast(compute_dtype) over weights of `weight_dtype`
    trained: bool  # a run can train it (Trainer has a flag for it); the others are estimated only
    needs_cuda: bool = False  # fp16 autocast has no CPU path in Trainer

    @property
    def weight_bytes(self) -> int:
        return self.weight_dtype.itemsize

    @property
    def compute_bytes(self) -> int:
        return self.compute_dtype.itemsize

    @property
    def half_compute(self) -> bool:
        """Activations in half precision (autocast or half weights): the kernels and logits the estimate counts."""
        return self.compute_bytes < 4

    @property
    def slow_on_cpu(self) -> bool:
        """Most CPUs have no fast half-precision matmuls: autocast only adds casts there, and a run loses time."""
        return self.autocast

    def trainer_flags(self) -> dict[str, bool]:
        """`TrainingArguments`' precision flags."""
        return {"bf16": self.autocast and self.compute_dtype == torch.bfloat16,
                "fp16": self.autocast and self.compute_dtype == torch.float16}


PRECISIONS = {precision.name: precision for precision in (
    Precision("fp32", torch.float32, torch.float32, autocast=False, trained=True),
    Precision("bf16", torch.float32, torch.bfloat16, autocast=True, trained=True),
    Precision("fp16", torch.float32, torch.float16, autocast=True, trained=True, needs_cuda=True),
    Precision("pure-bf16", torch.bfloat16, torch.bfloat16, autocast=False, trained=False),
)}
AUTO = "auto"
PRECISION_NAMES = (AUTO, *(name for name, precision in PRECISIONS.items() if precision.trained))  # what a run takes
ESTIMATE_PRECISION_NAMES = tuple(PRECISIONS)  # what an estimate takes: resolved names, and the estimated-only ones


def resolve(requested: str, device: str) -> str:
    """auto: bf16 where the GPU supports it, fp32 on CPU (CPU bf16 autocast is slower than fp32)."""
    if requested == AUTO:
        return "bf16" if device == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if PRECISIONS[requested].needs_cuda and device != "cuda":
        raise DemoInputError(f"{requested} mixed precision needs a CUDA GPU; use fp32 or bf16 on CPU")
    return requested
