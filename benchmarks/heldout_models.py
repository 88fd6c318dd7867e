"""Held-out cases' models and GPUs built for trainfit from a :class:`heldout_builder.Mapping`.

A model the catalog lacks is a transformers config of the case's dimensions (built on the meta
device by trainfit: no weights, no download); the case's dimensions win where a catalog entry
differs; a card the catalog lacks is a catalog entry with the fields the case states replaced.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heldout_builder import Mapping


DIMS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")


def build_source(mapping: Mapping) -> tuple[Any, list[str]]:
    """The ModelSource for a mapping (needs transformers), and notes on what was adjusted."""
    from transformers import AutoConfig

    from trainfit.model.source import ModelSource, resolve_model

    spec, notes = mapping.model, []
    if spec["kind"] == "catalog":
        source = resolve_model(spec["name"])
        source.config = copy.deepcopy(source.config)
        for key in DIMS:  # the case's dimensions win where the catalog differs
            have, want = getattr(source.config, key, None), spec["dims"].get(key)
            if have is not None and want is not None and have != want and not (
                    key == "tie_word_embeddings" and spec["untie"]):
                setattr(source.config, key, want)
                notes.append(f"{key} {have} → {want} (the case's model)")
    else:
        cfg = AutoConfig.for_model(**copy.deepcopy(spec["config"]))
        task = "seq2seq-lm" if getattr(cfg, "is_encoder_decoder", False) else "causal-lm"
        source = ModelSource(spec["dims"]["name"], cfg, task, "local")
    if spec["untie"]:
        source.config.tie_word_embeddings = False
    if spec["litgpt"]:
        # litgpt's GPT has no dropout layers and uses the tanh GELU (as calibration.py)
        for key, value in source.config.to_dict().items():
            if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
                setattr(source.config, key, 0.0)
        if getattr(source.config, "hidden_act", None) == "gelu_new":
            source.config.hidden_act = "gelu_pytorch_tanh"
    return source, notes


def build_gpu(mapping: Mapping) -> Any:
    from trainfit.hardware.gpus import find_gpu

    gpu = find_gpu(mapping.gpu)
    return dataclasses.replace(gpu, **mapping.gpu_overrides) if mapping.gpu_overrides else gpu
