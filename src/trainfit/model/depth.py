"""The layer stack's repeating pattern: which smaller stacks a simulation can stand on.

The simulation extrapolates a step in depth from two small stacks (:mod:`trainfit.memory.extrapolate`),
which is exact only where the layers the full stack has beyond the small ones are copies of
layers the small ones differ by.  Models are not all one layer repeated:

* Gemma-2 alternates a sliding-window and a global attention layer, Gemma-3 five sliding ones
  and a global one, gpt-oss sliding and full ones (``layer_types``);
* DeepSeek-V3 and GLM-4.5 keep their first ``first_k_dense_replace`` layers dense and route the
  rest through experts; Llama-4 Maverick alternates dense and expert layers
  (``interleave_moe_layer_step``); Qwen2-MoE keeps ``mlp_only_layers`` dense;
* hybrid stacks (Granite-4.0-H, Jamba, Qwen3-Next) interleave attention with Mamba or linear
  attention layers.

A stack truncated to 2 and 3 layers of such a model is not two stacks one repeat apart: DeepSeek-V3
at 2-3 layers is all dense, and extrapolated it would have no experts at all.  So the pattern is
read from the model itself, built on the meta device: each layer's signature (its modules'
classes, parameter and buffer shapes, their scalar settings such as a sliding window, and the
config's per-layer entries such as ``layer_types``), and the description "a prefix of ``prefix``
layers, then a period of ``period`` layers repeated to the end" with the shallowest small stacks
that reproduces every layer.  The small stacks are then ``prefix + k·period`` layers deep,
checked to build into the full stack's first layers, and the full stack is the same with more
repeats: what grows with the depth is a whole period.  No pattern found (or a truncated stack
that builds differently): simulated at full depth, as before.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import torch

from trainfit.model.source import ModelSource, build_config, layer_count, no_cache

_SCALARS = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class LayerPattern:
    """A stack of ``full`` layers = ``prefix`` layers, then ``repeats`` × ``period`` layers."""

    full: int
    prefix: int
    """Leading layers outside the repeat: DeepSeek-V3's three dense layers, or the first layers
    of a period where the stack ends inside one (Gemma-3-27B's 62 = 2 + 10 × 6: the repeats are
    counted from the end, as the small stacks keep the full one's first layers)."""
    period: int
    """Layers per repeat: 1 for Llama, 2 for Gemma-2, 6 for Gemma-3."""

    @property
    def repeats(self) -> int:
        """How many periods the full stack has after its prefix."""
        return (self.full - self.prefix) // self.period

    def depth(self, repeats: int) -> int:
        """The depth of the same stack with ``repeats`` periods."""
        return self.prefix + repeats * self.period


def _index_like(values: list[Any]) -> bool:
    """A setting that is each layer's own position (``layer_idx`` and its kin, whatever their
    name): it tells the layers apart without changing what they compute or allocate."""
    # whole numbers only: a flag's False/True equals 0/1 in Python (a review: a yes/no setting
    # two layers have would have been read as their index)
    if any(v is not None and type(v) is not int for v in values):
        return False
    # counted from 0 or 1, in every layer or in those a submodule is in (a hybrid's Mamba
    # mixer, Granite-4.0-H's three in four: None where it is not)
    present = [(i, v) for i, v in enumerate(values) if v is not None]
    return len(present) > 1 and any(all(v == i + k for i, v in present) for k in (0, 1))


def _module_records(layer: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Per submodule of one layer, by its name in the layer: its class, its parameters' and
    buffers' shapes and dtypes, whether they train, and its scalar settings."""
    out = {}
    for name, m in layer.named_modules():
        rec: dict[str, Any] = {
            "": type(m).__name__,
            "params": tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad)
                            for n, p in m.named_parameters(recurse=False)),
            "buffers": tuple((n, tuple(b.shape), str(b.dtype))
                             for n, b in m.named_buffers(recurse=False)),
        }
        for k, v in vars(m).items():
            if k.startswith("_") or k == "training":
                continue
            if isinstance(v, _SCALARS) or (isinstance(v, (tuple, list))
                                           and all(isinstance(x, _SCALARS) for x in v)):
                rec["." + k] = tuple(v) if isinstance(v, list) else v
        out[name] = rec
    return out


def per_layer_keys(config: Any, n: int) -> list[str]:
    """The config's per-layer lists (``layer_types``, Llama-4's ``no_rope_layers``): those of
    the stack's length, but for a list of every layer's index (Llama-4 Scout's ``moe_layers``,
    every layer an expert layer)."""
    return sorted(k for k, v in vars(config).items()
                  if isinstance(v, (list, tuple)) and len(v) == n and not k.startswith("_")
                  and not _index_like(list(v)))


def _signatures(model: torch.nn.Module, config: Any, n: int, keys: list[str]
                ) -> list[str] | None:
    """One signature (a JSON string) per layer of the ``n``-layer stack (``keys``: the config's
    per-layer lists, read at each layer), or None when the model has no module list of ``n``
    layers (its stack cannot be found)."""
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    if not stacks:
        return None
    per_layer = [[_module_records(stack[i]) for stack in stacks] for i in range(n)]
    # drop the settings that are a layer's position (they differ in every layer), compared by
    # submodule name: a layer with a module the others lack (RWKV's first, with its pre_ln)
    # does not hide the others' layer_id
    settings = {(s, name, k) for layer in per_layer for s, recs in enumerate(layer)
                for name, rec in recs.items() for k in rec if k.startswith(".")}
    for s, name, k in settings:
        values = [per_layer[i][s].get(name, {}).get(k) for i in range(n)]
        if _index_like(values):
            for i in range(n):
                per_layer[i][s].get(name, {}).pop(k, None)
    lists = {k: getattr(config, k) for k in keys}
    return [json.dumps([per_layer[i], {k: repr(v[i]) for k, v in lists.items()}],
                       sort_keys=True, default=repr) for i in range(n)]


