"""The checks between a job's fields that JobSpec.__post_init__ runs after each field's own
(job/validate.py): what the method allows of 4-bit weights, what stepping in the backward rules
out, what each sharding engine offers. Out of job/spec.py, which holds the fields."""

from __future__ import annotations

from typing import Any

from trainfit.job.choices import ENGINE_OFFLOADS, QUANT_LIBS, QUANTS, JobError, _choice


def check_quantization(job: Any) -> None:
    """What the method allows of 4-bit weights and their library, and torchtune's copied
    layers (single-device, torchao's NF4)."""
    if job.kbit_prepared and job.method != "qlora":
        raise JobError("--kbit-prepared applies to --method qlora",
                       "a LoRA base cast to float32 is --precision fp32")
    if job.method == "qlora":
        job.quant = job.quant or "nf4-dq"
        _choice("quant", job.quant, QUANTS)
        _choice("quant_lib", job.quant_lib, QUANT_LIBS)
        if job.quant_lib != "bnb" and job.quant != "nf4-dq":
            raise JobError(f"--quant-lib {job.quant_lib} with --quant {job.quant}: torchao's "
                           "NF4 always double-quantizes its scales", "use --quant nf4-dq")
    elif job.quant is not None:
        raise JobError(f"--quant {job.quant} needs --method qlora",
                       "use --method qlora, or --quant none to clear a quant the job file set")
    elif job.quant_lib != "bnb":
        raise JobError(f"--quant-lib {job.quant_lib} needs --method qlora",
                       "use --method qlora, or drop --quant-lib")
    if job.clone_layers and (job.sharding != "none" or job.ranks > 1
                              or job.fsdp_init != "sharded"):
        what = (f"--sharding {job.sharding}" if job.sharding != "none" else
                f"--ranks {job.ranks}" if job.ranks > 1 else f"--fsdp-init {job.fsdp_init}")
        raise JobError(f"--clone-layers with {what}: torchtune builds its layers as copies on "
                       "the GPU in its single-device recipes only",
                       "drop --clone-layers (torchtune's distributed recipes build on meta)")
    if job.clone_layers and job.method == "qlora" and job.quant_lib == "bnb":
        raise JobError("--clone-layers with --quant-lib bnb: the deep copies are torchtune's, "
                       "whose 4-bit weights are torchao's", "add --quant-lib torchao or "
                       "torchao-0.1")
    if job.trl_logprob_head and (job.lm_head_chunk is not None or job.fp32_outputs):
        raise JobError("--trl-logprob-head with --lm-head-chunk / --fp32-outputs: each "
                       "replaces the loss head", "keep one of them")


def check_in_backward(job: Any) -> None:
    """What stepping each gradient as it arrives rules out (trainfit.model.in_backward)."""
    if job.grad_accum is not None and job.grad_accum != 1:
        raise JobError(f"--optimizer-in-backward with grad-accum {job.grad_accum}: each "
                       "micro-batch's gradient would be applied on its own",
                       "use --grad-accum 1 (a micro-batch equal to the per-rank batch), or "
                       "drop --optimizer-in-backward")
    if job.max_grad_norm is not None:
        raise JobError("--optimizer-in-backward with gradient clipping: clipping needs every "
                       "gradient of the step at once",
                       "add --max-grad-norm none (torchtune turns clipping off for it too)")
    if job.ranks > 1:
        raise JobError(f"--optimizer-in-backward with --ranks {job.ranks}: the step would run "
                       "before the ranks' gradients are reduced",
                       "use it on one GPU (--ranks 1)")
    if job.precision == "amp-fp16":
        raise JobError("--optimizer-in-backward with --precision amp-fp16: the GradScaler "
                       "checks the whole step's gradients for inf before any step",
                       "use --precision bf16-true or amp-bf16")


ZERO_BUCKETS = {"reduce_bucket_size": ("zero_reduce_bucket", 500_000_000, ("zero2", "zero3")),
                "stage3_prefetch_bucket_size": ("zero_prefetch_bucket", 50_000_000, ("zero3",))}
"""DeepSpeed's ``zero_optimization`` bucket sizes a job carries: its key → (the JobSpec field,
DeepSpeed 0.19's default where a config leaves the key out — ``runtime/zero/config.py``, what an
accelerate config without a DeepSpeed file runs — and the stages that have it)."""


