"""Linear-attention, short-convolution and SSM hybrids pack exactly with per-example mixers (hybrid_mixers.py).

For every hybrid family transformers 5.24 builds as a causal LM (tests/hybrid_families.py): a flattened row of three
examples, as the engine's `flatten` collator builds it, computes each example's logits and the training loss's
gradients as the examples alone do (eager attention, no packing, no padding), in fp32, within 1e-4 of the logit
scale; a padded batch still does too. Without the per-example mixers the same row mixes the examples (or the model
raises on the varlen keys), so every test here can fail.
"""

import math
import sys
from copy import deepcopy

import pytest
import torch
import transformers
from transformers.integrations import use_kernel_func_from_hub_with_fallback
from transformers.models.lfm2 import modeling_lfm2

from demo_core import RunConfig, prepare, run_comparison
from demo_core.attention import hybrid_hazard
from demo_core.attention.varlen import VARLEN
from demo_core.collators import FlattenCollator
from demo_core.errors import DemoInputError
from demo_core.memory.plan_request import load_config
from demo_core.memory.probe import probed_activations
from demo_core.memory.probe_model import ProbeSpec
from demo_core.memory.probe_recorder import ATTENTION_KERNEL_EXCLUDED
from demo_core.models import hybrid_mixers
from demo_core.models.sources import byte_tokenizer, config_source, load_model_source
from demo_core.training import memory_guard

from hybrid_families import HYBRID_FAMILIES, save_model_folder

TOLERANCE = 1e-4  # of the logit scale, as preflight.TOLERANCE
LENGTHS = (13, 6, 10)
LISTED_MODEL_TYPES = {"qwen3_5", "qwen3_5_moe", "qwen3_next", "olmo_hybrid", "lfm2", "lfm2_moe", "falcon_h1",
                      "bamba", "zamba2", "granitemoehybrid", "jamba", "minimax", "bailing_hybrid"}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _examples(lengths=LENGTHS) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, 384, (n,), generator=generator).tolist() for n in lengths]


def _flatten_batch(examples) -> dict:
    """The engine's packed batch: position_ids, cu_seq_lens_q/k, max_length_q/k, seq_idx, labels."""
    return FlattenCollator(byte_tokenizer())([{"input_ids": ids} for ids in examples])


def _build(family, attn_implementation: str, seed: int = 0) -> torch.nn.Module:
    transformers.set_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(family.make_config(), attn_implementation=attn_implementation)


def _family(name):
    return next(family for family in HYBRID_FAMILIES if family.name == name)


def _alone_logits(reference, examples) -> list[torch.Tensor]:
    with torch.no_grad():
        return [reference(input_ids=torch.tensor([ids]), use_cache=False).logits[0] for ids in examples]


def _relative(pieces, alone) -> float:
    scale = max(1.0, max(float(logits.abs().max()) for logits in alone))
    return max(float((piece - reference).abs().max()) for piece, reference in zip(pieces, alone)) / scale


def test_the_families_cover_every_listed_model_type_and_their_mixers_are_known():
    built = {family.make_config().model_type for family in HYBRID_FAMILIES}
    text_types = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}
    assert LISTED_MODEL_TYPES <= built | {text_types.get(name, name) for name in built}
    for family in HYBRID_FAMILIES:
        assert family.mixer in hybrid_mixers.MIXERS, family.name


@pytest.mark.parametrize("family", HYBRID_FAMILIES, ids=lambda family: family.name)
def test_packed_row_computes_each_example_as_alone(family):
    reference = _build(family, "eager").eval()
    model = _build(family, VARLEN).eval()
    installed = hybrid_mixers.install(model)
    assert {type(module).__name__ for module in installed.mixers} == {family.mixer}
    examples = _examples()
    alone = _alone_logits(reference, examples)
    batch = _flatten_batch(examples)
    layouts = {"flatten": {key: value for key, value in batch.items() if key != "labels"}}
    if not family.attention_needs_cu_seq_lens:
        layouts["position_ids only"] = {key: batch[key] for key in ("input_ids", "position_ids")}
    longest = max(LENGTHS)
    padded = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros_like(padded)
    for row, ids in enumerate(examples):
        padded[row, : len(ids)], mask[row, : len(ids)] = torch.tensor(ids), 1
    with torch.no_grad():
        for name, inputs in layouts.items():
            pieces = torch.split(model(**inputs, use_cache=False).logits[0], list(LENGTHS))
            assert _relative(pieces, alone) < TOLERANCE, (family.name, name)
        logits = model(input_ids=padded, attention_mask=mask, use_cache=False).logits
        assert _relative([logits[row, :n] for row, n in enumerate(LENGTHS)], alone) < TOLERANCE, family.name

    # The same row without per-example mixers: the state crosses the boundaries (or transformers refuses the keys).
    readings = {reading.layout: reading for reading in hybrid_hazard.measure_hazard(model, examples)}
    assert readings["position_ids"].max_abs_logit_diff / readings["position_ids"].logit_scale > 100 * TOLERANCE
    keyed = readings["trl_padding_free"]
    assert ("can't keep packed sequences apart" in keyed.error if keyed.error else
            keyed.max_abs_logit_diff / keyed.logit_scale > 100 * TOLERANCE), family.name
    assert hybrid_mixers.installed_on(model) is not None  # the measurement put them back


