"""Published ``config.json`` architecture values of the Gemma, Gemma-2 and Gemma-3 catalog models.

Pure data, as ``model_configs.py`` (read-only dicts; pass a ``copy.deepcopy`` to transformers);
where each value comes from is in ``CatalogModel.source`` (``models.py``).
"""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]

# ---------------------------------------------------------------------------
# Gemma
# ---------------------------------------------------------------------------

# Published gemma(-1) configs say ``"hidden_act": "gelu"``, a legacy value that
# transformers maps to the tanh approximation; the later published revision adds
# ``"hidden_activation": "gelu_pytorch_tanh"``, which is what is used here.
GEMMA_2B: Config = {
    "model_type": "gemma",
    "vocab_size": 256000,
    "hidden_size": 2048,
    "intermediate_size": 16384,
    "num_hidden_layers": 18,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": True,
}

GEMMA_7B: Config = {
    **GEMMA_2B,
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
}

GEMMA_2_2B: Config = {
    "model_type": "gemma2",
    "vocab_size": 256000,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "query_pre_attn_scalar": 256,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "attention_bias": False,
    "tie_word_embeddings": True,
}

GEMMA_2_9B: Config = {
    **GEMMA_2_2B,
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
}

# Gemma-3 4B: google/gemma-3-4b-it's config.json as published (multimodal: the language model in
# text_config, its heads, vocabulary and head_dim left to Gemma3TextConfig's defaults — 8 heads,
# 4 key/value heads, 262,208 tokens, 256 — beside a SigLIP vision tower).  AutoModelForCausalLM
# builds Gemma3ForConditionalGeneration from it: 4.30 B parameters, as its model card says.
GEMMA_3_4B: Config = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
