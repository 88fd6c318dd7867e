"""What a job sets that an emitted payload has no field for (:class:`ScriptSetting`: where the
script sets it), for :func:`trainfit.job.emit.emit`: the attention kernel, LoRA, 4-bit loading, a
bf16 model, the optimizer the ``optim`` names cannot say, checkpointing's variants, the sharding
engine, and for accelerate (a launch config) the training loop's own settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainfit.job.choices import TRANSFORMERS_ATTENTION
from trainfit.job.combinations import ZERO_BUCKETS
from trainfit.job.spec import JobSpec

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


_OPTIMIZER_CALL = {
    "adamw": "torch.optim.AdamW(model.parameters(), lr=...",
    "sgd": "torch.optim.SGD(model.parameters(), lr=...",
    "adamw-8bit": "bitsandbytes.optim.AdamW8bit(model.parameters(), lr=...",
    "paged-adamw": "bitsandbytes.optim.PagedAdamW32bit(model.parameters(), lr=...",
    "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit(model.parameters(), lr=...",
    "adafactor": "transformers.optimization.Adafactor(model.parameters(), lr=..., "
                 "scale_parameter=False, relative_step=False"}
"""The optimizer each job name is, as the script builds it (the same classes HF's ``optim``
names load)."""

def script_settings(job: JobSpec, target: str, transformers_version: str | None = None
                    ) -> list[ScriptSetting]:
    """What the job sets that ``target``'s payload has no field for (method names as in
    ``transformers_version``: 5.23 renamed gradient_checkpointing_enable)."""
    out = [ScriptSetting("attention", job.attention, f'from_pretrained(attn_implementation='
                                                     f'"{TRANSFORMERS_ATTENTION[job.attention]}")'
                         + ("" if job.attention in ("sdpa", "eager", "flash-attention-2") else
                            f" and torch.nn.attention.sdpa_kernel for {job.attention}"))]
    if job.method == "qlora":
        out.append(_quant_setting(job))
    optimizer = _optimizer_setting(job, target)
    if optimizer is not None:
        out.append(optimizer)
    if target == "trl" and job.padding_free and not job.packing:
        out.append(ScriptSetting("padding_free", True, f"truncate each sample to {job.seq_len} "
                                 "tokens before the trainer: with padding_free and no packing "
                                 "TRL takes max_length=None and cuts nothing"))
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
        out += _accelerate_settings(job, transformers_version)
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


def optimizer_call(job: JobSpec) -> str:
    """The script's optimizer constructor; AdamW and SGD with the implementation measured (the
    one-tensor loop as ``foreach=False``: torch's default, ``foreach=None``, picks foreach on
    CUDA — torch/optim/optimizer.py ``_default_to_fused_or_foreach``)."""
    impl = "" if job.optimizer not in ("adamw", "sgd") else \
        f", {job.optimizer_impl}=True" if job.optimizer_impl in ("fused", "foreach") \
        else ", foreach=False"
    # the momentum and decay the job was planned with (SGD's momentum is a state, its decay a
    # copy of the gradients under foreach)
    momentum = f", momentum={job.sgd_momentum!r}" if job.optimizer == "sgd" else ""
    decay = f", weight_decay={job.weight_decay!r}" if job.weight_decay else ""
    return _OPTIMIZER_CALL.get(job.optimizer, job.optimizer) + momentum + decay + impl + ")"


def _optimizer_setting(job: JobSpec, target: str) -> ScriptSetting | None:
    """The optimizer where the HF payload's ``optim`` name cannot say it: SGD's momentum and
    implementation, AdamW's one-tensor loop (accelerate's is :func:`_accelerate_settings`')."""
    if target not in ("hf", "trl"):
        return None
    if job.optimizer == "sgd":
        # HF's optim="sgd" is torch's SGD with the learning rate alone: the momentum trainfit
        # runs and a fused kernel tune may have measured faster are the script's to pass (a
        # review: a tuned fused SGD vanished from the payload without a word)
        return ScriptSetting("optimizer", f"sgd ({job.optimizer_impl})",
                             f"Trainer(optimizers=({optimizer_call(job)}, None))")
    if job.optimizer == "adamw" and job.optimizer_impl == "forloop":
        # optim="adamw_torch" leaves torch to pick its implementation (foreach on CUDA): the
        # one-tensor-at-a-time loop the job measured is the script's to ask for (an audit)
        return ScriptSetting("optimizer_impl", "forloop", "Trainer(optimizers=("
                             f"{optimizer_call(job)}, None))")
    return None


