"""From a record in TRL's layout to token ids and labels, exactly as TRL's SFTTrainer prepares it (trl 1.16,
`SFTTrainer._prepare_dataset`: `add_eos`, `tokenize_fn`, `build_labels`), and which tokens carry loss.

- text: the text, plus the tokenizer's EOS when it does not end with it, tokenized as the tokenizer does.
- prompt-completion: prompt + completion + EOS, concatenated as they are; the completion starts where the tokens of
  the prompt alone and of the whole stop agreeing (`common_prefix_length`: a token may merge across the boundary).
- conversations: `tokenizer.apply_chat_template(messages, tools=...)`; with assistant-only loss, the template's
  `{% generation %}` spans (`return_assistant_tokens_mask=True`), or TRL's training variant of a known template
  that has none (`get_training_chat_template`); a conversational prompt alone is rendered with the generation prompt.

`loss_on` picks the tokens that carry loss: `all`; `completion` (prompt-completion layouts: the completion);
`assistant` (conversational layouts: every assistant turn). `auto` is TRL's default for the layout: completion for
prompt-completion data (SFTConfig.completion_only_loss=None), every token otherwise (assistant_only_loss=False).
Labels are the ids where a token carries loss, -100 elsewhere; the model predicts token t from the tokens before it,
so a sequence's first token never carries loss, whatever its label (`trained_tokens` counts labels[1:]).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase
from trl.chat_template_utils import get_training_chat_template, has_generation_markers
from trl.data_utils import common_prefix_length

from demo_core.data.schemas import CHAT_PROMPT_COMPLETION, CONVERSATION, PROMPT_COMPLETION, TEXT
from demo_core.errors import DemoInputError

IGNORE_INDEX = -100
TRL_DEFAULT_LOSS_ON = {TEXT: "all", PROMPT_COMPLETION: "completion", CONVERSATION: "all",
                       CHAT_PROMPT_COMPLETION: "completion"}
LOSS_ON_CHOICES = {TEXT: ("all",), PROMPT_COMPLETION: ("all", "completion"), CONVERSATION: ("all", "assistant"),
                   CHAT_PROMPT_COMPLETION: ("all", "completion", "assistant")}


def resolve_loss_on(requested: str, layout: str) -> str:
    """The tokens that carry loss for this data: the request, or TRL's default for the layout ("auto")."""
    if requested == "auto":
        return TRL_DEFAULT_LOSS_ON[layout]
    if requested not in LOSS_ON_CHOICES[layout]:
        why = {"completion": "needs prompt/completion data (an answer apart from its prompt)",
               "assistant": "needs conversations (messages with assistant turns)"}[requested]
        raise DemoInputError(f"loss on {requested!r} {why}; this data is {layout} data: use "
                             f"{' or '.join(repr(choice) for choice in ('auto', *LOSS_ON_CHOICES[layout]))}")
    return requested


def training_chat_template(tokenizer: PreTrainedTokenizerBase, loss_on: str) -> str | None:
    """The template TRL renders with: the tokenizer's own (None), except for assistant-only loss with a template
    that has no `{% generation %}` markers, which TRL swaps for its training variant of that template."""
    if loss_on != "assistant" or has_generation_markers(tokenizer.chat_template):
        return None
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:
        raise DemoInputError(
            "assistant-only loss needs a chat template that marks the assistant's tokens with {% generation %}; this "
            "tokenizer's template has no such markers and TRL has no training variant of it: use loss on 'all', or a "
            "template with the markers") from None


def _with_eos(text: str, tokenizer: PreTrainedTokenizerBase) -> str:
    eos = tokenizer.eos_token
    return text if eos is None or text.endswith(eos) else text + eos


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list | None, template: str | None,
            **options) -> dict:
    if any("reasoning_content" in message for message in messages) and \
            "reasoning_content" not in (template or tokenizer.chat_template or ""):
        raise DemoInputError(
            "this data has reasoning parts (an assistant's reasoning_content), which this tokenizer's chat template "
            "never renders: the reasoning would be dropped without a word; use a model whose template renders "
            "reasoning_content (Qwen3's, DeepSeek-R1's, the presets'), or drop the reasoning parts")
    return tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=template, tokenize=True,
                                         return_dict=True, **options)


def _completion_mask(prompt_ids: list[int], ids: list[int]) -> list[int]:
    start = common_prefix_length(prompt_ids, ids)
    return [0] * start + [1] * (len(ids) - start)


def tokenize(fields: dict, layout: str, tokenizer: PreTrainedTokenizerBase, loss_on: str,
             template: str | None) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of one record, as SFTTrainer builds them for `loss_on`; `template` from
    `training_chat_template`."""
    masks = []
    if layout == TEXT:
        ids = tokenizer(_with_eos(fields["text"], tokenizer))["input_ids"]
    elif layout == PROMPT_COMPLETION:
        prompt_ids = tokenizer(fields["prompt"])["input_ids"]
        ids = tokenizer(fields["prompt"] + _with_eos(fields["completion"], tokenizer))["input_ids"]
        masks.append(_completion_mask(prompt_ids, ids) if loss_on == "completion" else None)
    else:
        assistant = loss_on == "assistant"
        if layout == CONVERSATION:
            rendered = _render(tokenizer, fields["messages"], fields.get("tools"), template,
                               return_assistant_tokens_mask=assistant)
        else:
            prompt_ids = _render(tokenizer, fields["prompt"], fields.get("tools"), template,
                                 add_generation_prompt=True)["input_ids"]
            rendered = _render(tokenizer, fields["prompt"] + fields["completion"], fields.get("tools"), template,
                               return_assistant_tokens_mask=assistant)
            masks.append(_completion_mask(prompt_ids, rendered["input_ids"]) if loss_on == "completion" else None)
        ids = list(rendered["input_ids"])
        masks.append(rendered.get("assistant_masks") if assistant else None)
    masks = [mask for mask in masks if mask is not None]
    labels = [token if all(bits) else IGNORE_INDEX for token, *bits in zip(ids, *masks)] if masks else list(ids)
    return list(ids), labels


def trained_tokens(labels: list[int]) -> int:
    """Tokens that carry loss: labels past the first (nothing predicts a sequence's first token) that are not -100."""
    return sum(label != IGNORE_INDEX for label in labels[1:])


def shown_example(tokenizer: PreTrainedTokenizerBase, ids: list[int], labels: list[int]) -> dict:
    """An example as trained: `text` (the tokens decoded, as tokenized), `loss_text` (the parts that carry loss,
    concatenated) and `loss_spans` ([start, end) character ranges of those parts in `text`)."""
    runs: list[tuple[bool, list[int]]] = []
    for position, (token, label) in enumerate(zip(ids, labels)):
        carries = position > 0 and label != IGNORE_INDEX
        if runs and runs[-1][0] == carries:
            runs[-1][1].append(token)
        else:
            runs.append((carries, [token]))
    text, loss_text, spans = "", "", []
    for carries, tokens in runs:
        piece = tokenizer.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if carries:
            spans.append([len(text), len(text) + len(piece)])
            loss_text += piece
        text += piece
    return {"text": text, "loss_text": loss_text, "loss_spans": spans}
