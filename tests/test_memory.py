"""Memory estimated from configs against bytes measured on real tiny models (CPU): states, activations, peaks."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.optimization import Adafactor

import demo_core.memory.estimate as estimate
from demo_core.errors import DemoInputError
from demo_core.memory.estimate import estimate_memory, estimate_memory_detail
from demo_core.memory.measure import CATEGORIES, SavedActivationMeter, tensor_bytes_by_category
from demo_core.memory.parameters import lora_adapter_shapes
from demo_core.memory.step import StepShape, TrainingSettings

from tiny_models import VOCAB, build, family_config, packed_batch, padded_batch, saved_bytes, segment_lengths

PRESET_FAMILIES = ["llama", "mistral", "qwen2", "gemma", "phi3", "granite", "gpt2"]


# ---- weights / gradients / optimizer: exact to the byte --------------------------------------------------------

def _one_step(model, optimizer) -> dict[str, int]:
    model(**padded_batch([32, 20]), use_cache=False).loss.backward()
    optimizer.step()
    return tensor_bytes_by_category(model, optimizer)


@pytest.mark.parametrize("optimizer_name", ["adamw", "sgd", "adafactor"])
@pytest.mark.parametrize("family", PRESET_FAMILIES)
def test_state_categories_exact_after_a_real_step(family, optimizer_name):
    config = family_config(family)
    model = build(config)
    optimizer = {
        "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
        "sgd": lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
        "adafactor": lambda params: Adafactor(params),  # transformers' own, factored second moments
    }[optimizer_name](model.parameters())
    measured = _one_step(model, optimizer)
    predicted = estimate_memory(config, StepShape(2, 32), TrainingSettings(optimizer=optimizer_name))
    for category in ("weights", "gradients", "optimizer"):
        assert predicted[category] == measured[category], (family, optimizer_name, category)
    # sanity of the measurement itself, independent of the estimator
    n_params = sum(p.numel() for p in model.parameters())
    assert measured["gradients"] == 4 * n_params
    if optimizer_name != "adafactor":
        assert measured["optimizer"] >= (8 if optimizer_name == "adamw" else 4) * n_params
    else:
        assert measured["optimizer"] < n_params  # factored: rows + columns, far below one value per parameter


def test_eight_bit_adamw_states_are_about_a_quarter_of_adamw():
    # bitsandbytes is not installed here: its layout (two uint8 states, an fp32 absmax per 256 values, tensors under
    # 4096 values in 32 bits) checked against AdamW's 8 bytes per value on the small llama's tensors.
    config = family_config("llama", hidden=256, layers=4, intermediate=1024)
    settings = lambda name: TrainingSettings(optimizer=name)  # noqa: E731
    adamw = estimate_memory(config, StepShape(1, 8), settings("adamw"))["optimizer"]
    eight_bit = estimate_memory(config, StepShape(1, 8), settings("adamw_8bit"))["optimizer"]
    assert 0.25 < eight_bit / adamw < 0.30


def test_pure_bf16_halves_weights_gradients_and_adamw_states():
    config = family_config("llama")
    model = build(config).to(torch.bfloat16)
    measured = _one_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    predicted = estimate_memory(config, StepShape(2, 32), TrainingSettings(precision="pure-bf16"))
    for category in ("weights", "gradients", "optimizer"):
        assert predicted[category] == measured[category], category


# ---- activations: estimate vs SavedActivationMeter -------------------------------------------------------------

@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_activation_estimate_matches_saved_tensors(size, layout, attention):
    config = family_config("llama") if size == "tiny" else family_config("llama", 256, 4, 1024)
    lengths = segment_lengths(300) if layout == "packed" else [96, 40, 71, 25]
    batch = packed_batch(lengths) if layout == "packed" else padded_batch(lengths)
    step = StepShape.packed_row(lengths) if layout == "packed" else StepShape.padded(lengths)
    measured = saved_bytes(build(config, attention), batch)
    estimated = estimate_memory(config, step, TrainingSettings(attention=attention))["activations"]
    error = (estimated - measured) / measured
    print(f"llama-{size} {layout} {attention} est={estimated} meas={measured} err={100 * error:+.3f}%")
    assert estimated == measured


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_pure_bf16_activations_match_a_bf16_model(family):
    config = family_config(family)
    lengths = [64, 30, 51]
    measured = saved_bytes(build(config).to(torch.bfloat16), padded_batch(lengths))
    estimated = estimate_memory(config, StepShape.padded(lengths), TrainingSettings(precision="pure-bf16"))
    assert estimated["activations"] == measured


def test_bf16_autocast_activations_include_half_weight_copies():
    config = family_config("llama")
    model = build(config)
    lengths = [64, 30, 51, 12]
    measured = saved_bytes(model, padded_batch(lengths), precision="bf16")
    est = estimate_memory_detail(config, StepShape.padded(lengths), TrainingSettings(precision="bf16"))
    assert est.categories["activations"] == measured
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert est.activation_terms["amp_weight_copies"] == 2 * linear_weights
    # master weights stay fp32 under autocast
    assert est.categories["weights"] == estimate_memory(config, StepShape.padded(lengths))["weights"]


def test_gradient_checkpointing_keeps_layer_inputs_and_recomputes_one_layer():
    lengths = [64, 30, 51, 12]
    config = family_config("llama")
    model = build(config)
    model.activation_checkpointing_enable()  # what Trainer does (non-reentrant)
    measured = saved_bytes(model, padded_batch(lengths))
    est = estimate_memory_detail(config, StepShape.padded(lengths), TrainingSettings(gradient_checkpointing=True))
    assert est.categories["activations"] == measured
    # One layer's saved bytes, measured as the difference a third layer makes without checkpointing.
    two, three = (saved_bytes(build(family_config("llama", layers=n)), padded_batch(lengths)) for n in (2, 3))
    assert est.temporary_terms["recomputed_layer"] == pytest.approx(three - two, rel=0.02)
    assert est.peak_by_moment["backward_recompute"] > est.peak_by_moment["forward_end"]


def test_varlen_saved_bytes_grow_linearly_with_real_tokens():
    config = family_config("llama")
    model = build(config, "varlen")
    short = segment_lengths(256, seed=3, low=8, high=24)
    measured = [saved_bytes(model, packed_batch(short * repeat)) for repeat in (1, 2)]  # twice the same segments
    ratio = measured[1] / measured[0]
    print(f"varlen packed: 256 tokens {measured[0]} B, 512 tokens {measured[1]} B, ratio {ratio:.4f}")
    assert abs(ratio - 2.0) < 0.06
    est = [estimate_memory(config, StepShape.packed_row(short * repeat), TrainingSettings(attention="varlen"))
           for repeat in (1, 2)]
    assert abs(est[1]["activations"] / est[0]["activations"] - 2.0) < 0.01


def test_packed_sdpa_is_linear_once_the_dense_mask_is_removed():
    config = family_config("llama")
    model = build(config, "sdpa")
    short = segment_lengths(256, seed=4, low=8, high=24)
    linear_part = []
    for repeat in (1, 2):
        tokens = 256 * repeat
        measured = saved_bytes(model, packed_batch(short * repeat))
        est = estimate_memory_detail(config, StepShape.packed_row(short * repeat), TrainingSettings(attention="sdpa"))
        mask_bytes = est.activation_terms["attention_scores_or_mask"]
        # the kernel converts the (1, 1, T, T) block-diagonal mask to fp32 once per layer: (sum s_i)^2
        assert mask_bytes == config.num_hidden_layers * tokens * tokens * 4
        linear_part.append(measured - mask_bytes)
    assert abs(linear_part[1] / linear_part[0] - 2.0) < 0.06


def test_quadratic_term_per_attention_path():
    config = family_config("llama")
    step = StepShape.packed_row([100, 50, 50])
    terms = {attention: estimate_memory_detail(config, step, TrainingSettings(attention=attention)).activation_terms
             for attention in ("eager", "varlen")}
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    # eager keeps the fp32 softmax probabilities of every head over the whole packed row: (sum s_i)^2
    assert terms["eager"]["attention_scores_or_mask"] == layers * heads * 200 ** 2 * 4
    # varlen attends within each segment and its kernel keeps a logsumexp, no scores at all
    assert "attention_scores_or_mask" not in terms["varlen"]


def test_bert_activation_estimate_with_dropout_masks():
    """The seed estimate's path, checked on a small BERT classifier (dropout 0.1 everywhere, CPU float masks)."""
    from transformers import AutoModelForSequenceClassification, BertConfig

    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                        vocab_size=VOCAB, num_labels=2, architectures=["BertForSequenceClassification"])
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    model.train()
    ids = torch.randint(0, VOCAB, (4, 64))
    with SavedActivationMeter(model) as meter:
        model(input_ids=ids, labels=torch.randint(0, 2, (4,)))
    est = estimate_memory_detail(config, StepShape(4, 64), TrainingSettings(attention="eager"))
    print(f"bert-small eager est={est.categories['activations']} meas={meter.saved_bytes}")
    assert est.categories["activations"] == meter.saved_bytes
    assert est.activation_terms["dropout_masks"] > 0
    on_cuda = estimate_memory_detail(config, StepShape(4, 64),
                                     TrainingSettings(attention="eager", device_type="cuda")).activation_terms
    assert on_cuda["dropout_masks"] * 4 == est.activation_terms["dropout_masks"]  # bool masks instead of float


