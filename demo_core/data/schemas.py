"""One record of a fine-tuning file, read as TRL reads it: one of TRL's four SFT layouts, or a problem that says
why not.

TRL's layouts (https://huggingface.co/docs/trl/dataset_formats), the only shapes that leave this module:
- `text`: `{"text": str}` (language modeling, standard);
- `prompt-completion`: `{"prompt": str, "completion": str}`, trained as prompt + completion exactly (TRL
  concatenates them as they are, nothing inserted);
- `conversation`: `{"messages": [{"role", "content", ...}], "tools"?}` (language modeling, conversational);
- `conversational prompt-completion`: `{"prompt": [messages], "completion": [messages], "tools"?}`.

The common schemas map onto them (README: "Data formats"):
- chat `messages` / ShareGPT `conversations` (`from`/`value`, roles human/gpt/observation/function_call), content as
  a string or as parts with the text under `text`, `content` or `value`; a record-level `system`/`system_prompt`
  becomes the system turn, `tools` (a list or a JSON string) the tool schemas; OpenAssistant's trees export (a
  `prompt` node with `replies`) becomes the conversation along the best-ranked replies;
- instruction schemas become a conversational prompt-completion: Alpaca `instruction` + `input`, Dolly `instruction`
  + `context`, GSM8K / OrcaMath `question`, FLAN `inputs`, MetaMath `query`, MATH `problem`, ... joined with a newline
  into the user turn (as LLaMA-Factory's Alpaca converter joins instruction and input), after the `system` turn and
  the earlier turns of Alpaca-style `history` ([[instruction, response], ...]); the one answer column (`output`,
  `response`, `completion`, `answer`, `targets`, `solution`) is the assistant turn.
A number where text belongs is read as its text. Data for other trainers (preference pairs, KTO's labelled
completions, prompt-only or step-wise data) is refused with what it is and how to turn it into fine-tuning data.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

TEXT, PROMPT_COMPLETION = "text", "prompt-completion"
CONVERSATION, CHAT_PROMPT_COMPLETION = "conversation", "conversational prompt-completion"
LAYOUTS = (TEXT, PROMPT_COMPLETION, CONVERSATION, CHAT_PROMPT_COMPLETION)
CONVERSATIONAL = (CONVERSATION, CHAT_PROMPT_COMPLETION)

CHAT_COLUMNS = ("messages", "conversations")
SYSTEM_COLUMNS = ("system", "system_prompt")
# Every prompt-like column present is kept, in this order, joined by newlines; then exactly one answer column.
PROMPT_COLUMNS = ("instruction", "prompt", "question", "query", "problem", "inputs", "input", "context")
ANSWER_COLUMNS = ("output", "response", "completion", "answer", "targets", "solution")
HISTORY_COLUMN = "history"
# Columns that make an object a record (and not a file's wrapper around its records: readers.py)
RECORD_COLUMNS = (*CHAT_COLUMNS, *PROMPT_COLUMNS, *ANSWER_COLUMNS, "text", "chosen", "rejected")

ROLE_KEYS = ("role", "from")
CONTENT_KEYS = ("content", "value", "text")
PART_TEXT_KEYS = ("text", "content", "value")
NON_TEXT_PARTS = ("image", "image_url", "input_image", "audio", "input_audio", "video", "file")
# Typed parts that are not the message's text (LLaMA-Factory v1's content parts: {"type": ..., "value": ...}): the
# reasoning goes where chat templates read it (`reasoning_content`, as Qwen3's and DeepSeek-R1's templates do), the
# tool calls into the message's `tool_calls`; glued into the text they would train on a run-on string.
REASONING_PART, TOOL_CALLS_PARTS = "reasoning", ("tool_calls", "tool_call")
ROLES = {"user": "user", "human": "user", "prompter": "user",
         "assistant": "assistant", "gpt": "assistant", "model": "assistant", "bot": "assistant",
         "system": "system", "tool": "tool", "observation": "tool", "function": "tool", "ipython": "tool"}
TOOL_CALL_ROLE = "function_call"  # LLaMA-Factory's ShareGPT: the value is {"name", "arguments"} as JSON
MESSAGE_KEYS_KEPT = ("name", "tool_call_id")


class RecordProblem(Exception):
    """A record that cannot be trained on as it is: it is skipped and named in a note (or, when no record of the
    file can be trained on, the file is refused with this message)."""


class BlankRecord(RecordProblem):
    """A record without any text: skipped and counted."""


class OtherTrainersData(RecordProblem):
    """Preference, KTO, prompt-only or step-wise data: formats of other trainers, not supervised fine-tuning."""


@dataclasses.dataclass
class SFTRecord:
    layout: str
    fields: dict  # TRL's columns for the layout (see the module docstring)
    unused: tuple[str, ...] = ()  # columns (or message keys) holding text that this layout does not train on
    left_out_parts: int = 0  # content parts without text (images, audio, ...): the models here read text only


@dataclasses.dataclass
class _Seen:
    """What reading one record left aside, for the notes."""

    used: set[str] = dataclasses.field(default_factory=set)
    unused_message_keys: set[str] = dataclasses.field(default_factory=set)
    left_out_parts: int = 0


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


def _as_text(value: Any, what: str) -> str:
    """Text from a string, or from a number (an answer of 42 is the text "42"); None reads as no text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise RecordProblem(f"{what} holds {_json_type(value)}, not text")


