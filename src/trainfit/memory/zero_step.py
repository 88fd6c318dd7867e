"""The ZeRO optimizer step on one rank: the job's optimizer run on DeepSpeed's flat fp32
partitions, and the fp32 gradient it is given (deepspeed 0.19.8).

DeepSpeed hands its optimizer one flat, 1-D fp32 tensor per parameter group (ZeRO-2's
``single_partition_of_fp32_groups``) or per sub-group (ZeRO-3's ``fp32_partitioned_groups_flat``),
whatever the model's shapes.  So what the optimizer keeps and makes is that of a 1-D tensor of
the partition's size, not of the model's weights:

* torch's foreach AdamW makes one partition-sized temporary, its for-loop AdamW two
  (``exp_avg_sq.sqrt()`` and its division, alive together); the fused kernels none.  This is
  the optimizer HF Trainer gives DeepSpeed when the configuration has no ``optimizer`` block
  (accelerate's plugin writes none): ``optim="adamw_torch"`` is the foreach one;
  DeepSpeed's own optimizer (a config with an ``optimizer`` block: FusedAdam on a GPU) makes
  none, as torch's fused one.
* Adafactor factors a parameter's second moment only for ≥ 2-D parameters: on the flat partition
  it keeps a full one (4 bytes an element), where the model's matrices would keep two vectors.

What one flat tensor costs is measured by running the job's optimizer itself on a small fp32
tensor on this CPU (:func:`flat_optimizer_bytes`; the foreach and for-loop code is the same
Python on any device), not written down per optimizer.  The gradient's side is from DeepSpeed's
``step`` (:func:`step_temporary_bytes`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from trainfit.job import JobSpec
from trainfit.job.choices import SGD_MOMENTUM

SUB_GROUP_SIZE = 10**9
"""DeepSpeed's ``sub_group_size`` (``runtime/zero/config.py``: ``pp_int(1e9)``), left so by
accelerate's plugin and written so in the HF docs' ZeRO-3 configs."""

_FLAT_ELEMENTS = 1 << 17
"""The measured tensor's size: above bitsandbytes' ``min_8bit_size`` (4096), under which its
8-bit optimizers keep 32-bit states, and its paged optimizers' 100 000 elements, under which they
keep them in device memory (:mod:`trainfit.model.standins`), as a partition of any model that
needs ZeRO is; large enough that the per-tensor scalars (``step``) are ≪ 0.1 % an element."""


@dataclass(frozen=True)
class FlatOptimizerBytes:
    """What the job's optimizer holds and makes for one element of a flat fp32 partition."""

    states_per_element: float
    """Allocator bytes its states keep (a paged optimizer's are managed memory: 0 here)."""
    temporaries_per_element: float
    """Bytes its step has alive above the states at once, beyond the parameter and its gradient."""


@functools.cache
def flat_optimizer_bytes(optimizer: str, optimizer_impl: str, weight_decay: float = 0.0,
                         sgd_momentum: float = SGD_MOMENTUM) -> FlatOptimizerBytes:
    """Run the optimizer the job names (:func:`trainfit.model.workload.make_optimizer`'s) on one
    flat fp32 tensor of :data:`_FLAT_ELEMENTS` for two steps and count, with plan's tracker, the
    states the first leaves and the peak the second reaches above them.  The weight decay is
    applied to the whole partition (HF Trainer's no-decay group, the norms and biases, is its own
    flat partition, stepped after: its share is ≪ 1 %, so this errs over by that)."""
    from trainfit.memory.tracker import LiveBytesTracker
    from trainfit.model.workload import make_optimizer

    momentum = {"sgd_momentum": sgd_momentum} if optimizer == "sgd" else {}
    job = JobSpec(model="flat-partition", optimizer=optimizer, optimizer_impl=optimizer_impl,
                  weight_decay=weight_decay, **momentum)
    n = _FLAT_ELEMENTS
    flat = torch.nn.Parameter(torch.zeros(n))
    flat.grad = torch.full((n,), 1e-3)
    opt = make_optimizer(job, [flat], simulate=True)
    tracker = LiveBytesTracker()
    if hasattr(opt, "managed_ctx"):
        opt.managed_ctx = tracker.managed  # paged states: managed memory, as the simulator books
    # booked first: an in-place op on a storage the tracker has not seen would book it as new
    tracker.track(flat, "parameters")
    tracker.track(flat.grad, "gradients")
    before = tracker.current_bytes
    with tracker:
        opt.step()
        states = tracker.current_bytes
        tracker.set_phase("optimizer")
        opt.step()
    temporaries = max(tracker.phase_peaks.get("optimizer", states) - states, 0)
    return FlatOptimizerBytes((states - before) / n, temporaries / n)


