"""The page's widgets for declared settings (demo_core/settings.py): one Gradio component per setting with a
`page=Widget(...)`, in page order, its label and range from the declaration and its info the setting's help.

`settings_form(cls, values)` builds them inside the active `gr.Blocks` and returns a `Form`: the components by
setting name, the chips under the free-text boxes, and the events a person's edit fires. Handlers take the values
by name (`inputs_kwargs=form.widgets`), so a new setting reaches them without an edit here or in `app.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import gradio as gr

from demo_core.settings import SWITCH_WORDS, Setting, page_settings

SWITCH_CHOICE = {value: word for word, value in SWITCH_WORDS.items()}  # None -> "auto", True -> "on"


def typed_slider(*args, **kwargs) -> gr.Slider:
    """A slider whose number box hands what was typed to the handler, in range or not, so that the engine's settings
    check says what is wrong in its one sentence ("batch size must be between 1 and 256") and the box keeps what was
    typed (page.js keeps the slider from putting it back in range). Gradio's own check (Number.raise_if_out_of_bounds
    in Slider.preprocess) raised "Value 0 is less than minimum value 1" once per event that read the box, before any
    handler ran. Replaced on the instance, not by a subclass: Gradio writes a .pyi file beside any module that
    subclasses a component."""
    slider = gr.Slider(*args, **kwargs)
    slider.preprocess = lambda payload: None if payload is None else gr.Number.round_to_precision(payload,
                                                                                                   slider.precision)
    return slider


@dataclasses.dataclass
class Form:
    widgets: dict[str, gr.components.Component]  # by setting name, in page order
    chips: dict[str, dict[str, gr.Button]]  # setting name -> its chips (a built-in name -> its button)
    extras: dict[str, gr.components.Component]  # page-only components placed among them (`settings_form`'s `extras`)

    def edits(self) -> list:
        """The events a person's edit fires: Enter or leaving a free-text box, `input` elsewhere. Never `change`,
        which a value written by a handler fires too (a history click fills every input at once)."""
        events = []
        for name, widget in self.widgets.items():
            events += [widget.submit, widget.blur] if isinstance(widget, gr.Textbox) else [widget.input]
        return events

    def shown(self, values: dict) -> dict:
        """`{widget: value}` for the settings in `values` (a handler writing settings back into the inputs)."""
        return {self.widgets[name]: as_widget_value(self.widgets[name], value) for name, value in values.items()
                if name in self.widgets}


def as_widget_value(widget: gr.components.Component, value):
    """A list setting typed into a text box (LoRA's targets) is shown comma-separated, as the CLI takes it; an
    optional switch as its three-way choice ("auto", "on", "off": settings.SWITCH_WORDS)."""
    if isinstance(widget, gr.Textbox) and isinstance(value, (list, tuple)):
        return ",".join(value)
    if isinstance(widget, gr.Radio) and (value is None or isinstance(value, bool)):
        return SWITCH_CHOICE[value]
    return value


def _kind(item: Setting) -> str:
    if item.page.kind:
        return item.page.kind
    if item.base is bool and item.optional:
        return "switch"
    if item.base is bool:
        return "checkbox"
    if item.base is tuple:
        return "checkboxes"
    if item.choices is not None:
        return "dropdown"
    if item.base in (int, float):
        return "slider" if item.maximum is not None else "number"
    return "text"


def text_with_chips(choices, value: str, label: str, info: str, elem_id: str) -> tuple[gr.Textbox, dict]:
    """A free-text box with its usual values as chips below: typing `gpt2` and Enter keeps `gpt2` (a Dropdown would
    pick its first match, `tiny-gpt2`), and a chip click fills the box."""
    box = gr.Textbox(value, label=label, info=info, elem_id=elem_id, max_lines=1)
    if not choices:
        return box, {}
    with gr.Row(elem_classes="chips"):
        chips = {choice: gr.Button(choice, size="sm", variant="secondary") for choice in choices}
    return box, chips


def _component(item: Setting, value, limits, elem_id: str, enter_hint: str):
    """(the component, its chips) for one setting."""
    kind, label = _kind(item), item.page.label or item.words.capitalize()
    common = dict(label=label, info=item.help, elem_id=elem_id)
    offered = item.page.choices() if callable(item.page.choices) else item.page.choices
    if kind == "text":
        value = ",".join(value) if isinstance(value, (list, tuple)) else value
        return text_with_chips(item.builtin_values(), value, label, f"{item.help}; {enter_hint}", elem_id)
    if kind == "slider":
        steps = dict(step=1) if item.base is int else {}
        return typed_slider(item.minimum, item.upper(limits), value=value, **steps, **common), {}
    if kind == "number":
        return gr.Number(value, precision=0 if item.base is int else None, minimum=item.minimum, **common), {}
    if kind == "dropdown":
        return gr.Dropdown(list(offered or item.choice_values()), value=value, **common), {}
    if kind == "checkboxes":
        return gr.CheckboxGroup(list(offered or item.builtin_values()), value=list(value), **common), {}
    if kind == "checkbox":
        return gr.Checkbox(value, **common), {}
    if kind == "switch":  # auto, on or off: a checkbox cannot say "auto" (it read as off)
        return gr.Radio(list(SWITCH_WORDS), value=SWITCH_CHOICE[value], **common), {}
    raise ValueError(f"{item.name}: unknown widget kind {kind!r}")


def settings_form(cls: type, values: dict, limits=None, *, elem_prefix: str = "", enter_hint: str = "Enter asks",
                  extras: dict[str, tuple[str, Callable[[], gr.components.Component]]] | None = None) -> Form:
    """The widgets of `cls`'s page settings, showing `values` (by name), in page order: the main ones first, then
    those marked `more` in a closed "More settings"; consecutive widgets of one `row` side by side. `extras` places
    page-only components: {name: (the setting it follows, a function that builds it)}, e.g. the run page's upload box
    after the dataset."""
    after = {setting: (name, build) for name, (setting, build) in (extras or {}).items()}
    form = Form({}, {}, {})
    settings = page_settings(cls)
    for more in (False, True):
        group = [item for item in settings if item.page.more == more]
        if not group:
            continue
        with gr.Accordion("More settings", open=False) if more else contextlib.nullcontext():
            _place(group, form, values, limits, elem_prefix, enter_hint, after)
    return form


def _place(group: list[Setting], form: Form, values: dict, limits, elem_prefix: str, enter_hint: str,
           after: dict) -> None:
    index = 0
    while index < len(group):
        row = group[index].page.row
        members = [group[index]]
        while row is not None and index + len(members) < len(group) and group[index + len(members)].page.row == row:
            members.append(group[index + len(members)])
        with gr.Row() if len(members) > 1 else contextlib.nullcontext():
            for item in members:
                elem_id = elem_prefix + item.name.replace("_", "-")
                form.widgets[item.name], chips = _component(item, values[item.name], limits, elem_id, enter_hint)
                if chips:
                    form.chips[item.name] = chips
                if item.name in after:
                    name, build = after[item.name]
                    form.extras[name] = build()
        index += len(members)
