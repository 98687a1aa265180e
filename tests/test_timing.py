"""Robust throughput without training: which steps count, the trimmed statistics, the flags, the work ideal, turns."""

import threading

import pytest
import torch

from demo_core.models.sources import load_model_source
from demo_core.results import Result, compare
from demo_core.step_statistics import interquartile_mean, timed_step_indices, weighted_quantile
from demo_core.throughput.work import WorkModel, step_flops
from demo_core.training.turns import Turns


def make_result(collator: str, step_times_s: list[float], slots: list[int], real: list[int] | None = None,
                profiled_step: int | None = 2, precision: str = "fp32", flops: list[float] | None = None) -> Result:
    steps = len(step_times_s)
    real = real or slots
    return Result(collator=collator, attention="varlen", device="cpu", precision=precision, steps=steps,
                  losses=[1.0] * steps, step_times_s=step_times_s, step_real_tokens=real, step_padded_slots=slots,
                  step_examples=[4] * steps, step_collate_s=[0.001] * steps, peak_memory_bytes=None, memory={},
                  profiled_step=profiled_step, step_work_flops=flops or [])


def test_throughput_leaves_out_the_warm_up_and_the_profiled_steps():
    assert timed_step_indices(6, [2, 6]) == [2, 3, 4]
    assert timed_step_indices(6, 2) == [2, 3, 4, 5]  # a document saved when one step was profiled
    assert timed_step_indices(6, None) == [1, 2, 3, 4, 5]
    assert timed_step_indices(2, [2]) == []
    # A 100 s warm-up and a 50 s profiled step change nothing: 1000 slots per second on every timed step.
    result = make_result("flatten", [100.0, 50.0, 1.0, 2.0, 1.5], [1000, 1000, 1000, 2000, 1500])
    assert result.timed_steps == 3
    assert result.tokens_per_s == pytest.approx(1000)
    assert result.step_time_median_s == pytest.approx(1.5)


def test_without_a_timed_step_there_is_no_throughput():
    result = make_result("flatten", [1.0, 1.0], [100, 100])
    assert result.timed_steps == 0
    assert result.tokens_per_s is None and result.samples_per_s is None and result.step_time_median_s is None
    assert result.to_dict()["tokens_per_s_range"] is None


def test_trimmed_mean_ignores_one_step_slowed_by_other_work():
    per_slot = [1.0, 1.1, 0.9, 1.0, 30.0, 1.05, 0.95, 1.0]
    assert interquartile_mean(per_slot, [1] * 8) == pytest.approx(1.0, abs=0.03)
    # (a plain mean would say 4.6)
    # Equal values per unit of weight: the trimmed mean is the plain weighted mean.
    assert interquartile_mean([2.0, 2.0, 2.0], [1, 5, 2]) == 2.0
    assert weighted_quantile([1.0, 2.0, 3.0], [1, 1, 8], 0.5) == 3.0  # the heavy value holds the middle


def test_a_spike_in_one_step_barely_moves_the_speedup():
    slots_padded, slots_flat = [800, 800, 800, 900, 700, 800, 800, 850], [300, 300, 300, 330, 270, 300, 300, 320]
    padded = make_result("padded", [s / 1000 for s in slots_padded], slots_padded, real=slots_flat)
    flatten = make_result("flatten", [s / 1000 for s in slots_flat], slots_flat)
    steady = compare([padded, flatten], ideal_speedup=8 / 3)["flatten"]["speedup_vs_padded"]
    spiked_times = [s / 1000 for s in slots_padded]
    spiked_times[4] *= 10  # one padded step descheduled for a while
    spiked = compare([make_result("padded", spiked_times, slots_padded, real=slots_flat), flatten],
                     ideal_speedup=8 / 3)["flatten"]
    assert steady == pytest.approx(8 / 3, rel=0.01)
    assert spiked["speedup_vs_padded"] == pytest.approx(steady, rel=0.05)
    low, high = spiked["speedup_range"]
    assert low <= spiked["speedup_vs_padded"] <= high


def test_fewer_than_three_timed_steps_give_no_speedup_and_say_why():
    padded = make_result("padded", [1.0] * 4, [800] * 4, real=[300] * 4)
    flatten = make_result("flatten", [0.4] * 4, [300] * 4)
    entry = compare([padded, flatten], ideal_speedup=8 / 3)["flatten"]
    assert entry["speedup_vs_padded"] is None and entry["speedup_range"] is None
    assert "few-timed-steps" in entry["flags"]