def check_sharding(job: Any) -> None:
    """What each engine (``sharding``) allows of offloading, FSDP's wrap and version, and the
    optimizer under ZeRO-Offload."""
    allowed = ENGINE_OFFLOADS[job.sharding]
    if job.offload not in allowed:
        raise JobError(f"--offload {job.offload} with --sharding {job.sharding}: not "
                       "something that engine offers",
                       f"with --sharding {job.sharding} use --offload "
                       f"{' or '.join(allowed)}" if len(allowed) > 1 else
                       "offloading needs --sharding fsdp, zero2 or zero3")
    if job.fsdp_init != "sharded" and job.sharding not in ("fsdp", "none"):
        raise JobError(f"--fsdp-init {job.fsdp_init} with --sharding {job.sharding}: "
                       "it describes FSDP's wrapping", "use --sharding fsdp (or none for "
                       "FSDP's NO_SHARD), or drop --fsdp-init")
    if job.fsdp_version != "auto" and job.sharding != "fsdp":
        raise JobError(f"--fsdp-version {job.fsdp_version} applies to --sharding fsdp only",
                       "drop --fsdp-version, or use --sharding fsdp")
    if job.fsdp_version == "2" and job.fsdp_init != "sharded":
        raise JobError(f"--fsdp-version 2 with --fsdp-init {job.fsdp_init}: that wrap is "
                       "FSDP1's", "use --fsdp-version 1 (or auto), or --fsdp-init sharded")
    if job.sharding in ("zero2", "zero3") and job.offload != "none" and \
            job.optimizer != "adamw":
        # under ZeRO-Offload accelerate (HF Trainer's too) swaps the optimizer for DeepSpeed's
        # CPU Adam on the host partitions (accelerate utils/deepspeed.py
        # map_pytorch_optim_to_deepspeed: fp32 m and v, whatever was asked): planning another
        # one's states would not be what runs
        raise JobError(f"--optimizer {job.optimizer} with --sharding {job.sharding} "
                       f"--offload {job.offload}: under ZeRO-Offload accelerate replaces it "
                       "with DeepSpeed's CPU Adam (fp32 states, on the host)",
                       "plan it as --optimizer adamw, or drop --offload")
    for flag, _, stages in ZERO_BUCKETS.values():
        if getattr(job, flag) is not None and job.sharding not in stages:
            raise JobError(f"--{flag.replace('_', '-')} applies to --sharding "
                           f"{' or '.join(stages)} only (a DeepSpeed bucket size)",
                           f"drop --{flag.replace('_', '-')}, or use --sharding {stages[-1]}")
    for flag in ("fsdp_no_sync", "fsdp_frozen_grads"):
        if getattr(job, flag) and job.sharding != "fsdp":
            raise JobError(f"--{flag.replace('_', '-')} applies to --sharding fsdp only",
                           f"drop --{flag.replace('_', '-')}, or use --sharding fsdp")


FSDP_MIXED_DTYPES = ("FSDP2's fully_shard needs one dtype for a layer's trainable weights "
                     "(torch _fsdp_param_group: 'FSDP expects uniform original parameter dtype')")
"""Why full fine-tuning in bf16-true under FSDP cannot run a model whose loader keeps trainable
weights in fp32 (model/loaded_dtypes.py; plan/inputs.fsdp_keeps_fp32_weights)."""
FLASH_ATTENTION_2_DTYPES_NOTE = (
    "FlashAttention-2 takes fp16 and bf16 tensors only: without autocast transformers hands it "
    "q, k and v in the model's weight dtype (integrations/flash_attention.get_target_dtype), "
    "fp32 here, and flash-attn raises")


def check_flash_attention(job: Any) -> None:
    """``--attention flash-attention-2`` with ``--precision fp32``: the step cannot run (see
    :data:`FLASH_ATTENTION_2_DTYPES_NOTE`); plan's grid leaves fp32 out for such a job."""
    if job.attention == "flash-attention-2" and job.precision == "fp32":
        raise JobError(f"--attention flash-attention-2 with --precision fp32: "
                       f"{FLASH_ATTENTION_2_DTYPES_NOTE}",
                       "use --precision amp-bf16 (or bf16-true, amp-fp16), or --attention sdpa")


def check_padding(job: Any) -> None:
    """``padded`` with packed rows (``padding_free`` or ``packing``): packed rows hold samples
    concatenated, with no padding."""
    if job.padded != "none" and (job.padding_free or job.packing):
        what = "--padding-free" if job.padding_free else "--packing"
        raise JobError(f"--padded {job.padded} with {what}: packed rows hold samples "
                       "concatenated, with no padding",
                       f"drop one: {what} (packed rows) or --padded (padded rows)")


def check_legacy_torch(job: Any) -> None:
    """``softmax_saves_input`` describes torch ≤ 1.10: the features that torch had not yet
    cannot be combined with it (the simulation would run torch 2.13's kernels, which save
    something else, or nothing, for the backward). Its checkpointing is reentrant, the only kind
    it had: :class:`~trainfit.job.spec.JobSpec` sets ``ckpt_reentrant``."""
    if not job.softmax_saves_input:
        return
    hint = "drop --softmax-saves-input, or plan what torch ≤ 1.10 ran"
    if job.attention != "eager":
        raise JobError(f"--softmax-saves-input with --attention {job.attention}: torch ≤ 1.10 "
                       "had no scaled_dot_product_attention (2.0); transformers then ran its own "
                       "matmul + softmax", "use --attention eager, or drop --softmax-saves-input")
    if job.compile:
        raise JobError("--softmax-saves-input with --compile: torch ≤ 1.10 had no torch.compile "
                       "(2.0)", hint)
    if job.grad_ckpt == "selective":
        raise JobError("--softmax-saves-input with --grad-ckpt selective: torch ≤ 1.10 "
                       "checkpointed whole layers, reentrantly only (selective checkpointing and "
                       "use_reentrant came later)", "use --grad-ckpt full or off")
    if job.activation_offload:
        raise JobError("--softmax-saves-input with --activation-offload: the offloading hooks "
                       "came after torch 1.10", hint)