# ---- seed example, what-if, settings -------------------------------------------------------------------------

def test_bert_large_seed_estimate_is_sane_and_weights_exact():
    from transformers import AutoModelForSequenceClassification

    config = estimate.bert_large_config()
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
    n_params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert 330e6 < n_params < 340e6
    seed = estimate.seed_example_estimate()
    print({k: round(v / 2**20) for k, v in seed["categories"].items()}, "peak MB", seed["peak_bytes"] / 2**20)
    assert seed["params"] == n_params
    assert seed["categories"]["weights"] == 4 * n_params + buffers
    assert seed["categories"]["optimizer"] == 8 * n_params + 4 * len(list(model.parameters()))
    assert 5 * 2**30 < seed["peak_bytes"] < 16 * 2**30
    assert 5 * 2**30 < seed["sum_of_categories_bytes"] < 16 * 2**30
    assert seed["peak_bytes"] <= seed["seed_measured_bytes"]


def test_what_if_grid_scales_the_right_categories():
    config = family_config("llama")
    settings = [TrainingSettings(precision=p, optimizer=o) for p in ("fp32", "bf16")
                for o in ("adamw", "adamw_8bit", "sgd")]
    rows = estimate.what_if_grid(config, batch_sizes=[1, 2], seq_lens=[128], settings=settings)
    assert len(rows) == 2 * 1 * 6
    by = {(r["batch_size"], r["precision"], r["optimizer"]): r for r in rows}
    assert by[(2, "fp32", "adamw")]["weights_bytes"] == by[(1, "fp32", "adamw")]["weights_bytes"]
    assert by[(2, "fp32", "adamw")]["activations_bytes"] > 1.9 * by[(1, "fp32", "adamw")]["activations_bytes"]
    assert (by[(1, "fp32", "adamw_8bit")]["optimizer_bytes"] < by[(1, "fp32", "sgd")]["optimizer_bytes"]
            < by[(1, "fp32", "adamw")]["optimizer_bytes"])
    assert all(r["total_bytes"] == sum(r[f"{c}_bytes"] for c in CATEGORIES) for r in rows)


def test_lora_adapters_replace_the_trainable_state():
    config = family_config("llama")
    full = estimate_memory_detail(config, StepShape(2, 64), TrainingSettings())
    lora = estimate_memory_detail(config, StepShape(2, 64), TrainingSettings(lora_rank=8))
    adapters = sum(math.prod(s) for s in lora_adapter_shapes(config, 8, ("all-linear",)))
    assert lora.trainable_params == adapters
    assert lora.categories["gradients"] == 4 * adapters
    assert lora.categories["weights"] == full.categories["weights"] + 4 * adapters
    # frozen layers keep no inputs for weight gradients: fewer saved activations
    assert lora.categories["activations"] < full.categories["activations"]


def test_bad_internal_choices_are_programming_errors_not_user_errors():
    with pytest.raises(ValueError, match="precision") as raised:
        TrainingSettings(precision="int4")
    assert not isinstance(raised.value, DemoInputError)
    with pytest.raises(ValueError, match="attention"):
        TrainingSettings(attention="flex")
    with pytest.raises(ValueError):
        StepShape(0, 8)
