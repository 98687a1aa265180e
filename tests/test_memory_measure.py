"""Memory measured: tensor sums per category, the saved-activation meter, device snapshots and phase peaks (CPU;
CUDA and NVML faked at their boundary, there is no GPU here)."""

from __future__ import annotations

import gc
import sys
import types

import pytest
import torch

import demo_core.memory.measure as memory
from demo_core.memory import estimate as memory_estimate
from demo_core.memory import probe as activation_probe
from demo_core.memory.estimate import estimate_memory
from demo_core.memory.step import StepShape, TrainingSettings

from tiny_models import build, family_config, padded_batch

# ---- tensors, the meter, the report ---------------------------------------------------------------------------


def test_tensor_bytes_unwraps_accelerated_optimizer_and_counts_tied_weights_once():
    config = family_config("gpt2")  # lm_head is tied to wte
    model = build(config)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    wrapper = types.SimpleNamespace(optimizer=inner)  # AcceleratedOptimizer's shape: the torch optimizer inside
    batch = padded_batch([16, 9])
    model(**batch, use_cache=False).loss.backward()
    inner.step()
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert memory.tensor_bytes_by_category(model, wrapper) == memory.tensor_bytes_by_category(model, inner)
    n_tensors = len(list(model.parameters()))
    n_params = sum(p.numel() for p in model.parameters())
    assert memory.tensor_bytes_by_category(model, inner)["optimizer"] == 8 * n_params + 4 * n_tensors


def test_optimizer_state_appears_only_after_the_first_step():
    config = family_config("llama")
    model = build(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert memory.tensor_bytes_by_category(model, optimizer) == {
        "weights": estimate_memory(config, StepShape(1, 8))["weights"], "gradients": 0, "optimizer": 0}


def test_meter_leaves_numerics_and_references_alone():
    config = family_config("llama")
    model = build(config)
    batch = padded_batch([32, 20])
    plain = model(**batch, use_cache=False)
    plain.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    meter = memory.SavedActivationMeter(model).attach()
    metered = model(**batch, use_cache=False)
    metered.loss.backward()
    meter.detach()
    assert torch.equal(plain.logits, metered.logits)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert meter.history and meter.history[0] > 0
    assert not meter._keys  # only totals are kept after the forward
    # hooks removed: a later forward is not metered
    model(**batch, use_cache=False)
    assert len(meter.history) == 1


def _live_tensors() -> int:
    gc.collect()
    return sum(1 for value in gc.get_objects() if type(value) is torch.Tensor)


def test_a_metered_forward_that_never_runs_backward_leaves_no_tensor_alive():
    """A forward metered and dropped (a burst stopped mid-step, a forward-only check) frees its graph: a pack hook that
    kept the saved tensor itself tied a saved output to its own grad_fn, a cycle through C++ that gc cannot collect."""
    model, batch = build(family_config("llama")), padded_batch([32, 20])
    before = _live_tensors()
    with memory.SavedActivationMeter(model):
        model(**batch, use_cache=False)
    assert _live_tensors() == before


def test_an_activation_fit_leaves_none_of_its_probe_forwards_alive(monkeypatch):
    """The planner's probes run forwards and never a backward: each kept its whole graph (~190 MB per planned model,
    11 GB over the planner's tests) while the recorder's pack hook kept the saved tensors themselves."""
    config, step = family_config("llama"), StepShape(2, 64)
    spec = memory_estimate._probe_spec(step, TrainingSettings(precision="fp32", attention="sdpa"), checkpointing=False)
    monkeypatch.setattr(activation_probe, "_FIT_CACHE", {})
    activation_probe.activation_fit(config, spec)  # the first fit also builds what any later one reuses
    monkeypatch.setattr(activation_probe, "_FIT_CACHE", {})
    before = _live_tensors()
    activation_probe.activation_fit(config, spec)
    assert _live_tensors() == before


def test_meter_excludes_parameter_views():
    layer = torch.nn.Linear(64, 64, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    with memory.SavedActivationMeter(layer) as meter:
        layer(x).sum()
    # linear saves x (for dW) and a transposed view of the weight (for dx); only x is an activation
    assert meter.saved_bytes == x.numel() * 4
    with memory.SavedActivationMeter(None) as unfiltered:
        layer(x).sum()
    assert unfiltered.saved_bytes == x.numel() * 4 + layer.weight.numel() * 4


def test_memory_report_errors():
    report = memory.memory_report({"weights": 110, "gradients": 100, "activations": 50},
                                  {"weights": 100, "gradients": 100, "activations": None, "context": 0},
                                  peak_bytes=300, peak_moment="backward_start")
    assert set(report["estimate"]) == set(memory.CATEGORIES)
    assert report["error"]["weights"] == pytest.approx(0.10)
    assert report["error"]["gradients"] == 0.0
    assert report["error"]["activations"] is None
    assert report["error"]["context"] == 0.0
    assert report["peak_bytes"] == 300 and report["peak_moment"] == "backward_start"


# ---- device snapshots: real on CPU, faked at the CUDA/NVML boundary ------------------------------------------

def test_cpu_snapshot_reads_rss():
    snap = memory.device_memory_snapshot("cpu")
    assert snap["kind"] == "cpu" and snap["rss_bytes"] > 10 * 2**20 and snap["context_bytes"] == 0


class _FakeNVMLError(Exception):
    pass


class _FakeLibraryNotFound(_FakeNVMLError):
    pass


def _fake_pynvml(used, total, processes, init_error=None):
    mod = types.ModuleType("pynvml")
    mod.NVMLError = _FakeNVMLError
    mod.NVMLError_LibraryNotFound = _FakeLibraryNotFound
    calls = {"init": 0, "shutdown": 0}

    def nvmlInit():
        calls["init"] += 1
        if init_error:
            raise init_error

    def nvmlShutdown():
        calls["shutdown"] += 1

    mod.nvmlInit, mod.nvmlShutdown = nvmlInit, nvmlShutdown
    mod.nvmlDeviceGetHandleByUUID = lambda uuid: ("handle", uuid)
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used, total=total, free=total - used)
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: processes
    mod.calls = calls
    return mod


@pytest.fixture
def fake_cuda(monkeypatch):
    values = {"memory_allocated": 3 * 2**30, "max_memory_allocated": 5 * 2**30, "memory_reserved": 6 * 2**30,
              "max_memory_reserved": 7 * 2**30}
    for name, value in values.items():
        monkeypatch.setattr(torch.cuda, name, lambda index=None, value=value: value)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: types.SimpleNamespace(uuid="1234-abcd"))
    return values