def _accelerate_settings(job: JobSpec, transformers_version: str | None) -> list[ScriptSetting]:
    """The training loop's settings an accelerate config (the launch) cannot hold."""
    out: list[ScriptSetting] = []
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
                             optimizer_call(job)))
    if job.max_grad_norm is not None and job.sharding not in ("zero2", "zero3"):
        out.append(ScriptSetting("max_grad_norm", job.max_grad_norm,
                                 f"accelerator.clip_grad_norm_(model.parameters(), "
                                 f"{job.max_grad_norm}) before optimizer.step()"))
    if job.grad_ckpt == "full" and job.sharding != "fsdp":
        ckpt = checkpointing_name(transformers_version)
        out.append(ScriptSetting("grad_ckpt", job.grad_ckpt,
                                 f"model.{ckpt}_enable({ckpt}_kwargs="
                                 f'{{"use_reentrant": {job.ckpt_reentrant}}})'))
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


def _bucket_keys(job: JobSpec) -> list[str]:
    """The DeepSpeed config keys that give the job's bucket sizes where they are not DeepSpeed's
    own defaults (which an accelerate config without a DeepSpeed config file runs): "auto"
    (hidden², filled by accelerate) or the job's number."""
    out = []
    for key, (field, default, stages) in ZERO_BUCKETS.items():
        value = getattr(job, field)
        if job.sharding in stages and value != default:
            out.append(f"{key}: {'auto' if value is None else value}")
    return out


def _sharding_setting(job: JobSpec, target: str) -> ScriptSetting | None:
    """The sharding engine and CPU offload, which ``target``'s payload cannot carry (None where
    it has nothing to carry: no sharding, or accelerate's own FSDP config)."""
    # FSDP is in every payload now (fsdp_config, accelerate's FSDP); ZeRO in accelerate's
    if job.sharding == "fsdp":
        return None
    sharded = job.sharding in ("zero2", "zero3") and target != "accelerate"
    if target == "accelerate" and job.sharding in ("zero2", "zero3"):
        # the config's deepspeed_config carries the stage and the offload; DeepSpeed's pinning
        # of offloaded states and bucket sizes other than its own defaults need their own file
        keys = [] if job.offload == "none" or job.zero_pin_memory else [
            "offload_optimizer: {device: cpu, pin_memory: false}"
            + (", offload_param the same" if job.offload == "all" else "")]
        keys += _bucket_keys(job)
        if not keys:
            return None
        return ScriptSetting("sharding", f"{job.sharding}, offload {job.offload}"
                             + ("" if job.offload == "none" or job.zero_pin_memory else
                                ", pin_memory false"),
                             f"a DeepSpeed config file (deepspeed_config_file, which then "
                             f"carries the stage and the offload too, with zero_optimization: "
                             f"{{{', '.join(keys)}}}): accelerate's deepspeed_config keys "
                             "cannot say it, and without the file "
                             "DeepSpeed 0.19's defaults run (pinned offload; "
                             + ", ".join(f"{k} {d:.0e}" for k, (_, d, _) in ZERO_BUCKETS.items())
                             + " elements)")
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
    if job.sharding.startswith("zero") and _bucket_keys(job):
        # without a DeepSpeed config file accelerate's config runs DeepSpeed's default buckets,
        # not the ones planned
        how += (f"; the buckets as planned take a DeepSpeed config file (zero_optimization: "
                f"{{{', '.join(_bucket_keys(job))}}}): without one DeepSpeed's defaults run")
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
