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
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from trainfit.engine.dist import shard_units
from trainfit.job import JobSpec
from trainfit.memory.sharded import fsdp_simulable
from trainfit.memory.tracker import LiveBytesTracker

_CONSTANT = (type(None), bool, int, float, str, torch.dtype, torch.device)
"""Non-tensor arguments a trace may treat as constants of the call."""


def _metadata(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.dtype, t.requires_grad)


def _blank(t: torch.Tensor) -> torch.Tensor:
    """A tensor like ``t`` for the trace to hold: AOTAutograd keeps its example inputs alive in
    the graph's metadata, which must not keep the step's own tensors (and their bytes) alive."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                               device=t.device).requires_grad_(t.requires_grad)


class _Partitioned:
    """``block.forward`` replaced: the AOTAutograd-partitioned graphs of the block, traced on
    first call per call signature (tensor shapes/strides/dtypes, grad mode, autocast, training;
    the non-tensor arguments are constants of the trace)."""

    def __init__(self, block: torch.nn.Module, tracker: LiveBytesTracker,
                 failures: list[str]) -> None:
        self.block = block
        self.eager = block.forward
        self.tracker = tracker
        self.failures = failures
        self.traced: dict[Any, Callable[..., Any]] = {}
        self.broken = False

    def _fail(self, why: str) -> None:
        self.broken = True
        self.failures.append(f"{type(self.block).__name__}: {why}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            return self.eager(*args, **kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        is_t = tuple(isinstance(x, torch.Tensor) for x in leaves)
        statics = tuple(None if t else x for x, t in zip(leaves, is_t, strict=True))
        odd = next((x for x in statics if not isinstance(x, _CONSTANT)), None)
        if odd is not None:
            # a mutable object (a KV cache, a module) is state a trace would capture
            self._fail(f"argument of type {type(odd).__name__} is not a constant")
            return self.eager(*args, **kwargs)
        named = list(self.block.named_parameters())
        params = [p for _, p in named]
        tensors = [x for x, t in zip(leaves, is_t, strict=True) if t]
        key = (spec, statics, is_t, tuple(_metadata(t) for t in tensors),
               torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"),
               torch.get_autocast_dtype("cpu"), self.block.training)
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
        from torch._inductor.decomposition import select_decomp_table

        block, eager = self.block, self.eager

        def run(params: list[torch.Tensor], tensors: list[torch.Tensor]) -> Any:
            it = iter(tensors)
            leaves = [next(it) if t else s for s, t in zip(statics, is_t, strict=True)]
            a, kw = tree_unflatten(leaves, spec)
            with _bound(block, dict(zip(names, params, strict=True))):
                return eager(*a, **kw)

        def boxed(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
            return make_boxed_func(gm.forward)

        # Inductor's decompositions: the partitioner cuts the graph Inductor sees (dropout,
        # GELU, layer norm decomposed), not the eager aten ops — GPT-2 with dropout saves 14 %
        # less for its backward that way, as torch.compile does
        fn = aot_function(run, fw_compiler=boxed, bw_compiler=boxed,
                          partition_fn=min_cut_rematerialization_partition,
                          decompositions=select_decomp_table())
        # the first call traces and runs once on blank inputs, untracked: what the trace keeps
        # (its example inputs, its graphs) is not memory of the step.  Its backward runs too
        # (gradients returned, not accumulated): AOTAutograd compiles the backward graph lazily,
        # and a failure there must send the block to eager now, not break the step's backward
        try:
            # fake-tensor kernels log each failure at ERROR before raising: the fallback says it
            with self.tracker.paused(), _quiet("torch._subclasses.fake_tensor"):
                blanks = [_blank(t) for t in tensors]
                out = fn(params, blanks)
                outs = [o for o in tree_leaves(out)
                        if isinstance(o, torch.Tensor) and o.requires_grad]
                wrt = [t for t in (*params, *blanks) if t.requires_grad]
                if outs and wrt:
                    torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs],
                                        allow_unused=True)
            del out, outs, blanks
        except Exception as exc:
            first = str(exc).splitlines()[0][:160] if str(exc) else ""
            self._fail(f"{type(exc).__name__}: {first}")
            return None
        return fn


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _outermost(blocks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The blocks not inside another block (a nested one is traced within its parent)."""
    inner = {id(m) for b in blocks for m in b.modules() if m is not b}
    return [b for b in blocks if id(b) not in inner]