def _filled(record: dict, column: str) -> bool:
    return column in record and bool(_as_text(record[column], f"'{column}'").strip())


def _holds_something(value: Any) -> bool:
    return bool(value.strip()) if isinstance(value, str) else value not in (None, [], {})


def _first(keys: tuple[str, ...], mapping: dict) -> str | None:
    return next((key for key in keys if key in mapping), None)


# ---- messages ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Content:
    text: str
    reasoning: str = ""
    tool_calls: list = dataclasses.field(default_factory=list)


def _typed_part(part: dict, what: str, content: _Content) -> bool:
    """A reasoning or tool-call part into its own place in `content`; False for any other part."""
    kind = part.get("type")
    if kind == REASONING_PART:
        content.reasoning += _as_text(part.get(_first(PART_TEXT_KEYS, part) or "value"), f"{what}'s reasoning")
        return True
    if kind in TOOL_CALLS_PARTS:
        value = part.get(_first(PART_TEXT_KEYS, part) or "value")
        try:
            calls = json.loads(value) if isinstance(value, str) else value
        except json.JSONDecodeError:
            raise RecordProblem(f"{what} has a {kind} part whose value is not JSON") from None
        content.tool_calls += _tool_calls(calls, what)
        return True
    if kind == "tools":
        raise RecordProblem(f"{what} has a 'tools' part: give the tool schemas as the record's 'tools'")
    return False


def _content(value: Any, what: str, seen: _Seen) -> _Content:
    """A message's content: a string, a number, or parts whose text is joined; reasoning and tool-call parts kept
    apart (`_typed_part`); non-text parts, such as images, left out and counted."""
    if not isinstance(value, (list, dict)):
        return _Content(_as_text(value, what))
    content, texts = _Content(""), []
    for number, part in enumerate(value if isinstance(value, list) else [value], start=1):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise RecordProblem(f"{what} part {number} is {_json_type(part)}, not a content part")
        if _typed_part(part, f"{what} part {number}", content):
            continue
        key = _first(PART_TEXT_KEYS, part)
        if key is not None:
            texts.append(_as_text(part[key], f"{what} part {number}"))
        elif part.get("type") in NON_TEXT_PARTS or any(kind in part for kind in NON_TEXT_PARTS):
            seen.left_out_parts += 1
        else:
            raise RecordProblem(f"{what} part {number} has no text under any of {', '.join(PART_TEXT_KEYS)} "
                                f"(its keys: {', '.join(sorted(part))})")
    content.text = "".join(texts)
    return content


