"""The one error type for user mistakes.

Anything a user can get wrong (a model name, a file, a number) raises `DemoInputError` with a message written for
that user. The CLI prints it as `error: ...` and exits 2; the app turns it into `gr.Error`. Every other exception is
a bug in this code and is allowed to surface as one.
"""


class DemoInputError(ValueError):
    """A user-facing mistake: the message is shown as is, without a traceback."""

