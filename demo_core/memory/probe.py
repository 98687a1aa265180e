"""Saved-activation bytes of any transformers model at any size, fitted exactly from tiny copies of it run on the CPU.

What autograd keeps for backward depends on every line of a model's forward (q/k norms, post-norms, fused
projections, what the activation saves, a partial-rotary `cat` that forces a copy, what the loss upcasts). A formula
per architecture needs a list of model types and goes stale with the next one. Here the model's own code answers:

1. The same config class is built small: the widths (head_dim, hidden size, intermediate sizes, vocabulary) are
   replaced by small values, everything else keeps its real value (head counts, rotary fraction, norms, biases,
   activation, MoE expert counts), with two decoder layers per kind of layer (`layer_types`, `no_rope_layers`, ...).
2. It runs forwards at a few token shapes under `saved_tensors_hooks`, counting every storage once and parameters
   never, exactly as `SavedActivationMeter` does, split by where the save happened: per decoder layer (by part:
   norms, attention, MLP), once per model (embeddings, head and loss) or shared by several layers (rotary tables).
3. Every saved tensor holds (a token count) x (one width or 1): bytes are bilinear in a few token monomials
   (B*S, S, B, 1 and the quadratic B*S^2, S^2 of masks and scores; T, 1, T^2 for a packed row) and the widths.
   A least-squares fit over more points than unknowns recovers the coefficients; its residual says whether the
   architecture really is bilinear (it is for every dense decoder tried, to the byte) and is kept as a note.
4. The fit is evaluated at the real widths and token shape: L layers of each kind, plus the once-per-model parts.

The tiny copy is built in probe_model.py, its forwards recorded in probe_recorder.py.

Left to formulas in memory/estimate.py: autocast's half copies of weights (widths squared) and the kernel of
varlen / flash_attention_2 (its buffers follow the segment lengths, which a fit over token counts cannot see; the
probe runs the real varlen function with its kernel's saved tensors set aside). LoRA is emulated as peft computes
it (frozen base, base(x) + B(A(x)) * scale), so autograd itself leaves out what a frozen layer does not need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from demo_core.caches import LRU
from demo_core.isolation import exclusive
from demo_core.memory.probe_model import (
    ProbeLayers,
    ProbeSpec,
    build_probe_model,
    chunk_field,
    fixed_chunk,
    point_chunk,
    real_chunk,
    real_width,
    width_names,
    width_points,
)
from demo_core.memory.probe_recorder import SaveRecorder, probe_batch, probe_state
from demo_core.precision import PRECISIONS

# Token shapes: odd sizes, away from the widths above (a weight copy is told apart by its values, see
# `_is_weight_copy`, so a token tensor of a weight's shape is counted all the same).
_ROWS_POINTS = (2, 3)
_SEQ_POINTS = (7, 11, 13)
_PACKED_POINTS = (17, 23, 29)
# A second set for a re-probe, and the held-out shape every fit must predict (rows, seq; packed: 1, T) before use.
_REPROBE_ROWS_POINTS = (2, 5)
_REPROBE_SEQ_POINTS = (9, 15, 19)
_REPROBE_PACKED_POINTS = (19, 31, 41)
_HELD_OUT = {"rows": (4, 17), "single_row": (1, 21), "packed": (1, 37)}
# A chunked scan's bytes follow the padded length and the chunk count too (probe_model._CHUNK_FIELDS): token counts
# over three or more chunk counts at each probe chunk size (4, 6, 8), more of them than the monomials per row, and
# always two chunks or more: with one, a chunk's slice is the whole tensor, contiguous, and the scan saves it
# without the copy it saves of every chunk's slice otherwise (so a sequence shorter than one real chunk reads a few
# copies of a chunk's keys high).
_CHUNKED_SEQ_POINTS = (17, 19, 23, 29, 31, 37)
_REPROBE_CHUNKED_SEQ_POINTS = (18, 21, 25, 27, 33, 41)
_CHUNKED_PACKED_POINTS = (19, 23, 29, 31, 37, 41)
_REPROBE_CHUNKED_PACKED_POINTS = (21, 25, 27, 33, 43, 47)
# A chunk size fixed in the scan's code is probed at its real size c: tokens over 2 to 5 chunks, as multiples of c
# plus these offsets.
_FIXED_CHUNK_POINTS = ((2, -5), (2, 3), (3, -3), (3, 5), (4, 1), (5, -7))
_REPROBE_FIXED_CHUNK_POINTS = ((2, -1), (2, 7), (3, 1), (4, -5), (4, 9), (5, 3))
_FIXED_CHUNK_HELD_OUT = (4, -11)
# A fit that misses the held-out forward by more than this is not bilinear for the architecture (float sums of
# exact byte counts agree to ~1e-9; a real misfit is whole tensors).
_HELD_OUT_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class ActivationFit:
    """Fitted bytes as coefficients over (token monomials) x (1, widths); `evaluate` applies them."""

    targets: tuple[str, ...]
    coefficients: np.ndarray  # (basis size, targets)
    quadratic_columns: np.ndarray  # bool per basis column: its token monomial is quadratic in tokens
    width_names: tuple[str, ...]
    spec: ProbeSpec
    residual_bytes: float  # largest misfit over the probe points: 0 when the architecture is bilinear
    kernel_heads: tuple[int, int] | None  # (query heads, key/value heads) the excluded kernel received
    kernel_layers: int  # real layers whose excluded kernel saves for backward (its inputs need a gradient)
    held_out_misfit_bytes: float  # largest miss on a forward the fit never saw (the reliability check)
    reference: "ProbeReference"  # that forward's shape and bytes: the physical bound of every term

    @property
    def reliable(self) -> bool:
        return self.held_out_misfit_bytes <= _HELD_OUT_TOLERANCE * max(self.reference.largest_bytes, 1.0) + 8

    def evaluate(self, config: Any, rows: int, seq_len: int) -> tuple[dict[str, int], dict[str, int]]:
        """(linear part, quadratic part) per target for `rows` x `seq_len` tokens of the real-width model."""
        widths = [real_width(config, name) for name in self.width_names]
        basis = _basis(_token_monomials(self.spec, rows, seq_len, real_chunk(config)), widths)
        contributions = basis[:, None] * self.coefficients
        linear = contributions[~self.quadratic_columns].sum(axis=0)
        quadratic = contributions[self.quadratic_columns].sum(axis=0)
        return ({t: int(round(v)) for t, v in zip(self.targets, linear)},
                {t: int(round(v)) for t, v in zip(self.targets, quadratic)})


@dataclasses.dataclass(frozen=True)
class ProbeReference:
    """The held-out forward of a fit: its token monomials, widths and measured bytes per target.

    Every saved tensor holds (a token monomial) x (a width or 1) bytes, a count that is never negative, so at any
    size a target's bytes are at most its bytes here times the largest growth of a monomial times the largest
    growth of a width (`bound`): a fitted value beyond that, or below zero, is a fit gone wrong, not memory.
    """

    monomials: tuple[float, ...]
    widths: tuple[int, ...]
    bytes_by_target: dict[str, float]

    @property
    def largest_bytes(self) -> float:
        return max(self.bytes_by_target.values(), default=0.0)

    def bound(self, target: str, monomials: list[float], widths: list[int],
              among: list[bool] | None = None) -> float:
        """The bound at `monomials` (the real token shape's, in `_token_monomials` order); `among`: which of them
        may grow it (a linear part's bound is not the quadratic monomials' growth)."""
        token_growth = max((real / ref for index, (real, ref) in enumerate(zip(monomials, self.monomials))
                            if among is None or among[index]), default=1.0)
        width_growth = max([1.0] + [real / ref for real, ref in zip(widths, self.widths)])
        return self.bytes_by_target.get(target, 0.0) * max(token_growth, 1.0) * width_growth


# ---- the fit -------------------------------------------------------------------------------------------------------

def _token_monomials(spec: ProbeSpec, rows: int, seq_len: int, chunk: int | None = None
                     ) -> list[tuple[float, bool]]:
    """(value, quadratic in tokens) of each token monomial: for a packed row T = seq_len, else B rows of S slots.
    With a chunked scan of `chunk` tokens also, per row, the padded length S', S' x chunk (the chunk x chunk blocks),
    the chunk count n and n^2, and chunk^2 (its masks)."""
    per_row = [(1, False), (seq_len, False), (seq_len ** 2, True)]
    if chunk:
        chunks = -(-seq_len // chunk)
        per_row += [(chunks * chunk, False), (chunks * chunk * chunk, False), (chunks, False), (chunks ** 2, True),
                    (chunk ** 2, False)]
    if spec.layout == "packed":
        return per_row
    row_terms = [(1, False)] if spec.single_row else [(1, False), (rows, False)]
    return [(r * s, quadratic) for (r, _), (s, quadratic) in itertools.product(row_terms, per_row)]


def _basis(monomials: list[tuple[float, bool]], widths: list[int]) -> np.ndarray:
    return np.array([m * w for m, _ in monomials for w in [1, *widths]], dtype=float)


def _token_points(spec: ProbeSpec, config: Any, reprobe: bool = False) -> list[tuple[int, int]]:
    fixed = None if chunk_field(config) else fixed_chunk(config)
    if fixed:
        lengths = tuple(k * fixed + offset for k, offset in
                        (_REPROBE_FIXED_CHUNK_POINTS if reprobe else _FIXED_CHUNK_POINTS))
    elif chunk_field(config):
        lengths = ((_REPROBE_CHUNKED_PACKED_POINTS if reprobe else _CHUNKED_PACKED_POINTS) if spec.layout == "packed"
                   else _REPROBE_CHUNKED_SEQ_POINTS if reprobe else _CHUNKED_SEQ_POINTS)
    elif spec.layout == "packed":
        lengths = _REPROBE_PACKED_POINTS if reprobe else _PACKED_POINTS
    else:
        lengths = _REPROBE_SEQ_POINTS if reprobe else _SEQ_POINTS
    if spec.layout == "packed":
        return [(1, t) for t in lengths]
    rows = (1,) if spec.single_row else (_REPROBE_ROWS_POINTS if reprobe else _ROWS_POINTS)
    return [(r, s) for r in rows for s in lengths]


def _held_out_point(spec: ProbeSpec, config: Any) -> tuple[int, int]:
    rows, seq_len = _HELD_OUT["packed" if spec.layout == "packed" else "single_row" if spec.single_row else "rows"]
    fixed = None if chunk_field(config) else fixed_chunk(config)
    if fixed:
        seq_len = _FIXED_CHUNK_HELD_OUT[0] * fixed + _FIXED_CHUNK_HELD_OUT[1]
    return rows, seq_len


def _targets_of(totals: dict[tuple, int], layers: ProbeLayers) -> dict[str, float]:
    """Per probe forward: bytes of the real model's L layers per part (each probe layer x the real layers it stands
    for), the largest single layer per kind, and the once-per-model parts."""
    targets: dict[str, float] = {}
    per_layer_total = [0.0] * len(layers.copies)
    for place, nbytes in totals.items():
        if place[0] == "layer":
            part = f"layers.{place[2]}"
            targets[part] = targets.get(part, 0.0) + nbytes * layers.weights[place[1]]
            per_layer_total[place[1]] += nbytes
        else:
            name = place[-1]
            targets[name] = targets.get(name, 0.0) + nbytes
    for kind, total in zip(layers.kinds, per_layer_total):
        targets[f"one_layer.{kind}"] = max(targets.get(f"one_layer.{kind}", 0.0), total)
    return targets


# A fit costs 0.1-1 s; its key is a config and a probe spec (layout, precision, attention, LoRA, ...). The planner
# page's warm-up fits every model chip's opening, LoRA and QLoRA questions (260 fits for 13 chips, measured with
# benchmarks/planner_latency.py); 1024 keep those and a few hundred questions beyond them, at about 1.3 MB (a fit is
# a few dozen numbers; its key a config's JSON, 1.3 KB on average over the warm-up's).
_FIT_CACHE: LRU = LRU(max_entries=1024)
_FIT_LOCK = threading.Lock()


def _free_fit_lock_in_child() -> None:  # a fit running in another thread at a fork is not running in the child
    global _FIT_LOCK
    _FIT_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_free_fit_lock_in_child)

_BEFORE_FIT = threading.local()  # this thread's `before_each_fit` hook, if any


@contextlib.contextmanager
def before_each_fit(hook: Callable[[], None] | None) -> Iterator[None]:
    """Calls `hook` in this thread before each fit the block computes (never before an answer from the cache), outside
    every lock. Work that should use idle time only (the server's warm-up of the planner's LoRA questions) waits in
    it, so that its fits never take a core, the fit lock or the process's torch state from a visitor's question."""
    previous = getattr(_BEFORE_FIT, "hook", None)
    _BEFORE_FIT.hook = hook
    try:
        yield
    finally:
        _BEFORE_FIT.hook = previous


def activation_fit(config: Any, spec: ProbeSpec) -> ActivationFit:
    """The fitted saved-activation bytes of `config`'s model under `spec` (cached per config and spec).

    One fit at a time, on one intra-op thread: the probe's ops are tiny, and handing each to OpenMP's pool costs
    milliseconds on a busy machine (measured on 2 busy cores: 1.0 s per fit with 2 threads, 0.12 s with one).
    A fit holds the process's torch state (isolation.exclusive): its models' weights and dropout masks are its own,
    and a run training meanwhile never sees its seeds, its dtype or its thread count. The process state is taken
    before `_FIT_LOCK`, always in that order.
    """
    key = (type(config).__name__, config.to_json_string(use_diff=False), spec)
    with _FIT_LOCK:
        if key in _FIT_CACHE:
            return _FIT_CACHE[key]
    hook = getattr(_BEFORE_FIT, "hook", None)
    if hook is not None:
        hook()
    with exclusive(seed=0, threads=1), _FIT_LOCK:
        if key not in _FIT_CACHE:
            _FIT_CACHE[key] = _fit(config, spec)
        return _FIT_CACHE[key]


def _fit(config: Any, spec: ProbeSpec) -> ActivationFit:
    """Fit over the probe points, then predict a forward the fit never saw (larger tokens, every width bumped). A miss
    there means the bytes are not bilinear at these points: the fit is re-probed once over other token shapes, and
    kept with its miss (`reliable` False) if that misses too; the planner refuses an unreliable fit."""
    fit = _fit_over(config, spec, reprobe=False)
    if not fit.reliable:
        second = _fit_over(config, spec, reprobe=True)
        fit = second if second.held_out_misfit_bytes < fit.held_out_misfit_bytes else fit
    return fit


def _fit_over(config: Any, spec: ProbeSpec, reprobe: bool) -> ActivationFit:
    names = width_names(config)
    layers = ProbeLayers.of(config, lora=bool(spec.lora_rank))
    autocast = PRECISIONS[spec.precision].autocast
    rows_of_basis, measured = [], []
    probe_state.kernel_heads = None
    probe_state.kernel_saving_layers = set()
    for widths in width_points(config, names):  # the last point bumps every width: the held-out forward's model
        model = build_probe_model(config, widths, spec, layers)
        recorder = SaveRecorder(model, config, len(layers.copies), spec.cuda_autocast)
        chunk = point_chunk(config, widths)
        for rows, seq_len in _token_points(spec, config, reprobe):
            batch = probe_batch(config, spec, rows, seq_len, widths["vocab_size"])
            measured.append(_targets_of(recorder.run(model, batch, autocast), layers))
            rows_of_basis.append(_basis(_token_monomials(spec, rows, seq_len, chunk), [widths[n] for n in names]))
    rows, seq_len = _held_out_point(spec, config)
    held_out = _targets_of(recorder.run(model, probe_batch(config, spec, rows, seq_len, widths["vocab_size"]), autocast),
                           layers)
    held_out_widths = [widths[n] for n in names]
    targets = tuple(sorted({t for m in measured + [held_out] for t in m}))
    design = np.array(rows_of_basis)
    values = np.array([[m.get(t, 0.0) for t in targets] for m in measured])
    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    coefficients = np.linalg.lstsq(design / scale, values, rcond=None)[0] / scale[:, None]
    residual = float(np.abs(design @ coefficients - values).max()) if values.size else 0.0
    monomials = _token_monomials(spec, rows, seq_len, chunk)
    predicted = _basis(monomials, held_out_widths) @ coefficients
    misfit = max((abs(p - held_out.get(t, 0.0)) for t, p in zip(targets, predicted)), default=0.0)
    reference = ProbeReference(tuple(float(m) for m, _ in monomials), tuple(held_out_widths), held_out)
    quadratic = np.array([q for _, q in _token_monomials(spec, 2, 2, chunk) for _ in range(len(names) + 1)])
    kernel_layers = round(sum(layers.weights[layer] for layer in probe_state.kernel_saving_layers
                              if layer is not None))
    return ActivationFit(targets, coefficients, quadratic, names, spec, residual, probe_state.kernel_heads,
                         kernel_layers, misfit, reference)


@dataclasses.dataclass
class ProbedActivations:
    """The probe's share of the activation estimate for one real model and token shape."""

    terms: dict[str, int]  # bytes per part: layers.norms, layers.attention, ..., attention_scores_or_mask
    largest_layer_bytes: int  # one decoder layer's saved bytes (what checkpointing recomputes at a time)
    kernel_heads: tuple[int, int] | None  # (query, key/value) heads of the attention kernel left to the formulas
    kernel_layers: int  # real layers whose kernel saves for backward
    notes: list[str]
    reliable: bool = True  # False: the fit missed its held-out forward, or a term left its physical bounds


