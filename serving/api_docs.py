"""What `gradio_client`'s `view_api()` and the page's API tab say about an endpoint: each parameter's name, type and
description, and the return value's type and description.

`gr.api` (Gradio 6.31) builds an endpoint from its function's type hints, but labels each parameter by its
position ("1st", "2nd", ...) with no description (a docstring's `Args:` reach only the MCP tab), and reads the
return type from the raw signature, where postponed annotations (`from __future__ import annotations`) leave the
string "dict", shown as "Any". `documented_api` resolves the signature first, registers the endpoint with `gr.api`,
then names each parameter's component after the parameter and gives it the docstring's description; the return
is typed by a `TypedDict` below and described by the docstring's `Returns:`. The descriptions live in one place,
the docstrings, which the MCP tab reads too.

The endpoints that take a run's (or a plan's) settings get their signature and their `Args:` from the declared
settings (`settings_endpoint`, demo_core/settings.py): a setting declared with an `api` position is a parameter.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Literal, TypedDict

import gradio as gr
from gradio.utils import get_function_description, get_function_params

from demo_core.settings import Setting, api_settings


class RunDocument(TypedDict):
    """A run as `python -m demo_core compare --json` writes it, plus why it ended (`stop_reason`)."""

    config: dict[str, Any]
    dataset_stats: dict[str, Any]
    results: list[dict[str, Any]]
    comparison: dict[str, dict[str, Any]]
    ideal_speedup: float
    contamination: list[dict[str, Any]]
    contamination_not_checked: str | None
    environment: dict[str, Any]
    partial: bool
    memory_guard: dict[str, Any] | None
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
    memory_guard: dict[str, Any]
    predicted: dict[str, Any]  # the run's predicted time: duration_s, basis, setup_s, step_s, long, long_after_s
    # the same comparison on each GPU of the table: per GPU its label and per collator tokens_per_s, step_s and
    # speedup_vs_padded (docs/THROUGHPUT.md)
    gpu_predictions: dict[str, dict[str, Any]]


class RunSummary(TypedDict):
    """One saved run in a line (`presentation.report.run_summary`), with what this client may do with it."""

    run_id: str
    saved_at: str
    model: str
    dataset: str
    collators: list[str]
    steps: int
    batch_size: int  # as saved: per device since batch_semantics, the whole step's before (see `batch`)
    grad_accum: int | None
    effective_batch_size: int
    batch: str  # the batch in words, saying when a run was saved before batch size meant per device
    seed: int
    max_length: int
    samples: int
    attention: str
    best_speedup: float | None
    partial: bool
    private: bool
    yours: bool


class SharedLink(TypedDict):
    """A shared link (`/share`): its token, the query that opens it on the page, and the run it copies."""

    token: str
    query: str
    run_id: str


@dataclasses.dataclass(frozen=True)
class ApiParameter:
    """A parameter an endpoint takes besides the declared settings (the uploaded file), at its fixed position."""

    position: int
    name: str
    type: Any
    help: str
    default: Any = None


# The file parameter of /compare and /preview, added after the eleven settings of the time; settings declared later
# take the positions after it (RunConfig's `api`), so that no positional call ever changes meaning.
DATASET_FILE = ApiParameter(11, "dataset_file", gr.FileData | None,
                            "a .json/.jsonl file used instead of dataset (gradio_client.handle_file), private to you")


def _api_type(item: Setting):
    """What the API page lists: the choices as `Literal[...]`, a list setting as its comma-separated string."""
    if item.choices is not None:
        return Literal[item.choice_values()]  # type: ignore[valid-type]
    return str if item.base is tuple else item.type


def settings_endpoint(handler: Callable, defaults, *extras: ApiParameter) -> Callable:
    """An endpoint for `gr.api` whose signature is derived from the declared settings of `defaults`' dataclass (its
    `api` positions, types and help; the values of `defaults` as defaults) plus `extras`, then the `gr.Request` when
    the handler takes one.

    `gr.api` reads the signature (parameter names, order, defaults), the type hints and the docstring's `Args:`, and
    calls the endpoint with positional values: the endpoint binds them to their names and calls
    `handler(**by name)`, so the handler itself takes the settings by name (`**settings`)."""
    items = api_settings(type(defaults))
    parameters = [(item.name, _api_type(item), getattr(defaults, item.name), item.described()) for item in items]
    for extra in sorted(extras, key=lambda extra: extra.position):
        parameters.insert(extra.position, (extra.name, extra.type, extra.default, extra.help))
    kind, handler_signature = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.signature(handler, eval_str=True)
    asks_request = "request" in handler_signature.parameters  # Gradio fills it in: it is no API parameter
    signature = inspect.Signature(
        [inspect.Parameter(name, kind, default=",".join(default) if isinstance(default, tuple) else default,
                           annotation=kind_of) for name, kind_of, default, _ in parameters]
        + [inspect.Parameter("request", kind, default=None, annotation=gr.Request)] * asks_request,
        return_annotation=handler_signature.return_annotation)

    @functools.wraps(handler)
    def endpoint(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return handler(**bound.arguments)

    endpoint.__signature__ = signature
    endpoint.__annotations__ = {**{name: p.annotation for name, p in signature.parameters.items()},
                                "return": signature.return_annotation}
    summary, _, returns = (handler.__doc__ or "").partition("Returns:")
    described = "\n".join(f"        {name}: {help}" for name, _, _, help in parameters)
    endpoint.__doc__ = f"{summary.rstrip()}\n\n    Args:\n{described}\n\n    Returns:{returns}"
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
