"""The memory planner: the burst's own estimate for a run's settings, measured runs, sharding, LoRA counts, searches,
shipped configs and the CLI contract."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from commandline.main import main
from demo_core import RunConfig, run_comparison
from demo_core.errors import DemoInputError
from demo_core.memory.parameters import param_facts
from demo_core.memory.plan_request import GPU_SIZES_GB, PlanRequest, load_config, shipped_configs, training_settings
from demo_core.memory.planner import device_estimate, per_device_estimate, plan
from demo_core.memory.step import StepShape
from demo_core.models.sources import PRESETS
from demo_core.training.engine import prepare
from presentation.plan_text import changes_that_need_less, largest_fit_words

GIB = 2 ** 30
SMALL_RUN = dict(model="tiny-llama", dataset="flan-like", samples=24, steps=2, batch_size=4, precision="fp32",
                 device="cpu", collators=("padded", "flatten"))
STATE_CATEGORIES = ("weights", "gradients", "optimizer", "activations")


def _planned(run: RunConfig, collator: str):
    """The planner's per-device estimate for the batch a burst measured (its first), with the run's settings."""
    prepared = prepare(run)
    lengths = [len(ids) for ids in prepared.dataset.examples[: run.batch_size]]
    step = StepShape.padded(lengths) if collator == "padded" else StepShape.packed_row(lengths)
    request = PlanRequest(model=run.model, precision=run.precision, optimizer=run.optimizer,
                          attention=prepared.resolved.attention, gradient_checkpointing=run.gradient_checkpointing,
                          device="cpu").validated()
    config = load_config(run.model)
    return per_device_estimate(config, step, training_settings(request, config))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_planner_equals_the_burst_estimate_and_the_measured_states_and_activations(checkpointing):
    run = RunConfig(gradient_checkpointing=checkpointing, **SMALL_RUN)
    for result in run_comparison(run).results:
        planned = _planned(run, result.collator)
        # One code path: the planner's numbers for a run's settings are the run's own estimate.
        assert planned.categories == result.memory["estimate"], result.collator
        measured = result.memory["measured"]
        planned_total = sum(planned.categories[c] for c in STATE_CATEGORIES)
        measured_total = sum(measured[c] for c in STATE_CATEGORIES)
        error = (planned_total - measured_total) / measured_total
        print(f"checkpointing={checkpointing} {result.collator}: planned {planned_total:,} measured "
              f"{measured_total:,} B ({100 * error:+.2f}%)")
        assert abs(planned_total - measured_total) <= 8  # bytes (the aim was 10%)
        # CPU peak as the burst reports it: the live tensors at the end of the forward
        assert abs(planned.peak_by_moment["forward_end"] / result.peak_memory_bytes - 1) < 0.10


def test_sharding_divides_what_it_should():
    request = dict(model="Llama-3.2-1B", batch_size=2, seq_length=1024)
    single = plan(PlanRequest(**request)).device.categories
    by_shard = {shard: plan(PlanRequest(**request, gpus=4, shard=shard)).device.categories
                for shard in ("none", "zero1", "zero2", "zero3", "fsdp")}
    quarter = {category: math.ceil(single[category] / 4) for category in single}
    assert by_shard["none"]["gradients"] == 2 * single["gradients"]  # DDP's buckets copy every gradient
    assert by_shard["zero1"]["optimizer"] == quarter["optimizer"]
    assert by_shard["zero1"]["gradients"] == single["gradients"] and by_shard["zero1"]["weights"] == single["weights"]
    assert by_shard["zero2"]["gradients"] == quarter["gradients"] and by_shard["zero2"]["weights"] == single["weights"]
    for shard in ("zero3", "fsdp"):
        assert by_shard[shard]["weights"] == quarter["weights"]
        assert by_shard[shard]["optimizer"] == quarter["optimizer"]
    for categories in by_shard.values():  # data parallel: each device keeps its own micro-batch's activations
        assert categories["activations"] == single["activations"]


@pytest.mark.parametrize("targets", ["q_proj,v_proj", "all-linear"])
def test_lora_trainable_params_match_the_module_shapes(targets):
    config = PRESETS["small-llama"].config()
    model = AutoModelForCausalLM.from_config(config)
    wanted = targets.split(",")
    expected = sum(8 * (module.in_features + module.out_features) for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and name != "lm_head"
                   and ("all-linear" in wanted or name.rsplit(".", 1)[-1] in wanted))
    assert expected > 0
    result = plan(PlanRequest(model="small-llama", lora_rank=8, lora_targets=targets, device="cpu",
                              precision="fp32", batch_size=2, seq_length=64))
    assert result.device.trainable_params == expected
    assert result.device.categories["gradients"] == 4 * expected  # fp32 adapters


def test_qlora_stores_the_linear_weights_in_four_bits():
    lora = plan(PlanRequest(model="Llama-3.1-8B", lora_rank=16, batch_size=1, seq_length=512))
    qlora = plan(PlanRequest(model="Llama-3.1-8B", lora_rank=16, qlora=True, batch_size=1, seq_length=512,
                             base_dtype="half"))  # the rest of the base as loaded
    # the default: peft's prepare_model_for_kbit_training upcasts the rest to fp32
    kbit = plan(PlanRequest(model="Llama-3.1-8B", lora_rank=16, qlora=True, batch_size=1, seq_length=512))
    assert kbit.request.base_dtype == "fp32"
    # 8.03B params, of which the embeddings and the output layer (2 x 128256 x 4096) are not quantized
    linear = lora.device.params - 2 * 128256 * 4096 - 65 * 4096  # minus the norms
    rest = lora.device.params - linear
    assert 0.5 * linear + 2 * rest < qlora.device.categories["weights"] < 0.53 * linear + 2 * rest + 4 * 50e6
    buffers = param_facts(load_config("Llama-3.1-8B")).buffer_bytes  # rotary tables, fp32 as built
    assert kbit.device.categories["weights"] - qlora.device.categories["weights"] == 2 * rest + buffers // 2
    # LoRA's default base: loaded in bf16, fp32 adapters (peft's default)
    assert lora.device.categories["weights"] == 2 * lora.device.params + 4 * lora.device.trainable_params + buffers // 2


def test_max_batch_size_and_seq_length_are_the_largest_that_fit_the_device_with_the_margin():
    base = dict(model="Qwen2.5-0.5B", seq_length=1024, batch_size=4, gpu_gb=24, packed=True)
    found = plan(PlanRequest(**base))
    b, s = found.max_batch_size, found.max_seq_length
    assert b >= 1 and s >= 2
    # decided on what nvidia-smi would show plus the margin, not on the live tensors alone
    needs = lambda **change: device_estimate(PlanRequest(**{**base, **change})).device_used_high_bytes  # noqa: E731
    assert needs(batch_size=b) <= 24 * GIB < needs(batch_size=b + 1)
    assert needs(seq_length=s) <= 24 * GIB < needs(seq_length=s + 1)
    live = lambda **change: device_estimate(PlanRequest(**{**base, **change})).peak_bytes  # noqa: E731
    assert live(batch_size=b + 1) < 24 * GIB  # the live tensors alone would have let one more example in


def test_packing_a_length_profile_needs_less_than_padding_it():
    request = dict(model="SmolLM2-135M", dataset="flan-like", samples=256, batch_size=16, seq_length=1024)
    padded = device_estimate(PlanRequest(**request)).peak_bytes
    packed = device_estimate(PlanRequest(**request, packed=True)).peak_bytes
    assert packed < padded


# Published sizes from the model cards (see demo_core/models/configs/README.md).
PUBLISHED_PARAMS = {"Llama-3.2-1B": 1.23e9, "Llama-3.2-3B": 3.21e9, "Llama-3.1-8B": 8.03e9, "Qwen2.5-0.5B": 0.49e9,
                    "Qwen2.5-7B": 7.61e9, "Mistral-7B-v0.3": 7.25e9, "gemma-2-2b": 2.61e9,
                    "Phi-3-mini-4k-instruct": 3.82e9, "SmolLM2-135M": 135e6, "SmolLM2-1.7B": 1.71e9,
                    "Mixtral-8x7B-v0.1": 46.7e9, "Llama-2-7b-hf": 6.74e9, "Llama-3.3-70B-Instruct": 70.6e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_shipped_configs_load_and_match_published_sizes(name):
    assert set(shipped_configs()) == set(PUBLISHED_PARAMS)
    config = load_config(name)
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert abs(params / PUBLISHED_PARAMS[name] - 1) < 0.01, (name, params)
    assert load_config(json.loads(shipped_configs()[name].read_text())["_name_or_path"]).to_dict() == config.to_dict()


def test_a_local_config_folder_loads_and_an_uncached_hub_id_is_a_user_error(tmp_path):
    (tmp_path / "config.json").write_text(shipped_configs()["SmolLM2-135M"].read_text())
    assert load_config(str(tmp_path)).hidden_size == 576
    with pytest.raises(DemoInputError, match="local cache"):
        load_config("no-such-org/no-such-model")


# ---- CLI ------------------------------------------------------------------------------------------------------

def test_plan_cli_writes_the_contract_keys(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny-llama", "--batch-size", "4", "--seq-length", "256", "--device", "cpu",
                 "--precision", "fp32", "--gradient-checkpointing", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert {"per_device", "total_bytes", "reserved_bytes", "device_used_bytes", "peak_moment", "fits",
            "max_batch_size", "max_seq_length", "fit_basis", "margin_bytes"} <= set(document)
    assert set(document["per_device"]) == {"weights", "gradients", "optimizer", "activations", "temporary", "context"}
    assert set(document["fits"]) == {str(gb) for gb in GPU_SIZES_GB}
    assert document["total_bytes"] >= document["per_device"]["weights"] + document["per_device"]["activations"]
    # on the CPU there is no caching allocator and no context: the three numbers are the live tensors
    assert document["total_bytes"] == document["reserved_bytes"] == document["device_used_bytes"]
    assert document["fit_basis"] == "device_used_bytes"
    output = capsys.readouterr().out
    assert "fits:" in output and "device used" in output and "margin" in output


def test_plan_cli_on_cuda_reports_the_three_numbers_and_decides_on_device_used(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "Qwen2.5-0.5B", "--batch-size", "2", "--seq-length", "1024", "--gpu-gb", "24",
                 "--context-gb", "0.5", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["total_bytes"] < document["reserved_bytes"] < document["device_used_bytes"]
    assert document["device_used_bytes"] - document["reserved_bytes"] == GIB // 2  # the context given
    assert document["device_used_range_bytes"][1] == document["device_used_bytes"] + document["margin_bytes"]
    for gb, fits in document["fits"].items():
        assert fits == (document["device_used_bytes"] + document["margin_bytes"] <= int(gb) * GIB)


@pytest.mark.parametrize("args, message", [
    (["--model", "tiny-llama", "--gpus", "0"], "gpus must be at least 1"),
    (["--model", "tiny-llama", "--shard", "zero9"], "invalid choice"),
    (["--model", "tiny-llama", "--shard", "zero2"], "give gpus of 2 or more"),
    (["--model", "tiny-llama", "--qlora"], "give a lora rank"),
    (["--model", "tiny-llama", "--batch-size", "two"], "batch size must be a whole number"),
    (["--model", "no-such-org/no-such-model"], "local cache"),
    (["--batch-size", "4"], "required: --model"),
])
def test_plan_bad_input_is_one_line_and_exit_2(capsys, args, message):
    assert main(["plan", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_a_plan_that_fits_nowhere_says_so_and_what_would_help():
    # A full fine-tune of 8B parameters needs ~16 bytes each before any activation: over 80 GB at any batch.
    stuck = plan(PlanRequest(model="Llama-3.1-8B", batch_size=8, seq_length=2048)).to_dict()
    assert stuck["max_batch_size"] == 0 == stuck["max_seq_length"]
    words = largest_fit_words(stuck)
    assert words.startswith("on 80 GB: not one example of 2,048 tokens fits; no length fits at batch size 8")
    assert "LoRA" in words and "gradient checkpointing" in words
    # The hint names only what the request has not done: LoRA, checkpointing and sharding are on here.
    lora = plan(PlanRequest(model="Llama-3.3-70B-Instruct", batch_size=64, seq_length=8192, lora_rank=16,
                            gradient_checkpointing=True, gpus=2, shard="fsdp", gpu_gb=24)).to_dict()
    hint = largest_fit_words(lora)
    assert not lora["max_batch_size"] and "4-bit base" in hint
    assert "LoRA" not in hint and "checkpointing" not in hint and "sharding" not in hint
    fitting = plan(PlanRequest(model="SmolLM2-135M", batch_size=8, seq_length=2048)).to_dict()
    assert largest_fit_words(fitting) == (f"on 80 GB: largest batch size {fitting['max_batch_size']} at 2,048 tokens; "
                                          f"longest sequence {fitting['max_seq_length']:,} tokens at batch size 8")


@pytest.mark.parametrize("checkpointing", [None, True])  # auto resolves on for LoRA (TRL's SFTTrainer), or asked on
def test_the_hint_does_not_name_lora_or_checkpointing_when_both_are_on(checkpointing):
    # The page's opening LoRA question at 4 x 65,536 tokens: no example of that length fits 24 GB even with both on.
    stuck = plan(PlanRequest(model="Llama-3.1-8B", lora_rank=16, gradient_checkpointing=checkpointing, batch_size=4,
                             seq_length=65536, gpu_gb=24)).to_dict()
    assert stuck["request"]["gradient_checkpointing"] is True and stuck["max_batch_size"] == 0
    # The same words from a document that still says "auto" (an echo of the question as asked): resolved again.
    as_asked = {**stuck, "request": {**stuck["request"], "gradient_checkpointing": checkpointing}}
    for document in (stuck, as_asked):
        hint = largest_fit_words(document).split("; ", 1)[1]
        assert "need less" in hint and "4-bit base" in hint, hint
        assert "LoRA" not in hint and "checkpointing" not in hint, hint


def test_each_change_the_hint_names_is_one_the_request_has_not_made():
    full = dataclasses.asdict(PlanRequest(model="Llama-3.1-8B").validated())
    assert changes_that_need_less(full) == ["LoRA", "8-bit AdamW", "gradient checkpointing", "sharding over more GPUs"]
    made = {  # a setting that makes one change -> the words that must then be gone from the hint
        "LoRA": dict(lora_rank=16), "4-bit base": dict(lora_rank=16, qlora=True),
        "8-bit AdamW": dict(optimizer="adamw_8bit"), "checkpointing": dict(gradient_checkpointing=True),
        "sharding": dict(gpus=2, shard="fsdp"),
    }
    for words, settings in made.items():
        request = dataclasses.asdict(PlanRequest(model="Llama-3.1-8B", **settings).validated())
        changes = changes_that_need_less(request)
        assert changes and not any(words in change for change in changes), (settings, changes)
