"""What ``tune`` hands on: ``trainfit.yaml`` (read by ``trainfit train``; a comment on each knob's
effect and the measured numbers), HF ``TrainingArguments`` / TRL ``SFTConfig`` keyword arguments,
and an accelerate config for many ranks."""

from __future__ import annotations

from typing import Any

import yaml

from trainfit.job import JobSpec

KNOB_COMMENTS = {
    "micro_batch": "samples per forward/backward; larger = faster kernels, more activation memory",
    "grad_accum": "micro-batches per optimizer step (effective batch = micro × accum × ranks)",
    "effective_batch": "samples per optimizer step over all ranks: what the optimizer sees",
    "precision": "amp-bf16/amp-fp16 halve activation memory and use tensor cores; fp32 is slowest",
    "grad_ckpt": "full reduces activation memory ~L×, ~30 % slower (forward recomputed)",
    "attention": "sdpa picks flash/memory-efficient kernels; eager materialises T×T scores",
    "optimizer": "adamw keeps 2 fp32 states per weight (8 B); 8-bit variants keep 2 B "
                 "(tensors under 4096 elements keep fp32 states)",
    "optimizer_impl": "fused = one kernel for all weights (fastest); foreach = grouped; forloop",
    "num_workers": "data-loader processes; 0 loads in the training process (GPU waits)",
    "prefetch_factor": "batches each worker prepares ahead",
    "pin_memory": "True: page-locked batches, asynchronous host→GPU copies (more host RAM)",
    "persistent_workers": "True keeps workers between epochs (no restart cost, RAM held)",
    "compile": "True: torch.compile — faster steps after a one-off compile",
    "seq_len": "tokens per sample; activation memory grows with it (attention: quadratically "
               "without flash)",
    "max_grad_norm": "gradient clipping threshold (None: off)",
}


def job_yaml(job: JobSpec, *, measured: dict[str, Any] | None = None, device: str | None = None,
             memory_limit_bytes: int | None = None, header: list[str] | None = None) -> str:
    """The job as YAML, one comment per knob, and what tune measured (a file-only section)."""
    lines = [f"# {h}" for h in (header or [])]
    for key, value in job.to_dict().items():
        text = yaml.safe_dump({key: value}, default_flow_style=True, width=1000).strip()
        text = text[1:-1] if text.startswith("{") else text
        comment = KNOB_COMMENTS.get(key)
        lines.append(f"{text}  # {comment}" if comment else text)
    if device is not None:
        lines.append(f"device: {device}  # where tune measured")
    if memory_limit_bytes is not None:
        lines.append(f"memory_limit: {memory_limit_bytes}  # bytes the pick had to fit in")
    if measured:
        lines.append("measured:  # by trainfit tune on the device above (bytes, seconds)")
        for k, v in measured.items():
            if k != "step_times_s":
                lines.append(f"  {k}: {yaml.safe_dump(v, default_flow_style=True).strip()}"
                             .replace("\n...", ""))
    return "\n".join(lines) + "\n"


_HF_OPTIM = {("adamw", "fused"): "adamw_torch_fused", ("adamw", "foreach"): "adamw_torch",
             ("adamw", "forloop"): "adamw_torch", ("adamw-8bit", None): "adamw_bnb_8bit",
             ("paged-adamw", None): "paged_adamw_32bit", ("paged-adamw-8bit", None): "paged_adamw_8bit",
             ("adafactor", None): "adafactor", ("sgd", None): "sgd"}


def hf_training_args(job: JobSpec) -> dict[str, Any]:
    """``transformers.TrainingArguments`` keyword arguments for the same knobs."""
    optim = _HF_OPTIM.get((job.optimizer, job.optimizer_impl)) or _HF_OPTIM[(job.optimizer, None)]
    kw: dict[str, Any] = {
        "per_device_train_batch_size": job.micro_batch,
        "gradient_accumulation_steps": job.grad_accum,
        "bf16": job.precision in ("amp-bf16", "bf16-true"),
        "fp16": job.precision == "amp-fp16",
        "gradient_checkpointing": job.grad_ckpt == "full",
        "optim": optim,
        "learning_rate": job.lr,
        "max_grad_norm": job.max_grad_norm if job.max_grad_norm is not None else 0.0,
        "dataloader_num_workers": job.num_workers,
        "dataloader_pin_memory": job.pin_memory,
        "dataloader_persistent_workers": job.persistent_workers,
        "torch_compile": job.compile,
        "seed": job.seed,
    }
    if job.num_workers > 0:
        kw["dataloader_prefetch_factor"] = job.prefetch_factor
    if job.grad_ckpt == "full":
        kw["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    return kw


def trl_sft_config(job: JobSpec) -> dict[str, Any]:
    """``trl.SFTConfig`` keyword arguments (TrainingArguments + sequence settings)."""
    kw = hf_training_args(job)
    kw["max_length"] = job.seq_len
    kw["packing"] = bool(job.packing)
    return kw


def accelerate_config(job: JobSpec) -> dict[str, Any]:
    """An accelerate config (``accelerate launch --config_file``) for ``job.ranks`` processes."""
    mp = {"amp-bf16": "bf16", "bf16-true": "bf16", "amp-fp16": "fp16"}.get(job.precision or "", "no")
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP" if job.sharding == "fsdp" else "MULTI_GPU",
        "num_machines": 1, "machine_rank": 0, "num_processes": job.ranks,
        "mixed_precision": mp, "gpu_ids": "all", "main_training_function": "main",
        "rdzv_backend": "static", "same_network": True, "use_cpu": False,
    }
    if job.sharding == "fsdp":
        cfg["fsdp_config"] = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                              "fsdp_reshard_after_forward": True,
                              "fsdp_activation_checkpointing": job.grad_ckpt == "full"}
    return cfg
