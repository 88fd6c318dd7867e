"""Published ``config.json`` architecture values for the built-in model catalog.

Pure data: every dict holds ``model_type`` plus the architecture fields of the
model's published Hugging Face ``config.json`` (bookkeeping such as token ids,
dropout, dtype or ``transformers_version`` is left out).  Each dict is a valid
``transformers.AutoConfig.for_model(**config)`` argument set.

Treat these dicts as read-only.  ``transformers`` mutates nested dicts in place
(e.g. it writes ``rope_theta`` into ``rope_scaling``), so pass a
``copy.deepcopy`` of a config to it.

Where a value comes from is recorded in ``CatalogModel.source`` (``models.py``).
"""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]

# the Gemma and Qwen families live in gemma_configs.py and qwen_configs.py (this file's size);
# re-exported for models.py
from trainfit.model.catalog.gemma_configs import (  # noqa: E402, F401
    GEMMA_2_2B,
    GEMMA_2_9B,
    GEMMA_2B,
    GEMMA_3_4B,
    GEMMA_7B,
)
from trainfit.model.catalog.qwen_configs import (  # noqa: E402, F401
    QWEN2_5_0_5B,
    QWEN2_5_1_5B,
    QWEN2_5_7B,
    QWEN2_5_14B,
    QWEN2_5_32B,
    QWEN2_5_72B,
    QWEN3_4B,
    QWEN3_8B,
    QWEN3_14B,
    QWEN3_32B,
)

# ---------------------------------------------------------------------------
# Llama family
# ---------------------------------------------------------------------------

_LLAMA3_ROPE_SCALING_32X: Config = {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

LLAMA_3_2_1B: Config = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": dict(_LLAMA3_ROPE_SCALING_32X),
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": True,
}

LLAMA_3_2_3B: Config = {
    **LLAMA_3_2_1B,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_scaling": dict(_LLAMA3_ROPE_SCALING_32X),
}

LLAMA_3_8B: Config = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
}

LLAMA_3_1_8B: Config = {
    **LLAMA_3_8B,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rope_scaling": {**_LLAMA3_ROPE_SCALING_32X, "factor": 8.0},
}

# 70B: the 8B's block at 8192 wide, 80 deep, 64 query heads over 8 key/value heads
LLAMA_3_70B: Config = {
    **LLAMA_3_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}

LLAMA_3_1_70B: Config = {
    **LLAMA_3_70B,
    "max_position_embeddings": 131072,
    "rope_scaling": {**_LLAMA3_ROPE_SCALING_32X, "factor": 8.0},
}

LLAMA_2_7B: Config = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": False,
}

LLAMA_2_13B: Config = {
    **LLAMA_2_7B,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 40,
}

# Llama-2-70B is the first Llama with grouped-query attention (8 key/value heads)
LLAMA_2_70B: Config = {
    **LLAMA_2_7B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}

TINYLLAMA_1_1B: Config = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": False,
}

# ---------------------------------------------------------------------------
# Mistral
# ---------------------------------------------------------------------------

MISTRAL_7B_V0_1: Config = {
    "model_type": "mistral",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
}

# Mistral-Nemo (12B): head_dim 128 set apart from hidden 5120 / 32 heads, 131,072-token vocabulary
MISTRAL_NEMO_12B: Config = {**MISTRAL_7B_V0_1, "vocab_size": 131072, "hidden_size": 5120,
                            "num_hidden_layers": 40, "head_dim": 128,
                            "max_position_embeddings": 1024000, "rope_theta": 1000000.0,
                            "sliding_window": None}

MISTRAL_7B_V0_2: Config = {
    **MISTRAL_7B_V0_1,
    "rope_theta": 1000000.0,
    "sliding_window": None,
}

# ---------------------------------------------------------------------------
# Phi
# ---------------------------------------------------------------------------

PHI_2: Config = {
    "model_type": "phi",
    "vocab_size": 51200,
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "hidden_act": "gelu_new",
    "max_position_embeddings": 2048,
    "layer_norm_eps": 1e-05,
    "partial_rotary_factor": 0.4,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "qk_layernorm": False,
    "tie_word_embeddings": False,
}

PHI_3_MINI_4K: Config = {
    "model_type": "phi3",
    "vocab_size": 32064,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
}

# Phi-4 (14B): Phi-3's block, 100,352-token vocabulary, full attention (no sliding window)
PHI_4: Config = {**PHI_3_MINI_4K, "vocab_size": 100352, "hidden_size": 5120,
                 "intermediate_size": 17920, "num_hidden_layers": 40, "num_attention_heads": 40,
                 "num_key_value_heads": 10, "max_position_embeddings": 16384,
                 "original_max_position_embeddings": 16384, "rope_theta": 250000.0,
                 "sliding_window": None}

