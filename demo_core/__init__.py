"""Packing Lab engine: real training bursts comparing padded and padding-free batching.

Public API (what the CLI and the app use; nothing here imports gradio):
- `RunConfig`, `Limits`, `DemoInputError` (the one error type for user mistakes);
- `prepare(RunConfig) -> Prepared`, then `preview(prepared)` for the no-training views and
  `run_comparison(prepared) -> Comparison` (its `.to_dict()` is the JSON document); both also take a RunConfig;
- `COLLATORS` (the collator registry), the choices for the other settings, `PRESETS`, `BUILTIN_DATASETS`;
- the memory planner: `plan(PlanRequest) -> Plan`, `device_estimate`, `shipped_configs`; `planned(PlanRequest)`: the
  plan with each collator's predicted speed on its GPU (`Plan.throughput`), `GPUS` the cards it knows;
- `settings`: the declaration every setting of `RunConfig` and `PlanRequest` is made with (CLI, page, API derive from it);
- `initialize_profiler()`: call once from the main thread of a server whose runs train in worker threads;
- `freeze_start_up_objects()`: call once when a server has started, so that each run's garbage collection walks only
  what runs made;
- `release_caches()`: empties every cache the engine keeps across calls (each is bounded) and hands the freed memory
  back to the system.

The engine returns numbers; the figures, tables and sentences that show them are the `presentation` package's.
"""

from demo_core import settings
from demo_core.caches import freeze_start_up_objects, release_caches
from demo_core.collators import COLLATORS, CollatorSpec
from demo_core.config import ATTENTION_NAMES, OPTIMIZER_NAMES, PRECISION_NAMES, Limits, RunConfig
from demo_core.data.loading import BUILTIN_DATASETS
from demo_core.errors import DemoInputError
from demo_core.gpus import GPUS
from demo_core.memory.measure import CATEGORIES as MEMORY_CATEGORIES
from demo_core.memory.plan_request import EQUAL_LENGTHS, GIB, PlanRequest, shipped_configs
from demo_core.memory.planner import DeviceEstimate, Plan, device_estimate, plan
from demo_core.models.sources import PRESETS
from demo_core.results import Comparison, Result, write_json
from demo_core.throughput.planning import planned
from demo_core.training.anatomy import initialize_profiler
from demo_core.training.engine import prepare, preview, run_comparison
from demo_core.training.prepared import Prepared

__all__ = ["ATTENTION_NAMES", "BUILTIN_DATASETS", "COLLATORS", "CollatorSpec", "Comparison", "DemoInputError",
           "DeviceEstimate", "EQUAL_LENGTHS", "GIB", "GPUS", "Limits", "MEMORY_CATEGORIES",
           "OPTIMIZER_NAMES", "PRECISION_NAMES", "PRESETS", "Plan", "PlanRequest", "Prepared", "Result", "RunConfig",
           "device_estimate", "freeze_start_up_objects", "initialize_profiler", "plan", "planned", "prepare",
           "preview", "release_caches", "run_comparison", "settings", "shipped_configs", "write_json"]
