"""The varlen_attn adapter on every signature PyTorch has shipped, tested on CPU with fakes at the device boundary.

Each fake has the exact signature of one release's `torch.nn.attention.varlen.varlen_attn` (copied from the 2.10.0,
2.11.0 and 2.12.0 wheels; 2.13 is the one installed here) and computes what FlashAttention computes, by its own
conventions: `window_size=(left, right)` counts keys before/after the query, `is_causal` means right = 0, the
default scale is 1/sqrt(head_dim of the tensors it is given), and it refuses what the real kernel refuses (different
head counts without `enable_gqa`, q/k/v head dims that differ). The expectation is computed independently, by
transformers' conventions (a window of W keys includes the query). The real kernel is checked in tests/test_cuda.py.
"""

import inspect

import pytest
import torch

from demo_core.attention import kernels as torch_varlen
from demo_core.attention import varlen as attention
from demo_core.attention.kernels import VarlenKernel
from demo_core.models.sources import byte_tokenizer, config_source


def _flash_reference(query, key, value, cu_seq, left: int, right: int, scale: float | None) -> torch.Tensor:
    """FlashAttention's semantics, per segment: query i sees key j when i - left <= j <= i + right (-1: no bound)."""
    if query.shape[1] != key.shape[1]:
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    outputs = []
    for start, end in zip(cu_seq[:-1].tolist(), cu_seq[1:].tolist()):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        offsets = torch.arange(end - start)
        allowed = torch.ones(end - start, end - start, dtype=torch.bool)
        if left >= 0:
            allowed &= offsets[None, :] >= offsets[:, None] - left
        if right >= 0:
            allowed &= offsets[None, :] <= offsets[:, None] + right
        scores = (q @ k.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
        outputs.append((scores.softmax(-1) @ v).transpose(0, 1))
    return torch.cat(outputs)


def _check_shapes(query, key, value, enable_gqa: bool) -> None:
    if not (query.shape[-1] == key.shape[-1] == value.shape[-1]):
        raise RuntimeError("FlashAttention needs one head dim for q, k and v")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError("number of heads in key/value must equal query's; try setting enable_gqa=True")


def varlen_attn_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    _check_shapes(query, key, value, enable_gqa=False)
    return _flash_reference(query, key, value, cu_seq_q, -1, 0 if is_causal else -1, None)


def varlen_attn_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1)):
    _check_shapes(query, key, value, enable_gqa=False)
    return _flash_reference(query, key, value, cu_seq_q, *window_size, scale)


def varlen_attn_2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    _check_shapes(query, key, value, enable_gqa)
    return _flash_reference(query, key, value, cu_seq_q, *window_size, scale)


