"""Varlen attention is exact (logits and gradients) on every preset; backend choice never picks what cannot run.

References are independent of the code under test: each example run alone (no packing, no padding) through the
built-in sdpa attention, and a padded batch through built-in sdpa for gradients.
"""

import subprocess
import sys

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

from demo_core import DemoInputError, RunConfig
from demo_core.attention import capability
from demo_core.attention import kernels as torch_varlen
from demo_core.attention import varlen as attention
from demo_core.attention.capability import resolve_attention
from demo_core.attention.varlen import VARLEN, varlen_attention
from demo_core.collators import make_collator
from demo_core.models.sources import PRESETS, load_model_source
from demo_core.segments import find_segments
from demo_core.training.engine import prepare

TINY_PRESETS = [name for name in PRESETS if name.startswith("tiny-")]
# Lengths spanning several buckets, with a 1-token example and two of equal length.
LENGTHS = [9, 1, 40, 17, 17, 6, 33]
TOLERANCE = 1e-4


def _examples(lengths=LENGTHS, seed=0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=generator).tolist() for n in lengths]


def _padded_inputs(examples, side: str) -> dict:
    longest = max(len(ids) for ids in examples)
    input_ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, ids in enumerate(examples):
        span = slice(0, len(ids)) if side == "right" else slice(longest - len(ids), longest)
        input_ids[row, span] = torch.tensor(ids)
        mask[row, span] = 1
    # Positions count real tokens, as generation does: GPT-2's absolute positions would otherwise shift with padding.
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def _per_example_logits(model, examples, layout: str) -> list[torch.Tensor]:
    """Each example's logits out of one batched forward in the given layout."""
    if layout in ("flatten-cu", "flatten-positions"):
        batch = make_collator("flatten", load_model_source("tiny-llama").tokenizer)([{"input_ids": e} for e in examples])
        keys = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
        if layout == "flatten-positions":  # segments only from position_ids restarts
            keys = ("input_ids", "position_ids")
        logits = model(**{key: batch[key] for key in keys}, use_cache=False).logits[0]
        return list(torch.split(logits, [len(e) for e in examples]))
    side = layout.removeprefix("padded-")
    inputs = _padded_inputs(examples, side)
    logits = model(**inputs, use_cache=False).logits
    mask = inputs["attention_mask"].bool()
    return [logits[row][mask[row]] for row in range(len(examples))]


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_varlen_logits_equal_each_example_alone(preset):
    source = load_model_source(preset)
    examples = _examples()
    reference = source.build("sdpa", seed=0).eval()
    model = source.build(VARLEN, seed=0).eval()
    with torch.no_grad():
        alone = [reference(input_ids=torch.tensor([ids]), use_cache=False).logits[0] for ids in examples]
        for layout in ("flatten-cu", "flatten-positions", "padded-right", "padded-left"):
            packed = _per_example_logits(model, examples, layout)
            worst = max(float((p - a).abs().max()) for p, a in zip(packed, alone))
            assert worst < TOLERANCE, f"{preset} {layout}: max |Δlogit| {worst:.2e}"


def _gradients(model, inputs: dict) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(**inputs, use_cache=False).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_packed_varlen_gradients_equal_padded_sdpa_gradients(preset):
    source = load_model_source(preset)
    examples = _examples(seed=1)
    features = [{"input_ids": ids} for ids in examples]
    padded = make_collator("padded", source.tokenizer)(features)
    packed = make_collator("flatten", source.tokenizer)(features)
    expected = _gradients(source.build("sdpa", seed=0).train(), padded)
    actual = _gradients(source.build(VARLEN, seed=0).train(), packed)
    assert expected.keys() == actual.keys()
    for name, grad in expected.items():
        assert grad.abs().max() > 0 or "bias" in name, f"{name}: no gradient reaches it, the check would be empty"
        diff = float((actual[name] - grad).abs().max())
        assert diff < TOLERANCE, f"{preset} {name}: max |Δgrad| {diff:.2e}"


