"""The planner's answer for the card: reserved and device-used memory, the margin a fit keeps, the checks every fitted
term passes, the heads a config's architectures name, and the settings people train with."""

from __future__ import annotations

import dataclasses

import pytest

from demo_core.errors import DemoInputError
from demo_core.memory import estimate as memory_estimate
from demo_core.memory import probe as activation_probe
from demo_core.memory import reserve as memory_reserve
from demo_core.memory.estimate import bert_large_config, estimate_memory_detail
from demo_core.memory.plan_request import PlanRequest, load_config, shipped_configs
from demo_core.memory.planner import device_estimate, plan
from demo_core.memory.reserve import MIB, segment_bytes
from demo_core.memory.step import StepShape, TrainingSettings

from tiny_models import family_config

GIB = 2 ** 30


# ---- the caching allocator and the device -----------------------------------------------------------------------

@pytest.mark.parametrize("blocks, reserved", [
    ([(16 * MIB, 8)], 128 * MIB),  # >= 10 MiB: a segment each, already a 2 MiB multiple (the devlog's example)
    ([(11 * MIB - 1, 1)], 12 * MIB),  # rounded up to 2 MiB
    ([(4 * MIB, 5)], 20 * MIB),  # 1-10 MiB: five fit one 20 MiB segment
    ([(4 * MIB, 6)], 40 * MIB),  # the sixth opens another
    ([(8 * MIB, 3)], 40 * MIB),  # two per 20 MiB segment
    ([(1000, 4000)], 2 * 2 * MIB),  # small blocks, each rounded to 1,024 bytes, packed in 2 MiB segments
    ([], 0),
])
def test_segments_follow_the_caching_allocators_rules(blocks, reserved):
    assert segment_bytes(blocks) == reserved


def test_reserved_adds_rounding_workspaces_and_slack_and_device_used_adds_context_and_nccl():
    base = dict(model="Qwen2.5-0.5B", batch_size=2, seq_length=1024, context_gb=0.5)
    one = device_estimate(PlanRequest(**base)).memory
    assert one.reserve_terms["library_workspaces"] == memory_reserve.LIBRARY_WORKSPACE_BYTES
    assert one.reserved.bytes == one.allocated_bytes + sum(one.reserve_terms.values())
    assert one.reserved.low <= one.reserved.bytes <= one.reserved.high
    assert one.device_used.bytes == one.reserved.bytes + GIB // 2 and one.device_terms["nccl"] == 0
    ddp = device_estimate(PlanRequest(**base, gpus=4)).memory
    assert ddp.device_terms["nccl"] == memory_reserve.NCCL_BYTES["more"]  # one communicator's buffers
    # FSDP gathers each layer on its own stream: its measured slack grows with the step, one stream's does not
    fsdp = device_estimate(PlanRequest(**base, gpus=4, shard="fsdp")).memory
    shares = sorted(m.bytes for m in memory_reserve.PUBLISHED_SHARDED_SLACK)
    assert fsdp.reserve_terms["cache_slack"] > one.reserve_terms["cache_slack"]
    assert shares[0] * fsdp.allocated_bytes / 4 < fsdp.reserve_terms["cache_slack"] < shares[-1] * fsdp.allocated_bytes


def test_the_context_is_given_or_a_published_typical_figure_with_its_range():
    lazy = device_estimate(PlanRequest(model="SmolLM2-135M", batch_size=1, seq_length=256)).memory
    eager = device_estimate(PlanRequest(model="SmolLM2-135M", batch_size=1, seq_length=256,
                                        cuda_module_loading="eager")).memory
    assert lazy.device_terms["cuda_context"] == 426 * MIB and "lazy" in lazy.context_source
    assert eager.device_terms["cuda_context"] == 1343 * MIB  # the HF guide's V100 without lazy loading
    assert lazy.margin_bytes > 0
    given = device_estimate(PlanRequest(model="SmolLM2-135M", batch_size=1, seq_length=256, context_gb=1)).memory
    assert given.device_terms["cuda_context"] == GIB and given.context_source.startswith("given")


