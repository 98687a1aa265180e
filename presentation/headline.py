"""The run at a glance, for the top of the page: whether it is done, and per packed collator the three numbers a
teammate asks about first (speed against padded with its ideal, peak memory against padded, the loss difference),
big; then, folded under them on the page, why each collator's numbers look the way they do.

- `status_line`: "### Done in 11.5 s", or stopped;
- `headline`: a status over `numbers`, the big numbers (HTML inside the headline's markdown: a card per packed collator for up to
  `CARDS_UP_TO`, a compact table for more, so that seven collators stay on one screen), the baseline and what its
  peak memory measures on this device, and what is missing (a collator that did not finish, a skipped check);
- `collator_lines` / `detail_markdown`: per collator its numbers in words, its flags, and the registry's `why`.

On the page:

    ### Done in 11.5 s
    ┌ ■ flatten ───────────────────────────────────────────────┐
    │ 2.18×                 −46%                   4.8e-7      │
    │ speed vs padded:      peak memory vs padded: max |Δloss| │
    │ faster; ideal 2.87×   35.1 MB vs 65.5 MB     vs padded:  │
    │                                              identical   │
    └──────────────────────────────────────────────────────────┘
    Baseline padded: 5,522 real tokens/s, peak 65.5 MB. Peak memory here: ...
"""

from __future__ import annotations

from html import escape

from demo_core.collators import BASELINE, collator_spec
from presentation.report import contamination_skipped, flags_in_words, human_bytes, result_entries

CARDS_UP_TO = 3  # packed collators shown as cards; more become a compact table
MEMORY_RISE_NOTED_ABOVE = 0.05  # a higher peak than padded's by more than this says why in its card
LOSS_IDENTICAL_BELOW = 1e-4  # float rounding over a few steps stays far below it; a different training far above
# Flags (results.compare) in a few words, for a card; the details below it have the full words.
FLAG_SHORT = {"few-timed-steps": "too few timed steps", "above-ideal": "above every ideal",
              "noisy": "noisy steps", "other-batches": "other batches than padded",
              "slow-precision": "slow precision on a CPU"}


def collator_key(name: str) -> str:
    """A swatch in the collator's plot colour, so that its line of text points at its bar and its curve."""
    return f'<span class="collator-key" style="background:{collator_spec(name).color}"></span>'


def status_line(document: dict, seconds: float | None = None) -> str:
    status = "Stopped: partial results" if document.get("partial") else "Done"
    return f"### {status}" + (f" in {seconds:.1f} s" if seconds is not None else "")


# ---- the big numbers ---------------------------------------------------------------------------------------------

def _times(ratio: float) -> str:
    return "faster" if ratio >= 1.005 else "slower" if ratio <= 1 / 1.005 else "as fast"


# What each big number is, in card and table order; a card writes it under its number, the table over its column.
STAT_NAMES = ("speed vs padded", "peak memory vs padded", "max |Δloss| vs padded")


def loss_number(difference: float) -> str:
    """The loss difference in a card's width: "9.5e-7", not "9.5e-07" (the exponent's zero is one more character a
    narrow card has to cut)."""
    mantissa, exponent = f"{difference:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _speed_says(entry: dict) -> str:
    """What the speedup says, its caveat first when a flag distrusts it: the measured range of a noisy one, the ideal
    an implausible one is above."""
    speedup, ideal, flags = entry["speedup_vs_padded"], entry["ideal_speedup"], entry.get("flags", [])
    if "noisy" in flags and entry.get("speedup_range"):
        low, high = entry["speedup_range"]
        return f"noisy, {low:.2f}–{high:.2f}×: run again; ideal {ideal:.2f}×"
    if "above-ideal" in flags:
        return f"above the ideal {ideal:.2f}×: padded was likely slowed; run again"
    return f"{_times(speedup)}; ideal {ideal:.2f}×"


