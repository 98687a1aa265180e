"""Presentation of a run document, shared by the CLI and the page, so both show the same numbers the same way.

- `RESULT_COLUMNS`: one column per number of the results table (page table, CSV and the CLI's table), the key ones
  first (a phone shows the first few without scrolling);
- `headline`: one line per collator, its numbers next to why they look that way (the registry's `why`), and the
  attention path's;
- `contamination_title`: what the contamination table checks, or why it is empty;
- `run_summary`: one saved run in a line (the page's history table and the `/history` API);
- `cost_markdown`: the before-training cost table of a preview;
- `format_report`: the CLI's printed report.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Any, Callable

from .collators import BASELINE, collator_spec


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

    def show(self, result: dict, entry: dict) -> str:
        value = self.value(result, entry)
        if value is None:
            return "–"
        return self.fmt(value) if callable(self.fmt) else self.fmt.format(value)


RESULT_COLUMNS = (
    Column("collator", lambda r, c: r["collator"] + (" (partial)" if r["partial"] else ""), "{}"),
    Column("speedup vs padded", lambda r, c: c["speedup_vs_padded"], "{:.2f}×"),
    Column("ideal speedup", lambda r, c: c["ideal_speedup"], "{:.2f}×"),
    Column("max |Δloss| vs padded", lambda r, c: c["max_abs_loss_diff_vs_padded"], "{:.1e}"),
    Column("peak memory", lambda r, c: r["peak_memory_bytes"], human_bytes, csv_header="peak memory bytes"),
    Column("real tokens/s", lambda r, c: r["tokens_per_s"], "{:,.0f}"),
    Column("samples/s", lambda r, c: r["samples_per_s"], "{:.1f}"),
    Column("median step ms", lambda r, c: r["step_time_median_s"] * 1000, "{:.0f}"),
    Column("pad fraction", lambda r, c: r["pad_fraction"], "{:.1%}"),
    Column("final loss", lambda r, c: r["losses"][-1] if r["losses"] else None, "{:.4f}"),
    Column("steps", lambda r, c: r["steps"], "{}"),
    Column("attention", lambda r, c: r["attention"], "{}", in_terminal=False),
)
RESULT_HEADERS = [column.header for column in RESULT_COLUMNS]
CONTAMINATION_HEADERS = ["example", "tokens", "flatten max |Δlogit| vs alone", "naive-concat max |Δlogit| vs alone"]


def _rows(document: dict):
    for result in document["results"]:
        yield result, document["comparison"][result["collator"]]


def results_table(document: dict) -> list[list[str]]:
    return [[column.show(result, entry) for column in RESULT_COLUMNS] for result, entry in _rows(document)]


def results_csv(document: dict) -> str:
    """The results table with raw values (no rounding), one row per collator."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([column.csv_header or column.header for column in RESULT_COLUMNS])
    writer.writerows([column.value(result, entry) for column in RESULT_COLUMNS] for result, entry in _rows(document))
    return buffer.getvalue()


def contamination_table(document: dict) -> list[list]:
    return [[row["example"], row["length"], f"{row['flatten_max_abs_logit_diff']:.1e}",
             f"{row['naive_concat_max_abs_logit_diff']:.1e}"] for row in document["contamination"]]


CONTAMINATION_TITLE = ("Contamination check: logits of each example inside the packed row vs the example alone "
                       "(≈1e-6 is float rounding; naive concat moves them by O(1))")


def contamination_title(document: dict) -> str:
    """The contamination table's title: what it checks, or, when it is empty, why."""
    if document.get("contamination") or not document.get("partial"):
        return CONTAMINATION_TITLE
    return ("Contamination check: skipped, this run stopped before its last collator finished (the check runs only "
            "after a complete run)")


def best_speedup(document: dict) -> float | None:
    speedups = [entry["speedup_vs_padded"] for name, entry in document.get("comparison", {}).items()
                if name != BASELINE and entry["speedup_vs_padded"] is not None]
    return max(speedups) if speedups else None


def collator_key(name: str) -> str:
    """A swatch in the collator's plot colour, so that its line of text points at its bar and its curve."""
    return f'<span class="collator-key" style="background:{collator_spec(name).color}"></span>'


def _numbers(result: dict, entry: dict) -> str:
    if entry["speedup_vs_padded"] is None:
        return f"{result['tokens_per_s']:,.0f} real tokens/s"
    if result["collator"] == BASELINE:
        return f"{result['tokens_per_s']:,.0f} real tokens/s, the baseline"
    difference = entry["max_abs_loss_diff_vs_padded"]
    loss = ("loss identical to padded" if difference is not None and difference < 1e-4
            else f"loss differs from padded by up to {difference:.2f}")
    return f"{entry['speedup_vs_padded']:.2f}× the padded throughput (ideal {entry['ideal_speedup']:.2f}×), {loss}"


