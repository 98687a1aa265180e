"""Tiny decoder-only configs, one per family, built from transformers' own config classes.

Each entry names what makes the family interesting for packing and what the run should do on the varlen path:
"exact", or a refusal whose message must match `refused`. Windows and chunks are 8 tokens so that the check's
examples (see tests/test_packing_exactness.py) outgrow them. Used by tests/test_packing_exactness.py and by
benchmarks/packing_exactness.py, which writes the README's table from the same entries.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import transformers

VOCAB = 384  # the byte tokenizer's size (models.BYTE_VOCAB_SIZE)
WINDOW = 8
SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, max_position_embeddings=256, pad_token_id=0, bos_token_id=None, eos_token_id=1,
             tie_word_embeddings=False)
GPT_STYLE = dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, pad_token_id=0,
                 bos_token_id=None, eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    feature: str  # what this family adds to the table
    make_config: Callable[[], transformers.PretrainedConfig]
    refused: str | None = None  # a regex the refusal must match; None: packing must be exact


def _small(config_class: str, **overrides) -> Callable[[], transformers.PretrainedConfig]:
    return lambda: getattr(transformers, config_class)(**{**SMALL, **overrides})


FAMILIES = [
    Family("llama", "baseline: RoPE, GQA", _small("LlamaConfig")),
    Family("mistral", "sliding window", _small("MistralConfig", sliding_window=WINDOW)),
    Family("ministral", "sliding window on alternate layers",
           _small("MinistralConfig", head_dim=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    Family("qwen2", "use_sliding_window", _small("Qwen2Config", use_sliding_window=True, sliding_window=WINDOW,
                                                 max_window_layers=0)),
    Family("qwen2_moe", "MoE; window only in the mask", _small(
        "Qwen2MoeConfig", use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
        shared_expert_intermediate_size=32, **MOE)),
    Family("qwen3", "QK-norm", _small("Qwen3Config", head_dim=16)),
    Family("qwen3_moe", "MoE, QK-norm", _small("Qwen3MoeConfig", head_dim=16, **MOE)),
    Family("mixtral", "MoE, sliding window", _small("MixtralConfig", sliding_window=WINDOW, num_local_experts=4,
                                                    num_experts_per_tok=2)),
    Family("olmoe", "MoE", _small("OlmoeConfig", num_experts=4, num_experts_per_tok=2)),
    Family("gemma", "head_dim ≠ hidden/heads", _small("GemmaConfig", head_dim=32)),
    Family("gemma2", "logit soft-capping", _small("Gemma2Config", head_dim=16, sliding_window=WINDOW),
           refused="soft-capping"),
    Family("gemma3_text", "local (sliding) and global layers", _small(
        "Gemma3TextConfig", head_dim=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    Family("cohere2", "sliding layers, NoPE global layers", _small(
        "Cohere2Config", sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    Family("exaone4", "sliding layers", _small("Exaone4Config", sliding_window=WINDOW,
                                                layer_types=["sliding_attention", "full_attention"])),
    Family("starcoder2", "sliding window, biases", _small("Starcoder2Config", sliding_window=WINDOW)),
    Family("phi3", "sliding window, fused qkv", _small("Phi3Config", sliding_window=WINDOW)),
    Family("granite", "multipliers", _small("GraniteConfig")),
    Family("smollm3", "NoPE layers", _small("SmolLM3Config", no_rope_layers=[1, 0])),
    Family("llama4_text", "chunked attention, NoPE layers, MoE", _small(
        "Llama4TextConfig", head_dim=16, attention_chunk_size=WINDOW, num_local_experts=2, num_experts_per_tok=1,
        intermediate_size_mlp=128, no_rope_layers=[1, 0], layer_types=["chunked_attention", "full_attention"])),
    Family("gpt_oss", "attention sinks, sliding layers, MoE", _small(
        "GptOssConfig", head_dim=16, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"])),
    Family("deepseek_v3", "MLA: value head dim ≠ query head dim", _small(
        "DeepseekV3Config", num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        moe_intermediate_size=32, first_k_dense_replace=1)),
    Family("stablelm", "partial rotary (25%)", _small("StableLmConfig")),
    Family("phi", "partial rotary, parallel block", _small("PhiConfig", resid_pdrop=0.0, embd_pdrop=0.0)),
    Family("persimmon", "partial rotary, QK layernorm", _small("PersimmonConfig", num_key_value_heads=4)),
    Family("gpt_neox", "partial rotary, parallel residual", _small("GPTNeoXConfig", num_key_value_heads=4)),
    Family("cohere", "parallel block, interleaved rotary", _small("CohereConfig")),
    Family("olmo2", "QK-norm, post-norm", _small("Olmo2Config")),
    Family("gpt2", "learned absolute positions", lambda: transformers.GPT2Config(**GPT_STYLE, n_inner=128)),
    Family("gpt_bigcode", "learned absolute positions, multi-query", lambda: transformers.GPTBigCodeConfig(
        **GPT_STYLE, n_inner=128, multi_query=True)),
    Family("opt", "learned absolute positions with offset", lambda: transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
        max_position_embeddings=256, word_embed_proj_dim=64, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        dropout=0.0)),
    Family("gptj", "interleaved rotary", lambda: transformers.GPTJConfig(**GPT_STYLE, rotary_dim=8, n_inner=128)),
    Family("codegen", "interleaved rotary, fused qkv", lambda: transformers.CodeGenConfig(
        **GPT_STYLE, rotary_dim=8, n_inner=128)),
    # per-example mixers (demo_core/models/hybrid_mixers.py; every covered hybrid: tests/test_hybrid_packing.py)
    Family("lfm2", "hybrid: short convolutions, run per example", _small(
        "Lfm2Config", layer_types=["conv", "full_attention"])),
    Family("bamba", "hybrid: Mamba-2 layers, run per example", _small(
        "BambaConfig", attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=8, mamba_chunk_size=16)),
    Family("nemotron_h", "hybrid: Mamba-2 layers per-example mixers do not cover", _small(
        "NemotronHConfig", hybrid_override_pattern="M*", mamba_num_heads=8, mamba_head_dim=16, n_groups=1,
        ssm_state_size=8, chunk_size=16, head_dim=16), refused="packed row"),
    Family("falcon", "attention in its own code", lambda: transformers.FalconConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
        pad_token_id=0, bos_token_id=None, eos_token_id=1, new_decoder_architecture=True),
        refused="AttentionInterface"),
]


# ---- measuring one family ------------------------------------------------------------------------------------------

LENGTHS = (13, 6, 10)  # the first two outgrow the 8-token windows and chunks


def _examples(lengths=LENGTHS) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def _layouts(examples) -> dict[str, tuple[dict, Callable]]:
    """Inputs per layout and how to cut each example's logits out of the output, as transformers' padding-free test
    builds them: a left-padded batch whose position_ids count real tokens, and one flattened row with position_ids
    (with and without DataCollatorWithFlattening's flash kwargs)."""
    longest = max(len(ids) for ids in examples)
    input_ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, ids in enumerate(examples):
        input_ids[row, longest - len(ids):] = torch.tensor(ids)
        mask[row, longest - len(ids):] = 1
    padded = {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1) * mask}
    flat = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": ids} for ids in examples])
    flat.pop("labels")
    lengths = [len(ids) for ids in examples]
    return {
        "left-padded": (padded, lambda logits: [logits[row][mask[row].bool()] for row in range(len(examples))]),
        "flatten + flash kwargs": (dict(flat), lambda logits: list(torch.split(logits[0], lengths))),
        "flatten, position_ids only": ({key: flat[key] for key in ("input_ids", "position_ids")},
                                       lambda logits: list(torch.split(logits[0], lengths))),
    }