def _reference_attention(q, k, v, lengths, scale=None):
    """Eager causal attention per segment with heads repeated for GQA: (T, Hq, D) in, (T, Hq, D) out."""
    outputs, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for length in lengths:
        qs, ks, vs = (t[start:start + length].transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        scores = qs @ ks.transpose(1, 2) * (scale if scale is not None else qs.shape[-1] ** -0.5)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        outputs.append((scores.masked_fill(~causal, float("-inf")).softmax(-1) @ vs).transpose(0, 1))
        start += length
    return torch.cat(outputs)


class _Module(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("q_heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_varlen_attention_matches_eager_reference_with_gqa(q_heads, kv_heads):
    lengths = [3, 50, 1, 21, 19, 8]
    total, head_dim = sum(lengths), 16
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, q_heads, total, head_dim, generator=generator, requires_grad=True)
    k = torch.randn(1, kv_heads, total, head_dim, generator=generator, requires_grad=True)
    v = torch.randn(1, kv_heads, total, head_dim, generator=generator, requires_grad=True)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    out, _ = varlen_attention(_Module(), q, k, v, None, scaling=0.2, position_ids=positions)
    tokens = [t[0].transpose(0, 1) for t in (q, k, v)]
    expected = _reference_attention(*tokens, lengths, scale=0.2)
    assert float((out[0] - expected).detach().abs().max()) < 1e-5
    weights = torch.randn(expected.shape, generator=generator)
    grads = torch.autograd.grad((out[0] * weights).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for got, want in zip(grads, expected_grads):
        assert float((got - want).abs().max()) < 1e-5


def test_torch_varlen_kernel_wiring(monkeypatch):
    """The CUDA branch's gathers, cu_seqlens and scatter, with the kernel replaced at the device boundary by a
    reference that follows varlen_attn's documented contract (this machine has no CUDA)."""
    calls = []

    def fake_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                         enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
        assert window_size == (-1, 0) and torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32
        lengths = torch.diff(cu_q).tolist()
        assert max_q == max_k == max(lengths) and enable_gqa == (q.shape[1] != k.shape[1])
        calls.append(lengths)
        return _reference_attention(q, k, v, lengths, scale)

    monkeypatch.setattr(torch_varlen, "INSTALLED", torch_varlen.VarlenKernel.of(fake_varlen_attn))
    monkeypatch.setattr(attention, "_flash_dtype", lambda query, dropout_p: torch.float32)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 12, 8, generator=generator)
    k, v = torch.randn(2, 3, 2, 12, 8, generator=generator)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :5] = 0  # left padding
    mask[2, 9:] = 0  # right padding
    out, _ = varlen_attention(_Module(), q, k, v, mask, scaling=None)
    assert calls == [[7, 12, 9]]
    for row in range(3):
        real = mask[row].bool()
        tokens = [t[row].transpose(0, 1)[real] for t in (q, k, v)]
        assert float((out[row][real] - _reference_attention(*tokens, [int(real.sum())])).abs().max()) < 1e-5
        assert not out[row][~real].any()


def test_kernel_is_never_tried_on_cpu():
    assert attention._flash_dtype(torch.zeros(1, 1, 2, 8, dtype=torch.bfloat16), 0.0) is None


def test_find_segments_from_each_source_agree():
    lengths = [4, 16, 31, 14]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    cu = torch.tensor([0, 4, 20, 51, 65], dtype=torch.int32)
    from_cu = find_segments(1, 65, torch.device("cpu"), cu_seq_lens=cu)
    from_positions = find_segments(1, 65, torch.device("cpu"), position_ids=positions)
    assert from_cu.lengths == from_positions.lengths == lengths
    assert from_cu.all_real and from_cu.cu_seqlens.tolist() == cu.tolist()
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
    padded = find_segments(3, 5, torch.device("cpu"), attention_mask=mask, position_ids=torch.arange(5)[None])
    assert padded.lengths == [3, 4] and padded.real_index.tolist() == [2, 3, 4, 5, 6, 7, 8]
    assert not padded.all_real


def test_buckets_cover_every_real_token_once_with_bounded_padding():
    lengths = [1, 2, 24, 25, 30, 100, 118, 700, 1024, 3]
    segments = find_segments(1, sum(lengths), torch.device("cpu"),
                             position_ids=torch.cat([torch.arange(n) for n in lengths])[None])
    assert sorted(segments.bucket_destination.tolist()) == list(range(sum(lengths)))
    for bucket in segments.buckets:
        members, longest = bucket.gather_index.shape
        padding_slots = bucket.gather_index.numel() - bucket.keep_index.numel()
        assert padding_slots <= members * max(longest - longest / 1.25, 16)
    assert len(segments.buckets) < len(lengths)  # similar lengths share a call


def test_mask_with_holes_is_refused_with_a_clear_error():
    model = load_model_source("tiny-llama").build(VARLEN, seed=0)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 4] = 0
    with pytest.raises(DemoInputError, match="holes in row 1"):
        model(input_ids=torch.randint(3, 300, (2, 10)), attention_mask=mask, use_cache=False)


