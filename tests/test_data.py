"""Reading fine-tuning data as TRL reads it: the files datasets' JSON loader reads, every common schema rendered into
TRL's layouts with the tokens that carry loss, and the ways data can be wrong (one refusal naming the reason and the
line, or a note naming what was skipped). Training on these layouts is in test_sft.py."""

import json

import datasets
import pytest

from demo_core import DemoInputError
from demo_core.data.loading import builtin_records, load
from demo_core.data.readers import read_file
from demo_core.models.sources import byte_tokenizer

BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def write(tmp_path, name: str, content: str | bytes | list) -> str:
    path = tmp_path / name
    if isinstance(content, list):
        content = "\n".join(json.dumps(record) for record in content)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def test_builtins_are_deterministic_by_seed():
    assert builtin_records("flan-like", 5, 3) == builtin_records("flan-like", 5, 3)
    assert builtin_records("flan-like", 5, 3) != builtin_records("flan-like", 5, 4)


def test_flan_like_has_a_heavy_tail(tokenizer):
    stats = load("flan-like", tokenizer, 2000, 0, 4096).stats
    assert 120 <= stats.mean <= 180
    assert stats.p99 >= 6 * stats.p50


def test_orcamath_like_is_long_and_narrow(tokenizer):
    stats = load("orcamath-like", tokenizer, 2000, 0, 4096).stats
    assert 350 <= stats.mean <= 450
    assert stats.std / stats.mean <= 0.2


def test_builtins_are_text_trained_on_every_token_as_in_the_blogs_runs(tokenizer):
    dataset = load("flan-like", tokenizer, 50, 0, 4096)
    assert (dataset.layout, dataset.loss_on) == ("text", "all")
    assert dataset.trained_tokens == dataset.stats.total_tokens - dataset.stats.count  # all but each first token
    assert dataset.shown[0]["text"].endswith("</s>")  # the EOS TRL appends: the model learns to stop


def test_truncation_is_reported(tokenizer):
    dataset = load("orcamath-like", tokenizer, 50, 0, 380)
    assert dataset.stats.max == 380
    assert dataset.stats.truncated > 0
    assert any("truncated" in note for note in dataset.notes)


def test_all_examples_too_long_is_refused(tokenizer):
    with pytest.raises(DemoInputError, match="all 20 examples are longer"):
        load("orcamath-like", tokenizer, 20, 0, 50)


def test_an_answer_cut_off_by_max_length_leaves_its_example_out_with_a_note(tmp_path, tokenizer):
    path = write(tmp_path, "long.jsonl", [{"prompt": "x" * 100, "completion": "y"}, {"prompt": "a", "completion": "b"}])
    dataset = load(path, tokenizer, 2, 0, 50)
    assert dataset.stats.count == 1 and dataset.records == [{"prompt": "a", "completion": "b"}]
    assert any("1 of 2 examples have no token that carries loss" in note for note in dataset.notes)


# ---- files: what datasets.load_dataset("json") reads ------------------------------------------------------------

ROWS = [{"text": "first row"}, {"text": "second row"}]
LINES = "\n".join(json.dumps(row) for row in ROWS)


