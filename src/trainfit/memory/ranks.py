"""One rank's share of the one-process step: what data parallelism adds (DDP's gradient buckets)
or divides (FSDP's shards, DeepSpeed ZeRO's partitions), phase by phase, and what CPU offload
keeps in host RAM.  :func:`trainfit.memory.predict.finish` takes the largest phase as the
rank's allocated peak."""

from __future__ import annotations

from trainfit.engine.dist import mixed_precision_policy
from trainfit.job import JobSpec
from trainfit.memory.allocator import K_MIN_BLOCK
from trainfit.memory.zero import (
    compute_dtype_bytes,
    end_parameter_bytes,
    fsdp_offload_phases,
    zero_phases,
)
from trainfit.model.source import ModelSource, hidden_size
from trainfit.model.towers import unused_parameter_note
from trainfit.model.workload import weight_dtypes

DDP_BUCKET_FACTOR = 1.0
"""DDP with ``gradient_as_bucket_view=False`` (the default) keeps flat bucket copies of every
gradient: +1 × gradient bytes (torch/nn/parallel/distributed.py, reducer.cpp)."""
FSDP_PREFETCH_UNITS = 2
"""FSDP FULL_SHARD holds the unsharded parameters of the running unit plus the prefetched next one
(forward and backward prefetch, one decoder layer per unit as HF's auto-wrap does)."""


def _shard_adjust(job: JobSpec, breakdown: dict[str, int], per_layer_param_bytes: int,
                  grad_bytes: int) -> tuple[int, list[str]]:
    """Bytes to add to the single-process peak for data parallelism (analytic, stated).

    ``grad_bytes``: all gradients of one step (trainable parameters × their dtype's size)."""
    if job.ranks <= 1:
        return 0, []
    if job.sharding == "none" and job.fsdp_init != "sharded":
        # FSDP1's NO_SHARD: the flat gradient is all-reduced in place (no DDP bucket copies)
        return 0, ["FSDP NO_SHARD: every rank holds everything; gradients all-reduced in place"]
    if job.sharding == "none":
        extra = int(grad_bytes * DDP_BUCKET_FACTOR)
        return extra, [f"DDP: + gradient buckets ({extra / 2**30:.2f} GiB, "
                       "gradient_as_bucket_view=False)"]
    sharded = shard_breakdown(breakdown, job.ranks)
    gathered = FSDP_PREFETCH_UNITS * per_layer_param_bytes
    return gathered + sum(sharded.values()) - sum(breakdown.values()), [_fsdp_note(job, gathered)]


SHARDED = ("parameters", "gradients", "optimizer")
"""What FSDP FULL_SHARD splits over the ranks (torch/distributed/fsdp: flat parameters, their
gradients after reduce-scatter, and the optimizer states built on the flat shards)."""


