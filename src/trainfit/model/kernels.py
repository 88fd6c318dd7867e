"""Kernels a model's transformers code takes from an optional package when it is installed, and
which of them this simulation runs as transformers' PyTorch fallback instead.

transformers 5 marks such functions with ``use_kernel_func_from_hub_with_fallback(name, package)``
(transformers/integrations/hub_kernels.py): the package's implementation when it imports (Mamba's
``mamba_ssm`` selective scan, ``causal_conv1d``, flash-linear-attention's ``fla`` for gated
delta rules), else the function's own PyTorch body.  A GPU with the package runs a fused CUDA
kernel; without it — and on this CPU, where the step is simulated — the PyTorch body: Mamba-1's
is a loop over the sequence (a 130 M model at 256 tokens predicted at 54 s per step on a T4, a
QA run).  The simulation can only run what imports here, so the plan says which path its numbers
are of rather than present the fallback's as the GPU's.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from typing import Any

_FALLBACK_RE = re.compile(
    r"use_kernel_func_from_hub_with_fallback\(\s*[\"'](\w+)[\"']\s*,\s*[\"']([\w.]+)[\"']")


@functools.lru_cache(maxsize=64)
def fallback_kernels(model_type: str) -> tuple[tuple[str, str], ...]:
    """(function, package) pairs of ``model_type``'s modeling code whose package does not import
    here: the functions run as their PyTorch fallback in the simulation."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    # a text config's type names its model's module (qwen3_5_text → models/qwen3_5)
    module = model_type_to_module_name(model_type)
    try:
        source = inspect.getsource(importlib.import_module(
            f"transformers.models.{module}.modeling_{module}"))
    except (ImportError, OSError, TypeError):  # another layout, remote code: nothing to say
        return ()
    return tuple((func, package) for func, package in dict.fromkeys(_FALLBACK_RE.findall(source))
                 if not _imports(package))


@functools.lru_cache(maxsize=16)
def _imports(package: str) -> bool:
    """Whether ``package`` imports here — as transformers tries it (``import_module``): one
    installed but failing to import (mamba_ssm without CUDA) is a fallback too."""
    try:
        importlib.import_module(package)
    except Exception:  # any failure to import is transformers' fallback
        return False
    return True


def fallback_note(config: Any) -> str:
    """The plan's sentence on kernels simulated as their PyTorch fallback ("" when none)."""
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str):
        return ""
    found = fallback_kernels(model_type)
    if not found:
        return ""
    packages = " / ".join(sorted({p.split(".")[0] for _, p in found}))
    funcs = ", ".join(f for f, _ in found)
    return (f"{model_type}: transformers takes some of its kernels from {packages} when "
            f"installed ({funcs}); they do not import here, so the step is simulated with "
            f"transformers' PyTorch fallbacks — memory and speed are what a GPU without "
            f"{packages} runs; with them, the fused kernels' (usually less memory, faster) are "
            "not predicted")
