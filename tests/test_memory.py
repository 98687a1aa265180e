"""Memory anatomy: estimates from configs against bytes measured on real tiny models (CPU)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM

import demo_core.memory as memory

VOCAB = 384


def tiny_config(arch: str, hidden: int = 128, layers: int = 2, intermediate: int = 256):
    if arch == "gpt2":
        return AutoConfig.for_model("gpt2", n_embd=hidden, n_layer=layers, n_head=4, vocab_size=VOCAB,
                                    n_positions=2048, bos_token_id=0, eos_token_id=0)
    extra = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if arch == "gemma":
        extra["head_dim"] = hidden // 4  # gemma's default head_dim is 256 whatever the hidden size
    return AutoConfig.for_model(arch, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                max_position_embeddings=2048, **extra)


def small_config(arch: str = "llama"):
    return tiny_config(arch, hidden=256, layers=4, intermediate=1024)


def build(config, attention="sdpa"):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    model.train()
    return model


def padded_batch(batch=4, seq_len=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq_len // 4, seq_len + 1, (batch,), generator=g)
    lengths[0] = seq_len  # the longest row sets the width, as a padding collator does
    ids = torch.randint(0, VOCAB, (batch, seq_len), generator=g)
    mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()  # right padding
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}, int(mask.sum())


def packed_batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    ids = torch.randint(0, VOCAB, (1, total), generator=g)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    labels = ids.clone()
    starts = torch.tensor([0] + list(lengths[:-1])).cumsum(0)
    labels[0, starts] = -100  # first token of each example, as DataCollatorWithFlattening does
    return {"input_ids": ids, "position_ids": position_ids, "labels": labels}


def segment_lengths(total, seed=0, low=8, high=48):
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(int(torch.randint(low, high, (1,), generator=g)))
    lengths[-1] -= sum(lengths) - total
    if lengths[-1] < 2:
        lengths[-2] += lengths.pop()
    return lengths


def measure_saved(model, batch, precision="fp32"):
    ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
           else torch.autocast("cpu", enabled=False))
    with memory.SavedActivationMeter(model) as meter, ctx:
        out = model(**batch, use_cache=False)
    return meter.saved_bytes, out


# ---- weights / gradients / optimizer: exact to the byte --------------------------------------------------------

ARCHS = ["llama", "mistral", "qwen2", "gemma", "phi3", "granite", "gpt2"]


@pytest.mark.parametrize("optimizer_name", ["adamw", "sgd"])
@pytest.mark.parametrize("arch", ARCHS)
def test_state_categories_exact_after_a_real_step(arch, optimizer_name):
    config = tiny_config(arch)
    model = build(config)
    if optimizer_name == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    batch, _ = padded_batch(batch=2, seq_len=32)
    loss = model(**batch, use_cache=False).loss
    loss.backward()
    optimizer.step()
    measured = memory.tensor_bytes_by_category(model, optimizer)
    estimate = memory.estimate_memory(config, batch_size=2, seq_len=32, optimizer=optimizer_name)
    for category in ("weights", "gradients", "optimizer"):
        assert estimate[category] == measured[category], (arch, optimizer_name, category)
    # sanity of the measurement itself, independent of the estimator
    n_params = sum(p.numel() for p in model.parameters())
    assert measured["gradients"] == 4 * n_params
    per_param = 8 if optimizer_name == "adamw" else 4
    assert measured["optimizer"] >= per_param * n_params


def test_tensor_bytes_unwraps_accelerated_optimizer_and_counts_tied_weights_once():
    config = tiny_config("gpt2")  # lm_head is tied to wte
    model = build(config)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    wrapper = types.SimpleNamespace(optimizer=inner)  # AcceleratedOptimizer's shape: the torch optimizer inside
    batch, _ = padded_batch(batch=2, seq_len=16)
    model(**batch, use_cache=False).loss.backward()
    inner.step()
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert memory.tensor_bytes_by_category(model, wrapper) == memory.tensor_bytes_by_category(model, inner)
    n_tensors = len(list(model.parameters()))
    n_params = sum(p.numel() for p in model.parameters())
    assert memory.tensor_bytes_by_category(model, inner)["optimizer"] == 8 * n_params + 4 * n_tensors


def test_optimizer_state_appears_only_after_the_first_step():
    config = tiny_config("llama")
    model = build(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert memory.tensor_bytes_by_category(model, optimizer) == {
        "weights": memory.estimate_memory(config, batch_size=1, seq_len=8)["weights"],
        "gradients": 0, "optimizer": 0}


# ---- activations: estimate vs SavedActivationMeter -------------------------------------------------------------

ERRORS: list[str] = []


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("path", ["padded", "packed"])
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_activation_estimate_matches_saved_tensors(size, path, attention):
    config = tiny_config("llama") if size == "tiny" else small_config("llama")
    model = build(config, attention)
    if path == "padded":
        batch, real = padded_batch(batch=4, seq_len=96)
        est = memory.estimate_memory_detail(config, batch_size=4, seq_len=96, real_tokens=real,
                                            attention=attention)
    else:
        lengths = segment_lengths(300)
        batch = packed_batch(lengths)
        real = sum(lengths)
        est = memory.estimate_memory_detail(config, batch_size=1, seq_len=real, real_tokens=real, packed=True,
                                            segment_lengths=lengths, attention=attention)
    measured, _ = measure_saved(model, batch)
    estimated = est.categories["activations"]
    error = (estimated - measured) / measured
    line = f"llama-{size} {path} {attention} tokens={real} est={estimated} meas={measured} err={100 * error:+.2f}%"
    ERRORS.append(line)
    print(line)
    assert abs(error) < 0.10, line


@pytest.mark.parametrize("arch", ["gemma", "phi3", "gpt2"])
def test_activation_estimate_other_architectures(arch):
    config = tiny_config(arch)
    model = build(config, "sdpa")
    batch = packed_batch(segment_lengths(200, seed=1))
    measured, _ = measure_saved(model, batch)
    estimated = memory.estimate_memory(config, batch_size=1, seq_len=200, real_tokens=200, packed=True,
                                       attention="sdpa")["activations"]
    print(f"{arch} packed sdpa est={estimated} meas={measured} err={100 * (estimated - measured) / measured:+.2f}%")
    assert abs(estimated - measured) / measured < 0.10


def test_bf16_autocast_activations_include_half_weight_copies():
    config = tiny_config("llama")
    model = build(config, "sdpa")
    batch, real = padded_batch(batch=4, seq_len=64)
    measured, _ = measure_saved(model, batch, precision="bf16")
    est = memory.estimate_memory_detail(config, batch_size=4, seq_len=64, real_tokens=real, precision="bf16")
    print(f"llama-tiny padded sdpa bf16 est={est.categories['activations']} meas={measured}")
    assert abs(est.categories["activations"] - measured) / measured < 0.10
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert est.activation_terms["amp_weight_copies"] == 2 * linear_weights
    # master weights stay fp32 under autocast
    assert est.categories["weights"] == memory.estimate_memory(config, batch_size=4, seq_len=64)["weights"]


def test_meter_leaves_numerics_and_references_alone():
    config = tiny_config("llama")
    model = build(config)
    batch, _ = padded_batch(batch=2, seq_len=32)
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


# ---- linear growth of the packed path -----------------------------------------------------------------------

def _per_segment_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """A minimal varlen stand-in for the test: causal SDPA per segment (segments from position_ids restarts)."""
    position_ids = kwargs["position_ids"][0]
    starts = (position_ids == 0).nonzero().flatten().tolist() + [position_ids.numel()]
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    outs = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True,
                                           scale=scaling) for a, b in zip(starts[:-1], starts[1:])]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register("test_per_segment", _per_segment_attention)


def test_packed_saved_bytes_grow_linearly_with_real_tokens():
    config = tiny_config("llama")
    model = build(config, "test_per_segment")
    short = segment_lengths(256, seed=3, low=8, high=24)
    measured = []
    for repeat in (1, 2):
        batch = packed_batch(short * repeat)  # the same short segments, twice as many
        measured.append(measure_saved(model, batch)[0])
    ratio = measured[1] / measured[0]
    print(f"per-segment packed: 256 tokens {measured[0]} B, 512 tokens {measured[1]} B, ratio {ratio:.4f}")
    assert abs(ratio - 2.0) < 0.06
    # the estimator's varlen path has no quadratic term, so it doubles exactly up to the 8-byte label pad
    est = [memory.estimate_memory(config, batch_size=1, seq_len=n, real_tokens=n, packed=True,
                                  segment_lengths=short * (n // 256), attention="varlen")["activations"]
           for n in (256, 512)]
    assert abs(est[1] / est[0] - 2.0) < 0.01


def test_packed_sdpa_is_linear_once_the_dense_mask_is_removed():
    config = tiny_config("llama")
    model = build(config, "sdpa")
    short = segment_lengths(256, seed=4, low=8, high=24)
    linear_part = []
    for repeat in (1, 2):
        tokens = 256 * repeat
        saved = measure_saved(model, packed_batch(short * repeat))[0]
        est = memory.estimate_memory_detail(config, batch_size=1, seq_len=tokens, real_tokens=tokens, packed=True,
                                            segment_lengths=short * repeat, attention="sdpa")
        mask_bytes = est.activation_terms["sdpa_mask"]
        assert mask_bytes == config.num_hidden_layers * tokens * tokens * 4  # (sum s_i)^2 per layer
        linear_part.append(saved - mask_bytes)
    assert abs(linear_part[1] / linear_part[0] - 2.0) < 0.06


def test_quadratic_term_per_attention_path():
    config = tiny_config("llama")
    lengths = [100, 50, 50]
    kwargs = dict(batch_size=1, seq_len=200, real_tokens=200, packed=True, segment_lengths=lengths)
    eager = memory.estimate_memory_detail(config, attention="eager", **kwargs).activation_terms
    varlen = memory.estimate_memory_detail(config, attention="varlen", **kwargs).activation_terms
    math_varlen = memory.estimate_memory_detail(config, attention="varlen", varlen_materializes_scores=True,
                                                **kwargs).activation_terms
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    assert eager["attention_scores"] == layers * heads * 200 ** 2 * 4  # (sum s_i)^2
    assert "attention_scores" not in varlen and "sdpa_mask" not in varlen
    assert math_varlen["attention_scores"] == layers * heads * sum(s * s for s in lengths) * 4  # sum s_i^2


# ---- seed example, reports, what-if, peaks -------------------------------------------------------------------

def test_bert_large_seed_estimate_is_sane_and_weights_exact():
    from transformers import AutoModelForSequenceClassification

    config = memory.bert_large_config()
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
    n_params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert 330e6 < n_params < 340e6
    seed = memory.seed_example_estimate()
    print({k: round(v / 2**20) for k, v in seed["categories"].items()}, "peak MB", seed["peak_bytes"] / 2**20)
    assert seed["params"] == n_params
    assert seed["categories"]["weights"] == 4 * n_params + buffers
    assert seed["categories"]["optimizer"] == 8 * n_params + 4 * len(list(model.parameters()))
    assert 5 * 2**30 < seed["peak_bytes"] < 16 * 2**30
    assert 5 * 2**30 < seed["sum_of_categories_bytes"] < 16 * 2**30
    assert seed["peak_bytes"] <= seed["seed_measured_bytes"]


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


def test_what_if_grid_scales_the_right_categories():
    config = tiny_config("llama")
    rows = memory.what_if_grid(config, batch_sizes=[1, 2], seq_lens=[128], precisions=["fp32", "bf16"],
                               optimizers=["adamw", "adamw_8bit", "sgd"])
    assert len(rows) == 2 * 1 * 2 * 3
    by = {(r["batch_size"], r["precision"], r["optimizer"]): r for r in rows}
    assert by[(2, "fp32", "adamw")]["weights_bytes"] == by[(1, "fp32", "adamw")]["weights_bytes"]
    assert by[(2, "fp32", "adamw")]["activations_bytes"] > 1.9 * by[(1, "fp32", "adamw")]["activations_bytes"]
    assert (by[(1, "fp32", "adamw_8bit")]["optimizer_bytes"] < by[(1, "fp32", "sgd")]["optimizer_bytes"]
            < by[(1, "fp32", "adamw")]["optimizer_bytes"])
    assert all(r["total_bytes"] == sum(r[f"{c}_bytes"] for c in memory.CATEGORIES) for r in rows)


def test_bad_choices_raise_the_user_error():
    from demo_core.errors import DemoInputError

    with pytest.raises(DemoInputError):
        memory.estimate_memory(tiny_config("llama"), batch_size=1, seq_len=8, precision="int4")
    with pytest.raises(DemoInputError):
        memory.estimate_memory(tiny_config("llama"), batch_size=1, seq_len=8, attention="flex")


def test_compare_peaks_relative_to_padded():
    results = [{"collator": "padded", "peak_memory_bytes": 1000},
               {"collator": "flatten", "peak_memory_bytes": 800},
               {"collator": "bfd", "peak_memory_bytes": None}]
    out = memory.compare_peaks(results)
    assert out["padded"]["change_vs_padded"] == 0.0
    assert out["flatten"]["change_vs_padded"] == pytest.approx(-0.20)
    assert out["bfd"]["change_vs_padded"] is None


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


def test_bert_activation_formula_behind_the_seed_estimate():
    """The seed estimate's formula, checked on a small BERT classifier (dropout 0.1 everywhere, CPU masks)."""
    from transformers import AutoModelForSequenceClassification, BertConfig

    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                        vocab_size=VOCAB, num_labels=2)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    model.train()
    ids = torch.randint(0, VOCAB, (4, 64))
    with memory.SavedActivationMeter(model) as meter:
        model(input_ids=ids, labels=torch.randint(0, 2, (4,)))
    estimated = memory.estimate_memory(config, batch_size=4, seq_len=64, attention="eager")["activations"]
    print(f"bert-small eager est={estimated} meas={meter.saved_bytes}")
    assert abs(estimated - meter.saved_bytes) / meter.saved_bytes < 0.05


def test_attach_reports_each_forward_end_and_phase_peaks_on_cpu():
    config = tiny_config("llama")
    model = build(config)
    peaks = memory.PhasePeaks("cpu")
    ends = []
    meter = memory.SavedActivationMeter(model).attach(on_forward_end=lambda saved: (ends.append(saved),
                                                                                   peaks.mark("forward_end")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for seed in (0, 1):
        batch, _ = padded_batch(batch=2, seq_len=32, seed=seed)
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
    report = memory.memory_report(memory.estimate_memory(config, batch_size=2, seq_len=32), measured,
                                  peaks.peak_bytes, peaks.peak_moment)
    assert report["error"]["weights"] == 0.0 and report["error"]["optimizer"] == 0.0
    assert report["measured"]["gradients"] == 0  # zero_grad(set_to_none) after the step
    assert report["measured"]["temporary"] is None and report["measured"]["context"] == 0