def _loss_gradients(model, loss) -> dict[str, torch.Tensor]:
    loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return gradients


@pytest.mark.parametrize("family, checkpointing", [(family, False) for family in HYBRID_FAMILIES] + [
    # GraniteMoeHybrid's decoder layers never see position_ids, Zamba2's Mamba layer sits inside a hybrid layer: the
    # recompute in backward must still find the boundaries the model's forward read.
    (_family("granitemoehybrid"), True), (_family("zamba2"), True), (_family("qwen3_5"), True)],
    ids=lambda value: value.name if hasattr(value, "name") else ("checkpointed" if value else ""))
def test_packed_row_trains_with_the_gradients_of_each_example_alone(family, checkpointing):
    model = _build(family, VARLEN).train()
    hybrid_mixers.install(model)
    if checkpointing:
        model.activation_checkpointing_enable()
    examples = _examples()
    targets = sum(len(ids) - 1 for ids in examples)  # one mean token loss over the batch, as Trainer computes it
    expected = _loss_gradients(model, sum(
        model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids]), use_cache=False).loss * (len(ids) - 1)
        for ids in examples) / targets)
    actual = _loss_gradients(model, model(**_flatten_batch(examples), use_cache=False).loss)
    assert actual.keys() == expected.keys()
    mixers = [name for name, _ in hybrid_mixers.mixer_modules(model)]
    mixer_parameters = [name for name in expected if any(name.startswith(f"{mixer}.") for mixer in mixers)]
    assert mixer_parameters and all(expected[name].abs().max() > 0 for name in mixer_parameters)
    scale = max(float(gradient.abs().max()) for gradient in expected.values())
    assert max(float((actual[name] - gradient).abs().max()) for name, gradient in expected.items()) < TOLERANCE * scale


def test_a_qwen3_5_checkpoint_folder_trains_its_text_model_with_per_example_mixers(tmp_path):
    """A folder shaped as Qwen3.5 releases ship (Qwen3_5ForConditionalGeneration: vision tower, `text_config`) loads
    through the engine as its language model, and that model's builds pack exactly."""
    folder = save_model_folder(_family("qwen3_5"), tmp_path / "qwen3_5")
    source = load_model_source(str(folder))
    model = source.build(VARLEN).eval()
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and hybrid_mixers.installed_on(model) is not None
    examples = _examples()
    alone = _alone_logits(model, examples)
    with torch.no_grad():
        batch = {key: value for key, value in _flatten_batch(examples).items() if key != "labels"}
        pieces = torch.split(model(**batch, use_cache=False).logits[0], list(LENGTHS))
    assert _relative(pieces, alone) < TOLERANCE


def test_engine_builds_carry_the_mixers_and_plain_models_do_not():
    source = config_source("lfm2", _family("lfm2").make_config(), byte_tokenizer())
    assert hybrid_mixers.installed_on(source.build("eager")) is not None
    assert hybrid_mixers.installed_on(_build(_family("lfm2"), "eager")) is None


def test_remove_puts_transformers_mixers_back():
    family = _family("jamba")
    model = _build(family, "eager").eval()
    installed = hybrid_mixers.install(model)
    assert hybrid_mixers.install(model) is installed  # idempotent
    examples = _examples()
    alone = _alone_logits(model, examples)
    inputs = {key: value for key, value in _flatten_batch(examples).items() if key != "labels"}
    installed.remove()
    with torch.no_grad():
        pieces = torch.split(model(**inputs, use_cache=False).logits[0], list(LENGTHS))
    assert _relative(pieces, alone) > 100 * TOLERANCE and hybrid_mixers.installed_on(model) is None


