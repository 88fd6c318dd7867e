"""What DeepSpeed ZeRO's CPU offload holds in host RAM beyond the GPU-side difference, per rank.

:func:`trainfit.memory.ranks.host_offload_bytes` counts what the offload moves off the GPU (the
fp32 master, the optimizer states, the fp32 gradient partition, ZeRO-3's 16-bit gradient buffer
and, with ``offload_param``, the 16-bit parameter partitions).  The host holds more, read in
DeepSpeed 0.19.8's code:

* ZeRO-2 ``offload_optimizer`` (``stage_1_and_2.py`` ``DeepSpeedZeroOptimizer.__init__``):
  ``param_buffer_of_bit16_for_cpu_offload_groups``, a 16-bit twin of the rank's partition (the
  updated weights' way back to the GPU), and ``temp_grad_buffer_for_cpu_offload``, the largest
  trainable parameter in 16 bits — host-only, uncounted.  With ``pin_memory`` the fp32 partition,
  its fp32 gradient, the twin and the buffer are each pinned (``get_accelerator().pin_memory``);
  the optimizer states, made by ``zeros_like``, are not.
* ZeRO-3 ``offload_optimizer`` (``stage3.py``): ``grad_partitions_flat_buffer``, the rank's
  16-bit gradient partition in one tensor (counted), pinned with ``pin_memory``; the fp32
  gradient of each optimizer sub-group (``subgroup_gradient_buffer``: ``sub_group_size``
  elements, 1e9 by default — a sub-group closes at the parameter that reaches it), pinned with
  ``pin_memory``; the fp32 master (``.to(cpu).clone()``) and the states unpinned.
* ZeRO-3 ``offload_param``: ``zero.Init`` (``partition_parameters.py``, ``_partition_param``)
  puts each parameter's partition on the host, pinned with ``pin_memory`` (counted once, its
  rounding: :func:`zero3_param_blocks`); the optimizer then copies the trainable ones into one
  flat buffer per parameter group (``_create_param_groups_fp16_flat_cpu_memory``), pinned
  whatever ``pin_memory`` says, and frees the per-parameter ones — which PyTorch's pinned cache
  keeps (it gives nothing back unless told to): the flat buffer is host memory on top; without
  ``pin_memory`` the per-parameter ones were plain host tensors, freed: the flat buffer takes
  their place.
* fp32 mode: the parameters are the master, but DeepSpeed clones them onto the host for the
  offloaded optimizer all the same (ZeRO-2's ``single_partition_of_fp32_groups``, pinned with
  ``pin_memory``; ZeRO-3's ``.to(cpu).clone()``, not pinned), counted with the GPU-side terms
  as both clone it without an offload too (memory.zero).

Each pinned tensor comes from PyTorch's ``CachingHostAllocator``, which rounds it up to a power
of two (:mod:`trainfit.memory.host_offload`).  The flat buffers are sized here from the whole
model's trainable count (a plan row extrapolated from small simulations has it; their rounding is
not affine in depth); the per-parameter blocks come from the simulated model, one list per layer,
affine in depth (``SimResult.info["pinned_shards"]``).
"""

from __future__ import annotations

from typing import Any

from trainfit.memory.host_offload import pow2_ceil
from trainfit.memory.zero import compute_dtype_bytes
from trainfit.memory.zero_step import SUB_GROUP_SIZE


def _offloaded(job: Any) -> bool:
    return job.sharding in ("zero2", "zero3") and job.offload != "none"