def test_fits_are_decided_on_device_used_plus_the_margin_not_on_the_live_tensors():
    request = PlanRequest(model="Llama-3.2-1B", batch_size=4, seq_length=4096, precision="pure-bf16",
                          gradient_checkpointing=True)
    found = plan(request)
    memory = found.device.memory
    for gb, fits in found.fits.items():
        assert fits == (memory.device_used.high <= gb * GIB)
    # A card between the live peak and device used + margin: the live tensors fit it, the plan must say no.
    card_gb = (memory.allocated_bytes + memory.device_used.high) / 2 / GIB
    between = plan(dataclasses.replace(request, gpu_gb=card_gb))
    assert memory.allocated_bytes < card_gb * GIB
    assert between.max_batch_size < 4 and between.max_seq_length < 4096


# ---- every fitted term checked ----------------------------------------------------------------------------------

_SWEEP = {
    # the issue's case: QLoRA r=8, pure bf16, gradient checkpointing, 2 x 2048
    "qlora": dict(lora_rank=8, qlora=True, precision="pure-bf16", gradient_checkpointing=True, batch_size=2,
                  seq_length=2048),
    "full": dict(precision="bf16", batch_size=1, seq_length=1024),
}


@pytest.mark.parametrize("model", sorted(shipped_configs()))
def test_every_shipped_config_gives_sane_numbers_with_the_full_and_the_chunked_loss(model):
    config = load_config(model)
    for name, setting in _SWEEP.items():
        estimates = {loss: device_estimate(PlanRequest(model=model, loss=loss, **setting))
                     for loss in ("full", "chunked")}
        # A bound no step reaches: fp32 weights, gradients and two states, and per token 64 fp32 hidden-size
        # tensors per layer and 16 bytes per vocabulary entry (the full logits in fp32, their gradients and more).
        tokens = setting["batch_size"] * setting["seq_length"]
        bound = 16 * estimates["full"].params + tokens * (
            config.num_hidden_layers * 64 * 4 * config.hidden_size + 16 * config.vocab_size)
        for loss, estimate in estimates.items():
            terms = {**estimate.categories, **estimate.activation_terms, **estimate.temporary_terms}
            assert estimate.reliable and min(terms.values()) >= 0, (model, name, loss, terms)
            memory = estimate.memory
            assert estimate.peak_bytes == memory.allocated_bytes < memory.reserved.bytes < memory.device_used.bytes
            assert estimate.peak_bytes < bound, (model, name, loss, estimate.peak_bytes / GIB)
        full, chunked = estimates["full"], estimates["chunked"]
        # the chunked head never keeps the full logits: its saved head is smaller
        assert chunked.activation_terms["head_and_loss"] < full.activation_terms["head_and_loss"], (model, name)
        if name == "qlora":
            assert chunked.peak_bytes < full.peak_bytes, model  # a frozen head: nothing accumulated in fp32


def test_the_issues_fused_loss_case_reads_gigabytes_not_terabytes():
    setting = dict(model="Llama-3.1-8B", **_SWEEP["qlora"])
    chunked = device_estimate(PlanRequest(loss="chunked", **setting))
    full = device_estimate(PlanRequest(loss="full", **setting))
    assert 5 * GIB < chunked.peak_bytes < full.peak_bytes < 20 * GIB  # was 12,424 GiB against 13.5 GiB


@pytest.mark.parametrize("loss", ["full", "chunked"])
def test_memory_grows_with_the_sequence_up_to_the_models_longest(loss):
    # A 64k-token row's activations once read as float rounding (their threshold grew with the quadratic monomials'
    # growth, which is zero here) and vanished: device use fell from 58 to 41 GiB going from 48k to 64k tokens, and
    # 80 GB "fit" the model's whole 131,072 positions.
    setting = dict(model="Llama-3.1-8B", loss=loss, **{**_SWEEP["qlora"], "batch_size": 1})
    lengths = [4096 * 2 ** power for power in range(6)]  # 4k to 128k
    used = [device_estimate(PlanRequest(**{**setting, "seq_length": length})).memory.device_used.bytes
            for length in lengths]
    activations = [device_estimate(PlanRequest(**{**setting, "seq_length": length})).categories["activations"]
                   for length in lengths]
    assert all(later > earlier for earlier, later in zip(used, used[1:])), [u / GIB for u in used]
    # checkpointing keeps each layer's input: linear in tokens, so doubling the length doubles it
    assert all(later == pytest.approx(2 * earlier, rel=0.01) for earlier, later in zip(activations, activations[1:]))
    longest = plan(PlanRequest(gpu_gb=80, **{**setting, "seq_length": 2048})).max_seq_length
    assert 0 < longest < 131_072


