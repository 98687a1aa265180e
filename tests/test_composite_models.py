"""Checkpoints whose config is a vision-language composite train their language model on text, with its own
weights, or are refused in one sentence naming why (transformers cannot build that language model on its own)."""

import json

import pytest
import torch
from transformers import (
    AutoModelForImageTextToText,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    Mistral3Config,
    MistralConfig,
    PixtralVisionConfig,
    Qwen2_5_VLConfig,
)

from commandline.main import main
from demo_core.models.sources import byte_tokenizer, load_model_source

TEXT = dict(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=2048, pad_token_id=0, bos_token_id=None, eos_token_id=1)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
              patch_size=16)
COMPOSITES = {
    # transformers 5 saves Mistral 3 as "language_model.model.*" with a head tied at the top level
    "mistral3": lambda: Mistral3Config(text_config=MistralConfig(**TEXT).to_dict(),
                                       vision_config=PixtralVisionConfig(**VISION).to_dict()),
    "llava": lambda: LlavaConfig(text_config=LlamaConfig(**TEXT, tie_word_embeddings=False).to_dict(),
                                 vision_config=CLIPVisionConfig(**VISION).to_dict()),
}


def _composite_folder(folder, name: str) -> str:
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(COMPOSITES[name]()).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_a_vision_language_checkpoint_trains_its_language_model_with_its_own_weights(tmp_path, name, capsys):
    folder = _composite_folder(tmp_path / name, name)
    composite = AutoModelForImageTextToText.from_pretrained(folder)
    source = load_model_source(folder)
    language_model = source.build("sdpa", seed=0)
    assert type(language_model).__name__.endswith("ForCausalLM")
    built = language_model.state_dict()
    theirs = {key: value for key, value in composite.state_dict().items() if "vision" not in key
              and "projector" not in key}
    assert len(built) >= len({k for k in theirs if "rotary" not in k}) - 1
    # every weight of the language model is the checkpoint's own, none freshly drawn
    for key, value in built.items():
        match = [other for other in theirs if other.endswith(key.removeprefix("model."))]
        assert match and torch.equal(value, theirs[match[0]]), key
    document = tmp_path / "run.json"
    assert main(["compare", "--model", folder, "--samples", "8", "--steps", "2", "--batch-size", "4",
                 "--max-length", "128", "--collators", "padded,flatten", "--json", str(document)]) == 0
    run = json.loads(document.read_text())
    assert run["comparison"]["flatten"]["max_abs_loss_diff_vs_padded"] < 1e-4


def test_a_vision_language_checkpoint_whose_language_model_has_no_causal_lm_is_refused_in_one_sentence(tmp_path,
                                                                                                         capsys):
    folder = tmp_path / "qwen2_5_vl"
    Qwen2_5_VLConfig(text_config={**TEXT, "model_type": "qwen2_5_vl_text"}).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    assert main(["compare", "--model", str(folder), "--samples", "8", "--steps", "2"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "Traceback" not in error
    assert error.startswith("error: qwen2_5_vl is a vision-language model whose language model (Qwen2_5_VLTextConfig) "
                            "transformers builds only inside it")
