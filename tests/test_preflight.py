"""Refusals happen before training, as one line and exit 2; runs that pass the pre-flight check finish cleanly.

Models come as hub-style local folders (config.json, weights, tokenizer), as a new user would bring them.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from transformers import AttentionInterface, Gemma2Config, MistralConfig, NemotronHConfig, Starcoder2Config

from commandline.main import main
from demo_core import RunConfig, run_comparison
from demo_core.attention import preflight
from demo_core.attention.contamination import contamination_check
from demo_core.errors import DemoInputError
from demo_core.models.sources import byte_tokenizer, config_source, load_model_source

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SMALL = dict(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, max_position_embeddings=2048, pad_token_id=0, bos_token_id=None, eos_token_id=1)


def _model_folder(path, config) -> str:
    source = config_source(config.model_type, config, byte_tokenizer())
    source.build("eager", seed=0).save_pretrained(path)
    source.tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def hybrid_folder(tmp_path_factory):
    """A Mamba-2 hybrid whose mixer models/hybrid_mixers.py does not cover (NemotronH's): transformers' PyTorch
    fallback raises on a packed row's keys. (The hybrids it covers pack exactly: tests/test_hybrid_packing.py.)"""
    config = NemotronHConfig(**SMALL, hybrid_override_pattern="M*", mamba_num_heads=8, mamba_head_dim=16, n_groups=1,
                             ssm_state_size=8, chunk_size=16, head_dim=16)
    return _model_folder(tmp_path_factory.mktemp("nemotron_h"), config)


@pytest.fixture(scope="module")
def window_folder(tmp_path_factory):
    """A StarCoder2 whose 64-token window is shorter than flan-like's examples (and than any naive-concat row). (A
    Mistral folder would do as well, but transformers maps its tokenizer to Llama's, which a byte tokenizer's files
    cannot build.)"""
    return _model_folder(tmp_path_factory.mktemp("starcoder2"), Starcoder2Config(**SMALL, sliding_window=64))


def _compare(model, *extra) -> list[str]:
    return ["compare", "--model", model, "--samples", "8", "--steps", "2", "--batch-size", "4", "--max-length",
            "128", *extra]


@pytest.mark.parametrize("attention, reason", [
    # transformers 5.24 raises inside the convolution without causal-conv1d
    ("varlen", "packing check for nemotron_h on varlen .cpu.: .*packed row"),
    ("sdpa", "packing check for nemotron_h on sdpa .cpu.: .*packed row"),
    ("auto", "no attention path computes nemotron_h exactly on cpu with these collators: on varlen, sdpa and eager, "),
])
def test_a_hybrid_model_folder_is_refused_before_training(capsys, hybrid_folder, attention, reason):
    assert main(_compare(hybrid_folder, "--collators", "padded,flatten", "--attention", attention)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert re.search(reason, lines[0]), lines[0]
    # The reason once, whatever the number of paths that share it, and only a remedy that works: every path failed
    # on the packed row, so another attention would not help; padded collators do (the next test trains them).
    assert lines[0].count("packed row") == 1 and "--attention" not in lines[0]
    assert lines[0].endswith("run it with padded collators only (padded, padded-grouped), which keep each example "
                             "in its own row")
    assert len(lines[0]) < 500


def test_the_same_hybrid_trains_padded(capsys, hybrid_folder, tmp_path):
    """Padding keeps each example in its own row: nothing to refuse, and the contamination report (which needs a
    packed row this model cannot compute here) is left empty instead of failing the finished run."""
    document_path = tmp_path / "run.json"
    assert main(_compare(hybrid_folder, "--collators", "padded", "--attention", "sdpa", "--json",
                         str(document_path))) == 0
    document = json.loads(document_path.read_text())
    assert [result["collator"] for result in document["results"]] == ["padded"] and not document["partial"]
    assert document["contamination"] == []


def test_soft_capping_model_folder_is_refused_on_varlen_with_its_reason(capsys, tmp_path):
    folder = _model_folder(tmp_path, Gemma2Config(**SMALL, head_dim=16))
    assert main(_compare(folder, "--collators", "padded,flatten", "--attention", "varlen")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "soft-capping" in err
    assert err.endswith("--attention eager computes it exactly")  # tried before it is suggested


def test_refusal_from_the_real_entry_point_has_no_traceback(hybrid_folder):
    done = subprocess.run([sys.executable, "-m", "demo_core", *_compare(hybrid_folder, "--collators", "flatten")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2
    assert done.stderr.startswith("error: no attention path computes nemotron_h exactly") and "Traceback" not in done.stderr


def test_sliding_window_model_finishes_with_its_contamination_report(window_folder):
    """The run that used to end in `error: a segment of 460 tokens exceeds the model's sliding window 64`."""
    config = RunConfig(model=window_folder, samples=8, collators=("padded", "flatten"), steps=2, batch_size=4,
                       max_length=256, attention="varlen")
    document = run_comparison(config).to_dict()
    assert document["comparison"]["flatten"]["max_abs_loss_diff_vs_padded"] < 1e-4
    rows = document["contamination"]
    assert rows and sum(row["length"] for row in rows) > 64
    assert max(row["flatten_max_abs_logit_diff"] for row in rows) < 1e-4
    assert min(row["naive_concat_max_abs_logit_diff"] for row in rows[1:]) > 0.01


def test_contamination_check_cuts_the_naive_row_to_the_model_positions():
    """tiny-gpt2 learns 2048 positions: eight 1024-token examples cannot be one naive-concat row."""
    source = load_model_source("tiny-gpt2")
    examples = [[3 + i % 290 for i in range(1024)]] * 8
    rows, not_checked = contamination_check(source, "sdpa", examples, "cpu", seed=0)
    assert [row["length"] for row in rows] == [1024, 1024] and not_checked is None


def test_a_model_that_crashes_in_the_contamination_check_leaves_it_empty_and_says_why(monkeypatch):
    source = load_model_source("tiny-llama")

    def broken(*args, **kwargs):
        raise RuntimeError("the model broke")

    monkeypatch.setattr("demo_core.attention.contamination._rows", broken)
    rows, not_checked = contamination_check(source, "sdpa", [[5, 6, 7], [8, 9]], "cpu", seed=0)
    assert rows == [] and "could not compute" in not_checked and "RuntimeError" in not_checked


def test_preflight_results_are_cached_per_model_path_and_layout(monkeypatch):
    source = load_model_source("tiny-qwen2")
    preflight.check_packing_is_exact(source, "varlen", "cpu", ("flatten",))
    monkeypatch.setattr(preflight, "measure_packing", lambda *args: pytest.fail("measured twice"))
    preflight.check_packing_is_exact(source, "varlen", "cpu", ("flatten",))
    with pytest.raises(pytest.fail.Exception):
        preflight.check_packing_is_exact(source, "varlen", "cpu", ("padded",))


def test_a_model_that_never_calls_varlen_is_refused(monkeypatch):
    """If a model's layers skip the attention interface, `--attention varlen` must not report numbers it never ran."""
    source = config_source("llama", load_model_source("tiny-llama").config, byte_tokenizer())
    monkeypatch.setitem(AttentionInterface._global_mapping, "varlen",
                        lambda module, q, k, v, mask, **kwargs: (
                            torch.nn.functional.scaled_dot_product_attention(
                                q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
                            ).transpose(1, 2), None))
    with pytest.raises(DemoInputError, match="never called varlen attention"):
        preflight.check_packing_is_exact(source, "varlen", "cpu", ("padded",))


def test_examples_outgrow_short_windows():
    window_64 = config_source("mistral", MistralConfig(**SMALL, sliding_window=64), byte_tokenizer())
    window_4096 = config_source("mistral", MistralConfig(**SMALL, sliding_window=4096), byte_tokenizer())
    assert preflight.example_lengths(window_64)[0] == 67
    assert preflight.example_lengths(window_4096)[0] == 13  # long windows: read from the mask on every forward
