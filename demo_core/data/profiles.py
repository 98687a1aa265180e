"""A dataset's length profile read from a text file: one example's length in tokens per line, as a planner user
brings it (`plan --dataset lengths.txt`), so a plan prices their own data without the data itself."""

from __future__ import annotations

from pathlib import Path

from demo_core.errors import DemoInputError

PROFILE_SUFFIX = ".txt"


def is_length_profile(dataset: str | None) -> bool:
    return bool(dataset) and str(dataset).lower().endswith(PROFILE_SUFFIX)


def read_length_profile(path: str) -> tuple[int, ...]:
    """The token lengths in a .txt file, one whole number of at least 1 per line (blank lines skipped); a bad line is
    named by its number."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DemoInputError(f"length profile {path} not found: give a .txt file with one token length per line")
    lengths = []
    for number, line in enumerate(file.read_text(errors="replace").splitlines(), start=1):
        text = line.strip()
        if not text:
            continue
        if not text.isdigit() or int(text) < 1:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise DemoInputError(f"line {number} of {path}: expected a token length (a whole number of at least 1), "
                                 f"got {shown!r}")
        lengths.append(int(text))
    if not lengths:
        raise DemoInputError(f"length profile {path} holds no lengths: one whole number per line")
    return tuple(lengths)
