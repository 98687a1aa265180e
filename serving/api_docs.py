"""What `gradio_client`'s `view_api()` and the page's API tab say about an endpoint: each parameter's name, type and
description, and the return value's type and description.

`gr.api` (Gradio 6.31) builds an endpoint from its function's type hints, but labels each parameter by its
position ("1st", "2nd", ...) with no description (a docstring's `Args:` reach only the MCP tab), and reads the
return type from the raw signature, where postponed annotations (`from __future__ import annotations`) leave the
string "dict", shown as "Any". `documented_api` resolves the signature first, registers the endpoint with `gr.api`,
then names each parameter's component after the parameter and gives it the docstring's description; the return
is typed by a `TypedDict` below and described by the docstring's `Returns:`. The descriptions live in one place,
the docstrings, which the MCP tab reads too.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, TypedDict

import gradio as gr
from gradio.utils import get_function_description, get_function_params

from demo_core import ATTENTION_NAMES, BUILTIN_DATASETS, COLLATORS, OPTIMIZER_NAMES, PRECISION_NAMES, PRESETS

# The choices the engine accepts, as types the API page lists (an unlisted value still reaches the engine's own
# validation, which names the choices in its message).
AttentionName = Literal[ATTENTION_NAMES]  # type: ignore[valid-type]
PrecisionName = Literal[PRECISION_NAMES]  # type: ignore[valid-type]
OptimizerName = Literal[OPTIMIZER_NAMES]  # type: ignore[valid-type]


class RunDocument(TypedDict):
    """A run as `python -m demo_core compare --json` writes it, plus why it ended (`stop_reason`)."""

    config: dict[str, Any]
    dataset_stats: dict[str, Any]
    results: list[dict[str, Any]]
    comparison: dict[str, dict[str, Any]]
    ideal_speedup: float
    contamination: list[dict[str, Any]]
    environment: dict[str, Any]
    partial: bool
    stop_reason: str | None


class PreviewDocument(TypedDict):
    """`demo_core.preview`: the numbers before any training."""

    config: dict[str, Any]
    dataset_stats: dict[str, Any]
    lengths: list[int]
    attention: str
    attention_why: str
    device: str
    batches: dict[str, dict[str, Any]]
    cost: dict[str, Any]
    predicted: dict[str, Any]  # the run's predicted time: duration_s, basis, setup_s, step_s, long, long_after_s


class RunSummary(TypedDict):
    """One saved run in a line (`demo_core.report.run_summary`), with what this client may do with it."""

    run_id: str
    saved_at: str
    model: str
    dataset: str
    collators: list[str]
    steps: int
    batch_size: int
    seed: int
    max_length: int
    samples: int
    attention: str
    best_speedup: float | None
    partial: bool
    private: bool
    yours: bool


SETTINGS_ARGS = f"""Args:
        model: a preset ({", ".join(PRESETS)}), a hub id, or a local folder under the allowed roots
        dataset: {" or ".join(BUILTIN_DATASETS)}, a hub dataset id, or a .json/.jsonl file under the allowed roots
        samples: how many examples to draw from the dataset
        collators: comma-separated collator names ({", ".join(COLLATORS)}), e.g. "padded,flatten"
        steps: optimizer steps per collator (step 1 is a warm-up, left out of the timings)
        batch_size: examples per step (for bfd and trl-bfd: packed rows)
        attention: auto (varlen or flash-attn 2 where they work), or one path by name
        seed: seed of the data order and of the initial weights
        max_length: longer examples are truncated to this many tokens
        precision: auto (bf16 on a GPU that has it, else fp32), or one by name
        optimizer: the optimizer every collator trains with
        dataset_file: a .json/.jsonl file used instead of dataset (gradio_client.handle_file), private to you"""


def with_settings_args(endpoint):
    """Appends the run settings' descriptions to the docstring's `Args:`, shared by the endpoints that take them."""
    summary, _, returns = endpoint.__doc__.partition("Returns:")
    endpoint.__doc__ = f"{summary.rstrip()}\n\n    {SETTINGS_ARGS}\n\n    Returns:{returns}"
    return endpoint


def _describe(component, name: str, description: str) -> None:
    component.label = name
    # `api_info` is the component's JSON schema; Gradio shows its `additional_description` next to the type.
    component._api_info = {**component.api_info(), "description": description,
                           "additional_description": description}


def documented_api(demo: gr.Blocks, endpoint, api_name: str, returns: str, **options) -> None:
    """`gr.api(endpoint, api_name=api_name, **options)`, with named, described parameters and a typed return called
    `returns`."""
    endpoint.__signature__ = inspect.signature(endpoint, eval_str=True)  # the types themselves, not their names
    dependency = gr.api(endpoint, api_name=api_name, **options)
    _, parameters, descriptions = get_function_description(endpoint)
    names = [name for name, *_ in get_function_params(endpoint)]  # what gr.api made components of
    for component_id, name in zip(dependency["inputs"], names, strict=True):
        _describe(demo.blocks[component_id], name, parameters[name])
    for component_id in dependency["outputs"]:
        _describe(demo.blocks[component_id], returns, " ".join(line.strip() for line in descriptions))
