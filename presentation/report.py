"""Presentation of a run document, shared by the CLI and the page, so both show the same numbers the same way.

- `RESULT_COLUMNS`: one column per number of the results table (page table, CSV and the CLI's table), the key ones
  first (a phone shows the first few without scrolling);
- `contamination_title`: what the contamination table checks, or why it is empty;
- `FLAG_WORDS`: what each comparison flag means, for the page's table, the headline and the CLI;
- `anatomy_rows` / `anatomy_markdown`: where the profiled steps' time went (their median), why the speedup misses its
  ideal, and when the anatomy cannot be trusted;
- `run_summary`: one saved run in a line (the page's history table and the `/history` API);
- `cost_markdown`: the before-training cost table of a preview;
- `loss_sentence` / `marked_text`: which tokens carry loss, and an example with its trained parts marked;
- `format_report`: the CLI's printed report.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Any, Callable

from demo_core.collators import BASELINE, COLLATORS, collator_spec
from demo_core.results import ABOVE_IDEAL_TOLERANCE
from demo_core.training.anatomy import OP_CLASSES, PHASES, backward_over_forward
from presentation.batch_words import batch_words, effective_batch_size


def human_bytes(count: float) -> str:
    """Bytes as people read them: 117,321,932 -> "117.3 MB" (decimal units, as GPU sizes are quoted)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:,.1f} {unit}"
    return f"{count:,.0f} B"


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict, dict], Any]  # (result, its comparison entry) -> raw value (CSV), None when not defined
    fmt: str | Callable[[Any], str]  # display format of a value that is not None
    in_terminal: bool = True  # the CLI prints it (the page and the CSV show every column)
    csv_header: str | None = None  # where the CSV's raw value has a unit the display header does not say
    text: Callable[[dict, dict], str] | None = None  # the shown text from the whole row, where one value is not enough

    def show(self, result: dict, entry: dict) -> str:
        value = self.value(result, entry)
        if value is None:
            return "–"
        if self.text is not None:
            return self.text(result, entry)
        return self.fmt(value) if callable(self.fmt) else self.fmt.format(value)


def predicted_and_measured(result: dict, entry: dict) -> str:
    """The step-time model's speedup beside the burst's own (docs/THROUGHPUT.md)."""
    measured = entry["speedup_vs_padded"]
    return (f"predicted {entry['predicted_speedup_vs_padded']:.2f}×, "
            + ("not measured" if measured is None else f"measured {measured:.2f}×"))


# What each comparison flag (results.compare) means, in words.
FLAG_WORDS = {
    "few-timed-steps": ("fewer than 3 timed steps (step 1 is warm-up, profiled steps are left out): no speedup; run "
                        "more steps"),
    "above-ideal": "more than 10% above every ideal: more likely other work slowed the padded steps than a real gain",
    "noisy": "the steps disagree (range wider than 25% of the speedup): other work on the machine; run again",
    "other-batches": "other batches than padded (packed rows or length grouping): not a like-for-like comparison",
    "slow-precision": "bf16/fp16 on a CPU: without fast half-precision matmuls autocast only adds casts; use fp32",
}


def flags_in_words(entry: dict) -> list[str]:
    return [FLAG_WORDS[flag] for flag in entry.get("flags", [])]


