"""Time anatomy: operator classification, and the anatomy of real tiny training bursts."""

import statistics
import threading
import time

import pytest
import torch
from torch.profiler import profile

from demo_core import RunConfig, run_comparison
from demo_core.step_statistics import profiled_steps
from demo_core.training.anatomy import (
    OP_CLASSES,
    PHASES,
    StepProfiler,
    _ModuleRanges,
    backward_over_forward,
    classify_events,
    classify_op,
    robust_anatomy,
)
from presentation import report


@pytest.mark.parametrize("name, context, expected", [
    ("aten::mm", None, "matmul"),
    ("aten::addmm", None, "matmul"),
    ("autograd::engine::evaluate_function: MmBackward0", None, "matmul"),
    ("aten::bmm", None, "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", None, "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", None, "attention"),
    ("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0", None, "attention"),
    ("aten::_flash_attention_forward", None, "attention"),
    ("aten::_log_softmax", None, "normalization"),
    ("aten::_softmax_backward_data", None, "normalization"),
    ("aten::native_layer_norm", None, "normalization"),
    ("aten::nll_loss_forward", None, "normalization"),
    ("aten::mul", "normalization", "normalization"),  # inside an RMS norm module, or its backward
    ("aten::mm", "attention", "attention"),  # inside a fused attention kernel's subtree
    ("aten::silu", None, "elementwise"),
    ("aten::add_", None, "elementwise"),
    ("autograd::engine::evaluate_function: MulBackward0", None, "elementwise"),
    ("aten::index_select", None, "elementwise"),
    ("aten::mul", None, "elementwise"),
    ("aten::_fused_adamw_", "optimizer", "optimizer"),
    ("aten::mm", "optimizer", "optimizer"),  # phase wins over name
    ("aten::copy_", "data", "data"),
    ("aten::view", None, "other"),
    ("aten::transpose", None, "other"),
    ("packing-lab: attention module", None, "attention"),
])
def test_known_operators_land_in_their_class(name, context, expected):
    assert classify_op(name, context) == expected