def _gradients(model, loss) -> dict[str, torch.Tensor]:
    loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return gradients


def measure_family(source, attention: str = "varlen") -> dict:
    """Max |Δlogit| over every layout and max |Δgrad| of the training loss (mean token cross-entropy over the
    batch, as Trainer computes it) between `attention` on the packed row and each example alone on eager, in fp32;
    also whether the same parameters got gradients and whether any gradient reached the weights."""
    examples = _examples()
    reference = source.build("eager", seed=0).eval()
    model = source.build(attention, seed=0).eval()
    with torch.no_grad():
        alone = [reference(input_ids=torch.tensor([ids]), use_cache=False).logits[0] for ids in examples]
        logit_diff = 0.0
        for inputs, cut in _layouts(examples).values():
            packed = cut(model(**inputs, use_cache=False).logits)
            logit_diff = max(logit_diff, *(float((p - a).abs().max()) for p, a in zip(packed, alone)))
    # Each example predicts its own next tokens: len - 1 targets each, one mean over all of them.
    targets = sum(len(ids) - 1 for ids in examples)
    expected_loss = sum(reference(input_ids=torch.tensor([ids]), labels=torch.tensor([ids]), use_cache=False).loss
                        * (len(ids) - 1) / targets for ids in examples)
    expected = _gradients(reference, expected_loss)
    flat = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": ids} for ids in examples])
    actual = _gradients(model, model(**flat, use_cache=False).loss)
    grad_diff = max(float((actual[name] - grad).abs().max()) for name, grad in expected.items())
    return {"logit_diff": logit_diff, "grad_diff": grad_diff, "same_parameters": actual.keys() == expected.keys(),
            "gradient_reaches_weights": any(grad.abs().max() > 0 for grad in expected.values())}