RESULT_COLUMNS = (
    Column("collator", lambda r, c: r["collator"] + (" (partial)" if r["partial"] else ""), "{}"),
    Column("speedup vs padded", lambda r, c: c["speedup_vs_padded"], "{:.2f}×"),
    Column("ideal speedup", lambda r, c: c["ideal_speedup"], "{:.2f}×"),
    Column("max |Δloss| vs padded", lambda r, c: c["max_abs_loss_diff_vs_padded"], "{:.1e}"),
    Column("peak memory", lambda r, c: r["peak_memory_bytes"], human_bytes, csv_header="peak memory bytes"),
    Column("speedup range", lambda r, c: c.get("speedup_range"), "{0[0]:.2f}–{0[1]:.2f}×"),
    Column("work ideal", lambda r, c: c.get("work_ideal_speedup"), "{:.2f}×"),
    Column("predicted speedup", lambda r, c: c.get("predicted_speedup_vs_padded"), "{:.2f}×",
           text=predicted_and_measured),
    # Short keys in the terminal's table (the words follow it), the words on the page and in the CSV.
    Column("flags", lambda r, c: "; ".join(flags_in_words(c)) or None, "{}", in_terminal=False),
    Column("real tokens/s", lambda r, c: r["tokens_per_s"], "{:,.0f}"),
    Column("samples/s", lambda r, c: r["samples_per_s"], "{:.1f}"),
    Column("median step ms", lambda r, c: None if r["step_time_median_s"] is None else r["step_time_median_s"] * 1000,
           "{:.0f}"),
    Column("pad fraction", lambda r, c: r["pad_fraction"], "{:.1%}"),
    Column("final loss", lambda r, c: r["losses"][-1] if r["losses"] else None, "{:.4f}"),
    Column("steps", lambda r, c: r["steps"], "{}"),
    Column("timed steps", lambda r, c: r.get("timed_steps"), "{}"),
    Column("effective batch", lambda r, c: r.get("effective_batch_size"), "{}", in_terminal=False),
    Column("attention", lambda r, c: r["attention"], "{}", in_terminal=False),
)
RESULT_HEADERS = [column.header for column in RESULT_COLUMNS]
CONTAMINATION_HEADERS = ["example", "tokens", "flatten max |Δlogit| vs alone", "naive-concat max |Δlogit| vs alone"]


def result_entries(document: dict):
    """(result, its comparison entry) per collator of the run, in run order; a result saved before results carried
    their effective batch gets its run's (batch_semantics.py)."""
    for result in document["results"]:
        if result.get("effective_batch_size") is None:
            result = {**result, "effective_batch_size": effective_batch_size(document)}
        yield result, document["comparison"][result["collator"]]


def results_table(document: dict) -> list[list[str]]:
    return [[column.show(result, entry) for column in RESULT_COLUMNS] for result, entry in result_entries(document)]


def settings_columns(document: dict) -> dict[str, Any]:
    """The run's settings as the CSV's last columns (`config.<key>`: as asked, `resolved_*` as trained, lists
    comma-separated), its effective batch also for a run saved before it was recorded."""
    config = {"effective_batch_size": effective_batch_size(document), **document["config"]}
    return {f"config.{key}": ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            for key, value in config.items()}


def results_csv(document: dict) -> str:
    """The results table with raw values (no rounding), one row per collator, then the settings that made it."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    settings = settings_columns(document)
    writer.writerow([column.csv_header or column.header for column in RESULT_COLUMNS] + list(settings))
    writer.writerows([column.value(result, entry) for column in RESULT_COLUMNS] + list(settings.values())
                     for result, entry in result_entries(document))
    return buffer.getvalue()


def contamination_table(document: dict) -> list[list]:
    return [[row["example"], row["length"], f"{row['flatten_max_abs_logit_diff']:.1e}",
             f"{row['naive_concat_max_abs_logit_diff']:.1e}"] for row in document["contamination"]]


HYBRID_HAZARD_KEY = "flatten_without_per_example_mixers_max_abs_logit_diff"  # attention/contamination.py's rows
CONTAMINATION_TITLE = ("Contamination check: logits of each example inside the packed row vs the example alone "
                       "(≈1e-6 is float rounding; naive concat moves them by O(1))")


def contamination_skipped(document: dict) -> str | None:
    """Why a run's contamination table is empty, or None when it has rows (or, saved before runs said why, it was
    complete)."""
    if document.get("contamination"):
        return None
    if document.get("contamination_not_checked"):
        return document["contamination_not_checked"]
    return "the run stopped before its last collator finished (the check runs only after a complete run)" \
        if document.get("partial") else None


def contamination_title(document: dict) -> str:
    """The contamination table's title: what it checks, or, when it is empty, why."""
    reason = contamination_skipped(document)
    return CONTAMINATION_TITLE if reason is None else f"Contamination check: not checked, {reason}"


