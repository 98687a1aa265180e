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
_REMEDY = {"packed": "run it with padded collators or --attention eager", "padded": "use another attention"}


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


def _refusing(what: str, action, remedy: str = "use another attention"):
    """Runs `action`; the model's own errors become a refusal that names them (ours pass through as they are)."""
    try:
        return action()
    except DemoInputError:
        raise
    except Exception as error:
        raise DemoInputError(f"the model fails on {what} ({_first_line(error)}); {remedy}") from None


@torch.no_grad()
def measure_packing(source: ModelSource, attention: str, device: str, layouts, seed: int = 0) -> dict[str, float]:
    """Max |Δlogit| per layout between the run's path and each example alone on eager, relative to the largest
    reference logit (so a checkpoint with large logits gets the same relative tolerance as a random-init one)."""
    with exclusive(seed):  # no other thread moves its weights, dtype or generators mid-check; it moves none
        examples = check_examples(source)
        with torch.device(device):
            model = _refusing(f"building it with {attention}", lambda: source.build(attention, seed=seed)).eval()
            # The reference shares the weights when the model can switch attention in place (transformers' rule).
            reference = model if type(model)._can_set_attn_implementation() else source.build("eager", seed=seed).eval()
        calls_before = varlen.calls.count
        packed = {layout: _refusing(_WHAT[layout], lambda: _per_example_logits(model, layout, source, examples, device),
                                    _REMEDY[layout])
                  for layout in layouts}
        if attention == varlen.VARLEN and varlen.calls.count == calls_before:
            raise DemoInputError("its layers never called varlen attention: they compute attention in their own code")
        if attention != "eager":
            reference.set_attn_implementation("eager")
        alone = [_refusing("one example on eager", lambda: reference(input_ids=torch.tensor([ids], device=device),
                                                                     use_cache=False).logits[0].float())
                 for ids in examples]
        scale = max(1.0, max(float(logits.abs().max()) for logits in alone))
        return {layout: max(float((p - a).abs().max()) for p, a in zip(logits, alone)) / scale
                for layout, logits in packed.items()}


def check_packing_is_exact(source: ModelSource, attention: str, device: str, collators) -> None:
    """Refuses (DemoInputError) a run whose layouts would not compute each example as if it were alone."""
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
    except DemoInputError as refusal:
        raise DemoInputError(f"{where}: {refusal}") from None
    finally:
        transformers_logging.set_verbosity(verbosity)
    tolerance = HALF_PRECISION_TOLERANCE if attention == "flash_attention_2" else TOLERANCE
    for layout, difference in differences.items():
        if difference > tolerance:
            raise DemoInputError(
                f"{where}: {_WHAT[layout]} computes each example differently from the example alone on eager (max "
                f"|Δlogit| {difference:.1e} of the logit scale, tolerance {tolerance:.0e}): examples affect each "
                f"other (convolution or recurrent layers, masks that ignore position_ids) or the attention path "
                f"leaves out a feature of this model; {_REMEDY[layout]}"
            )
    _passed[key] = True


def exact_attention(source: ModelSource, requested: str, device: str, collators) -> str:
    """The attention the run will use: a named one must pass its capability and this check; `auto` takes the first
    path in `capability.AUTO_ORDER` that does both, and refuses with every path's reason when none does."""
    if requested != "auto":
        attention = attention_paths.resolve_attention(requested, source.config, device)
        check_packing_is_exact(source, attention, device, collators)
        return attention
    reasons = []
    for candidate in attention_paths.AUTO_ORDER:
        works, why = attention_paths.capability(source.config, candidate, device)
        if not works:
            continue
        try:
            check_packing_is_exact(source, candidate, device, collators)
        except DemoInputError as refusal:
            reasons.append(str(refusal))
            continue
        return candidate
    raise DemoInputError("no attention path computes this model exactly with these collators: "
                         + "; ".join(reasons))