@pytest.mark.parametrize("name, content", [
    ("bom.jsonl", BOM + LINES.encode()),
    ("lines-saved-as.json", LINES),
    ("UPPER.JSONL", LINES),
    ("upper.JSON", json.dumps(ROWS)),
    ("list.json", json.dumps(ROWS, indent=2)),
    ("bom-list.json", BOM + json.dumps(ROWS).encode()),
    ("pretty-objects.json", "\n".join(json.dumps(row, indent=2) for row in ROWS)),
    ("windows.jsonl", LINES.replace("\n", "\r\n") + "\r\n"),
    ("blank-lines.jsonl", "\n\n".join(json.dumps(row) for row in ROWS) + "\n\n"),
    ("list-in.jsonl", json.dumps(ROWS)),
    ("lines.ndjson", LINES),
    ("strings.json", json.dumps(["first row", "second row"])),
])
def test_reads_every_file_datasets_json_loader_reads(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    theirs = datasets.load_dataset("json", data_files=str(path), split="train").to_list()
    ours = [record.value for record in read_file(path).records]
    assert [row if isinstance(row, dict) else {"text": row} for row in ours] == theirs == ROWS


def test_a_data_object_holding_the_list_is_read_as_its_records(tmp_path, tokenizer):
    path = write(tmp_path, "wrapped.json", json.dumps({"data": ROWS}))
    assert load(path, tokenizer, 2, 0, 512).stats.count == 2


def test_records_are_named_by_their_line_in_lists_too(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps(ROWS, indent=2))
    assert [record.where for record in read_file(path).records] == ["list.json line 2", "list.json line 5"]


def test_a_bad_line_is_skipped_and_named_while_the_rest_trains(tmp_path, tokenizer):
    path = write(tmp_path, "some-bad.jsonl", '{"text": "ok one"}\n{"text": "broken"\n{"text": "ok two"}\n')
    dataset = load(path, tokenizer, 5, 0, 512)
    assert dataset.stats.count == 2
    assert any("skipped 1 of 3 records" in note and "line 2: not valid JSON" in note for note in dataset.notes)


def test_a_file_of_bad_lines_is_refused_naming_the_first(tmp_path, tokenizer):
    path = write(tmp_path, "bad.jsonl", '{oops\n{"text": "broken"\n')
    with pytest.raises(DemoInputError, match="bad.jsonl line 1: not valid JSON"):
        load(path, tokenizer, 2, 0, 512)


def test_a_broken_list_is_refused_with_its_line(tmp_path, tokenizer):
    path = write(tmp_path, "broken.json", '[\n{"text": "a"},\n{"text": "b"\n]')
    with pytest.raises(DemoInputError, match="broken.json line 4: not valid JSON"):
        load(path, tokenizer, 2, 0, 512)


def test_empty_file(tmp_path, tokenizer):
    with pytest.raises(DemoInputError, match="empty"):
        load(write(tmp_path, "empty.jsonl", ""), tokenizer, 1, 0, 512)


def test_more_samples_than_rows_uses_all_and_says_so(tmp_path, tokenizer):
    path = write(tmp_path, "data.jsonl", [{"text": f"row {i}"} for i in range(3)])
    dataset = load(path, tokenizer, 10, 0, 512)
    assert dataset.stats.count == 3
    assert "used all 3" in dataset.notes[0]


# ---- schemas: each rendered as TRL renders its layout (the byte tokenizer's chat template) ----------------------

USER, ASSISTANT, SYSTEM = "<|user|>\n", "<|assistant|>\n", "<|system|>\n"


@pytest.mark.parametrize("record, loss_on, text, loss_text", [
    # TRL's standard formats: text as it is (+ EOS; the first token is never predicted), prompt + completion as
    # they are, nothing inserted between them.
    ({"text": "hello world"}, "auto", "hello world</s>", "ello world</s>"),
    ({"prompt": "2+2=", "completion": "4"}, "auto", "2+2=4</s>", "4</s>"),
    ({"prompt": "2+2=", "completion": "4"}, "all", "2+2=4</s>", "+2=4</s>"),
    # Instruction schemas: a conversational prompt-completion, the completion trained on: everything the template
    # renders after the prompt with its generation prompt, as TRL masks it (here the answer, EOS and a newline).
    ({"instruction": "add", "input": "2 and 3", "output": "5"}, "auto",
     f"{USER}add\n2 and 3\n{ASSISTANT}5</s>\n", "5</s>\n"),
    ({"instruction": "add", "input": "", "output": 5}, "auto", f"{USER}add\n{ASSISTANT}5</s>\n", "5</s>\n"),
    ({"instruction": "Summarize.", "context": "A long text.", "response": "Short.", "category": "summarization"},
     "auto", f"{USER}Summarize.\nA long text.\n{ASSISTANT}Short.</s>\n", "Short.</s>\n"),
    ({"question": "2+2?", "answer": "4\n#### 4"}, "auto", f"{USER}2+2?\n{ASSISTANT}4\n#### 4</s>\n",
     "4\n#### 4</s>\n"),
    ({"inputs": "Translate: hallo", "targets": "hello", "task": "wmt"}, "auto",
     f"{USER}Translate: hallo\n{ASSISTANT}hello</s>\n", "hello</s>\n"),
    ({"system_prompt": "Be brief.", "query": "hi", "response": "hey"}, "auto",
     f"{SYSTEM}Be brief.\n{USER}hi\n{ASSISTANT}hey</s>\n", "hey</s>\n"),
    # Alpaca's history: earlier turns, trained as prompt (completion) or as assistant turns (assistant).
    ({"instruction": "and now?", "output": "b", "history": [["first?", "a"]], "system": "S"}, "auto",
     f"{SYSTEM}S\n{USER}first?\n{ASSISTANT}a</s>\n{USER}and now?\n{ASSISTANT}b</s>\n", "b</s>\n"),
    ({"instruction": "and now?", "output": "b", "history": [["first?", "a"]]}, "assistant",
     f"{USER}first?\n{ASSISTANT}a</s>\n{USER}and now?\n{ASSISTANT}b</s>\n", "a</s>b</s>"),
    # Chat: content parts with the text under any usual key, ShareGPT roles, a record-level system prompt.
    ({"messages": [{"role": "user", "content": [{"type": "text", "content": "hi"}, {"type": "image"}]},
                   {"role": "assistant", "content": [{"type": "text", "value": "hello"}]}]}, "assistant",
     f"{USER}hi\n{ASSISTANT}hello</s>\n", "hello</s>"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}], "system": "S"}, "auto",
     f"{SYSTEM}S\n{USER}hi\n{ASSISTANT}hello</s>\n", f"|system|>\nS\n{USER}hi\n{ASSISTANT}hello</s>\n"),
    ({"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "hello"}]},
     "auto", f"{USER}hi\n{ASSISTANT}hello</s>\n", "hello</s>\n"),
    # OpenAssistant's trees export: the best-ranked thread (rank 0), deleted replies skipped.
    ({"message_tree_id": "t", "prompt": {"role": "prompter", "text": "hi", "replies": [
        {"role": "assistant", "text": "worse", "rank": 1, "replies": []},
        {"role": "assistant", "text": "gone", "rank": 0, "deleted": True, "replies": []},
        {"role": "assistant", "text": "best", "rank": 0, "replies": []}]}}, "assistant",
     f"{USER}hi\n{ASSISTANT}best</s>\n", "best</s>"),
    # LLaMA-Factory's ShareGPT with tools: function_call and observation turns, the tools as a JSON string.
    ({"conversations": [{"from": "human", "value": "2*3?"},
                        {"from": "function_call", "value": '{"name": "mul", "arguments": {"a": 2, "b": 3}}'},
                        {"from": "observation", "value": "6"}, {"from": "gpt", "value": "6."}],
      "tools": '[{"name": "mul", "parameters": {"type": "object"}}]'}, "assistant",
     '<|tools|>\n[{"name": "mul", "parameters": {"type": "object"}}]\n'
     f'{USER}2*3?\n{ASSISTANT}<tool_call>{{"name": "mul", "arguments": {{"a": 2, "b": 3}}}}</tool_call></s>\n'
     f'<|tool|>\n6\n{ASSISTANT}6.</s>\n',
     '<tool_call>{"name": "mul", "arguments": {"a": 2, "b": 3}}</tool_call></s>6.</s>'),
])
def test_each_schema_renders_as_trl_renders_its_layout(tmp_path, tokenizer, record, loss_on, text, loss_text):
    dataset = load(write(tmp_path, "data.jsonl", [record]), tokenizer, 1, 0, 1024, loss_on=loss_on)
    shown = dataset.shown[0]
    assert (shown["text"], shown["loss_text"]) == (text, loss_text)
    assert "".join(shown["text"][start:end] for start, end in shown["loss_spans"]) == loss_text
    assert dataset.trained_tokens == len(tokenizer(loss_text)["input_ids"])


