"""A plan row's speed beyond the step's own ops: the gradient synchronisation of its ranks over
the GPU's link, or unknown with the cause (an unknown or host-routed link, the allocator
retrying at the card's limit, CPU or activation offload)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from trainfit.hardware.gpus import GpuSpec
from trainfit.job import JobSpec
from trainfit.memory.predict import MemoryPrediction
from trainfit.memory.zero import compute_job
from trainfit.model.source import hidden_size
from trainfit.model.workload import build_model_on_meta
from trainfit.speed.comm import sync_time, unknown_interconnect, untimed_link, with_sync
from trainfit.speed.host import SWITCH
from trainfit.speed.host_timing import (
    H100_HOST_REFERENCE_OP_S,
    HOST_ENV,
    machine_reference_op_s,
)
from trainfit.speed.predict import SpeedPrediction, unknown_speed
from trainfit.speed.zero_hooks import HookCounts, hook_counts, hook_ops

_COUNTS: dict[tuple[Any, ...], HookCounts] = {}


def zero_hook_counts(job: JobSpec, source: Any) -> HookCounts | None:
    """What DeepSpeed's hooks run over in ``job``'s micro-step (None: not a ZeRO job, or a
    model with no width to read the persistence threshold from).  Counted on the model as
    DeepSpeed holds it (:func:`trainfit.memory.zero.compute_job`), built on the meta device
    once per model structure."""
    if job.sharding not in ("zero2", "zero3"):
        return None
    hidden = hidden_size(source)
    if not hidden:
        return None
    # by the model's name and configuration, not the source object's id (a review: an id
    # reused after garbage collection would serve another model's counts)
    config = getattr(source, "config", None)
    described = json.dumps(config.to_dict() if hasattr(config, "to_dict") else repr(config),
                           sort_keys=True, default=str)
    key = (getattr(source, "name", ""), hashlib.sha256(described.encode()).hexdigest(),
           job.method, job.lora_r, tuple(job.lora_targets or ()), job.quant, job.grad_ckpt,
           job.sharding)
    if key not in _COUNTS:
        model, _ = build_model_on_meta(compute_job(job), source)
        # selective checkpointing runs each layer's forward again too (its hooks and fetches
        # fire again): counted as full, an upper bound on the hooks (a review)
        _COUNTS[key] = hook_counts(model, hidden, job.grad_ckpt in ("full", "selective"))
    return _COUNTS[key]


def framework_host_s(job: JobSpec, source: Any) -> float:
    """Host seconds per micro-step of DeepSpeed ZeRO's hooks (:mod:`trainfit.speed.zero_hooks`),
    at the reference op the host step is read at: this machine's (plan assumes it trains here,
    as :mod:`trainfit.speed.host` does), the H100 host's where none was measured here or the
    host measurement is off.  0 for any other job."""
    counts = zero_hook_counts(job, source)
    if counts is None:
        return 0.0
    # a given host's reference (TRAINFIT_HOST_REFERENCE_OP_S) holds with the measurement off
    ref = machine_reference_op_s() if os.environ.get(SWITCH) != "0" or \
        os.environ.get(HOST_ENV) else None
    return hook_ops(counts, 3 if job.sharding == "zero3" else 2) * (ref or H100_HOST_REFERENCE_OP_S)


def synced(speed: SpeedPrediction | None, job: JobSpec, mem: MemoryPrediction,
           gpu: GpuSpec | None) -> SpeedPrediction | None:
    """``speed`` with the gradient synchronisation of ``ranks`` > 1 added (trainfit.speed.comm);
    unknown, with the cause, when the GPU's interconnect is, when the allocator retries at the
    card's limit, or when the job offloads to the host (its states or its activations)."""
    if speed is not None and mem.alloc_retries:
        return unknown_speed(speed.model_flops_per_token,
                             f"at the card's limit the allocator releases its cache and retries "
                             f"{mem.alloc_retries}× a step (num_alloc_retries): each release "
                             "synchronizes the GPU; the slow-down is not modelled (a smaller "
                             "micro-batch" + (" or full checkpointing" if job.grad_ckpt != "full" else "")
                             + " gives it room)")
    if speed is not None and job.offload != "none":
        return unknown_speed(speed.model_flops_per_token,
                             f"offload {job.offload}: the host↔GPU copies and the optimizer step "
                             "on the CPU are not modelled")
    if speed is not None and job.activation_offload:
        # each micro-step's saved activations cross the host link twice (TRL's manager): on a
        # PCIe 4 x16 (~25 GB/s) a few GiB each way take as long as many models' whole step, so
        # whether the copy stream keeps up with compute is not a rounding error; untimed here
        return unknown_speed(speed.model_flops_per_token,
                             "activation offload: the saved activations' copies to the host and "
                             "back (every micro-step, over the host's PCIe link) are not timed; "
                             "streamed beside compute they are hidden only while the link keeps "
                             "up")
    if speed is None or gpu is None or job.ranks <= 1 or speed.step_time_s is None:
        return speed
    untimed = untimed_link(gpu, job.ranks)
    if untimed is not None:
        return unknown_interconnect(speed, job.ranks, *untimed)
    sharded = job.sharding != "none"
    # gradients: fp32 under DDP+AMP; reduced in the compute dtype by DeepSpeed, in
    # fsdp_reduce_dtype by FSDP
    grad_elem = 2 if job.precision == "bf16-true" or (
        job.sharding.startswith("zero") and job.precision != "fp32") or (
        job.sharding == "fsdp" and job.fsdp_reduce_dtype == "param") else 4
    # parameters are gathered in the compute dtype under FSDP/ZeRO mixed precision; QLoRA's
    # packed 4-bit values at half a byte (their quantization state is no parameter: never
    # gathered), its 16-bit rest — embeddings, head, norms, MoE experts — at 2 (an audit: every
    # value at 4.5 bits read Mixtral's 45 B bf16 experts' gathers 3.5× too small)
    weight_elem = 4 if job.precision == "fp32" or (
        not sharded and job.method == "full" and job.precision != "bf16-true") else 2
    packed = mem.packed_4bit_params if job.method == "qlora" else 0
    gathered_bytes = packed * 0.5 + (mem.total_params - packed) * weight_elem
    # the collectives run under the micro-steps' forward + backward: the optimizer step comes
    # after the last reduce-scatter (ZeRO-3's begins by releasing every gathered parameter), so
    # it hides none of them (an audit: Mixtral ZeRO-3's step read 16 % short)
    fb_s = speed.step_time_s - (speed.optimizer_s or 0.0)
    # FSDP1 with frozen and trainable weights in one flat parameter reduce-scatters the whole
    # unit's gradient, the frozen part's too (JobSpec.fsdp_frozen_grads; QLoRA's packed values
    # as their 16-bit storage, 4 to an element) — a review: the memory had them, the time not
    frozen_too = job.sharding == "fsdp" and job.fsdp_frozen_grads
    grad_elems = (mem.total_params - 0.75 * packed) if frozen_too else mem.trainable_params
    return with_sync(speed, sync_time(
        ranks=job.ranks, sharding=job.sharding, grad_accum=job.grad_accum or 1,
        grad_bytes=grad_elems * grad_elem, reduce_once=job.fsdp_no_sync,
        # ZeRO-2 gathers the updated partitions of what trains; FSDP / ZeRO-3 every parameter
        param_bytes=mem.trainable_params * weight_elem if job.sharding == "zero2"
        else gathered_bytes,
        link_gbs=gpu.interconnect_gbs, micro_step_s=fb_s / (job.grad_accum or 1),
        hbm_gbs=gpu.memory_bandwidth_gbs,
        device_share=speed.device_busy_fraction if speed.device_busy_fraction else 1.0))
