"""LoRA bursts through peft: packing stays exact, every collator trains the same adapters, and the memory estimate
(and the planner, its same code path) matches what the real peft run holds, category by category."""

from __future__ import annotations

import json
import math

import pytest
import torch

from commandline.main import main
from demo_core import DemoInputError, RunConfig, run_comparison
from demo_core.memory.parameters import lora_adapter_shapes
from demo_core.memory.plan_request import PlanRequest, load_config, training_settings
from demo_core.memory.planner import per_device_estimate
from demo_core.memory.step import StepShape
from demo_core.models.sources import load_model_source
from demo_core.training.engine import prepare
from demo_core.training.lora import check_qlora, with_lora

SMALL = dict(dataset="flan-like", samples=24, steps=4, batch_size=4, lora_rank=8)
STATES = ("weights", "gradients", "optimizer")

def _settings(**fields) -> RunConfig:
    return RunConfig(**{"steps": 1, "batch_size": 4, "max_length": 64, "learning_rate": 1e-3,
                            "optimizer": "adamw", "precision": "fp32", "device": "cpu", "seed": 0, "lora_rank": 4,
                            **fields})

def _adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}

def test_the_same_seed_gives_every_collator_the_same_base_and_adapters():
    source = load_model_source("tiny-llama")
    first = with_lora(source.build("sdpa", seed=0), _settings())
    second = with_lora(source.build("sdpa", seed=0), _settings())
    other_seed = with_lora(source.build("sdpa", seed=0), _settings(seed=1))
    adapters = _adapters(first)
    assert adapters and all(name.endswith(("lora_A.default.weight", "lora_B.default.weight")) for name in adapters)
    assert all(torch.equal(value, _adapters(second)[name]) for name, value in adapters.items())
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters()))
    # A is drawn from the seed (B starts at zero), so another seed draws other adapters
    first_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert not torch.equal(adapters[first_a], _adapters(other_seed)[first_a])

def test_lora_packing_gives_padded_losses_through_trainer_and_sfttrainer():
    comparison = run_comparison(RunConfig(model="tiny-llama", collators=("padded", "flatten", "trl-padding-free"),
                                          **SMALL)).to_dict()
    losses = {result["collator"]: result["losses"] for result in comparison["results"]}
    assert len(losses["padded"]) == 4 and losses["padded"][-1] < losses["padded"][0]  # the adapters learn
    for collator in ("flatten", "trl-padding-free"):
        # float rounding only (measured 5e-7): the same batches, the same adapters, the same optimizer steps
        assert comparison["comparison"][collator]["max_abs_loss_diff_vs_padded"] < 1e-5, collator
    assert comparison["config"]["lora_rank"] == 8 and comparison["config"]["lora_targets"] == ["all-linear"]

def _planned(run: RunConfig, collator: str, lengths: list[int], attention: str):
    """The planner's estimate for the batch a burst measured (its first), with the run's settings."""
    step = StepShape.padded(lengths) if collator == "padded" else StepShape.packed_row(lengths)
    request = PlanRequest(model=run.model, precision="fp32", optimizer=run.optimizer, attention=attention,
                          gradient_checkpointing=run.gradient_checkpointing, device="cpu", lora_rank=run.lora_rank,
                          lora_targets=",".join(run.lora_targets),
                          loss="full").validated()  # Trainer's collators: the model's own loss over full logits
    config = load_config(run.model)
    return per_device_estimate(config, step, training_settings(request, config))