def best_speedup(document: dict) -> float | None:
    """The best speedup over padded among the collators that compare like for like: those whose registry entry
    claims padded's losses (the same batches, the same loss). bfd trains other batches and naive-concat a wrong
    loss, so a larger number of theirs is not packing's speedup; a collator no longer registered is left out too."""
    speedups = [entry["speedup_vs_padded"] for name, entry in document.get("comparison", {}).items()
                if name != BASELINE and name in COLLATORS and COLLATORS[name].loss_parity
                and entry["speedup_vs_padded"] is not None]
    return max(speedups) if speedups else None


# ---- time anatomy -----------------------------------------------------------------------------------------------

# Operation classes whose time grows with the token slots a step computes (padding included), and the rest: per
# example attention (varlen / flash skip padding in the padded baseline too), the optimizer, data, Python overhead.
SCALES_WITH_SLOTS = ("matmul", "normalization", "elementwise")
DOES_NOT_SCALE = ("attention", "optimizer", "data", "other")


def anatomy_rows(document: dict, part: str) -> list[list[str]]:
    """A header and one row per profiled collator: `part` "phases" (CPU time on a CPU), "phases_wall" or "ops", in ms
    of the median profiled step, with backward / forward."""
    names = PHASES if part.startswith("phases") else OP_CLASSES
    rows = [["collator", "profiled steps", "median step ms", *names, "backward / forward"]]
    for result in document["results"]:
        anatomy = result.get("time_anatomy")
        if anatomy and part in anatomy:  # runs saved before the wall-clock phases have none
            ratio = backward_over_forward(anatomy, "phases_wall" if part == "phases_wall" else "phases")
            rows.append([result["collator"], ",".join(str(step) for step in _profiled(result)),
                         f"{anatomy['step_s'] * 1000:.0f}", *(f"{anatomy[part][name] * 1000:.0f}" for name in names),
                         "–" if ratio is None else f"{ratio:.2f}"])
    return rows


def _profiled(result: dict) -> list[int]:
    """The 1-based steps behind a result's anatomy (saved runs before several were profiled had one)."""
    return result.get("profiled_steps") or [result["profiled_step"]]


def times_words(before_s: float, after_s: float) -> str:
    """How much faster (or slower) `after_s` ran than `before_s`, in words that read right either way."""
    ratio = before_s / max(after_s, 1e-12)
    if ratio >= 1.005:
        return f"{ratio:.2f}× faster"
    if ratio <= 1 / 1.005:
        return f"{1 / ratio:.2f}× slower"
    return "as fast"