def _memory_says(result: dict, padded: dict, change: float) -> str:
    """Both peaks, and when the collator's is higher, why: its steps compute more token slots than padded's (best-fit
    packing fills rows up to the max length, grouping keeps long examples together)."""
    peaks = f"{human_bytes(result['peak_memory_bytes'])} vs {human_bytes(padded['peak_memory_bytes'])}"
    if change <= MEMORY_RISE_NOTED_ABOVE:
        return peaks
    slots = [run["padded_slots"] / run["steps"] if run.get("padded_slots") and run.get("steps") else None
             for run in (result, padded)]  # per step: a partial run has fewer steps
    if all(slots) and slots[0] > slots[1] * (1 + MEMORY_RISE_NOTED_ABOVE):
        return f"{peaks}: its steps hold {slots[0] / slots[1]:.1f}× the token slots"
    return f"{peaks}: see why below"


def _stats(result: dict, entry: dict, padded: dict) -> list[tuple[str, str, str]]:
    """(big number, what it is, what it says) for speed, memory and loss; "–" where the run has no such number."""
    speedup = entry["speedup_vs_padded"]
    speed = ("–", "none: too few timed steps") if speedup is None else (f"{speedup:.2f}×", _speed_says(entry))
    change = entry.get("peak_memory_vs_padded")
    memory = ("–", "not measured") if change is None else \
        (f"{change:+.0%}".replace("-", "−"), _memory_says(result, padded, change))
    difference = entry["max_abs_loss_diff_vs_padded"]
    loss = ("–", "no common step") if difference is None else \
        (loss_number(difference), "identical (float rounding)" if difference < LOSS_IDENTICAL_BELOW
         else "differs (not the same training)")
    return [(number, what, says) for what, (number, says) in zip(STAT_NAMES, (speed, memory, loss))]


def _stat(number: str, what: str, says: str) -> str:
    """A big number over its caption; in the compact table the column's header says `what`, except on a phone,
    whose table is a stack of rows without a header (page.css)."""
    return (f'<span class="glance-number">{number}</span><span class="glance-caption">'
            f'<span class="glance-what">{escape(what)}: </span>{escape(says)}</span>')


def _name(result: dict) -> str:
    return f"{collator_key(result['collator'])}<b>{escape(result['collator'])}</b>" + \
        (" (partial)" if result.get("partial") else "")


def _flags(entry: dict) -> str:
    flags = [FLAG_SHORT.get(flag, flag) for flag in entry.get("flags", [])]
    return f'<div class="glance-flags">⚠ {", ".join(flags)}: see why below</div>' if flags else ""


def _cards(packed: list[tuple[dict, dict]], padded: dict) -> str:
    cards = []
    for result, entry in packed:
        stats = "".join(f'<div class="glance-stat">{_stat(*stat)}</div>' for stat in _stats(result, entry, padded))
        cards.append(f'<div class="glance-card"><div class="glance-name">{_name(result)}</div>'
                     f'<div class="glance-stats">{stats}</div>{_flags(entry)}</div>')
    return f'<div class="glance">{"".join(cards)}</div>'


def _table(packed: list[tuple[dict, dict]], padded: dict) -> str:
    head = "".join(f"<th>{escape(header)}</th>" for header in ("collator", *STAT_NAMES))
    rows = "".join(f"<tr><td>{_name(result)}{_flags(entry)}</td>"
                   + "".join(f"<td>{_stat(*stat)}</td>" for stat in _stats(result, entry, padded)) + "</tr>"
                   for result, entry in packed)
    return f'<table class="glance-table"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _baseline_note(padded: dict, results: list[dict]) -> str:
    rate = "no timed step" if padded["tokens_per_s"] is None else f"{padded['tokens_per_s']:,.0f} real tokens/s"
    kinds = list(dict.fromkeys(result.get("peak_memory_kind") for result in results if result.get("peak_memory_kind")))
    measures = f" Peak memory here: {'; '.join(kinds)}." if kinds else ""
    return (f'<p class="glance-note">Baseline {_name(padded)}: {rate}, peak '
            f'{human_bytes(padded["peak_memory_bytes"])}.{escape(measures)}</p>')


