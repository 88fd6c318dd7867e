"""Live-bytes tracker: the predicted ``max_memory_allocated`` of a step run on data-less tensors.

Every tensor storage created while the tracker is active is registered with its size and a weak
reference; when the storage dies its bytes are released.  The maximum of the running total is the
peak.  This is the mechanism of ``torch.distributed._tools.mem_tracker.MemTracker`` reduced to what
we need: the stock tracker registers grad hooks on every parameter (it crashes on frozen LoRA base
weights) and snapshots every module (100+ s per 7B step); keeping only live bytes, the global peak
and one snapshot per new peak costs ~5 % over the untracked step (see docs/notes/memory-simulation.md).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary, weakref

from trainfit.memory.allocator import EMPTY_CACHE_UID, HISTORY_UID
from trainfit.memory.kernel_workspace import WORKSPACES

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "buffers",
              "data_parallel")
"""``data_parallel``: what FSDP allocates for its collectives (gathered parameters, all-gather and
reduce-scatter buffers) when the step runs sharded (:mod:`trainfit.memory.sharded`)."""
MANAGED = "managed"
"""Category of bytes in CUDA managed memory (paged optimizer states): on the device while they fit,
but not in the caching allocator's statistics."""


def _storage(t: torch.Tensor) -> Any:
    """The storage holding ``t``'s bytes: a DTensor's (FSDP's) local shard's, else its own."""
    inner = getattr(t, "_local_tensor", None)
    return (inner if isinstance(inner, torch.Tensor) else t).untyped_storage()


@dataclass
class _Block:
    nbytes: int
    category: str
    phase: str
    uid: int = 0


