"""The job's closed vocabularies (the values each choice field takes) and its one error type:
what :class:`trainfit.job.spec.JobSpec` validates against, apart from the dataclass itself."""

from __future__ import annotations

import difflib
from typing import Any

METHODS = ("full", "lora", "qlora")
QUANTS = ("nf4", "nf4-dq", "fp4")
QUANT_LIBS = ("bnb", "torchao", "torchao-0.1")
PRECISIONS = ("fp32", "amp-fp16", "amp-bf16", "bf16-true")
OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "adafactor", "sgd")
SGD_MOMENTUM = 0.9
"""trainfit's SGD momentum (JobSpec.sgd_momentum's default; another is SGD's alone)."""
OPTIMIZER_IMPLS = ("forloop", "foreach", "fused")
GRAD_CKPT = ("off", "full", "selective")
ATTENTIONS = ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-math", "eager", "flash-attention-2")
TRANSFORMERS_ATTENTION = {"sdpa": "sdpa", "sdpa-flash": "sdpa", "sdpa-efficient": "sdpa",
                          "sdpa-math": "sdpa", "eager": "eager",
                          "flash-attention-2": "flash_attention_2"}
"""Each ``--attention`` as transformers' ``attn_implementation`` (the sdpa-* kernel preferences
are SDPA, picked with ``torch.nn.attention.sdpa_kernel``)."""
SHARDINGS = ("none", "fsdp", "zero2", "zero3")
OFFLOADS = ("none", "optimizer", "all")
ENGINE_OFFLOADS = {"none": ("none",), "fsdp": ("none", "all"), "zero2": ("none", "optimizer"),
                   "zero3": ("none", "optimizer", "all")}
"""The offloads each sharding engine offers, least first: FSDP's CPUOffload moves the
parameters with the optimizer step, ZeRO-2 only the optimizer, ZeRO-3 either."""
ENGINE_NAMES = {"none": "DDP", "fsdp": "FSDP", "zero2": "DeepSpeed ZeRO-2",
                "zero3": "DeepSpeed ZeRO-3"}
BASE_DTYPES = ("auto", "fp32", "bf16", "fp16")
REDUCE_DTYPES = ("fp32", "param")
FSDP_INITS = ("sharded", "wrap", "wrap-sync")
FSDP_VERSIONS = ("auto", "1", "2")
ROPE_CACHES = ("none", "fp32", "bf16", "fp16")
PADDINGS = ("none", "longest", "always")
LORA_ALIASES = ("q", "k", "v", "o", "mlp", "lm_head", "all-linear")


DEFAULT_MARGIN = 0.10
"""Fraction of the capacity (GPU memory, or tune's --memory-limit) a configuration leaves free to
count as fitting: fits = peak ≤ (1 − margin) × capacity. 10 % covers what neither the prediction nor
a short probe sees (allocator behaviour under pressure, NCCL buffers, longer batches at run time)."""


class JobError(ValueError):
    """Bad input: ``str(err)`` is one line naming what is wrong; ``hint`` says how to fix it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


NOT_MODELLED = {("sharding", "zero1"): "ZeRO-1 is not modelled: a rank holds between "
                "--sharding zero2 (gradients partitioned too: less) and --sharding none "
                "(nothing partitioned: more) — plan both to bound it",
                ("sharding", "ddp"): "several ranks without sharding are DDP: --sharding none "
                "with --ranks N"}
"""Values people type that trainfit knows are not among the choices: what to use instead (a
review: `--sharding zero1` was asked "did you mean 'zero3'?")."""


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        if (hint := NOT_MODELLED.get((name, str(value).lower()))) is not None:
            raise JobError(f"{_flag(name)} {value!r}: must be one of {', '.join(allowed)}", hint)
        close = difflib.get_close_matches(str(value).lower(), allowed, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose one of {', '.join(allowed)}"
        raise JobError(f"{_flag(name)} {value!r}: must be one of {', '.join(allowed)}", hint)
