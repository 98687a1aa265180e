"""The step-time model (demo_core/throughput): what each part responds to, the GPU table, the CPU rates, the
contract."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from transformers import BambaConfig, JambaConfig

from demo_core import RunConfig, prepare
from demo_core.errors import DemoInputError
from demo_core.gpus import gpu_for_device_name
from demo_core.memory.plan_request import load_config
from demo_core.throughput import CALIBRATED, GPUS, cpu_rates, gpu, ops, predict_throughput
from demo_core.throughput.batches import best_fit_decreasing
from demo_core.throughput.cpu_rates import measure_cpu_rates
from demo_core.throughput.facts import ModelFacts
from demo_core.throughput.ops import ops_per_micro_batch
from demo_core.throughput.run_prediction import predicted_speedups

REQUIRED_GPUS = ("a100-80gb", "a100-40gb", "h100-sxm", "h100-pcie", "h200", "l40s", "l4", "a10g", "t4", "rtx-4090")


@pytest.fixture(scope="module")
def config():
    return load_config("Llama-3.2-1B")


def lognormal_lengths(sigma: float, mean: float = 500, count: int = 2000) -> list[int]:
    draws = np.random.default_rng(0).lognormal(0.0, sigma, count)
    return [max(8, int(length)) for length in draws * mean / draws.mean()]


def speedup(config, lengths, **settings) -> float:
    settings = {"batch_size": 8, "gpu": "a100-80gb", **settings}
    return predict_throughput(config, lengths, ["flatten"], **settings)["collators"]["flatten"]["speedup_vs_padded"]


def test_the_returned_dict_has_exactly_the_contract_keys(config):
    result = predict_throughput(config, lognormal_lengths(0.6), ["padded", "flatten", "bfd"], 4, "h100-sxm")
    assert set(result) == {"gpu", "collators"} and result["gpu"] == "h100-sxm"
    assert list(result["collators"]) == ["padded", "flatten", "bfd"]
    for entry in result["collators"].values():
        assert set(entry) == {"tokens_per_s", "step_s", "speedup_vs_padded", "range", "breakdown"}
        low, high = entry["range"]
        assert low <= entry["speedup_vs_padded"] <= high
        assert entry["step_s"] == pytest.approx(sum(entry["breakdown"].values()))
    assert result["collators"]["padded"]["speedup_vs_padded"] == 1.0


def test_padded_slots_drive_paddeds_matmul_time_and_not_flattens(config):
    # same examples but one: a single long example makes every padded batch it lands in pay its length
    even = [200] * 64
    one_long = [200] * 63 + [1800]
    parts = {}
    for name, lengths in (("even", even), ("one_long", one_long)):
        result = predict_throughput(config, lengths, ["padded", "flatten"], 8, "a100-80gb")["collators"]
        parts[name] = {collator: entry["breakdown"]["matmul"] for collator, entry in result.items()}
    padded_slots_ratio = (7 * 8 * 200 + 8 * 1800) / (8 * 8 * 200)  # one of 8 batches padded to 1800
    assert parts["one_long"]["padded"] / parts["even"]["padded"] == pytest.approx(padded_slots_ratio, rel=0.15)
    real_ratio = sum(one_long) / sum(even)
    assert parts["one_long"]["flatten"] / parts["even"]["flatten"] == pytest.approx(real_ratio, rel=0.15)


def test_equal_lengths_predict_no_speedup(config):
    assert speedup(config, [512] * 512) == pytest.approx(1.0, abs=0.03)


def test_more_length_spread_predicts_more_speedup(config):
    narrow, wide = speedup(config, lognormal_lengths(0.2)), speedup(config, lognormal_lengths(0.9))
    assert wide > narrow * 1.3 and narrow < 1.3


def test_fixed_costs_shrink_the_speedup(config):
    lengths = lognormal_lengths(0.8)
    full = speedup(config, lengths)
    heavier_step = dataclasses.replace(CALIBRATED, step_fixed_s=CALIBRATED.step_fixed_s * 20)
    assert speedup(config, lengths, efficiencies=heavier_step) < full
    # QLoRA's dequantization is paid per micro-batch whatever its tokens: the slower it is, the less packing gains
    qlora = speedup(config, lengths, lora_rank=16, qlora=True)
    slow_dequant = dataclasses.replace(CALIBRATED, dequant_efficiency=CALIBRATED.dequant_efficiency / 10)
    assert speedup(config, lengths, lora_rank=16, qlora=True, efficiencies=slow_dequant) < qlora * 0.9
    # and a foreach AdamW's step over every weight (the published runs' default) costs a full fine-tune more
    assert speedup(config, lengths, optimizer_impl="foreach") < full


def test_a_four_bit_base_sharded_over_gpus_dequantizes_at_its_own_rate(config):
    """PEFT's unfused 4-bit layers under FSDP pay far more per micro-batch than on one GPU (fms-acceleration's
    2-GPU QLoRA runs): priced at sharded_dequant_efficiency, and packing gains less there."""
    lengths = lognormal_lengths(0.8)
    qlora = {"lora_rank": 16, "qlora": True, "batch_size": 4, "grad_accum": 2}

    def dequantize_s(**settings):
        result = predict_throughput(config, lengths, ["padded"], gpu="a100-80gb", **qlora, **settings)
        return result["collators"]["padded"]["breakdown"]["dequantize"] / qlora["grad_accum"]  # per micro-batch

    one_gpu, sharded = dequantize_s(), dequantize_s(gpus=2, shard="fsdp")
    rates = CALIBRATED.dequant_efficiency / CALIBRATED.sharded_dequant_efficiency
    assert sharded == pytest.approx(one_gpu * rates, rel=1e-6) and rates > 3
    # a replicated 4-bit base (DDP) dequantizes as on one GPU
    assert dequantize_s(gpus=2, shard="none") == pytest.approx(one_gpu, rel=1e-6)
    assert speedup(config, lengths, gpus=2, shard="fsdp", **qlora) < speedup(config, lengths, gpus=2, shard="none",
                                                                               **qlora)


def test_a_slower_interconnect_and_more_gpus_shrink_the_speedup(config):
    lengths = lognormal_lengths(0.8)
    settings = dict(gpus=8, shard="fsdp", batch_size=4)
    fast = speedup(config, lengths, **settings)
    slow_link = dataclasses.replace(CALIBRATED, comm_efficiency=CALIBRATED.comm_efficiency / 20)
    assert speedup(config, lengths, efficiencies=slow_link, **settings) < fast * 0.9
    # past one node of 8 the ring runs over the network, slower than NVLink: the weight gathers cost more
    assert speedup(config, lengths, **{**settings, "gpus": 32}) < fast


def test_bigger_batches_pay_more(config):
    lengths = lognormal_lengths(0.8)
    assert speedup(config, lengths, batch_size=16) > speedup(config, lengths, batch_size=2)


def test_every_gpu_name_resolves_with_cited_numbers():
    for name in REQUIRED_GPUS:
        device = gpu(name.upper())
        assert device.name == name and device.source.startswith("https://")
        assert device.fp16_flops > device.fp32_flops > 0 and device.memory_bytes_per_s > 0
        assert device.link_bytes_per_s > 0 and device.memory_bytes >= 16e9
    assert set(REQUIRED_GPUS) <= set(GPUS)
    with pytest.raises(DemoInputError, match="unknown GPU"):
        gpu("a100-8gb")
    with pytest.raises(DemoInputError, match="bf16"):
        gpu("t4").peak_flops("bf16")


def test_best_fit_decreasing_keeps_every_token_within_the_rows():
    lengths = [min(length, 1024) for length in lognormal_lengths(0.9, mean=150)]
    rows = best_fit_decreasing(lengths, 1024)
    assert sorted(length for row in rows for length in row) == sorted(lengths)
    assert max(sum(row) for row in rows) <= 1024
    assert len(rows) <= -(-sum(lengths) // 1024) + 2  # nearly full rows


def test_cpu_microbenchmark_returns_positive_rates_quickly():
    started = time.perf_counter()
    rates = measure_cpu_rates(threads=1)
    assert time.perf_counter() - started < 2.0
    assert rates.matmul_flops > 1e8 and rates.attention_flops > 0 and rates.memory_bytes_per_s > 1e8
    assert 0 < rates.seconds_per_op < 1e-3 and rates.matmul_half_tokens >= 0


def test_a_prepared_cpu_run_gets_a_predicted_speedup_per_collator():
    prepared = prepare(RunConfig(model="tiny-llama", dataset="flan-like", samples=64, steps=4, batch_size=8,
                                 collators=("padded", "flatten", "naive-concat")))
    predicted = predicted_speedups(prepared.resolved, prepared.source.config, [len(ids) for ids in prepared.examples],
                                   measure_cpu_rates(threads=1))
    assert set(predicted) == {"padded", "flatten", "naive-concat"} and predicted["padded"] == 1.0
    # naive-concat's one segment pays attention over the whole row: never faster than flatten
    assert 1.0 < predicted["flatten"] and predicted["naive-concat"] < predicted["flatten"]


def test_a_mixture_of_experts_is_priced_by_the_experts_each_token_uses():
    facts = ModelFacts.of(load_config("Mixtral-8x7B-v0.1"))
    assert (facts.experts, facts.experts_per_token) == (8, 2)
    # Mistral AI's announcement: 46.7B parameters, 12.9B used per token (2 of 8 experts)
    assert facts.params == pytest.approx(46.7e9, rel=0.01)
    assert facts.active_matmul_weights == pytest.approx(12.9e9, rel=0.03)
    lengths = lognormal_lengths(0.8)
    dense_7b = predict_throughput(load_config("Mistral-7B-v0.3"), lengths, ["flatten"], 4, "h100-sxm")
    moe = predict_throughput(load_config("Mixtral-8x7B-v0.1"), lengths, ["flatten"], 4, "h100-sxm")
    ratio = dense_7b["collators"]["flatten"]["tokens_per_s"] / moe["collators"]["flatten"]["tokens_per_s"]
    assert 1.3 < ratio < 6.5  # about the active weights' ratio (12.9 / 7.2), not the total's (46.7 / 7.2)


def test_a_hybrids_state_space_layers_scan_every_slot_and_only_its_attention_layers_attend():
    bamba = BambaConfig(attn_layer_indices=[9, 18, 27], mamba_d_state=128)
    facts = ModelFacts.of(bamba)
    assert (facts.attention_layers, facts.ssm_layers) == (3, 29) and facts.ssm_flops_per_token > 0
    result = predict_throughput(bamba, lognormal_lengths(0.8), ["padded", "flatten"], 4, "a100-80gb")["collators"]
    padded, flatten = result["padded"]["breakdown"], result["flatten"]["breakdown"]
    assert padded["ssm"] > flatten["ssm"] > 0  # padding is scanned too; packing scans real tokens only
    assert ModelFacts.of(load_config("Llama-3.2-1B")).ssm_layers == 0


def test_each_model_is_priced_by_its_own_operation_count():
    gpt2, llama = (ops_per_micro_batch(load_config(name), False) for name in ("tiny-gpt2", "tiny-llama"))
    assert gpt2 and llama and gpt2 < 0.8 * llama  # fused Conv1D projections, no rotary: fewer ops per block
    assert ops_per_micro_batch(load_config("tiny-llama"), True) > llama  # checkpointing recomputes the forward


@pytest.mark.parametrize("config", [load_config("Mistral-7B-v0.3"), JambaConfig(num_hidden_layers=8)],
                         ids=["mistral-32-layers", "jamba-periods"])
def test_a_model_too_large_to_copy_whole_is_counted_on_its_probe_layers_to_the_same_operation(config, monkeypatch):
    """Past the budget (DeepSeek-V3's every-layer copy held 2.4B weights) the count runs on two layers per kind, each
    standing for its share of the real layers, and the layers outside once: the same count as every layer's, with
    the backward, checkpointing's recomputed forward and LoRA's adapters attributed to their layers (Jamba: a
    config that places its layers by rule, copied as a prefix)."""
    for checkpointing, lora_rank in ((False, 0), (True, 0), (True, 16)):
        monkeypatch.setattr(ops, "_COUNTS", ops.LRU(max_entries=4))
        monkeypatch.setattr(ops, "EVERY_LAYER_BUDGET_PARAMS", 10**12)
        every_layer = ops_per_micro_batch(config, checkpointing, lora_rank)
        monkeypatch.setattr(ops, "_COUNTS", ops.LRU(max_entries=4))
        monkeypatch.setattr(ops, "EVERY_LAYER_BUDGET_PARAMS", 0)
        assert every_layer and ops_per_micro_batch(config, checkpointing, lora_rank) == every_layer


def test_a_per_tensor_optimizer_and_exposed_collectives_cost_more():
    config, lengths = load_config("Llama-3.2-1B"), lognormal_lengths(0.8)

    def step(part, **settings):
        result = predict_throughput(config, lengths, ["padded"], 4, "a100-80gb", **settings)
        return result["collators"]["padded"]["breakdown"][part]

    assert step("optimizer", optimizer_impl="foreach") > 1.5 * step("optimizer", optimizer_impl="fused")
    settings = dict(gpus=8, shard="fsdp")
    exposed = dataclasses.replace(CALIBRATED, comm_overlap=0.0)
    assert step("sharded_comm", efficiencies=exposed, **settings) > step("sharded_comm", **settings)


def test_torchs_device_names_find_their_table_entries():
    assert gpu_for_device_name("NVIDIA A100-SXM4-80GB").name == "a100-80gb"
    assert gpu_for_device_name("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert gpu_for_device_name("NVIDIA H100 PCIe").name == "h100-pcie"
    assert gpu_for_device_name("Tesla T4").name == "t4"
    assert gpu_for_device_name("NVIDIA L40S").name == "l40s" and gpu_for_device_name("NVIDIA L4").name == "l4"
    assert gpu_for_device_name("NVIDIA GeForce RTX 3090") is None


def test_this_cpus_rates_are_measured_in_fp32_whatever_default_dtype_another_thread_set(monkeypatch):
    """A probe fit in another thread (the planner's warm-up) sets torch's process-wide default dtype to fp16 for a
    moment; a run measuring this CPU then must still time fp32 work, as its bursts train (fp16 matmuls on a CPU run
    about 40x slower, and mixed with fp32 tensors they raise)."""
    measured = {}
    timed = cpu_rates._fastest_seconds

    def dtypes_then_time(works, rounds):
        with torch.no_grad():
            measured.update({name: work().dtype for name, work in works.items() if name != "chain"})
        return timed(works, rounds)

    monkeypatch.setattr(cpu_rates, "_fastest_seconds", dtypes_then_time)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        cpu_rates.measure_cpu_rates(threads=1)
    finally:
        torch.set_default_dtype(default)
    assert len(measured) >= 3 and set(measured.values()) == {torch.float32}
