"""Every user mistake in the catalogue gets one clear DemoInputError (the CLI and the app show its message).

One case each. The checks run through `preview`, which applies exactly the validation a run applies, so no
training is needed to prove them.
"""

import json

import pytest
from transformers import AutoModelForCausalLM, BloomConfig, Gemma2Config

from demo_core import DemoInputError, Limits, RunConfig, preview
from demo_core.models.sources import byte_tokenizer


def refused(message: str, limits: Limits | None = None, **fields):
    config = RunConfig(**{"samples": 16, "steps": 2, "batch_size": 4, **fields})
    with pytest.raises(DemoInputError, match=message):
        preview(config, limits)


def save_tiny_model(folder, config):
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return str(folder)


def jsonl(tmp_path, name, content: str | bytes):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def test_unknown_model_id_offline():
    refused("cannot load model 'nobody/nothing-here'.*offline", model="nobody/nothing-here")


def test_local_path_that_is_not_a_model_folder(tmp_path):
    refused("not a model folder", model=str(tmp_path))


def test_model_without_position_ids_cannot_pack(tmp_path):
    config = BloomConfig(vocab_size=384, hidden_size=64, n_layer=1, n_head=2)
    refused("take no position_ids", model=save_tiny_model(tmp_path, config), collators=("padded", "flatten"))


def test_model_family_without_the_requested_attention(tmp_path):
    config = Gemma2Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    refused("gemma2 has no sdpa", model=save_tiny_model(tmp_path, config), attention="sdpa")


def test_unavailable_attention_flash_on_cpu():
    refused("flash_attention_2 needs a CUDA GPU", attention="flash_attention_2")


def test_malformed_jsonl_line(tmp_path):
    # One bad line among good ones is skipped with a note (test_data.py); a file with no readable line is refused.
    refused("line 2: not valid JSON", dataset=jsonl(tmp_path, "d.jsonl", '\n{oops\n{"text": "broken"\n'))


def test_empty_file(tmp_path):
    refused("is empty", dataset=jsonl(tmp_path, "d.jsonl", ""))


def test_file_without_a_text_column(tmp_path):
    refused("no usable text", dataset=jsonl(tmp_path, "d.jsonl", json.dumps({"title": "q", "id": 1})))


def test_non_text_upload(tmp_path):
    refused("not UTF-8 text", dataset=jsonl(tmp_path, "d.jsonl", bytes(range(256)) * 4))


def test_upload_over_the_size_cap(tmp_path):
    refused("limit is", Limits(max_upload_bytes=100), dataset=jsonl(tmp_path, "d.jsonl", json.dumps({"text": "x" * 500})))


def test_hub_dataset_id_offline():
    refused("cannot load dataset 'nobody/no-dataset'.*offline", dataset="nobody/no-dataset")


@pytest.mark.parametrize("samples", [0, -3])
def test_sample_size_zero_or_negative(samples):
    refused("samples must be between 1 and", samples=samples)


def test_sample_size_larger_than_the_data_says_what_was_used(tmp_path):
    path = jsonl(tmp_path, "d.jsonl", "\n".join(json.dumps({"text": f"row number {i}"}) for i in range(5)))
    stats = preview(RunConfig(dataset=path, samples=50, steps=2, batch_size=2))["dataset_stats"]
    assert stats["count"] == 5
    assert "used all 5" in stats["notes"][0]


def test_steps_zero():
    refused("steps must be between", steps=0)


def test_steps_over_the_cap():
    refused("steps must be between 1 and 30", Limits(max_steps=30), steps=31)


def test_batch_size_zero():
    refused("batch size must be between", batch_size=0)


def test_max_length_below_two():
    refused("max length must be between 2", max_length=1)


def test_examples_all_longer_than_max_length():
    refused("all 16 examples are longer than max length 20", dataset="orcamath-like", max_length=20)


def test_unknown_collator():
    refused("unknown collator 'sorted'", collators=("padded", "sorted"))


@pytest.mark.parametrize("field, value", [("samples", "many"), ("steps", "1e9x"), ("batch_size", None),
                                          ("seed", 1.5), ("learning_rate", "fast")])
def test_non_numeric_fields_through_the_api(field, value):
    refused("must be a (whole )?number", **{field: value})
