"""Tiny random hybrids, one per linear-attention / short-convolution / SSM family transformers 5.24 builds as a causal
LM, each two layers (Falcon-H1 three, Qwen3.5's composite four): its stateful mixer, then attention. Used by
tests/test_hybrid_packing.py and by benchmarks/hybrid_packing.py, which writes docs/HYBRID_PACKING.md's table from the
same entries.

`initializer_range=0.1` (transformers' default is 0.02): at 0.02 a random LFM2 or Jamba moves its logits by only
~5e-4 to 2e-3 when its examples mix, too close to the 1e-4 tolerance for a test that must tell mixing from rounding;
at 0.1 every family mixes by 9e-2 of its logit scale or more.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import transformers

from demo_core.models.sources import byte_tokenizer

VOCAB = 384  # the byte tokenizer's size (models.BYTE_VOCAB_SIZE)
_INIT = 0.1
BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=2048, pad_token_id=0, bos_token_id=None, eos_token_id=1,
            tie_word_embeddings=False, initializer_range=_INIT)
GATED_DELTA = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                   linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"])
MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=16,
              mamba_d_conv=4, mamba_expand=2)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


@dataclasses.dataclass(frozen=True)
class HybridFamily:
    name: str  # the model type
    mixer: str  # the class of its stateful mixer in transformers.models.<type>.modeling_<type>
    feature: str
    make_config: Callable[[], transformers.PretrainedConfig]
    # transformers builds this family's attention masks without position_ids, so its attention keeps examples apart
    # only with `cu_seq_lens_q` in the batch (varlen or flash_attention_2): a position_ids-only row mixes there.
    attention_needs_cu_seq_lens: bool = False


def _config(config_class: str, **fields) -> Callable[[], transformers.PretrainedConfig]:
    return lambda: getattr(transformers, config_class)(**{**BASE, **fields})


def qwen3_5_composite() -> transformers.PretrainedConfig:
    """A Qwen3.5 checkpoint's config as released: `model_type` qwen3_5 with the language model in `text_config`
    (qwen3_5_text: linear-attention layers before every full-attention one, M-RoPE `rope_parameters`, a gated attention
    output) and a vision tower in `vision_config`; shrunk, field names and layout kept. The fields as they stand in
    https://huggingface.co/Qwen/Qwen3.5-0.8B/blob/main/config.json (architectures
    ["Qwen3_5ForConditionalGeneration"], text_config: 24 layers [linear_attention x3, full_attention] x6, head_dim
    256, linear key/value heads 16/16 of 128, linear_conv_kernel_dim 4, attn_output_gate true, rope_parameters
    {mrope_interleaved: true, mrope_section [11, 11, 10], rope_theta 1e7, partial_rotary_factor 0.25}; vision_config:
    depth 12, hidden_size 768, out_hidden_size 1024). transformers 5.24's AutoModelForCausalLM builds the text model
    (Qwen3_5ForCausalLM) from it."""
    text = {**BASE, **GATED_DELTA, "model_type": "qwen3_5_text", "head_dim": 16, "attn_output_gate": True,
            "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            "num_hidden_layers": 4, "full_attention_interval": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5,
                                "mrope_interleaved": True, "mrope_section": [2, 1, 1]}}
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, in_channels=3, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16,
                  deepstack_visual_indexes=[])
    return transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                                      architectures=["Qwen3_5ForConditionalGeneration"])


HYBRID_FAMILIES = [
    HybridFamily("qwen3_5_text", "Qwen3_5GatedDeltaNet", "gated delta net (Qwen3.5 dense)",
                 _config("Qwen3_5TextConfig", **GATED_DELTA, head_dim=16)),
    HybridFamily("qwen3_5", "Qwen3_5GatedDeltaNet", "composite vision + text config, as checkpoints ship",
                 qwen3_5_composite),
    HybridFamily("qwen3_5_moe_text", "Qwen3_5MoeGatedDeltaNet", "gated delta net, MoE (Qwen3.5 MoE)",
                 _config("Qwen3_5MoeTextConfig", **GATED_DELTA, **MOE, head_dim=16,
                         shared_expert_intermediate_size=32)),
    HybridFamily("qwen3_next", "Qwen3NextGatedDeltaNet", "gated delta net, MoE",
                 _config("Qwen3NextConfig", **GATED_DELTA, **MOE, head_dim=16, shared_expert_intermediate_size=32)),
    HybridFamily("olmo_hybrid", "OlmoHybridGatedDeltaNet", "gated delta net",
                 _config("OlmoHybridConfig", **GATED_DELTA)),
    HybridFamily("lfm2", "Lfm2ShortConv", "short convolutions",
                 _config("Lfm2Config", layer_types=["conv", "full_attention"])),
    HybridFamily("lfm2_moe", "Lfm2MoeShortConv", "short convolutions, MoE", _config(
        "Lfm2MoeConfig", layer_types=["conv", "full_attention"], num_dense_layers=1, **MOE)),
    # 3 layers: with 2, the memory probe would read its two `mlp_multipliers` as one value per layer
    HybridFamily("falcon_h1", "FalconH1Mixer", "Mamba-2 in parallel with attention in every layer",
                 _config("FalconH1Config", **MAMBA2, mamba_d_ssm=128, num_hidden_layers=3)),
    HybridFamily("bamba", "BambaMixer", "Mamba-2", _config("BambaConfig", attn_layer_indices=[1], **MAMBA2)),
    HybridFamily("zamba2", "Zamba2MambaMixer", "Mamba-2, shared attention block", lambda: transformers.Zamba2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        layers_block_type=["mamba", "hybrid"], mamba_d_state=8, n_mamba_heads=8, chunk_size=16, adapter_rank=8,
        intermediate_size=128, max_position_embeddings=2048, pad_token_id=0, bos_token_id=None, eos_token_id=1,
        initializer_range=_INIT)),
    HybridFamily("granitemoehybrid", "GraniteMoeHybridMambaLayer", "Mamba-2, MoE", _config(
        "GraniteMoeHybridConfig", layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=64, **MAMBA2), attention_needs_cu_seq_lens=True),
    HybridFamily("jamba", "JambaMambaMixer", "Mamba-1, MoE", _config(
        "JambaConfig", attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
        num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2)),
    # Kimi delta attention (the gated delta rule with a per-channel decay) beside MLA, a first dense layer, experts
    HybridFamily("bailing_hybrid", "BailingHybridDeltaAttention", "Kimi delta attention, MLA, MoE", _config(
        "BailingHybridConfig", num_key_value_heads=4, linear_num_heads=4, linear_head_dim=16, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, head_dim=24, num_experts=4, num_experts_per_token=2,
        num_expert_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1,
        mlp_layer_types=["dense", "sparse"], layer_types=["linear_attention", "full_attention"])),
    HybridFamily("minimax", "MiniMaxLightningAttention", "lightning attention, MoE", _config(
        "MiniMaxConfig", layer_types=["linear_attention", "full_attention"], num_local_experts=4, num_experts_per_tok=2,
        block_size=8, head_dim=16)),
]


def save_model_folder(family: HybridFamily, folder: Path, seed: int = 0) -> Path:
    """The family as a model folder the engine loads like a checkpoint: config.json, weights, the byte tokenizer."""
    transformers.set_seed(seed)
    config = family.make_config()
    # A composite config names its checkpoint class (Qwen3_5ForConditionalGeneration): save that, as releases do.
    model_class = getattr(transformers, (config.architectures or ["AutoModelForCausalLM"])[0])
    model = model_class._from_config(config) if config.architectures else model_class.from_config(config)
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder
