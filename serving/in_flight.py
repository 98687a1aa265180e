"""Whether the server is serving a visitor right now, for background work that should use idle time only.

Every handler counts itself in for as long as it runs: `serving/errors.py` `user_errors`, which wraps them all, holds
`REQUESTS.serving()` around the call (a generator handler, such as a run on the page, until its last yield). Work
nobody waits for (the planner's warm-up of its LoRA questions, serving/planner_page.py) calls
`REQUESTS.wait_until_idle()` before each piece of it, so it never takes a core or a lock from a visitor who waits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class InFlight:
    """A count of the requests being served, and a wait for a moment with none."""

    def __init__(self):
        self._changed = threading.Condition()
        self.count = 0  # handlers running now
        self.waiting = 0  # background jobs held back until the count is 0

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        with self._changed:
            self.count += 1
        try:
            yield
        finally:
            with self._changed:
                self.count -= 1
                self._changed.notify_all()

    def wait_until_idle(self) -> None:
        """Returns once no request is being served (at once when none is)."""
        with self._changed:
            self.waiting += 1
            try:
                self._changed.wait_for(lambda: self.count == 0)
            finally:
                self.waiting -= 1


REQUESTS = InFlight()