def test_cuda_snapshot_with_nvml_process_memory(monkeypatch, fake_cuda):
    import os

    proc = types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=6 * 2**30 + 500 * 2**20)
    other = types.SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=2**30)
    fake = _fake_pynvml(used=10 * 2**30, total=16 * 2**30, processes=[other, proc])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    snap = memory.device_memory_snapshot("cuda:0")
    assert snap["max_allocated_bytes"] == fake_cuda["max_memory_allocated"]
    assert snap["max_reserved_bytes"] == fake_cuda["max_memory_reserved"]
    assert snap["nvml_process_used_bytes"] == proc.usedGpuMemory
    assert snap["nvml_device_used_bytes"] == 10 * 2**30
    # context = what this process holds beyond the allocator's pool, computed from the live numbers
    assert snap["context_bytes"] == proc.usedGpuMemory - fake_cuda["memory_reserved"]
    assert snap["context_source"] == "nvml_process"
    assert fake.calls["init"] == fake.calls["shutdown"] == 1


def test_cuda_snapshot_falls_back_to_device_used_when_pids_are_hidden(monkeypatch, fake_cuda):
    fake = _fake_pynvml(used=9 * 2**30, total=16 * 2**30, processes=[])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    snap = memory.device_memory_snapshot("cuda")
    assert snap["nvml_process_used_bytes"] is None
    assert snap["context_bytes"] == 9 * 2**30 - fake_cuda["memory_reserved"]
    assert snap["context_source"] == "nvml_device"


def test_cuda_snapshot_without_nvml_library(monkeypatch, fake_cuda):
    fake = _fake_pynvml(used=0, total=0, processes=[], init_error=_FakeLibraryNotFound("no libnvidia-ml"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    snap = memory.device_memory_snapshot("cuda:0")
    assert snap["nvml_device_used_bytes"] is None and snap["context_bytes"] is None
    assert snap["max_allocated_bytes"] == fake_cuda["max_memory_allocated"]


def test_cuda_snapshot_without_pynvml_package(monkeypatch, fake_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    snap = memory.device_memory_snapshot("cuda:0")
    assert snap["context_bytes"] is None and snap["reserved_bytes"] == fake_cuda["memory_reserved"]


def test_attach_reports_each_forward_end_and_phase_peaks_on_cpu():
    config = family_config("llama")
    model = build(config)
    peaks = memory.PhasePeaks("cpu")
    ends = []
    meter = memory.SavedActivationMeter(model).attach(on_forward_end=lambda saved: (ends.append(saved),
                                                                                   peaks.mark("forward_end")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for seed in (0, 1):
        batch = padded_batch([32, 20], seed=seed)
        peaks.reset()
        model(**batch, use_cache=False).loss.backward()
        peaks.mark("backward_end")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        peaks.mark("optimizer_step")
    meter.detach()
    assert ends == meter.history and len(ends) == 2 and meter.max_saved_bytes == max(ends)
    assert set(peaks.peaks) == {"forward_end", "backward_end", "optimizer_step"}
    assert peaks.peak_bytes > 0 and peaks.peak_moment in peaks.peaks
    measured = memory.measured_categories(model, optimizer, meter, memory.device_memory_snapshot("cpu"))
    report = memory.memory_report(estimate_memory(config, StepShape(2, 32)), measured,
                                  peaks.peak_bytes, peaks.peak_moment)
    assert report["error"]["weights"] == 0.0 and report["error"]["optimizer"] == 0.0
    assert report["measured"]["gradients"] == 0  # zero_grad(set_to_none) after the step
    assert report["measured"]["temporary"] is None and report["measured"]["context"] == 0
