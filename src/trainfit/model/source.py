"""Resolve ``--model`` (catalog name, local dir, config.json, HF id) to a transformers config."""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.job import JobError
from trainfit.model.config_file import (
    ARCH_FIELDS,
    SIZE_FIELDS,
    check_config_fields,
    config_from_dict,
    overridden_note,
)

TASKS = ("causal-lm", "seq2seq-lm", "sequence-classification", "custom-lm")


@dataclass
class ModelSource:
    name: str
    """What the user asked for."""
    config: Any
    """A ``transformers.PretrainedConfig``."""
    task: str
    """causal-lm, seq2seq-lm or sequence-classification."""
    origin: str
    """catalog / local / hub / custom (``module:factory``)."""
    note: str = ""
    composite: Any = None
    """The whole multimodal configuration the model is built from when ``config`` is its language
    model's (``text_config``, which every size is read from); None for a language model's own
    configuration.  What ``AutoModelForCausalLM`` builds from it is what is planned and run:
    Gemma-3 4B+ the language model beside its vision tower (held, not run on text batches),
    Llama-4 and Qwen3.5 the language model alone (:func:`split_multimodal`)."""
    stored_quant: Any = None
    """A :class:`trainfit.model.stored_quant.StoredQuant` when the checkpoint is published 4-bit
    (bitsandbytes ``quantization_config``): ``from_pretrained`` loads it so, LoRA on it is QLoRA;
    None otherwise."""


def build_config(source: ModelSource) -> Any:
    """The configuration the model is built from (``from_config``): the multimodal one when
    there is one, else ``source.config``."""
    return source.composite if source.composite is not None else source.config


def no_cache(cfg: Any) -> None:
    """``use_cache = False`` on a configuration and on its language model's (a multimodal
    model's language model reads its own ``text_config``)."""
    cfg.use_cache = False
    text = getattr(cfg, "text_config", None)
    if text is not None and hasattr(text, "use_cache"):
        text.use_cache = False


LAYER_ATTRS = ("num_hidden_layers", "n_layer", "num_layers")
"""The config fields that give a model's depth (transformers' usual name, GPT-2's, T5's)."""


def layer_count(source: ModelSource) -> tuple[str | None, int]:
    """(the config field holding the depth, the depth); (None, 0) when no field gives it."""
    cfg = source.config
    for attr in LAYER_ATTRS:
        n = getattr(cfg, attr, None)
        if isinstance(n, int) and n > 0:
            return attr, n
    return None, 0


def hidden_size(source: ModelSource) -> int:
    """The model's width (transformers' ``hidden_size``, T5's ``d_model``, GPT-2's ``n_embd``,
    Llama-reference ``dim``); 0 when no field gives it."""
    cfg = source.config
    return next((v for a in ("hidden_size", "d_model", "n_embd", "dim")
                 if isinstance(v := getattr(cfg, a, None), int) and v > 0), 0)


def _task_for(config: Any) -> str:
    archs = getattr(config, "architectures", None) or []
    if any("SequenceClassification" in a for a in archs):
        return "sequence-classification"
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq-lm"
    return "causal-lm"


def _check_fields(config: Any, where: str) -> None:
    hidden = getattr(config, "hidden_size", None) or getattr(config, "d_model", None) \
        or getattr(config, "n_embd", None)
    vocab = getattr(config, "vocab_size", None)
    if not hidden or not vocab:
        missing = "hidden_size" if not hidden else "vocab_size"
        raise JobError(f"{where}: config has no {missing}",
                       "a transformers config.json with model_type and the architecture sizes "
                       "is needed")


def _towers(cfg: Any) -> list[tuple[str, Any]]:
    return [(k, getattr(cfg, k)) for k in ("vision_config", "audio_config")
            if getattr(cfg, k, None) is not None]


def is_multimodal(cfg: Any) -> bool:
    """A language model in ``text_config`` beside a vision or audio tower (Gemma-3 4B+,
    Llama-4, Qwen3.5, Mistral-3), its sizes not at the top level."""
    return getattr(cfg, "text_config", None) is not None and bool(_towers(cfg)) \
        and not getattr(cfg, "hidden_size", None)


