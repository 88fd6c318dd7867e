"""FSDP as the library runs it, on data-less tensors: one rank of ``ranks``.

The per-rank memory of a fully-sharded step is not modelled from a formula: the step runs through
torch's own FSDP2 (``torch.distributed.fsdp.fully_shard``, the FSDP that torchtitan, accelerate's
``fsdp_version: 2`` and ``trainfit train`` use) on fake tensors, with torch's *fake process group*
(``torch.testing._internal.distributed.fake_pg``: every collective succeeds without sending a
byte; the buffers FSDP allocates for them are real allocations of the right size).  So what FSDP
holds and when — the sharded fp32 master parameters, the all-gather input (cast to the
``MixedPrecisionPolicy``'s ``param_dtype``) and output buffers, the unsharded parameters of the
running unit and the prefetched next one, the root's parameters kept unsharded between its forward
and backward, the unsharded gradients, the reduce-scatter input in ``reduce_dtype`` and the
sharded gradient, the optimizer states and the optimizer's temporaries on the local shards — is
exactly what torch's code allocates, counted by the same live-bytes tracker as any other step.
torchtitan estimates FSDP memory the same way (``scripts/estimate/estimation.py``: FakeTensorMode
+ fake process group + its memory tracker).

Rank 0 is simulated: FSDP2 pads each parameter's dim-0 split to ``ceil(n / ranks)`` rows, so rank 0
holds the largest shard of every parameter.

What a fake process group cannot show — NCCL's own buffers, the CUDA context of each process — is
added in :mod:`trainfit.memory.predict` and stated there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from trainfit.engine.dist import fully_shard_model, mixed_precision_policy
from trainfit.job import JobSpec

FSDP_CATEGORY = "data_parallel"
"""Tracker category of everything FSDP allocates for its collectives: the gathered parameters,
all-gather and reduce-scatter buffers, mixed-precision casts of the shards."""


def fsdp_simulable(job: JobSpec) -> bool:
    """Whether this job's step is simulated through FSDP itself: FSDP over > 1 rank, in a process
    without a real process group (a real one — a rank under torchrun — cannot be replaced by the
    fake one; the analytic per-rank model of :mod:`trainfit.memory.predict` serves there)."""
    return job.sharding == "fsdp" and job.ranks > 1 and not dist.is_initialized()


@contextlib.contextmanager
def fake_world(ranks: int) -> Iterator[Any]:
    """A fake default process group of ``ranks`` ranks (this process is rank 0) and its 1-D CPU
    device mesh; destroyed on exit so the next simulation may use another world size."""
    # importing the module registers the "fake" backend (torch.distributed.Backend.FAKE)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        # built outside any FakeTensorMode: the mesh is made of real (tiny) tensors
        yield init_device_mesh("cpu", (ranks,))
    finally:
        dist.destroy_process_group()


def shard_model(model: torch.nn.Module, job: JobSpec, mesh: Any) -> None:
    """``fully_shard`` every transformer block, then the root, with the job's mixed-precision
    policy — what ``trainfit train`` runs (:func:`trainfit.engine.dist.fully_shard_model`) —
    applied on the ``meta`` model, before its parameters become fake tensors."""
    fully_shard_model(model, mixed_precision_policy(job.precision, job.fsdp_reduce_dtype), mesh,
                      no_sync=job.fsdp_no_sync)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds the bytes: a DTensor's local shard, else itself."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


@contextlib.contextmanager
def fsdp_bookkeeping(tracker: Any) -> Iterator[None]:
    """Books what FSDP allocates around its collectives as ``data_parallel`` and the sharded
    gradients it leaves as ``gradients``: FSDP2's parameter-group methods are wrapped for the
    duration of one simulation (``FSDPParamGroup`` is FSDP2's unit of all-gather/reduce-scatter)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    originals = {name: getattr(FSDPParamGroup, name)
                 for name in ("unshard", "wait_for_unshard", "reshard", "post_backward")}
    storage_fns = {(mod, name): getattr(mod, name) for mod in (_fsdp_param, _fsdp_param_group)
                   for name in ("alloc_storage", "free_storage") if hasattr(mod, name)}

    def resized(name: str) -> Any:
        orig = storage_fns[(_fsdp_param, name)]

        def wrapper(tensor: torch.Tensor) -> None:
            orig(tensor)  # FSDP frees/allocates by resizing a storage in place: book it
            tracker.resize_storage(tensor, tensor.untyped_storage().size())
        return wrapper

    def booked(name: str) -> Any:
        orig = originals[name]

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            before = tracker.category_override
            tracker.category_override = FSDP_CATEGORY
            try:
                return orig(self, *args, **kwargs)
            finally:
                tracker.category_override = before
                if name == "post_backward":
                    for fp in self.fsdp_params:
                        grad = fp.sharded_param.grad
                        if grad is not None:
                            tracker.reclassify(local(grad), "gradients")
        return wrapper

    default = torch.cpu.current_stream()
    cpu_stream = torch.cpu.stream

    @contextlib.contextmanager
    def on_stream(stream: Any) -> Iterator[None]:
        # FSDP2 makes its collective buffers under ``device_handle.stream(side_stream)``; on a
        # GPU those blocks belong to that stream's pool (the allocator replay keeps them apart)
        before = tracker.stream
        tracker.stream = 0 if stream is default else id(stream)
        try:
            with cpu_stream(stream):
                yield
        finally:
            tracker.stream = before

    for name in originals:
        setattr(FSDPParamGroup, name, booked(name))
    for mod, name in storage_fns:
        setattr(mod, name, resized(name))
    torch.cpu.stream = on_stream
    try:
        yield
    finally:
        torch.cpu.stream = cpu_stream
        for name, fn in originals.items():
            setattr(FSDPParamGroup, name, fn)
        for (mod, name), fn in storage_fns.items():
            setattr(mod, name, fn)
