"""LoRA and QLoRA for the bursts, through peft: every collator trains the same adapters on the same frozen base.

A LoRA burst is the full fine-tune's burst with one step more between building the model and handing it to its
trainer: `with_lora` wraps the model with peft's `get_peft_model`, once per collator, for Trainer and SFTTrainer
alike (SFTTrainer takes a ready PeftModel as its model). One wrapping for both trainers keeps the promise every burst
makes, the same initial weights for every collator: peft draws each A matrix with kaiming_uniform from torch's global
generator, so the generator is seeded right before (B starts at zero, so step 1's loss is the base model's).

Settings a fine-tuner would recognise: rank r with lora_alpha = 2r (scaling 2, what lora.py's imitation assumes), no
dropout (two collators must compute the same numbers), no bias, adapters in fp32 (peft's autocast_adapter_dtype),
targets as peft's `target_modules` (module names, matched on the name or its last dotted parts; or "all-linear").

QLoRA (Dettmers et al. 2023, arXiv 2305.14314) stores the frozen linear weights in 4-bit NF4 with double quantization
through bitsandbytes, which quantizes on CUDA only: refused elsewhere (`check_qlora`).
"""

from __future__ import annotations

import importlib.util
import tempfile
import warnings

import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, PretrainedConfig
from transformers.pytorch_utils import Conv1D

from demo_core.config import LORA_ALL_LINEAR, RunConfig
from demo_core.errors import DemoInputError
from demo_core.memory.parameters import param_facts
from demo_core.models import hybrid_mixers
from demo_core.models.lora import is_lora_target

LORA_ALPHA_PER_RANK = 2  # lora_alpha = 2 x rank: a common choice, and the scaling lora.py's imitation computes


def lora_config(rank: int, targets: tuple[str, ...], fan_in_fan_out: bool = False):
    """`fan_in_fan_out` for weights stored (in, out), GPT-2's Conv1D (peft would warn and set it itself)."""
    from peft import LoraConfig  # imported when a LoRA run needs it: a full fine-tune never loads peft

    return LoraConfig(r=rank, lora_alpha=LORA_ALPHA_PER_RANK * rank, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM", fan_in_fan_out=fan_in_fan_out,
                      target_modules=LORA_ALL_LINEAR if targets == (LORA_ALL_LINEAR,) else list(targets))


def check_lora_targets(config: PretrainedConfig, model_name: str, targets: tuple[str, ...]) -> None:
    """Every target must name at least one linear layer of the model (what peft adapts, and what the memory
    estimate counts); an unknown name is refused before anything trains, with the names that would work."""
    layers = param_facts(config).linear_layers  # (name, in, out, is the output layer), from the meta-device model
    unmatched = [target for target in targets
                 if not any(is_lora_target(name, is_output, (target,)) for name, _, _, is_output in layers)]
    if unmatched:
        known = sorted({name.rsplit(".", 1)[-1] for name, _, _, is_output in layers if not is_output})
        raise DemoInputError(f"lora target {unmatched[0]!r} names no linear layer of {model_name}; choose from: "
                             f"{', '.join(known)}, or {LORA_ALL_LINEAR}")


def check_qlora(device: str) -> None:
    """QLoRA needs bitsandbytes' 4-bit kernels, which run on CUDA."""
    if device != "cuda":
        raise DemoInputError("QLoRA quantizes the base model to 4 bits with bitsandbytes, which needs a CUDA GPU; "
                             "on this machine train LoRA without --qlora")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise DemoInputError("QLoRA needs the bitsandbytes package: pip install -r requirements-gpu.txt")


def quantized(model: torch.nn.Module, compute_dtype: torch.dtype) -> torch.nn.Module:
    """The same weights reloaded with bitsandbytes' 4-bit NF4 linear layers (double quantization), as QLoRA loads a
    checkpoint; everything else (embeddings, norms, the output layer) in the compute dtype. Through a saved copy,
    so a random-init preset is quantized exactly like a hub checkpoint."""
    with tempfile.TemporaryDirectory(prefix="packing-lab-qlora-") as folder:
        model.save_pretrained(folder)
        quantized_model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=compute_dtype, attn_implementation=model.config._attn_implementation,
            device_map={"": torch.cuda.current_device()},
            quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                   bnb_4bit_use_double_quant=True,
                                                   bnb_4bit_compute_dtype=compute_dtype))
    quantized_model.loss_type = model.loss_type  # ModelSource.build may have named it (gpt2)
    hybrid_mixers.install(quantized_model)  # as ModelSource.build does: a reloaded hybrid packs per example too
    return quantized_model


def with_lora(model: torch.nn.Module, run: RunConfig) -> torch.nn.Module:
    """`model` frozen, its targeted linear layers wrapped with LoRA adapters initialised from `run.seed`."""
    from peft import get_peft_model

    if run.qlora:
        model = quantized(model, torch.bfloat16 if run.precision != "fp32" else torch.float32)
    config = lora_config(run.lora_rank, run.lora_targets,
                         fan_in_fan_out=any(isinstance(module, Conv1D) for module in model.modules()))
    torch.manual_seed(run.seed)  # the A matrices: the same draw for every collator
    with warnings.catch_warnings():  # peft 0.21 asks transformers 5 for a renamed attribute; nothing to act on
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return get_peft_model(model, config)
