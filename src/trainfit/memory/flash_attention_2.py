"""transformers' ``flash_attention_2`` (``--attention flash-attention-2``) as the simulated
step runs it: a model built with sdpa, whose attention calls go through transformers' attention
interface (:func:`interface_as_flash_attention_2`) or straight to SDPA
(:class:`trainfit.memory.semantics._DeviceOps`), answered as flash-attn answers them — 16-bit
q, k and v, the grouped heads as they are, no T×T mask, a padded batch unpadded
(:mod:`trainfit.memory.flash_varlen`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainfit.job import JobError
from trainfit.memory.flash_varlen import unpadded_attention
from trainfit.memory.sdpa_choice import AttentionTarget


def flash_attention_2_inputs(module: Any, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """fp32 q, k and v as transformers hands them to FlashAttention-2, which takes 16-bit ones:
    cast to ``get_target_dtype``'s dtype (integrations/flash_attention.py: the autocast dtype,
    a quantized model's ``config.dtype``, else the first Linear's weight dtype) by
    ``fa_peft_integration_check`` — copies the kernel keeps for its backward in place of the fp32
    ones. fp32 reaches it under QLoRA after peft's prepare_model_for_kbit_training (fp32 norms
    upcast the hidden states; bitsandbytes' 4-bit layers return their input's dtype): under
    autocast cast to its dtype, without it to the quantized model's ``config.dtype`` — there
    SDPA was simulated with fp32 inputs, its math kernel's T×T probabilities kept (2× the tiny
    case's activations, a review)."""
    from transformers.integrations.flash_attention import get_target_dtype

    dt = get_target_dtype(query, module)
    if dt not in (torch.float16, torch.bfloat16):
        raise JobError("--attention flash-attention-2: transformers would hand FlashAttention-2 "
                       f"q, k and v in {dt} (no autocast, and {dt} weights), which flash-attn "
                       "refuses: it takes fp16 and bf16 only",
                       "use --precision amp-bf16, or --attention sdpa")
    return tuple(t.to(dt) for t in (query, key, value))


def unpads(target: AttentionTarget, q: Any, k: Any, mask: Any, padding: bool) -> bool:
    """A flash_attention_2 call transformers unpads (:mod:`trainfit.memory.flash_varlen`): a
    boolean mask that is the batch's padding (``padding``: not a seq2seq decoder's own causal
    mask of ones, which transformers hands flash attention as None), on the GPU, with the
    batch's rows known (:attr:`AttentionTarget.padded_rows`) and q and k as long as the batch
    (:attr:`AttentionTarget.padded_length`: a longer q, e.g. one with tokens of its own, is not
    the batch's rows)."""
    rows = target.padded_rows
    return bool(padding and rows and target.device == "cuda" and mask is not None
                and mask.dtype == torch.bool and q.dim() == k.dim() == 4
                and len(rows) == q.shape[0]
                and q.shape[-2] == k.shape[-2] == target.padded_length >= max(rows))


def interface_as_flash_attention_2(sdpa_forward: Any, target: AttentionTarget,
                                   count: Callable[[], None]) -> Any:
    """transformers' sdpa attention function as its ``flash_attention_2`` runs the same call:
    no boolean mask (FlashAttention-2 takes causality and sliding windows as arguments and
    unpads padding), so the function passes ``enable_gqa`` where it would have repeated k and v
    to the query heads with a mask present (``use_gqa_in_sdpa``: copies FlashAttention-2 never
    makes, (n_heads / n_kv − 1) × k and v a layer: a review), and takes causality from the
    module (``is_causal``: an encoder's self-attention and cross-attention are not causal). A
    float mask or position bias stays (models transformers refuses flash_attention_2 for).
    Gemma-2's ``softcap`` goes too: FlashAttention-2 applies it to the scores inside its kernel
    (no tensor of its own), where transformers' sdpa function refuses it. A padded batch is
    unpadded, attended and padded back as transformers does it (:func:`unpads`,
    :mod:`trainfit.memory.flash_varlen`)."""
    def call(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
             *args: Any, **kwargs: Any) -> Any:
        if query.dtype == torch.float32:
            query, key, value = flash_attention_2_inputs(module, query, key, value)
        kwargs.pop("softcap", None)
        causal_self = bool(getattr(module, "is_causal", False))
        # a seq2seq decoder's self-attention mask is its own (ones, skipped) unless the batch
        # gives a decoder mask; everywhere else a boolean mask is the batch's padding
        padding = target.decoder_only or target.batch_mask_causal or not causal_self
        if unpads(target, query, key, attention_mask, padding):
            given = dict(zip(("dropout", "scaling", "is_causal"), args, strict=False))
            given.update({k: kwargs[k] for k in ("dropout", "scaling", "is_causal")
                          if k in kwargs})
            causal = given.get("is_causal")
            causal = getattr(module, "is_causal", True) if causal is None else causal
            count()
            return unpadded_attention(query, key, value, target.padded_rows,
                                      float(given.get("dropout") or 0.0),
                                      bool(causal) and query.shape[-2] > 1,
                                      given.get("scaling")), None
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = None
        return sdpa_forward(module, query, key, value, attention_mask, *args, **kwargs)

    return call
