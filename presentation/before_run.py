"""What the page says before Run, from a preview's numbers: what Run will cost, in one line beside the button
(`forecast_line`), the question a run that would be long or refused asks before it starts (`question`), and what
trains (`trained_example`): the first example as the model sees it, chat template applied, its trained parts marked
and the count of trained tokens.

    ⚠ long · Run: about 4.4 min, peak 1.8 GB of 10.5 GB
"""

from __future__ import annotations

import re
from html import escape

from presentation.report import human_bytes, human_seconds

# The markup a chat template adds around the turns, shown as such in the example: ChatML and Llama 3 headers
# (<|im_start|>, <|start_header_id|>), <s> / </s>, Gemma's <start_of_turn>, Mistral's [INST] and ByT5's <extra_id_0>.
TEMPLATE_TOKEN = re.compile(r"<\|[^<>|\s]{1,40}\|>|</?s>|<(?:start|end)_of_turn>|<extra_id_\d+>|<pad>|\[/?INST\]|"
                            r"</?tool_call>")
# A stretch longer than this (trained or not) is cut in its middle: the example shows its shape, not all its text.
EXAMPLE_STRETCH_CHARS = 360


def _warnings(preview: dict) -> list[tuple[str, str]]:
    """(a few words for the line, the question's sentence) per reason to ask before the run starts."""
    predicted, memory = preview.get("predicted"), preview.get("memory_guard")
    warnings = []
    if predicted and predicted["long"]:
        warnings.append(("⚠ long", f"This run is predicted to take about {human_seconds(predicted['duration_s'])} "
                                   f"(more than {human_seconds(predicted['long_after_s'])}); fewer steps, collators or "
                                   "a smaller model finish sooner."))
    if memory and memory.get("available_bytes") and not memory["fits"]:
        peak, available = human_bytes(memory["predicted_peak_bytes"]), human_bytes(memory["available_bytes"])
        warnings.append(("⚠ does not fit", f"Its predicted peak, {peak}, is more than the {available} available: the "
                                           "run would be refused and say what fits."))
    return warnings


def forecast_line(preview: dict) -> str:
    """What Run will cost, in one line (markdown): its predicted time, its peak memory against what this machine
    has, and the warnings in a word or two (the cost table under the batch says how each was predicted)."""
    predicted, memory = preview.get("predicted"), preview.get("memory_guard")
    parts = []
    if predicted:
        parts.append(f"about **{human_seconds(predicted['duration_s'])}**")
    if memory and memory.get("available_bytes"):
        parts.append(f"peak **{human_bytes(memory['predicted_peak_bytes'])}** of "
                     f"{human_bytes(memory['available_bytes'])}")
    if not parts:
        return ""
    # The warnings first: a phone shows the line's beginning when it cuts it.
    return "".join(f"**{words}** · " for words, _ in _warnings(preview)) + "Run: " + ", ".join(parts)


def question(preview: dict) -> str:
    """What Run asks before a run that would be long or refused starts (markdown), or "" when it starts at once."""
    sentences = [sentence for _, sentence in _warnings(preview)]
    return " ".join(sentences + ["Start it anyway?"]) if sentences else ""


def _short(piece: str) -> str:
    if len(piece) <= EXAMPLE_STRETCH_CHARS:
        return piece
    half = EXAMPLE_STRETCH_CHARS // 2
    return f"{piece[:half]} … {piece[-half:]}"


def _marked(piece: str) -> str:
    """A piece of the example as HTML, its template markup in its own style."""
    html, start = [], 0
    for match in TEMPLATE_TOKEN.finditer(piece):
        html += [escape(piece[start:match.start()]), f'<span class="template-token">{escape(match.group())}</span>']
        start = match.end()
    html.append(escape(piece[start:]))
    return "".join(html)


def example_html(example: dict) -> str:
    """One example (dataset_stats.examples) as trained: its text with the chat template's markup visible, the parts
    that carry loss in <mark>, each long stretch cut in its middle."""
    text, pieces, start = example["text"], [], 0
    for begin, end in example.get("loss_spans", []):
        pieces += [(False, text[start:begin]), (True, text[begin:end])]
        start = end
    pieces.append((False, text[start:]))
    body = "".join(f"<mark>{_marked(_short(piece))}</mark>" if carries else _marked(_short(piece))
                   for carries, piece in pieces if piece)
    return f'<pre class="as-trained">{body}</pre>'


def trained_example(preview: dict) -> str:
    """What trains, before Run (markdown with an HTML block): which tokens carry loss and how many ("trained tokens
    N of M (x%)"), and the first example as the model sees it with its trained parts marked."""
    stats, config = preview["dataset_stats"], preview["config"]
    if "loss_on" not in stats:
        return ""
    total, trained = stats["total_tokens"], stats["trained_tokens"]
    share = f" ({trained / total:.0%})" if total else ""
    why = f" (TRL's default for {stats['layout']} data)" if config.get("loss_on", "auto") == "auto" else ""
    lines = [f"**What trains**: loss on {stats['loss_on']}{why}; trained tokens **{trained:,} of {total:,}**{share}."]
    if stats.get("examples"):
        lines.append('The first example as trained, <mark>highlighted: carries loss</mark>, '
                     '<span class="template-token">template markup</span> as the model reads it:')
        lines.append(example_html(stats["examples"][0]))
    return "\n\n".join(lines)