class ToyRMSNorm(torch.nn.Module):
    """Python ops like transformers' RMS norms: pow, mean, rsqrt, mul."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(16, 16), ToyRMSNorm()

    def forward(self, x):
        return self.norm(self.linear(x)).pow(2).sum()  # the second pow is outside the norm


def test_backward_nodes_take_the_class_of_the_forward_op_that_made_them():
    model = Toy()
    ranges = _ModuleRanges(model)
    with profile() as profiler:
        model(torch.randn(4, 16, requires_grad=True)).backward()
    ranges.remove()
    classified = classify_events(profiler.events(), lambda _start: "forward", on_device=False)
    pow_backward = {op_class for event, op_class, _ in classified
                    if event.name == "autograd::engine::evaluate_function: PowBackward0"}
    assert pow_backward == {"normalization", "elementwise"}  # the norm's pow, and the one outside it
    mm_backward = {op_class for event, op_class, _ in classified if event.name.startswith("aten::mm")}
    assert mm_backward == {"matmul"}
    assert {op_class for _, op_class, _ in classified} <= set(OP_CLASSES)


def test_an_abandoned_window_stops_the_profiler_and_unhooks_the_model():
    """What a burst that fails mid-step relies on (burst.run_burst abandons in a finally)."""
    model = Toy()
    hooks_before = (len(model._forward_pre_hooks), len(model.norm._forward_pre_hooks), len(model._forward_hooks))
    profiler = StepProfiler(model, "cpu", [2])
    profiler.open()
    assert torch.autograd._profiler_enabled()
    model(torch.randn(2, 16))
    profiler.abandon()
    assert not torch.autograd._profiler_enabled()
    hooks_after = (len(model._forward_pre_hooks), len(model.norm._forward_pre_hooks), len(model._forward_hooks))
    assert hooks_after == hooks_before
    assert profiler.anatomy is None


@pytest.fixture(scope="module")
def tiny_run():
    config = RunConfig(model="tiny-llama", dataset="flan-like", samples=32, collators=("padded", "flatten"), steps=6,
                       batch_size=8, attention="varlen", device="cpu")
    return run_comparison(config).to_dict()


@pytest.mark.parametrize("steps, expected", [(1, []), (2, [2]), (5, [2]), (6, [2, 6]), (9, [2, 6]),
                                             (20, [2, 6, 10, 14, 18]), (1000, [2, 6, 10, 14, 18])])
def test_profiled_steps_are_spread_over_the_burst_and_leave_three_timed_steps(steps, expected):
    assert profiled_steps(steps) == expected
    if steps >= 5:
        assert steps - 1 - len(expected) >= 3


def test_every_burst_profiles_the_same_steps_and_leaves_them_out_of_the_throughput(tiny_run):
    for result in tiny_run["results"]:
        assert result["profiled_steps"] == [2, 6] and result["profiled_step"] == 2
        assert result["timed_steps"] == 3 and len(result["step_anatomies"]) == 2
        anatomy = result["time_anatomy"]
        assert set(anatomy["phases"]) == set(PHASES) and set(anatomy["ops"]) == set(OP_CLASSES)
        assert anatomy["profiled_steps"] == 2 and isinstance(anatomy["doubts"], list)


def test_phases_and_operations_each_add_up_to_the_profiled_step(tiny_run):
    for anatomy in (a for result in tiny_run["results"] for a in [result["time_anatomy"], *result["step_anatomies"]]):
        assert sum(anatomy["phases"].values()) == pytest.approx(anatomy["step_s"], rel=0.15)
        assert sum(anatomy["phases_wall"].values()) == pytest.approx(anatomy["step_s"], rel=0.15)
        assert min(anatomy["phases_cpu_s"][phase] for phase in ("forward", "backward")) > 0
        assert sum(anatomy["ops"].values()) == pytest.approx(anatomy["step_s"], rel=0.15)
        assert anatomy["ops"]["other"] < 0.5 * anatomy["step_s"]  # "other" tops up to step_s: most is classified
        assert all(seconds >= 0 for seconds in [*anatomy["phases"].values(), *anatomy["ops"].values()])
        # Every phase a training step has took time, and the classes the model has were found.
        assert min(anatomy["phases"][phase] for phase in ("forward", "backward", "optimizer", "data")) > 0
        assert min(anatomy["ops"][name] for name in ("matmul", "attention", "normalization", "elementwise",
                                                       "optimizer")) > 0


def test_padding_puts_a_larger_share_of_the_step_into_work_that_scales_with_slots(tiny_run):
    """Padded computes ~3x the slots of the same batch: more of its step is matmul and element-wise work. (Ratios
    of one profiled CPU step that differ less, backward / forward or the optimizer's share, swing with the machine's
    load: the CLI and docs/RESULTS.md report them, no test holds them.)"""
    padded, flatten = (result["time_anatomy"] for result in tiny_run["results"])

    def share(anatomy, names):
        return sum(anatomy["ops"][name] for name in names) / anatomy["step_s"]

    assert share(padded, ("matmul", "elementwise")) > share(flatten, ("matmul", "elementwise"))


def _anatomy(forward_s: float, backward_s: float, matmul_s: float) -> dict:
    """One profiled step's anatomy: 10 ms each of optimizer and data, everything else "other"."""
    step_s = forward_s + backward_s + 0.02
    phases = {"forward": forward_s, "backward": backward_s, "optimizer": 0.01, "data": 0.01, "other": 0.0}
    ops = {**dict.fromkeys(OP_CLASSES, 0.0), "matmul": matmul_s, "optimizer": 0.01, "data": 0.01,
           "other": step_s - matmul_s - 0.02}
    return {"step_s": step_s, "phases": phases, "ops": ops}


def test_the_centre_of_the_profiled_steps_shrugs_off_one_stalled_step():
    steady = _anatomy(0.1, 0.2, 0.2)
    stalled = _anatomy(0.5, 0.2, 0.2)  # descheduled during its forward
    centre = robust_anatomy([steady, stalled, steady])
    assert centre["phases"]["backward"] / centre["phases"]["forward"] == pytest.approx(2.0)
    for part in ("phases", "ops"):
        assert sum(centre[part].values()) == pytest.approx(centre["step_s"])
        for name, seconds in centre[part].items():
            assert seconds / centre["step_s"] == pytest.approx(steady[part][name] / steady["step_s"])
    assert centre["doubts"] == [] and centre["share_spread"] == 0.0


