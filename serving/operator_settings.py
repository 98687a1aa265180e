"""The operator's settings, read from the environment, checked together when the app starts.

A bad value (`PACKING_LAB_MAX_SAMPLES=lots`, `PACKING_LAB_PLANNER_WARMUP=some`) stops `python app.py` with one
`error: ...` line and exit status 2 before the server binds, as the CLI does for its flags, instead of a traceback,
or a server that starts and fails at the first run, upload or planner question that reads the setting.
"""

from __future__ import annotations

import sys

from demo_core import DemoInputError, Limits
from serving import planner_page, runs, uploads


def checked_limits() -> Limits:
    """The run caps (`Limits.from_env`), once every other setting read later has been checked too."""
    try:
        limits = Limits.from_env()
        runs.run_time_cap_s()
        uploads.max_age_s()
        planner_page.warm_up_scope()
    except DemoInputError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return limits