def test_a_deep_copy_packs_exactly_with_its_own_weights():
    """install binds each mixer's forward to the mixer: a copy of the model (TRL's reference models are deep copies)
    runs its own weights, not the original's."""
    family = _family("bamba")
    model = _build(family, "eager").eval()
    hybrid_mixers.install(model)
    copy = deepcopy(model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    examples = _examples()
    alone = _alone_logits(_build(family, "eager").eval(), examples)  # the weights the copy took, never wrapped
    inputs = {key: value for key, value in _flatten_batch(examples).items() if key != "labels"}
    with torch.no_grad():
        pieces = torch.split(copy(**inputs, use_cache=False).logits[0], list(LENGTHS))
    assert _relative(pieces, alone) < TOLERANCE


# ---- where the boundaries come from ---------------------------------------------------------------------------------

def test_packed_segments_from_position_ids_and_from_cu_seq_lens():
    batch = _flatten_batch(_examples())
    tokens = sum(LENGTHS)
    from_positions = hybrid_mixers.packed_segments(1, tokens, torch.device("cpu"), position_ids=batch["position_ids"])
    from_cu = hybrid_mixers.packed_segments(1, tokens, torch.device("cpu"), cu_seq_lens=batch["cu_seq_lens_q"])
    assert from_positions.lengths == from_cu.lengths == list(LENGTHS)
    # Qwen3.5's text model also takes (4, batch, seq) positions: the text row first
    four_rows = batch["position_ids"][None].expand(4, 1, tokens)
    segments = hybrid_mixers.packed_segments(1, tokens, torch.device("cpu"), position_ids=four_rows)
    assert segments.lengths == list(LENGTHS)


def test_unpacked_batches_have_no_segments():
    cpu = torch.device("cpu")
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 1]])
    left_padded_positions = (mask.cumsum(1) - 1) * mask  # zeros on the padding: restarts there, not in the examples
    assert hybrid_mixers.packed_segments(3, 4, cpu, position_ids=left_padded_positions, attention_mask=mask) is None
    assert hybrid_mixers.packed_segments(3, 4, cpu, position_ids=torch.arange(4)[None], attention_mask=mask) is None
    assert hybrid_mixers.packed_segments(1, 5, cpu, position_ids=torch.arange(5)[None]) is None
    assert hybrid_mixers.packed_segments(1, 5, cpu, cu_seq_lens=torch.tensor([0, 5], dtype=torch.int32)) is None


def test_varlen_keys_are_those_transformers_collator_builds():
    examples = _examples()
    batch = _flatten_batch(examples)
    segments = hybrid_mixers.packed_segments(1, sum(LENGTHS), torch.device("cpu"), position_ids=batch["position_ids"])
    keys = hybrid_mixers.varlen_keys(segments)
    assert torch.equal(keys["cu_seq_lens_q"], batch["cu_seq_lens_q"])
    assert torch.equal(keys["seq_idx"], batch["seq_idx"]) and keys["seq_idx"].dtype == batch["seq_idx"].dtype


def test_every_kernel_a_mixer_kind_waits_for_is_defined_beside_its_mixers():
    """A kernel function transformers renamed would leave its mixers looping forever, kernel or not."""
    for family in HYBRID_FAMILIES:
        model = _build(family, "eager")
        for _, mixer in hybrid_mixers.mixer_modules(model):
            modeling = sys.modules[type(mixer).__module__]
            for name in hybrid_mixers.MIXERS[type(mixer).__name__].kernels:
                assert hybrid_mixers._is_package_kernel(getattr(modeling, name)) is False, (family.name, name)
                assert "is_new_implementation" in getattr(modeling, name).__code__.co_freevars, (family.name, name)


def test_kernels_are_read_from_transformers_own_choice():
    # Here no kernel package is installed: transformers bound its PyTorch fallbacks, and the loop runs.
    assert not hybrid_mixers._is_package_kernel(modeling_lfm2.causal_conv1d_fn)
    assert not hybrid_mixers.kernels_ready(modeling_lfm2.Lfm2ShortConv)
    assert not hybrid_mixers.kernels_ready(transformers.models.jamba.modeling_jamba.JambaMambaMixer)
    # The same decorator bound to a package that is installed (the standard library's math) reads as a kernel.
    bound = use_kernel_func_from_hub_with_fallback("sqrt", "math")(lambda value: value)
    assert hybrid_mixers._is_package_kernel(bound) and bound(4.0) == math.sqrt(4.0)


