"""Checkpoints published already quantized by bitsandbytes: ``quantization_config`` with
``quant_method: bitsandbytes`` in config.json (unsloth's ``*-bnb-4bit`` uploads, a model saved
after loading it in 4 bits).

``from_pretrained`` loads such a checkpoint 4-bit whatever the caller asks for (transformers'
bitsandbytes quantizer with ``pre_quantized=True``), so what trains is decided by the checkpoint:

* LoRA on it is QLoRA, in the checkpoint's format (nf4 / fp4, double-quantized or not);
* full fine-tuning cannot run: the packed uint8 weights take no gradient (transformers' Trainer
  refuses "purely quantized models" without adapters);
* the modules left 16-bit are its ``llm_int8_skip_modules`` and the class's
  ``_keep_in_fp32_modules``; when the list is stated, transformers adds no default skips (the
  output head, the tied embedding, the last module: ``HfQuantizer.get_modules_to_not_convert``,
  transformers 5.23 ``quantizers/base.py``);
* Llama-4's stacked experts are first unstacked into one ``nn.Linear`` per projection and expert
  (``MODULES_TO_PATCH_FOR_QUANTIZATION``, applied in ``preprocess_model`` only when
  ``pre_quantized``), so they are 4-bit. Quantized on the fly from a 16-bit checkpoint they stay
  16-bit, as every other stacked expert does (``replace_with_bnb_linear`` converts ``nn.Linear``
  only).

8-bit checkpoints (LLM.int8) are not modelled: planning them would need 8-bit weights and their
outlier columns, which trainfit does not simulate, so they are refused with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainfit.job import JobError
from trainfit.job.spec import JobSpec

if TYPE_CHECKING:  # torch only where a model is built: `emit` of a job file reads this module
    import torch


@dataclass(frozen=True, kw_only=True)
class StoredQuant:
    """How a checkpoint's weights are stored, as its ``quantization_config`` says."""

    quant: str
    """trainfit's name of the 4-bit format: nf4, nf4-dq (double-quantized scales), fp4."""
    skip_modules: tuple[str, ...] | None
    """``llm_int8_skip_modules``: the modules the checkpoint keeps 16-bit (transformers' patterns);
    None when not stated (transformers then skips the output head, tied and last modules)."""

    def describe(self) -> str:
        skip = "" if self.skip_modules is None else \
            f", {len(self.skip_modules)} module patterns kept 16-bit (llm_int8_skip_modules)"
        return f"bitsandbytes 4-bit {self.quant}{skip}"


def _get(q: Any, key: str, default: Any = None) -> Any:
    if isinstance(q, dict):
        return q.get(key, q.get("_" + key, default))
    return getattr(q, key, getattr(q, "_" + key, default))


def stored_quant(config: Any, where: str) -> StoredQuant | None:
    """The checkpoint's 4-bit bitsandbytes format from its ``quantization_config`` (None for a
    checkpoint stored unquantized, or quantized by another method: those load dequantized to
    fine-tune, :func:`trainfit.model.source.quantization_note`). An 8-bit checkpoint or a 4-bit
    type bitsandbytes does not have is refused (:class:`JobError`)."""
    q = getattr(config, "quantization_config", None)
    if not q or _get(q, "quant_method") != "bitsandbytes":
        return None
    if _get(q, "load_in_8bit", False):
        raise JobError(f"--model {where}: its checkpoint is stored 8-bit (bitsandbytes LLM.int8, "
                       "config.json's quantization_config); trainfit does not model 8-bit weights",
                       "plan the 16-bit original with --method lora, or a 4-bit checkpoint or "
                       "the original with --method qlora")
    if not _get(q, "load_in_4bit", False):
        return None
    kind = _get(q, "bnb_4bit_quant_type", "fp4")
    if kind not in ("nf4", "fp4"):
        raise JobError(f"--model {where}: quantization_config's bnb_4bit_quant_type {kind!r} is "
                       "not a bitsandbytes 4-bit type", "use a checkpoint with nf4 or fp4 weights")
    double = bool(_get(q, "bnb_4bit_use_double_quant", False))
    skip = _get(q, "llm_int8_skip_modules")
    # fp4 with double-quantized scales is planned as fp4 (fp32 scales: 0.4 bit per weight more,
    # the safe side), as the script front door maps it (script/mapping.py)
    return StoredQuant(quant="nf4-dq" if double and kind == "nf4" else kind,
                       skip_modules=None if skip is None else tuple(str(s) for s in skip))


