"""Real storage and initial values for a model built on ``meta`` (what ``from_config`` would
give it, without ever holding the whole model twice).

A transformers model is initialised by transformers itself: each module's ``_init_weights``
(children before parents, as ``initialize_weights`` goes) — T5's factor-scaled weights, Mamba's
``A_log``/``D``/``dt_proj``, Gemma's (1 + w) norms at 0, and the buffers its config computes:
rotary frequencies with their ``rope_theta`` and scaling, Gemma's ``embed_scale``, BERT's
``position_ids``, GPT-Neo's causal mask.  Each module's call runs on a *twin*: the module's
attributes shared, its tensors new.  A first call on a twin whose tensors are all on ``meta``
records which tensors it writes (through ``transformers.initialization``, which every
``_init_weights`` of transformers 5 calls); a second on a host twin of just those, filled with a
value no init writes (NaN, or a sentinel for integers and masks), makes the values, and a tensor
written whole is copied in (:func:`assign`: a sharded rank takes its rows).  So every value is
drawn once, on the host, from torch's generator seeded once: the same on every device and under
every sharding.  What no ``_init_weights`` writes, and any module that is not transformers'
(a ``module:factory`` model), gets the generic values: N(0, 0.02) weights, ones for norm scales,
the usual rotary frequencies.

An audit found the generic values alone on every tensor: Gemma's embed_scale −0.01, Mixtral's and
Llama-3's rotary frequencies at base 10,000 — buffers no checkpoint stores, so a pretrained model
loaded over them computed something else — and T5 barely learning (6.24 → 6.15 in 10 steps).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch

INT_SENTINEL = -(2**31) + 7
"""What an integer or mask twin starts as: no init writes it (positions, masks are ≥ 0)."""


def materialize(model: torch.nn.Module, device: torch.device | str) -> torch.nn.Module:
    """``to_empty`` on ``device``, with shared parameters shared again (to_empty gives each module
    its own new Parameter: a custom GPT's head tied to its embedding); returns the base model
    (peft's wrapped one, or the model)."""
    shared: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for mod in model.modules():
        for pname, prm in mod._parameters.items():
            if prm is not None:
                shared.setdefault(id(prm), []).append((mod, pname))
    model.to_empty(device=device)
    for users in shared.values():
        first_mod, first_name = users[0]
        for mod, pname in users[1:]:
            mod._parameters[pname] = first_mod._parameters[first_name]
    base = hf_model(model)
    if hasattr(base, "tie_weights"):  # to_empty unties shared storage; from_pretrained keeps it
        try:
            base.tie_weights()
        except KeyError:
            # a tied head wrapped by LoRA (--lora-targets ...,lm_head): transformers cannot set
            # the wrapper's weight ("attribute 'weight' already exists", a traceback in tune:
            # an audit); its base_layer.weight shares the embedding's Parameter, re-tied above
            pass
    return base


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside trainfit's and peft's wrappers: the chunked head's (``--lm-head-chunk``,
    ``--trl-logprob-head``), then peft's base model.  An audit: under a chunked head neither the
    checkpoint nor transformers' init reached the model (its names began with the wrapper's)."""
    from trainfit.model.chunked_head import ChunkedHeadLM

    if isinstance(model, ChunkedHeadLM):
        model = model.model
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def generic_init(model: torch.nn.Module, seed: int, zero_lora_b: bool,
                 skip: set[int] | frozenset[int] = frozenset()) -> None:
    """N(0, 0.02) weights (GPT-2/Llama init), ones for norm scales, the usual rotary frequencies,
    drawn on the host; every tensor whose id is in ``skip`` (loaded, or written by transformers)
    kept.  ``zero_lora_b``: PEFT's init (the adapter starts as a no-op)."""
    from trainfit.model.runtime import assign

    gen = torch.Generator().manual_seed(seed)
    norm_params = {f"{n}.{pn}": pn for n, m in model.named_modules()
                   if type(m).__name__.endswith("Norm") for pn in ("weight", "bias")}
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if id(t) in skip:
                continue
            if not t.is_floating_point():
                t.zero_()
            elif name.endswith(("norm.weight", "ln_f.weight", "layernorm.weight")) \
                    or "LayerNorm.weight" in name or ".ln_" in name:
                t.fill_(1.0)
            elif name in norm_params:  # norms the names above miss (a custom model's ln1)
                t.fill_(1.0 if norm_params[name] == "weight" else 0.0)
            elif "inv_freq" in name:
                dim = t.numel() * 2
                t.copy_(1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)))
            elif zero_lora_b and "lora_B" in name:
                t.zero_()
            else:
                assign(t, torch.randn(t.shape, generator=gen, dtype=torch.float32) * 0.02)