FAKES = {"2.10": varlen_attn_2_10, "2.11": varlen_attn_2_11, "2.12": varlen_attn_2_12}
LENGTHS = [9, 1, 17, 6]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _expected(query, key, value, window: int | None, scale: float) -> torch.Tensor:
    """transformers' conventions, computed separately: a window of W keys is kv > q - W, causal inside it."""
    groups = query.shape[1] // key.shape[1]
    outputs, start = [], 0
    for length in LENGTHS:
        q, k, v = (t[start:start + length].transpose(0, 1) for t in (query, key, value))
        k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
        position = torch.arange(length)
        allowed = position[None, :] <= position[:, None]
        if window is not None:
            allowed &= position[None, :] > position[:, None] - window
        scores = (q @ k.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
        outputs.append((scores.softmax(-1) @ v).transpose(0, 1))
        start += length
    return torch.cat(outputs)


# (takes_is_causal, takes_scale, takes_window, takes_enable_gqa) per release, from each release's varlen.py
RELEASED_SIGNATURES = {(2, 10): (True, False, False, False), (2, 11): (False, True, True, False)}
NEWEST_SIGNATURE = (False, True, True, True)  # 2.12 and later


def test_the_installed_signature_is_read_as_its_release_has_it():
    """Against the real function of whatever torch runs this (2.13 here, 2.11 on the GPU box)."""
    release = tuple(int(part) for part in torch.__version__.split(".")[:2])
    if release < (2, 10):
        assert torch_varlen.INSTALLED is None and "added in 2.10" in torch_varlen.absence_reason()
        return
    kernel = torch_varlen.INSTALLED
    read = (kernel.takes_is_causal, kernel.takes_scale, kernel.takes_window, kernel.takes_enable_gqa)
    assert read == RELEASED_SIGNATURES.get(release, NEWEST_SIGNATURE)


@pytest.mark.parametrize("version, takes", [("2.10", RELEASED_SIGNATURES[2, 10]),
                                            ("2.11", RELEASED_SIGNATURES[2, 11]), ("2.12", NEWEST_SIGNATURE)])
def test_each_signature_is_recognised(version, takes):
    kernel = VarlenKernel.of(FAKES[version])
    assert (kernel.takes_is_causal, kernel.takes_scale, kernel.takes_window, kernel.takes_enable_gqa) == takes


def test_a_signature_without_causal_control_is_not_used():
    def unknown(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        raise AssertionError("never called")

    assert VarlenKernel.of(unknown) is None


@pytest.mark.parametrize("version", FAKES)
@pytest.mark.parametrize("q_heads, kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("value_head_dim", [16, 12])  # 12: MLA's value head dim differs from the query's
def test_adapter_gives_transformers_causal_attention_on_every_version(version, q_heads, kv_heads, window,
                                                                      value_head_dim):
    kernel = VarlenKernel.of(FAKES[version])
    generator = torch.Generator().manual_seed(0)
    total = sum(LENGTHS)
    query = torch.randn(total, q_heads, 16, generator=generator)
    key = torch.randn(total, kv_heads, 16, generator=generator)
    value = torch.randn(total, kv_heads, value_head_dim, generator=generator)
    cu_seqlens = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    scale = 0.3  # not 1/sqrt(16): 2.10 takes no scale, the adapter must fold it into q
    if window is not None and not kernel.takes_window:
        with pytest.raises(ValueError, match="takes no window_size"):
            kernel(query, key, value, cu_seqlens, max(LENGTHS), scale=scale, window=window)
        return
    out = kernel(query, key, value, cu_seqlens, max(LENGTHS), scale=scale, window=window)
    assert out.shape == (total, q_heads, value_head_dim)
    assert float((out - _expected(query, key, value, window, scale)).abs().max()) < 1e-5


def test_describe_names_what_the_adapter_adds():
    assert "GQA by repeating k/v heads" in VarlenKernel.of(varlen_attn_2_11).describe()
    described = VarlenKernel.of(varlen_attn_2_10).describe()
    assert "scale folded into q" in described and "sliding windows on per-segment SDPA" in described
    assert "repeating" not in VarlenKernel.of(varlen_attn_2_12).describe()


# ---- the attention function on each version, the kernel path taken as on a GPU in bf16 ----------------------------

@pytest.mark.parametrize("version, kernel_takes_the_window", [("2.10", False), ("2.11", True), ("2.12", True)])
def test_sliding_window_model_is_exact_on_every_version(monkeypatch, version, kernel_takes_the_window):
    """A Mistral with an 8-token window, packed, against each example alone on eager. Where the kernel takes no
    window (2.10) the windowed layers run on per-segment SDPA instead; the kernel still runs where no segment
    outgrows the window."""
    windows_asked = []
    fake = FAKES[version]

    def recording(*args, **kwargs):
        windows_asked.append(kwargs.get("window_size"))
        return fake(*args, **kwargs)

    recording.__signature__ = inspect.signature(fake)
    monkeypatch.setattr(torch_varlen, "INSTALLED", VarlenKernel.of(recording))
    # The device boundary: on this CPU the kernel path is taken as it would be for half-precision CUDA tensors.
    monkeypatch.setattr(attention, "_flash_dtype", lambda query, dropout_p: torch.float32)
    from transformers import MistralConfig

    config = MistralConfig(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=128, sliding_window=8, pad_token_id=0)
    source = config_source("mistral-window-8", config, byte_tokenizer())
    model = source.build(attention.VARLEN, seed=0).eval()
    reference = source.build("eager", seed=0).eval()
    lengths = [13, 5, 8]
    ids = torch.randint(3, 300, (1, sum(lengths)), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        alone = torch.cat([reference(input_ids=part[None], use_cache=False).logits[0]
                           for part in torch.split(ids[0], lengths)])
    assert float((packed - alone).abs().max()) < 1e-4
    if kernel_takes_the_window:
        assert windows_asked == [(7, 0)] * config.num_hidden_layers
    else:
        assert windows_asked == []
