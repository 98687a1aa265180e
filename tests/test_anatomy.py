"""Time anatomy: operator classification, and the anatomy of real tiny training bursts."""

import pytest
import torch
from torch.profiler import profile

from demo_core import RunConfig, run_comparison
from demo_core.anatomy import (OP_CLASSES, PHASES, PROFILED_STEP, StepProfiler, _ModuleRanges, classify_events,
                               classify_op)


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
    profiler = StepProfiler(model, "cpu")
    profiler.open()
    assert torch.autograd._profiler_enabled()
    model(torch.randn(2, 16))
    profiler.abandon()
    assert not torch.autograd._profiler_enabled()
    assert (len(model._forward_pre_hooks), len(model.norm._forward_pre_hooks), len(model._forward_hooks)) == hooks_before
    assert profiler.anatomy is None


@pytest.fixture(scope="module")
def tiny_run():
    config = RunConfig(model="tiny-llama", dataset="flan-like", samples=32, collators=("padded", "flatten"), steps=4,
                       batch_size=8, attention="varlen", device="cpu")
    return run_comparison(config).to_dict()


def test_every_burst_profiles_step_2_and_leaves_it_out_of_the_throughput(tiny_run):
    for result in tiny_run["results"]:
        assert result["profiled_step"] == PROFILED_STEP
        assert result["timed_steps"] == result["steps"] - 2
        anatomy = result["time_anatomy"]
        assert set(anatomy["phases"]) == set(PHASES) and set(anatomy["ops"]) == set(OP_CLASSES)


def test_phases_and_operations_each_add_up_to_the_profiled_step(tiny_run):
    for result in tiny_run["results"]:
        anatomy = result["time_anatomy"]
        assert sum(anatomy["phases"].values()) == pytest.approx(anatomy["step_s"], rel=0.15)
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