@pytest.mark.parametrize("collator, precision, flatten_time_s, flag", [
    ("flatten", "fp32", 0.2, "above-ideal"),  # 5x against an ideal of 2.67x
    ("flatten", "bf16", 0.4, "slow-precision"),
    ("bfd", "fp32", 0.4, "other-batches"),
])
def test_flags_name_what_to_distrust(collator, precision, flatten_time_s, flag):
    padded = make_result("padded", [1.0] * 6, [800] * 6, real=[300] * 6, precision=precision)
    other = make_result(collator, [flatten_time_s] * 6, [300] * 6, precision=precision)
    entry = compare([padded, other], ideal_speedup=8 / 3)[collator]
    assert flag in entry["flags"]
    clean = compare([padded, make_result("flatten", [0.4] * 6, [300] * 6)], ideal_speedup=8 / 3)["flatten"]
    assert clean["flags"] == []


def test_steps_that_disagree_are_flagged_noisy():
    padded = make_result("padded", [1.0] * 8, [800] * 8, real=[300] * 8)
    jumpy = make_result("flatten", [0.4, 0.4, 0.2, 0.8, 0.3, 0.7, 0.25, 0.9], [300] * 8)
    entry = compare([padded, jumpy], ideal_speedup=8 / 3)["flatten"]
    assert "noisy" in entry["flags"]
    low, high = entry["speedup_range"]
    assert high / low > 1.5


def test_work_ideal_is_padded_work_per_real_token_over_the_collators():
    padded = make_result("padded", [1.0] * 5, [800] * 5, real=[300] * 5, flops=[8e9] * 5)
    flatten = make_result("flatten", [0.5] * 5, [300] * 5, flops=[4e9] * 5)
    entry = compare([padded, flatten], ideal_speedup=8 / 3)["flatten"]
    assert entry["work_ideal_speedup"] == pytest.approx(2.0)
    assert entry["ratio_to_work_ideal"] == pytest.approx(entry["speedup_vs_padded"] / 2.0)


def test_step_flops_count_padding_in_linear_layers_and_attention_pairs_per_path():
    work = WorkModel(linear_weights=1000, attention_width=8, layers=2)
    lengths = [2, 4]
    # Linear: 2 x 1000 per slot. Padded: 2 x 4 slots; packed: 6. Varlen pairs: 3 + 10 causal pairs either way.
    assert step_flops(work, lengths, "padded", "varlen") == 3 * (2 * 1000 * 8 + 4 * 8 * 13 * 2)
    assert step_flops(work, lengths, "packed", "varlen") == 3 * (2 * 1000 * 6 + 4 * 8 * 13 * 2)
    # SDPA with a mask computes every pair of its rows: 2 x 4² padded, 6² for the packed row.
    assert step_flops(work, lengths, "padded", "sdpa") == 3 * (2 * 1000 * 8 + 4 * 8 * 32 * 2)
    assert step_flops(work, lengths, "packed", "sdpa") == 3 * (2 * 1000 * 6 + 4 * 8 * 36 * 2)
    # Naive concatenation: one segment over the whole row.
    assert step_flops(work, lengths, "naive", "varlen") == 3 * (2 * 1000 * 6 + 4 * 8 * 21 * 2)


def test_work_model_counts_gpt2_conv1d_layers():
    model = load_model_source("tiny-gpt2").build("sdpa")
    lm_head = model.lm_head.weight.numel()
    # c_attn, c_proj, c_fc, mlp c_proj per layer are Conv1D, not Linear: missing them leaves only the LM head.
    assert WorkModel.of(model).linear_weights > 3 * lm_head


def test_turns_alternate_threads_step_by_step_and_survive_one_leaving_early():
    turns, order = Turns(["a", "b", "c"]), []

    def participant(name: str, steps: int) -> None:
        turns.wait_for_turn(name)
        try:
            for step in range(steps):
                order.append((name, step))
                turns.pass_turn(name)
        finally:
            turns.leave(name)

    threads = [threading.Thread(target=participant, args=(name, steps))
               for name, steps in (("a", 3), ("b", 1), ("c", 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2), ("c", 2)]


def test_torch_threads_are_restored_after_the_block():
    from demo_core.isolation import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