# ---- through the engine ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lfm2", "bamba"])
def test_a_hybrid_model_folder_trains_packed_like_padded(tmp_path, name):
    """The Trainer burst the app runs: flatten's losses match padded's, the contamination check finds each example
    computed as alone, and shows what the same row computes without per-example mixers. (Every listed family through
    the CLI: docs/HYBRID_PACKING.md.)"""
    folder = save_model_folder(_family(name), tmp_path / name)
    config = RunConfig(model=str(folder), samples=8, collators=("padded", "flatten"), steps=2, batch_size=4,
                       max_length=128, attention="auto")
    document = run_comparison(config).to_dict()
    assert {result["attention"] for result in document["results"]} == {VARLEN}
    assert document["comparison"]["flatten"]["max_abs_loss_diff_vs_padded"] < TOLERANCE
    rows = document["contamination"]
    assert rows and max(row["flatten_max_abs_logit_diff"] for row in rows) < TOLERANCE
    assert min(row["flatten_without_per_example_mixers_max_abs_logit_diff"] for row in rows[1:]) > 100 * TOLERANCE


@pytest.mark.parametrize("name, reliable", [("lfm2", True), ("bamba", True), ("minimax", False)])
def test_only_a_reliable_estimate_refuses_a_run(monkeypatch, tmp_path, name, reliable):
    """MiniMax's lightning attention saves a last partial block whose bytes follow (tokens mod block)^2, which the
    memory probe's fit cannot extrapolate: its estimate is marked unreliable and refuses nothing (the burst's
    out-of-memory handling ends a run that does not fit); LFM2's short convolutions and Bamba's chunked Mamba-2 scan
    (tokens rounded up to whole chunks: token monomials of the fit) are exact and still refuse. The free memory is
    the one boundary replaced (test_memory_guard.py)."""
    monkeypatch.setattr(memory_guard, "available_bytes", lambda device: 1)
    folder = save_model_folder(_family(name), tmp_path / name)
    prepared = prepare(RunConfig(model=str(folder), samples=8, collators=("padded", "flatten"), steps=2,
                                 batch_size=4, max_length=128))
    if reliable:
        with pytest.raises(DemoInputError, match="this run needs about"):
            memory_guard.refuse_if_too_big(prepared)
        return
    memory = memory_guard.refuse_if_too_big(prepared)
    assert memory.fits is False and not any(collator.estimate_reliable for collator in memory.collators)


@pytest.mark.parametrize("name, lora_rank, reliable",
                         [("lfm2", 4, True), ("bamba", 4, True), ("zamba2", 0, True), ("minimax", 0, False)])
def test_the_memory_probe_fits_hybrids_and_says_where_it_cannot(name, lora_rank, reliable):
    """The probe shrinks a model's widths: Mamba-2's head width and Zamba2's shared-block positions follow, LoRA's
    stand-in exposes the weight a Mamba-2 mixer reads, a chunked scan's bytes are fitted over chunk counts (exact:
    tests/test_memory_hybrids.py) as a short convolution's are, and a fit that misses its held-out forward (MiniMax's
    partial last block) says so."""
    spec = ProbeSpec(layout="rows", single_row=False, precision="fp32",
                                      attention=ATTENTION_KERNEL_EXCLUDED, checkpointing=False,
                                      lora_rank=lora_rank)
    probed = probed_activations(_family(name).make_config(), spec, rows=2, seq_len=64)
    assert bool(probed.reliable) == reliable
    if reliable:
        assert min(probed.terms.values()) > 0 and not probed.notes
    else:
        assert any("not bilinear" in note for note in probed.notes)


def test_the_planner_plans_a_qwen3_5_checkpoint_as_its_text_model(tmp_path):
    folder = save_model_folder(_family("qwen3_5"), tmp_path / "qwen3_5")
    config = load_config(str(folder))
    assert config.model_type == "qwen3_5_text"
    assert config.layer_types == _family("qwen3_5").make_config().text_config.layer_types
