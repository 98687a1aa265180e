"""Packing Lab engine: real training bursts comparing padded and padding-free batching.

Public API: `run_comparison(RunConfig) -> Comparison` (its `.to_dict()` is the JSON contract), `preview(RunConfig)`
for the no-training views, and `DemoInputError` for user mistakes. Nothing here imports gradio.
"""

from .config import COLLATOR_NAMES, Limits, RunConfig
from .engine import preview, run_comparison
from .errors import DemoInputError
from .results import Comparison, Result

__all__ = ["COLLATOR_NAMES", "Comparison", "DemoInputError", "Limits", "Result", "RunConfig", "preview",
           "run_comparison"]
