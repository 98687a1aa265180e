"""Packing Lab engine: real training bursts comparing padded and padding-free batching.

Public API (what the CLI and the app use; nothing here imports gradio):
- `RunConfig`, `Limits`, `DemoInputError` (the one error type for user mistakes);
- `prepare(RunConfig) -> Prepared`, then `preview(prepared)` for the no-training views and
  `run_comparison(prepared) -> Comparison` (its `.to_dict()` is the JSON document); both also take a RunConfig;
- `COLLATORS` (the collator registry), the choices for the other settings, `PRESETS`, `BUILTIN_DATASETS`;
- `RunHistory`;
- the memory planner: `plan(PlanRequest) -> Plan`, `device_estimate`, `shipped_configs`, `largest_fit_words`;
- `settings`: the declaration every setting of `RunConfig` and `PlanRequest` is made with (CLI, page, API derive from it);
- `initialize_profiler()`: call once from the main thread of a server whose runs train in worker threads.

The engine returns numbers; the figures, tables and sentences that show them are the `presentation` package's.
"""

from . import settings
from .anatomy import initialize_profiler
from .collators import COLLATORS, CollatorSpec
from .config import ATTENTION_NAMES, OPTIMIZER_NAMES, PRECISION_NAMES, Limits, RunConfig
from .data import BUILTIN_DATASETS
from .engine import Prepared, prepare, preview, run_comparison
from .errors import DemoInputError
from .history import HistoryEntry, RunHistory, data_dir
from .memory_measure import CATEGORIES as MEMORY_CATEGORIES
from .models import PRESETS
from .planner import (EQUAL_LENGTHS, GIB, DeviceEstimate, Plan, PlanRequest, device_estimate,
                      largest_fit_words, plan, shipped_configs)
from .results import Comparison, Result, write_json

__all__ = ["ATTENTION_NAMES", "BUILTIN_DATASETS", "COLLATORS", "CollatorSpec", "Comparison", "DemoInputError",
           "DeviceEstimate", "EQUAL_LENGTHS", "GIB", "HistoryEntry", "Limits", "MEMORY_CATEGORIES",
           "OPTIMIZER_NAMES", "PRECISION_NAMES", "PRESETS", "Plan", "PlanRequest", "Prepared", "Result", "RunConfig",
           "RunHistory", "data_dir", "device_estimate", "initialize_profiler", "largest_fit_words", "plan", "prepare",
           "preview", "run_comparison", "settings", "shipped_configs", "write_json"]
