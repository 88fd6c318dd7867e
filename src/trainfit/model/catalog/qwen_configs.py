"""Published ``config.json`` architecture values of the Qwen2.5 and Qwen3 catalog models.

Pure data, as ``model_configs.py`` (read-only dicts; pass a ``copy.deepcopy`` to transformers);
where each value comes from is in ``CatalogModel.source`` (``models.py``).
"""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]

# ---------------------------------------------------------------------------
# Qwen2.5
# ---------------------------------------------------------------------------

QWEN2_5_0_5B: Config = {
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
}

QWEN2_5_1_5B: Config = {
    **QWEN2_5_0_5B,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
}

QWEN2_5_7B: Config = {
    **QWEN2_5_0_5B,
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}

# 14B / 32B / 72B: rms_norm_eps 1e-05 (the 7B and smaller: 1e-06); no tied head
QWEN2_5_14B: Config = {
    **QWEN2_5_7B,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
}

QWEN2_5_32B: Config = {
    **QWEN2_5_14B,
    "intermediate_size": 27648,
    "num_hidden_layers": 64,
}

QWEN2_5_72B: Config = {
    **QWEN2_5_14B,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}

# ---------------------------------------------------------------------------
# Qwen3: per-head RMSNorm on queries and keys (q_norm / k_norm), no q/k/v bias, head_dim 128
# set apart from hidden_size / heads
# ---------------------------------------------------------------------------

QWEN3_8B: Config = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "tie_word_embeddings": False,
}

QWEN3_4B: Config = {
    **QWEN3_8B,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "tie_word_embeddings": True,
}

QWEN3_14B: Config = {
    **QWEN3_8B,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
}

QWEN3_32B: Config = {
    **QWEN3_8B,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
}