def collator_lines(document: dict, attention_why: str | None = None) -> list[str]:
    """Per collator of the run, its numbers and, in italics, why they look that way; then the attention path's
    why, when known (it comes from the preview: a saved run does not record it)."""
    lines = [f"{collator_key(result['collator'])} **{result['collator']}**: {_numbers(result, entry)}. "
             f"*{collator_spec(result['collator']).why}*" for result, entry in _rows(document)]
    if attention_why:
        lines.append(f"**{document['config'].get('resolved_attention')} attention**: *{attention_why}*")
    return lines


def headline(document: dict, seconds: float | None = None, attention_why: str | None = None) -> str:
    """The run in a few lines (markdown): done or stopped, each collator's numbers and why, and what is missing."""
    lines = collator_lines(document, attention_why)
    compared = [name for name, entry in document["comparison"].items()
                if name != BASELINE and entry["speedup_vs_padded"] is not None]
    selected = document["config"].get("collators", [])
    finished = [result["collator"] for result in document["results"]]
    if not compared and document.get("partial"):
        missing = [name for name in selected if name not in finished]
        lines.append(f"Stopped before {', '.join(missing) or 'the end'} finished: no speedup to compare yet.")
    elif not compared:
        lines.append(f"Add `{BASELINE}` and a packing collator to see a speedup.")
    if document.get("partial") and not document.get("contamination"):
        lines.append("The contamination check was skipped: it runs only after a complete run.")
    status = "Stopped: partial results" if document.get("partial") else "Done"
    timing = f" in {seconds:.1f} s" if seconds is not None else ""
    return f"### {status}{timing}\n" + "\n".join(f"- {line}" for line in lines)


# ---- saved runs -------------------------------------------------------------------------------------------------

# The key columns first, as in the results table (the run id stays first: a picked row is found by it).
HISTORY_HEADERS = ["run id", "best speedup", "status", "saved (UTC)", "model", "dataset", "samples", "collators",
                   "steps", "batch", "attention"]


def run_summary(run_id: str, saved_at: str, document: dict) -> dict:
    """One saved run in a line: the `/history` API returns these, the page's history table shows them."""
    config = document.get("config", {})
    return {"run_id": run_id, "saved_at": saved_at,
            **{key: config.get(key) for key in ("model", "dataset", "collators", "steps", "batch_size", "seed",
                                                "max_length")},
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
            summary["batch_size"], summary["attention"]]


# ---- before training ---------------------------------------------------------------------------------------------

def cost_markdown(preview: dict) -> str:
    cost, config = preview["cost"], preview["config"]
    notes = "".join(f"\n\n*Note: {note}*" for note in preview["dataset_stats"].get("notes", []))
    return f"""| Before training (from the data alone) | |
|---|---|
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


def format_report(document: dict) -> str:
    stats, config = document["dataset_stats"], document["config"]
    lines = [
        f"model {config['model']}  attention {config['resolved_attention']}  device {config['resolved_device']}  "
        f"precision {config['resolved_precision']}",
        f"dataset {stats['name']}: {stats['count']} examples, mean {stats['mean']:.0f} tokens, "
        f"p50 {stats['p50']:.0f}, p90 {stats['p90']:.0f}, p99 {stats['p99']:.0f}, max {stats['max']}",
        "",
    ]
    columns = [column for column in RESULT_COLUMNS if column.in_terminal]
    rows = [[column.header for column in columns]]
    rows += [[column.show(result, entry) for column in columns] for result, entry in _rows(document)]
    lines.append(text_table(rows))
    world_size = document["environment"].get("world_size", 1)
    if world_size > 1:
        lines.append(f"{world_size} processes (DDP), {config['batch_size'] // world_size} examples each per step: "
                     "tokens/s and samples/s are the aggregate; per process tokens/s:")
        lines += [f"  {result['collator']}: {' / '.join(f'{rate:.0f}' for rate in result['tokens_per_s_per_device'])}"
                  for result in document["results"]]
    contamination = document["contamination"]
    if contamination:
        lines.append("")
        lines.append(
            f"contamination check ({len(contamination)} examples): max |Δlogit| vs each example alone: "
            f"flatten {max(r['flatten_max_abs_logit_diff'] for r in contamination):.1e}, "
            f"naive-concat {max(r['naive_concat_max_abs_logit_diff'] for r in contamination):.1e}"
        )
    lines += [f"note: {note}" for note in stats.get("notes", [])]
    return "\n".join(lines)