# ---------------------------------------------------------------------------
# Falcon / GPT-NeoX (StableLM alpha)
# ---------------------------------------------------------------------------

FALCON_7B: Config = {
    "model_type": "falcon",
    "vocab_size": 65024,
    "hidden_size": 4544,
    "num_hidden_layers": 32,
    "num_attention_heads": 71,
    "multi_query": True,
    "new_decoder_architecture": False,
    "parallel_attn": True,
    "bias": False,
    "alibi": False,
    "layer_norm_epsilon": 1e-05,
    "tie_word_embeddings": True,
}

STABLELM_BASE_ALPHA_3B: Config = {
    "model_type": "gpt_neox",
    "vocab_size": 50688,
    "hidden_size": 4096,
    "intermediate_size": 16384,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "hidden_act": "gelu",
    "max_position_embeddings": 4096,
    "layer_norm_eps": 1e-05,
    "rotary_pct": 0.25,
    "rotary_emb_base": 10000,
    "use_parallel_residual": True,
    "tie_word_embeddings": False,
}

# ---------------------------------------------------------------------------
# GPT-2
# ---------------------------------------------------------------------------

GPT2: Config = {
    "model_type": "gpt2",
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-05,
    "tie_word_embeddings": True,
}

DISTILGPT2: Config = {**GPT2, "n_layer": 6}

GPT2_MEDIUM: Config = {**GPT2, "n_embd": 1024, "n_layer": 24, "n_head": 16}
GPT2_LARGE: Config = {**GPT2, "n_embd": 1280, "n_layer": 36, "n_head": 20}
GPT2_XL: Config = {**GPT2, "n_embd": 1600, "n_layer": 48, "n_head": 25}

# ---------------------------------------------------------------------------
# Encoder-only / encoder-decoder
# ---------------------------------------------------------------------------

BERT_LARGE_UNCASED: Config = {
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "hidden_act": "gelu",
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "position_embedding_type": "absolute",
    "pad_token_id": 0,
}

# ChatLM-mini-Chinese builds ``T5Config()`` and overrides d_ff, d_kv, d_model,
# num_heads, num_layers, num_decoder_layers and vocab_size; everything else is
# the T5Config default (relu FFN, tied embeddings, 32/128 relative buckets).
CHATLM_MINI_CHINESE: Config = {
    "model_type": "t5",
    "vocab_size": 29298,
    "d_model": 768,
    "d_kv": 64,
    "d_ff": 3072,
    "num_layers": 10,
    "num_decoder_layers": 10,
    "num_heads": 12,
    "feed_forward_proj": "relu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "layer_norm_epsilon": 1e-06,
    "is_encoder_decoder": True,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}

T5_SMALL: Config = {
    "model_type": "t5",
    "vocab_size": 32128,
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_layers": 6,
    "num_decoder_layers": 6,
    "num_heads": 8,
    "feed_forward_proj": "relu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "layer_norm_epsilon": 1e-06,
    "is_encoder_decoder": True,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}

# Not a published model: a Llama-architecture config sized for real runs on a laptop CPU
# (tune/train tests and benchmarks), with Llama-2's vocabulary.
LLAMA_TINY_58M: Config = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}

# ---------------------------------------------------------------------------
# Granite 4.0 hybrid (Mamba2 + NoPE GQA attention), dense (no routed experts)
# ---------------------------------------------------------------------------

_GRANITE_H_1B_LAYER_TYPES: list[str] = (
    ["mamba"] * 5
    + ["attention"]
    + ["mamba"] * 9
    + ["attention"]
    + ["mamba"] * 9
    + ["attention"]
    + ["mamba"] * 9
    + ["attention"]
    + ["mamba"] * 4
)

GRANITE_4_0_H_1B: Config = {
    "model_type": "granitemoehybrid",
    "vocab_size": 100352,
    "hidden_size": 1536,
    "intermediate_size": 4096,
    "shared_intermediate_size": 4096,
    "num_hidden_layers": 40,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "num_local_experts": 0,
    "num_experts_per_tok": 0,
    "layer_types": _GRANITE_H_1B_LAYER_TYPES,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "position_embedding_type": "nope",
    "rms_norm_eps": 1e-05,
    "attention_bias": False,
    "attention_multiplier": 0.0078125,
    "embedding_multiplier": 12,
    "logits_scaling": 6,
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "tie_word_embeddings": True,
}