def sub_group_pinned_bytes(partition: int, largest: int, elem: int = 4) -> int:
    """At most what ZeRO-3's optimizer sub-groups' pinned fp32 gradients hold for a rank's
    ``partition`` elements (``elem`` bytes each).  A sub-group closes at the parameter that takes
    it to ``SUB_GROUP_SIZE`` (``stage3.py`` ``_create_fp16_sub_groups``): k closed ones of at
    least SUB_GROUP_SIZE and at most SUB_GROUP_SIZE + the ``largest`` partition − 1 elements,
    and the rest, at most ``partition`` − k × SUB_GROUP_SIZE, each its power-of-two block; the
    most over every k the partition allows (a review: cutting the closed ones at their largest
    left the rest too small, its block under-counted by 1 GiB for Llama-2-7B on 2 ranks)."""
    most = SUB_GROUP_SIZE + max(largest - 1, 0)  # a sub-group's most elements, the last's too
    closed = pow2_ceil(elem * most)
    least_k = max(0, -(-partition // most) - 1)  # the rest holds at most `most` elements
    return max(k * closed + pow2_ceil(elem * min(max(partition - k * SUB_GROUP_SIZE, 0), most))
               for k in range(least_k, max(least_k, partition // SUB_GROUP_SIZE) + 1))


def zero_host_extra_bytes(job: Any, trainable_params: int, largest_numel: int) -> int:
    """One rank's host bytes of a ZeRO offload beyond the GPU-side difference
    (:func:`trainfit.memory.ranks.host_offload_bytes`): the buffers it does not count, and each
    pinned block's rounding up to a power of two (pinned: ``zero_pin_memory``, or always where
    DeepSpeed pins whatever the config says), ZeRO-2's accumulation buffer among them
    (:func:`zero2_accumulation_bytes`).  0 without a ZeRO offload."""
    if not _offloaded(job):
        return 0
    pin = job.zero_pin_memory
    ranks = max(job.ranks, 1)
    elem = compute_dtype_bytes(job)
    part = -(-trainable_params // ranks)
    extra = 0

    def held(nbytes: int, counted: bool, pinned: bool) -> int:
        return (pow2_ceil(nbytes) if pinned else nbytes) - (nbytes if counted else 0)

    if job.sharding == "zero2":
        # the fp32 partition (a clone in fp32 mode too, counted on the GPU side either way:
        # memory.zero.zero_phases) and its fp32 gradient; the 16-bit twin and the staging
        # buffer, host-only
        extra += held(4 * part, True, pin) + held(4 * part, True, pin)
        extra += held(elem * part, False, pin) + held(elem * largest_numel, False, pin)
        return extra + zero2_accumulation_bytes(job, trainable_params, largest_numel)
    # ZeRO-3: the 16-bit gradient buffer; the sub-groups' fp32 gradients (in fp32 mode the
    # master's clone, .to(cpu).clone(), unpinned, is counted on the GPU side: memory.zero)
    extra += held(elem * part, True, pin)
    extra += (sub_group_pinned_bytes(part, -(-largest_numel // ranks)) - 4 * part) if pin else 0
    if job.offload == "all":
        # the optimizer's flat 16-bit buffer of the trainable partitions, pinned always: on top
        # of the per-parameter blocks PyTorch's pinned cache keeps when those were pinned; in
        # their place (counted) when they were not
        extra += held(elem * part, not pin, True)
    return extra


def zero3_param_blocks(job: Any, model: Any) -> list[int] | None:
    """ZeRO-3 ``offload_param`` with ``pin_memory``: the bytes of each parameter's pinned host
    partition ``zero.Init`` made (counted by the GPU-side difference: their rounding is the
    extra), on one rank of the simulated model — every parameter: ``ds_persist`` is still false
    when ``zero.Init`` partitions (the engine marks the persistent ones later, their host
    partition kept).  None otherwise."""
    if job.sharding != "zero3" or job.offload != "all" or not job.zero_pin_memory:
        return None
    ranks = max(job.ranks, 1)
    return [-(-p.numel() // ranks) * p.element_size() for p in model.parameters()]


def zero2_accumulation_bytes(job: Any, trainable_params: int, largest_numel: int) -> int:
    """ZeRO-2 offload with gradient accumulation: ``accumulated_grads_in_cpu``, a host buffer of
    each parameter of the rank's partition at its full numel, in the 16-bit dtype
    (``stage_1_and_2.py`` ``async_accumulate_grad_in_cpu_via_gpu``, called on every micro-step
    but the lone one of a step without accumulation).  0.19's compact partition path skips it
    only with ``data_types.grad_accum_dtype: fp32`` set in bf16/fp16 mode (not the default).
    The partition's two edge parameters are whole on both ranks they straddle: at most the
    partition and twice the largest parameter (a bound, never under); with ``zero_pin_memory``
    each is a power-of-two block: twice that, a bound.  0 otherwise."""
    if job.sharding != "zero2" or job.offload == "none" or (job.grad_accum or 1) <= 1:
        return 0
    ranks = max(job.ranks, 1)
    held = compute_dtype_bytes(job) * (-(-trainable_params // ranks) + 2 * largest_numel)
    # pinned, each parameter's buffer is its own power-of-two block: under twice its bytes
    return 2 * held if job.zero_pin_memory else held