def job_for_checkpoint(job: JobSpec, source: Any, fields: dict[str, Any],
                       say: Any = None) -> JobSpec:
    """The job as ``from_pretrained`` of a 4-bit checkpoint makes it: ``lora`` becomes ``qlora``
    (said through ``say``), ``qlora`` takes the checkpoint's format (a different ``--quant`` the
    user gave is said to be overridden), ``full`` is refused with the fix."""
    stored = getattr(source, "stored_quant", None)
    if stored is None or source.task == "custom-lm":
        return job
    where = source.name
    if job.method == "full":
        raise JobError(f"--method full on {where}: its weights are stored 4-bit "
                       f"({stored.describe()}) and 4-bit weights take no gradient",
                       "use --method qlora (LoRA over the 4-bit weights), or the 16-bit original "
                       "for full fine-tuning")
    if job.quant_lib != "bnb":
        raise JobError(f"--quant-lib {job.quant_lib} on {where}: its weights are bitsandbytes "
                       "4-bit, as stored", "drop --quant-lib (bnb)")
    changed = []
    if job.method == "lora":
        changed.append("--method lora on a checkpoint stored 4-bit is QLoRA: planned as "
                       f"--method qlora --quant {stored.quant}")
    elif "quant" in fields and job.quant != stored.quant:
        changed.append(f"--quant {job.quant}: the checkpoint's weights are {stored.quant}, as "
                       "stored; planned with those")
    if say is not None:
        for line in changed:
            say(f"model: {line}")
    if job.method == "qlora" and job.quant == stored.quant:
        return job
    return job.replace(method="qlora", quant=stored.quant)


def check_job(job: JobSpec, source: Any) -> None:
    """Refuse a job that cannot be what ``from_pretrained`` makes of the checkpoint (the
    simulation's own guard; the CLI first adapts the job with :func:`job_for_checkpoint`)."""
    stored = getattr(source, "stored_quant", None)
    if stored is None or source.task == "custom-lm":
        return
    if job.method != "qlora" or job.quant != stored.quant or job.quant_lib != "bnb":
        raise JobError(f"--method {job.method} on {source.name}: its weights are stored 4-bit "
                       f"({stored.describe()}), which from_pretrained loads as they are",
                       f"use --method qlora --quant {stored.quant}")


def patched_expert_classes(source: Any, method: str) -> frozenset[str]:
    """Names of the expert classes transformers unstacks into ``nn.Linear`` layers before it
    quantizes this checkpoint (Llama-4's ``Llama4TextExperts``): only a pre-quantized bitsandbytes
    checkpoint loaded for QLoRA; empty otherwise."""
    if method != "qlora" or getattr(source, "stored_quant", None) is None:
        return frozenset()
    return unstacked_when_stored()


def unstacked_when_stored() -> frozenset[str]:
    """The expert classes transformers unstacks for a bitsandbytes checkpoint stored 4-bit."""
    from transformers.quantizers.base import MODULES_TO_PATCH_FOR_QUANTIZATION

    return frozenset(name for name, how in MODULES_TO_PATCH_FOR_QUANTIZATION.items()
                     if "bitsandbytes" in [str(getattr(m, "value", m))
                                           for m in how["quantization_methods"]])


def unstack_experts(model: torch.nn.Module, classes: frozenset[str]) -> int:
    """Replace each module of ``classes`` by the module transformers puts in its place
    (``SequentialLlama4TextExperts``: one ``Llama4TextMLP`` per expert), built on the meta device
    from the model's text config as ``_convert_model_for_quantization`` does; returns how many."""
    if not classes:
        return 0
    import torch
    from transformers.quantizers.base import MODULES_TO_PATCH_FOR_QUANTIZATION

    text = model.config.get_text_config()
    count = 0
    for name, module in list(model.named_modules()):
        kind = type(module).__name__
        if kind not in classes or not name:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        dtype = next(module.parameters()).dtype
        with torch.device("meta"):
            new = MODULES_TO_PATCH_FOR_QUANTIZATION[kind]["module_name"](text)
        parent._modules[child] = new.to(dtype)
        count += 1
    return count


def hf_module_name(peft_name: str) -> str:
    """A module's name as transformers' quantizer sees it (before peft wraps the model): without
    peft's ``base_model.model.`` prefix and its LoRA layers' ``.base_layer``."""
    name = peft_name.removeprefix("base_model.model.")
    return name.replace(".base_layer", "")


def keeps_16bit(peft_name: str, patterns: list[str]) -> bool:
    """Whether transformers leaves the module 16-bit under ``patterns`` (its own matcher:
    ``should_convert_module``, prefix at a module boundary, regex, or suffix)."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    return not should_convert_module(hf_module_name(peft_name), patterns)
