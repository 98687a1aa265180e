"""Memory of a training step, measured: tensor sums per category, saved activations, device snapshots, phase peaks.

What each number is (the estimate of the same categories is in memory_estimate.py):

    weights      parameters + buffers, each storage once (`tensor_bytes_by_category`); under LoRA the frozen base
                 and the adapters; under QLoRA the 4-bit weights with their quantization constants
    gradients    every parameter's `.grad` (under LoRA only the adapters have one)
    optimizer    the tensors in `optimizer.state` (accelerate's AcceleratedOptimizer unwrapped; under LoRA it holds
                 the adapters only, as Trainer builds it over the parameters that require a gradient)
    activations  what autograd saves for backward during one forward (`SavedActivationMeter`: saved-tensor hooks,
                 one count per storage, parameters excluded, FSDP's gathered full weights too)
    temporary    only an allocator timeline shows it: per-phase CUDA peaks (`PhasePeaks`); None otherwise
    context      the CUDA context and library workspaces: NVML used minus the allocator's reserved bytes
                 (`device_memory_snapshot`); 0 on CPU

Under FSDP (`compare --fsdp`) parameters, gradients and optimizer state are DTensors: every sum counts this
process's local shard (`local_tensor`), the bytes this process holds.

`memory_report` puts an estimate next to a measurement with the relative error per category.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import torch
from torch.distributed.tensor import DTensor

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporary", "context")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """What this process holds of `t`: a DTensor's local shard (FSDP2 keeps parameters, gradients and optimizer
    state as DTensors sharded over the processes), any other tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def storage_key(t: torch.Tensor) -> tuple[str, int, int]:
    """(device, address, bytes) of the storage behind `t` (its local shard's, for a DTensor): views of one storage
    share it. FSDP2's shards are views too: a weight's shard of its zero-padded chunk (an uneven split pads the last
    ranks), a layer's gradient shards of one reduce-scatter output; the storage is what the process holds."""
    t = local_tensor(t)
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr(), storage.nbytes())


