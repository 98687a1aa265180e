"""The history as one visitor sees it: which runs they may list and redraw, and which they may delete.

Everyone's shared runs (built-in, hub and allowed-root data) are listed to everyone; a private run (made on an
uploaded file) only to the session that made it. Only the session that made a run may delete it, and the answer for
another visitor's run is the same as for no run at all, so that deleting cannot be used to probe for private runs.
"""

from __future__ import annotations

from demo_core import DemoInputError
from presentation import report
from serving import downloads
from serving.history import HistoryEntry, RunHistory
from serving.sessions import Session

PRIVATE_MARK = " (private to this tab)"


def summaries(history: RunHistory, session: Session) -> list[dict]:
    """One summary per run the session may see, oldest first, with `private` and `yours` (it may delete it)."""
    return [{**report.run_summary(entry.run_id, entry.saved_at, entry.document), "private": entry.private,
             "yours": entry.owner == session.key} for entry in history.visible_to(session.key)]


def table(history: RunHistory, session: Session) -> list[list]:
    """The page's history rows, newest first; a private run's dataset is marked as such."""
    column = report.HISTORY_HEADERS.index("dataset")
    rows = []
    for summary in reversed(summaries(history, session)):
        row = report.history_row(summary)
        if summary["private"]:
            row[column] += PRIVATE_MARK
        rows.append(row)
    return rows


def entry(history: RunHistory, session: Session, run_id: str) -> HistoryEntry:
    found = history.get(run_id)
    if found is None or not found.visible_to(session.key):
        raise DemoInputError("that run is no longer in the history")
    return found


def delete(history: RunHistory, session: Session, run_ids: set[str] | None = None,
           private_only: bool = False) -> list[str]:
    """Deletes the session's runs (those in `run_ids`, or all; only private ones if asked), with their downloads."""
    mine = {entry.run_id for entry in history.entries()
            if entry.owner == session.key and (entry.private or not private_only)}
    strangers = sorted((run_ids or set()) - mine)
    if strangers:
        raise DemoInputError(f"run {strangers[0]!r} is not one of yours: only the browser tab or API client that made "
                             "a run can delete it")
    wanted = mine if run_ids is None else run_ids
    deleted = history.delete(session.key, wanted) if wanted else []
    downloads.forget(deleted)
    return deleted
