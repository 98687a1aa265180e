"""Precision names mean one thing everywhere (demo_core/precision.py): the trainer's flags, the estimate's bytes,
the probe's dtype and autocast, the slow-on-a-CPU flag, the choices a run and an estimate offer."""

import pytest

from demo_core import DemoInputError
from demo_core.config import RunConfig
from demo_core.memory.plan_request import PlanRequest
from demo_core.precision import ESTIMATE_PRECISION_NAMES, PRECISION_NAMES, PRECISIONS, resolve
from demo_core.settings import by_name


def test_a_run_offers_the_trained_precisions_and_an_estimate_adds_pure_bf16():
    assert PRECISION_NAMES == ("auto", "fp32", "bf16", "fp16")
    assert ESTIMATE_PRECISION_NAMES == ("fp32", "bf16", "fp16", "pure-bf16")
    assert by_name(RunConfig)["precision"].choices == PRECISION_NAMES
    assert by_name(PlanRequest)["precision"].choices == ESTIMATE_PRECISION_NAMES


@pytest.mark.parametrize("name, flags, weight_bytes, compute_bytes, autocast", [
    ("fp32", {"bf16": False, "fp16": False}, 4, 4, False),
    ("bf16", {"bf16": True, "fp16": False}, 4, 2, True),  # Trainer's bf16=True: fp32 master weights
    ("fp16", {"bf16": False, "fp16": True}, 4, 2, True),
    ("pure-bf16", {"bf16": False, "fp16": False}, 2, 2, False),  # bf16 weights, no autocast
])
def test_each_precision_is_one_row_of_flags_and_bytes(name, flags, weight_bytes, compute_bytes, autocast):
    precision = PRECISIONS[name]
    assert precision.trainer_flags() == flags
    assert (precision.weight_bytes, precision.compute_bytes, precision.autocast) == (weight_bytes, compute_bytes,
                                                                                      autocast)
    assert precision.slow_on_cpu == autocast  # autocast on a CPU only adds casts


def test_auto_resolves_per_device_and_fp16_needs_a_gpu():
    assert resolve("auto", "cpu") == "fp32" and resolve("bf16", "cpu") == "bf16"
    with pytest.raises(DemoInputError, match="fp16 mixed precision needs a CUDA GPU"):
        resolve("fp16", "cpu")