def test_an_anatomy_that_cannot_be_trusted_says_why_in_words():
    [one_step] = robust_anatomy([_anatomy(0.1, 0.2, 0.2)])["doubts"]
    assert "one profiled step" in one_step
    [disagree] = robust_anatomy([_anatomy(0.1, 0.2, 0.2), _anatomy(0.4, 0.2, 0.2)])["doubts"]
    assert "disagree" in disagree
    stalled_forward = robust_anatomy([_anatomy(0.4, 0.2, 0.2)] * 3)
    assert any("backward took 0.50× the forward" in doubt for doubt in stalled_forward["doubts"])


def _profiled(collator: str, matmul_s: float, other_s: float) -> dict:
    """A result whose profiled steps trained batches of 200 slots holding 100 real tokens (slots ideal 2x)."""
    ops = {**dict.fromkeys(OP_CLASSES, 0.0), "matmul": matmul_s, "other": other_s}
    anatomy = {"step_s": matmul_s + other_s, "ops": ops, "phases": {}}
    return {"collator": collator, "time_anatomy": anatomy, "profiled_steps": [2, 6], "profiled_step": 2,
            "step_padded_slots": [200] * 6, "step_real_tokens": [100] * 6}


def test_the_anatomy_sentence_says_slower_and_never_claims_more_than_the_slots_ideal_without_why():
    padded = _profiled("padded", matmul_s=0.8, other_s=0.2)
    sentence = report._gap_sentence(padded, _profiled("flatten", matmul_s=0.5, other_s=0.4))
    assert "it ran 1.60× faster" in sentence and "it ran 2.00× slower" in sentence
    assert "0.50× faster" not in sentence and "removing padding can give" not in sentence
    beyond = report._gap_sentence(padded, _profiled("flatten", matmul_s=0.08, other_s=0.2))
    assert "it ran 10.00× faster" in beyond
    assert "10.00× is more than the 2.00× that removing padding can give" in beyond and "timed steps" in beyond


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(6)))

    def forward(self, x):
        return self.layers(x).pow(2).mean()


@pytest.fixture
def one_thread():
    """What a CPU burst trains with (RunConfig's threads default): with more, idle OpenMP workers spin between
    operators and their spinning counts as the process's CPU time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _profiled_toy_step(stall_forward_s: float) -> dict:
    """One training step of a small MLP through StepProfiler's marks, as Trainer's callbacks place them, with the
    process off the CPU for `stall_forward_s` during its forward (a sleep: what a busy machine's scheduler does)."""
    torch.manual_seed(0)
    model, x = Stack(), torch.randn(512, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model.register_forward_hook(lambda *_: time.sleep(stall_forward_s))
    profiler = StepProfiler(model, "cpu", [1])
    profiler.open()
    profiler.mark("step_begin")
    model(x).backward()
    optimizer.step()
    profiler.mark("optimizer_end")
    profiler.close(1)
    return profiler.step_anatomies[0]


def test_phases_count_the_time_the_process_ran_not_the_time_it_waited(one_thread):
    _profiled_toy_step(0.0)  # the first step's one-time work (allocations, first dispatch) would weigh on its forward
    # A few steps of each: one toy step's CPU-time ratio alone swings 1.6-2.4 on a quiet machine (a few ms per phase)
    steady = [_profiled_toy_step(0.0) for _ in range(5)]
    stalled = [_profiled_toy_step(0.4) for _ in range(3)]
    for step in stalled:
        # wall clock: the stall lands in the forward, and backward reads faster than forward
        assert step["phases_wall"]["forward"] > 0.4 and backward_over_forward(step, "phases_wall") < 0.75
        # CPU time: the stalled step's forward is as long as a steady one's
        assert step["phases_cpu_s"]["forward"] < 0.1
    # and so is the ratio
    stalled_ratio = statistics.median(backward_over_forward(step) for step in stalled)
    assert stalled_ratio == pytest.approx(statistics.median(backward_over_forward(step) for step in steady), rel=0.5)
    assert stalled_ratio > 3 * statistics.median(backward_over_forward(step, "phases_wall") for step in stalled)


def test_another_thread_of_the_process_counts_in_no_phase(one_thread):
    """A server's other threads (a planner warming up, another request) run while a step waits: with one intra-op
    thread the phases are the training thread's CPU time, so what they run lands in no phase. (The process's CPU
    time read 0.4 s of a spinning thread into the stalled forward.)"""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        stalled = _profiled_toy_step(0.4)
    finally:
        stop.set()
        spinner.join()
    assert stalled["phases_cpu_s"]["forward"] < 0.1
