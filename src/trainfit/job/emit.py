"""What ``tune`` hands on besides the tuned file (:mod:`trainfit.job.tuned_file`): HF
``TrainingArguments`` / TRL ``SFTConfig`` keyword arguments, and an accelerate config
(``accelerate launch --config_file``).

The translations take the job and the device it was tuned for, and nothing else: ``trainfit emit
FILE`` reads a tuned file and prints them without importing torch (under 2 s). Each payload holds
only settings the target library accepts as given (tests construct them with the real
``TrainingArguments``, ``SFTConfig`` and accelerate's config loader); what the job sets that is not
a field of the target (the attention kernel, LoRA, 4-bit loading, a bf16 model) is returned beside
it as :class:`ScriptSetting` s, for the script to set.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import yaml

from trainfit import json_text
from trainfit.job.script_settings import ScriptSetting, checkpointing_name, script_settings
from trainfit.job.spec import JobError, JobSpec

TARGETS = ("hf", "trl", "accelerate")
"""What ``trainfit emit --to`` and ``trainfit tune --emit`` translate a job into."""

@dataclass(frozen=True)
class Emitted:
    """One translation of a job: the payload exactly as the target reads it, and the rest."""

    target: str
    """hf | trl | accelerate"""
    payload: dict[str, Any]
    """TrainingArguments / SFTConfig keyword arguments, or an accelerate config."""
    device: str
    """cpu | cuda (the device the job was tuned for; ``use_cpu`` follows it)."""
    transformers_version: str | None
    """The version the names are for (None: transformers not installed here)."""
    trl_version: str | None = None
    """For ``trl``: the TRL whose SFTConfig adds its own names to transformers' (None: not
    installed here, or another target)."""
    script: list[ScriptSetting] = field(default_factory=list)
    """What the job sets that the payload cannot carry."""
    unstated: list[str] = field(default_factory=list)
    """Job fields the file leaves open that the payload would need (e.g. ``packing``)."""
    recipe: dict[str, Any] = field(default_factory=dict)
    """The learning rate, seed and weight decay (where one) the file states (no payload carries
    them: said, not set)."""

    def text(self) -> str:
        """What goes on stdout: JSON for hf/trl (``TrainingArguments(**json.load(f))``), YAML for
        accelerate (``accelerate launch --config_file``)."""
        if self.target == "accelerate":
            return commented_yaml(self.payload)
        return json_text.dumps(self.payload, indent=1) + "\n"


ACCELERATE_COMMENTS = {
    "distributed_type": "NO one process; MULTI_GPU DDP (the whole model on every GPU); FSDP / "
                        "DEEPSPEED shard it (less memory per GPU, more communication)",
    "mixed_precision": "bf16/fp16 autocast: ~half the activation memory, faster matmuls; no = "
                       "fp32 throughout",
    "num_processes": "one process per GPU: the ranks the job was planned for",
    "use_cpu": "true: runs on the CPU (emit sets it for a job tuned or emitted for the CPU)",
    "gpu_ids": "which GPUs the processes use",
    "dynamo_config": "torch.compile: fused kernels, faster steps after a one-time compile (often "
                     "minutes: typical, not predicted here)",
    "zero_stage": "2 shards optimizer states and gradients; 3 shards the weights too (least "
                  "memory, most communication)",
    "gradient_accumulation_steps": "micro-steps per optimizer step: the effective batch over "
                                   "the micro-batch and ranks",
    "gradient_clipping": "max gradient norm (0.0: no clipping)",
    "offload_optimizer_device": "cpu keeps the fp32 master and optimizer states in host RAM: "
                                "far less GPU memory, a slower step",
    "offload_param_device": "cpu keeps the weight partitions in host RAM (ZeRO-3): least GPU "
                            "memory, the slowest step",
    "zero3_init_flag": "true builds the model already partitioned (ZeRO-3): no whole copy per "
                       "GPU at load",
    "zero3_save_16bit_model": "true gathers a whole 16-bit model when saving (ZeRO-3)",
    "fsdp_version": "1 FullyShardedDataParallel (flat parameters); 2 fully_shard (per-parameter "
                    "DTensors)",
    "fsdp_auto_wrap_policy": "each transformer block its own FSDP unit: one block's weights "
                             "gathered at a time",
    "fsdp_reshard_after_forward": "true frees each block's gathered weights after its forward "
                                  "(less memory, a second all-gather in the backward)",
    "fsdp_activation_checkpointing": "true recomputes each block's activations in the backward: "
                                     "far less memory, ~30 % slower (typical, not predicted "
                                     "here: trainfit plan predicts it)",
    "fsdp_offload_params": "true keeps the sharded weights, gradients and optimizer in host RAM: "
                           "least GPU memory, much slower",
    "fsdp_sync_module_states": "true broadcasts rank 0's weights at wrap time (needed with "
                               "cpu_ram_efficient_loading)",
    "fsdp_cpu_ram_efficient_loading": "true loads the weights on rank 0 only: one host copy "
                                      "instead of one per process",
    "fsdp_use_orig_params": "true keeps the model's own parameter names (needed with frozen "
                            "weights, LoRA)",
}
"""The effect of each accelerate config key emit writes, as a comment beside it (the project's
rule for generated YAML; accelerate's own ``config`` questionnaire words these)."""


def commented_yaml(payload: dict[str, Any]) -> str:
    """``payload`` as YAML with :data:`ACCELERATE_COMMENTS` beside their keys; the comments are
    YAML comments, so ``yaml.safe_load`` reads back ``payload`` exactly."""
    plain = yaml.safe_dump(payload, sort_keys=False, width=float("inf"))
    raw = plain.splitlines()
    lines = []
    for i, line in enumerate(raw):
        key = line.strip().split(":", 1)[0]
        note = ACCELERATE_COMMENTS.get(key)
        # a value that goes on to the next line (a block or a folded string) takes no comment:
        # it would land inside the value (a review)
        nxt = raw[i + 1] if i + 1 < len(raw) else ""
        indent = len(line) - len(line.lstrip())
        goes_on = bool(nxt.strip()) and len(nxt) - len(nxt.lstrip()) > indent and \
            not line.rstrip().endswith(":")
        single = ":" in line and not goes_on and not line.rstrip().endswith(("|", ">", "|-", ">-"))
        lines.append(f"{line}  # {note}" if note and single else line)
    out = "\n".join(lines) + "\n"
    # what is read back is the payload, or the file goes without comments
    try:
        return out if yaml.safe_load(out) == payload else plain
    except yaml.YAMLError:
        return plain


def installed_version(dist: str) -> str | None:
    """The installed distribution's version, read from its metadata (no import of the package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def device_kind(device: str | None) -> str:
    """cpu | cuda: ``device`` as a tuned file states it (cpu, cuda, cuda:1 ...; None → cuda, where
    a job without a stated device is meant to run)."""
    # cuda or cuda:N only ("cudagarbage" was read as cuda: an audit)
    if device is None or re.fullmatch(r"cuda(:\d+)?", str(device)):
        return "cuda"
    if str(device) == "cpu":
        return "cpu"
    raise JobError(f"device {device!r}: unknown", "use cpu, cuda or cuda:N")


_HF_OPTIM = {("adamw", "fused"): "adamw_torch_fused", ("adamw", "foreach"): "adamw_torch",
             ("adamw", "forloop"): "adamw_torch", ("adamw-8bit", None): "adamw_bnb_8bit",
             ("paged-adamw", None): "paged_adamw_32bit", ("paged-adamw-8bit", None): "paged_adamw_8bit",
             ("adafactor", None): "adafactor", ("sgd", None): "sgd"}


def hf_training_args(job: JobSpec, *, device: str = "cuda",
                     transformers_version: str | None = None) -> dict[str, Any]:
    """``transformers.TrainingArguments`` keyword arguments for the same knobs on ``device``
    (cpu | cuda). ``bf16``/``fp16`` are autocast (amp-*); a bf16-true job loads its weights in
    bf16 instead (a :class:`ScriptSetting`), with no autocast on top."""
    optim = _HF_OPTIM.get((job.optimizer, job.optimizer_impl)) or _HF_OPTIM[(job.optimizer, None)]
    ckpt = checkpointing_name(transformers_version)
    kw: dict[str, Any] = {
        "per_device_train_batch_size": job.micro_batch,
        # the library's 8 could pass the memory the tuned micro-batch fits in (an evaluation
        # holds no gradients or states, but its activations are per sample as the training's)
        "per_device_eval_batch_size": job.micro_batch,
        "gradient_accumulation_steps": job.grad_accum,
        "bf16": job.precision == "amp-bf16",
        "fp16": job.precision == "amp-fp16",
        ckpt: job.grad_ckpt == "full",
        "optim": optim,
        "max_grad_norm": job.max_grad_norm if job.max_grad_norm is not None else 0.0,
        "dataloader_num_workers": job.num_workers,
        "dataloader_pin_memory": job.pin_memory,
        # DataLoader refuses persistent workers without workers (a ValueError at the first epoch)
        "dataloader_persistent_workers": job.persistent_workers and job.num_workers > 0,
        "torch_compile": job.compile,
    }
    # learning_rate, seed and weight_decay are the recipe's, not knobs trainfit measures or
    # chooses: trainfit's defaults (1e-4, 0) written into the payload changed a script's Trainer
    # defaults (5e-5, 42) unseen, and `**json.load(...)` beside the script's own learning_rate=
    # raised a TypeError (a QA run); the messages say so
    if device_kind(device) == "cpu":
        kw["use_cpu"] = True  # without it, bf16 raises "Your setup doesn't support bf16/gpu"
    if job.num_workers > 0:
        kw["dataloader_prefetch_factor"] = job.prefetch_factor
    if job.sharding == "fsdp":
        # transformers 5 reads FSDP from fsdp=True + fsdp_config (a string of options is
        # deprecated); under FSDP its checkpointing is fsdp_config's (the top-level flag adds a
        # redundant all-gather, transformers warns) unless the job asks for reentrant (an audit)
        in_fsdp = job.grad_ckpt == "full" and not job.ckpt_reentrant
        kw["fsdp"] = True
        kw["fsdp_config"] = {"version": 1 if job.fsdp_flat else 2, "reshard_after_forward": True,
                             "cpu_offload": job.offload == "all",
                             "activation_checkpointing": in_fsdp}
        if in_fsdp:
            kw[ckpt] = False
            return kw
    if job.grad_ckpt == "full":
        # non-reentrant unless the job says otherwise (torch's recommended mode; what it measured)
        kw[f"{ckpt}_kwargs"] = {"use_reentrant": job.ckpt_reentrant}
    return kw


def trl_sft_config(job: JobSpec, *, device: str = "cuda",
                   transformers_version: str | None = None) -> dict[str, Any]:
    """``trl.SFTConfig`` keyword arguments (TrainingArguments + sequence settings). ``packing`` as
    tune measured it: trainfit joins documents with EOS and cuts full ``seq_len`` sequences, which
    is TRL's ``packing_strategy="wrapped"`` (its default ``bfd`` keeps documents apart and needs
    FlashAttention for padding-free batches). Left out when the job does not state it."""
    kw = hf_training_args(job, device=device, transformers_version=transformers_version)
    kw["max_length"] = job.seq_len
    if job.activation_offload:
        kw["activation_offloading"] = True  # TRL's OffloadActivations: what trainfit runs
    if job.packing is not None:
        kw["packing"] = bool(job.packing)
        if job.packing:
            kw["packing_strategy"] = "wrapped"
    if job.padding_free:  # what plan simulated: one row per micro-batch (JobSpec.padding_free)
        kw["padding_free"] = True
        if job.packing:
            # TRL's padding-free packing: documents kept apart in each bin (wrapped with
            # padding_free is what TRL warns against)
            kw["packing_strategy"] = "bfd"
        else:
            # TRL enforces no max_length on padding-free rows without packing and raises when
            # one is set (trl 1.16 SFTTrainer: a review's SFTTrainer failed on this payload): the
            # script truncates its samples (script_settings says so)
            kw["max_length"] = None
    return kw


def accelerate_config(job: JobSpec, *, device: str = "cuda") -> dict[str, Any]:
    """An accelerate config (``accelerate launch --config_file``) for ``job.ranks`` processes on
    ``device``: one process is ``NO`` (no distribution), several are ``MULTI_CPU`` on a CPU,
    ``MULTI_GPU`` (DDP) or ``FSDP`` on GPUs; ``use_cpu`` follows the device."""
    cpu = device_kind(device) == "cpu"
    if cpu and job.sharding in ("fsdp", "zero2", "zero3"):
        # the config was MULTI_CPU, plain DDP with the whole model on every process, unsaid (an
        # audit): accelerate's FSDP and DeepSpeed plugins run on GPUs
        raise JobError(f"sharding: {job.sharding} on a CPU: accelerate's "
                       f"{'FSDP' if job.sharding == 'fsdp' else 'DeepSpeed'} runs on GPUs, and "
                       "the config would launch plain DDP, the whole model on every process",
                       "emit it with --device cuda for the GPU machine, or set sharding: none "
                       "(trainfit train --nproc N runs FSDP on CPU ranks itself)")
    mp = {"amp-bf16": "bf16", "amp-fp16": "fp16"}.get(job.precision or "", "no")
    if job.sharding == "fsdp" and not cpu:
        dist = "FSDP"
    elif job.sharding in ("zero2", "zero3") and not cpu:
        dist = "DEEPSPEED"
    elif job.ranks > 1:
        dist = "MULTI_CPU" if cpu else "MULTI_GPU"
    else:
        dist = "NO"
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": dist,
        "downcast_bf16": "no", "enable_cpu_affinity": False, "machine_rank": 0,
        "main_training_function": "main", "mixed_precision": mp, "num_machines": 1,
        "num_processes": job.ranks, "rdzv_backend": "static", "same_network": True,
        "use_cpu": cpu,
    }
    if not cpu:
        cfg["gpu_ids"] = "all"
    if job.compile:
        # accelerate's own field for torch.compile (an audit: compile: true was dropped unsaid)
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    if dist == "DEEPSPEED":
        # accelerate's config keys (commands/config/cluster.py; utils/dataclasses.py
        # DeepSpeedPlugin): the engine plan modelled, where a config without them launched the
        # ZeRO job as plain DDP with the whole model on every rank (an audit)
        cfg["deepspeed_config"] = {
            "zero_stage": int(job.sharding[-1]),
            "gradient_accumulation_steps": job.grad_accum,
            "gradient_clipping": job.max_grad_norm if job.max_grad_norm is not None else 0.0,
            "offload_optimizer_device": "cpu" if job.offload in ("optimizer", "all") else "none",
            "offload_param_device": "cpu" if job.offload == "all" else "none",
            "zero3_init_flag": job.sharding == "zero3",
            "zero3_save_16bit_model": job.sharding == "zero3"}
    if dist == "FSDP":
        if job.ckpt_reentrant and job.grad_ckpt == "full":
            # accelerate's fsdp_activation_checkpointing wraps each block in checkpoint_wrapper,
            # non-reentrant: the config cannot say reentrant
            raise JobError("--ckpt-reentrant with FSDP: accelerate's fsdp_activation_checkpointing"
                           " checkpoints non-reentrantly", "drop --ckpt-reentrant, or set "
                           "fsdp_activation_checkpointing: false and call model."
                           "gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                           "{'use_reentrant': True}) in the script")
        # FSDP1 where the job's wrap is FSDP1's (fsdp_version 1, or auto with a wrap init),
        # with the rank-0 loading and broadcast wrap-sync names (accelerate's keys)
        cfg["fsdp_config"] = {"fsdp_version": 1 if job.fsdp_flat else 2,
                              "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                              "fsdp_reshard_after_forward": True,
                              "fsdp_activation_checkpointing": job.grad_ckpt == "full",
                              "fsdp_offload_params": job.offload == "all"}
        if job.fsdp_flat:
            sync = job.fsdp_init == "wrap-sync"
            cfg["fsdp_config"].update({"fsdp_sync_module_states": sync,
                                       "fsdp_cpu_ram_efficient_loading": sync,
                                       "fsdp_use_orig_params": True})
    return cfg


DEFAULTS_UNLIKE_THE_LIBRARY = {"pin_memory": "dataloader_pin_memory"}
"""Job fields whose trainfit default differs from TrainingArguments' (pin_memory False vs True):
written only where the file states them (a tuned file does: tune chose them), else the library's
default stands."""


def emit(job: JobSpec, target: str, *, device: str | None = None,
         stated: Collection[str] | None = None) -> Emitted:
    """The job translated for ``target`` (hf | trl | accelerate) on ``device``.  ``stated``: the
    fields the job file sets (None: all of them, a job tune just chose)."""
    if target not in TARGETS:
        raise JobError(f"--to {target}: unknown", "use hf, trl or accelerate")
    if job.micro_batch is None or job.grad_accum is None or job.precision is None \
            or job.grad_ckpt is None:
        missing = [k for k in ("micro_batch", "precision", "grad_ckpt") if getattr(job, k) is None]
        raise JobError(f"the job leaves {', '.join(missing)} open: nothing tuned to emit",
                       "run `trainfit tune FILE --out tuned.yaml` first and emit from tuned.yaml, "
                       "or set them in the file")
    kind = device_kind(device)
    version = installed_version("transformers")
    if target == "accelerate":
        payload = accelerate_config(job, device=kind)
    elif target == "trl":
        payload = trl_sft_config(job, device=kind, transformers_version=version)
    else:
        payload = hf_training_args(job, device=kind, transformers_version=version)
    unstated = ["packing"] if target == "trl" and job.packing is None else []
    for name, key in DEFAULTS_UNLIKE_THE_LIBRARY.items():
        if stated is not None and name not in stated and key in payload:
            del payload[key]
            unstated.append(name)
    # the decay only where there is one (a tuned file states every field: "weight_decay 0.0 …
    # set weight_decay=" was noise)
    recipe = {k: getattr(job, k) for k in ("lr", "seed", "weight_decay")
              if stated is not None and k in stated and (k != "weight_decay" or job.weight_decay)}
    return Emitted(target=target, payload=payload, device=kind, transformers_version=version,
                   trl_version=installed_version("trl") if target == "trl" else None,
                   script=script_settings(job, target, version), unstated=unstated, recipe=recipe)
