"""`python -m demo_core compare ...`: the engine headless. Prints a table; `--json PATH` writes the document (each
result with its script, `code`), `--emit-code DIR` the scripts with what they read offline, `--report PATH.html` a
self-contained report (and the same as Markdown with its PNGs, `<name>-markdown.zip` beside it).

Bad input exits 2 with one line `error: ...` on stderr and no traceback (argparse's own errors included).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commandline.plan import add_plan_parser, run_plan
from demo_core.attention.capability import capability_table
from demo_core.config import RunConfig
from demo_core.errors import DemoInputError
from demo_core.results import write_json
from demo_core.settings import add_arguments, from_arguments
from demo_core.training import distributed
from demo_core.training.engine import prepare, run_comparison
from demo_core.training.recipe import SCRIPT_NAME, write_assets
from presentation.recipe_script import with_code
from presentation.report import format_report, text_table  # the CLI's words, as the page's: one presentation


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump: the contract for bad input
        raise DemoInputError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m demo_core", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    compare = commands.add_parser("compare", help="run a short training burst per collator and compare them")
    add_arguments(compare, RunConfig)  # a flag per declared setting (config.py, settings.py)
    compare.add_argument("--json", metavar="PATH", help="write the full result document here")
    compare.add_argument("--emit-code", metavar="DIR",
                         help="write DIR/train_<collator>.py for each collator, a script that trains its burst's "
                              "steps with transformers / TRL / peft, and what it reads offline (a preset's initial "
                              "weights and tokenizer, the data in the run's order)")
    compare.add_argument("--report", metavar="PATH.html",
                         help="write one self-contained HTML report (headline, figures, tables, settings, versions, "
                              "notes, the scripts) that opens offline, and the same as Markdown with its PNGs in "
                              "<name>-markdown.zip beside it")
    caps = commands.add_parser("capabilities", help="which attention path works for which model family and device")
    caps.add_argument("--models", default="tiny-llama,tiny-mistral,tiny-qwen2,tiny-gemma,tiny-phi3,tiny-granite,tiny-gpt2")
    add_plan_parser(commands)
    return parser


def emit_code(prepared, document: dict, directory: Path) -> list[Path]:
    """The scripts of `document` (its results' `code`) and what they read, into `directory`."""
    written = write_assets(prepared, directory)
    for result in document["results"]:
        path = directory / SCRIPT_NAME.format(result["collator"])
        path.write_text(result["code"])
        written.append(path)
    return written


def report_paths(report: str) -> tuple[Path, Path]:
    """(the HTML report, the Markdown zip beside it) of `--report PATH.html`."""
    page = Path(report)
    return page, page.with_name(f"{page.stem}-markdown.zip")


def check_outputs(args) -> None:
    """Where the run's files go, checked before it trains: a mistyped path costs no training. The scripts' folder
    is made first, so that the JSON and the report may go into it."""
    if args.emit_code:
        if Path(args.emit_code).exists() and not Path(args.emit_code).is_dir():
            raise DemoInputError(f"--emit-code {args.emit_code} is a file: give a folder (it is created if missing)")
        Path(args.emit_code).mkdir(parents=True, exist_ok=True)
    for flag, value in (("--json", args.json), ("--report", args.report)):
        if value and not Path(value).resolve().parent.is_dir():
            raise DemoInputError(f"{flag} {value}: the folder {Path(value).parent} does not exist")
        if value and Path(value).is_dir():
            raise DemoInputError(f"{flag} {value} is a folder: give a file name")


def _compare(args) -> None:
    check_outputs(args)
    prepared = prepare(from_arguments(RunConfig, args))
    document = with_code(run_comparison(prepared).to_dict())
    distributed.close()
    if not distributed.is_main_process():
        return  # under a launcher rank 0 reports for the whole group; the others exit 0 quietly
    if args.emit_code:
        emit_code(prepared, document, Path(args.emit_code))
    if args.json:
        write_json(document, args.json)
    if args.report:
        # Imported when asked: the report draws figures, and a training machine may have no matplotlib
        # (docs/GPU_OFFLINE.md); tests/test_cli.py trains without it.
        from presentation.run_report import report_files

        page, archive = report_files(document, include_examples=True)  # the CLI's user trained on their own data
        html_path, zip_path = report_paths(args.report)
        html_path.write_text(page)
        zip_path.write_bytes(archive)
    print(format_report(document))


def _capabilities(args) -> None:
    from demo_core.models.sources import load_model_source

    configs = {name: load_model_source(name).config for name in args.models.split(",") if name}
    rows = [["model", "attention", "device", "works", "why"]]
    rows += [[r["model"], r["attention"], r["device"], "yes" if r["works"] else "no", r["why"]]
             for r in capability_table(configs)]
    print(text_table(rows))


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        {"compare": _compare, "capabilities": _capabilities, "plan": run_plan}[args.command](args)
    except DemoInputError as error:
        print(f"error: {error}", file=sys.stderr)
        distributed.wait_for_failing_ranks()  # under a launcher: let every rank print it before any exits
        return 2
    except OSError as error:  # e.g. --json into a folder that does not exist
        print(f"error: {error.strerror or error}: {error.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    return 0
