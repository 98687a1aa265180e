"""The one error type for user mistakes.

Anything a user can get wrong (a model name, a file, a number) raises `DemoInputError` with a message written for
that user. The CLI prints it as `error: ...` and exits 2; the app turns it into `gr.Error`. Every other exception is
a bug in this code and is allowed to surface as one.
"""

import os


class DemoInputError(ValueError):
    """A user-facing mistake: the message is shown as is, without a traceback."""


def offline_hint(what: str) -> str:
    """The clause to add to a failed hub load when the hub is switched off (HF_HUB_OFFLINE=1), else nothing."""
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    return f" (offline: only {what} already in the local cache can be used)" if offline else ""