@contextlib.contextmanager
def _recording(written: set[int], whole: set[int]) -> Iterator[None]:
    """transformers.initialization's functions, each recording the tensor it is given (a view's
    base too) in ``written``, and in ``whole`` a tensor it is given itself (not a view: every
    value written), then doing its work."""
    import transformers.initialization as hf_init

    names = [n for n in dir(hf_init) if n.endswith("_") and not n.startswith("_")
             and callable(getattr(hf_init, n))]
    saved = {n: getattr(hf_init, n) for n in names}

    def wrap(fn: Any) -> Any:
        def recorded(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(tensor, torch.Tensor):
                written.add(id(tensor))
                if tensor._base is not None:
                    written.add(id(tensor._base))
                else:
                    whole.add(id(tensor))
            return fn(tensor, *args, **kwargs)
        return recorded

    try:
        for n, fn in saved.items():
            setattr(hf_init, n, wrap(fn))
        yield
    finally:
        for n, fn in saved.items():
            setattr(hf_init, n, fn)


def _twin(m: torch.nn.Module, host: set[int], exact: frozenset[int] | set[int] = frozenset()
          ) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """``m`` with new tensors: on the host (NaN, or the sentinel; uninitialised for floats in
    ``exact``, which an init function is given whole) for those whose real tensor's id is in
    ``host``, else on meta; and the twin's tensors by name (its whole subtree).  Not copy.copy,
    which FSDP2's module class (its __new__ rebuilds the original) cannot take."""
    made: dict[str, torch.Tensor] = {}

    def new(x: torch.Tensor) -> torch.Tensor:
        if id(x) not in host:
            return torch.empty(x.shape, dtype=x.dtype, device="meta")
        if x.is_floating_point():
            return torch.empty(x.shape) if id(x) in exact else torch.full(x.shape, float("nan"))
        # an integer, or a mask held as integers so that the sentinel fits
        return torch.full(x.shape, INT_SENTINEL, dtype=torch.int64)

    def build(mod: torch.nn.Module, prefix: str) -> torch.nn.Module:
        t = object.__new__(type(mod))
        t.__dict__.update(mod.__dict__)
        t._parameters = {}
        for k, p in mod._parameters.items():
            t._parameters[k] = None if p is None else torch.nn.Parameter(new(p),
                                                                         requires_grad=False)
            if p is not None:
                made[prefix + k] = t._parameters[k]
        t._buffers = {}
        for k, b in mod._buffers.items():
            t._buffers[k] = None if b is None else new(b)
            if b is not None:
                made[prefix + k] = t._buffers[k]
        t._modules = {k: None if c is None else build(c, f"{prefix}{k}.")
                      for k, c in mod._modules.items()}
        return t

    return build(m, ""), made


def hf_initialize(base: torch.nn.Module, seed: int, zero_lora_b: bool,
                  loaded: set[int] | frozenset[int] = frozenset()) -> set[int]:
    """transformers' own ``_init_weights`` of every module of ``base`` (see the module
    docstring); returns the ids of the real tensors it wrote.  ``loaded``: tensors a checkpoint
    gave, never written.  Nothing (an empty set) for a model that is not transformers'."""
    from trainfit.model.runtime import assign

    init_module = getattr(base, "_init_weights", None)
    if init_module is None or not hasattr(base, "initialize_weights"):
        return set()
    torch.manual_seed(seed)
    done: set[int] = set()
    # peft's B matrices start at zero (the adapter a no-op); found by their full names (a
    # module's own names are relative: "weight" — an audit found them drawn N(0, 0.02))
    lora_b = {id(t) for n, t in base.named_parameters(remove_duplicate=False)
              if "lora_B" in n} if zero_lora_b else set()

    def post_order(m: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
        return [*(x for k, c in m.named_children() for x in post_order(c, f"{prefix}{k}.")),
                (prefix, m)]

    # a tied head's weight is the embedding's: transformers inits both before it ties them, so
    # the head's draw never reaches the embedding (its padding row stays 0: an audit)
    tied = set(getattr(base, "all_tied_weights_keys", None) or {})
    with torch.no_grad():
        for prefix, m in post_order(base):
            real = {n: t for n, t in [*m.named_parameters(), *m.named_buffers()]
                    if (prefix + n).replace(".base_layer", "") not in tied}  # LoRA's head too
            if not real:
                continue
            # which of the subtree's tensors this module's init writes: a dry run on meta
            written: set[int] = set()
            whole: set[int] = set()
            twin, made = _twin(m, set())
            try:
                with _recording(written, whole):
                    init_module(twin)
                names = [n for n, t in made.items() if id(t) in written]
            except Exception:  # an init that reads values (meta has none): its own tensors
                names, whole = [n for n in made if "." not in n], set()
            want = {id(real[n]) for n in names if n in real and id(real[n]) not in loaded
                    and id(real[n]) not in lora_b}
            if not want:
                continue
            # a float given whole to an init function is all written: no NaN to fill and scan
            # (half the cost of a 0.5 B model's init)
            exact = {id(real[n]) for n in names if n in real and id(made[n]) in whole}
            twin, made = _twin(m, want, exact)
            try:
                init_module(twin)
            except Exception:  # what it cannot make keeps the generic values
                continue
            for n, v in made.items():
                r = real.get(n)
                if r is None or id(r) not in want:
                    continue
                if v.is_floating_point() and (id(r) in exact or not torch.isnan(v).any()):
                    assign(r, v.to(torch.float32))
                elif not v.is_floating_point() and not (v == INT_SENTINEL).any():
                    r.copy_(v.to(r.dtype))
                else:
                    continue
                done.add(id(r))
    # the twins, freed now rather than by a later collection in the middle of someone's step
    # (the CPU ground truth counts frees: a test saw its peak 2 % low)
    gc.collect()
    return done


def init_weights(model: torch.nn.Module, device: torch.device | str, seed: int,
                 zero_lora_b: bool = True) -> torch.nn.Module:
    """Real storage on ``device`` and initial values (see the module docstring).
    ``zero_lora_b``: PEFT's init (the adapter starts as a no-op); the memory ground truth keeps
    them random, as it always has (values do not change its bytes).  LoRA's A matrices, being
    ``nn.Linear``, get transformers' N(0, initializer_range), not peft's Kaiming-uniform."""
    base = materialize(model, device)
    written = hf_initialize(base, seed, zero_lora_b)
    generic_init(model, seed, zero_lora_b, skip=written)
    return model
