"""What ``plan`` checks before it predicts anything: the precisions a GPU supports, bitsandbytes
where the job needs it, and the plan's own options (epochs, dataset size, margin) — each failure a
:class:`~trainfit.job.JobError` that names the fix."""

from __future__ import annotations

import importlib.util
from typing import Any

from trainfit.hardware.gpus import GpuSpec
from trainfit.job import PRECISIONS, JobError, JobSpec


def supported_precisions(gpu: GpuSpec | None) -> list[str]:
    if gpu is None or gpu.bf16_supported:
        return list(PRECISIONS)
    return ["fp32", "amp-fp16"]


def grid_precisions(gpu: GpuSpec | None, job: JobSpec | None = None
                    ) -> tuple[list[str], list[str]]:
    """The precisions plan's grid varies when the user fixed none, and those it leaves out.

    On a catalog GPU with bf16 whose fp16 and bf16 tensor-core rates are the same known figure
    (every Ampere, Ada and Hopper card: NVIDIA's datasheets, the GPU catalog) amp-fp16 is left
    out: autocast casts the same operations to 2 bytes as amp-bf16 does (torch's CUDA autocast
    op lists are one list for both dtypes), so the rows hold the same tensors — on dense models
    to the byte but GradScaler's few scalars, and a step slower by its unscale of every gradient
    (tests/plan/test_plan.py); a tiny Mixtral's came out 6.6 % above amp-bf16's, never below —
    and amp-fp16 adds loss scaling's skipped steps.
    Planned, its groups cost a quarter of the plan's time for rows that could not win;
    ``--precision amp-fp16`` still plans it.  A generic card (rates unknown) keeps it.

    Under ZeRO-2/3 over ranks (``job``) bf16-true is left out too: DeepSpeed's bf16 mode is one
    mode, the module in bf16 with an fp32 master partition (memory/zero.compute_job), whether
    asked as amp-bf16 or bf16-true — its group was amp-bf16's to the byte (an audit).

    Under ``--attention flash-attention-2`` fp32 is left out: FlashAttention-2 cannot run it
    (:data:`trainfit.job.combinations.FLASH_ATTENTION_2_DTYPES_NOTE`)."""
    got = supported_precisions(gpu)
    left: list[str] = []
    rates = gpu.peak_tflops if gpu is not None else {}
    same_rate = rates.get("fp16") is not None and rates.get("fp16") == rates.get("bf16")
    if gpu is not None and gpu.bf16_supported and same_rate:
        left.append("amp-fp16")
    if job is not None and job.sharding.startswith("zero") and job.ranks > 1 and \
            "bf16-true" in got:
        left.append("bf16-true")
    if job is not None and job.attention == "flash-attention-2":
        left.append("fp32")
    return [p for p in got if p not in left], left


def fsdp_keeps_fp32_weights(job: JobSpec, source: Any) -> bool:
    """Full fine-tuning under FSDP over ranks of a model whose loader keeps trainable weights in
    fp32 in bf16 (``_keep_in_fp32_modules_strict``: MoE routers): bf16-true cannot run it (FSDP2
    wants one dtype for a layer's trainable weights; model/loaded_dtypes.py), so the grid leaves
    it out (a review: the whole plan ended in FSDP's AssertionError)."""
    import torch

    from trainfit.model.loaded_dtypes import fsdp_full_fine_tuning, kept_fp32_names
    from trainfit.model.workload import bare_model_on_meta

    if not fsdp_full_fine_tuning(job):
        return False

    model = bare_model_on_meta(source)
    if model is None:
        return False
    params = dict(model.named_parameters())
    return any(n in params for n in kept_fp32_names(model, torch.bfloat16))


def check_bitsandbytes(job: JobSpec) -> None:
    """QLoRA and bnb optimizers need bitsandbytes where the job will run; say so before planning
    (the plan itself uses data-less twins of bnb's layers and optimizers)."""
    needs = job.method == "qlora" or job.optimizer in ("adamw-8bit", "paged-adamw",
                                                       "paged-adamw-8bit")
    if needs and importlib.util.find_spec("bitsandbytes") is None:
        what = "--method qlora" if job.method == "qlora" else f"--optimizer {job.optimizer}"
        raise JobError(f"{what} needs bitsandbytes, which is not installed",
                       "pip install bitsandbytes (or: pip install 'trainfit[qlora]')")


FLASH_ATTENTION_2_MIN_CC = (8, 0)
"""flash-attn 2's README: FlashAttention-2 supports Ampere, Ada and Hopper GPUs; Turing (T4,
RTX 2080) only in FlashAttention 1.x, Volta not at all."""


def check_flash_attention_gpu(job: JobSpec, gpu: GpuSpec | None) -> None:
    """``--attention flash-attention-2`` on a card FlashAttention-2 does not build for (its
    compute capability known: a generic card's is not)."""
    cc = gpu.compute_capability if gpu is not None else None
    if job.attention != "flash-attention-2" or not cc:
        return
    if tuple(int(x) for x in cc.split(".")[:2]) < FLASH_ATTENTION_2_MIN_CC:
        raise JobError(f"--attention flash-attention-2 on {gpu.display_name} (compute capability "
                       f"{cc}): FlashAttention-2 runs on Ampere or newer (8.0+)",
                       "use --attention sdpa (torch's SDPA picks its memory-efficient kernel on "
                       "this card)")


def check_precision(job: JobSpec, gpu: GpuSpec | None) -> None:
    if job.precision and gpu is not None and "bf16" in job.precision and not gpu.bf16_supported:
        raise JobError(f"--precision {job.precision}: {gpu.display_name} has no bf16 support",
                       "use --precision amp-fp16 (fp16 autocast with a GradScaler) or fp32")


def check_inputs(job: JobSpec, gpu: GpuSpec | None, margin: float, dataset_tokens: int | None,
                 epochs: float | None) -> None:
    if epochs is not None and dataset_tokens is None:
        raise JobError(f"--epochs {epochs:g} needs the dataset size",
                       "add --dataset-tokens N (tokens in one epoch)")
    if epochs is not None and not 0 < epochs < float("inf"):  # inf: "Infinity" in --json
        raise JobError(f"--epochs {epochs:g}: must be a finite number > 0", "e.g. --epochs 1")
    if dataset_tokens is not None and dataset_tokens <= 0:
        raise JobError(f"--dataset-tokens {dataset_tokens}: must be ≥ 1",
                       "the tokens in one epoch, e.g. --dataset-tokens 50000000")
    check_precision(job, gpu)
    check_flash_attention_gpu(job, gpu)
    check_bitsandbytes(job)
    if not 0.0 <= margin < 1.0:
        raise JobError(f"--margin {margin}: must be in [0, 1)", "e.g. --margin 0.1 for 10 %")
