"""A config.json read as transformers reads it, and checked before a model is built from it: the
sizes every model of its class needs are stated (not the class's defaults), they are positive
integers, the heads divide the width, and fields the class derives agree with the file."""

from __future__ import annotations

from typing import Any

from trainfit.job import JobError

ARCH_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
"""What a config.json must state when its class has the attribute: transformers fills a missing one
with the class's default (a config.json with only ``model_type: llama`` is a 6.7 B Llama-2), a
guess trainfit does not make silently."""
TEXT_FIELDS = ("hidden_size", "num_hidden_layers")
"""What a multimodal config.json's ``text_config`` must state: its heads and vocabulary may be
left to the class's defaults (Gemma-3-4B's published file does), its width and depth not."""
MAX_LAYERS = 2048
"""The deepest model a config.json may describe (published LLMs have up to a few hundred layers)."""
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
        if n == "num_hidden_layers" and v > MAX_LAYERS:
            # plan builds the layers: a million of them simulated for minutes with no end in
            # sight (an audit); the deepest published LLMs have a few hundred
            raise JobError(f"--model {where}: config.json {key} = {v:,}: more layers than "
                           f"trainfit plans ({MAX_LAYERS:,})", f"check {key} against the "
                           "model's original config.json")
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