def _gap_sentence(padded: dict, result: dict) -> str:
    """Why `result` missed the ideal on the profiled steps: what shrank with packing, what did not, and a ratio
    beyond the batches' slots ideal said for what it is."""
    before, after = padded["time_anatomy"], result["time_anatomy"]
    indices = [step - 1 for step in _profiled(padded)]
    batch_ideal = (sum(padded["step_padded_slots"][i] for i in indices)
                   / sum(padded["step_real_tokens"][i] for i in indices))

    def part(anatomy: dict, classes: tuple[str, ...]) -> float:
        return sum(anatomy["ops"][name] for name in classes)

    scaling_share = part(before, SCALES_WITH_SLOTS) / before["step_s"]
    scaling_s = (part(before, SCALES_WITH_SLOTS), part(after, SCALES_WITH_SLOTS))
    steps = _profiled(padded)
    which = (f"profiled steps {', '.join(map(str, steps))} (median; slots ideal for those batches" if len(steps) > 1
             else f"profiled step {steps[0]} (slots ideal for that batch")
    sentence = (f"**{result['collator']}** on {which} {batch_ideal:.2f}×): {scaling_share:.0%} of padded's step was "
                f"matmul, normalization and element-wise work, which scales with padded slots; it ran "
                f"{times_words(*scaling_s)}. The other {1 - scaling_share:.0%} (attention per example, optimizer, "
                f"data, Python between operators) does not scale with padding; it ran "
                f"{times_words(part(before, DOES_NOT_SCALE), part(after, DOES_NOT_SCALE))}. The step: "
                f"{times_words(before['step_s'], after['step_s'])}.")
    beyond = max(scaling_s[0] / max(scaling_s[1], 1e-12), before["step_s"] / after["step_s"])
    if beyond > (1 + ABOVE_IDEAL_TOLERANCE) * batch_ideal:
        sentence += (f" {beyond:.2f}× is more than the {batch_ideal:.2f}× that removing padding can give: other work "
                     f"on the machine slowed padded's profiled steps more than {result['collator']}'s, or padded's "
                     f"larger matrices ran less efficiently; the speedup measured over the timed steps is the number "
                     f"to trust.")
    return sentence


def anatomy_doubt_lines(document: dict) -> list[str]:
    """One line per doubt of each collator's anatomy (anatomy.anatomy_doubts), for the page and the CLI."""
    return [f"{result['collator']}'s time anatomy: {doubt}" for result in document["results"]
            for doubt in (result.get("time_anatomy") or {}).get("doubts", [])]


def anatomy_markdown(document: dict) -> str:
    """The page's words under the anatomy figure: backward / forward, the gap to the ideal explained, and what not to
    take at face value."""
    profiled = [r for r in document["results"] if r.get("time_anatomy")]
    if not profiled:
        return "*No step was profiled: the anatomy needs at least 2 steps (step 2 is the first profiled one).*"
    ratios = ", ".join(f"{r['collator']} {backward_over_forward(r['time_anatomy']):.2f}×" for r in profiled)
    steps = ", ".join(str(step) for step in _profiled(profiled[0]))
    on_cpu = [r for r in profiled if "phases_cpu_s" in r["time_anatomy"]]
    clock = ""
    if on_cpu:  # phases from the process's CPU time: what other processes take from it cannot move between phases
        wall = ", ".join(f"{r['collator']} {backward_over_forward(r['time_anatomy'], 'phases_wall'):.2f}×"
                         for r in on_cpu)
        clock = (f"; phases measured in the process's CPU time, which other work on the machine cannot shift "
                 f"(wall clock: {wall})")
    lines = [f"Backward / forward time: {ratios} (the model training anatomy: backward ≈ 2× forward, two matmuls "
             f"per forward one{clock}). Steps {steps} of each burst, profiled with torch.profiler and left out of "
             "the throughput; each share is the median over those steps. The profiler slows a step, so compare "
             "shares, not seconds."]
    lines += [f"⚠ {line}." for line in anatomy_doubt_lines(document)]
    return "\n\n".join(lines + _gap_sentences(document))


def _gap_sentences(document: dict) -> list[str]:
    """One per profiled collator that trained padded's batches (only then are its profiled steps the same batches)."""
    profiled = [r for r in document["results"] if r.get("time_anatomy")]
    padded = next((r for r in profiled if r["collator"] == BASELINE), None)
    return [_gap_sentence(padded, result) for result in profiled if padded is not None and result is not padded
            and collator_spec(result["collator"]).same_batches_as_padded]


# ---- saved runs -------------------------------------------------------------------------------------------------

# The key columns first, as in the results table (the run id stays first: a picked row is found by it).
HISTORY_HEADERS = ["run id", "best speedup", "status", "saved (UTC)", "model", "dataset", "samples", "collators",
                   "steps", "batch", "attention"]


