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
— the same regions Dynamo would compile too, whose savings are not counted (upper bound) — but
for a chunked head's loss, which runs as its partition keeps it (model/chunked_head.py:
the chunk and two values per row, no fp32 log-softmax).

A block whose trace fails (data-dependent Python control flow, an op without a fake kernel) is
run eager and said so: the prediction then is the eager step's, as before.

A block's parameters and buffers are inputs of its graphs, so blocks of one structure (a model's
32 identical layers, and the same layers in a later simulation of that model at the same depth)
share one trace per call signature: the trace is the slow part of a compiled plan.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten
from transformers import PretrainedConfig

from trainfit.engine.dist import transformer_blocks
from trainfit.job import JobSpec
from trainfit.memory.semantics import active_device_ops
from trainfit.memory.sharded import fsdp_simulable
from trainfit.memory.tracker import LiveBytesTracker

_CONSTANT = (type(None), bool, int, float, str, torch.dtype, torch.device)
"""Non-tensor arguments a trace may treat as constants of the call."""


@contextlib.contextmanager
def _compiled_region(ops: Any) -> Iterator[None]:
    """The device semantics told that a compiled block is being traced (what transformers does
    differently under Dynamo: :attr:`~trainfit.memory.semantics._DeviceOps.compiled_region`)."""
    if ops is None:
        yield
        return
    before, ops.compiled_region = ops.compiled_region, True
    try:
        yield
    finally:
        ops.compiled_region = before


def _metadata(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.dtype, t.requires_grad)


def _blank(t: torch.Tensor) -> torch.Tensor:
    """A tensor like ``t`` for the trace to hold: AOTAutograd keeps its example inputs alive in
    the graph's metadata, which must not keep the step's own tensors (and their bytes) alive.
    Zeros, not uninitialised memory: the trace's own run on real tensors reads them (token ids
    index an embedding table)."""
    blank = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).zero_()
    return blank.requires_grad_(t.requires_grad)


_PER_LAYER = frozenset({"layer_idx", "training"})
"""Module attributes that differ between a model's layers without changing what a training
step computes: transformers' ``layer_idx`` only addresses the KV cache (not used in training;
an attribute derived from it, as GPT-2's ``scaling`` or a layer type, is compared itself)."""


