"""``torch.compile``'s activation memory: each transformer block as AOTAutograd partitions it.

What a compiled step keeps for the backward is decided by AOTAutograd's min-cut partitioner
(torch/_functorch/partitioners.py ``min_cut_rematerialization_partition``, the partitioner
Inductor uses): it traces the block's joint forward+backward graph and saves the cheapest cut —
recomputing elementwise chains (norms, activations, casts, RoPE) in the backward instead of
saving their outputs, as eager autograd does.  Here every block (``engine.dist.shard_units``:
the modules a transformers model names in ``_no_split_modules``) is traced once on the fake
tensors of the simulation with that same partitioner and the two graphs run op by op under the
live-bytes tracker: the saved set is the compiled step's; the ops inside each graph run unfused,
so transients inside a block can only be over-counted (Inductor fuses them into fewer buffers),
never under-counted.  Modules outside the blocks (embedding, final norm, head, loss) run eager
— the same regions Dynamo would compile too, whose savings are not counted (upper bound).

A block whose trace fails (data-dependent Python control flow, an op without a fake kernel) is
run eager and said so: the prediction then is the eager step's, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from trainfit.engine.dist import shard_units

_CONSTANT = (type(None), bool, int, float, str, torch.dtype, torch.device)
"""Non-tensor arguments a trace may treat as constants of the call."""


class _Partitioned:
    """``block.forward`` replaced: the AOTAutograd-partitioned graphs of the block, traced on
    first call per call structure (the non-tensor arguments are constants of the trace)."""

    def __init__(self, block: torch.nn.Module, tracker: Any, failures: list[str]) -> None:
        self.block = block
        self.eager = block.forward
        self.tracker = tracker
        self.failures = failures
        self.traced: dict[Any, Callable[..., Any]] = {}
        self.broken = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            return self.eager(*args, **kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        is_t = tuple(isinstance(x, torch.Tensor) for x in leaves)
        statics = tuple(None if t else x for x, t in zip(leaves, is_t, strict=True))
        if not all(isinstance(x, _CONSTANT) for x in statics):
            # a mutable object (a KV cache, a module) is state the trace would capture: eager
            return self.eager(*args, **kwargs)
        key = (spec, statics, is_t)
        named = list(self.block.named_parameters())
        params = [p for _, p in named]
        tensors = [x for x, t in zip(leaves, is_t, strict=True) if t]
        fn = self.traced.get(key)
        if fn is None:
            fn = self._trace(spec, statics, is_t, [n for n, _ in named], params, tensors)
            if fn is None:
                return self.eager(*args, **kwargs)
            self.traced[key] = fn
        return fn(params, tensors)

    def _trace(self, spec: Any, statics: tuple[Any, ...], is_t: tuple[bool, ...],
               names: list[str], params: list[torch.Tensor], tensors: list[torch.Tensor]
               ) -> Callable[..., Any] | None:
        from functorch.compile import aot_function, make_boxed_func
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        block, eager = self.block, self.eager

        def run(params: list[torch.Tensor], tensors: list[torch.Tensor]) -> Any:
            it = iter(tensors)
            leaves = [next(it) if t else s for s, t in zip(statics, is_t, strict=True)]
            a, kw = tree_unflatten(leaves, spec)
            with _swap_params(block, dict(zip(names, params, strict=True))):
                return eager(*a, **kw)

        def boxed(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
            return make_boxed_func(gm.forward)

        fn = aot_function(run, fw_compiler=boxed, bw_compiler=boxed,
                          partition_fn=min_cut_rematerialization_partition)
        # the first call traces (fake tensors of the trace, not allocations of the step) and
        # runs once: untracked, and with identity saved-tensor hooks so that an enclosing
        # checkpoint does not count this call's saved tensors as the block's
        try:
            with self.tracker.paused(), torch.autograd.graph.saved_tensors_hooks(
                    lambda t: t, lambda t: t):
                out = fn(params, tensors)
            del out
        except Exception as exc:
            self.broken = True
            first = str(exc).splitlines()[0][:160] if str(exc) else ""
            self.failures.append(f"{type(block).__name__}: {type(exc).__name__}: {first}")
            return None
        return fn


@contextlib.contextmanager
def partitioned_blocks(model: torch.nn.Module, tracker: Any) -> Iterator[list[str]]:
    """Inside, every transformer block of ``model`` runs as its AOTAutograd partition; yields the
    list of blocks that could not be traced (they run eager)."""
    failures: list[str] = []
    blocks = shard_units(model)
    for b in blocks:
        b.forward = _Partitioned(b, tracker, failures)  # type: ignore[method-assign]
    try:
        yield failures
    finally:
        for b in blocks:
            del b.forward  # the instance attribute; the class's forward is back


class _swap_params:
    """Binds the block's parameters to the trace's tensors (``torch.func.functional_call`` would
    do it too, but re-enters ``forward`` — which is this wrapper)."""

    def __init__(self, block: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
        self.block, self.values, self.saved = block, values, []

    def __enter__(self) -> None:
        for name, v in self.values.items():
            mod, _, leaf = name.rpartition(".")
            owner = self.block.get_submodule(mod) if mod else self.block
            self.saved.append((owner, leaf, owner._parameters[leaf]))
            owner._parameters[leaf] = v  # type: ignore[assignment]

    def __exit__(self, *exc: Any) -> None:
        for owner, leaf, p in reversed(self.saved):
            owner._parameters[leaf] = p
        self.saved.clear()


def partitions(job: Any, sharded: bool) -> bool:
    """Whether the simulation runs the blocks as their AOTAutograd partition: compiled jobs,
    not under FSDP (its DTensor parameters are not traced here) and not with checkpointing
    (a checkpointed block saves only its inputs either way: Dynamo traces the checkpoint as a
    region the partitioner recomputes)."""
    return bool(job.compile) and not sharded and job.grad_ckpt in (None, "off")


def compile_note(job: Any, untraced: list[str]) -> str:
    """What the prediction of a ``torch.compile`` job is (a plan note)."""
    if not partitions(job, job.sharding == "fsdp" and job.ranks > 1):
        why = "checkpointed blocks save only their inputs" if job.grad_ckpt not in (
            None, "off") else "FSDP's sharded parameters are not traced"
        return (f"torch.compile: memory simulated as the eager step ({why}); the compiled "
                "step's partitioner can only save less (tune measures it)")
    text = ("torch.compile: each block saves what AOTAutograd's min-cut partitioner keeps for "
            "its backward (traced on the simulated step); ops inside a block run unfused, so "
            "its transients are upper bounds; embedding, head and loss are the eager step's")
    if untraced:
        text += f"; blocks that could not be traced ran eager ({'; '.join(sorted(set(untraced)))})"
    return text
