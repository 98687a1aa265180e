"""Built-in length profiles and every file schema, including the ways a file can be wrong."""

import json

import pytest

from demo_core import DemoInputError
from demo_core.data import builtin_texts, load
from demo_core.models import byte_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def test_builtins_are_deterministic_by_seed():
    assert builtin_texts("flan-like", 5, 3) == builtin_texts("flan-like", 5, 3)
    assert builtin_texts("flan-like", 5, 3) != builtin_texts("flan-like", 5, 4)


def test_flan_like_has_a_heavy_tail(tokenizer):
    stats = load("flan-like", tokenizer, 2000, 0, 4096).stats
    assert 120 <= stats.mean <= 180
    assert stats.p99 >= 6 * stats.p50


def test_orcamath_like_is_long_and_narrow(tokenizer):
    stats = load("orcamath-like", tokenizer, 2000, 0, 4096).stats
    assert 350 <= stats.mean <= 450
    assert stats.std / stats.mean <= 0.2


def test_truncation_is_reported(tokenizer):
    dataset = load("orcamath-like", tokenizer, 50, 0, 380)
    assert dataset.stats.max == 380
    assert dataset.stats.truncated > 0
    assert any("truncated" in note for note in dataset.notes)


def test_all_examples_too_long_is_refused(tokenizer):
    with pytest.raises(DemoInputError, match="all 20 examples are longer"):
        load("orcamath-like", tokenizer, 20, 0, 50)


@pytest.mark.parametrize("record, expected", [
    ({"text": "hello world"}, "hello world"),
    ({"prompt": "2+2?", "response": "4"}, "2+2?\n4"),
    ({"instruction": "say hi", "output": "hi"}, "say hi\nhi"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
     "user: hi\nassistant: hello"),
    # The blog's datasets as the hub has them: OrcaMath's question/answer, FLAN's inputs/targets.
    ({"question": "2+2?", "answer": "4"}, "2+2?\n4"),
    ({"inputs": "Translate: hallo", "targets": "hello", "task": "wmt"}, "Translate: hallo\nhello"),
    # Alpaca keeps its optional input; an empty one adds nothing.
    ({"instruction": "add", "input": "2 and 3", "output": "5"}, "add\n2 and 3\n5"),
    ({"instruction": "say hi", "input": "", "output": "hi"}, "say hi\nhi"),
    ({"prompt": "2+2?", "completion": ""}, "2+2?\n"),
    # ShareGPT conversations, TRL's conversational prompt/completion, content given as text parts.
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
     "human: hi\ngpt: hello"),
    ({"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "hello"}]},
     "user: hi\nassistant: hello"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}]}, "user: hi"),
])
def test_jsonl_schemas(tmp_path, tokenizer, record, expected):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(record) + "\n")
    dataset = load(str(path), tokenizer, 1, 0, 512)
    assert dataset.examples == [tokenizer(expected)["input_ids"]]


def test_json_list_file(tmp_path, tokenizer):
    path = tmp_path / "data.json"
    path.write_text(json.dumps([{"text": f"example number {i}"} for i in range(10)]))
    dataset = load(str(path), tokenizer, 4, 0, 512)
    assert dataset.stats.count == 4


def test_more_samples_than_rows_uses_all_and_says_so(tmp_path, tokenizer):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"row {i}"}) for i in range(3)))
    dataset = load(str(path), tokenizer, 10, 0, 512)
    assert dataset.stats.count == 3
    assert "used all 3" in dataset.notes[0]


def test_malformed_line_is_named(tmp_path, tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "broken"\n')
    with pytest.raises(DemoInputError, match="line 2"):
        load(str(path), tokenizer, 2, 0, 512)


def test_missing_column_is_named(tmp_path, tokenizer):
    path = tmp_path / "cols.jsonl"
    path.write_text(json.dumps({"question": "no text here"}) + "\n")
    with pytest.raises(DemoInputError, match="no usable text.*question"):
        load(str(path), tokenizer, 1, 0, 512)


def test_empty_file(tmp_path, tokenizer):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DemoInputError, match="empty"):
        load(str(path), tokenizer, 1, 0, 512)
