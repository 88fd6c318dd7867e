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

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import yaml

from trainfit.job.spec import JobError, JobSpec

TARGETS = ("hf", "trl", "accelerate")
"""What ``trainfit emit --to`` and ``trainfit tune --emit`` translate a job into."""

ACTIVATION_CHECKPOINTING_SINCE = (5, 23)
"""transformers 5.23 (the version trainfit pins) names checkpointing ``activation_checkpointing``;
``gradient_checkpointing`` is there a "Deprecated alias of `activation_checkpointing`, will be
removed in v6" that warns (training_args.py of 5.23.0). Older versions get the old name, which all
of them accept."""


@dataclass(frozen=True)
class ScriptSetting:
    """A job setting that is not a field of the emitted payload: where the script sets it."""

    knob: str
    """The job field (``attention``, ``method``, ``quant``, ``precision`` ...)."""
    value: Any
    """The job's value."""
    where: str
    """The call and argument that set it, e.g. ``from_pretrained(attn_implementation="sdpa")``."""


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
    """The learning rate and seed the file states (no payload carries them: said, not set)."""

    def text(self) -> str:
        """What goes on stdout: JSON for hf/trl (``TrainingArguments(**json.load(f))``), YAML for
        accelerate (``accelerate launch --config_file``)."""
        if self.target == "accelerate":
            return yaml.safe_dump(self.payload, sort_keys=False)
        return json.dumps(self.payload, indent=1) + "\n"