def _tower_sizes(cfg: Any) -> str:
    """Each tower, its sizes from its config (not from building it: this process may go on to
    fork the plan's workers, and children forked after the parent built a model deadlocked,
    plan/workers.py SimulationWorkers)."""
    out = []
    for k, sub in _towers(cfg):
        sizes = ", ".join(f"{a} {getattr(sub, a)}" for a in ("num_hidden_layers", "hidden_size",
                                                             "intermediate_size")
                          if isinstance(getattr(sub, a, None), int))
        out.append(f"its {k.removesuffix('_config')} tower ({getattr(sub, 'model_type', k)}"
                   f"{': ' + sizes if sizes else ''})")
    return " and ".join(out)


def causal_lm_class(cfg: Any) -> Any:
    """The class ``AutoModelForCausalLM`` builds for ``cfg``'s model type (None: it has none,
    as for LLaVA and Qwen2-VL); looked up by name, nothing built."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(cfg, "model_type", ""))
    return getattr(transformers, name, None) if name else None


def builds_language_model_alone(cls: Any, text: Any) -> bool:
    """Whether ``cls``, the causal-LM class of a multimodal configuration, is built from its
    language model's configuration ``text`` alone (Llama-4's ``Llama4ForCausalLM``), not from
    the whole one with its towers (Gemma-3's ``Gemma3ForConditionalGeneration``)."""
    config_class = getattr(cls, "config_class", None)
    return isinstance(config_class, type) and isinstance(text, config_class)


def split_multimodal(cfg: Any, where: str, task: str = "causal-lm") -> tuple[Any, Any, str]:
    """(the language model's configuration, the multimodal one or None, what is planned).

    trainfit plans what ``AutoModelForCausalLM.from_pretrained`` loads, as a text fine-tuning
    script does (TRL's SFT of Gemma-3 calls it so):

    * Gemma-3 4B+ (and Gemma-3n, Gemma-4): ``Gemma3ForConditionalGeneration``, the language model
      beside its vision tower.  The tower's weights are held (quantized with the rest under
      QLoRA: transformers' BitsAndBytesConfig skips only the output head, quantizers/base.py
      ``get_keys_to_not_convert``) but not run, as the batches are text: no activations, no
      gradients (a parameter that took no part in the loss has none, and AdamW keeps no state
      for it), and no model FLOPs.
    * Llama-4, Llama-3.2-Vision, Qwen3.5: ``Llama4ForCausalLM`` and its kin, the language model
      alone (the checkpoint's tower weights are not loaded).
    * Qwen2-VL, LLaVA, Mistral-3: ``AutoModelForCausalLM`` has no class for them — one clear line.

    Planning the language model alone where the class holds the tower would leave the tower's
    weights out: an under-prediction."""
    if not is_multimodal(cfg):
        return cfg, None, ""
    text = cfg.text_config
    cls = causal_lm_class(cfg)
    cls_name = cls.__name__ if cls is not None else None
    archs = getattr(cfg, "architectures", None) or [cls_name or type(cfg).__name__]
    if cls is None or task != "causal-lm":
        fields = [f"model_type: {_text_twin(text.model_type)}",
                  *(f"{k}: {getattr(text, k)}" for k in (*ARCH_FIELDS, *SIZE_FIELDS)
                    if getattr(text, k, None) is not None)]
        # the head is tied in the whole config where the text one may not say it (Qwen2-VL-2B):
        # left out, a config of its own unties it and over-counts the head (an audit)
        tie = getattr(cfg, "tie_word_embeddings", None)
        if tie is None:
            tie = getattr(text, "tie_word_embeddings", None)
        if tie is not None:
            fields.append(f"tie_word_embeddings: {str(bool(tie)).lower()}")
        why = ("that AutoModelForCausalLM cannot load; trainfit plans what it loads"
               if task == "causal-lm" else f"planned as a {task}; trainfit plans a multimodal "
               "model only as AutoModelForCausalLM loads it")
        raise JobError(f"--model {where}: {archs[0]} is a multimodal model (a language model in "
                       f"text_config beside {_tower_sizes(cfg)}) {why}",
                       "to plan text-only fine-tuning of its language model, write its text_config "
                       f"as a config.json of its own ({', '.join(fields)}) and plan that; the tower "
                       "is then not counted (add its weights by hand, and its gradients and "
                       "optimizer states if it trains)")
    if builds_language_model_alone(cls, text):
        return text, cfg, (f"{archs[0]}'s language model, as AutoModelForCausalLM builds and "
                           f"loads it ({cls_name}, sizes from text_config); {_tower_sizes(cfg)} "
                           "is not loaded")
    built = cls_name if cls_name == archs[0] else f"{archs[0]} as {cls_name}"
    return text, cfg, (f"{built}, as AutoModelForCausalLM builds it: the language model (sizes "
                       f"from text_config) and {_tower_sizes(cfg)}, held in memory "
                       "(quantized with the rest under qlora) and not run — the batches are "
                       "text: no activations, gradients or optimizer states for the tower, and "
                       "its parameters are not in the model FLOPs; LoRA targets named by leaf "
                       "(q_proj, v_proj, all-linear) adapt the tower's layers too, as peft "
                       "matches them, and those adapters get no gradient")


TEXT_TWINS = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2", "qwen3_vl_text": "qwen3",
              "qwen3_vl_moe_text": "qwen3_moe"}
