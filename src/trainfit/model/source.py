"""Resolve ``--model`` (catalog name, local dir, config.json, HF id) to a transformers config."""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.job import JobError

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


ARCH_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
"""What a config.json must state when its class has the attribute: transformers fills a missing one
with the class's default (a config.json with only ``model_type: llama`` is a 6.7 B Llama-2), a
guess trainfit does not make silently."""
TEXT_FIELDS = ("hidden_size", "num_hidden_layers")
"""What a multimodal config.json's ``text_config`` must state: its heads and vocabulary may be
left to the class's defaults (Gemma-3-4B's published file does), its width and depth not."""
SIZE_FIELDS = ("intermediate_size", "num_key_value_heads", "max_position_embeddings", "head_dim")
"""Checked when given; when missing, transformers' default (or derived value) is used and named in
the model's note."""


def _given(data: dict[str, Any], cls: Any, name: str) -> tuple[str, Any] | None:
    """(the key, its value) under which ``data`` states ``name`` (its own name or the class's
    ``attribute_map`` spelling: GPT-2's n_embd is hidden_size)."""
    aliases = [name, *([cls.attribute_map[name]] if name in getattr(cls, "attribute_map", {})
                       else [])]
    aliases += [k for k, v in getattr(cls, "attribute_map", {}).items() if v == name]
    for key in aliases:
        if key in data:
            return key, data[key]
    return None


def check_config_values(data: dict[str, Any], cls: Any, where: str) -> None:
    """The sizes a config.json gives are positive integers (checked before transformers reads
    them: ``"big"`` or ``-1`` is one clear line, not a traceback or a 0-parameter model)."""
    if isinstance(data.get("text_config"), dict):
        sub = getattr(cls, "sub_configs", {}).get("text_config")
        if isinstance(sub, type):
            check_config_values(data["text_config"], sub, f"{where} (text_config)")
    for n in (*ARCH_FIELDS, *SIZE_FIELDS):
        got = _given(data, cls, n)
        if got is None or (got[1] is None and n in SIZE_FIELDS):
            continue
        key, v = got
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise JobError(f"--model {where}: config.json {key} = {v!r}: must be a positive "
                           "integer", f"give {key} as a whole number ≥ 1, as in the model's "
                           "original config.json")
    _check_heads(data, cls, where)


