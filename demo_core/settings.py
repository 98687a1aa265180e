"""Settings declared once: a setting is a dataclass field whose metadata says everything the CLI, the page, the API
and the provenance line need, as TRL declares its trainer's options (`trl/trainer/sft_config.py`:
`field(default=..., metadata={"help": ...})`).

    learning_rate: float = setting(1e-3, help="the optimizer's learning rate", minimum=0, api=12,
                                   page=Widget(order=12, more=True))

`RunConfig` (config.py) and the planner's `PlanRequest` (planner.py) are declared this way, and everything else is
derived from their fields, in one place each:

- validation: numbers from any client (`as_int` / `as_float`), ranges (`minimum`, `maximum`: a number or the name of
  a `Limits` field) and closed `choices` (`checked_values`); what a declaration cannot say stays in `validated()`;
- the CLI (`add_arguments`, `from_arguments`): a flag per field, `--max-length` for `max_length`, its help the
  `help` plus the choices or built-in names, a bool as a switch;
- the page (serving/widgets.py): a widget per field with a `page=Widget(...)`, in `Widget.order`, its info the
  `help`; the line that says which settings a section shows (serving/provenance.py), from `shown`;
- the API (serving/api_docs.py): a parameter per field with an `api` position (the endpoint's positional order, a
  contract: new settings take the next free position, never an earlier one), typed (`Literal[...]` for choices), its
  default the declared one, its description the `help`.

Why not transformers' `HfArgumentParser`: it hands `metadata` to argparse as keyword arguments (so it cannot carry the
page's and the API's keys), converts with argparse's `type=` (whose messages are not the engine's one clear message
for a bad value), and knows no comma-separated lists.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from typing import Any, Callable, Union

from demo_core.errors import DemoInputError

Choices = Union[tuple, Callable[[], tuple], None]  # a callable for choices that can change (the collator registry)


@dataclasses.dataclass(frozen=True)
class Widget:
    """How the page shows a setting; serving/widgets.py builds the Gradio component from it."""

    order: float  # its place among the page's settings (the API's order is the setting's own `api`)
    kind: str | None = None  # text | slider | number | dropdown | checkboxes | checkbox; None: from the type
    label: str | None = None  # None: the name in words, capitalised ("max_length" -> "Max length")
    more: bool = False  # under the page's closed "More settings" instead of with the main settings
    choices: Choices = None  # what the page offers when it is not the setting's own choices or built-in names
    row: str | None = None  # consecutive widgets with the same row name sit side by side


def setting(default: Any = dataclasses.MISSING, *, help: str, choices: Choices = None, builtins: Choices = None,
            minimum: float | None = None, maximum: float | str | None = None, api: int | None = None,
            page: Widget | None = None, shown: str | None = None, cli: bool = True, speed: bool = False,
            declaration: "Declaration | None" = None):
    """A dataclass field that declares a setting (see the module's docstring).

    help: one line, shown as the CLI's help, the page's info and the API's description;
    choices: the only values allowed (checked, a dropdown, argparse choices, `Literal[...]` in the API);
    builtins: names that need no file or download (the model presets, the built-in datasets, the collators): listed
        in the help and offered as chips, while other values stay allowed;
    minimum, maximum: the range of a number, inclusive; `maximum` may name a `Limits` field ("max_samples");
    api: the setting's position in the `/compare` and `/preview` (or `/plan`) positional order, None: not in the API;
    page: how the page shows it, None: not on the page;
    shown: how the provenance line writes it, a format of the value ("{} samples"); default "<name in words> value";
    cli: False keeps it off the command line;
    speed: it changes how long a token slot takes to train (the model, the device, LoRA, checkpointing...): runs
        compare their measured speed only with runs that agree on every such setting (`speed_key`);
    declaration: the shared `Declaration` this field places (set by `Declaration.placed`).
    """
    metadata = {"help": help, "choices": choices, "builtins": builtins, "minimum": minimum, "maximum": maximum,
                "api": api, "page": page, "shown": shown, "cli": cli, "speed": speed, "declaration": declaration}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True, eq=False)  # compared by identity: two classes share a setting by sharing this
class Declaration:
    """A setting that a run (`RunConfig`) and a plan (`PlanRequest`) both take, declared once: its default, help,
    range, choices and speed flag. Each class places it (its API position, its page widget) with `placed`, so the
    two can never drift apart, and `shared_names` finds the settings a run hands its plan."""

    default: Any
    help: str
    choices: Choices = None
    minimum: float | None = None
    maximum: float | str | None = None
    shown: str | None = None
    speed: bool = False

    def placed(self, *, api: int | None = None, page: Widget | None = None, cli: bool = True):
        return setting(self.default, help=self.help, choices=self.choices, minimum=self.minimum,
                       maximum=self.maximum, shown=self.shown, speed=self.speed, api=api, page=page, cli=cli,
                       declaration=self)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One declared field, read back: its name, type and default from the dataclass, the rest from `setting()`."""

    name: str
    type: Any  # the resolved annotation (`int`, `str | None`, `tuple[str, ...]`)
    default: Any  # dataclasses.MISSING when the field has none
    help: str
    choices: Choices = None
    builtins: Choices = None
    minimum: float | None = None
    maximum: float | str | None = None
    api: int | None = None
    page: Widget | None = None
    shown: str | None = None
    cli: bool = True
    speed: bool = False
    declaration: Declaration | None = None

    @property
    def words(self) -> str:
        """The name as messages and the provenance line write it: "max length"."""
        return self.name.replace("_", " ")

    @property
    def base(self) -> type:
        """bool, int, float, str or tuple: the annotation without `| None` and without the tuple's item type."""
        kinds = [kind for kind in typing.get_args(self.type) if kind is not type(None)] \
            if isinstance(self.type, types.UnionType) or typing.get_origin(self.type) is Union else [self.type]
        return typing.get_origin(kinds[0]) or kinds[0]

    @property
    def optional(self) -> bool:
        """None is a value it may take (`int | None`): "not given", the engine decides."""
        return type(None) in typing.get_args(self.type)

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    def choice_values(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices

    def builtin_values(self) -> tuple:
        return tuple((self.builtins() if callable(self.builtins) else self.builtins) or ())

    def upper(self, limits=None) -> float | None:
        """The largest allowed number: the declared one, or the `Limits` field it names (None without limits: a plan
        is bounded by the device it asks about, not by what one run here may take)."""
        if isinstance(self.maximum, str):
            return getattr(limits, self.maximum, None)
        return self.maximum

    def described(self) -> str:
        """The help with what a reader of the CLI or the API cannot see on the page: the choices of a list setting
        (the page shows checkboxes) and the built-in names (the page shows chips)."""
        if self.base is tuple:
            return f"{self.help}; comma-separated, from: {', '.join(self.builtin_values())}"
        if self.builtins:
            return f"{self.help}; built-in: {', '.join(self.builtin_values())}"
        return self.help

    def as_text(self, value) -> str:
        """The value as the provenance line writes it."""
        if self.base is tuple or isinstance(value, (list, tuple)):
            value = ", ".join(value or [])
        if self.shown is not None:
            return self.shown.format(value)
        if self.base is bool:
            if value is None:
                return f"{self.words} auto"
            return self.words if value else f"no {self.words}"
        return f"{self.words} {value}"


@functools.cache  # unbounded on purpose: one entry per dataclass declared with setting()
def declared(cls: type) -> tuple[Setting, ...]:
    """The settings of a dataclass declared with `setting()`, in field order. A plain field (no `setting()`) fails
    loudly: give it a help line at least, so that the CLI explains it."""
    hints = typing.get_type_hints(cls)
    settings = []
    for field in dataclasses.fields(cls):
        if "help" not in field.metadata:
            raise TypeError(f"{cls.__name__}.{field.name} is a plain field: declare it with settings.setting(...)")
        settings.append(Setting(field.name, hints[field.name], field.default, **field.metadata))
    return tuple(settings)


def by_name(cls: type) -> dict[str, Setting]:
    return {item.name: item for item in declared(cls)}


def shared_names(first: type, second: type) -> tuple[str, ...]:
    """The settings both classes place from one `Declaration` (a run's that its memory plan takes as they are)."""
    theirs = {item.name: item.declaration for item in declared(second) if item.declaration is not None}
    return tuple(item.name for item in declared(first)
                 if item.declaration is not None and theirs.get(item.name) is item.declaration)


def speed_names(cls: type) -> tuple[str, ...]:
    """The settings that change how long a token slot takes to train (declared with `speed=True`)."""
    return tuple(item.name for item in declared(cls) if item.speed)


def api_settings(cls: type) -> list[Setting]:
    """The settings an API endpoint takes, in its positional order."""
    return sorted((item for item in declared(cls) if item.api is not None), key=lambda item: item.api)


def page_settings(cls: type) -> list[Setting]:
    """The settings the page shows, in page order."""
    return sorted((item for item in declared(cls) if item.page is not None), key=lambda item: item.page.order)


# ---- validation ---------------------------------------------------------------------------------------------------

def as_int(name: str, value) -> int:
    """Integers from the CLI, the UI (floats from sliders) and the API (anything a client sends)."""
    if isinstance(value, bool):
        raise DemoInputError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise DemoInputError(f"{name} must be a whole number, got {value!r}")


def as_float(name: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DemoInputError(f"{name} must be a number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise DemoInputError(f"{name} must be a finite number, got {value!r}")
    return number


# An optional switch ("auto" unless set) as the page's three-way choice writes it.
SWITCH_WORDS = {"auto": None, "on": True, "off": False}


def _checked(item: Setting, value, limits):
    if item.base is bool and item.optional and isinstance(value, str) and value in SWITCH_WORDS:
        return SWITCH_WORDS[value]
    if value is None and item.optional:
        return None
    if item.base is bool and not isinstance(value, bool):
        raise DemoInputError(f"{item.words} must be true or false, got {value!r}")
    if item.base is int:
        value = as_int(item.words, value)
    elif item.base is float:
        value = as_float(item.words, value)
    low, high = item.minimum, item.upper(limits)
    if high is not None and not low <= value <= high:
        raise DemoInputError(f"{item.words} must be between {low} and {high}, got {value}")
    if low is not None and value < low:
        raise DemoInputError(f"{item.words} must be at least {low}, got {value}")
    allowed = item.choice_values()
    if allowed is not None and value not in allowed:
        raise DemoInputError(f"unknown {item.words} {value!r}; choose from: {', '.join(map(str, allowed))}")
    return value


def checked_values(instance, limits=None) -> dict[str, Any]:
    """Every declared number converted and held to its range, every value with choices held to them, in field
    order, so that the first bad field is named; returns the converted numbers (to `dataclasses.replace` with)."""
    values = {}
    for item in declared(type(instance)):
        value = _checked(item, getattr(instance, item.name), limits)
        if item.base in (int, float) or item.base is bool and item.optional:
            values[item.name] = value
    return values


def capped_defaults(cls: type, limits):
    """The declared defaults, each number lowered to its `Limits` cap: a run with defaults is always allowed."""
    return cls(**{item.name: min(item.default, item.upper(limits)) for item in declared(cls)
                  if isinstance(item.maximum, str)})


# ---- the command line ---------------------------------------------------------------------------------------------

def flag(item: Setting) -> str:
    return "--" + item.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """A flag per declared setting, named after it, its help the setting's; values arrive as typed, as strings, and
    the dataclass's validation converts them (one message for a bad value, whoever typed it)."""
    for item in declared(cls):
        if not item.cli:
            continue
        if item.base is bool:  # a switch; with a default of True or None ("the engine decides"), --no-x too
            action = "store_true" if item.default is False else argparse.BooleanOptionalAction
            parser.add_argument(flag(item), action=action, default=item.default, help=item.described())
            continue
        default = ",".join(item.default) if item.base is tuple else item.default
        options = dict(required=True) if item.required else dict(default=default)
        parser.add_argument(flag(item), choices=item.choice_values(), help=item.described(), **options)


def from_arguments(cls: type, args: argparse.Namespace):
    """The dataclass from parsed arguments (not validated yet)."""
    return cls(**{item.name: getattr(args, item.name) for item in declared(cls) if item.cli})