def _arguments(value: Any) -> Any:
    """Tool-call arguments as an object: chat templates render a dict (OpenAI's format sends a JSON string)."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return {} if value is None else value


def _tool_call(value: Any, what: str) -> dict:
    """{"type": "function", "function": {"name", "arguments"}} from the nested (OpenAI) or the flat form."""
    call = value.get("function", value) if isinstance(value, dict) else None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise RecordProblem(f"{what} has a tool call without a 'name'")
    function = {"name": call["name"], "arguments": _arguments(call.get("arguments"))}
    normalized = {"type": "function", "function": function}
    if isinstance(value.get("id"), str):
        normalized["id"] = value["id"]
    return normalized


def _tool_calls(value: Any, what: str) -> list[dict]:
    calls = value if isinstance(value, list) else [value]
    return [_tool_call(call, what) for call in calls]


def _message(raw: Any, what: str, seen: _Seen) -> dict:
    if not isinstance(raw, dict):
        raise RecordProblem(f"{what} is {_json_type(raw)}, not a message object")
    role_key, content_key = _first(ROLE_KEYS, raw), _first(CONTENT_KEYS, raw)
    role = raw.get(role_key)
    if not isinstance(role, str):
        raise RecordProblem(f"{what} has no role (a 'role', or ShareGPT's 'from')")
    if role.lower() == TOOL_CALL_ROLE:
        try:
            call = json.loads(_as_text(raw.get(content_key), f"{what}'s value"))
        except json.JSONDecodeError:
            raise RecordProblem(f"{what} is a function_call whose value is not JSON") from None
        return {"role": "assistant", "content": "", "tool_calls": _tool_calls(call, what)}
    if role.lower() not in ROLES:
        # (the role itself is not quoted: messages never quote a file's content)
        raise RecordProblem(f"{what} has a role that is none of: user (human, prompter), assistant (gpt, model), "
                            f"system, tool (observation, function_call)")
    calls = _tool_calls(raw["tool_calls"], what) if raw.get("tool_calls") else []
    if content_key is None and not calls:
        raise RecordProblem(f"{what} has no content (a 'content', or ShareGPT's 'value')")
    content = _content(raw.get(content_key), f"{what}'s content", seen)
    message = {"role": ROLES[role.lower()], "content": content.text}
    if content.reasoning or content.tool_calls:
        if message["role"] != "assistant":
            raise RecordProblem(f"{what} is a {message['role']} message with reasoning or tool-call parts: only the "
                                f"assistant reasons and calls tools")
        if content.reasoning:
            message["reasoning_content"] = content.reasoning
    calls = calls + content.tool_calls
    if calls:
        message["tool_calls"] = calls
    message.update({key: raw[key] for key in MESSAGE_KEYS_KEPT if isinstance(raw.get(key), str)})
    read = {role_key, content_key, "tool_calls", *MESSAGE_KEYS_KEPT}
    seen.unused_message_keys.update(key for key, item in raw.items()
                                    if key not in read and isinstance(item, str) and item.strip())
    return message


def _messages(value: Any, column: str, seen: _Seen) -> list[dict]:
    if not isinstance(value, list):
        raise RecordProblem(f"'{column}' holds {_json_type(value)}, not a list of messages")
    return [_message(raw, f"'{column}' message {number}", seen) for number, raw in enumerate(value, start=1)]


def _says_something(messages: list[dict]) -> bool:
    return any(message["content"].strip() or message.get("tool_calls") for message in messages)


def _with_system(messages: list[dict], record: dict, seen: _Seen) -> list[dict]:
    """The record's `system`/`system_prompt` column as the first turn (a conversation may carry its own)."""
    filled = [column for column in SYSTEM_COLUMNS if _filled(record, column)]
    if len(filled) > 1:
        raise RecordProblem(f"two system prompts, '{filled[0]}' and '{filled[1]}': keep one")
    if not filled:
        return messages
    seen.used.add(filled[0])
    system = _as_text(record[filled[0]], filled[0])
    if messages and messages[0]["role"] == "system":
        if messages[0]["content"] != system:
            raise RecordProblem(f"'{filled[0]}' and the conversation's own system turn differ: keep one")
        return messages
    return [{"role": "system", "content": system}, *messages]


def _tools(record: dict, seen: _Seen) -> dict:
    """{"tools": [...]} from a list or a JSON string (LLaMA-Factory writes a string), or {}."""
    value = record.get("tools")
    if value in (None, "", []):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RecordProblem("'tools' is text but not JSON: give a list of tool schemas") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise RecordProblem(f"'tools' holds {_json_type(value)}, not a list of tool schemas")
    seen.used.add("tools")
    return {"tools": value}