def shard_breakdown(breakdown: dict[str, int], ranks: int) -> dict[str, int]:
    """One rank's share of a one-process breakdown under FSDP: the sharded categories ÷ ranks
    (rounded up: a flat parameter is padded to a multiple of the world size), the rest whole."""
    return {k: -(-v // ranks) if k in SHARDED else v for k, v in breakdown.items()}


def frozen_grads_phases(job: JobSpec, source: ModelSource, phases: dict[str, dict[str, int]],
                        trainable_params: int) -> tuple[dict[str, dict[str, int]], list[str]]:
    """FSDP1 flat parameters mixing frozen and trainable weights (``fsdp_frozen_grads``): the
    flat parameter requires a gradient when any member does, so the backward makes the whole
    unit's unsharded gradient, reduce-scatters it and keeps a sharded gradient of the whole
    unit (torch/distributed/fsdp/_flat_param.py; FullyShardedDataParallel's use_orig_params
    docstring).  Added to the FSDP2 step (whose frozen weights get none): the frozen shards'
    gradient in the parameters' dtype, and one unit's unsharded gradient in flight."""
    params = max(b.get("parameters", 0) for b in phases.values())
    trainable_bytes = -(-trainable_params * 4 // job.ranks)  # fp32 adapters: a small share
    frozen = max(0, params - trainable_bytes)
    unit = frozen * job.ranks // max(_layers(source), 1)
    # under no_sync (HF Trainer, Fabric's no_backward_sync) the accumulating micro-steps keep
    # every unit's unsharded gradient: the whole frozen model's, on every rank
    held = frozen * job.ranks if job.fsdp_no_sync and (job.grad_accum or 1) > 1 else 0

    def extra(k: str) -> tuple[int, int]:
        if k.startswith("forward@first") and not held:
            return 0, 0
        if k == "optimizer":
            return frozen, 0
        if held:  # accumulating: the unsharded gradients, sharded ones only from the last sync
            return 0, held
        return frozen, unit
    out = {k: {**b, "gradients": b.get("gradients", 0) + extra(k)[0],
               "data_parallel": b.get("data_parallel", 0) + extra(k)[1]}
           for k, b in phases.items()}
    return out, [f"FSDP1 flat parameters with frozen weights: + their sharded gradient "
                 f"({frozen / 2**30:.2f} GiB) and one unit's unsharded gradient "
                 f"({unit / 2**30:.2f} GiB) in the backward"
                 + (f"; under no_sync the whole frozen model's unsharded gradient "
                    f"({held / 2**30:.2f} GiB) through the accumulation" if held else "")]


def _fsdp_sim_note(job: JobSpec) -> str:
    mp = mixed_precision_policy(job.precision, job.fsdp_reduce_dtype)
    policy = "no mixed-precision policy" if mp.param_dtype is None else (
        f"MixedPrecisionPolicy(param_dtype={str(mp.param_dtype).removeprefix('torch.')}, "
        f"reduce_dtype={str(mp.reduce_dtype).removeprefix('torch.')}): fp32 master shards")
    return (f"FSDP over {job.ranks} ranks: one rank's step run through torch's FSDP2 "
            f"(fully_shard per block + root, {policy}) with a fake process group; "
            "breakdown term data_parallel = gathered parameters and collective buffers")


def _fsdp_note(job: JobSpec, gathered: int) -> str:
    return (f"FSDP over {job.ranks} ranks: parameters/gradients/optimizer states ÷ {job.ranks}, "
            f"+ {FSDP_PREFETCH_UNITS} unsharded layers in flight ({gathered / 2**30:.2f} GiB, "
            "breakdown term data_parallel)")


def _layers(source: ModelSource) -> int:
    """The FSDP units (decoder blocks; encoder + decoder blocks for T5-style models) the
    parameters are spread over.  GPT-2 names its depth ``n_layer``: read as 1 layer, FSDP's two
    layers in flight were twice the whole model."""
    cfg = source.config
    n = next((v for a in ("num_hidden_layers", "n_layer", "num_layers")
              if isinstance(v := getattr(cfg, a, None), int) and v > 0), 1)
    dec = getattr(cfg, "num_decoder_layers", None) if getattr(cfg, "is_encoder_decoder", False) \
        else None
    return n + (dec if isinstance(dec, int) and dec > 0 else 0)


def data_parallel_bytes(job: JobSpec, source: ModelSource, breakdown: dict[str, int],
                        trainable_params: int) -> tuple[int, list[str]]:
    """What data parallelism adds to the one-process step's peak (DDP buckets, FSDP shards),
    from the one-process breakdown; 0 for one rank.  Negative under FSDP (sharding frees more
    than the gathered layers take); :func:`trainfit.memory.predict.finish` instead states it
    as positive terms."""

    grad_bytes = trainable_params * weight_dtypes(job)[1].itemsize
    return _shard_adjust(job, breakdown, breakdown["parameters"] // _layers(source), grad_bytes)


def _gpu_quant_state(job: JobSpec, quant_state_bytes: int) -> int:
    """The quantization state FSDP's CPU offload leaves on the GPU: bitsandbytes' (an attribute
    beside the weight); torchao's NF4 weight is one tensor subclass parameter whose scales
    FSDP moves with it."""
    return quant_state_bytes if job.quant_lib == "bnb" else 0


def host_offload_bytes(job: JobSpec, source: ModelSource, phases: dict[str, dict[str, int]],
                       off: dict[str, dict[str, int]], trainable_params: int,
                       per_rank: bool = False, quant_state_bytes: int = 0,
                       largest_trainable_numel: int = 0,
                       largest_param_bytes: int | None = None) -> int:
    """Host RAM one rank's CPU offload holds: what the rank keeps on the GPU without the offload
    less what it keeps with it (``off``: the job's :func:`rank_phases`, made from ``phases``),
    at the phase they differ most — the parameter shards, fp32
    master, optimizer states and gradients the offload moved (0 without one).  ZeRO-2's host
    gradient is its fp32 partition (the step's fp32 copy, a temporary on the GPU without
    offload), not the 16-bit partition the GPU stops holding, which is left out: 16 B per
    partitioned parameter; ZeRO-3 keeps its 16-bit ``grad_partitions_flat_buffer`` on the host
    as well: 18 B, 20 with ``offload_param`` (docs/notes/multi-gpu-memory-mechanisms.md §5);
    FSDP's CPUOffload: 16 (fp32 shard, gradient, two states).  ZeRO's host-only buffers (ZeRO-2's
    16-bit twin, ZeRO-3's flat parameter buffer) and its pinned blocks' rounding:
    :func:`trainfit.memory.zero_host.zero_host_extra_bytes`, added by the caller."""
    if job.offload == "none":
        return 0
    on_gpu, _ = rank_phases(job.replace(offload="none"), source, phases, trainable_params,
                            per_rank, quant_state_bytes, largest_trainable_numel,
                            largest_param_bytes)
    if job.sharding in ("zero2", "zero3") and "optimizer" in on_gpu:
        # the host holds the fp32 gradient partition (4 B a partitioned value; ZeRO-3: every
        # sub-group's), where the GPU's step makes one sub-group's at a time beside its 16-bit
        # flat copy and the optimizer's temporaries (memory/zero_step.step_temporary_bytes):
        # those have no host twin (DeepSpeed's CPU Adam updates in place)
        part = -(-trainable_params // max(job.ranks, 1))
        on_gpu["optimizer"] = {**on_gpu["optimizer"],
                               "temporaries": -(-4 * part // K_MIN_BLOCK) * K_MIN_BLOCK}
    # buffers: the model's, the same either way, but for what an offload adds on the GPU (ZeRO-2's
    # staging buffer), which is not host memory
    skip = ("gradients", "buffers") if job.sharding == "zero2" else ()
    return max(0, *(sum(v - off[k].get(c, 0) for c, v in on_gpu[k].items() if c not in skip)
                    for k in off))


def rank_phases(job: JobSpec, source: ModelSource, phases: dict[str, dict[str, int]],
                trainable_params: int, per_rank: bool = False, quant_state_bytes: int = 0,
                largest_trainable_numel: int = 0, largest_param_bytes: int | None = None
                ) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Each phase's per-rank breakdown (every term ≥ 0), and the notes; the largest phase is the
    per-rank allocated peak.

    ``phases``: the one-process breakdown at each phase's own peak.  Under FSDP the phase that
    peaks on one rank need not be the one-process peak phase (sharding shrinks the optimizer
    phase by far more than the activation-heavy backward), so every phase is sharded and the
    largest taken; DDP's buckets live through the whole step and add to every phase alike.
    ``per_rank``: the phases were simulated as one rank of a sharded step (FSDP through a fake
    process group): nothing is added or divided (with FSDP's CPU offload the host's part is
    taken out).  DeepSpeed ZeRO: :func:`trainfit.memory.zero.zero_phases`."""
    if job.sharding in ("zero2", "zero3"):
        per_phase, notes = zero_phases(
            job, phases, trainable_params=trainable_params, quant_state_bytes=quant_state_bytes,
            hidden=hidden_size(source), layers=_layers(source),
            compute_bytes=compute_dtype_bytes(job), end_bytes=end_parameter_bytes(job, source),
            largest_trainable_numel=largest_trainable_numel,
            largest_param_bytes=largest_param_bytes)
    elif per_rank:
        per_phase = phases
        notes = [_fsdp_sim_note(job)]
        if job.fsdp_frozen_grads and job.method != "full":
            per_phase, more = frozen_grads_phases(job, source, phases, trainable_params)
            notes += more
        if job.offload == "all":
            per_phase, more = fsdp_offload_phases(per_phase,
                                                  _gpu_quant_state(job, quant_state_bytes))
            notes += more
    elif job.sharding == "fsdp" and job.offload == "all" and job.ranks == 1:
        per_phase, notes = fsdp_offload_phases(phases,
                                               _gpu_quant_state(job, quant_state_bytes))
    elif job.ranks > 1 and job.sharding != "none":
        params = max(b.get("parameters", 0) for b in phases.values())
        gathered = FSDP_PREFETCH_UNITS * (params // _layers(source))
        per_phase = {k: {**shard_breakdown(b, job.ranks), "data_parallel": gathered}
                     for k, b in phases.items()}
        notes = [_fsdp_note(job, gathered)]
    else:
        extra, notes = data_parallel_bytes(job, source, next(iter(phases.values())),
                                           trainable_params)
        notes = [*notes, *filter(None, [unused_parameter_note(source, job.ranks, job.sharding)])]
        per_phase = {k: {**b, **({"data_parallel": extra} if extra else {})}
                     for k, b in phases.items()}
    return per_phase, notes
