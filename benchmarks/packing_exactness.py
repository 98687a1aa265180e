"""Which model families pack exactly: the table of docs/MODELS.md, from the families and measurement of
tests/test_packing_exactness.py (tests/model_families.py).

For each family: what a run does before training on the varlen path (capability, then the pre-flight check); when
it passes, the largest |Δlogit| over three layouts (left-padded, flattened with and without the flash kwargs) and
the largest |Δgrad|, each against every example alone on eager, in fp32; otherwise the refusal's reason.

    python benchmarks/packing_exactness.py                           # prints the markdown table
    python benchmarks/packing_exactness.py --readme docs/MODELS.md   # rewrites the table between its markers
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from demo_core.attention import preflight  # noqa: E402
from demo_core.attention import varlen as attention  # noqa: E402
from demo_core.errors import DemoInputError  # noqa: E402
from demo_core.models.sources import byte_tokenizer, config_source  # noqa: E402

from model_families import FAMILIES, measure_family  # noqa: E402

BEGIN, END = "<!-- packing-exactness:begin -->", "<!-- packing-exactness:end -->"
TABLE_DOC = "docs/MODELS.md"  # the doc that carries the table between the markers


def row(family) -> list[str]:
    source = config_source(family.name, family.make_config(), byte_tokenizer())
    try:
        preflight.exact_attention(source, attention.VARLEN, "cpu", ("padded", "flatten"))
    except DemoInputError as refusal:
        reason = str(refusal).split(": ", 1)[-1].split("; ")[0]  # without the "packing check for ..." prefix
        return [family.name, family.feature, "–", "–", f"refused: {reason}"]
    measured = measure_family(source)
    return [family.name, family.feature, f"{measured['logit_diff']:.1e}", f"{measured['grad_diff']:.1e}", "exact"]


def table() -> str:
    lines = ["| family | what it adds | max \\|Δlogit\\| | max \\|Δgrad\\| | varlen, packed |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in map(row, FAMILIES)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", type=Path,
                        help=f"rewrite the table between the markers in this file ({TABLE_DOC})")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models: per-op overhead, not compute
    text = (f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, fp32, CPU; "
            f"`python benchmarks/packing_exactness.py --readme {TABLE_DOC}`\n\n{table()}")
    if args.readme is None:
        print(text)
        return
    readme = args.readme.read_text()
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"{args.readme} has no {BEGIN} ... {END} markers")
    head, rest = readme.split(BEGIN, 1)
    args.readme.write_text(f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")


if __name__ == "__main__":
    main()
