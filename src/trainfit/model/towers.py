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

from trainfit.model.experts import inactive_expert_params_of
from trainfit.model.source import (
    ModelSource,
    builds_language_model_alone,
    causal_lm_class,
    is_multimodal,
)


def tower_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters of ``model`` outside its language model and output head, each once (none for
    a language model, whose ``get_decoder()`` holds its whole stack).  Through the wrappers a
    job adds: peft's ``PeftModel`` and trainfit's chunked head."""
    from trainfit.model.chunked_head import ChunkedHeadLM

    base = model.model if isinstance(model, ChunkedHeadLM) else model
    unwrap = getattr(base, "get_base_model", None)
    base = unwrap() if callable(unwrap) else base
    skipped = _text_step_skipped(base)
    if not is_multimodal(getattr(base, "config", None)):
        # a language model's own parameters all run: T5's encoder is outside get_decoder(), a
        # classifier's head outside get_output_embeddings(), and both take part in the loss
        return skipped
    get_decoder = getattr(base, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if decoder is None or decoder is base:
        return skipped
    run = {id(p) for p in decoder.parameters()} - {id(p) for p in skipped}
    getter = getattr(base, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if head is not None:
        run |= {id(p) for p in head.parameters()}
    out: dict[int, torch.nn.Parameter] = {}
    for p in base.parameters():
        if id(p) not in run:
            out.setdefault(id(p), p)
    return list(out.values())


TEXT_SKIPPED_LAYERS = ("MllamaCrossAttentionDecoderLayer",)
"""Decoder layers a text-only step skips whole: Llama-3.2-Vision's cross-attention layers
(``MllamaTextModel.forward``: ``continue`` when there are no cross-attention states) — an audit
found their 26 % of the parameters given optimizer states a text step never makes."""


def _text_step_skipped(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of :data:`TEXT_SKIPPED_LAYERS` in ``model``, each once."""
    out: dict[int, torch.nn.Parameter] = {}
    for m in model.modules():
        if type(m).__name__ in TEXT_SKIPPED_LAYERS:
            for p in m.parameters():
                out.setdefault(id(p), p)
    return list(out.values())


def tower_params(model: torch.nn.Module) -> int:
    """The tower's matmul weights among :func:`tower_parameters` (0 for a language model): what
    MFU's N counts of the model and the tower takes no part in — as N
    (:func:`trainfit.model.workload.matmul_params`), no lookup table, norm or bias."""
    from trainfit.model.workload import matmul_params

    tower = tower_parameters(model)
    return matmul_params(model, only={id(p) for p in tower}) if tower else 0


def holds_towers(source: ModelSource) -> bool:
    """Whether the model built for ``source`` holds a tower beside its language model: a
    multimodal configuration that ``AutoModelForCausalLM`` builds whole (Gemma-3 4B+), not its
    language model alone (Llama-4, Qwen3.5) — or layers a text step skips
    (:data:`TEXT_SKIPPED_LAYERS`: Llama-3.2-Vision's cross-attention layers)."""
    if source.task == "causal-lm" and getattr(source.config, "cross_attention_layers", None):
        return True
    if source.composite is None or source.task != "causal-lm":
        return False
    cls = causal_lm_class(source.composite)
    return cls is not None and not builds_language_model_alone(cls, source.config)


def unused_parameter_note(source: ModelSource, ranks: int, sharding: str) -> str:
    """DDP over a model whose tower holds trainable parameters that get no gradient (full
    fine-tuning, or LoRA adapters peft put on the tower's q_proj/v_proj): its reducer raises
    "Expected to have finished reduction in the prior iteration" unless it looks for unused
    parameters; "" where that cannot happen."""
    if ranks < 2 or sharding != "none" or not holds_towers(source):
        return ""
    what = ("the cross-attention layers' trainable parameters (Llama-3.2-Vision: a text step "
            "skips those layers whole)" if getattr(source.config, "cross_attention_layers", None)
            else "the tower's trainable parameters")
    return (f"DDP: {what} (weights under full fine-tuning, LoRA "
            "adapters peft matched in them) get no gradient from text batches, and DDP stops with "
            "'Expected to have finished reduction in the prior iteration' unless "
            "find_unused_parameters=True (TrainingArguments(ddp_find_unused_parameters=True); "
            "the HF Trainer turns it off under gradient checkpointing) or they are frozen "
            "(requires_grad_(False)); its gradient buckets are counted for every trainable "
            "parameter, as DDP allocates them")


_COUNTS: dict[tuple[str, str], int] = {}
"""Tower parameters by (task, the multimodal configuration's JSON): a plan asks once per row."""


def tower_params_of(source: ModelSource) -> int:
    """:func:`tower_params` of the source's model, built once on the meta device (cached per
    configuration); 0 for a language model or one transformers cannot build."""
    if not holds_towers(source):
        return 0
    # the whole configuration where there is one (Llama-3.2-Vision's text config alone has no
    # causal-LM class: AutoModelForCausalLM builds its language model from the whole one)
    whole = source.composite if source.composite is not None else source.config
    key = (source.task, whole.to_json_string(use_diff=False))
    if key not in _COUNTS:
        from trainfit.model.attention_impl import auto_model_class

        cfg = copy.deepcopy(whole)
        try:
            with torch.device("meta"):
                _COUNTS[key] = tower_params(auto_model_class(source.task).from_config(cfg))
        except Exception:  # an unbuildable config: the simulation reports it; count nothing
            _COUNTS[key] = 0
    return _COUNTS[key]


def inactive_params_of(source: ModelSource) -> int:
    """Parameters a token does not run through, left out of model FLOPs: the routed experts it
    skips (:func:`trainfit.model.experts.inactive_expert_params_of`) and a multimodal model's
    towers (:func:`tower_params_of`)."""
    return inactive_expert_params_of(source) + tower_params_of(source)
