"""Hybrid (SSM, linear-attention, short-convolution) and MLA / mixture-of-experts models: the planner answers for them,
and the activation estimate equals the bytes a real tiny CPU step saves (as tests/test_memory_families.py checks the
dense decoders).

Each config is built from its transformers config class at a tiny size the probe's own small models never use
(hidden 64, and the scans' own chunk of 16 tokens where the config sets one), so a match means the fit carries over
to other widths, chunk sizes and token shapes. Gated and Kimi delta nets scan in chunks of 64 tokens fixed in
transformers' code: their batches span two chunks or more, where the probe fits them (below two chunks a few
per-chunk copies differ). Run `pytest -s tests/test_memory_hybrids.py` to see the table.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from commandline.main import main
from demo_core.memory.estimate import estimate_memory_detail
from demo_core.memory.measure import SavedActivationMeter
from demo_core.memory.plan_request import PlanRequest
from demo_core.memory.planner import plan
from demo_core.memory.step import StepShape, TrainingSettings
from demo_core.models.sources import byte_tokenizer

from tiny_models import build, packed_batch, padded_batch

VOCAB = 384
BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=2048, pad_token_id=0, bos_token_id=None, eos_token_id=1,
            tie_word_embeddings=False)
MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=16,
              mamba_d_conv=4, mamba_expand=2)
GATED_DELTA = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                   linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"])
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# DeepSeek's MLA (low-rank queries and keys, a rotary part of its own, qk_rope_head_dim != head_dim of the probe's
# small models) and a first dense layer before the experts
MLA = dict(kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=4,
           num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1)


def _zamba2(hidden_size: int, heads: int) -> transformers.Zamba2Config:
    return transformers.Zamba2Config(
        vocab_size=VOCAB, hidden_size=hidden_size, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=heads, layers_block_type=["mamba", "hybrid"], mamba_d_state=8, n_mamba_heads=8,
        chunk_size=16, adapter_rank=8, intermediate_size=128, max_position_embeddings=2048, pad_token_id=0,
        bos_token_id=None, eos_token_id=1)


HYBRIDS = {
    "bamba": lambda: transformers.BambaConfig(**BASE, **MAMBA2, attn_layer_indices=[1]),
    "granitemoehybrid": lambda: transformers.GraniteMoeHybridConfig(
        **BASE, **MAMBA2, layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=64),
    # one layer: Mamba-2 beside attention in the same layer, and lists of one entry per layer
    "falcon_h1": lambda: transformers.FalconH1Config(**{**BASE, "num_hidden_layers": 1}, **MAMBA2, mamba_d_ssm=128),
    "jamba": lambda: transformers.JambaConfig(
        **BASE, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=4,
        num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2),
    "zamba2": lambda: _zamba2(hidden_size=64, heads=4),
    # Zamba2 derives its attention head width, 2 x hidden / heads: 38 (rounded down) with 5 heads, where the probe's
    # hidden sizes give widths that are not whole either; with 6 heads one of them is odd, which rotary refuses
    "zamba2_5_heads": lambda: _zamba2(hidden_size=96, heads=5),
    "zamba2_6_heads": lambda: _zamba2(hidden_size=96, heads=6),
    "qwen3_next": lambda: transformers.Qwen3NextConfig(**BASE, **GATED_DELTA, **MOE, head_dim=16,
                                                       shared_expert_intermediate_size=32),
    # the gated delta net's head widths as the config class derives them, and as the released shape has them (the
    # class's defaults): three quarters of the hidden size per key head (24 here), the value heads twice that
    "olmo_hybrid": lambda: transformers.OlmoHybridConfig(**BASE, linear_num_key_heads=2, linear_conv_kernel_dim=4,
                                                         layer_types=["linear_attention", "full_attention"]),
    "lfm2": lambda: transformers.Lfm2Config(**BASE, layer_types=["conv", "full_attention"]),
    # Mamba-2 with a head width of its own (its head count shrunk in multiples of its groups), experts, attention, MLP
    "nemotron_h": lambda: transformers.NemotronHConfig(
        **{**BASE, "num_hidden_layers": 4}, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=8,
        chunk_size=16, conv_kernel=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32, layers_block_type=["mamba", "moe", "attention", "mlp"], head_dim=16),
    # Kimi delta attention (chunks of 64 fixed in transformers' code) beside MLA, a first dense layer, then experts
    "bailing_hybrid": lambda: transformers.BailingHybridConfig(
        **{**BASE, "num_key_value_heads": 4}, linear_num_heads=4, linear_head_dim=16, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, head_dim=24, num_experts=4, num_experts_per_token=2,
        num_expert_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1,
        mlp_layer_types=["dense", "sparse"], layer_types=["linear_attention", "full_attention"]),
    "deepseek_v3": lambda: transformers.DeepseekV3Config(**{**BASE, "num_key_value_heads": 4}, **MLA),
    # V3.2: MLA with a sparse-attention indexer (its own heads and width) that picks each query's keys: up to
    # index_topk of them (2048 in released configs), more than these batches' rows hold, as at real lengths up to it
    "deepseek_v32": lambda: transformers.DeepseekV32Config(**{**BASE, "num_key_value_heads": 4}, **MLA,
                                                           index_n_heads=4, index_head_dim=16, index_topk=256),
    # V2: the same MLA, and a config class (transformers 5) that requires the hidden size to be a multiple of the
    # head count, which MLA never splits it by: 16 heads, so the probe's usual hidden sizes (40, 56) are refused
    "deepseek_v2": lambda: transformers.DeepseekV2Config(**{**BASE, "num_attention_heads": 16,
                                                            "num_key_value_heads": 16}, **MLA),
    # one decoder layer: the per-layer lists of one entry
    "llama_one_layer": lambda: transformers.LlamaConfig(**{**BASE, "num_hidden_layers": 1}),
}
PADDED_LENGTHS = [64, 21, 47, 33]
PACKED_LENGTHS = [40, 17, 60, 33, 50]
TWO_CHUNKS_PADDED = [150, 70, 131, 93]  # gated delta nets: 64-token chunks
TWO_CHUNKS_PACKED = [90, 47, 60, 33]


class _HoldingMeter(SavedActivationMeter):
    """The meter, holding every tensor it is handed until the count ends. The meter counts storages by address: a
    saved tensor freed inside the forward (a branch whose output the model drops: DeepSeek's MLA freed some, by the
    allocator's state) and a later one the allocator puts at its address read as one, so a count could read a few KB
    low depending on what ran before. Held, no address is reused, and every saved storage counts once, as the
    probe's recorder counts them (memory/probe_recorder.py keeps its saved tensors alive for the same reason)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self.held: list[torch.Tensor] = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.held.append(t)
        return super()._pack(t)


def held_saved_bytes(model: torch.nn.Module, batch: dict) -> int:
    """What autograd saves in one fp32 forward (loss included), with no storage's address reused meanwhile."""
    with _HoldingMeter(model) as meter:
        model(**batch, use_cache=False)
    meter.held.clear()
    return meter.saved_bytes


# Tiny forwards: OpenMP's hand-off costs more than the work on a busy machine (the probe runs this way too).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _lengths(family: str, layout: str) -> list[int]:
    if family in ("qwen3_next", "olmo_hybrid", "bailing_hybrid"):
        return TWO_CHUNKS_PACKED if layout == "packed" else TWO_CHUNKS_PADDED
    return PACKED_LENGTHS if layout == "packed" else PADDED_LENGTHS


@pytest.mark.parametrize("family, layout", [(family, layout) for family in HYBRIDS for layout in ("padded", "packed")])
def test_the_activation_estimate_of_hybrids_and_mla_equals_a_real_step(family, layout):
    config = HYBRIDS[family]()
    lengths = _lengths(family, layout)
    packed = layout == "packed"
    measured = held_saved_bytes(build(config, "sdpa"), packed_batch(lengths) if packed else padded_batch(lengths))
    step = StepShape.packed_row(lengths) if packed else StepShape.padded(lengths)
    estimate = estimate_memory_detail(config, step, TrainingSettings(precision="fp32", attention="sdpa"))
    estimated = estimate.categories["activations"]
    print(f"{family:17s} {layout:6s} est {estimated:>10,} meas {measured:>10,} "
          f"err {100 * (estimated - measured) / measured:+.3f}%")
    assert estimate.reliable, estimate.notes
    assert estimated == measured, (family, layout, estimated, measured)  # to the byte


@pytest.mark.parametrize("family", list(HYBRIDS))
def test_the_planner_answers_for_hybrids_and_mla(family, tmp_path):
    HYBRIDS[family]().save_pretrained(tmp_path)
    answer = plan(PlanRequest(model=str(tmp_path), batch_size=2, seq_length=512, gpu_gb=24))  # refused: raises
    assert answer.device.reliable and answer.device.categories["activations"] > 0
    # a tiny model fits a 24 GB card up to its positions, and its scaling curve grows with the length
    assert answer.max_seq_length == 2048 and answer.fits[24]
    used = [point["padded_bytes"] for point in answer.scaling]
    assert used == sorted(used) and used[0] < used[-1]


def _model_folder(family: str, folder) -> str:
    """The family as a checkpoint folder: config.json, random weights, the byte tokenizer."""
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(HYBRIDS[family]()).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v32", "deepseek_v2", "llama_one_layer"])
def test_checkpoints_that_crashed_the_memory_probe_plan_and_train_through_the_cli(family, tmp_path, capsys):
    """Issue 31's crashes: DeepSeek-V3/V3.2 shapes (qk_rope_head_dim beside a shrunk head_dim) and a one-layer
    model (per-layer lists of one entry) plan and train from a model folder, flatten equal to padded."""
    folder = _model_folder(family, tmp_path / family)
    planned, compared = tmp_path / "plan.json", tmp_path / "run.json"
    assert main(["plan", "--model", folder, "--batch-size", "2", "--seq-length", "256", "--json", str(planned)]) == 0
    document = json.loads(planned.read_text())
    assert document["max_seq_length"] == 2048 and document["per_device"]["activations"] > 0
    assert main(["compare", "--model", folder, "--samples", "8", "--steps", "2", "--batch-size", "4",
                 "--max-length", "128", "--collators", "padded,flatten", "--json", str(compared)]) == 0
    run = json.loads(compared.read_text())
    assert run["comparison"]["flatten"]["max_abs_loss_diff_vs_padded"] < 1e-4
    assert "Traceback" not in capsys.readouterr().err


def test_a_kernel_path_the_model_cannot_run_is_refused_in_one_sentence_and_auto_plans_sdpa(tmp_path, capsys):
    """DeepSeek-V3.2's indexer slices a 4-D attention mask, which the per-example kernel paths do not build: named,
    the path is refused in one line; auto plans SDPA, as the engine's pre-flight trains it, and says so."""
    config = HYBRIDS["deepseek_v32"]()
    config.save_pretrained(tmp_path)
    assert main(["plan", "--model", str(tmp_path), "--attention", "varlen"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "Traceback" not in error
    assert error.startswith("error: cannot estimate memory for deepseek_v32 models with attention varlen")
    answer = plan(PlanRequest(model=str(tmp_path), batch_size=2, seq_length=256, gpu_gb=24))
    assert answer.attention == "sdpa"
    assert any(note.startswith("attention sdpa: the varlen path") for note in answer.notes)


def test_a_model_without_attention_is_refused_in_one_sentence(tmp_path, capsys):
    """A pure Mamba-2 model has no attention heads (its head_dim is its scan's), and its config class ties the hidden
    size to the scan's heads, which the probe does not shrink together: the plan says so in one line, where it raised
    AttributeError ('num_attention_heads') with a traceback."""
    transformers.Mamba2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
                              expand=2, state_size=8, n_groups=1, chunk_size=16).save_pretrained(tmp_path)
    assert main(["plan", "--model", str(tmp_path), "--batch-size", "2", "--seq-length", "128"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith("error: cannot estimate memory for mamba2 models")
