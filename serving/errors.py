"""Every exception a handler raises reaches the visitor as one readable `gr.Error`, never as a traceback.

A user mistake (`demo_core.DemoInputError`) keeps its message; anything else is logged on the server (upload paths
replaced by file names) and shown as "something went wrong" with its type only, since its message may name server
internals. The message stays on the page until the visitor closes it: one that vanished after a few seconds left a
red mark and no reason.

Every handler passes through `user_errors`, so it is also where a request counts as in flight (serving/in_flight.py)
for the background work that waits for an idle server.
"""

from __future__ import annotations

import functools
import inspect
import logging

import gradio as gr

import demo_core
from serving.in_flight import REQUESTS
from serving.uploads import RedactUploadPaths

logger = logging.getLogger("packing_lab.app")
logger.addFilter(RedactUploadPaths())  # an unexpected error's message or traceback may name an upload's server path


def as_ui_error(error: Exception) -> gr.Error:
    if isinstance(error, gr.Error):
        return error
    if isinstance(error, demo_core.DemoInputError):
        return gr.Error(str(error), duration=None, print_exception=False)
    logger.error("unexpected error", exc_info=error)
    return gr.Error(f"Something went wrong inside the app ({type(error).__name__}); the server log has the details.",
                    duration=None, print_exception=False)


def user_errors(fn):
    """Wraps a handler (plain or generator) so that its exceptions reach the page as `gr.Error`, and it counts as a
    request in flight while it runs (a generator until it ends or is closed)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def generator(*args, **kwargs):
            try:
                with REQUESTS.serving():
                    yield from fn(*args, **kwargs)
            except Exception as error:
                raise as_ui_error(error) from None
        return generator

    @functools.wraps(fn)
    def plain(*args, **kwargs):
        try:
            with REQUESTS.serving():
                return fn(*args, **kwargs)
        except Exception as error:
            raise as_ui_error(error) from None
    return plain
