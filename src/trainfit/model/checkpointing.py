"""Selective activation checkpointing: torchtitan's op-level policy, applied through the same
``torch.utils.checkpoint`` call transformers uses for full checkpointing.

Full checkpointing keeps only each block's input and recomputes the whole block in the backward
(~1/3 more compute).  torchtitan's ``selective`` "op" mode
(``torchtitan/distributed/activation_checkpoint.py``, classic policy) keeps the outputs of the
expensive ops — attention and every other matmul (``aten.mm``), the max of a softmax-like
reduction — and recomputes the cheap elementwise ones: most of the memory saving for a fraction
of the recomputation.  Being a dispatch-level policy (``create_selective_checkpoint_contexts``),
it runs unchanged on the fake tensors of a plan and on the real ones of a run.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten.max.default,
}
"""torchtitan's ``_save_list`` (its reduce-scatter entry concerns async tensor parallelism), plus
the CPU flash kernel this machine's runs use in the GPU kernel's place."""

SAVE_OP_NAMES = frozenset({
    "flash_attn::_flash_attn_forward",
    "flash_attn::_flash_attn_varlen_forward",
    "trainfit::flash_varlen_attention",
})
"""Attention ops outside aten saved alike, by name (their libraries need not be importable):
flash-attn's own ops (custom ops on torch ≥ 2.4: flash_attn_interface.py, v2.8.2 L56-73),
which transformers' ``flash_attention_2`` runs — torchtitan's list, written for SDPA, would
recompute them — and the simulation's stand-in for the variable-length one
(memory/flash_varlen.py)."""


def _policy(meta: dict[str, int]) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        # "saves output of all compute ops, except every second mm"
        save = (func in SAVE_OPS or func.name() in SAVE_OP_NAMES) \
            and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def selective_context_fn() -> Any:
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint``: one fresh policy (and mm
    counter) per checkpointed region, as torchtitan builds it."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy(defaultdict(int)))


def checkpoint_kwargs(grad_ckpt: str, reentrant: bool = False) -> dict[str, Any]:
    """``gradient_checkpointing_kwargs`` for transformers' ``gradient_checkpointing_enable``
    (``reentrant``: the job's ``ckpt_reentrant``; the reentrant mode needs the block's input to
    require grad, which transformers arranges for ``input_ids`` models and PEFT models)."""
    kw: dict[str, Any] = {"use_reentrant": reentrant}
    if grad_ckpt == "selective":
        kw["context_fn"] = selective_context_fn
    return kw


_JOBS = object()


def enable_checkpointing(model: Any, grad_ckpt: str, reentrant: bool = False,
                         kwargs: Any = _JOBS) -> None:
    """Turn on transformers' checkpointing of each decoder layer: ``activation_checkpointing_enable``
    where transformers has it (5.23 renamed the method: ``gradient_checkpointing_enable`` now warns
    that v6 removes it), else the old name, with the same keyword arguments (``kwargs``: given
    as they are — a script's own TrainingArguments', None for transformers' default — else the
    job's)."""
    kw = checkpoint_kwargs(grad_ckpt, reentrant) if kwargs is _JOBS else kwargs
    new = getattr(model, "activation_checkpointing_enable", None)
    if callable(new):
        new(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def disable_checkpointing(model: Any) -> None:
    """``activation_checkpointing_disable`` where transformers has it, else the old name."""
    new = getattr(model, "activation_checkpointing_disable", None)
    (new if callable(new) else model.gradient_checkpointing_disable)()