def probed_activations(config: Any, spec: ProbeSpec, rows: int, seq_len: int,
                       dropout_mask_bytes_per_element: int = 4) -> ProbedActivations:
    """Evaluate the fit for the real model at `rows` x `seq_len`.

    Layer parts come out as `layers.norms`, `layers.attention`, `layers.mlp`, `layers.layer_other`; what grows with
    the square of the tokens (masks, eager scores) is split off into `attention_scores_or_mask`. CPU dropout masks
    are float (4 bytes per element); pass 1 for CUDA's bool masks. Every fitted target is checked against its
    physical range (`ProbeReference.bound`): none may be negative or beyond the bound.
    """
    fit = activation_fit(config, spec)
    linear, quadratic = fit.evaluate(config, rows, seq_len)
    monomials, squared = zip(*_token_monomials(spec, rows, seq_len, real_chunk(config)))
    widths = [real_width(config, name) for name in fit.width_names]
    terms: dict[str, int] = {}
    largest_layer = 0
    out_of_bounds = []
    for target in fit.targets:
        bound = fit.reference.bound(target, list(monomials), widths)
        for part, quadratic_part in ((linear, False), (quadratic, True)):
            # Float sums of exact counts, extrapolated: zero is zero. Each part's rounding grows with its own
            # monomials: judged by the quadratic ones' growth, a long sequence's real linear bytes (a 64k-token
            # row's whole activations) would read as rounding and vanish.
            part_bound = fit.reference.bound(target, list(monomials), widths,
                                             [is_squared == quadratic_part for is_squared in squared])
            if abs(part[target]) <= 8 + _HELD_OUT_TOLERANCE * part_bound:
                part[target] = 0
        noise = 8 + _HELD_OUT_TOLERANCE * bound
        value = linear[target] + quadratic[target]
        if value < 0 or value > bound + noise:
            out_of_bounds.append(f"{target} {value / 2**30:,.3f} GiB (physical range 0 to {bound / 2**30:,.3f})")
        if target.startswith("one_layer."):
            largest_layer = max(largest_layer, value)
            continue
        if target.endswith("dropout_masks"):  # masks of hidden states and of attention probabilities alike
            masks = value * dropout_mask_bytes_per_element // 4
            terms["dropout_masks"] = terms.get("dropout_masks", 0) + masks
            continue
        terms[target] = terms.get(target, 0) + linear[target]
        terms["attention_scores_or_mask"] = terms.get("attention_scores_or_mask", 0) + quadratic[target]
    notes = []
    if not fit.reliable:
        notes.append(f"the probe's saved bytes are not bilinear in tokens and widths for this architecture: the fit "
                     f"missed a forward it never saw by {fit.held_out_misfit_bytes:,.0f} bytes, after a re-probe")
    if out_of_bounds:
        notes.append("fitted terms outside their physical range: " + "; ".join(out_of_bounds))
    return ProbedActivations({k: v for k, v in terms.items() if v}, largest_layer, fit.kernel_heads,
                             fit.kernel_layers, notes,
                             reliable=fit.reliable and not out_of_bounds)
