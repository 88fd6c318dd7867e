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
    derived = _derived_fields(cls, data) if cls is not None else []
    cfg = AutoConfig.for_model(**{k: v for k, v in data.items() if k not in derived})
    for k in derived:
        if getattr(cfg, k) != data[k]:
            raise JobError(f"--model {where}: {k} = {data[k]!r} in config.json, but transformers' "
                           f"{type(cfg).__name__} derives {k} = {getattr(cfg, k)!r} from the other "
                           "fields and cannot build the model as stated",
                           f"remove {k} or make the fields it derives from agree with it")
    return cfg


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
        return ModelSource(entry.name, cfg, entry.task, "catalog", entry.note)

    path = Path(name).expanduser()
    if path.exists():
        cfg_path = path / "config.json" if path.is_dir() else path
        if not cfg_path.is_file():
            raise JobError(f"--model {name}: directory has no config.json",
                           "point --model at a model directory or a config.json file")
        try:
            data = json.loads(cfg_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise JobError(f"--model {name}: {cfg_path.name} is not valid JSON ({err})") from None
        if not isinstance(data, dict) or "model_type" not in data:
            raise JobError(f"--model {name}: config.json has no model_type",
                           "add the model_type field (e.g. \"llama\") from the original model")
        try:
            cfg = config_from_dict(data, name)
        except JobError:
            raise
        except (ValueError, KeyError, TypeError) as err:
            raise JobError(f"--model {name}: transformers cannot read this config "
                           f"({str(err).splitlines()[0]})",
                           "upgrade transformers or check model_type") from None
        _check_fields(cfg, name)
        return ModelSource(str(path), cfg, _task_for(cfg), "local")

    if "/" in name and not name.startswith((".", "/")):
        try:
            cfg = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
        except ValueError as err:
            if "trust_remote_code" in str(err):
                raise JobError(f"--model {name}: needs the model's own code",
                               "add --trust-remote-code if you trust its authors") from None
            raise JobError(f"--model {name}: {str(err).splitlines()[0]}") from None
        except OSError as err:
            raise JobError(f"--model {name}: cannot fetch its config.json from the hub "
                           f"({type(err).__name__})",
                           "check the id and the network, or pass a local config.json") from None
        _check_fields(cfg, name)
        return ModelSource(name, cfg, _task_for(cfg), "hub")

    close = difflib.get_close_matches(name.lower(), model_names(), n=3, cutoff=0.5)
    hint = ("did you mean " + ", ".join(close) + "?") if close else \
        "run `trainfit models` for the catalog, or give an HF id / config.json path"
    raise JobError(f"--model {name}: unknown model", hint)


def max_positions(source: ModelSource) -> int | None:
    cfg = source.config
    for name in ("max_position_embeddings", "n_positions"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None  # relative positions (T5): no hard limit
