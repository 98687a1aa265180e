"""Pre-flight check: before anything trains, prove that this model computes the same thing packed as alone.

The promise "packing trains exactly like padding" holds per model, not in general: hybrid models carry a
convolution or recurrent state from one example into the next, some models ignore `position_ids` when they build
their masks, and an attention path can crash on (or silently drop) an argument a family passes. So `prepare()` asks
the model itself: two short examples, once in each layout the run will use (one packed row, a padded batch), on the
run's attention path and device, against each example alone through transformers' eager attention (the reference:
no packing, no padding, no kernel of ours). A difference beyond float rounding, a crash inside the model, or a
varlen path the model never calls refuses the run with one `DemoInputError` naming the reason.

Cost: one extra model build (random init, or the checkpoint's weights) and five forwards of under 70 tokens, in fp32,
on the run's device; cached per model, attention, device and layout, so a second run (or the app's preview) pays
nothing. For a 1B model that is a few seconds and ~5 GB of fp32 weights on the device, once.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.utils import logging as transformers_logging

from demo_core.attention import capability as attention_paths
from demo_core.attention import varlen
from demo_core.caches import LRU
from demo_core.collators import FlattenCollator, PaddedCollator, collator_spec
from demo_core.errors import DemoInputError
from demo_core.isolation import exclusive
from demo_core.models.sources import ModelSource

# The batch each checked layout feeds the model (the registry's `layout`; "naive" is inexact by design, unchecked).
_LAYOUT_COLLATORS = {"packed": FlattenCollator, "padded": PaddedCollator}
# fp32 logits, relative to their scale: float rounding stays near 1e-6, packing errors are 1e-2 and up. (Stricter
# than transformers' own padding-free test, which runs in bf16 with its epsilon, 7.8e-3.)
TOLERANCE = 1e-4
# flash_attention_2 has no fp32 kernel: transformers casts to half inside, so compare at bf16's epsilon.
HALF_PRECISION_TOLERANCE = torch.finfo(torch.bfloat16).eps
_SHORT_EXAMPLE = 6
_LONG_EXAMPLE = 13
_LONGEST_CHECKED_WINDOW = 64

# The checks that passed, by (model, its config's JSON, attention, device, layouts): a passed check is a model build
# and five forwards not repeated. 256 entries: every preset on every path and layout, and the local folders a
# server was asked about, at a few KB of key each.
_passed: LRU = LRU(max_entries=256)


def example_lengths(source: ModelSource) -> tuple[int, int]:
    """Two lengths; the first outgrows the model's sliding window or attention chunk when that is short enough to
    check cheaply (longer windows are read from the model's mask on every forward: see attention.py)."""
    text_config = source.config.get_text_config()
    spans = [getattr(text_config, name, None) for name in ("sliding_window", "attention_chunk_size")]
    spans = [span for span in spans if isinstance(span, int) and 0 < span <= _LONGEST_CHECKED_WINDOW]
    return (max(_LONG_EXAMPLE, min(spans) + 3) if spans else _LONG_EXAMPLE), _SHORT_EXAMPLE


def check_examples(source: ModelSource) -> list[list[int]]:
    vocab_size = min(source.config.get_text_config().vocab_size, len(source.tokenizer))
    generator = torch.Generator().manual_seed(0)
    # ids from 3 up: clear of the pad/eos/unk ids low in most vocabularies
    return [torch.randint(3, vocab_size, (length,), generator=generator).tolist()
            for length in example_lengths(source)]


def layouts_for(collators) -> tuple[str, ...]:
    """The batch layouts a run with these collators feeds the model, packed first (naive-concat is inexact by
    design, so it is not checked)."""
    used = {collator_spec(name).layout for name in collators}
    return tuple(layout for layout in _LAYOUT_COLLATORS if layout in used)


_WHAT = {"packed": "a packed row", "padded": "a padded batch"}
# What keeps each example in its own row, whatever the attention path: the collators a packed row's refusal suggests.
PADDED_COLLATORS = "padded, padded-grouped"


@dataclasses.dataclass(frozen=True)
class Inexact:
    """Why one attention path does not compute this model exactly: `cause` says it without naming the path, so that
    a refusal can say one cause once for every path it shares."""

    attention: str
    layout: str | None  # the layout it failed on ("packed", "padded"), None when the model did not even build
    cause: str
    difference: float | None = None  # max |Δlogit| over the logit scale, when the model ran but mixed examples


class PackingRefused(DemoInputError):
    """check_packing_is_exact's refusal of one path, with its `Inexact` for a caller that words several at once."""

    def __init__(self, inexact: Inexact, message: str):
        super().__init__(message)
        self.inexact = inexact


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _per_example_logits(model, layout: str, source: ModelSource, examples, device: str) -> list[torch.Tensor]:
    batch = _LAYOUT_COLLATORS[layout](source.tokenizer)([{"input_ids": ids} for ids in examples])
    inputs = {key: value.to(device) if torch.is_tensor(value) else value
              for key, value in batch.items() if key != "labels"}
    logits = model(**inputs, use_cache=False).logits.float()
    if layout == "packed":
        return list(torch.split(logits[0], [len(ids) for ids in examples]))
    return [logits[row, : len(ids)] for row, ids in enumerate(examples)]


class _Failed(Exception):
    """The model raised on one of the check's forwards: `layout` it was computing, `error` its first line."""

    def __init__(self, layout: str | None, error: str):
        super().__init__(error)
        self.layout, self.error = layout, error


def _refusing(layout: str | None, action):
    """Runs `action`; the model's own errors become a `_Failed` that names them (ours pass through as they are)."""
    try:
        return action()
    except DemoInputError:
        raise
    except Exception as error:
        raise _Failed(layout, _first_line(error)) from None


@torch.no_grad()
def measure_packing(source: ModelSource, attention: str, device: str, layouts, seed: int = 0) -> dict[str, float]:
    """Max |Δlogit| per layout between the run's path and each example alone on eager, relative to the largest
    reference logit (so a checkpoint with large logits gets the same relative tolerance as a random-init one)."""
    with exclusive(seed):  # no other thread moves its weights, dtype or generators mid-check; it moves none
        examples = check_examples(source)
        with torch.device(device):
            model = _refusing(None, lambda: source.build(attention, seed=seed)).eval()
            # The reference shares the weights when the model can switch attention in place (transformers' rule).
            reference = model if type(model)._can_set_attn_implementation() else source.build("eager", seed=seed).eval()
        calls_before = varlen.calls.count
        packed = {layout: _refusing(layout, lambda: _per_example_logits(model, layout, source, examples, device))
                  for layout in layouts}
        if attention == varlen.VARLEN and varlen.calls.count == calls_before:
            raise _Failed(None, "its layers never called varlen attention: they compute attention in their own code")
        if attention != "eager":
            reference.set_attn_implementation("eager")
        alone = [_refusing("alone", lambda: reference(input_ids=torch.tensor([ids], device=device),
                                                      use_cache=False).logits[0].float())
                 for ids in examples]
        scale = max(1.0, max(float(logits.abs().max()) for logits in alone))
        return {layout: max(float((p - a).abs().max()) for p, a in zip(logits, alone)) / scale
                for layout, logits in packed.items()}


def _cause(failed: _Failed) -> str:
    if failed.layout is None:
        return failed.error if failed.error.startswith("its layers") else f"the model fails to build ({failed.error})"
    what = "one example alone on eager" if failed.layout == "alone" else _WHAT[failed.layout]
    return f"the model fails on {what} ({failed.error})"


def _mixing(layout: str, differences: list[float], tolerance: float) -> str:
    low, high = min(differences), max(differences)
    measured = f"{high:.1e}" if low == high or f"{low:.1e}" == f"{high:.1e}" else f"{low:.1e} to {high:.1e}"
    return (f"{_WHAT[layout]} computes each example differently from the example alone on eager (max |Δlogit| "
            f"{measured} of the logit scale, tolerance {tolerance:.0e}): examples affect each other (convolution or "
            f"recurrent layers, masks that ignore position_ids) or the attention path leaves out a feature of this model")


def check_packing_is_exact(source: ModelSource, attention: str, device: str, collators) -> None:
    """Refuses (PackingRefused) a run whose layouts would not compute each example as if it were alone."""
    layouts = layouts_for(collators)
    key = (source.name, source.config.to_json_string(), attention, device, layouts)
    if not layouts or key in _passed:
        return
    where = f"packing check for {source.family} on {attention} ({device})"
    # The probe's own warnings (e.g. a kernel falling back) would land on stderr before a refusal's one `error:`
    # line; training repeats whatever matters.
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        differences = measure_packing(source, attention, device, layouts)
    except _Failed as failed:
        inexact = Inexact(attention, failed.layout if failed.layout in _WHAT else None, _cause(failed))
        raise PackingRefused(inexact, f"{where}: {inexact.cause}") from None
    finally:
        transformers_logging.set_verbosity(verbosity)
    tolerance = _tolerance(attention)
    for layout, difference in differences.items():
        if difference > tolerance:
            inexact = Inexact(attention, layout, _mixing(layout, [difference], tolerance), difference)
            raise PackingRefused(inexact, f"{where}: {inexact.cause}")
    _passed[key] = True


def _tolerance(attention: str) -> float:
    return HALF_PRECISION_TOLERANCE if attention == "flash_attention_2" else TOLERANCE


def _paths(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _refusal(source: ModelSource, device: str, refused: list[Inexact], remedy: str) -> str:
    """One cause once, with the paths that share it, then what would work: "no attention path computes lfm2 exactly
    on cpu with these collators: on varlen, sdpa and eager, a packed row computes each example differently ...;
    run it with padded collators only (padded, padded-grouped)"."""
    groups: dict[tuple, list[Inexact]] = {}
    for inexact in refused:  # mixing on one layout is one cause whatever its size on each path
        key = (inexact.layout, "mixes") if inexact.difference is not None else (inexact.layout, inexact.cause)
        groups.setdefault(key, []).append(inexact)
    causes = []
    for (layout, _), members in groups.items():
        differences = [m.difference for m in members if m.difference is not None]
        cause = _mixing(layout, differences, max(_tolerance(m.attention) for m in members)) if differences \
            else members[0].cause
        causes.append(cause if len(refused) == 1 else f"on {_paths([m.attention for m in members])}, {cause}")
    head = (f"packing check for {source.family} on {refused[0].attention} ({device})" if len(refused) == 1 else
            f"no attention path computes {source.family} exactly on {device} with these collators")
    return f"{head}: {'; '.join(causes)}; {remedy}"


def _what_works(source: ModelSource, device: str, collators, refused: list[Inexact]) -> str:
    """The change that would train this model exactly: another attention path that passes the check (tried here,
    so that the suggestion is one that works), else padded collators when only packed rows failed."""
    tried = {inexact.attention for inexact in refused}
    for candidate in attention_paths.AUTO_ORDER:
        if candidate in tried or not attention_paths.capability(source.config, candidate, device)[0]:
            continue
        try:
            check_packing_is_exact(source, candidate, device, collators)
        except PackingRefused as other:
            refused.append(other.inexact)
            continue
        return f"--attention {candidate} computes it exactly"
    if all(inexact.layout == "packed" for inexact in refused):
        return f"run it with padded collators only ({PADDED_COLLATORS}), which keep each example in its own row"
    return f"no attention path here trains {source.family} exactly, padded or packed"


def exact_attention(source: ModelSource, requested: str, device: str, collators) -> str:
    """The attention the run will use: a named one must pass its capability and this check; `auto` takes the first
    path in `capability.AUTO_ORDER` that does both. A refusal says each cause once and what would work instead."""
    if requested != "auto":
        works, why = attention_paths.capability(source.config, requested, device)
        if not works:
            remedy = _what_works(source, device, collators, [Inexact(requested, None, why)])
            raise DemoInputError(f"attention {requested!r} is unavailable for {source.family} on {device}: {why}; "
                                 f"{remedy}")
        attention = requested
        try:
            check_packing_is_exact(source, attention, device, collators)
        except PackingRefused as refused:
            inexacts = [refused.inexact]
            remedy = _what_works(source, device, collators, inexacts)
            raise DemoInputError(_refusal(source, device, inexacts[:1], remedy)) from None
        return attention
    refused: list[Inexact] = []
    for candidate in attention_paths.AUTO_ORDER:
        if not attention_paths.capability(source.config, candidate, device)[0]:
            continue
        try:
            check_packing_is_exact(source, candidate, device, collators)
        except PackingRefused as refusal:
            refused.append(refusal.inexact)
            continue
        return candidate
    if not refused:
        raise DemoInputError(f"no attention path works for {source.family} on {device}")
    raise DemoInputError(_refusal(source, device, refused, _what_works(source, device, collators, refused)))
