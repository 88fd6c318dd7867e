"""Map the portable LoRA target aliases (q,k,v,o,mlp,lm_head,all-linear) to module names.

Architectures name their projections differently (Llama ``q_proj``, BERT ``query``, T5 ``q``,
GPT-2's fused ``c_attn`` Conv1D, Falcon/NeoX ``query_key_value``).  We classify every linear layer
of the built model by where it sits (inside an attention block or not) and its leaf name, so a new
architecture works without a table entry.  A fused q/k/v projection is adapted when any of q, k, v
is asked for (PEFT cannot adapt a third of a fused matrix); likewise the shared k/v projections
of multi-head latent attention when k or v is.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Iterable

import torch

from trainfit.job import LORA_ALIASES, JobError

_ATTN_PARTS = ("attn", "attention", "self_attn", "selfattention", "encdecattention", "mixer.attn")
_Q = {"q_proj", "query", "q", "wq", "q_lin"}
_K = {"k_proj", "key", "k", "wk", "k_lin"}
_V = {"v_proj", "value", "v", "wv", "v_lin"}
_O = {"o_proj", "out_proj", "dense", "o", "c_proj", "wo", "out_lin", "dense_out"}
_QKV = {"c_attn", "query_key_value", "qkv_proj", "wqkv", "qkv", "in_proj"}
# multi-head latent attention (DeepSeek-V2/V3, Kimi): q through a low-rank pair, k and v both
# from one compressed projection and its up-projection
_Q_LATENT = {"q_a_proj", "q_b_proj"}
_KV = {"kv_a_proj_with_mqa", "kv_b_proj"}


def _linear_types() -> tuple[type, ...]:
    types: list[type] = [torch.nn.Linear]
    try:
        from transformers.pytorch_utils import Conv1D

        types.append(Conv1D)
    except ImportError:  # pragma: no cover - transformers always has it
        pass
    return tuple(types)


def classify_linears(model: torch.nn.Module) -> dict[str, str]:
    """Full module name → one of q,k,v,o,qkv,kv,mlp,lm_head,other."""
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kinds: dict[str, str] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, _linear_types()):
            continue
        if mod is out_emb or name.split(".")[-1] in ("lm_head", "embed_out", "output_layer"):
            kinds[name] = "lm_head"
            continue
        parts = name.lower().split(".")
        leaf = parts[-1]
        in_attn = any(p in _ATTN_PARTS or "attention" in p or p.endswith("attn") for p in parts[:-1])
        if in_attn and leaf in _QKV:
            kinds[name] = "qkv"
        elif in_attn and leaf in _KV:
            kinds[name] = "kv"
        elif in_attn and (leaf in _Q or leaf in _Q_LATENT):
            kinds[name] = "q"
        elif in_attn and leaf in _K:
            kinds[name] = "k"
        elif in_attn and leaf in _V:
            kinds[name] = "v"
        elif in_attn and (leaf in _O or (len(parts) > 1 and parts[-2] == "output")):
            kinds[name] = "o"
        elif "classifier" in parts or "score" in parts or "pooler" in parts:
            kinds[name] = "other"
        else:
            kinds[name] = "mlp"
    return kinds


def _leafs(names: Iterable[str]) -> str:
    """The distinct last components of module names, sorted, comma-separated."""
    return ", ".join(sorted({n.split(".")[-1] for n in names}))


def import_peft() -> None:
    """Import peft — and through it bitsandbytes — in a thread of its own, whose stack holds
    nothing of the caller's.  bitsandbytes logs a failed optional import with the exception as
    the record's argument; a logging handler that keeps its records (pytest's log capture does)
    then keeps the traceback's frames alive and, imported in the caller's thread, every frame
    above them too: a simulation's model and tracker stayed alive, their frees went missing from
    the allocator trace, and a plan row's depth extrapolation failed under pytest only.  An
    import error is raised again by the caller's own import."""
    if "peft" not in sys.modules:
        worker = threading.Thread(target=_import_quietly, args=("peft",), name="import-peft")
        worker.start()
        worker.join()


def _import_quietly(name: str) -> None:
    with contextlib.suppress(ImportError):
        importlib.import_module(name)


PEFT_MAMBA_TYPES = {"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"}
PEFT_MAMBA_REFUSED = {"out_proj", "conv1d"}
"""peft 0.21's ``_check_lora_target_modules_mamba`` (tuners/tuners_utils.py): LoRA on these
modules of these architectures raises. Mirrored so that all-linear adapts the rest, and the hint
never suggests them (an audit: the hint named out_proj, which then ended in peft's ValueError)."""
MAMBA_UNCALLED = {"dt_proj"}
"""Modules transformers' Mamba mixer never calls: it reads ``dt_proj.weight`` itself
(``MambaMixer``'s ``cuda_kernels_forward`` and ``slow_forward``), so a LoRA adapter there gets
no gradient (an audit: its lora_B stayed 0 while counted as trained). Left out of all-linear."""


def peft_default_targets(model_type: str) -> list[str] | None:
    """peft's default ``target_modules`` for ``model_type`` (None: it has none and asks)."""
    import_peft()
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as M

    return list(M[model_type]) if model_type in M else None


def resolve_targets(model: torch.nn.Module, targets: list[str], model_type: str) -> list[str] | str:
    """Turn the job's ``lora_targets`` into what ``peft.LoraConfig(target_modules=...)`` takes:
    ``default`` is peft's default for the model type, or q, v where peft has none."""
    defaulted = targets == ["default"]
    if defaulted:
        if (peft_own := peft_default_targets(model_type)) is not None:
            return peft_own
        targets = ["q", "v"]
    mamba = model_type in PEFT_MAMBA_TYPES
    if targets == ["all-linear"] and not mamba:
        return "all-linear"
    kinds = classify_linears(model)
    if mamba:  # what peft refuses is never a target, nor suggested as one
        kinds = {n: k for n, k in kinds.items()
                 if n.rsplit(".", 1)[-1] not in PEFT_MAMBA_REFUSED | MAMBA_UNCALLED}
    names: list[str] = []
    aliases = [t for t in targets if t in LORA_ALIASES]
    literal = [t for t in targets if t not in LORA_ALIASES]
    for name, kind in kinds.items():
        want = ("all-linear" in aliases and kind != "lm_head") or kind in aliases or (
            kind == "qkv" and any(a in aliases for a in ("q", "k", "v"))) or (
            kind == "kv" and any(a in aliases for a in ("k", "v")))
        if want:
            names.append(name)
    for lit in literal:
        hits = [n for n in kinds if n == lit or n.endswith("." + lit)]
        if not hits:
            raise JobError(f"--lora-targets {lit}: no linear layer of this model is named so",
                           f"its linear layers are: {_leafs(kinds)} (or use q,k,v,o,mlp,"
                           "lm_head,all-linear)")
        names.extend(hits)
    if not names:
        leafs = _leafs(n for n, k in kinds.items() if k != "lm_head")
        if defaulted:
            # no --lora-targets given: peft has no default for this architecture and it has no
            # attention projections to take instead (Mamba)
            raise JobError(f"LoRA targets: peft has no default for {model_type} and it has no "
                           "query/value projections", f"give --lora-targets: all-linear, or some "
                           f"of its linear layers: {leafs}")
        raise JobError(f"--lora-targets {','.join(targets)}: matches no layer of this model",
                       f"use all-linear or name the modules (its linear layers: {leafs})")
    return sorted(set(names))
