"""The CUDA path, checked on a GPU: PyTorch's varlen kernel inside our attention, bursts in bf16, memory by phase
and by NVML. Skipped without CUDA; benchmarks/gpu_check.sh runs this file first on a GPU machine.

Tolerances: fp32 paths as on CPU (1e-4); the bf16 kernel against an fp32 reference at 3e-2 of the largest value
(bf16 keeps 8 bits of mantissa: 3.9e-3 per rounding, a few roundings deep).
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from demo_core import RunConfig, run_comparison
from demo_core.attention import capability, preflight
from demo_core.attention import kernels as torch_varlen
from demo_core.attention import varlen as attention
from demo_core.errors import DemoInputError
from demo_core.models.sources import byte_tokenizer, config_source

from model_families import FAMILIES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16_RELATIVE_TOLERANCE = 3e-2
LENGTHS = [7, 300, 1, 64, 129, 1024]


class _Layer(torch.nn.Module):
    is_causal = True


@pytest.fixture
def kernel_calls(monkeypatch) -> list:
    """Records each call into the installed varlen_attn (empty on a torch without it)."""
    calls = []
    if torch_varlen.INSTALLED is not None:
        real = torch_varlen.INSTALLED.function

        def counting(*args, **kwargs):
            calls.append(kwargs.get("window_size"))
            return real(*args, **kwargs)

        monkeypatch.setattr(torch_varlen, "INSTALLED", dataclasses.replace(torch_varlen.INSTALLED, function=counting))
    return calls


def _per_segment_sdpa(q, k, v, window: int | None, scale: float) -> torch.Tensor:
    """fp32 reference: SDPA on each segment alone, (1, H, T, D) in, (1, T, H, Dv) out."""
    outputs, start = [], 0
    for length in LENGTHS:
        segment = [t[:, :, start:start + length].float() for t in (q, k, v)]
        position = torch.arange(length, device=q.device)
        allowed = position[None, :] <= position[:, None]
        if window is not None:
            allowed &= position[None, :] > position[:, None] - window
        outputs.append(F.scaled_dot_product_attention(*segment, attn_mask=allowed, scale=scale,
                                                      enable_gqa=True).transpose(1, 2))
        start += length
    return torch.cat(outputs, dim=1)


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.detach().float() - expected.detach()).abs().max() / expected.detach().abs().max())


@pytest.mark.parametrize("q_heads, kv_heads", [(32, 8), (16, 16)])
@pytest.mark.parametrize("window", [None, 128])
@pytest.mark.parametrize("value_head_dim", [64, 48])  # 48: MLA-style value head dim, padded for the kernel
@pytest.mark.parametrize("inputs", ["bf16 tensors", "fp32 under bf16 autocast"])
def test_varlen_kernel_matches_per_segment_sdpa(kernel_calls, q_heads, kv_heads, window, value_head_dim, inputs):
    generator = torch.Generator(device="cuda").manual_seed(0)
    total, head_dim, scale = sum(LENGTHS), 64, 0.11
    dtype = torch.bfloat16 if inputs == "bf16 tensors" else torch.float32

    def tensor(heads, dim):
        return torch.randn(1, heads, total, dim, device="cuda", generator=generator, dtype=dtype, requires_grad=True)

    q, k, v = tensor(q_heads, head_dim), tensor(kv_heads, head_dim), tensor(kv_heads, value_head_dim)
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None].cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=inputs != "bf16 tensors"):
        out, _ = attention.varlen_attention(_Layer(), q, k, v, None, scaling=scale, sliding_window=window,
                                            position_ids=positions)
    expected = _per_segment_sdpa(q, k, v, window, scale)
    weights = torch.randn(expected.shape, device="cuda", generator=generator)
    grads = torch.autograd.grad((out.float() * weights).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    assert _relative(out, expected) < BF16_RELATIVE_TOLERANCE
    for got, want in zip(grads, expected_grads):
        assert _relative(got, want) < BF16_RELATIVE_TOLERANCE
    if torch_varlen.INSTALLED is None:  # the SDPA fallback gave these numbers; the table must say why
        works, why = capability.capability(config_source("llama", _llama_config(), byte_tokenizer()).config,
                                          attention.VARLEN, "cuda")
        assert works and torch_varlen.absence_reason() in why
    elif window is None or torch_varlen.INSTALLED.takes_window:
        assert kernel_calls, "the kernel never ran"
    else:
        assert not kernel_calls  # torch 2.10: windows run on per-segment SDPA


def _llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, pad_token_id=0)


def _packing_on(source, device: str) -> dict | str:
    try:
        return preflight.measure_packing(source, attention.VARLEN, device, ("flatten", "padded"))
    except DemoInputError as refusal:
        return str(refusal)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.name in (
    "mistral", "gemma3_text", "qwen2_moe", "llama4_text", "gpt_oss", "deepseek_v3", "gpt2", "stablelm")],
    ids=lambda family: family.name)
def test_families_pack_on_cuda_as_on_cpu(family):
    """The mask reading, segment bookkeeping, sinks and MLA on CUDA tensors (fp32: the per-bucket SDPA path) give
    what they give on CPU with this machine's transformers (tests/test_packing_exactness.py pins the CPU verdicts
    to requirements.txt's transformers; an older one may refuse more, and must then refuse on both)."""
    source = config_source(family.name, family.make_config(), byte_tokenizer())
    on_cpu, on_cuda = _packing_on(source, "cpu"), _packing_on(source, "cuda")
    if isinstance(on_cpu, str):
        assert on_cuda == on_cpu
        return
    assert on_cuda.keys() == on_cpu.keys()
    for layout, difference in on_cpu.items():
        assert on_cuda[layout] == pytest.approx(difference, abs=preflight.TOLERANCE), (layout, on_cpu, on_cuda)


BURST = dict(model="small-llama", dataset="flan-like", samples=48, steps=6, batch_size=8, max_length=512,
             attention="varlen", optimizer="adamw", device="cuda")


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-4), ("bf16", 1e-2)])
def test_llama_shape_burst_padded_and_flatten_losses_agree(kernel_calls, precision, tolerance):
    document = run_comparison(RunConfig(**BURST, precision=precision, collators=("padded", "flatten"))).to_dict()
    padded, flatten = document["results"]
    assert padded["step_real_tokens"] == flatten["step_real_tokens"]
    assert max(abs(a - b) for a, b in zip(padded["losses"], flatten["losses"])) < tolerance
    assert bool(kernel_calls) == (precision == "bf16" and torch_varlen.INSTALLED is not None)


def test_memory_is_measured_per_phase_and_by_nvml():
    document = run_comparison(RunConfig(**BURST, precision="bf16", collators=("padded", "flatten"))).to_dict()
    for result in document["results"]:
        phases = result["memory"]["phase_peaks"]
        assert set(phases) == {"forward_end", "backward_end", "optimizer_step"} and min(phases.values()) > 0
        assert result["peak_memory_bytes"] == max(phases.values())
        context = result["memory"]["measured"]["context"]
        assert context is not None and context > 0, "NVML gave no CUDA context (is nvidia-ml-py importable?)"
        assert result["memory"]["measured"]["activations"] > 0
    assert document["comparison"]["flatten"]["peak_memory_vs_padded"] < 0  # flan-like: packing needs less