def _check_heads(data: dict[str, Any], cls: Any, where: str) -> None:
    """The heads divide the width (unless head_dim is stated), the key/value heads the heads."""
    def value(n: str) -> Any:
        return (_given(data, cls, n) or (None, None))[1]

    hidden, heads, kv = value("hidden_size"), value("num_attention_heads"), \
        value("num_key_value_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and value("head_dim") is None \
            and hidden % heads:
        raise JobError(f"--model {where}: hidden_size {hidden} is not divisible by "
                       f"num_attention_heads {heads}", "every head takes hidden_size / heads "
                       "dimensions: choose sizes that divide (or state head_dim)")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise JobError(f"--model {where}: num_attention_heads {heads} is not divisible by "
                       f"num_key_value_heads {kv}", "each key/value head serves a whole group of "
                       "query heads: choose a divisor of the heads")


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
        fields = [f"{k}: {getattr(text, k)}" for k in ("model_type", *ARCH_FIELDS, *SIZE_FIELDS)
                  if getattr(text, k, None) is not None]
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


def source_of(name: str, cfg: Any, task: str, origin: str, note: str = "",
              where: str | None = None) -> ModelSource:
    """A :class:`ModelSource` whose ``config`` is the language model's (a multimodal
    configuration split by :func:`split_multimodal`, its note first)."""
    from trainfit.model.kernels import fallback_note
    from trainfit.model.stored_quant import stored_quant

    stored = stored_quant(cfg, where or name)
    text, composite, what = split_multimodal(cfg, where or name, task)
    return ModelSource(name, text, task, origin,
                       "; ".join(n for n in (what, note, fallback_note(text)) if n),
                       composite, stored)


def check_config_fields(data: dict[str, Any], cfg: Any, where: str) -> list[str]:
    """The sizes every model of its class needs are stated in the config.json (not filled in from
    the class's defaults; their values were checked by :func:`check_config_values`). Returns the
    other sizes transformers filled in (for the model's note)."""
    if isinstance(data.get("text_config"), dict) and getattr(cfg, "text_config", None) is not None:
        # a multimodal config.json's text_config leaves to its class's defaults what the
        # published model has (Gemma-3-4B's heads and vocabulary): transformers loads the
        # published file so, and they are named in the note, not refused
        inner, text = data["text_config"], cfg.text_config
        # but its width and depth: every published one states them
        missing = [n for n in TEXT_FIELDS if hasattr(text, n)
                   and _given(inner, type(text), n) is None]
        if missing:
            raise JobError(f"--model {where}: config.json's text_config does not state "
                           f"{', '.join(missing)} (transformers would fill in "
                           f"{type(text).__name__}'s defaults: a model nobody described)",
                           "use the model's complete config.json (from its hub page or its "
                           "directory), or add the missing fields to text_config")
        return [f"text_config.{n} = {getattr(text, n)}" for n in (*ARCH_FIELDS, *SIZE_FIELDS)
                if getattr(text, n, None) is not None and _given(inner, type(text), n) is None]
    cls = type(cfg)
    missing = [n for n in ARCH_FIELDS if hasattr(cfg, n) and _given(data, cls, n) is None]
    if missing:
        raise JobError(f"--model {where}: config.json does not state {', '.join(missing)} "
                       f"(transformers would fill in {cls.__name__}'s defaults: a model nobody "
                       "described)", "use the model's complete config.json (from its hub page or "
                       "its directory), or add the missing fields")
    filled = [n for n in SIZE_FIELDS
              if getattr(cfg, n, None) is not None and _given(data, cls, n) is None]
    fixed = [n for n in filled if n in SHAPE_FIELDS and _constant_default(data, cfg, n, where)]
    if fixed:
        raise JobError(f"--model {where}: config.json does not state {', '.join(fixed)} "
                       f"(transformers would fill in {cls.__name__}'s default "
                       f"{', '.join(f'{n} = {getattr(cfg, n)}' for n in fixed)}, a constant that "
                       "does not follow from the fields given: a model nobody described)",
                       "use the model's complete config.json (from its hub page or its "
                       "directory), or add the missing fields")
    return [f"{n} = {getattr(cfg, n)}" for n in filled]


def overridden_note(data: dict[str, Any], cfg: Any) -> str:
    """What the config class changed of the file's own values that changes the model: T5Config
    (transformers 5) sets ``tie_word_embeddings = True`` whatever the file says — Flan-T5-base's
    ``false`` then plans 222.9 M parameters, not the checkpoint's 247.6 M (a QA run): planned as
    transformers builds it, said."""
    given = data.get("tie_word_embeddings")
    built = getattr(cfg, "tie_word_embeddings", None)
    if isinstance(given, bool) and isinstance(built, bool) and given != built:
        return (f"config.json says tie_word_embeddings {str(given).lower()}, but transformers' "
                f"{type(cfg).__name__} sets it {str(built).lower()}: planned as transformers "
                "builds the model (its output head " + ("shares" if built else "does not share")
                + " the input embedding's weights)")
    return ""


SHAPE_FIELDS = ("intermediate_size",)
"""Missing sizes refused when the class fills them with a constant: the MLP width sets about two
thirds of a decoder's parameters (a Qwen3-0.6B config.json without it was planned as 2.2 B
parameters, with a note, in a QA run); a default derived from the width (Mamba's expand ×
hidden) describes the model given and stays a note.  ``head_dim`` is not one: a class's constant
is its family's (Qwen3's 128), and MLA models (DeepSeek-V2) leave it unused."""


def _constant_default(data: dict[str, Any], cfg: Any, name: str, where: str) -> bool:
    """Whether ``cfg``'s filled-in ``name`` stays the same when the config's width doubles (the
    class's constant, not a value derived from the fields given)."""
    key = (_given(data, type(cfg), "hidden_size") or (None, None))[0]
    if key is None or not isinstance(data.get(key), int):
        return False
    try:
        wider = config_from_dict({**data, key: data[key] * 2}, where)
    except Exception:  # a width the class refuses to double (its own checks): cannot tell
        return False
    return getattr(wider, name, None) == getattr(cfg, name)


def _derived_fields(cls: type, data: dict[str, Any]) -> list[str]:
    """Keys of ``data`` the config class computes itself: read-only properties.  Falcon derives
    ``head_dim`` as ``hidden_size // num_attention_heads`` (transformers
    models/falcon/configuration_falcon.py, a property without a setter); a config.json that
    also states it made ``for_model`` fail with "property 'head_dim' ... has no setter"."""
    out = []
    for k in data:
        attr = getattr(cls, k, None)
        if isinstance(attr, property) and attr.fset is None:
            out.append(k)
    return out


def config_from_dict(data: dict[str, Any], where: str) -> Any:
    """A transformers config from a config.json's fields: only what the class accepts is passed
    to its constructor; a field it derives is checked against the derived value (never
    silently replaced: a different value means a model transformers cannot build)."""
    from transformers import CONFIG_MAPPING, AutoConfig

    model_type = data["model_type"]
    cls = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None
    if cls is None:
        raise JobError(f"--model {where}: model_type {model_type!r} is not one transformers "
                       "knows", "check model_type (e.g. llama, gpt2, mistral), or upgrade "
                       "transformers")
    check_config_values(data, cls, where)
    derived = _derived_fields(cls, data)
    cfg = AutoConfig.for_model(**{k: v for k, v in data.items() if k not in derived})
    for k in derived:
        if getattr(cfg, k) != data[k]:
            raise JobError(f"--model {where}: {k} = {data[k]!r} in config.json, but transformers' "
                           f"{type(cfg).__name__} derives {k} = {getattr(cfg, k)!r} from the other "
                           "fields and cannot build the model as stated",
                           f"remove {k} or make the fields it derives from agree with it")
    return cfg


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
        return ModelSource(name, describe(module, name), CUSTOM_TASK, "custom",
                           "your own nn.Module (module:factory), called as model(input_ids) → logits")
    entry = find_model(name)
    if entry is not None:
        # transformers edits nested dicts (rope_scaling) in place: never hand it the catalog's own
        cfg = AutoConfig.for_model(**copy.deepcopy(entry.config))
        return source_of(entry.name, cfg, entry.task, "catalog", entry.note)

    path = Path(name).expanduser()
    if path.exists():
        cfg_path = path / "config.json" if path.is_dir() else path
        if not cfg_path.is_file():
            raise JobError(f"--model {name}: directory has no config.json",
                           "point --model at a model directory or a config.json file")
        try:
            data = json.loads(cfg_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise JobError(f"--model {name}: {cfg_path.name} is not valid JSON ({err})",
                           "use the model's config.json as published (a JSON object)") from None
        except OSError as err:
            raise JobError(f"--model {name}: cannot read {cfg_path.name} "
                           f"({err.strerror or type(err).__name__})",
                           "check the path and its permissions (ls -l)") from None
        if not isinstance(data, dict) or "model_type" not in data:
            raise JobError(f"--model {name}: config.json has no model_type",
                           "add the model_type field (e.g. \"llama\") from the original model")
        try:
            cfg = config_from_dict(data, name)
        except JobError:
            raise
        except Exception as err:  # transformers' own validators raise several types
            raise JobError(f"--model {name}: transformers cannot read this config "
                           f"({str(err).splitlines()[0] if str(err) else type(err).__name__})",
                           "upgrade transformers or check model_type and the field values") from None
        defaulted = check_config_fields(data, cfg, name)
        notes = [f"not in config.json, transformers' defaults used: {', '.join(defaulted)}"
                 ] if defaulted else []
        notes.append(overridden_note(data, cfg))
        notes.append(quantization_note(cfg, name))
        src = source_of(str(path), cfg, _task_for(cfg), "local",
                        "; ".join(n for n in notes if n), where=name)
        _check_fields(src.config, name)
        return src

    if "/" in name and not name.startswith((".", "/")):
        try:
            cfg = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
        except ValueError as err:
            if "trust_remote_code" in str(err):
                raise JobError(f"--model {name}: needs the model's own code",
                               "add --trust-remote-code if you trust its authors") from None
            raise JobError(f"--model {name}: {str(err).splitlines()[0]}",
                           "check the hub id, or pass a local config.json") from None
        except OSError as err:
            raise JobError(f"--model {name}: cannot fetch its config.json from the hub "
                           f"({type(err).__name__})",
                           "check the id and the network, or pass a local config.json") from None
        src = source_of(name, cfg, _task_for(cfg), "hub", quantization_note(cfg, name))
        _check_fields(src.config, name)
        return src

    if name.startswith((".", "/", "~")) or name.endswith(".json"):
        # written as a path: say the path is missing, not that the name is unknown (QA)
        raise JobError(f"--model {name}: no such file or directory",
                       "check the path (a model directory with a config.json, or the config.json "
                       "itself), or give a catalog name (trainfit models) or an HF id")
    close = difflib.get_close_matches(name.lower(), model_names(), n=3, cutoff=0.5)
    hint = ("did you mean " + ", ".join(close) + "?") if close else \
        "run `trainfit models` for the catalog, or give an HF id / config.json path"
    raise JobError(f"--model {name}: unknown model", hint)


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