"""A multimodal model's text ``model_type`` that AutoModelForCausalLM cannot build → the language
model's own causal-LM type (Qwen2-VL's text model is Qwen2's decoder, its rotary split into
sections aside: transformers models/qwen2_vl): the hint named ``qwen2_vl_text``, which plan then
refused (an audit)."""


def _text_twin(model_type: str) -> str:
    """``model_type`` when AutoModelForCausalLM builds it, else its causal-LM twin."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return model_type
    twin = TEXT_TWINS.get(model_type, model_type.removesuffix("_text"))
    return twin if twin in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else model_type


def source_of(name: str, cfg: Any, task: str, origin: str, note: str = "",
              where: str | None = None) -> ModelSource:
    """A :class:`ModelSource` whose ``config`` is the language model's (a multimodal
    configuration split by :func:`split_multimodal`, its note first)."""
    from trainfit.model.kernels import fallback_note
    from trainfit.model.stored_quant import stored_quant

    stored = stored_quant(cfg, where or name)
    text, composite, what = split_multimodal(cfg, where or name, task)
    return ModelSource(name, text, task, origin,
                       # each part without its full stop: "shapes).; granite…" (an audit)
                       "; ".join(n.rstrip(".") for n in (what, note, fallback_note(text),
                                                         encoder_note(text, task)) if n),
                       composite, stored)


def encoder_note(cfg: Any, task: str) -> str:
    """A masked-LM encoder (BERT, RoBERTa) planned through AutoModelForCausalLM: its LM-head
    class with ``is_decoder`` off — the same encoder and head, attention bidirectional, the
    loss over every position's logits, as a masked-LM step holds them. Said (an audit: a
    BertForMaskedLM config planned as 'loss over the whole logits', nothing said)."""
    archs = getattr(cfg, "architectures", None) or []
    masked = [a for a in archs if a.endswith("ForMaskedLM")]
    if task != "causal-lm" or not masked or getattr(cfg, "is_decoder", True):
        return ""
    return (f"{masked[0]} planned as the model AutoModelForCausalLM builds from its "
            "configuration (is_decoder false: bidirectional attention, the same encoder and an "
            "output head over every position, as a masked-LM step computes its logits); the "
            "loss is over all positions' logits, the same tensors the masked-LM loss reads")


def quantization_note(config: Any, where: str = "config.json") -> str:
    """What the plan does with a checkpoint published quantized (``quantization_config`` in
    config.json). bitsandbytes 4-bit (unsloth's ``*-bnb-4bit``): ``from_pretrained`` loads the
    weights 4-bit as stored, so they are planned 4-bit and LoRA on them is QLoRA
    (:mod:`trainfit.model.stored_quant`). Other methods (gpt-oss's MXFP4, DeepSeek-V3's and
    Qwen3-FP8's fp8 blocks): ``from_config`` builds the model unquantized, so the weights are
    planned in each row's precision, which is what fine-tuning loads (gpt-oss:
    ``Mxfp4Config(dequantize=True)``; fp8 checkpoints are dequantized to train them with peft).
    Said, so that a plan of a 13 GB download is not read as wrong; "" when the config has none."""
    from trainfit.model.stored_quant import stored_quant

    q = getattr(config, "quantization_config", None)
    if not q:
        return ""
    method = (q.get("quant_method") if isinstance(q, dict) else
              getattr(q, "quant_method", None)) or "its own"
    stored = stored_quant(config, where)
    if stored is not None:
        return (f"config.json's quantization_config ({stored.describe()}): from_pretrained "
                "loads the weights 4-bit, as stored, so the plan holds them 4-bit: LoRA on them "
                "is QLoRA, and full fine-tuning cannot run")
    return (f"config.json's quantization_config ({method}) describes how the checkpoint is "
            "stored; the plan loads the weights unquantized (in each row's precision), as "
            "fine-tuning does (e.g. Mxfp4Config(dequantize=True) for gpt-oss); --method qlora "
            "plans 4-bit bitsandbytes weights instead")


def resolve_model(name: str, trust_remote_code: bool = False) -> ModelSource:
    from transformers import AutoConfig

    from trainfit.model.catalog.models import find_model, model_names
    from trainfit.model.custom import CUSTOM_TASK, build_module, describe, is_factory_spec

    if is_factory_spec(name):
        import torch

        with torch.device("meta"):
            module = build_module(name)
        cfg = describe(module, name)
        # said where plan shows only "checkpointing off" rows (an audit: the reason was a code
        # comment)
        no_ckpt = "" if cfg.supports_grad_ckpt else (
            "; it has no gradient_checkpointing_enable(), so checkpointing is planned off only")
        return ModelSource(name, cfg, CUSTOM_TASK, "custom",
                           "your own nn.Module (module:factory), called as model(input_ids) → "
                           f"logits{no_ckpt}")
    entry = find_model(name)
    if entry is not None:
        # transformers edits nested dicts (rope_scaling) in place: never hand it the catalog's own
        cfg = AutoConfig.for_model(**copy.deepcopy(entry.config))
        return source_of(entry.name, cfg, entry.task, "catalog", entry.note)

    path = Path(name).expanduser()
    if path.exists():
        return _local_source(name, path)
    if "/" in name and not name.startswith((".", "/")):
        return _hub_source(name, trust_remote_code)
    if name.startswith((".", "/", "~")) or name.endswith(".json"):
        # written as a path: say the path is missing, not that the name is unknown (QA)
        raise JobError(f"--model {name}: no such file or directory",
                       "check the path (a model directory with a config.json, or the config.json "
                       "itself), or give a catalog name (trainfit models) or an HF id")
    close = difflib.get_close_matches(name.lower(), model_names(), n=3, cutoff=0.5)
    hint = ("did you mean " + ", ".join(close) + "?") if close else \
        "run `trainfit models` for the catalog, or give an HF id / config.json path"
    raise JobError(f"--model {name}: unknown model", hint)


def _json_float(obj: dict[str, Any]) -> Any:
    """transformers' encoding of a float JSON cannot hold (``{"__float__": "Infinity"}``)."""
    if len(obj) == 1 and isinstance(obj.get("__float__"), str):
        return float(obj["__float__"])
    return obj


def _local_source(name: str, path: Path) -> ModelSource:
    """A model directory with a config.json, or the config.json itself (read and checked by
    :mod:`trainfit.model.config_file`)."""
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file():
        raise JobError(f"--model {name}: directory has no config.json",
                       "point --model at a model directory or a config.json file")
    try:
        # transformers writes a non-finite float as {"__float__": "Infinity"} (Mamba-2's
        # time_step_limit) and reads it back so: plain json.loads left the object, which its
        # validator refused (an audit)
        data = json.loads(cfg_path.read_text(), object_hook=_json_float)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise JobError(f"--model {name}: {cfg_path.name} is not valid JSON ({err})",
                       "use the model's config.json as published (a JSON object)") from None
    except OSError as err:
        raise JobError(f"--model {name}: cannot read {cfg_path.name} "
                       f"({err.strerror or type(err).__name__})",
                       "check the path and its permissions (ls -l)") from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(data), "a number")
        raise JobError(f"--model {name}: {cfg_path.name} holds {kind}, not a JSON object",
                       "use the model's config.json as published (a JSON object with "
                       "model_type and the architecture sizes)")
    if "model_type" not in data:
        raise JobError(f"--model {name}: config.json has no model_type",
                       "add the model_type field (e.g. \"llama\") from the original model")
    try:
        cfg = config_from_dict(data, name)
    except JobError:
        raise
    except Exception as err:  # transformers' own validators raise several types
        if "auto_map" in data:  # its own modeling code beside it: never run from a local dir
            raise JobError(f"--model {name}: {cfg_path.name} names its own modeling code "
                           f"(auto_map) for model_type {data.get('model_type')!r}, which "
                           "transformers does not ship; trainfit does not run a local "
                           "directory's code", "give its hub id with --trust-remote-code "
                           "(the code then comes from the hub), or a model transformers "
                           "knows") from None
        said = " ".join(line.strip() for line in str(err).splitlines()[:3]) or type(err).__name__
        raise JobError(f"--model {name}: transformers cannot read this config ({said})",
                       "upgrade transformers or check model_type and the field values") from None
    defaulted = check_config_fields(data, cfg, name)
    notes = [f"not in config.json, transformers' defaults used: {', '.join(defaulted)}"
             ] if defaulted else []
    notes.append(overridden_note(data, cfg))
    notes.append(quantization_note(cfg, name))
    src = source_of(str(path), cfg, _task_for(cfg), "local",
                    "; ".join(n.rstrip(".") for n in notes if n), where=name)
    _check_fields(src.config, name)
    return src


