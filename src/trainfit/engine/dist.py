"""Many ranks: torchrun's environment → a process group, DDP or FSDP, and the collective decisions
every rank must take together (an OOM on one rank makes all ranks split; an interrupt stops all)."""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist


def leave_together(code: int = 0, wait: bool = True) -> NoReturn:
    """A rank whose work is done: wait for the others, destroy the group, flush, and exit without
    the interpreter's teardown, in which gloo's threads were now and then destroyed while
    joinable ("terminate called without an active exception", SIGABRT after every result had
    been written: seen in the 2-rank tests despite ``destroy_process_group`` at exit).
    ``wait``: barrier first (a rank that failed does not wait: the others may never arrive)."""
    if dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Dist:
        """Set up by torchrun / accelerate launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR…)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        d = cls(rank=int(os.environ["RANK"]), world=world,
                local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            # the decisions every rank takes together (any OOM, loss sums, sample ids) travel as
            # small CPU tensors and objects: NCCL carries CUDA tensors only, so on GPUs the group
            # has both backends, gloo for CPU tensors and NCCL for the gradients
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.set_device(d.local_rank)
            dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
            # torch's teardown order otherwise destroys gloo's worker threads while joinable at
            # interpreter exit ("terminate called without an active exception", SIGABRT after the
            # work is done: seen ~1 run in 4 of two CPU ranks); torch asks for this call
            atexit.register(dist.destroy_process_group)
        return d

    def shards(self, sharding: str) -> bool:
        """Whether :meth:`wrap` shards the parameters (then they are DTensors: the optimizer must be
        built over them after wrapping, and checkpoints gather collectively)."""
        return sharding == "fsdp" and self.world > 1

    def wrap(self, model: torch.nn.Module, device: torch.device,
             sharding: str = "none", policy: Any = None, no_sync: bool = False
             ) -> torch.nn.Module:
        """DDP (``sharding: none``) or FSDP full shard (``fsdp``, with the mixed-precision
        ``policy`` of :func:`mixed_precision_policy`) over the ranks; one rank: the model itself —
        FSDP over one rank would shard nothing and only add copies, so it is a no-op there (the
        job's ``sharding`` then changes no number)."""
        if self.world == 1:
            return model
        if sharding == "fsdp":
            return fully_shard_model(model, policy, no_sync=no_sync)
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        return DDP(model, device_ids=ids)

    def any(self, flag: bool) -> bool:
        return flag if self.world == 1 else self.max(1.0 if flag else 0.0) > 0

    def max(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def sum(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def gather_ids(self, ids: list[int]) -> list[int]:
        if self.world == 1:
            return ids
        out: list[list[int] | None] = [None] * self.world
        dist.all_gather_object(out, ids)
        return [i for part in out for i in (part or [])]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks, each its own FSDP unit (gathered just before it runs, freed after):
    modules whose class a transformers model names in ``_no_split_modules`` (what accelerate's
    auto-wrap policy uses; found on any submodule, so a PEFT wrapper's inner model counts), else
    the entries of the ``nn.ModuleList`` holding the most parameters (a custom GPT's ``blocks``, not
    a block's list of experts), else none (the root alone: correct, only without the per-block
    memory saving). Inner modules come before the modules holding them: ``fully_shard`` must
    reach a nested unit before its parent claims the parameters."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if blocks:
        # a unit holding a weight tied to one outside it (BERT's word embeddings, also its
        # output decoder) is left to the root: fully_shard refuses a parameter shared between
        # two groups, and the root holds both of its users
        tied = _tied_parameter_ids(model, blocks)
        blocks = [b for b in blocks if not any(id(p) in tied for p in b.parameters())]
        return blocks[::-1]  # modules() lists a parent before its children
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    if not lists:
        return []
    return list(max(lists, key=lambda ml: sum(p.numel() for p in ml.parameters())))


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of :func:`shard_units` not inside another one, in the model's module order
    (the layers' order in a decoder)."""
    units = shard_units(model)
    inner = {id(m) for b in units for m in b.modules() if m is not b}
    outer = {id(b) for b in units if id(b) not in inner}
    return [m for m in model.modules() if id(m) in outer]


def _tied_parameter_ids(model: torch.nn.Module, blocks: list[torch.nn.Module]) -> set[int]:
    """Parameters with more than one owner, an owner being the innermost of ``blocks`` holding
    the parameter, or the root for one reachable without entering a block: a weight tied across
    blocks (one submodule shared by two layers) or between a block and the root (BERT's word
    embeddings and output decoder).  Owners, not names: one module reachable under two names
    (trainfit's chunked-head wrapper keeps the decoder as ``model`` and ``_decoder``) ties
    nothing — counted by names every weight looked tied, no block was a unit and FSDP gathered
    the whole model at once."""
    owner: dict[int, int] = {}
    tied: set[int] = set()
    for b in blocks[::-1]:  # modules() lists a parent before its children: innermost first
        inside = {id(m) for m in b.modules()}
        for p in b.parameters():
            o = owner.setdefault(id(p), id(b))
            if o != id(b) and o not in inside:  # held by a block that is not nested in b
                tied.add(id(p))
    ids = {id(b) for b in blocks}
    stack, seen = [model], set()
    while stack:  # the root's own: every module reached without entering a block
        m = stack.pop()
        if id(m) in seen or id(m) in ids:
            continue
        seen.add(id(m))
        for p in m._parameters.values():
            if p is not None and id(p) in owner:
                tied.add(id(p))
        stack.extend(c for c in m._modules.values() if c is not None)
    return tied


def mixed_precision_policy(precision: str | None, reduce_dtype: str = "fp32") -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for a job's precision.

    ``amp-bf16`` / ``amp-fp16`` under FSDP are FSDP's mixed precision, as accelerate
    (``mixed_precision: bf16`` → ``MixedPrecisionPolicy(param_dtype=bf16, …)``), torchtitan
    (``mixed_precision_param = "bfloat16"``, ``mixed_precision_reduce = "float32"``) and
    llm-foundry (``mixed_precision: DEFAULT``) run it: fp32 master shards, parameters gathered and
    computed in the low precision, gradients reduce-scattered in ``reduce_dtype`` (``fp32``, or
    ``param``: the low precision).  Not autocast over gathered fp32 weights, which would gather 4
    bytes per parameter and save a low-precision copy of every weight for the backward.  ``fp32``
    and ``bf16-true`` need no policy (the parameters already are what is computed in)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    low = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(precision or "fp32")
    if low is None:
        return MixedPrecisionPolicy()
    reduce = {"fp32": torch.float32, "param": low}[reduce_dtype]
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=reduce)


def fully_shard_model(model: torch.nn.Module, policy: Any = None, mesh: Any = None,
                      no_sync: bool = False) -> torch.nn.Module:
    """FSDP2 (``torch.distributed.fsdp.fully_shard``): per block, then the root (embeddings, final
    norm, head). FSDP2 rather than FSDP1: its parameters stay the model's own (DTensors under the
    same names, no flat-parameter wrapper), so state dicts, PEFT's frozen/trainable mix and gradient
    clipping need no special case; it runs on CPU with gloo (checked on torch 2.13: all-gather,
    reduce-scatter, DTensor grads in ``clip_grad_norm_``), so no FSDP1 fallback is needed. amp-fp16's
    GradScaler works unchanged: DTensor reduces its inf/NaN check over the shards, so all ranks
    skip or take a step together. It replaces the module's parameters in place, so it runs on the
    ``meta`` model before any weight or optimizer exists (:func:`trainfit.model.runtime.build_real`).
    Gradients are reduce-scattered in every micro-step's backward (no accumulation unsharded: that
    would cost the full gradient's memory FSDP is there to save).  ``mesh``: the default group's
    when None (plan's simulation passes the mesh of its fake process group)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = {"mp_policy": policy or MixedPrecisionPolicy(), "mesh": mesh}
    for block in shard_units(model):
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    if no_sync:
        # HF Trainer / accelerate accumulate without reduce-scattering (accelerate's no_sync is
        # FSDP2's set_requires_gradient_sync(False)): train_step enters it before the last
        # micro-step, as it does DDP's no_sync
        model.no_sync = _gradient_sync_off(model)  # type: ignore[assignment]
    return model


def _gradient_sync_off(model: Any) -> Any:
    import contextlib

    @contextlib.contextmanager
    def no_sync() -> Any:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    return no_sync