def _unwrap_optimizer(optimizer: Any) -> Any:
    # accelerate's AcceleratedOptimizer (what Trainer holds) wraps the torch optimizer in `.optimizer`.
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def _quantization_constants(params: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    """bitsandbytes' 4-bit weights (QLoRA) keep their block constants outside the parameter, in `quant_state`
    (absmax, code, and with double quantization a second state for the absmax itself)."""
    for param in params:
        state = getattr(param, "quant_state", None)
        while state is not None:
            yield from (value for value in vars(state).values() if isinstance(value, torch.Tensor))
            state = getattr(state, "state2", None)


def tensor_bytes_by_category(model: torch.nn.Module, optimizer: Any = None) -> dict[str, int]:
    """Exact bytes of weights (parameters + buffers), gradients and optimizer state, each storage counted once."""
    seen: set[tuple[str, int, int]] = set()

    def total(tensors: Iterable[torch.Tensor]) -> int:
        nbytes = 0
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            key = storage_key(t)
            if key[1] == 0 and t.device.type != "meta":
                continue
            if key in seen:
                continue
            seen.add(key)
            nbytes += key[2]
        return nbytes

    params = list(model.parameters())
    weights = total([*params, *model.buffers(), *_quantization_constants(params)])
    gradients = total(p.grad for p in params if p.grad is not None)
    opt = _unwrap_optimizer(optimizer)
    state_tensors: list[torch.Tensor] = []
    if opt is not None:
        for state in opt.state.values():
            state_tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return {"weights": weights, "gradients": gradients, "optimizer": total(state_tensors)}


class SavedActivationMeter:
    """Counts the bytes autograd saves for backward while active, one count per storage, parameters excluded.

    Use as a context manager around the forward (and loss), or `attach(model)` to have it switch on in a forward
    pre-hook and off in the forward hook of every call (the loss of HF models is computed inside forward).
    The pack hook returns the tensor detached (its storage, so numerics and lifetimes are unchanged: the tensor itself
    would hold its own grad_fn, a cycle gc cannot break when no backward runs, as torch's saved_tensors_hooks
    docstring warns); the meter keeps only (device, data_ptr, nbytes) keys, never a reference. A view of a parameter (weight.t() for a matmul) shares the
    parameter's storage and is excluded; autocast's half copies of weights are new storages and are counted.
    Caveat: a storage freed *during* the forward and reused at the same address with the same size by a later saved
    tensor would be counted once; saved tensors stay alive until backward, so this needs an unsaved graph branch.
    """

    def __init__(self, model: torch.nn.Module | None = None):
        self.model = model
        self.saved_bytes = 0
        self.saved_tensors = 0
        self.max_saved_bytes = 0
        self.history: list[int] = []  # saved_bytes of each metered forward, in order
        self._keys: set[tuple[str, int, int]] = set()
        self._param_ptrs: set[tuple[str, int]] = set()
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._handles: list[Any] = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.model is not None and isinstance(t._base if t._base is not None else t, torch.nn.Parameter):
            # A parameter or a view of one. Under FSDP the full weights a layer computes with are parameters
            # gathered for that layer only (not the model's sharded ones): weights, not activations.
            return t.detach()
        key = storage_key(t)
        if (key[0], key[1]) not in self._param_ptrs and key not in self._keys:
            self._keys.add(key)
            self.saved_bytes += key[2]
            self.saved_tensors += 1
        return t.detach()

    def start(self) -> None:
        """Begin a new count (resets saved_bytes) and install the hooks."""
        if self._hooks is not None:
            return
        self._param_ptrs = (
            {storage_key(p)[:2] for p in self.model.parameters()}
            if self.model is not None else set()
        )
        self._keys = set()
        self.saved_bytes = 0
        self.saved_tensors = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()

    def stop(self) -> int:
        """Remove the hooks, record this forward's total and return it."""
        if self._hooks is None:
            return self.saved_bytes
        self._hooks.__exit__(None, None, None)
        self._hooks = None
        self._keys = set()  # drop the keys; only the totals are kept
        self.history.append(self.saved_bytes)
        self.max_saved_bytes = max(self.max_saved_bytes, self.saved_bytes)
        return self.saved_bytes

    def __enter__(self) -> "SavedActivationMeter":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def attach(self, model: torch.nn.Module | None = None, on_forward_end: Any = None) -> "SavedActivationMeter":
        """Meter every forward of `model` (pre-hook starts, forward hook stops). `detach()` removes the hooks.

        `on_forward_end(saved_bytes)` runs right after each forward, e.g. `lambda _: peaks.mark("forward_end")`.
        """
        model = model if model is not None else self.model
        if self.model is None:
            self.model = model

        def _end(*_: Any) -> None:
            saved = self.stop()
            if on_forward_end is not None:
                on_forward_end(saved)

        self._handles.append(model.register_forward_pre_hook(lambda *_: self.start()))
        self._handles.append(model.register_forward_hook(_end))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.stop()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _nvml_memory(cuda_index: int) -> dict[str, int | None] | None:
    """NVML's view of the device: used bytes on the whole device and, if visible, this process's bytes.

    Returns None when NVML is unavailable (no package, no driver: NVMLError_LibraryNotFound, ...).
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = None
        try:
            # NVML numbers devices physically; torch numbers them after CUDA_VISIBLE_DEVICES. The UUID matches both.
            uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # older torch without .uuid, MIG UUIDs, ...: fall back to the index
            handle = pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        process_bytes = None
        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    process_bytes = int(proc.usedGpuMemory)
        except pynvml.NVMLError:
            process_bytes = None  # containers often hide other PIDs; keep the device total
        return {"device_used_bytes": int(info.used), "device_total_bytes": int(info.total),
                "process_used_bytes": process_bytes}
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def device_memory_snapshot(device: Any = None) -> dict[str, Any]:
    """What the device says about memory right now (nothing hard-coded).

    CUDA: allocated / max allocated (live tensors), reserved / max reserved (the caching allocator's pool), NVML
    used bytes for the device and this process, and `context_bytes` = NVML process (or device) used - reserved:
    the CUDA context and library workspaces that no tensor accounts for. CPU: the process RSS via psutil.
    """
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    snapshot: dict[str, Any] = {"device": str(dev), "kind": dev.type}
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        reserved = int(torch.cuda.memory_reserved(index))
        snapshot.update(
            allocated_bytes=int(torch.cuda.memory_allocated(index)),
            max_allocated_bytes=int(torch.cuda.max_memory_allocated(index)),
            reserved_bytes=reserved,
            max_reserved_bytes=int(torch.cuda.max_memory_reserved(index)),
        )
        nvml = _nvml_memory(index)
        snapshot["nvml_device_used_bytes"] = nvml["device_used_bytes"] if nvml else None
        snapshot["nvml_process_used_bytes"] = nvml["process_used_bytes"] if nvml else None
        used = None
        if nvml:
            # Prefer this process's own figure; the device total also includes other processes.
            used = nvml["process_used_bytes"] if nvml["process_used_bytes"] is not None else nvml["device_used_bytes"]
        snapshot["context_source"] = (
            None if used is None else ("nvml_process" if nvml["process_used_bytes"] is not None else "nvml_device")
        )
        snapshot["context_bytes"] = max(0, used - reserved) if used is not None else None
        return snapshot
    try:
        import psutil

        snapshot["rss_bytes"] = int(psutil.Process().memory_info().rss)
    except ImportError:
        snapshot["rss_bytes"] = None
    snapshot["context_bytes"] = 0
    return snapshot


class PhasePeaks:
    """Peak bytes per moment of a step: `mark(moment)` closes the phase that ended at that moment.

    CUDA: max_memory_allocated since the previous mark (the peak stats are reset at each mark).
    CPU: there is no per-phase allocator peak; the phase value is the process RSS at the mark.
    """

    def __init__(self, device: Any = None):
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        self.peaks: dict[str, int] = {}

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def mark(self, moment: str) -> int:
        if self.device.type == "cuda":
            value = int(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            value = int(device_memory_snapshot(self.device).get("rss_bytes") or 0)
        self.peaks[moment] = max(self.peaks.get(moment, 0), value)
        return value

    @property
    def peak_bytes(self) -> int | None:
        return max(self.peaks.values()) if self.peaks else None

    @property
    def peak_moment(self) -> str | None:
        return max(self.peaks, key=self.peaks.get) if self.peaks else None


# What a result's one peak (`peak_memory_bytes`, `memory.peak_bytes`) is on each device, in words for the reader.
PEAK_KINDS = {
    "cuda": "allocator peak (torch.cuda.max_memory_allocated): the most bytes live tensors held at once in a step",
    "cpu": "sum of live tensor sizes at the end of the forward (weights + optimizer state + saved activations): a "
           "CPU process has no allocator peak to read",
}


def measured_peak(device: str, measured: Mapping[str, int | None],
                  peaks: PhasePeaks) -> tuple[int | None, str | None, dict[str, int]]:
    """(peak bytes, its moment, the bytes alive then by category, adding up to the peak): the one peak a result
    reports, with what made it, so that a picture of it never stacks categories that were not alive together.

    CUDA: the allocator's peak over the steps' phases; weights and optimizer state are alive throughout, and the rest
    ("other": saved activations, gradients, temporaries) is what the allocator held beyond them, which it does not
    split. CPU: the live tensors at the end of the forward, category by category."""
    if device == "cuda":
        peak = peaks.peak_bytes
        held = {category: measured.get(category) or 0 for category in ("weights", "optimizer")}
        parts = {**held, "other": max(0, peak - sum(held.values()))} if peak else {}
        return peak, peaks.peak_moment, parts
    parts = {category: measured.get(category) or 0 for category in ("weights", "optimizer", "activations")}
    peak = sum(parts.values()) or None
    return peak, "forward_end", parts if peak else {}


# The moment of a step a result's estimate is compared with its measurement at (`compared_moment`): where the
# measurement is one moment's live tensors (CPU: the end of the forward, `measured_peak`), the estimate at that same
# moment; where it is the allocator's peak over the step (CUDA), the estimate's peak. Comparing the estimate's peak
# with a CPU forward's end read +400% for tiny-llama with LoRA and checkpointing: the recomputed layer's and the
# logits' gradients, counted in the estimate, are not alive at the end of the forward.
STEP_PEAK = "peak"


def compared_moment(device: str, measured_moment: str | None) -> str:
    """The moment of a step at which this device's measurement and the estimate are compared (see above)."""
    return STEP_PEAK if device == "cuda" or measured_moment is None else measured_moment


def memory_report(
    estimate: Mapping[str, int],
    measured: Mapping[str, int | None],
    peak_bytes: int | None = None,
    peak_moment: str | None = None,
) -> dict[str, Any]:
    """Estimate and measurement per category, with the signed relative error (estimate - measured) / measured."""
    est = {cat: int(estimate.get(cat, 0)) for cat in CATEGORIES}
    meas = {cat: (None if measured.get(cat) is None else int(measured[cat])) for cat in CATEGORIES}
    error: dict[str, float | None] = {}
    for cat in CATEGORIES:
        m = meas[cat]
        if m is None:
            error[cat] = None
        elif m == 0:
            error[cat] = 0.0 if est[cat] == 0 else None  # a relative error against zero means nothing
        else:
            error[cat] = (est[cat] - m) / m
    return {"estimate": est, "measured": meas, "error": error, "peak_bytes": peak_bytes, "peak_moment": peak_moment}


def measured_categories(
    model: torch.nn.Module, optimizer: Any = None, meter: SavedActivationMeter | None = None,
    snapshot: Mapping[str, Any] | None = None,
) -> dict[str, int | None]:
    """The measured side of `memory_report`: tensor sums, the meter's largest forward, the snapshot's context."""
    measured: dict[str, int | None] = dict(tensor_bytes_by_category(model, optimizer))
    measured["activations"] = meter.max_saved_bytes if meter is not None and meter.history else None
    measured["temporary"] = None  # only an allocator timeline (CUDA peaks per phase) shows temporaries
    measured["context"] = snapshot.get("context_bytes") if snapshot else None
    return measured
