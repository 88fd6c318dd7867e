"""The tensors ``from_pretrained(dtype=...)`` keeps in fp32, which ``from_config(dtype=...)``
(how trainfit builds a model on ``meta``) does not.

transformers 5 loads a checkpoint with a *dtype plan* (``PreTrainedModel._get_dtype_plan``):
``_keep_in_fp32_modules`` stay fp32 when the model loads in fp16 (T5's feed-forward output
``wo``: huggingface/transformers#20287), ``_keep_in_fp32_modules_strict`` in fp16 and bf16
(DeepSeek-V3's ``e_score_correction_bias``, gpt-oss' ``sinks``, MoE router weights). Its loader
matches each checkpoint key with ``re.search`` against the plan's names
(``core_model_loading.build_glob_alternation``), so the same search over the built model's
parameters and buffers picks the same tensors. A review: T5's ``wo`` was planned in fp16,
2 bytes a weight under what the user's run holds, and its input activations with it (T5 casts
the hidden state to ``wo.weight.dtype``).
"""

from __future__ import annotations

from typing import Any

import torch


def kept_fp32_names(model: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """The floating parameters and buffers transformers' loader keeps in fp32 when ``model``
    loads in ``dtype`` (whatever their dtype now), by every name they have. Uses the library's
    own plan and matcher."""
    plan_of = getattr(model, "_get_dtype_plan", None)
    if plan_of is None or dtype not in (torch.float16, torch.bfloat16):
        return []
    plan = plan_of(dtype)
    if not plan:
        return []
    from transformers.core_model_loading import build_glob_alternation

    pattern, _, _ = build_glob_alternation(list(plan))
    tensors = [*model.named_parameters(remove_duplicate=False),
               *model.named_buffers(remove_duplicate=False)]
    return [name for name, t in tensors
            if t is not None and t.is_floating_point() and pattern.search(name)]


def keep_fp32_as_loaded(model: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """Cast to fp32 what transformers' loader keeps in fp32 for a model loaded in ``dtype``;
    returns the names of the trainable parameters among them. A tied parameter (a head that is
    the embedding) is cast only if each of its names is kept, as one tensor: the loader re-ties
    the head to the embedding after loading (a review: hy_v4's tied head, on its strict list,
    would have been untied)."""
    names = set(kept_fp32_names(model, dtype))
    aliases: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), set()).add(name)
    cast: dict[int, torch.Tensor] = {}
    trainable = []
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for store in (mod._parameters, mod._buffers):
            for key, t in list(store.items()):
                name = f"{mod_name}.{key}" if mod_name else key
                if name not in names or t is None or t.dtype == torch.float32 or \
                        not aliases.get(id(t), {name}) <= names:
                    continue
                if id(t) not in cast:
                    if isinstance(t, torch.nn.Parameter):
                        cast[id(t)] = torch.nn.Parameter(t.data.to(torch.float32),
                                                         requires_grad=t.requires_grad)
                        if t.requires_grad:
                            trainable.append(name)
                    else:
                        cast[id(t)] = t.to(torch.float32)
                store[key] = cast[id(t)]
    return trainable


def fsdp_full_fine_tuning(job: Any) -> bool:
    """Every weight trains under FSDP over ranks: FSDP2's fully_shard then needs one dtype for a
    layer's weights, so an fp32 one the loader keeps cannot run beside bf16 ones (the build
    refuses it, plan.inputs.fsdp_keeps_fp32_weights leaves bf16-true out of the grid)."""
    return job.sharding == "fsdp" and job.ranks > 1 and job.method == "full"
