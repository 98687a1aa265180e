"""A run as a report to send: one self-contained HTML file (`report_html`: every figure embedded as a PNG at twice
the pixels it is shown at, no request to anywhere when it opens), and the same as Markdown with its PNGs in a zip
(`report_zip`, for a pull request or an issue).

Both are one Markdown text (`report_markdown`): the headline, the run's figures, the results table, why each
collator's numbers look so, the time anatomy, the settings, the data, versions and device, the notes, and each
collator's script. The HTML is that Markdown rendered by markdown-it-py (CommonMark, tables on) with a small style
sheet of its own. The text of the examples goes in only with `include_examples` (the page asks the visitor whose
upload it is; the CLI's user owns their data).
"""

from __future__ import annotations

import base64
import io
import zipfile
from html import escape
from typing import Callable

from markdown_it import MarkdownIt
from matplotlib.figure import Figure

from demo_core.batch_semantics import document_batch
from demo_core.config import RunConfig
from demo_core.settings import declared
from presentation import headline, plots, report
from presentation.batch_words import batch_words
from presentation.recipe_script import command_line, scripts

DENSITY = 2  # device pixels per CSS pixel of the embedded PNGs: sharp on a laptop's or a phone's screen
# (file name, what it shows for a reader who cannot see it, how it is drawn)
FIGURES: tuple[tuple[str, str, Callable[[dict], Figure]], ...] = (
    ("throughput", "Real tokens per second per collator, each bar labelled with its speedup over padded",
     plots.throughput_figure),
    ("memory", "Memory at the peak of a step per collator, by category, estimated beside measured",
     plots.memory_figure),
    ("loss", "Training loss per step, one line per collator", plots.loss_figure),
    ("anatomy", "Where the median profiled step's time went per collator, by phase and by operation",
     plots.anatomy_figure),
)
STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #1f2328; }
h1, h2, h3 { line-height: 1.25; } h2 { border-bottom: 1px solid #d1d9e0; padding-bottom: .3rem; margin-top: 2rem; }
table { border-collapse: collapse; display: block; overflow-x: auto; margin: 1rem 0; }
th, td { border: 1px solid #d1d9e0; padding: .3rem .6rem; text-align: left; vertical-align: top; }
pre { background: #f6f8fa; padding: 1rem; overflow-x: auto; font-size: 13px; line-height: 1.4; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
img { max-width: 100%; height: auto; }
.glance { display: flex; flex-wrap: wrap; gap: .75rem; } .glance-card { border: 1px solid #d1d9e0;
  border-radius: .5rem; padding: .75rem 1rem; } .glance-stats { display: flex; gap: 1.5rem; flex-wrap: wrap; }
.glance-stat { display: flex; flex-direction: column; max-width: 14rem; } .glance-number { font-size: 1.8rem;
  font-weight: 700; } .glance-caption { font-size: .85rem; color: #59636e; } .glance-flags { color: #9a6700; }
.glance-number, .glance-caption { display: block; } .glance-table .glance-what { display: none; }
.collator-key { display: inline-block; width: .8em; height: .8em; margin-right: .35em; border-radius: 2px; }
"""


def figure_png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=figure.dpi * DENSITY)
    return buffer.getvalue()


def figures(document: dict) -> dict[str, tuple[bytes, int, str]]:
    """name -> (PNG bytes, the CSS pixels wide it is shown at, its alt text); none for a run without results."""
    if not document["results"]:
        return {}
    drawn = {}
    for name, alt, draw in FIGURES:
        figure = draw(document)
        drawn[name] = (figure_png(figure), round(figure.get_figwidth() * plots.FIGURE_DPI), alt)
    return drawn


def _table(header: list[str], rows: list[list]) -> str:
    def cell(value) -> str:
        return escape(str(value)).replace("|", "\\|").replace("\n", " ")

    return "\n".join(["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(map(cell, row)) + " |" for row in rows)])


def settings_rows(document: dict) -> list[list[str]]:
    """Every declared setting as asked and, where the engine decided it, as it trained; then the batch in words."""
    config = document["config"]
    rows = []
    for item in declared(RunConfig):
        value = config.get(item.name, item.default)
        value = ", ".join(value) if isinstance(value, (list, tuple)) else value
        resolved = config.get(f"resolved_{item.name}", value)
        rows.append([item.name, value, "" if resolved == value else resolved])
    return rows + [["batch", batch_words(document), ""]]


def _data_lines(document: dict, include_examples: bool) -> list[str]:
    stats = document["dataset_stats"]
    lines = [f"**{escape(str(stats['name']))}**: {stats['count']} examples, mean {stats['mean']:.0f} tokens, p50 "
             f"{stats['p50']:.0f}, p90 {stats['p90']:.0f}, p99 {stats['p99']:.0f}, max {stats['max']}."]
    if "loss_on" in stats:
        lines.append(report.loss_sentence(stats, document["config"].get("loss_on", "auto")) + ".")
    if include_examples and stats.get("examples"):
        lines += ["", "The first examples as trained (⟦the parts that carry loss⟧):", ""]
        lines += [f"- `{report.marked_text(example, keep=200)}`" for example in stats["examples"]]
    elif stats.get("examples"):
        lines.append("*The examples' text is left out of this report.*")
    return lines


def _notes(document: dict) -> list[str]:
    notes = [f"{result['collator']}: {words}" for result, entry in report.result_entries(document)
             for words in report.flags_in_words(entry)]
    notes += report.anatomy_doubt_lines(document)
    skipped = report.contamination_skipped(document)
    if skipped:
        notes.append(f"contamination check not run: {skipped}")
    if document.get("stop_reason"):
        notes.append(f"ended early: {document['stop_reason']}")
    notes += document["dataset_stats"].get("notes", [])
    shape = document_batch(document)
    if shape.saved_before:
        notes.append(f"saved before batch size meant the per-device micro-batch: {batch_words(document)}")
    return notes


def report_markdown(document: dict, image_source: Callable[[str, bytes], str], drawn: dict | None = None,
                    include_examples: bool = False, title: str | None = None) -> str:
    """The report as Markdown; `image_source(name, png)` says where each figure's image is (a file name in the zip,
    a data URI in the HTML)."""
    drawn = figures(document) if drawn is None else drawn
    config = document["config"]
    lines = [f"# {escape(title or 'Packing Lab run')}", "",
             f"`{config['model']}` on `{config['dataset']}` · {config['steps']} steps · {batch_words(document)} · "
             f"{config.get('resolved_attention', config.get('attention'))} attention · "
             f"{config.get('resolved_device', config.get('device'))}", "",
             "## At a glance" + (" (stopped: partial results)" if document.get("partial") else ""), "",
             headline.numbers(document), ""]
    if drawn:
        lines += ["## Figures", ""]
        lines += [f'<img src="{image_source(name, png)}" width="{width}" alt="{escape(alt)}">'
                  for name, (png, width, alt) in drawn.items() if name != "anatomy"]
    lines += ["", "## Results per collator", "", _table(report.RESULT_HEADERS, report.results_table(document)), "",
              "## Why each collator's numbers look the way they do", "", headline.detail_markdown(document), ""]
    if "anatomy" in drawn:
        png, width, alt = drawn["anatomy"]
        lines += ["## Time anatomy", "", f'<img src="{image_source("anatomy", png)}" width="{width}" '
                                         f'alt="{escape(alt)}">', "", report.anatomy_markdown(document), ""]
    if document.get("contamination"):
        lines += ["## Contamination check", "", report.contamination_title(document), "",
                  _table(report.CONTAMINATION_HEADERS, report.contamination_table(document)), ""]
    lines += ["## Settings", "", _table(["setting", "as asked", "as trained"], settings_rows(document)), "",
              "## Data", "", *_data_lines(document, include_examples), "",
              "## Versions and device", "", _table(["", "version, device"], [[key, value] for key, value in
                                                            document.get("environment", {}).items()]), ""]
    notes = _notes(document)
    if notes:
        lines += ["## Notes", "", *(f"- {escape(note)}" for note in notes), ""]
    code = scripts(document)
    if code:
        lines += ["## The run as code", "",
                  "Each collator's burst as a script; the files they read are written beside them by:", "",
                  f"    {command_line(config)}", ""]
        for name, text in code.items():
            lines += [f"### train_{name}.py", "", "```python", text.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def _data_uri(name: str, png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def report_html(document: dict, include_examples: bool = False, title: str | None = None,
                drawn: dict | None = None) -> str:
    """One HTML file that needs nothing else: its figures inline, its style sheet inline, no link to fetch. `drawn`:
    the `figures` of the document, when the zip draws them too."""
    markdown = report_markdown(document, _data_uri, drawn, include_examples, title)
    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)
    return (f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{escape(title or 'Packing Lab run')}</title>\n<style>{STYLE}</style>\n</head>\n"
            f"<body>\n{body}</body>\n</html>\n")


def report_zip(document: dict, include_examples: bool = False, title: str | None = None,
               drawn: dict | None = None) -> bytes:
    """report.md and figures/<name>.png, zipped."""
    drawn = figures(document) if drawn is None else drawn
    markdown = report_markdown(document, lambda name, png: f"figures/{name}.png", drawn, include_examples, title)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("report.md", markdown)
        for name, (png, _, _) in drawn.items():
            archive.writestr(f"figures/{name}.png", png)
    return buffer.getvalue()


def report_files(document: dict, include_examples: bool = False, title: str | None = None) -> tuple[str, bytes]:
    """(the HTML report, the Markdown zip) of one run, its figures drawn once for both."""
    drawn = figures(document)
    return (report_html(document, include_examples, title, drawn),
            report_zip(document, include_examples, title, drawn))