def _best_thread(node: dict) -> list[dict]:
    """OpenAssistant's trees export: the messages from the root prompt along the best-ranked reply (rank 0 first,
    unranked after), skipping deleted replies."""
    thread = []
    while node is not None:
        thread.append({"role": node.get("role"), "content": node.get("text")})
        replies = [reply for reply in node.get("replies") or [] if isinstance(reply, dict) and not reply.get("deleted")]
        node = min(replies, key=lambda reply: (reply.get("rank") is None, reply.get("rank") or 0), default=None)
    return thread


# ---- layouts ----------------------------------------------------------------------------------------------------

def _refuse_other_trainers_data(record: dict) -> None:
    """`record` as written (a null parent_id still says what the record is)."""
    if "chosen" in record and "rejected" in record:
        raise OtherTrainersData(
            "preference data (prompt/chosen/rejected, for DPO-style trainers), not fine-tuning data: to fine-tune on "
            "the preferred answers, keep 'chosen' as 'completion' (or as 'messages') and drop 'rejected'")
    answer = next((column for column in ("completion", *CHAT_COLUMNS, *ANSWER_COLUMNS) if column in record), None)
    if isinstance(record.get("label"), bool) and answer is not None:
        # TRL's prompt/completion/label and LLaMA-Factory's messages + label (its KTO layout) alike
        raise OtherTrainersData(
            f"unpaired preference data ('{answer}' with a true/false 'label', for KTO): answers labelled false are "
            f"answers not to learn; to fine-tune, keep the records labelled true and drop 'label'")
    if "completions" in record and "labels" in record:
        raise OtherTrainersData("step-wise supervision data (prompt/completions/labels, for process reward "
                                "models), not fine-tuning data")
    if isinstance(record.get("prompt"), list) and "completion" not in record:
        raise OtherTrainersData("prompt-only data (for online trainers such as GRPO): no answer to train on")
    if "message_id" in record and "parent_id" in record:
        raise OtherTrainersData("one OpenAssistant message per record (message_id/parent_id): give the trees "
                                "export (*.trees.jsonl), whose records are whole conversations")


def _conversation(record: dict, seen: _Seen) -> tuple[str, dict] | None:
    columns = [column for column in CHAT_COLUMNS if isinstance(record.get(column), list)]
    if len(columns) > 1:
        raise RecordProblem("both 'messages' and 'conversations': keep one")
    if columns:
        messages = _messages(record[columns[0]], columns[0], seen)
        seen.used.add(columns[0])
    elif isinstance(record.get("prompt"), dict) and "replies" in record["prompt"]:
        messages = _messages(_best_thread(record["prompt"]), "prompt", seen)
        seen.used.add("prompt")
    else:
        return None
    messages = _with_system(messages, record, seen)
    if not _says_something(messages):
        raise BlankRecord("no message has text")
    return CONVERSATION, {"messages": messages, **_tools(record, seen)}


def _prompt_completion(record: dict, seen: _Seen) -> tuple[str, dict] | None:
    if "prompt" not in record or "completion" not in record:
        return None
    prompt, completion = record["prompt"], record["completion"]
    seen.used.update(("prompt", "completion"))
    if isinstance(prompt, list) and isinstance(completion, list):
        prompt_messages = _with_system(_messages(prompt, "prompt", seen), record, seen)
        completion_messages = _messages(completion, "completion", seen)
        if not _says_something(completion_messages):
            if not _says_something(prompt_messages):
                raise BlankRecord("no message has text")
            raise RecordProblem("empty answer ('completion')")
        fields = {"prompt": prompt_messages, "completion": completion_messages, **_tools(record, seen)}
        return CHAT_PROMPT_COMPLETION, fields
    if isinstance(prompt, list) or isinstance(completion, list):
        raise RecordProblem("'prompt' and 'completion' must both be text, or both lists of messages")
    prompt_text, completion_text = _as_text(prompt, "'prompt'"), _as_text(completion, "'completion'")
    if not completion_text.strip():
        if not prompt_text.strip():
            raise BlankRecord("empty prompt and completion")
        raise RecordProblem("empty answer ('completion')")
    for column in (*SYSTEM_COLUMNS, HISTORY_COLUMN, "input", "context"):
        if _holds_something(record.get(column)):
            raise RecordProblem(f"'{column}' has text, but prompt/completion text is trained as it is (prompt + "
                                f"completion, TRL's standard format): fold it into 'prompt', or give 'prompt' and "
                                f"'completion' as lists of messages")
    return PROMPT_COMPLETION, {"prompt": prompt_text, "completion": completion_text}