def installed_version(dist: str) -> str | None:
    """The installed distribution's version, read from its metadata (no import of the package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def checkpointing_name(transformers_version: str | None) -> str:
    """``activation_checkpointing`` for transformers ≥ 5.23 (and when it is not installed here:
    the pinned version's name), else ``gradient_checkpointing``."""
    v = _version_tuple(transformers_version)
    return "gradient_checkpointing" if v is not None and v < ACTIVATION_CHECKPOINTING_SINCE \
        else "activation_checkpointing"


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
    # learning_rate and seed are the recipe's, not knobs trainfit measures or chooses: trainfit's
    # defaults (1e-4, 0) written into the payload changed a script's Trainer defaults (5e-5, 42)
    # unseen, and `**json.load(...)` beside the script's own learning_rate= raised a TypeError
    # (a QA run); the messages say so
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
    return kw


def accelerate_config(job: JobSpec, *, device: str = "cuda") -> dict[str, Any]:
    """An accelerate config (``accelerate launch --config_file``) for ``job.ranks`` processes on
    ``device``: one process is ``NO`` (no distribution), several are ``MULTI_CPU`` on a CPU,
    ``MULTI_GPU`` (DDP) or ``FSDP`` on GPUs; ``use_cpu`` follows the device."""
    cpu = device_kind(device) == "cpu"
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


_ACCELERATE_OPTIM = {
    "adamw": "torch.optim.AdamW(model.parameters(), lr=...",
    "sgd": "torch.optim.SGD(model.parameters(), lr=..., momentum=0.9",
    "adamw-8bit": "bitsandbytes.optim.AdamW8bit(model.parameters(), lr=...",
    "paged-adamw": "bitsandbytes.optim.PagedAdamW32bit(model.parameters(), lr=...",
    "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit(model.parameters(), lr=...",
    "adafactor": "transformers.optimization.Adafactor(model.parameters(), lr=..., "
                 "scale_parameter=False, relative_step=False"}
"""The optimizer each job name is, as the script builds it (the same classes HF's ``optim``
names load)."""

_ATTN = {"sdpa": "sdpa", "sdpa-flash": "sdpa", "sdpa-efficient": "sdpa", "sdpa-math": "sdpa",
         "eager": "eager"}


def script_settings(job: JobSpec, target: str, transformers_version: str | None = None
                    ) -> list[ScriptSetting]:
    """What the job sets that ``target``'s payload has no field for (method names as in
    ``transformers_version``: 5.23 renamed gradient_checkpointing_enable)."""
    out = [ScriptSetting("attention", job.attention, f'from_pretrained(attn_implementation='
                                                     f'"{_ATTN[job.attention]}")'
                         + ("" if job.attention in ("sdpa", "eager") else
                            f" and torch.nn.attention.sdpa_kernel for {job.attention}"))]
    if job.method == "qlora":
        out.append(_quant_setting(job))
    if job.optimizer == "sgd" and target in ("hf", "trl"):
        # HF's optim="sgd" is torch's SGD with the learning rate alone: the momentum trainfit
        # runs and a fused kernel tune may have measured faster are the script's to pass (a
        # review: a tuned fused SGD vanished from the payload without a word)
        out.append(ScriptSetting("optimizer", f"sgd ({job.optimizer_impl})",
                                 "Trainer(optimizers=(torch.optim.SGD(model.parameters(), lr=..., "
                                 "momentum=0.9" + (", fused=True" if job.optimizer_impl == "fused"
                                                   else ", foreach=True"
                                                   if job.optimizer_impl == "foreach" else "")
                                 + "), None))"))
    if job.optimizer == "adamw" and job.optimizer_impl == "forloop" and target in ("hf", "trl"):
        # optim="adamw_torch" leaves torch to pick its implementation (foreach on CUDA): the
        # one-tensor-at-a-time loop the job measured is the script's to ask for (an audit)
        out.append(ScriptSetting("optimizer_impl", "forloop",
                                 "Trainer(optimizers=(torch.optim.AdamW(model.parameters(), lr=..., "
                                 "foreach=False), None))"))
    if job.grad_ckpt == "selective":
        # no payload field takes a context_fn (a function): the script turns it on, and the
        # payload's own checkpointing stays off (an audit: it read as no checkpointing at all)
        ckpt = checkpointing_name(transformers_version)
        out.append(ScriptSetting("grad_ckpt", "selective",
                                 f"model.{ckpt}_enable({ckpt}_kwargs={{\"use_reentrant\": False, "
                                 "\"context_fn\": trainfit.model.checkpointing."
                                 "selective_context_fn}) (torchtitan's op-level policy: matmul "
                                 "outputs kept, the rest recomputed)"))
    if job.method in ("lora", "qlora"):
        out.append(ScriptSetting("method", job.method, f"peft.LoraConfig(r={job.lora_r}, "
                                 f"lora_alpha={job.lora_alpha}, lora_dropout={job.lora_dropout}, "
                                 f"target_modules={_peft_targets(job.lora_targets)})"))
    if job.precision == "bf16-true":
        out.append(ScriptSetting("precision", job.precision,
                                 "from_pretrained(dtype=torch.bfloat16) (no autocast on top)"))
    if target == "accelerate":
        # an accelerate config holds the launch, not the training loop: the loader, optimizer and
        # clipping the job measured are the script's (an audit: they went unsaid)
        loader = f"batch_size={job.micro_batch}, num_workers={job.num_workers}, " \
                 f"pin_memory={job.pin_memory}" + (
                     f", prefetch_factor={job.prefetch_factor}, persistent_workers="
                     f"{job.persistent_workers}" if job.num_workers > 0 else "")
        out.append(ScriptSetting("grad_accum", job.grad_accum,
                                 f"Accelerator(gradient_accumulation_steps={job.grad_accum}), "
                                 f"DataLoader({loader})"))
        out.append(ScriptSetting("optimizer", f"{job.optimizer} ({job.optimizer_impl})",
                                 _ACCELERATE_OPTIM.get(job.optimizer, job.optimizer)
                                 + ("" if job.optimizer not in ("adamw", "sgd") else
                                    f", {job.optimizer_impl}=True" if job.optimizer_impl in
                                    ("fused", "foreach") else ", foreach=False") + ")"))
        if job.max_grad_norm is not None and job.sharding not in ("zero2", "zero3"):
            out.append(ScriptSetting("max_grad_norm", job.max_grad_norm,
                                     f"accelerator.clip_grad_norm_(model.parameters(), "
                                     f"{job.max_grad_norm}) before optimizer.step()"))
        if job.grad_ckpt == "full" and job.sharding != "fsdp":
            ckpt = checkpointing_name(transformers_version)
            out.append(ScriptSetting("grad_ckpt", job.grad_ckpt,
                                     f"model.{ckpt}_enable({ckpt}_kwargs="
                                     f'{{"use_reentrant": {job.ckpt_reentrant}}})'))
    elif target == "hf":
        out.append(ScriptSetting("seq_len", job.seq_len,
                                 f"tokenizer(..., max_length={job.seq_len}, truncation=True)"
                                 + (" and packed into full sequences" if job.packing else "")))
    if job.activation_offload and target != "trl":
        # TrainingArguments has no field for it; SFTConfig(activation_offloading=True) has
        out.append(ScriptSetting("activation_offload", True,
                                 "ctx = trl.models.activation_offloading."
                                 "get_act_offloading_ctx_manager(model) once, then `with ctx:` "
                                 "around each forward + loss (SFTConfig(activation_offloading="
                                 "True) wraps the whole training step)"))
    if job.optimizer_in_backward:
        # neither TrainingArguments nor accelerate has it: the script registers the hooks
        out.append(ScriptSetting("optimizer_in_backward", True,
                                 "one optimizer per parameter, stepped from "
                                 "p.register_post_accumulate_grad_hook (torchtune's "
                                 "training.register_optim_in_bwd_hooks); the Trainer's own "
                                 "optimizer step then has nothing to do"))
    if job.expandable_segments:
        # an allocator setting, read from the environment before CUDA starts: no payload has it
        out.append(ScriptSetting("expandable_segments", True,
                                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch "
                                 "environment (before CUDA starts)"))
    sharding = _sharding_setting(job, target)
    if sharding is not None:
        out.append(sharding)
    if job.ranks > 1 and target != "accelerate":
        out.append(ScriptSetting("ranks", job.ranks,
                                 f"torchrun --nproc-per-node {job.ranks} (per-device batch × "
                                 f"accumulation × {job.ranks} = effective batch "
                                 f"{job.effective_batch})"))
    return out


def _quant_setting(job: JobSpec) -> ScriptSetting:
    """QLoRA's BitsAndBytesConfig, as the plan simulated the 4-bit weights."""
    dq = job.quant == "nf4-dq"
    qtype = "fp4" if job.quant == "fp4" else "nf4"
    # an fp32 job: bf16 as on a card that has it (plan computes in fp32 on one without:
    # model/workload.qlora_compute_dtype); emit does not know the card, so it says so
    compute = "float16" if job.precision == "amp-fp16" else "bfloat16"
    # sharded QLoRA: FSDP and ZeRO flatten the packed weights with the 16-bit parameters,
    # so they are stored as bf16 (as the plan simulated them: model/workload.py)
    # (and loaded in bf16: the storage dtype is the other parameters' dtype, HF's pairing)
    sharded = job.sharding != "none" and job.ranks > 1
    storage = ", bnb_4bit_quant_storage=torch.bfloat16" if sharded else ""
    return ScriptSetting("quant", job.quant, "from_pretrained(quantization_config="
                         f'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="{qtype}", '
                         f"bnb_4bit_use_double_quant={dq}, "
                         f"bnb_4bit_compute_dtype=torch.{compute}{storage})"
                         + (", dtype=torch.bfloat16)" if sharded else ")")
                         + (" — bfloat16 on a card with bf16; float32 on one without (a T4, a "
                            "V100), as plan simulates it" if job.precision == "fp32" else ""))


def _sharding_setting(job: JobSpec, target: str) -> ScriptSetting | None:
    """The sharding engine and CPU offload, which ``target``'s payload cannot carry (None where
    it has nothing to carry: no sharding, or accelerate's own FSDP config)."""
    # FSDP is in every payload now (fsdp_config, accelerate's FSDP); ZeRO in accelerate's
    if job.sharding == "fsdp":
        return None
    sharded = job.sharding in ("zero2", "zero3") and target != "accelerate"
    if target == "accelerate" and job.sharding in ("zero2", "zero3"):
        # the config's deepspeed_config carries the stage and the offload; only DeepSpeed's
        # pinning of offloaded states needs its own file
        if job.offload == "none" or job.zero_pin_memory:
            return None
        return ScriptSetting("sharding", f"{job.sharding}, offload {job.offload}, pin_memory "
                             "false", "a DeepSpeed config file (deepspeed_config_file, with "
                             "offload_optimizer: {device: cpu, pin_memory: false}" + (
                                 ", and offload_param the same" if job.offload == "all" else "")
                             + "): accelerate's deepspeed_config keys cannot say it, and "
                             "DeepSpeed 0.19 pins by default")
    if not sharded and job.offload == "none":
        return None
    # TrainingArguments' deepspeed field needs DeepSpeed installed to be built: said, never
    # dropped (a QA run's ZeRO-3 + offload job came out as plain DDP, 172.5 GiB a rank predicted)
    stage = {"zero2": "DeepSpeed ZeRO-2", "zero3": "DeepSpeed ZeRO-3"}.get(job.sharding,
                                                                         job.sharding)
    off = "" if job.offload == "none" else (
        f", {'optimizer states' if job.offload == 'optimizer' else 'parameters and optimizer states'}"
        " offloaded to CPU")
    how = ("an accelerate config with distributed_type: DEEPSPEED and deepspeed_config: "
           f"{{zero_stage: {job.sharding[-1]}" + (
               ", offload_optimizer_device: cpu" if job.offload != "none" else "") + (
               ", offload_param_device: cpu" if job.offload == "all" else "") + "}" + (
               "; pin_memory: false, as planned, takes a DeepSpeed config file instead "
               "(deepspeed_config_file, with offload_optimizer: {device: cpu, pin_memory: "
               "false}" + (", and offload_param the same" if job.offload == "all" else "")
               + "): DeepSpeed 0.19 pins by default" if job.offload != "none"
               and not job.zero_pin_memory else "")
           if job.sharding.startswith("zero") else "the launcher's sharding config")
    return ScriptSetting("sharding", f"{job.sharding}, offload {job.offload}",
                         f"{stage}{off}: not in this payload — set it with {how}")


_LLAMA_NAMES = {"q": ("q_proj",), "k": ("k_proj",), "v": ("v_proj",), "o": ("o_proj",),
                "mlp": ("gate_proj", "up_proj", "down_proj"), "lm_head": ("lm_head",)}


def _peft_targets(targets: list[str]) -> str:
    """``target_modules=`` as peft takes it: None for peft's own default of the architecture,
    the string "all-linear", module names as given; trainfit's aliases (q, v, mlp …) name
    layers by role, which peft does not read (a QA run: target_modules=['default'] failed)."""
    if targets == ["default"]:
        return "None (peft's default for the architecture)"
    if targets == ["all-linear"]:
        return '"all-linear"'
    roles = [t for t in targets if t in _LLAMA_NAMES]
    if roles:
        # the example names only the roles asked for (an audit: a q,v job's example listed the
        # MLP's modules too, which a user copying it would adapt)
        llama = ", ".join(n for r in roles for n in _LLAMA_NAMES[r])
        return (f"[the module names of {', '.join(roles)} in this model, e.g. {llama} for "
                "Llama]" + (
                    f" + {[t for t in targets if t not in roles]}" if len(roles) < len(targets)
                    else ""))
    return str(targets)


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
    recipe = {k: getattr(job, k) for k in ("lr", "seed") if stated is not None and k in stated}
    return Emitted(target=target, payload=payload, device=kind, transformers_version=version,
                   trl_version=installed_version("trl") if target == "trl" else None,
                   script=script_settings(job, target, version), unstated=unstated, recipe=recipe)