# ---- backend choice ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_auto_on_cpu_picks_a_path_that_trains(preset, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(capability, "is_flash_attn_2_available", lambda: True)  # installed, but no GPU to run on
    prepared = prepare(RunConfig(model=preset, samples=4, batch_size=2, attention="auto", device="auto"))
    assert (prepared.resolved.device, prepared.resolved.attention) == ("cpu", VARLEN)
    model = prepared.source.build(prepared.resolved.attention, seed=0)
    batch = make_collator("flatten", prepared.source.tokenizer)([{"input_ids": e} for e in prepared.dataset.examples])
    model(**batch, use_cache=False).loss.backward()


@pytest.mark.parametrize("flash_installed,expected", [(True, "flash_attention_2"), (False, VARLEN)])
def test_auto_on_cuda_prefers_flash_only_when_installed(flash_installed, expected, monkeypatch):
    monkeypatch.setattr(capability, "is_flash_attn_2_available", lambda: flash_installed)
    assert resolve_attention("auto", load_model_source("tiny-llama").config, "cuda") == expected


def test_auto_skips_paths_a_family_lacks():
    gemma2 = Gemma2Config(vocab_size=384, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=32, intermediate_size=128)
    # eager on transformers 5.24 (Gemma 2 has no sdpa there), sdpa where its class says it has: never varlen
    assert resolve_attention("auto", gemma2, "cpu") == ("sdpa" if Gemma2ForCausalLM._supports_sdpa else "eager")
    assert not capability.capability(gemma2, VARLEN, "cpu")[0]
    with pytest.raises(DemoInputError, match="soft-capping"):
        resolve_attention(VARLEN, gemma2, "cpu")


def test_requesting_an_unavailable_path_gives_the_capability_message(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DemoInputError, match="unavailable for llama on cpu: flash_attention_2 needs a CUDA GPU"):
        prepare(RunConfig(attention="flash_attention_2", samples=4))
    monkeypatch.setattr(capability, "is_flash_attn_2_available", lambda: False)
    with pytest.raises(DemoInputError, match="needs the flash-attn package"):
        resolve_attention("flash_attention_2", load_model_source("tiny-llama").config, "cuda")


def test_capabilities_command_prints_the_table():
    completed = subprocess.run([sys.executable, "-m", "demo_core", "capabilities", "--models", "tiny-llama,tiny-gpt2"],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].split()[:4] == ["model", "attention", "device", "works"]
    rows = [line.split(None, 4) for line in lines[1:]]
    assert len(rows) == 2 * len(capability.AUTO_ORDER) * 2
    cells = {(r[0], r[1], r[2]): r[3] for r in rows}
    assert cells[("tiny-llama", "flash_attention_2", "cpu")] == "no"
    assert cells[("tiny-gpt2", VARLEN, "cpu")] == "yes"