def _text(record: dict, seen: _Seen) -> tuple[str, dict] | None:
    if not _filled(record, "text"):
        return None
    seen.used.add("text")
    return TEXT, {"text": _as_text(record["text"], "'text'")}


def _history(record: dict, seen: _Seen) -> list[dict]:
    """Alpaca-style earlier turns: [[instruction, response], ...] (LLaMA-Factory's `history`)."""
    value = record.get(HISTORY_COLUMN)
    if value in (None, []):
        return []
    pairs = value if isinstance(value, list) else None
    if pairs is None or not all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
        raise RecordProblem(f"'{HISTORY_COLUMN}' must be a list of [instruction, response] pairs")
    seen.used.add(HISTORY_COLUMN)
    return [{"role": role, "content": _as_text(text, f"'{HISTORY_COLUMN}' turn")}
            for pair in pairs for role, text in zip(("user", "assistant"), pair)]


def _instruction(record: dict, seen: _Seen) -> tuple[str, dict] | None:
    prompts = [column for column in PROMPT_COLUMNS if _filled(record, column)]
    answers = [column for column in ANSWER_COLUMNS if _filled(record, column)]
    if not prompts and not answers:
        return None
    if len(answers) > 1:
        raise RecordProblem(f"two answer columns, '{answers[0]}' and '{answers[1]}': keep the one to train on")
    if not answers:
        empty = _first(ANSWER_COLUMNS, record)
        if empty is not None:
            raise RecordProblem(f"empty answer ('{empty}')")
        if prompts == ["prompt"]:
            raise OtherTrainersData("prompt-only data (for online trainers such as GRPO): no answer to train on")
        raise RecordProblem(f"no answer for '{prompts[0]}': give one of {', '.join(ANSWER_COLUMNS)}")
    if not prompts:
        raise RecordProblem(f"an answer ('{answers[0]}') without a prompt: give one of {', '.join(PROMPT_COLUMNS)}")
    seen.used.update((*prompts, answers[0]))
    question = "\n".join(_as_text(record[column], f"'{column}'") for column in prompts)
    prompt = _with_system([*_history(record, seen), {"role": "user", "content": question}], record, seen)
    completion = [{"role": "assistant", "content": _as_text(record[answers[0]], f"'{answers[0]}'")}]
    return CHAT_PROMPT_COMPLETION, {"prompt": prompt, "completion": completion, **_tools(record, seen)}


def _no_usable_text(record: dict) -> RecordProblem:
    if not any(isinstance(item, str) and item.strip() for item in record.values()):
        return BlankRecord("no text")
    return RecordProblem(
        f"no usable text; give a 'text' column, a prompt ({'/'.join(PROMPT_COLUMNS)}) with an answer "
        f"({'/'.join(ANSWER_COLUMNS)}), TRL's prompt/completion, or chat 'messages'/'conversations' "
        f"(found columns: {', '.join(sorted(record)) or 'none'})")


def sft_record(value: Any) -> SFTRecord:
    """One raw record as TRL's layout; raises RecordProblem (BlankRecord, OtherTrainersData) when it is not one."""
    if isinstance(value, str):  # an item of a top-level list of strings, as datasets reads it
        if not value.strip():
            raise BlankRecord("empty text")
        return SFTRecord(TEXT, {"text": value})
    if not isinstance(value, dict):
        raise RecordProblem(f"expected a JSON object, got {_json_type(value)}")
    _refuse_other_trainers_data(value)
    record = {key: item for key, item in value.items() if item is not None}  # Arrow fills absent columns with None
    seen = _Seen()
    # TRL's precedence: conversations, then prompt/completion, then the text column; the instruction schemas last.
    for read in (_conversation, _prompt_completion, _text, _instruction):
        layout_and_fields = read(record, seen)
        if layout_and_fields is not None:
            break
    else:
        raise _no_usable_text(record)
    unused = {f"'{key}'" for key, item in record.items()
              if key not in seen.used and isinstance(item, str) and item.strip()}
    unused |= {f"message key '{key}'" for key in seen.unused_message_keys}
    return SFTRecord(*layout_and_fields, tuple(sorted(unused)), seen.left_out_parts)