@pytest.mark.parametrize("record, message", [
    ({"prompt": "Q", "chosen": "good", "rejected": "bad"}, "preference data .* keep 'chosen' as 'completion'"),
    ({"chosen": [{"role": "user", "content": "q"}], "rejected": []}, "preference data"),
    ({"prompt": "Q", "completion": "A", "label": False}, "unpaired preference data .*KTO"),
    # LLaMA-Factory's KTO layout: a conversation with a true/false label, whose false answers are not to be learned
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "label": False},
     "unpaired preference data \\('messages' with a true/false 'label', for KTO\\)"),
    ({"messages": [{"role": "user", "content": [{"type": "reasoning", "value": "hm"}, "q"]}]},
     "user message with reasoning or tool-call parts"),
    ({"prompt": "Q"}, "prompt-only data"),
    ({"prompt": "Q", "completions": ["a"], "labels": [True]}, "step-wise supervision"),
    ({"message_id": "m", "parent_id": None, "role": "prompter", "text": "hi"}, "OpenAssistant message"),
    ({"question": "q", "answer": "short", "solution": "long"}, "two answer columns, 'answer' and 'solution'"),
    ({"prompt": "Q", "completion": "A", "system": "S"}, "'system' has text, but prompt/completion text"),
    ({"messages": [{"role": "narrator", "content": "x"}]}, "message 1 has a role that is none of: user"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "words": "x"}]}]}, "part 1 has no text"),
    ({"question": "no answer here", "id": 1}, "no answer for 'question'"),
    ({"title": "only metadata", "id": 1}, "no usable text.*found columns: id, title"),
])
def test_what_cannot_be_fine_tuned_on_is_refused_naming_why_and_where(tmp_path, tokenizer, record, message):
    with pytest.raises(DemoInputError, match=f"data.jsonl line 1: (.* )?{message}"):
        load(write(tmp_path, "data.jsonl", [record]), tokenizer, 1, 0, 512)


