"""Which settings the page's two views come from, in one line over each, so that the page shows one state at a time.

Section 1 (the batch before training) follows the inputs; the results (the headline, its figures and section 2) show
one run: the one just made, the one training, or one picked in the history. They can differ (the inputs change during
a run, or after a history run is drawn), and the line over section 1 then says in which settings. The page keeps
what each section shows in two `gr.State`s (plain dicts, made here) and redraws both lines from them whenever either
changes:

- a preview: `{"settings": {...}, "inputs": {...}, "failed_inputs": {...} or None, "missing": why or None}`,
  `inputs` being the raw widget values it was drawn from, by name (a preview of the same values is not drawn again);
- a run: `{"phase": ..., "settings": {...} or None, "run_id", "saved_at", "partial", "done", "of"}`.
"""

from __future__ import annotations

from demo_core import RunConfig
from demo_core.batch_semantics import as_per_device, document_batch
from demo_core.settings import by_name, page_settings
from presentation.batch_words import batch_words

NONE, WAITING, TRAINING, DONE, FAILED, NOTHING = "none", "waiting", "training", "done", "failed", "nothing"
NO_RUN = {"phase": NONE, "settings": None}


def settings_of(config: dict) -> dict:
    """The settings a visitor chooses (those the page shows, in page order) of a preview's or a run's `config`; a run
    saved before a setting was declared had its default, one saved before batch size meant per device has its batch
    as today's settings say it (batch_semantics.as_per_device)."""
    config = as_per_device(config)
    return {item.name: config.get(item.name, item.default) for item in page_settings(RunConfig)}


def preview_shown(config: dict, inputs: dict, missing: str | None = None) -> dict:
    return {"settings": settings_of(config), "inputs": inputs, "failed_inputs": None, "missing": missing}


def preview_failed(shown: dict | None, inputs: dict) -> dict:
    """The preview of `inputs` failed (its message is on screen): the picture is still the previous one, if any."""
    if shown is None:
        return {"settings": None, "inputs": None, "failed_inputs": inputs, "missing": None}
    return {**shown, "failed_inputs": inputs}


def is_shown(shown: dict | None, inputs: dict) -> bool:
    """Whether section 1 already shows (or has just failed to show) these widget values: nothing to redraw."""
    return shown is not None and inputs in (shown["inputs"], shown["failed_inputs"])


def run_started() -> dict:
    return {"phase": WAITING, "settings": None}


def run_training(config: dict, done: int, of: int) -> dict:
    return {"phase": TRAINING, "settings": settings_of(config), "done": done, "of": of}


def run_saved(run_id: str, saved_at: str, document: dict) -> dict:
    """`batch`: the batch in words when it says more than the settings (accumulation, processes, an earlier run)."""
    shape = document_batch(document)
    multiplied = shape.saved_before or shape.grad_accum > 1 or shape.processes > 1
    return {"phase": DONE, "settings": settings_of(document["config"]), "run_id": run_id, "saved_at": saved_at,
            "partial": bool(document.get("partial")), "batch": batch_words(document) if multiplied else None}


def run_failed(shown: dict) -> dict:
    return {**shown, "phase": FAILED}


def run_empty() -> dict:
    return {"phase": NOTHING, "settings": None}


def describe(settings: dict) -> str:
    """The settings in one line, each as its declaration writes it: `tiny-llama` · `flan-like` · 256 samples · …;
    accumulation with the effective batch it makes, as every Hugging Face trainer multiplies (one process: the
    page's)."""
    declared = by_name(RunConfig)
    words = []
    for name, value in settings.items():
        text = declared[name].as_text(value)
        if name == "grad_accum" and value > 1 and "batch_size" in settings:
            text += f" = {settings['batch_size'] * value} per step"
        words.append(text)
    return " · ".join(words)


def differences(here: dict, there: dict) -> list[str]:
    def shown(value):
        return ", ".join(value) if isinstance(value, (list, tuple)) else value

    declared = by_name(RunConfig)
    return [f"{declared[key].words} {shown(there[key])} there, {shown(here[key])} here"
            for key in here if here[key] != there.get(key)]


def _run_name(run: dict) -> str:
    return f"run **{run['run_id']}**" if run["phase"] == DONE else "the run"


def preview_line(shown: dict | None, run: dict) -> str:
    if shown is None:
        return "Drawing the batch of the current settings…"
    if shown["settings"] is None:
        return "⚠ **The current inputs could not be drawn** (see the message): no batch is shown."
    if shown["missing"]:
        line = f"**Not drawn:** {shown['missing']}. Settings: {describe(shown['settings'])}."
    else:
        line = f"**Shown:** the first batch of {describe(shown['settings'])}."
    if shown["failed_inputs"] is not None:
        line = ("⚠ **The current inputs could not be drawn** (see the message); below is still the batch of "
                f"{describe(shown['settings'])}.")
    if run["settings"] is not None:
        changed = differences(shown["settings"], run["settings"])
        if changed:
            line += (f"\n\n⚠ **Not the settings of the results above** ({_run_name(run)}): "
                     f"{'; '.join(changed)}.")
    return line


def run_line(run: dict) -> str:
    phase = run["phase"]
    if phase == NONE:
        return "**No run shown yet:** press **Run**, or pick a run in the history (section 3)."
    if phase == WAITING:
        return "**A new run is starting** (one run trains at a time; it may wait for another visitor's). The " \
               "previous results were cleared: they stay in the history."
    if phase == NOTHING:
        return "**Stopped before the first step:** nothing to show."
    if phase == FAILED and run["settings"] is None:
        return "⚠ **The run could not start** (see the message). The previous results stay in the history."
    settings = describe(run["settings"])
    if phase == TRAINING:
        return f"**Training** ({run['done']} of {run['of']} collators done, each appears when it finishes): {settings}."
    if phase == FAILED:
        return (f"⚠ **The run failed** (see the message): what it finished before the error, if anything, is below "
                f"and saved in the history. Settings: {settings}.")
    status = "stopped, partial" if run["partial"] else "complete"
    saved = run["saved_at"].replace("T", " ").split(".")[0].replace("+00:00", " UTC")
    batch = f" Batch: {run['batch']}." if run.get("batch") else ""
    return f"**Shown:** run **{run['run_id']}** ({status}, saved {saved}): {settings}.{batch}"


def lines(shown: dict | None, run: dict) -> tuple[str, str]:
    """(line over section 1, line over the run's results under the headline)."""
    return preview_line(shown, run), run_line(run)