def step_temporary_bytes(job: JobSpec, *, partition: int, largest_partition: int,
                         compute_bytes: int, stage3: bool) -> int:
    """The step's bytes above the partitions, the gradient partition and the optimizer's states,
    on one rank keeping ``partition`` trainable elements (its largest parameter's share:
    ``largest_partition``); the larger of two moments.

    * The cast: the flat gradient in fp32.  ZeRO-2 casts a whole group at once
      (``stage_1_and_2.py`` ``step``: ``self.flatten(averaged_gradients)`` — a copy, ``torch.cat``
      — then ``.to(fp32)``, both alive).  ZeRO-3 goes one optimizer sub-group at a time
      (``stage3.py`` ``_prepare_fp32_grad_for_sub_group``, the same flatten and cast;
      ``_release_sub_group`` frees the fp32 one before the next); a sub-group holds at most
      :data:`SUB_GROUP_SIZE` + its largest parameter's partition − 1 elements
      (``_create_fp16_sub_groups``).  In fp32 mode the cast is the flat copy itself (``.to`` of
      the same dtype returns it).
    * The optimizer: the fp32 gradient and the optimizer's temporaries on the flat partition
      (:func:`flat_optimizer_bytes`), beside the 16-bit gradient partition.  ZeRO-3's is made
      once (``grad_partitions_flat_buffer``).  ZeRO-2's is one buffer over all groups
      (``grads_in_partition``), whose views a group drops only in its own turn
      (``averaged_gradients[i] = None``): with HF Trainer's two groups (decay, no decay) the
      other group's views keep all of it alive while the large one steps (a review: released
      here, a 2-group run's step came 6 % over plan — 7.5 GiB for an 8B model on 2 ranks).  A
      single group's would be gone: that is over-counted (the safe side).

    An audit: the whole partition in fp32 for ZeRO-3 over-counted Llama-3.1-8B on 2 ranks by
    9 GiB (75.9 vs DeepSpeed's own 69.3 GiB estimate), a fitting run refused.  Another: the
    optimizer's temporaries were left out (DeepSpeed's fused Adam assumed); run by DeepSpeed on
    2 gloo ranks with torch's for-loop AdamW the step came 21 % above that (27 % with two
    groups)."""
    elements = min(partition, SUB_GROUP_SIZE + max(largest_partition - 1, 0)) if stage3 \
        else partition
    copy = compute_bytes if compute_bytes != 4 else 0
    cast = elements * (4 + copy)
    temps = flat_optimizer_bytes(job.optimizer, job.optimizer_impl, job.weight_decay,
                                 job.sgd_momentum).temporaries_per_element
    optimizer = elements * 4 + int(elements * temps + 0.5)
    # ZeRO-3 in fp16 checks the whole gradient buffer for overflow before the sub-groups
    # (stage3.py has_overflow: torch.isinf(grad_partitions_flat_buffer), then isnan: a 1-byte
    # bool the partition's size each, one at a time); more than the cast past 6 sub-groups
    # (a review: 70B on 8 ranks, 8.75 against 6 GB)
    check = partition if stage3 and (job.precision or "") == "amp-fp16" else 0
    return max(cast, optimizer, check)
