"""Mixture-of-experts layers: the routed experts' weights a token does not run through.

Model FLOPs (PaLM's 6N per token, :func:`trainfit.speed.predict.model_flops_per_token`) count
the matmul parameters a token's forward and backward use.  In a mixture-of-experts layer a token
runs through the top-k of the E routed experts, so only k/E of those experts' parameters are in
its N — the "active parameters" MoE models are described by (Mixtral-8x7B: 12.9 B of 46.7 B;
DeepSeek-V3: 37 B of 671 B).  Counting all of them made a plan of a small Mixtral print MFU
147 %, a figure above its physical limit.

transformers 5 keeps each layer's routed experts in one module whose class name ends in
``Experts`` (``MixtralExperts``, ``Qwen3MoeExperts``, ``GptOssExperts``: the classes its
``use_experts_implementation`` decorates), every parameter stacked along a first dimension of E;
shared experts are ordinary MLPs (``shared_expert``) that every token runs, so they stay in N.
"""

from __future__ import annotations

from typing import Any

import torch

TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")
"""Config attributes that hold how many routed experts each token runs through."""


def top_k(config: Any) -> int | None:
    for key in TOP_K_KEYS:
        k = getattr(config, key, None)
        if isinstance(k, int) and k > 0:
            return k
    return None


def inactive_expert_params(model: torch.nn.Module, config: Any) -> int:
    """Parameters of the routed experts that one token does not use: (1 − k/E) of each
    experts module's stacked parameters (0 for a dense model)."""
    k = top_k(config)
    if k is None:
        return 0
    inactive = 0
    for module in model.modules():
        if not type(module).__name__.endswith("Experts"):
            continue
        stacked = [p for p in module.parameters(recurse=False) if p.dim() >= 2]
        if not stacked:
            continue
        n_experts = stacked[0].shape[0]
        if n_experts <= k or any(p.shape[0] != n_experts for p in stacked):
            continue  # not a stack of E experts: count it whole (the safe side of MFU)
        inactive += sum(p.numel() for p in stacked) * (n_experts - k) // n_experts
    return inactive


def stacked_expert_params(model: torch.nn.Module,
                          unstacked: frozenset[str] = frozenset()) -> int:
    """Parameters of the ``*Experts`` modules' stacked tensors: what transformers 5's 4-bit
    conversion leaves in 16 bits — ``replace_with_bnb_linear`` converts ``nn.Linear`` layers only.
    ``unstacked``: the expert classes it first turns into ``nn.Linear`` layers, which happens for
    a checkpoint stored 4-bit only (Llama-4's, :func:`trainfit.model.stored_quant
    .patched_expert_classes`); quantized on the fly, Llama-4's experts stay 16-bit too."""
    return sum(p.numel() for m in model.modules() if type(m).__name__.endswith("Experts")
               and type(m).__name__ not in unstacked
               for p in m.parameters(recurse=False) if p.dim() >= 3)


_COUNTS: dict[tuple[str, str, bool], tuple[int, int, int]] = {}
"""(inactive, stacked, stacked even from a checkpoint stored 4-bit) expert parameters already
counted, by (task, the configuration's JSON, stored 4-bit): a plan asks once per row."""


def _counts_of(source: Any) -> tuple[int, int, int]:
    config = source.config
    if top_k(config) is None or source.task == "custom-lm" or \
            not hasattr(config, "to_json_string"):
        return 0, 0, 0
    # a multimodal model (Llama-4) is built from its whole configuration, top-k read from its
    # language model's
    built = getattr(source, "composite", None) or config
    key = (source.task, built.to_json_string(use_diff=False),
           getattr(source, "stored_quant", None) is not None)
    if key not in _COUNTS:
        from trainfit.model.stored_quant import patched_expert_classes, unstacked_when_stored
        from trainfit.model.workload import bare_model_on_meta

        model = bare_model_on_meta(source)
        _COUNTS[key] = 0, 0, 0  # an unbuildable config counts every parameter (as before)
        if model is not None:
            stacked = stacked_expert_params(model, patched_expert_classes(source, "qlora"))
            # what a checkpoint stored 4-bit would leave 16-bit (Llama-4's: none)
            stored = stacked_expert_params(model, unstacked_when_stored())
            _COUNTS[key] = inactive_expert_params(model, config), stacked, stored
    return _COUNTS[key]


def inactive_expert_params_of(source: Any) -> int:
    """:func:`inactive_expert_params` of the source's model, built once on the meta device
    (cached per configuration); 0 for a dense model, the user's own module, or a configuration
    transformers cannot build without its remote code."""
    return _counts_of(source)[0]


def stacked_expert_params_of(source: Any) -> int:
    """:func:`stacked_expert_params` of the source's model (cached as above; 0 likewise)."""
    return _counts_of(source)[1]


def stacked_when_stored_params_of(source: Any) -> int:
    """The stacked expert parameters that stay 16-bit even in a checkpoint stored 4-bit (all of
    them but Llama-4's, which transformers unstacks for it; cached as above)."""
    return _counts_of(source)[2]