def _numbered(sigs: list[str]) -> list[int]:
    """Each signature as the number of its first occurrence (the search compares numbers)."""
    first: dict[str, int] = {}
    return [first.setdefault(x, len(first)) for x in sigs]


def _build(source: ModelSource, trust_remote_code: bool) -> torch.nn.Module:
    """The plain model of ``source`` on the meta device (no LoRA, quantization or dtypes)."""
    from trainfit.model.attention_impl import auto_model_class

    cfg = copy.deepcopy(build_config(source))
    no_cache(cfg)
    with torch.device("meta"):
        return auto_model_class(source.task).from_config(cfg, trust_remote_code=trust_remote_code)


def with_layers(source: ModelSource, n: int) -> ModelSource:
    """The same model with an ``n``-layer stack, the config's per-layer lists
    (:func:`per_layer_keys`: ``layer_types``, ``no_rope_layers``) cut to ``n`` — some configs
    check them against the depth.  Only the config's own attributes are cut: a read-only
    property derived from the depth (Mamba's ``layer_types``) is not one, and follows it.  A
    multimodal model's language model is cut inside its configuration (its towers kept)."""
    attr, full = layer_count(source)
    if source.composite is not None:
        composite = copy.deepcopy(source.composite)
        cfg = composite.text_config
    else:
        composite, cfg = None, copy.deepcopy(source.config)
    setattr(cfg, attr, n)
    for k in per_layer_keys(cfg, full):
        setattr(cfg, k, list(getattr(cfg, k))[:n])
    return dataclasses.replace(source, config=cfg, composite=composite)


def _shortest(sigs: list[int], repeats: tuple[int, int]) -> LayerPattern | None:
    """The pattern with the shallowest small stacks (``repeats`` periods) that reproduces the
    signatures, or None when the small stacks would be no shallower than the full one.

    The repeats end where the stack ends: a stack ending inside a period (Gemma-3-27B's 62 =
    10 × 6 + 2) counts the extra layers in its prefix (2 + 10 × 6), so that the small stacks and
    the full one differ by whole periods at the same place.  Cut after a partial period instead,
    the small stacks' alloc/free traces did not align (no full-depth trace)."""
    n = len(sigs)
    best: tuple[int, LayerPattern] | None = None
    for period in range(1, n // 3 + 1):
        # the first layer from which the signatures repeat with this period
        start = next((q for q in range(n - 3 * period + 1)
                      if all(sigs[i] == sigs[q + (i - q) % period] for i in range(q, n))), None)
        if start is None:
            continue
        pat = LayerPattern(n, start + (n - start) % period, period)
        cost = pat.depth(repeats[0]) + pat.depth(repeats[1])
        if pat.repeats > repeats[1] and cost < n and (best is None or cost < best[0]):
            best = (cost, pat)
    return None if best is None else best[1]


_PATTERNS: dict[tuple[Any, ...], LayerPattern | None] = {}
"""Pattern by (task, the configuration's JSON, repeats, remote code trusted): a plan asks once
per group."""


def layer_pattern(source: ModelSource, repeats: tuple[int, int],
                  trust_remote_code: bool = False) -> LayerPattern | None:
    """The stack's repeating pattern, checked: stacks of ``repeats[0]`` and ``repeats[1]``
    periods build into the full stack's first layers.  None (simulate the full stack) when the
    model is not a decoder stack trainfit can cut, has no pattern whose small stacks are
    shallower than the full one together, or does not build."""
    cfg = source.config
    if source.task in ("seq2seq-lm", "custom-lm") or getattr(cfg, "is_encoder_decoder", False):
        return None  # custom-lm: its depth is the factory's, not a config field we can change
    attr, n = layer_count(source)
    if attr is None or not hasattr(cfg, "to_dict"):
        return None
    key = (source.task, json.dumps(build_config(source).to_dict(), sort_keys=True, default=repr),
           repeats, trust_remote_code)
    if key not in _PATTERNS:
        _PATTERNS[key] = _find(source, n, repeats, trust_remote_code)
    return _PATTERNS[key]


def _find(source: ModelSource, n: int, repeats: tuple[int, int],
          trust_remote_code: bool) -> LayerPattern | None:
    """:func:`layer_pattern`, uncached."""
    try:
        keys = per_layer_keys(source.config, n)
        sigs = _signatures(_build(source, trust_remote_code), source.config, n, keys)
        if sigs is None:
            return None
        pat = _shortest(_numbered(sigs), repeats)
        if pat is None:
            return None
        for k in repeats:
            small = with_layers(source, pat.depth(k))
            got = _signatures(_build(small, trust_remote_code), small.config, pat.depth(k), keys)
            if got != sigs[:pat.depth(k)]:
                return None  # the cut stack builds otherwise (a per-layer list it recomputes)
    except (AssertionError, AttributeError, ImportError, IndexError, KeyError, OSError,
            RuntimeError, TypeError, ValueError):
        # what transformers' model classes raise on a config they cannot build (the set
        # build_model_on_meta turns into one line, and a missing kernel package or remote
        # code): the full stack is simulated, and that simulation reports the error
        return None
    return pat