@pytest.mark.parametrize("model, attention, targets, optimizer, checkpointing", [
    ("tiny-llama", "varlen", ("all-linear",), "adamw", False),
    ("tiny-gpt2", "sdpa", ("c_attn",), "sgd", False),
    # 4 layers, adapters only after attention: the first layer saves nothing before its o_proj, not even the kernel's
    # inputs or the rotary tables, and the later layers do (the estimate probes the first layer on its own)
    ("small-llama", "varlen", ("o_proj",), "adamw", False),
    ("small-llama", "sdpa", ("self_attn.q_proj", "v_proj"), "adamw", True),
])
def test_lora_burst_memory_matches_the_estimate_and_the_planner(model, attention, targets, optimizer, checkpointing):
    run = RunConfig(model=model, attention=attention, lora_targets=targets, optimizer=optimizer,
                    gradient_checkpointing=checkpointing, collators=("padded", "flatten"),
                    **{**SMALL, "steps": 2})
    prepared = prepare(run)
    lengths = [len(ids) for ids in prepared.examples[: run.batch_size]]
    adapter_params = sum(math.prod(shape) for shape in
                         lora_adapter_shapes(prepared.source.config, run.lora_rank, targets))
    for result in run_comparison(prepared).results:
        memory = result.memory
        for category in STATES:  # tensors we can sum: exact
            assert memory["estimate"][category] == memory["measured"][category], (result.collator, category)
        assert memory["measured"]["gradients"] == 4 * adapter_params  # only the fp32 adapters train
        # to a few bytes, as full fine-tunes (a scalar or two the burst's meter sees around the loss)
        assert abs(memory["estimate"]["activations"] - memory["measured"]["activations"]) <= 8, result.collator
        planned = _planned(run, result.collator, lengths, prepared.resolved.attention)
        assert planned.categories == memory["estimate"], result.collator  # one code path
        assert planned.trainable_params == adapter_params

def test_lora_settings_are_checked_before_anything_trains():
    with pytest.raises(DemoInputError, match="lora target 'nope' names no linear layer of tiny-llama; choose from: "
                                             ".*q_proj"):
        prepare(RunConfig(model="tiny-llama", lora_rank=4, lora_targets="q_proj,nope", samples=8))
    with pytest.raises(DemoInputError, match="QLoRA trains LoRA adapters on a 4-bit base: give a lora rank"):
        RunConfig(qlora=True).validated()
    with pytest.raises(DemoInputError, match="all-linear already means every linear layer"):
        RunConfig(lora_rank=4, lora_targets="all-linear,q_proj").validated()
    assert RunConfig(lora_rank="16", lora_targets=" q_proj, v_proj ").validated().lora_targets == ("q_proj", "v_proj")

@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA GPU")
def test_qlora_without_a_gpu_is_refused_with_the_reason(capsys):
    assert main(["compare", "--lora-rank", "8", "--qlora", "--samples", "8"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "QLoRA quantizes the base model to 4 bits with bitsandbytes, which needs a CUDA " \
                               "GPU" in error[0], error

def test_qlora_on_a_gpu_without_bitsandbytes_says_what_to_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # a CUDA machine without bitsandbytes
    with pytest.raises(DemoInputError, match="pip install -r requirements-gpu.txt"):
        check_qlora("cuda")

@pytest.mark.parametrize("args, message", [
    (["--lora-rank", "-1"], "lora rank must be between 0 and 1024"),
    (["--lora-rank", "four"], "lora rank must be a whole number"),
    (["--lora-rank", "4", "--lora-targets", ","], "give lora targets"),
])
def test_bad_lora_flags_are_one_line_and_exit_2(capsys, args, message):
    assert main(["compare", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines

def test_cli_trains_lora_with_checkpointing_and_a_learning_rate(tmp_path, capsys):
    out = tmp_path / "lora.json"
    assert main(["compare", "--model", "tiny-llama", "--samples", "16", "--steps", "2", "--batch-size", "4",
                 "--collators", "padded,flatten", "--lora-rank", "4", "--lora-targets", "q_proj,v_proj",
                 "--gradient-checkpointing", "--learning-rate", "5e-4", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    config = document["config"]
    assert (config["lora_rank"], config["lora_targets"], config["gradient_checkpointing"],
            config["learning_rate"]) == (4, ["q_proj", "v_proj"], True, 5e-4)
    for result in document["results"]:
        assert result["memory"]["estimate"]["gradients"] == result["memory"]["measured"]["gradients"]
    assert "LoRA r=4 on q_proj,v_proj" in capsys.readouterr().out