def _missing(document: dict, paired: bool) -> list[str]:
    """What the numbers cannot say yet, one sentence each; `paired`: padded and another collator finished (a card
    says why it has no speedup, if it has none)."""
    lines = []
    finished = [result["collator"] for result in document["results"]]
    if not paired and document.get("partial"):
        missing = [name for name in document["config"].get("collators", []) if name not in finished]
        lines.append(f"Stopped before {', '.join(missing) or 'the end'} finished: no speedup to compare yet.")
    elif not paired:
        lines.append(f"Add `{BASELINE}` and a packing collator to see a speedup.")
    if document.get("stop_reason") not in (None, "stop", "time budget"):
        lines.append(f"Ended early: {document['stop_reason']}.")
    if contamination_skipped(document):
        lines.append(f"The contamination check was skipped: {contamination_skipped(document)}.")
    return lines


def numbers(document: dict) -> str:
    """The headline's body (markdown with an HTML block): the big numbers of every finished packed collator against
    padded, the baseline's, and what is missing."""
    padded = next((result for result in document["results"] if result["collator"] == BASELINE), None)
    packed = [(result, entry) for result, entry in result_entries(document)
              if padded is not None and result is not padded]
    parts = []
    if packed:
        parts.append(_cards(packed, padded) if len(packed) <= CARDS_UP_TO else _table(packed, padded))
    if padded is not None:
        parts.append(_baseline_note(padded, document["results"]))
    parts += [f"- {line}" for line in _missing(document, bool(packed))]
    return "\n\n".join(parts)


def headline(document: dict, status: str) -> str:
    """The run at a glance (markdown): `status` ("### Done in 11.5 s": `status_line`, or what the page says of a run
    training or picked in the history), the big numbers, what is missing."""
    return f"{status}\n\n{numbers(document)}"


# ---- why, per collator -------------------------------------------------------------------------------------------

def _speedup_sentence(entry: dict) -> str:
    low, high = entry["speedup_range"]
    work = entry.get("work_ideal_speedup")
    work_text = "" if work is None else f", {work:.2f}× by work (attention per example does not shrink)"
    return (f"{entry['speedup_vs_padded']:.2f}× the padded throughput (middle half of steps {low:.2f}–{high:.2f}×) "
            f"of an ideal {entry['ideal_speedup']:.2f}× by slots{work_text}")


def _in_words(result: dict, entry: dict) -> str:
    """The collator's numbers in words, its flags last (each with ⚠)."""
    warnings = "".join(f" ⚠ {words}." for words in flags_in_words(entry))
    rate = ("no timed step" if result["tokens_per_s"] is None else f"{result['tokens_per_s']:,.0f} real tokens/s")
    if result["collator"] == BASELINE:
        return f"{rate}, the baseline.{warnings}"
    if entry["speedup_vs_padded"] is None:
        return f"{rate}, no speedup.{warnings}"
    difference = entry["max_abs_loss_diff_vs_padded"]
    loss = ("loss identical to padded" if difference is not None and difference < LOSS_IDENTICAL_BELOW
            else f"loss differs from padded by up to {difference:.2f}")
    return f"{_speedup_sentence(entry)}, {loss}.{warnings}"


def collator_lines(document: dict, attention_why: str | None = None) -> list[str]:
    """Per collator of the run, its numbers and, in italics, why they look that way; then the attention path's
    why, when known (it comes from the preview: a saved run does not record it)."""
    lines = [f"{collator_key(result['collator'])} **{result['collator']}**: {_in_words(result, entry)} "
             f"*{collator_spec(result['collator']).why}*" for result, entry in result_entries(document)]
    if attention_why:
        lines.append(f"**{document['config'].get('resolved_attention')} attention**: *{attention_why}*")
    return lines


def detail_markdown(document: dict, attention_why: str | None = None) -> str:
    return "\n".join(f"- {line}" for line in collator_lines(document, attention_why))