@dataclass
class PeakSnapshot:
    """What was alive when the running total reached its maximum."""

    peak_bytes: int = 0
    phase: str = "setup"
    blocks: list[_Block] = field(default_factory=list)
    """The blocks alive at the peak, shared with the tracker: a later reclassification (gradients
    after accumulation, optimizer states after the step) moves them here too."""
    sizes: list[int] = field(default_factory=list)
    """Each block's bytes at the peak: FSDP resizes its unsharded parameters' storage in place
    after the peak (to 0 at reshard), so the shared block's ``nbytes`` is not the peak's (the
    breakdown of an FSDP rank summed 125 MiB short of its peak, booked as allocator blocks)."""

    def breakdown(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for b, nbytes in zip(self.blocks, self.sizes, strict=True):
            if b.category != MANAGED:
                out[b.category] += nbytes
        return out


_PRIM_DEVICE = torch.ops.prim.device.default
_ADD = torch.ops.aten.add.Tensor


@dataclass
class _State:
    """The tracker's totals just after an out-of-place gradient accumulation (its peak check
    waits until it is known whether the engine would have added in place)."""

    cur: int
    cat: dict[str, int]
    next_id: int
    phase: str
    phase_key: str
    alive: list[_Block] | None
    """The live blocks, taken only when the totals are a new global peak."""


def _plain(t: Any) -> bool:
    """A tensor the real step holds as a stock tensor (a fake one stands for one); not a subclass
    the real step has too (DTensor: the engine accumulates those out of place there as well)."""
    return type(t) is torch.Tensor or isinstance(t, FakeTensor)


def _from_engine() -> bool:
    """The op running now was issued by the autograd engine's C++ (no Python frame between it and
    the backward call), not by a Python backward, hook or recomputation."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if name == __file__ or "torch/_dynamo/" in name or name.endswith("torch/_compile.py"):
            f = f.f_back  # this module, the dispatch wrappers Dynamo puts around a mode
            continue
        return f.f_code.co_name == "_engine_run_backward" and name.endswith("autograd/graph.py")
    return False


class LiveBytesTracker(TorchDispatchMode):
    """Counts the bytes of live tensor storages and remembers the peak.

    ``block_bytes``: allocation granularity.  CUDA's caching allocator rounds every block up to 512
    bytes (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp); the CPU allocator does not round.
    """

    def __init__(self, block_bytes: int = 1) -> None:
        super().__init__()
        self.block_bytes = block_bytes
        self._live: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._alive: dict[int, _Block] = {}
        """uid → block of every live storage: a plain dict, so a peak snapshot is one C-level copy
        (iterating the weak-key dictionary cost ~20 % of a 7B simulation)."""
        self._refs: dict[int, Any] = {}
        """uid → the weak reference whose callback releases the block: removed with the block, so
        a long run (``train --memory-limit``) holds one entry per *live* storage, not one per
        storage ever created."""
        self.current_bytes = 0
        self.phase = "setup"
        self._phase_key = "setup"
        self.peak = PeakSnapshot()
        self.phase_peaks: dict[str, int] = {}
        self.managed_bytes = 0
        self.peak_managed_bytes = 0
        self._managed_depth = 0
        self.record_events = False
        self.events: list[tuple[int, int]] = []
        """(block id, +bytes) on allocation, (block id, -bytes) on free, in order, for replaying
        through the caching-allocator model."""
        self.event_phases: list[tuple[int, str]] = []
        """(index into ``events``, phase) where each phase of the recorded trace begins (the
        depth extension of a trace runs the backward's layers in reverse: depth_trace)."""
        self._next_id = 0
        self.op_hook: Any = None
        """Called as ``hook(func, args, kwargs, out, phase, micro_step)`` after every op (the
        speed model's recorder)."""
        self._micro = 0
        self._cat_bytes: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        """Live allocator bytes by category, kept up to date on every allocation and free."""
        self.phase_breakdowns: dict[str, dict[str, int]] = {}
        """Phase key → bytes by category at that phase's own peak (they sum to ``phase_peaks``).
        Extrapolation and data parallelism need what was alive at *each* phase's peak: the
        global peak's mix says nothing about the other phases, and the peak moves between
        phases as the micro-batch grows."""
        self._phase_peak_uid: dict[str, int] = {}
        self.stream: int = 0
        """The stream allocations are made on (0: the default stream).  CUDA's caching allocator
        reuses a freed block only for requests of the stream it was allocated on, so FSDP's
        collective buffers (made on its all-gather and reduce-scatter streams) form pools of
        their own: :func:`trainfit.memory.sharded.fsdp_bookkeeping` sets it."""
        self.event_streams: dict[int, int] = {}
        """Block id → stream, for the blocks allocated on a stream other than the default."""
        self.category_override: str | None = None
        """When set, every tensor an op creates is booked in this category (FSDP's collectives:
        :func:`trainfit.memory.sharded.fsdp_bookkeeping`)."""
        self._paused = 0
        self._pending: tuple[_Block, _Block, Any, _State] | None = None
        """An out-of-place gradient accumulation whose booking waits for the next event
        (:meth:`_settle`)."""

    @contextlib.contextmanager
    def managed(self) -> Iterator[None]:
        """Allocations inside are booked as CUDA managed memory, not allocator bytes."""
        self._managed_depth += 1
        try:
            yield
        finally:
            self._managed_depth -= 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Ops inside are neither booked nor passed to the op hook (a compiler tracing the step
        on fake tensors: :mod:`trainfit.memory.compiled`)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    # --- registration ---------------------------------------------------------------------
    def _rounded(self, nbytes: int) -> int:
        if self.block_bytes <= 1:
            return nbytes
        return math.ceil(nbytes / self.block_bytes) * self.block_bytes

    def _register(self, t: torch.Tensor, category: str) -> _Block | None:
        st = _storage(t)
        blk = self._live.get(st)
        if blk is not None:
            return blk
        nbytes = self._rounded(st.nbytes())
        self._next_id += 1
        if self._managed_depth:
            blk = _Block(nbytes, MANAGED, self.phase, self._next_id)
            self._live[st] = blk
            self.managed_bytes += nbytes
            self.peak_managed_bytes = max(self.peak_managed_bytes, self.managed_bytes)
            self._refs[blk.uid] = weakref.ref(st, lambda _r, b=blk: self._release(b))
            return blk
        blk = self._book(nbytes, category)
        self._live[st] = blk
        self._refs[blk.uid] = weakref.ref(st, lambda _r, b=blk: self._release(b))
        return blk

    def _book(self, nbytes: int, category: str) -> _Block:
        """A new allocator block of ``nbytes`` (the id already drawn): counted live, in the
        trace when one is recorded."""
        blk = _Block(nbytes, category, self.phase, self._next_id)
        self._alive[blk.uid] = blk
        self.current_bytes += nbytes
        self._cat_bytes[category] = self._cat_bytes.get(category, 0) + nbytes
        if self.record_events:
            self.events.append((blk.uid, nbytes))
            if self.stream:
                self.event_streams[blk.uid] = self.stream
        return blk

    def _release(self, blk: _Block) -> None:
        self._refs.pop(blk.uid, None)
        if blk.category == MANAGED:
            self.managed_bytes -= blk.nbytes
        else:
            self.current_bytes -= blk.nbytes
            self._cat_bytes[blk.category] -= blk.nbytes
            self._alive.pop(blk.uid, None)
            if self.record_events:
                self.events.append((blk.uid, -blk.nbytes))

    def resize_storage(self, t: torch.Tensor, nbytes: int) -> None:
        """``t``'s storage was resized in place to ``nbytes`` (FSDP frees and re-allocates its
        unsharded parameters with ``untyped_storage().resize_``, which no op reports): booked as
        a free of the old block and, when ``nbytes`` > 0, an allocation of a new one."""
        self._settle()
        blk = self._live.get(t.untyped_storage())
        if blk is None or blk.category == MANAGED:
            return
        new = self._rounded(nbytes)
        if new == blk.nbytes:
            return
        self.current_bytes += new - blk.nbytes
        self._cat_bytes[blk.category] += new - blk.nbytes
        if self.record_events:
            if blk.nbytes:
                self.events.append((blk.uid, -blk.nbytes))
            if new:
                self._next_id += 1
                self._alive.pop(blk.uid, None)
                ref = self._refs.pop(blk.uid, None)
                blk.uid = self._next_id
                self._alive[blk.uid] = blk
                if ref is not None:  # the storage's weak reference follows its block's id
                    self._refs[blk.uid] = ref
                self.events.append((blk.uid, new))
                if self.stream:
                    self.event_streams[blk.uid] = self.stream
        blk.nbytes = new
        self._check_peak()

    def track(self, t: torch.Tensor, category: str) -> None:
        """Register a tensor created outside the tracker (parameters, buffers, the batch)."""
        self._settle()
        self._register(t, category)
        self._check_peak()

    def adopt(self, t: torch.Tensor, category: str) -> None:
        """Know ``t``'s storage without booking its bytes: a view into a block booked on its own
        (FSDP1's parameters are views into their unit's flat parameter, booked by
        :mod:`trainfit.memory.wrap`), so an op writing into it in place books nothing new."""
        self._settle()
        st = _storage(t)
        if self._live.get(st) is None:
            self._next_id += 1
            self._live[st] = _Block(0, category, self.phase, self._next_id)

    def history(self, nbytes: int, uid: int | None = None) -> int:
        """Record, in the trace only, an allocation of ``nbytes`` (``uid`` None; returns its id)
        or the free of block ``uid``, made before the step: it takes and leaves segments in the
        allocator replay, never counts in the step's allocated bytes (ids ≥ ``HISTORY_UID``)."""
        self._settle()
        if uid is None:
            self._next_id += 1
            uid = HISTORY_UID + self._next_id
            if self.record_events:
                self.events.append((uid, self._rounded(nbytes)))
        elif self.record_events:
            self.events.append((uid, -self._rounded(nbytes)))
        return uid

    def empty_cache(self) -> None:
        """Record ``torch.cuda.empty_cache()`` + ``reset_peak_memory_stats()`` before the step
        (:data:`trainfit.memory.allocator.EMPTY_CACHE_UID`): the replay gives back the cached
        segments nothing lives in."""
        self._settle()
        if self.record_events:
            self.events.append((EMPTY_CACHE_UID, 0))

    def reclassify(self, t: torch.Tensor | None, category: str) -> None:
        self._settle()
        if t is None:  # a gradient an optimizer-in-backward hook already stepped and freed
            return
        blk = self._live.get(_storage(t))
        if blk is None or blk.category == MANAGED or blk.category == category:
            return
        # A block alive now and created before a phase's peak was alive at that peak: move it in
        # that snapshot too, so the phase breakdowns use final categories (as the global peak's
        # block list does: gradients are reclassified after accumulation, optimizer states
        # after the step that created them).
        for key, uid in self._phase_peak_uid.items():
            if blk.uid <= uid:
                snap = self.phase_breakdowns[key]
                snap[blk.category] -= blk.nbytes
                snap[category] = snap.get(category, 0) + blk.nbytes
        self._cat_bytes[blk.category] -= blk.nbytes
        self._cat_bytes[category] = self._cat_bytes.get(category, 0) + blk.nbytes
        blk.category = category

    def set_phase(self, phase: str, micro_step: int = 0) -> None:
        """``micro_step`` 0 is the first micro-batch of a step (no gradients alive yet), ≥ 1 a
        later one under accumulation; phase peaks are kept apart for the two."""
        self._settle()
        self.phase = phase
        self._micro = micro_step
        if self.record_events and (not self.event_phases or self.event_phases[-1][1] != phase):
            self.event_phases.append((len(self.events), phase))
        self._phase_key = phase if phase in ("optimizer", "idle", "setup") else \
            f"{phase}@{'accum' if micro_step else 'first'}"

    def _check_peak(self, state: _State | None = None) -> None:
        """``state``: the totals of a moment already past (a settled accumulation), else now's."""
        if state is None:
            self._settle()
            cur, key, next_id = self.current_bytes, self._phase_key, self._next_id
        else:
            cur, key, next_id = state.cur, state.phase_key, state.next_id
        if cur > self.phase_peaks.get(key, -1):
            self.phase_peaks[key] = cur
            self.phase_breakdowns[key] = dict(self._cat_bytes if state is None else state.cat)
            self._phase_peak_uid[key] = next_id
        if cur > self.peak.peak_bytes:
            if state is None:
                alive = list(self._alive.values())
                self.peak = PeakSnapshot(cur, self.phase, alive, [b.nbytes for b in alive])
            else:
                assert state.alive is not None
                self.peak = PeakSnapshot(cur, state.phase, state.alive,
                                         [b.nbytes for b in state.alive])

    # --- the engine's gradient accumulation ------------------------------------------------
    def _accumulation(self, func: Any, args: tuple, kwargs: dict | None) -> _Block | None:
        """The block of ``old`` when this op is the autograd engine summing two gradients of one
        tensor (``InputBuffer::accumulate``, torch/csrc/autograd/input_buffer.cpp:
        ``buffer[pos] = old_var + var``). The real engine adds in place,
        ``old_var.add_(var)``, when grad mode is off and it holds the last reference to
        ``old_var`` and its storage (``can_accumulate_inplace``: non-overlapping and dense, no
        tensor subclass) — but ``at::isTensorSubclassLike`` is true for every tensor while a
        dispatch mode is active, and fake tensors are a subclass: here it always adds out of
        place, one gradient-sized block more at that moment than the real step (CPU or GPU).
        Mamba's recurrent scan sums a [B, d_inner, L, d_state] gradient L times (each
        step's select_backward): +6.8 … +9.5 % over its real CPU step (an audit)."""
        if kwargs or len(args) != 2 or torch.is_grad_enabled():
            return None
        old, var = args
        if not (_plain(old) and _plain(var)) or old is var or old.layout != torch.strided \
                or old.shape != var.shape or old.dtype != var.dtype \
                or not is_non_overlapping_and_dense_or_false(old):
            return None
        if old._base is not None:
            # a view holds its base, so its storage has a second reference: the real engine
            # adds out of place (can_accumulate_inplace wants storage().use_count() == 1). A
            # weight's gradient out of mm's backward is one (a transpose); summed from two uses
            # — a tied embedding, a chunked head — the sum is a new block (a review: three V×H
            # blocks live at once on CPU, two simulated, −7.6 %)
            return None
        blk = self._live.get(_storage(old))
        if blk is None or blk.category == MANAGED or blk is self._live.get(_storage(var)):
            return None
        return blk if _from_engine() else None

    def _defer(self, old: _Block, out: _Block, st: Any) -> None:
        """Book ``out`` as allocated, but check the peak only once it is known whether the
        engine held the last reference to ``old`` (:meth:`_settle`)."""
        cur = self.current_bytes
        alive = list(self._alive.values()) if cur > self.peak.peak_bytes else None
        state = _State(cur, dict(self._cat_bytes), self._next_id, self.phase, self._phase_key,
                       alive)
        self._pending = (old, out, weakref.ref(st), state)

    def _settle(self) -> None:
        """Resolve the pending accumulation. ``old`` freed as the engine replaced it by the sum
        (before any other op runs): the engine held its last reference and the real step adds
        in place — the sum's storage takes ``old``'s block, no allocation and no free happen
        (nor in the recorded trace), the peak stays what it was before the add. ``old`` alive
        still (a second reference: the real engine adds out of place too): the add's totals
        are checked as any op's."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        old, out, ref, state = pending
        st = ref()
        if old.uid in self._alive or st is None or out.uid not in self._alive \
                or self._live.get(st) is not out:
            self._check_peak(state)
            return
        del self._alive[out.uid]
        self._refs.pop(out.uid, None)  # the weak reference dropped: its callback never runs
        self.event_streams.pop(out.uid, None)
        self.current_bytes += old.nbytes - out.nbytes
        self._cat_bytes[out.category] -= out.nbytes
        self._cat_bytes[old.category] = self._cat_bytes.get(old.category, 0) + old.nbytes
        self._live[st] = old
        self._alive[old.uid] = old
        self._refs[old.uid] = weakref.ref(st, lambda _r, b=old: self._release(b))
        if self.record_events:
            for entry in ((old.uid, -old.nbytes), (out.uid, out.nbytes)):
                for i in range(len(self.events) - 1, -1, -1):
                    if self.events[i] == entry:
                        del self.events[i]
                        break

    def __exit__(self, *exc: Any) -> Any:
        self._settle()
        return super().__exit__(*exc)

    # --- dispatch -------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _PRIM_DEVICE:
            # ``tensor.device`` reaches Python dispatch only because fake tensors are a Python
            # subclass; it allocates nothing and is no op in eager mode.  68 % of all dispatches
            # of a Llama LoRA step (counted): skipping the bookkeeping saves ~10 % of plan time.
            return func(*args, **(kwargs or {}))
        self._settle()
        out = func(*args, **(kwargs or {}))
        if self._paused:
            return out
        if self.op_hook is not None:
            self.op_hook(func, args, kwargs or {}, out, self.phase, self._micro)
        category = self.category_override or (
            "activations" if self.phase == "forward" else "temporaries")
        if isinstance(out, torch.Tensor):  # the common case, without flattening
            old = self._accumulation(func, args, kwargs) if func is _ADD else None
            known = self._next_id
            blk = self._register(out, category)
            if old is not None and blk is not None and blk.uid > known \
                    and blk.category != MANAGED:
                self._defer(old, blk, _storage(out))
                return out
        else:
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self._register(leaf, category)
        self._check_peak()
        workspace = WORKSPACES.get(func)
        if workspace is not None:
            self._transient(workspace(args))
        return out

    def _transient(self, sizes: list[int]) -> None:
        """Buffers the op just run allocates and frees inside its kernel, beside its outputs
        (:mod:`trainfit.memory.kernel_workspace`): booked as temporaries, the peak checked,
        then freed — in the trace too, so the allocator replay gives them blocks."""
        if self._managed_depth or not sizes:
            return
        blocks = []
        for size in sizes:
            self._next_id += 1
            blocks.append(self._book(self._rounded(size), "temporaries"))
        self._check_peak()
        for blk in reversed(blocks):
            self._release(blk)

    def live_breakdown(self) -> dict[str, int]:
        self._settle()
        out = dict.fromkeys((*CATEGORIES, MANAGED), 0)
        for blk in self._live.values():
            out[blk.category] += blk.nbytes
        return out