def _compared(module: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    """The attributes of ``module`` a trace may bake in.  A peft layer's ``kwargs`` are its
    construction arguments (the target's name, per layer), read when an adapter is added,
    never in ``forward`` (peft/tuners/lora/layer.py).  Known by module name, not by importing
    peft: an import inside the step would count its module-level tensors as the step's."""
    tuner = type(module).__module__.startswith("peft.")
    for k, v in vars(module).items():
        if k.startswith("_") or k in _PER_LAYER or (tuner and k == "kwargs"):
            continue
        yield k, v


class _Opaque(Exception):
    """An attribute whose value cannot be compared (an arbitrary object)."""


def _value_key(v: Any, memo: dict[int, Any]) -> Any:
    """``v`` as a hashable value that two equal attributes share: constants, containers of
    them, a transformers config (its JSON), a function (its qualified name), a partial."""
    if isinstance(v, _CONSTANT):
        return v
    if id(v) in memo:
        return memo[id(v)]
    if isinstance(v, (tuple, list)):
        key: Any = (type(v).__name__, tuple(_value_key(x, memo) for x in v))
    elif isinstance(v, dict):
        key = ("dict", tuple(sorted((repr(k), _value_key(x, memo)) for k, x in v.items())))
    elif isinstance(v, PretrainedConfig):
        # the JSON leaves out the attention (and experts) implementation: eager and SDPA blocks
        # of one config are different graphs (tune tries both in one process)
        key = (type(v).__qualname__, v.to_json_string(use_diff=False),
               getattr(v, "_attn_implementation", None),
               getattr(v, "_experts_implementation", None))
    elif isinstance(v, functools.partial):
        key = ("partial", _value_key(v.func, memo), _value_key(v.args, memo),
               _value_key(v.keywords, memo))
    elif isinstance(v, (types.FunctionType, types.BuiltinFunctionType)):
        key = ("fn", v.__module__, v.__qualname__)
    else:
        raise _Opaque(type(v).__name__)
    memo[id(v)] = key
    return key


_contexts = itertools.count()


def _structure(block: torch.nn.Module, named: list[tuple[str, torch.Tensor]],
               context: int, memo: dict[int, Any]) -> tuple[Any, ...]:
    """What makes two blocks the same graph: every submodule's type and plain attributes (the
    constants a trace bakes in: scaling factors, flags, window sizes, peft's per-adapter
    dicts, the model's config) and every parameter's and buffer's name and metadata.  Blocks
    with equal structure share one trace — the graphs take the parameters and buffers as
    inputs — so a 32-layer model is traced once, not 32 times, and a later simulation of the same
    model and shapes traces nothing (the config's JSON holds the depth: a simulation at another
    depth traces again).  A block holding an attribute that
    cannot be compared shares only within its own model (``context``), by object identity."""
    def modules(key_of: Callable[[Any], Any]) -> tuple[Any, ...]:
        return tuple((name, type(m), tuple(sorted((k, key_of(v)) for k, v in _compared(m))))
                     for name, m in block.named_modules())

    try:
        mods, scope = modules(lambda v: _value_key(v, memo)), None
    except _Opaque:
        mods = modules(lambda v: v if isinstance(v, _CONSTANT) else ("id", id(v)))
        scope = context
    return (scope, mods, tuple((n, _metadata(t)) for n, t in named))


_TRACES: collections.OrderedDict[Any, Any] = collections.OrderedDict()
"""Traces of this process, most recently used last: a plan simulates the same blocks in
several configurations.  The graphs hold no tensor of a step (traced on blanks)."""
_TRACES_MAX = 256


@dataclass(frozen=True)
class _Trace:
    """A block's partitioned graphs and the SDPA kernels one call of them runs (the trace
    saw them dispatched; the graphs call the aten kernels directly): a call through the cache
    counts them as the eager call would."""

    fn: Callable[..., Any]
    kernels: dict[str, int]


class _Failed(str):
    """A cached trace that failed (why): the blocks of that structure run eager without
    retrying, each saying so."""


class _Partitioned:
    """``block.forward`` replaced: the AOTAutograd-partitioned graphs of the block, traced on
    first call per call signature (tensor shapes/strides/dtypes, grad mode, autocast, training;
    the non-tensor arguments are constants of the trace) and shared, through ``traces``, with
    every block of the same structure."""

    def __init__(self, block: torch.nn.Module, tracker: LiveBytesTracker,
                 failures: list[str], context: int, memo: dict[int, Any]) -> None:
        self.block = block
        self.eager = block.forward
        self.tracker = tracker
        self.failures = failures
        self.traced = _TRACES
        self.keys: set[Any] = set()
        """The call signatures this block ran traced."""
        self.broken = False
        # parameters and buffers are inputs of the graphs (a buffer captured as a constant of
        # the trace would be a fake tensor inside the graph: BertEmbeddings' position ids)
        self.named = [*block.named_parameters(), *block.named_buffers()]
        self.structure = _structure(block, self.named, context, memo)

    def _fail(self, why: str) -> _Failed:
        self.broken = True
        self.failures.append(f"{type(self.block).__name__}: {why}")
        return _Failed(why)

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
        params = [p for _, p in self.named]
        tensors = [x for x, t in zip(leaves, is_t, strict=True) if t]
        ops = active_device_ops()
        # the target device's semantics decide the graph's kernels (SDPA, dropout, autocast)
        target = None if ops is None else repr(ops.target)
        key = (self.structure, target, spec, statics, is_t,
               tuple(_metadata(t) for t in tensors), torch.is_grad_enabled(),
               torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
               self.block.training)
        fn = self.traced.get(key)
        if fn is None:
            fn = self._trace(spec, statics, is_t, params, tensors, ops)
            self.traced[key] = fn
            while len(self.traced) > _TRACES_MAX:
                self.traced.popitem(last=False)
        else:
            self.traced.move_to_end(key)
            if isinstance(fn, _Failed):
                self._fail(fn)
        if isinstance(fn, _Failed):
            return self.eager(*args, **kwargs)
        self.keys.add(key)
        for kernel, n in fn.kernels.items() if ops is not None else ():
            ops.kernels_used[kernel] = ops.kernels_used.get(kernel, 0) + n
        return fn.fn(params, tensors)

    def _trace(self, spec: Any, statics: tuple[Any, ...], is_t: tuple[bool, ...],
               params: list[torch.Tensor], tensors: list[torch.Tensor], ops: Any
               ) -> _Trace | _Failed:
        """``ops``: the device semantics in force (their kernel counts), None outside them."""
        from functorch.compile import aot_function, make_boxed_func
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch._inductor.decomposition import select_decomp_table

        block, eager = self.block, self.eager
        names = [n for n, _ in self.named]
        calls = [0]

        def run(params: list[torch.Tensor], tensors: list[torch.Tensor]) -> Any:
            calls[0] += 1
            it = iter(tensors)
            leaves = [next(it) if t else s for s, t in zip(statics, is_t, strict=True)]
            a, kw = tree_unflatten(leaves, spec)
            with _bound(block, dict(zip(names, params, strict=True))), _compiled_region(ops):
                return eager(*a, **kw)

        def boxed(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
            return make_boxed_func(gm.forward)

        # Inductor's decompositions: the partitioner cuts the graph Inductor sees (dropout,
        # GELU, layer norm decomposed), not the eager aten ops — GPT-2 with dropout saves 14 %
        # less for its backward that way, as torch.compile does
        def partition(joint: torch.fx.GraphModule, inputs: Any, **kw: Any) -> Any:
            graphs = min_cut_rematerialization_partition(joint, inputs, **kw)
            for gm in graphs:
                _inline_constants(gm)
            return graphs

        fn = aot_function(run, fw_compiler=boxed, bw_compiler=boxed, partition_fn=partition,
                          decompositions=select_decomp_table())
        # the first call traces and runs once on blank inputs, untracked: what the trace keeps
        # (its example inputs, its graphs) is not memory of the step.  Its backward runs too
        # (gradients returned, not accumulated): AOTAutograd compiles the backward graph lazily,
        # and a failure there must send the block to eager now, not break the step's backward
        counts = None if ops is None else ops.kernels_used
        before = dict(counts or {})
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
            return self._fail(f"{type(exc).__name__}: {first}")
        finally:
            # the trace's own calls of the block (AOTAutograd runs it more than once) are not
            # calls of the step: its kernels are counted per call of the graphs instead
            seen = {k: n - before.get(k, 0) for k, n in (counts or {}).items()}
            if counts is not None:
                counts.clear()
                counts.update(before)
        return _Trace(fn, {k: -(-n // max(calls[0], 1)) for k, n in seen.items() if n > 0})


_INLINE_MAX_NUMEL = 256
"""Largest tensor constant written into a graph as ops (index lists, scalars)."""


def _inline_constants(gm: torch.fx.GraphModule) -> None:
    """A real tensor constant of a graph (``x[..., [-2]]`` makes one: Falcon's attention) made
    by ops of the graph instead: AOTAutograd deep-copies the backward graph when it compiles
    it, and copying a real tensor inside the simulation's fake mode fails; the ops run on fake
    tensors like the rest (a few bytes, tracked).  A larger constant stays (the block then fails
    to trace and runs eager, said)."""
    from torch._subclasses.fake_tensor import is_fake

    inlined: set[str] = set()
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target, None)
        if (not isinstance(value, torch.Tensor) or is_fake(value)
                or not 0 < value.numel() <= _INLINE_MAX_NUMEL or value.requires_grad):
            continue
        graph = gm.graph
        with graph.inserting_before(node):
            scalars = [graph.call_function(torch.ops.aten.scalar_tensor.default, (x,),
                                           {"dtype": value.dtype, "device": value.device})
                       for x in value.flatten().tolist()]
            made = graph.call_function(torch.ops.aten.view.default, (
                graph.call_function(torch.ops.aten.stack.default, (scalars,)),
                list(value.shape)))
        node.replace_all_uses_with(made)
        graph.erase_node(node)
        inlined.add(node.target)
    for target in inlined:  # after the loop: two get_attr nodes may read one constant
        delattr(gm, target)
    if inlined:
        gm.recompile()


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def partitioned_blocks(model: torch.nn.Module, tracker: LiveBytesTracker
                       ) -> Iterator[list[str]]:
    """Inside, every transformer block of ``model`` runs as its AOTAutograd partition; yields the
    list of blocks that could not be traced (they run eager)."""
    failures: list[str] = []
    context, memo = next(_contexts), {}
    blocks = transformer_blocks(model)
    before = [vars(b).get("forward") for b in blocks]
    for b in blocks:
        b.forward = _Partitioned(b, tracker, failures, context, memo)  # type: ignore[method-assign]
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
    """The block's parameters and buffers bound to the trace's tensors
    (``torch.func.functional_call`` would do it too, but calls ``forward`` — which is the
    wrapper)."""
    saved = []
    try:
        for name, v in values.items():
            mod, _, leaf = name.rpartition(".")
            owner = block.get_submodule(mod) if mod else block
            slots = owner._parameters if leaf in owner._parameters else owner._buffers
            saved.append((slots, leaf, slots[leaf]))
            slots[leaf] = v
        yield
    finally:
        for slots, leaf, p in reversed(saved):
            slots[leaf] = p


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
                "step's partitioner can only save less (tune measures it)" + _mask_clause(job))
    text = ("torch.compile: each block saves what AOTAutograd's min-cut partitioner keeps for "
            "its backward (traced on the simulated step, Inductor's decompositions); ops inside "
            "a block run unfused, so its transients are upper bounds; the modules outside the "
            "blocks (the model's _no_split_modules: usually embedding, head and loss) are the "
            "eager step's; one graph per block is assumed (torchtune, torchtitan): a "
            "whole-model graph under gradient accumulation also holds a second copy of the "
            "gradients at the end of each backward after the first (not counted)")
    if untraced:
        text += f"; blocks that could not be traced ran eager ({'; '.join(sorted(set(untraced)))})"
    return text + _mask_clause(job)


def _mask_clause(job: JobSpec) -> str:
    """The compiled step's attention mask (``compile_builds_mask``), which makes a compiled row
    hold more and run slower than the eager one (an audit: "memory simulated as the eager
    step" sat under a compiled row 0.64 GiB above it, predicted slower, with no word why)."""
    if not job.compile_builds_mask:
        return ""
    return ("; unlike the eager step, the model builds a batch × 1 × seq × seq attention mask "
            "each step (transformers' masking cannot skip it while Dynamo traces), which SDPA "
            "keeps per layer and which takes attention off the flash kernel (memory-efficient "
            "or cuDNN's): more memory and, often, a slower step than eager — model code that "
            "calls SDPA with is_causal (torchtune, torchtitan, litgpt) has none: "
            "--no-compile-builds-mask")