def run_summary(run_id: str, saved_at: str, document: dict) -> dict:
    """One saved run in a line: the `/history` API returns these, the page's history table shows them."""
    config = document.get("config", {})
    return {"run_id": run_id, "saved_at": saved_at,
            **{key: config.get(key) for key in ("model", "dataset", "collators", "steps", "batch_size", "seed",
                                                "max_length", "grad_accum")},
            "effective_batch_size": effective_batch_size(document), "batch": batch_words(document),
            # the examples the run used: fewer than asked for when the data had fewer
            "samples": document.get("dataset_stats", {}).get("count", config.get("samples")),
            "attention": config.get("resolved_attention", config.get("attention")),
            "best_speedup": best_speedup(document),
            "partial": bool(document.get("partial"))}


def history_row(summary: dict) -> list:
    best = summary["best_speedup"]
    return [summary["run_id"], "–" if best is None else f"{best:.2f}×",
            "stopped (partial)" if summary["partial"] else "complete",
            summary["saved_at"].replace("T", " ").replace("+00:00", ""), summary["model"],
            Path(summary["dataset"]).name, summary["samples"], ", ".join(summary["collators"]), summary["steps"],
            summary["batch"], summary["attention"]]


# ---- before training ---------------------------------------------------------------------------------------------

def human_seconds(seconds: float) -> str:
    """A duration as people say it: 12.4 -> "12 s", 250 -> "4.2 min", 90330 -> "25.1 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


PREDICTION_BASIS = {"history": "from earlier runs of this model here", "model": "by the step-time model for this GPU",
                    "parameters": "from the parameter count, on the slow side"}


def forecast_rows(preview: dict) -> str:
    """The cost table's rows for what Run will cost: its predicted time (duration.predicted) and peak memory against
    what this machine has (memory_guard), each with a warning when it is long or does not fit."""
    rows = []
    predicted, memory = preview.get("predicted"), preview.get("memory_guard")
    if predicted:
        warning = (f" ⚠ long: more than {human_seconds(predicted['long_after_s'])}; fewer steps, collators or a "
                   "smaller model finish sooner" if predicted["long"] else "")
        rows.append(f"| predicted time of the run, {PREDICTION_BASIS[predicted['basis']]} | "
                    f"**about {human_seconds(predicted['duration_s'])}**{warning} |")
    on_gpus = preview.get("gpu_predictions")
    best = next((name for name in ("flatten", *preview["config"]["collators"]) if name != "padded"
                 and on_gpus and name in next(iter(on_gpus.values()))["collators"]), None)
    if best is not None:
        rows.append(f"| speedup of {best} over padded on each GPU, predicted | " + " · ".join(
            f"{gpu['label']} {gpu['collators'][best]['speedup_vs_padded']:.2f}×" for gpu in on_gpus.values()) + " |")
    if memory and memory.get("available_bytes"):
        verdict = ("fits" if memory["fits"] else "⚠ does not fit: Run would be refused and say what fits")
        rows.append(f"| predicted peak memory of the run, {memory['device']} | "
                    f"**{human_bytes(memory['predicted_peak_bytes'])}** of {human_bytes(memory['available_bytes'])} "
                    f"available: {verdict} |")
    return "".join(f"\n{row}" for row in rows)


def cost_markdown(preview: dict) -> str:
    cost, config = preview["cost"], preview["config"]
    notes = "".join(f"\n\n*Note: {note}*" for note in preview["dataset_stats"].get("notes", []))
    return f"""| Before training (from the data and this machine) | |
|---|---|{forecast_rows(preview)}
| slots that are padding, over the {config['steps']} steps | **{cost['pad_fraction']:.0%}** |
| ideal speedup of packing (padded slots ÷ real tokens) | **{cost['ideal_speedup']:.2f}×** |
| attention scores, first batch: varlen Σsᵢ² | {cost['attention_scores_varlen']:,} |
| · padded B·L² | {cost['attention_scores_padded']:,} |
| · dense packed mask (Σsᵢ)² | {cost['attention_scores_dense_packed']:,} |
| optimizer steps per collator | {cost['optimizer_steps']} |
| attention path, device | {preview['attention']}, {preview['device']} |{notes}

