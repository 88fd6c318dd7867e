"""A multimodal model's towers: weights a text batch holds but does not run.

``AutoModelForCausalLM`` builds Gemma-3 4B+ as ``Gemma3ForConditionalGeneration``: the language
model beside a SigLIP vision tower and its projector (:func:`trainfit.model.source.
split_multimodal`).  Fine-tuned on text, the forward never calls the tower (its ``pixel_values``
are None), so its parameters are held in memory — the simulation builds and holds them — but a
token runs through none of them: they are not in model FLOPs (PaLM's 6N,
:func:`trainfit.speed.predict.model_flops_per_token`), or MFU would count work nobody did.

What runs is the language model (transformers' ``get_decoder()``) and the output head; every
other parameter is a tower's (or its projector's).
"""

from __future__ import annotations

import copy

import torch

from trainfit.model.source import ModelSource


def tower_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters of ``model`` outside its language model and output head, each once (none for
    a language model, whose ``get_decoder()`` holds its whole stack).  Through the wrappers a
    job adds: peft's ``PeftModel`` and trainfit's chunked head."""
    from trainfit.model.chunked_head import ChunkedHeadLM

    base = model.model if isinstance(model, ChunkedHeadLM) else model
    unwrap = getattr(base, "get_base_model", None)
    base = unwrap() if callable(unwrap) else base
    get_decoder = getattr(base, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if decoder is None or decoder is base:
        return []
    run = {id(p) for p in decoder.parameters()}
    getter = getattr(base, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if head is not None:
        run |= {id(p) for p in head.parameters()}
    out: dict[int, torch.nn.Parameter] = {}
    for p in base.parameters():
        if id(p) not in run:
            out.setdefault(id(p), p)
    return list(out.values())


def tower_params(model: torch.nn.Module) -> int:
    """How many parameters :func:`tower_parameters` holds (0 for a language model)."""
    return sum(p.numel() for p in tower_parameters(model))


def _builds_composite(source: ModelSource) -> bool:
    """Whether ``AutoModelForCausalLM`` builds the whole multimodal model (Gemma-3 4B+), not its
    language model alone (Llama-4, Qwen3.5)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(source.composite, "model_type", ""))
    cls = getattr(transformers, name, None) if name else None
    config_class = getattr(cls, "config_class", None)
    return cls is not None and not (isinstance(config_class, type)
                                    and isinstance(source.config, config_class))


_COUNTS: dict[tuple[str, str], int] = {}
"""Tower parameters by (task, the multimodal configuration's JSON): a plan asks once per row."""


def tower_params_of(source: ModelSource) -> int:
    """:func:`tower_params` of the source's model, built once on the meta device (cached per
    configuration); 0 for a language model or one transformers cannot build."""
    if source.composite is None or source.task != "causal-lm" or not _builds_composite(source):
        return 0
    key = (source.task, source.composite.to_json_string(use_diff=False))
    if key not in _COUNTS:
        from trainfit.model.workload import auto_model_class

        cfg = copy.deepcopy(source.composite)
        try:
            with torch.device("meta"):
                _COUNTS[key] = tower_params(auto_model_class(source.task).from_config(cfg))
        except Exception:  # an unbuildable config: the simulation reports it; count nothing
            _COUNTS[key] = 0
    return _COUNTS[key]