def test_one_unusable_record_is_skipped_and_named_not_the_file(tmp_path, tokenizer):
    rows = [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": ""}, {"instruction": "", "output": ""},
            {"instruction": "d", "output": 7}]
    dataset = load(write(tmp_path, "alpaca.jsonl", rows), tokenizer, 10, 0, 512)
    assert dataset.stats.count == 2  # the number 7 is an answer too
    assert any("skipped 2 of 4 records: 1 blank (alpaca.jsonl line 3), 1 that cannot be trained on as they are: "
               "alpaca.jsonl line 2: empty answer ('output')" in note for note in dataset.notes), dataset.notes


def test_text_that_no_layout_reads_is_named_in_a_note(tmp_path, tokenizer):
    rows = [{"instruction": "q", "response": "a", "category": "open_qa"},
            {"messages": [{"role": "user", "content": "q", "reasoning_content": "hm"},
                          {"role": "assistant", "content": [{"type": "image_url"}, "a"]}]}]
    notes = load(write(tmp_path, "dolly.jsonl", rows[:1]), tokenizer, 1, 0, 512).notes
    assert any("not trained on" in note and "'category' (1 records)" in note for note in notes)
    notes = load(write(tmp_path, "chat.jsonl", rows[1:]), tokenizer, 1, 0, 512).notes
    assert any("message key 'reasoning_content'" in note for note in notes)
    assert any("1 content parts without text" in note for note in notes)