{collator_notes(preview)}"""


def collator_notes(preview: dict) -> str:
    """What each selected collator and the attention path do to the numbers, one line each (from the registry)."""
    lines = [f"- **{name}**: {collator_spec(name).why}" for name in preview["config"]["collators"]]
    lines.append(f"- **{preview['attention']} attention**: {preview['attention_why']}")
    return "\n".join(lines)


# ---- the CLI's report ----------------------------------------------------------------------------------------------

def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width)
                               in enumerate(zip(row, widths))) for row in rows)


def loss_sentence(stats: dict, requested: str = "auto") -> str:
    """"loss on completion (TRL's default for prompt-completion data): 1,234 of 5,678 tokens carry loss"."""
    why = f" (TRL's default for {stats['layout']} data)" if requested == "auto" else ""
    return (f"loss on {stats['loss_on']}{why}: {stats['trained_tokens']:,} of {stats['total_tokens']:,} tokens "
            f"carry loss")


def marked_text(example: dict, keep: int = 60) -> str:
    """One shown example (dataset_stats.examples) on one line: the parts that carry loss in ⟦ ⟧, newlines as ⏎, and
    any stretch longer than `keep` characters cut in its middle."""
    text, pieces, start = example["text"], [], 0
    for begin, end in example.get("loss_spans", []):
        pieces += [(False, text[start:begin]), (True, text[begin:end])]
        start = end
    pieces.append((False, text[start:]))

    def short(piece: str) -> str:
        piece = piece.replace("\n", "⏎")
        return piece if len(piece) <= keep else f"{piece[:keep // 2]} … {piece[-keep // 2:]}"

    return "".join(f"⟦{short(piece)}⟧" if carries else short(piece) for carries, piece in pieces if piece)


def _data_lines(document: dict) -> list[str]:
    """What is trained: which tokens carry loss, per collator, and the first example with its trained part marked."""
    stats, config = document["dataset_stats"], document["config"]
    if "loss_on" not in stats:  # a document from before loss masks
        return []
    lines = [loss_sentence(stats, config.get("loss_on", "auto"))]
    if stats.get("examples"):
        lines.append(f"first example as trained, ⟦carries loss⟧: {marked_text(stats['examples'][0])}")
    if document["results"]:
        lines.append("tokens that carry loss / real tokens computed: " + ", ".join(
            f"{result['collator']} {result['trained_tokens']:,} / {result['real_tokens']:,}"
            for result in document["results"]))
    return lines


def rank_memory_lines(document: dict) -> list[str]:
    """Each rank's measured bytes per category at step 1 with the error of its estimate (`memory["ranks"]`); under
    FSDP the estimate is the planner's for this many GPUs, and one process's full copy is shown beside it."""
    if not any("ranks" in result["memory"] for result in document["results"]):
        return []
    world_size, fsdp = document["environment"]["world_size"], document["config"].get("fsdp")
    categories = ("weights", "gradients", "optimizer", "activations")

    def cell(entry: dict, category: str) -> str:
        measured, error = entry["measured"][category], entry["error"][category]
        return "–" if measured is None else f"{human_bytes(measured)} {'' if error is None else f'{error:+.2%}'}"

    rows = [["collator", "rank", *categories]]
    rows += [[result["collator"], str(rank), *(cell(entry, category) for category in categories)]
             for result in document["results"] for rank, entry in enumerate(result["memory"].get("ranks", []))]
    estimated_by = f"plan --gpus {world_size} --shard fsdp" if fsdp else "the estimate"
    lines = ["", f"memory per process at step 1, measured, and the error of {estimated_by}:", text_table(rows)]
    if fsdp and document["results"]:
        full = document["results"][0]["memory"]["unsharded_estimate"]
        lines.append("one process without sharding holds " + ", ".join(
            f"{category} {human_bytes(full[category])}" for category in categories[:3]))
    return lines


def training_words(config: dict) -> str:
    """What trains, when it is not every weight: "  LoRA r=8 on all-linear" (QLoRA: on a 4-bit base)."""
    if not config.get("lora_rank"):
        return ""
    base = " on a 4-bit base (QLoRA)" if config.get("qlora") else ""
    return f"  LoRA r={config['lora_rank']} on {','.join(config.get('lora_targets') or ['all-linear'])}{base}"


def format_report(document: dict) -> str:
    stats, config = document["dataset_stats"], document["config"]
    lines = [
        f"model {config['model']}  attention {config['resolved_attention']}  device {config['resolved_device']}  "
        f"precision {config['resolved_precision']}{training_words(config)}  {batch_words(document)}",
        f"dataset {stats['name']}: {stats['count']} examples, mean {stats['mean']:.0f} tokens, "
        f"p50 {stats['p50']:.0f}, p90 {stats['p90']:.0f}, p99 {stats['p99']:.0f}, max {stats['max']}",
        *_data_lines(document),
        "",
    ]
    columns = [column for column in RESULT_COLUMNS if column.in_terminal]
    rows = [[column.header for column in columns]]
    rows += [[column.show(result, entry) for column in columns] for result, entry in result_entries(document)]
    lines.append(text_table(rows))
    lines += [f"  {result['collator']}: {words}" for result, entry in result_entries(document)
              for words in flags_in_words(entry)]
    on_cpu = any("phases_cpu_s" in (result.get("time_anatomy") or {}) for result in document["results"])
    for part, by in (("phases", "phase" + (" (the process's CPU time, in shares of the step)" if on_cpu else "")),
                     ("phases_wall", "phase, wall clock"), ("ops", "operation")):
        if part == "phases_wall" and not on_cpu:  # on a GPU the phases are the wall clock already (or a saved run)
            continue
        anatomy = anatomy_rows(document, part)
        if len(anatomy) > 1:
            lines += ["", f"time anatomy of the profiled steps (median), by {by} (ms)", text_table(anatomy)]
    lines += [f"  {line}" for line in anatomy_doubt_lines(document)]
    gaps = _gap_sentences(document)
    lines += ["", *(gap.replace("**", "") for gap in gaps)] if gaps else []
    world_size = document["environment"].get("world_size", 1)
    if world_size > 1:
        sharding = "FSDP: weights, gradients and optimizer state sharded" if config.get("fsdp") else "DDP"
        lines.append(f"{world_size} processes ({sharding}), each training its own micro-batches: tokens/s and "
                     "samples/s are the aggregate; per process tokens/s:")
        lines += [f"  {result['collator']}: {' / '.join(f'{rate:.0f}' for rate in result['tokens_per_s_per_device'])}"
                  for result in document["results"] if result["tokens_per_s_per_device"]]
        lines += rank_memory_lines(document)
    contamination = document["contamination"]
    if contamination:
        lines.append("")
        lines.append(
            f"contamination check ({len(contamination)} examples): max |Δlogit| vs each example alone: "
            f"flatten {max(r['flatten_max_abs_logit_diff'] for r in contamination):.1e}, "
            f"naive-concat {max(r['naive_concat_max_abs_logit_diff'] for r in contamination):.1e}"
            + (f"; padding-free without per-example mixers (this hybrid's state crossing examples) "
               f"{max(r[HYBRID_HAZARD_KEY] for r in contamination):.1e}"
               if HYBRID_HAZARD_KEY in contamination[0] else "")
        )
    elif contamination_skipped(document):
        lines += ["", f"contamination check: not checked, {contamination_skipped(document)}"]
    if document.get("stop_reason"):
        lines.append(f"note: ended early: {document['stop_reason']}")
    lines += [f"note: {note}" for note in stats.get("notes", [])]
    return "\n".join(lines)