def _hub_source(name: str, trust_remote_code: bool) -> ModelSource:
    """An HF id: its config.json from the hub (or the local cache), as transformers fetches it."""
    from transformers import AutoConfig

    offline = not _hub_resolves()
    try:
        # without a network only the local cache can answer: asked at once (huggingface_hub
        # retried a failed name lookup 5 times with backoff, ~25 s and 10 lines of retry noise
        # before the error: an audit)
        cfg = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code,
                                         local_files_only=offline)
    except ValueError as err:
        if "trust_remote_code" in str(err):
            raise JobError(f"--model {name}: needs the model's own code",
                           "add --trust-remote-code if you trust its authors") from None
        raise JobError(f"--model {name}: {str(err).splitlines()[0]}",
                       "check the hub id, or pass a local config.json") from None
    except OSError as err:
        if offline:
            raise JobError(f"--model {name}: no network (the hub's host does not resolve) and "
                           "its config.json is not in the local Hugging Face cache",
                           "connect and run again, pass a local config.json, or a catalog "
                           "name (trainfit models)") from None
        raise JobError(f"--model {name}: cannot fetch its config.json from the hub "
                       f"({type(err).__name__})",
                       "check the id and the network, or pass a local config.json") from None
    src = source_of(name, cfg, _task_for(cfg), "hub", quantization_note(cfg, name))
    _check_fields(src.config, name)
    return src


def _hub_resolves() -> bool:
    """Whether the hub's host name resolves (HF_ENDPOINT's, as huggingface_hub reads it); True
    under HF_HUB_OFFLINE, where transformers reads the cache alone anyway, and where an HTTPS
    proxy serves the host (HTTPS_PROXY / ALL_PROXY, not bypassed by NO_PROXY)."""
    import socket
    import urllib.request
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    # through a proxy the name need not resolve here: the proxy resolves it (a review)
    proxies = urllib.request.getproxies()
    if (proxies.get("https") or proxies.get("all")) and not urllib.request.proxy_bypass(host):
        return True
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def check_seq_len(seq_len: int, source: ModelSource) -> None:
    """A sequence longer than the model's learned positions cannot run (plan refuses it as tune
    and train do)."""
    limit = max_positions(source)
    if limit is not None and seq_len > limit:
        raise JobError(f"--seq-len {seq_len}: longer than {source.name}'s {limit} positions "
                       "(max_position_embeddings)", f"use --seq-len ≤ {limit}")


def max_positions(source: ModelSource) -> int | None:
    cfg = source.config
    for name in ("max_position_embeddings", "n_positions"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None  # relative positions (T5): no hard limit