def test_a_fit_outside_its_physical_bounds_or_missing_its_held_out_forward_is_refused(monkeypatch):
    config, step = family_config("llama"), StepShape(2, 64)
    settings = TrainingSettings(precision="fp32", attention="sdpa")
    assert estimate_memory_detail(config, step, settings).reliable
    spec = memory_estimate._probe_spec(step, settings, checkpointing=False)
    fit = activation_probe.activation_fit(config, spec)
    assert fit.reliable and fit.held_out_misfit_bytes <= 8
    key = (type(config).__name__, config.to_json_string(use_diff=False), spec)
    # a fit gone wrong: one coefficient flipped far below zero, then a miss on the held-out forward
    broken = fit.coefficients.copy()
    broken[1] = -abs(broken[1]) - 1e6
    monkeypatch.setitem(activation_probe._FIT_CACHE, key, dataclasses.replace(fit, coefficients=broken))
    flipped = estimate_memory_detail(config, step, settings)
    assert not flipped.reliable and any("physical range" in note for note in flipped.notes)
    monkeypatch.setitem(activation_probe._FIT_CACHE, key, dataclasses.replace(fit, held_out_misfit_bytes=1e6))
    missed = estimate_memory_detail(config, step, settings)
    assert not missed.reliable and any("never saw" in note for note in missed.notes)


def test_the_planner_refuses_an_unreliable_fit(monkeypatch):
    original = activation_probe.probed_activations

    def missed(*args, **kwargs):
        return dataclasses.replace(original(*args, **kwargs), reliable=False, notes=["held-out miss"])

    monkeypatch.setattr(memory_estimate, "probed_activations", missed)  # where the estimate looks it up
    with pytest.raises(DemoInputError, match="reliably: .*held-out miss"):
        device_estimate(PlanRequest(model="SmolLM2-135M", batch_size=1, seq_length=128))


# ---- heads, settings ------------------------------------------------------------------------------------------

def test_the_config_architectures_choose_the_head(tmp_path):
    classifier = bert_large_config()  # BertForSequenceClassification, 2 labels: the anatomy page's BERT
    classifier.save_pretrained(tmp_path / "cls")
    masked = bert_large_config()
    masked.architectures = ["BertForMaskedLM"]
    masked.save_pretrained(tmp_path / "mlm")
    found = {name: plan(PlanRequest(model=str(tmp_path / name), batch_size=4, seq_length=512, precision="fp32"))
             for name in ("cls", "mlm")}
    assert found["cls"].model_head == "sequence-classification" and found["mlm"].model_head == "masked-lm"
    assert found["cls"].device.params < 336e6  # no 30,522-wide vocabulary head on the classifier
    assert found["cls"].device.temporary_terms["logits_gradients"] == 4 * 2 * (2 * 4)  # 4 rows x 2 labels, fp32
    assert found["mlm"].device.temporary_terms["logits_gradients"] == 4 * 512 * 30522 * 8
    assert found["cls"].attention == "sdpa"  # an encoder never gets the engine's causal varlen
    with pytest.raises(DemoInputError, match="chunked loss"):
        plan(PlanRequest(model=str(tmp_path / "cls"), batch_size=4, seq_length=512, loss="chunked"))


def test_lora_is_planned_as_sfttrainer_runs_it_and_the_8b_question_fits_24gb():
    request = PlanRequest(model="Llama-3.1-8B", lora_rank=16, batch_size=4, seq_length=2048, gpu_gb=24)
    found = plan(request)
    assert (found.request.base_dtype, found.request.loss, found.request.gradient_checkpointing) == (
        "half", "chunked", True)
    assert found.fits[24] and found.max_seq_length >= 2048 and found.max_batch_size >= 4
    # The old default (fp32 master weights, full logits, no checkpointing) reads ~77 GiB: what few LoRA users run.
    old = plan(dataclasses.replace(request, base_dtype="fp32", loss="full", gradient_checkpointing=False))
    assert old.device.peak_bytes > 60 * GIB and old.max_seq_length < 2048
    full_finetune = plan(PlanRequest(model="Llama-3.2-1B", batch_size=1, seq_length=512)).request
    assert (full_finetune.base_dtype, full_finetune.loss, full_finetune.gradient_checkpointing) == (
        "fp32", "full", False)


