"""Models that are the user's own ``nn.Module``, given as ``--model module:factory``.

Seed 003 trains its own GPT: ``outputs = model(input_ids)`` returns logits and the script computes
the cross-entropy itself.  ``module`` is a dotted module importable from the working directory or
a ``path/to/file.py``; ``factory`` is a callable in it that takes no argument and returns the
``nn.Module`` (a class works when its constructor needs none).  Importing it runs the user's own
local code, which they named explicitly — the same trust as running their training script; no
string from a config or dataset is ever executed.

The module is wrapped in :class:`CausalLMAdapter` so every trainfit step (the data-less
simulation, probes, the training loop) calls it as it calls a transformers model:
``model(input_ids=..., labels=...)`` → an output with ``.loss`` — next-token cross-entropy over
the labels that are not -100, computed in fp32 like transformers' ``ForCausalLMLoss``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from trainfit.job import FACTORY_SPEC as _SPEC
from trainfit.job import JobError, is_code_spec

CUSTOM_TASK = "custom-lm"


def is_factory_spec(name: str) -> bool:
    return is_code_spec(name)


def load_factory(spec: str) -> Any:
    """The factory callable named by ``module:factory`` (errors say what to fix)."""
    m = _SPEC.match(spec)
    if m is None:
        raise JobError(f"--model {spec}: not of the form module:factory",
                       "e.g. --model mygpt.model:build_model or --model ./model.py:GPT")
    module_name, factory = m["module"], m["factory"]
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser().resolve()
            if not path.is_file():
                raise JobError(f"--model {spec}: {path} does not exist",
                               "give the path of the .py file that defines the factory")
            ispec = importlib.util.spec_from_file_location(f"trainfit_user_{path.stem}", path)
            if ispec is None or ispec.loader is None:
                raise JobError(f"--model {spec}: cannot import {path}",
                               "give a Python source file (.py) that defines the factory")
            mod = importlib.util.module_from_spec(ispec)
            sys.modules[ispec.name] = mod  # pickling (plan's worker processes) finds it
            ispec.loader.exec_module(mod)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            mod = importlib.import_module(module_name)
    except ImportError as err:
        raise JobError(f"--model {spec}: cannot import {module_name} ({err})",
                       "run from the directory that contains it, or give path/to/file.py:factory"
                       ) from None
    fn = getattr(mod, factory, None)
    if not callable(fn):
        raise JobError(f"--model {spec}: {module_name} has no callable {factory}",
                       "name a function (or class) that returns the nn.Module")
    return fn


def build_module(spec: str) -> torch.nn.Module:
    """Call the factory (under whatever default device the caller set, e.g. ``meta``)."""
    fn = load_factory(spec)
    try:
        module = fn()
    except TypeError as err:
        raise JobError(f"--model {spec}: the factory needs arguments ({err})",
                       "wrap it in a function without arguments that returns the model") from None
    if not isinstance(module, torch.nn.Module):
        raise JobError(f"--model {spec}: the factory returned {type(module).__name__}, "
                       "not a torch.nn.Module", "return the model itself (an nn.Module instance)")
    return module


def describe(module: torch.nn.Module, spec: str) -> SimpleNamespace:
    """A config-like description the rest of trainfit reads (vocabulary, width, depth), from the
    module's ``config`` attribute when it has one, else from its layers: the first
    ``nn.Embedding`` gives vocabulary and width, the longest ``nn.ModuleList`` the depth."""
    own = getattr(module, "config", None)
    emb = next((m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None)
    lists = [len(m) for m in module.modules() if isinstance(m, torch.nn.ModuleList)]
    vocab = getattr(own, "vocab_size", None) or (emb.num_embeddings if emb is not None else None)
    hidden = getattr(own, "hidden_size", None) or getattr(own, "n_embd", None) or (
        emb.embedding_dim if emb is not None else None)
    if not vocab or not hidden:
        raise JobError(f"--model {spec}: cannot tell the vocabulary size (no nn.Embedding and no "
                       "config.vocab_size)", "give the module a `config` with vocab_size and "
                       "hidden_size")
    # a learned position table (an embedding named pos*) bounds the sequence length
    pos = [m.num_embeddings for n, m in module.named_modules()
           if isinstance(m, torch.nn.Embedding) and n.rsplit(".", 1)[-1].startswith(("pos", "wpe"))]
    return SimpleNamespace(model_type="custom", vocab_size=int(vocab), hidden_size=int(hidden),
                           num_hidden_layers=int(max(lists, default=0)) or None,
                           max_position_embeddings=getattr(own, "max_position_embeddings", None)
                           or getattr(own, "block_size", None) or (pos[0] if pos else None),
                           supports_grad_ckpt=callable(
                               getattr(module, "gradient_checkpointing_enable", None)),
                           factory=spec)


def _logits(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise TypeError(f"the custom model returned {type(out).__name__}: expected logits "
                    "(a tensor, a tuple starting with it, or an object with .logits)")


class CausalLMAdapter(torch.nn.Module):
    """Calls the user's module as trainfit calls a transformers causal LM."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.fp32_outputs = False
        """``JobSpec.fp32_outputs``: the logits the module returns are upcast at once."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, **_: Any) -> Any:
        from transformers.modeling_outputs import CausalLMOutput

        # attention_mask is not passed on: a plain GPT takes token ids only; padded positions
        # carry label -100 and so add nothing to the loss
        logits = _logits(self.inner(input_ids))
        if self.fp32_outputs:
            logits = logits.float()
        loss = None
        if labels is not None:
            # transformers' ForCausalLMLoss: upcast, shift by one, mean over labelled tokens
            shift = logits[:, :-1, :].float()
            target = labels[:, 1:].to(shift.device)
            loss = torch.nn.functional.cross_entropy(shift.reshape(-1, shift.shape[-1]),
                                                     target.reshape(-1), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)