def test_a_record_of_another_layout_is_skipped_with_a_note(tmp_path, tokenizer):
    rows = [{"text": "one"}, {"text": "two"}, {"prompt": "p", "completion": "c"}]
    dataset = load(write(tmp_path, "mixed.jsonl", rows), tokenizer, 5, 0, 512)
    assert dataset.layout == "text" and dataset.stats.count == 2
    assert any("line 3: prompt-completion data in a file of text data" in note for note in dataset.notes)


@pytest.mark.parametrize("record, loss_on, message", [
    ({"text": "plain"}, "completion", "loss on 'completion' needs prompt/completion data .*; this data is text data"),
    ({"prompt": "p", "completion": "c"}, "assistant", "loss on 'assistant' needs conversations"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, "completion",
     "loss on 'completion' needs prompt/completion data .*; this data is conversation data"),
])
def test_loss_on_what_the_layout_does_not_have_is_refused(tmp_path, tokenizer, record, loss_on, message):
    with pytest.raises(DemoInputError, match=message):
        load(write(tmp_path, "data.jsonl", [record]), tokenizer, 1, 0, 512, loss_on=loss_on)


def test_a_tokenizer_without_a_chat_template_renders_conversations_with_the_builtin_and_says_so(tmp_path):
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = None
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    dataset = load(write(tmp_path, "chat.jsonl", [record]), tokenizer, 1, 0, 512)
    assert dataset.shown[0]["text"] == f"{USER}q\n{ASSISTANT}a</s>\n"
    assert any("no chat template" in note for note in dataset.notes)


CHAT_WITH_PARTS = {"messages": [  # LLaMA-Factory v1's typed content parts
    {"role": "user", "content": [{"type": "text", "value": "2*3?"}]},
    {"role": "assistant", "content": [{"type": "reasoning", "value": "two threes"},
                                      {"type": "tool_calls", "value": json.dumps([{"name": "mul",
                                                                                   "arguments": {"a": 2, "b": 3}}])}]},
    {"role": "tool", "content": [{"type": "text", "value": "6"}]},
    {"role": "assistant", "content": [{"type": "text", "value": "6."}]}]}


def test_reasoning_and_tool_call_parts_render_where_the_chat_template_puts_them(tmp_path, tokenizer):
    dataset = load(write(tmp_path, "parts.jsonl", [CHAT_WITH_PARTS]), tokenizer, 1, 0, 1024, loss_on="assistant")
    shown = dataset.shown[0]
    assert shown["loss_text"] == ('<think>two threes</think><tool_call>{"name": "mul", "arguments": {"a": 2, "b": 3}}'
                                  '</tool_call></s>6.</s>')  # not "two threes[{...}]" glued into the answer
    assert "two threes" not in shown["text"].split("<think>")[0]


def test_reasoning_a_chat_template_never_renders_is_refused_by_name(tmp_path):
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = tokenizer.chat_template.replace("message.reasoning_content", "message.no_such_field")
    with pytest.raises(DemoInputError, match="reasoning parts .* this tokenizer's chat template never renders"):
        load(write(tmp_path, "parts.jsonl", [CHAT_WITH_PARTS]), tokenizer, 1, 0, 1024)


def test_records_under_one_top_level_key_are_read_as_datasets_reads_them_with_field(tmp_path, tokenizer):
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(3)]
    for wrapper in ({"train": rows}, {"version": "1.0", "data": rows}):
        path = write(tmp_path, "wrapped.json", json.dumps(wrapper, indent=2))
        expected = datasets.load_dataset("json", data_files=path, field=next(k for k in wrapper if k != "version"),
                                         split="train")
        assert [raw.value for raw in read_file(tmp_path / "wrapped.json").records] == expected.to_list()
        assert load(path, tokenizer, 10, 0, 512).stats.count == 3
    with pytest.raises(DemoInputError, match="keeps records under several keys \\(train, test\\)"):
        load(write(tmp_path, "splits.json", json.dumps({"train": rows, "test": rows})), tokenizer, 10, 0, 512)
    one = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert load(write(tmp_path, "one.json", json.dumps(one)), tokenizer, 10, 0, 512).stats.count == 1  # a record
