"""Fine-tuning data trained the way TRL trains it: public formats as files, loss masks that every collator keeps,
the same losses through Trainer and TRL's SFTTrainer, and gradient accumulation that changes nothing but the passes.

The files mirror public datasets' layouts (field names, nesting, JSON vs JSON Lines); the texts are short stand-ins.
TRL's SFTTrainer collators get the records, not our tokens: TRL renders, tokenizes and masks them itself
(`completion_only_loss` / `assistant_only_loss`), so equal per-step losses prove our masks are TRL's.
"""

import json
from pathlib import Path

import pytest
import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from demo_core import RunConfig, preview, run_comparison
from demo_core.data.loading import load
from demo_core.models.sources import byte_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOLERANCE = 1e-4  # as test_loss_parity.py: float rounding is ~1e-6 in fp32

ALPACA = [  # tatsu-lab/stanford_alpaca alpaca_data.json: a JSON list; `input` often empty
    {"instruction": "Give three tips for staying healthy.", "input": "",
     "output": "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Sleep well."},
    {"instruction": "Translate the sentence into French.", "input": "Where is the station?",
     "output": "Où est la gare ?"},
    {"instruction": "Add the numbers.", "input": "12 and 30", "output": 42},  # a number as the answer
]
DOLLY = [  # databricks/databricks-dolly-15k: JSON Lines with a context column and a category
    {"instruction": "When was the tower finished?", "context": "The tower was finished in 1889 for the fair.",
     "response": "In 1889.", "category": "closed_qa"},
    {"instruction": "Name a primary colour.", "context": "", "response": "Red.", "category": "open_qa"},
]
GSM8K = [  # openai/gsm8k (main): question / answer with the final number after ####
    {"question": "Tom has 3 apples and buys 2 more. How many does he have?",
     "answer": "He has 3 + 2 = <<3+2=5>>5 apples.\n#### 5"},
]
SHAREGPT = [  # ShareGPT (Vicuna's export): a JSON list, `conversations` of from/value, human/gpt
    {"id": "a1", "conversations": [{"from": "human", "value": "Hi!"},
                                   {"from": "gpt", "value": "Hello! How can I help?"},
                                   {"from": "human", "value": "Name a fruit."}, {"from": "gpt", "value": "A pear."}]},
    {"id": "a2", "conversations": [{"from": "system", "value": "Answer in one word."},
                                   {"from": "human", "value": "Capital of Peru?"}, {"from": "gpt", "value": "Lima."}]},
]
LLAMA_FACTORY_ALPACA = [  # hiyouga/LLaMA-Factory data/README.md: alpaca with system and history
    {"instruction": "And in Spanish?", "input": "", "output": "Hola.", "system": "You are a translator.",
     "history": [["Say hello in French.", "Bonjour."]]},
]
LLAMA_FACTORY_TOOLS = [  # LLaMA-Factory glaive_toolcall_en_demo.json: sharegpt with function_call / observation
    {"conversations": [
        {"from": "human", "value": "What is 6 times 7?"},
        {"from": "function_call", "value": json.dumps({"name": "multiply", "arguments": {"a": 6, "b": 7}})},
        {"from": "observation", "value": json.dumps({"result": 42})},
        {"from": "gpt", "value": "6 times 7 is 42."}],
     "tools": json.dumps([{"name": "multiply", "description": "Multiply two numbers",
                           "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                          "b": {"type": "number"}}}}])},
]
TRL_PROMPT_COMPLETION = [  # huggingface.co/docs/trl/dataset_formats: standard prompt-completion
    {"prompt": "The sky is", "completion": " blue."},
    {"prompt": "Two plus two is", "completion": " four."},
]
TRL_CONVERSATIONAL_PROMPT_COMPLETION = [  # the same page: conversational prompt-completion
    {"prompt": [{"role": "user", "content": "What color is the sky?"}],
     "completion": [{"role": "assistant", "content": "It is blue."}]},
]
OPENAI_CHAT = [  # OpenAI's chat fine-tuning format: messages, tool calls with JSON-string arguments, tools
    {"messages": [{"role": "system", "content": "You check the weather."},
                  {"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                      "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "Snow, -3 C"},
                  {"role": "assistant", "content": "Snowy and -3 C in Oslo."}],
     "tools": [{"type": "function", "function": {"name": "get_weather",
                                                  "parameters": {"type": "object",
                                                                 "properties": {"city": {"type": "string"}}}}}]},
]
OASST_TREES = [  # OpenAssistant/oasst1 2023-04-12_oasst_ready.trees.jsonl: a prompt node with ranked replies
    {"message_tree_id": "t1", "tree_state": "ready_for_export", "prompt": {
        "message_id": "m1", "role": "prompter", "text": "What is a haiku?", "lang": "en", "replies": [
            {"message_id": "m2", "role": "assistant", "text": "A short poem.", "rank": 1, "replies": []},
            {"message_id": "m3", "role": "assistant", "text": "A 5-7-5 syllable poem.", "rank": 0, "replies": [
                {"message_id": "m4", "role": "prompter", "text": "Write one.", "rank": 0, "replies": [
                    {"message_id": "m5", "role": "assistant", "text": "Old pond, a frog jumps.", "rank": 0,
                     "replies": []}]}]}]}},
]
ULTRACHAT = [  # HuggingFaceH4/ultrachat_200k: prompt, prompt_id and the whole conversation in messages
    {"prompt": "Name a planet.", "prompt_id": "p1",
     "messages": [{"role": "user", "content": "Name a planet."}, {"role": "assistant", "content": "Mars."}]},
]
# The public layouts by what TRL trains of them: the answer of a prompt-completion record, the assistant's turns of a
# conversation (the parity tests, the take-home scripts' tests and benchmarks/sft_parity.py share these groups).
PROMPT_COMPLETION_RECORDS = ALPACA + DOLLY + GSM8K + LLAMA_FACTORY_ALPACA
CONVERSATION_RECORDS = SHAREGPT + LLAMA_FACTORY_TOOLS + OPENAI_CHAT + OASST_TREES


def write(folder: Path, name: str, rows: list, as_list: bool = False) -> str:
    path = folder / name
    path.write_text(json.dumps(rows, indent=2, ensure_ascii=False) if as_list else
                    "\n".join(json.dumps(row, ensure_ascii=False) for row in rows))
    return str(path)


@pytest.mark.parametrize("name, rows, as_list, layout, loss_on, shows, trains", [
    ("alpaca_data.json", ALPACA, True, "conversational prompt-completion", "completion",
     "<|user|>\nTranslate the sentence into French.\nWhere is the station?\n", "Où est la gare ?</s>\n"),
    ("databricks-dolly-15k.jsonl", DOLLY, False, "conversational prompt-completion", "completion",
     "When was the tower finished?\nThe tower was finished in 1889", "In 1889.</s>\n"),
    ("gsm8k-train.jsonl", GSM8K, False, "conversational prompt-completion", "completion",
     "<|user|>\nTom has 3 apples", "#### 5</s>\n"),
    ("sharegpt.json", SHAREGPT, True, "conversation", "all", "<|user|>\nHi!\n<|assistant|>\nHello!", "A pear.</s>"),
    ("alpaca_en_demo.json", LLAMA_FACTORY_ALPACA, True, "conversational prompt-completion", "completion",
     "<|system|>\nYou are a translator.\n<|user|>\nSay hello in French.\n<|assistant|>\nBonjour.</s>\n", "Hola.</s>\n"),
    ("glaive_toolcall_en_demo.json", LLAMA_FACTORY_TOOLS, True, "conversation", "all",
     '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call></s>', "is 42.</s>"),
    ("trl-prompt-completion.jsonl", TRL_PROMPT_COMPLETION, False, "prompt-completion", "completion",
     "The sky is blue.</s>", " blue.</s>"),
    ("trl-conversational.jsonl", TRL_CONVERSATIONAL_PROMPT_COMPLETION, False, "conversational prompt-completion",
     "completion", "<|user|>\nWhat color is the sky?\n<|assistant|>\n", "It is blue.</s>\n"),
    ("openai-chat.jsonl", OPENAI_CHAT, False, "conversation", "all",
     '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>', "-3 C in Oslo.</s>"),
    ("oasst_ready.trees.jsonl", OASST_TREES, False, "conversation", "all",
     "A 5-7-5 syllable poem.</s>\n<|user|>\nWrite one.", "Old pond, a frog jumps.</s>"),
    ("ultrachat.jsonl", ULTRACHAT, False, "conversation", "all", "<|user|>\nName a planet.", "Mars.</s>"),
])
def test_each_public_format_shows_what_it_trains(tmp_path, name, rows, as_list, layout, loss_on, shows, trains):
    dataset = load(write(tmp_path, name, rows, as_list), byte_tokenizer(), len(rows), 0, 1024)
    assert (dataset.layout, dataset.loss_on, dataset.stats.count) == (layout, loss_on, len(rows))
    texts = [(shown["text"], shown["loss_text"]) for shown in dataset.shown]
    # (a template's newline after the end of a turn is trained when the whole conversation is)
    assert any(shows in text and loss.removesuffix("\n").endswith(trains.removesuffix("\n")) for text, loss in texts)
    if name == "ultrachat.jsonl":  # its `prompt` repeats the first user turn: said, not silently dropped
        assert any("'prompt' (1 records)" in note for note in dataset.notes)


def _run(dataset: str, **settings) -> dict:
    config = RunConfig(**{"model": "tiny-llama", "dataset": dataset, "samples": 24, "steps": 6, "batch_size": 4,
                          "max_length": 256, "device": "cpu", "precision": "fp32",
                          "collators": ("padded", "flatten", "trl-padding-free"), **settings})
    return run_comparison(config).to_dict()


def _max_loss_differences(document: dict) -> dict[str, float]:
    padded = document["results"][0]
    return {result["collator"]: max(abs(a - b) for a, b in zip(padded["losses"], result["losses"]))
            for result in document["results"][1:]}


@pytest.mark.parametrize("rows, loss_on", [
    (PROMPT_COMPLETION_RECORDS, "completion"),  # conversational prompt-completion
    (TRL_PROMPT_COMPLETION, "completion"),  # prompt + completion as they are
    (CONVERSATION_RECORDS, "assistant"),
])
def test_masked_losses_match_padding_through_trainer_and_sftrainer(tmp_path, rows, loss_on):
    document = _run(write(tmp_path, "data.jsonl", rows * 4), loss_on=loss_on)
    padded = document["results"][0]
    assert document["config"]["resolved_loss_on"] == loss_on
    for result in document["results"]:
        # TRL's own masks count the same tokens as ours, step by step, and fewer than the tokens computed
        assert result["step_trained_tokens"] == padded["step_trained_tokens"], result["collator"]
        assert result["step_real_tokens"] == padded["step_real_tokens"], result["collator"]
    assert 0 < padded["trained_tokens"] < padded["real_tokens"] / 2
    assert max(_max_loss_differences(document).values()) < TOLERANCE, _max_loss_differences(document)
    assert padded["losses"][-1] < padded["losses"][0]  # it trained: equal losses are not two frozen models


def test_gradient_accumulation_of_4_micro_batches_equals_one_batch_of_8(tmp_path):
    path = write(tmp_path, "alpaca.jsonl", (ALPACA + DOLLY + GSM8K) * 6)
    # Hugging Face's batch semantics: accumulation multiplies the per-device micro-batch
    one, four = (_run(path, batch_size=8 // n, grad_accum=n) for n in (1, 4))
    assert four["config"]["grad_accum"] == 4
    for whole, accumulated in zip(one["results"], four["results"]):
        name = whole["collator"]
        assert accumulated["step_examples"] == whole["step_examples"] == [8] * 6, name
        assert accumulated["step_trained_tokens"] == whole["step_trained_tokens"], name
        differences = [abs(a - b) for a, b in zip(whole["losses"], accumulated["losses"])]
        assert max(differences) < 1e-5, (name, differences)
    padded_one, padded_four = one["results"][0], four["results"][0]
    assert padded_four["padded_slots"] < padded_one["padded_slots"]  # micro-batches of 2 pad less than batches of 8
    assert four["ideal_speedup"] < one["ideal_speedup"]


def test_preview_shows_the_masked_prompt_in_every_batch_and_the_examples_as_trained(tmp_path):
    shown = preview(RunConfig(dataset=write(tmp_path, "dolly.jsonl", DOLLY * 4), samples=8, batch_size=4,
                              collators=("padded", "flatten", "bfd")))
    stats = shown["dataset_stats"]
    assert stats["loss_on"] == "completion" and stats["examples"][0]["loss_text"] in stats["examples"][0]["text"]
    for name, batch in shown["batches"].items():
        labels = [label for row in batch["labels"] for label in row]
        assert labels.count(-100) > len(labels) / 2, name  # prompts and chat headers carry no loss
        assert batch["trained_tokens"] == sum(label != -100 for row in batch["labels"] for label in row[1:]), name


# ---- a real-style tokenizer: byte-level BPE with Qwen2.5's chat template, as TRL ships it ------------------------

QWEN2_5_TEMPLATE = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()


@pytest.fixture(scope="module")
def qwen_style_model(tmp_path_factory) -> str:
    """A folder with a byte-level BPE tokenizer trained on a few lines (~0.2 s), Qwen2.5's special tokens and chat
    template (no {% generation %} markers: TRL swaps in its training variant for assistant-only loss), and a tiny
    random-init Llama whose vocabulary fits it."""
    folder = tmp_path_factory.mktemp("qwen-style")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    lines = [json.dumps(row) for row in SHAREGPT + LLAMA_FACTORY_TOOLS + OPENAI_CHAT + ALPACA + DOLLY] * 20
    backend.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = QWEN2_5_TEMPLATE
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def test_a_real_template_trains_the_assistant_turns_trl_marks(tmp_path, qwen_style_model):
    path = write(tmp_path, "chat.jsonl", (SHAREGPT + OPENAI_CHAT) * 4)
    shown = preview(RunConfig(model=qwen_style_model, dataset=path, samples=12, batch_size=4, loss_on="assistant",
                              collators=("padded",)))["dataset_stats"]["examples"]
    # TRL's Qwen2.5 training template: each assistant turn from its newline to <|im_end|>\n is trained.
    assert shown[0]["text"].startswith("<|im_start|>system\nYou are Qwen")
    assert all(shown_example["loss_text"].endswith("<|im_end|>\n") for shown_example in shown)
    document = _run(path, model=qwen_style_model, loss_on="assistant", samples=12, steps=4)
    padded = document["results"][0]
    assert all(r["step_trained_tokens"] == padded["step_trained_tokens"] for r in document["results"])
    assert max(_max_loss_differences(document).values()) < TOLERANCE, _max_loss_differences(document)