def test_adapter_dtype_sharding_optimizer_and_accumulation_change_what_they_should():
    base = dict(model="SmolLM2-135M", batch_size=2, seq_length=512, context_gb=0.5)
    fp32 = device_estimate(PlanRequest(lora_rank=16, **base))
    half = device_estimate(PlanRequest(lora_rank=16, adapter_dtype="base", **base))
    adapters = fp32.trainable_params
    assert fp32.categories["weights"] - half.categories["weights"] == 2 * adapters
    assert fp32.categories["gradients"] == 2 * half.categories["gradients"] == 4 * adapters
    assert fp32.activation_terms["amp_weight_copies"] == 2 * adapters  # fp32 adapters are copied by autocast
    assert "amp_weight_copies" not in half.activation_terms  # a bf16 base and bf16 adapters need no copy

    ddp = device_estimate(PlanRequest(gpus=2, **base))
    no_shard = device_estimate(PlanRequest(gpus=2, shard="fsdp-no-shard", **base))
    assert ddp.categories["gradients"] == 2 * no_shard.categories["gradients"]  # DDP's bucket copy

    impl = {name: device_estimate(PlanRequest(optimizer_impl=name, **base)).temporary_terms["optimizer_step"]
            for name in ("fused", "foreach", "single-tensor")}
    largest = 49152 * 576 * 4  # the embeddings, SmolLM2-135M's largest tensor, fp32
    gradients = device_estimate(PlanRequest(**base)).categories["gradients"]
    assert impl == {"fused": 0, "foreach": gradients, "single-tensor": 2 * largest}

    one = device_estimate(PlanRequest(**base))
    accumulated = device_estimate(PlanRequest(grad_accum=4, **base))
    kept = device_estimate(PlanRequest(keep_gradients=True, **base))
    assert one.live_by_moment["forward_end"].get("gradients", 0) == 0  # freed by zero_grad(set_to_none=True)
    for estimate in (accumulated, kept):
        assert estimate.live_by_moment["forward_end"]["gradients"] == one.categories["gradients"]
        assert estimate.peak_bytes > one.peak_bytes


def test_cuda_autocast_runs_layer_norm_in_fp32_where_cpu_autocast_does_not():
    step, cpu, cuda = StepShape(2, 64), TrainingSettings(precision="bf16"), TrainingSettings(precision="bf16",
                                                                                              device_type="cuda")
    gpt2 = family_config("gpt2")  # LayerNorm: CUDA autocast saves its input and output in fp32
    assert (estimate_memory_detail(gpt2, step, cuda).categories["activations"]
            > estimate_memory_detail(gpt2, step, cpu).categories["activations"])
    llama = family_config("llama")  # RMSNorm upcasts by itself: the same bytes either way
    assert (estimate_memory_detail(llama, step, cuda).categories["activations"]
            == estimate_memory_detail(llama, step, cpu).categories["activations"])


@pytest.mark.parametrize("change, message", [
    ({"base_dtype": "half", "precision": "fp32"}, "half-precision base"),
    ({"loss": "tiled"}, "unknown loss"),
    ({"optimizer_impl": "magic"}, "unknown optimizer impl"),
    ({"grad_accum": 0}, "grad accum must be between 1 and 256"),
    ({"shard": "fsdp-no-shard"}, "give gpus of 2 or more"),
    ({"cuda_module_loading": "late"}, "unknown cuda module loading"),
])
def test_new_settings_refuse_bad_values_with_one_message(change, message):
    with pytest.raises(DemoInputError, match=message):
        PlanRequest(model="SmolLM2-135M", **change).validated()


def test_probe_weight_copies_are_found_by_value_not_by_shape():
    # TRL's fused head saves B x (S-1) hidden states as one 2-D tensor: at 2 x 13 tokens that is 24 rows, the shape
    # of a 24-wide probe layer. Taken for a weight copy it was dropped, and the fit extrapolated to 12,424 GiB.
    config = family_config("llama")
    settings = TrainingSettings(precision="pure-bf16", loss="trl-fused", lora_rank=8, gradient_checkpointing=True)
    estimate = estimate_memory_detail(config, StepShape(2, 2048), settings)
    assert estimate.reliable and min(estimate.activation_terms.values()) >= 0
