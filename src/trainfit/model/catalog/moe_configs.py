"""Published ``config.json`` architecture values of the mixture-of-experts catalog models.

Pure data, as ``model_configs.py`` (read-only dicts; pass a ``copy.deepcopy`` to transformers);
where each value comes from is in ``CatalogModel.source`` (``models.py``).  transformers 5 keeps
each layer's routed experts as stacked tensors (``MixtralExperts``, ``Qwen3MoeExperts``): see
:mod:`trainfit.model.experts` for what that means for FLOPs and for 4-bit QLoRA.
"""

from __future__ import annotations

from typing import Any

from trainfit.model.catalog.model_configs import MISTRAL_7B_V0_1
from trainfit.model.catalog.qwen_configs import QWEN3_8B

Config = dict[str, Any]

# Mistral-7B's attention and width, 8 experts of width 14336 (2 routed per token), RoPE θ 1e6,
# no sliding window
MIXTRAL_8X7B: Config = {**MISTRAL_7B_V0_1, "model_type": "mixtral", "rope_theta": 1000000.0,
                        "sliding_window": None, "num_local_experts": 8, "num_experts_per_tok": 2,
                        "router_aux_loss_coef": 0.02}

# 128 experts of width 768, 8 routed per token; every layer sparse (decoder_sparse_step 1)
QWEN3_30B_A3B: Config = {**QWEN3_8B, "model_type": "qwen3_moe", "hidden_size": 2048,
                         "intermediate_size": 6144, "moe_intermediate_size": 768,
                         "num_hidden_layers": 48, "num_attention_heads": 32,
                         "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
                         "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                         "router_aux_loss_coef": 0.001}