@contextlib.contextmanager
def partitioned_blocks(model: torch.nn.Module, tracker: LiveBytesTracker
                       ) -> Iterator[list[str]]:
    """Inside, every transformer block of ``model`` runs as its AOTAutograd partition; yields the
    list of blocks that could not be traced (they run eager)."""
    failures: list[str] = []
    blocks = _outermost(shard_units(model))
    before = [vars(b).get("forward") for b in blocks]
    for b in blocks:
        b.forward = _Partitioned(b, tracker, failures)  # type: ignore[method-assign]
    try:
        yield failures
    finally:
        for b, f in zip(blocks, before, strict=True):
            if f is None:
                del b.forward  # the class's forward is back
            else:
                b.forward = f  # type: ignore[method-assign]


@contextlib.contextmanager
def _bound(block: torch.nn.Module, values: dict[str, torch.Tensor]) -> Iterator[None]:
    """The block's parameters bound to the trace's tensors (``torch.func.functional_call``
    would do it too, but calls ``forward`` — which is the wrapper)."""
    saved = []
    try:
        for name, v in values.items():
            mod, _, leaf = name.rpartition(".")
            owner = block.get_submodule(mod) if mod else block
            saved.append((owner, leaf, owner._parameters[leaf]))
            owner._parameters[leaf] = v  # type: ignore[assignment]
        yield
    finally:
        for owner, leaf, p in reversed(saved):
            owner._parameters[leaf] = p


def runs_partitioned(job: JobSpec, sharded: bool) -> bool:
    """Whether the simulation runs the blocks as their AOTAutograd partition: compiled jobs,
    not under FSDP (its DTensor parameters are not traced here) and not with checkpointing
    (a checkpointed block's saved set is its checkpoint's either way: Dynamo traces the
    checkpoint as a region the partitioner recomputes)."""
    return bool(job.compile) and not sharded and job.grad_ckpt in (None, "off")


def compiled_blocks(job: JobSpec, model: torch.nn.Module, tracker: LiveBytesTracker,
                    sharded: bool) -> contextlib.AbstractContextManager[list[str] | None]:
    """:func:`partitioned_blocks` when the simulation runs this job's blocks partitioned
    (yields the untraced blocks), else nothing (yields None)."""
    if runs_partitioned(job, sharded):
        return partitioned_blocks(model, tracker)
    return contextlib.nullcontext(None)


def compile_note(job: JobSpec, untraced: list[str], partitioned: bool | None = None) -> str:
    """What the prediction of a ``torch.compile`` job is (a plan note); ``partitioned``: what
    the simulation did (None: what it does for this job on one process)."""
    if partitioned is None:
        partitioned = runs_partitioned(job, fsdp_simulable(job))
    if not partitioned:
        why = "a checkpointed block's saved set is its checkpoint's" if job.grad_ckpt not in (
            None, "off") else "FSDP's sharded parameters are not traced"
        return (f"torch.compile: memory simulated as the eager step ({why}); the compiled "
                "step's partitioner can only save less (tune measures it)")
    text = ("torch.compile: each block saves what AOTAutograd's min-cut partitioner keeps for "
            "its backward (traced on the simulated step, Inductor's decompositions); ops inside "
            "a block run unfused, so its transients are upper bounds; embedding, head and loss "
            "are the eager step's; one graph per block is assumed (torchtune, torchtitan): a "
            "whole-model graph under gradient accumulation also holds a second copy of the "
            "gradients at the end of each backward after the first (not counted)")
    if untraced:
        text += f"; blocks that could not be traced ran eager ({'; '.join(sorted(set(untraced)))})"
    return text
