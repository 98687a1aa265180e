"""Every decoder-only family packs exactly on varlen, or its run is refused before training with the reason.

Mirrors transformers' padding-free test, `attention_mask_padding_matches_padding_free_with_position_ids` in
tests/test_modeling_common.py: the same examples run left-padded (position_ids counting real tokens) and flattened
into one row (position_ids restarting per example, with and without DataCollatorWithFlattening's flash kwargs),
compared on the real tokens. Two differences, both stricter: the reference is each example alone on eager (so an
error shared by the padded and packed layouts, such as dropped attention sinks, still shows), and it runs in fp32
with tolerance 1e-4 instead of bf16 with bf16's epsilon (7.8e-3). Gradients are compared too.
"""

import re

import pytest
import torch

from demo_core.attention import preflight
from demo_core.attention import varlen as attention
from demo_core.errors import DemoInputError
from demo_core.models.sources import byte_tokenizer, config_source

from model_families import FAMILIES, WINDOW, measure_family

TOLERANCE = 1e-4
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _source(family):
    return config_source(family.name, family.make_config(), byte_tokenizer())


def test_the_table_covers_the_families_the_promise_is_about():
    assert len(FAMILIES) >= 25
    features = " ".join(family.feature for family in FAMILIES)
    for feature in ("sinks", "sliding window", "MLA", "MoE", "NoPE", "partial rotary", "learned absolute", "hybrid",
                    "chunked"):
        assert feature in features, feature


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_family_packs_exactly_or_is_refused_with_its_reason(family):
    source = _source(family)
    try:
        preflight.exact_attention(source, attention.VARLEN, "cpu", ("padded", "flatten"))
    except DemoInputError as refusal:
        assert family.refused is not None, f"{family.name} was refused: {refusal}"
        assert re.search(family.refused, str(refusal)), str(refusal)
        return
    assert family.refused is None, f"{family.name} should have been refused ({family.refused})"
    measured = measure_family(source)
    assert measured["gradient_reaches_weights"] and measured["same_parameters"]
    assert measured["logit_diff"] < TOLERANCE, f"{family.name}: max |Δlogit| {measured['logit_diff']:.2e}"
    assert measured["grad_diff"] < TOLERANCE, f"{family.name}: max |Δgrad| {measured['grad_diff']:.2e}"


def _family(name):
    return next(family for family in FAMILIES if family.name == name)


def _what_varlen_read(monkeypatch, source) -> set[tuple]:
    """(pattern, segment lengths) for every mask varlen read during one forward of a 21-token example."""
    seen = set()
    infer = attention.infer_pattern

    def recording(mask_function, segments, seq_len):
        pattern = infer(mask_function, segments, seq_len)
        seen.add((pattern, tuple(segments.lengths)))
        return pattern

    monkeypatch.setattr(attention, "infer_pattern", recording)
    model = source.build(attention.VARLEN, seed=0).eval()
    ids = torch.randint(3, 300, (1, 2 * WINDOW + 5))
    with torch.no_grad():
        model(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None], use_cache=False)
    return seen


@pytest.mark.parametrize("name, expected", [
    # the window reaches qwen2_moe's attention only through its mask
    ("qwen2_moe", {(attention.Pattern("sliding", WINDOW), (21,)), (attention.CAUSAL, (21,))}),
    ("gemma3_text", {(attention.Pattern("sliding", WINDOW), (21,)), (attention.CAUSAL, (21,))}),
    # chunks of 8 become segments of their own
    ("llama4_text", {(attention.CAUSAL, (WINDOW, WINDOW, 5)), (attention.CAUSAL, (21,))}),
])
def test_windows_and_chunks_that_only_the_mask_knows_reach_varlen(monkeypatch, name, expected):
    assert _what_varlen_read(monkeypatch, _source(_family(name))) == expected


def test_dropping_attention_sinks_would_be_caught_before_training(monkeypatch):
    """The check compares against eager alone, so an error shared by padded and packed rows still shows."""
    source = _source(_family("gpt_oss"))
    real = attention.varlen_attention

    def without_sinks(*args, s_aux=None, **kwargs):
        return real(*args, **kwargs)

    monkeypatch.setitem(attention.AttentionInterface._global_mapping, attention.VARLEN, without_sinks)
    with pytest.raises(DemoInputError, match="differently from the example alone on eager"):
        preflight.check_packing_is_exact(source, attention.VARLEN, "cpu", ("flatten",))
