"""What activation offloading (``activation_offload``) holds in host RAM, per rank.

TRL's ``OffloadActivations`` (``trl/models/activation_offloading.py``, ``pack_tensor``) copies
each saved tensor it offloads into a host tensor of its own, ``torch.empty_like(activation,
pin_memory=True, device="cpu")`` (a broadcast tensor: its storage), and drops it once the
backward pass has brought it back (``unpack_tensor_with_streams``).  Pinned host memory comes from
PyTorch's ``CachingHostAllocator`` (``aten/src/ATen/core/CachingHostAllocator.h``, ``allocate``),
which rounds every request up to a power of two — "to improve reuse. These power of two sizes are
also used to index into the free list" — and keeps a freed block cached for the next request of
its size; it never gives one back to the OS unless told to (``torch._C._host_emptyCache``).  Every
tensor one forward pass offloads is alive when that forward ends, the backward frees them, and the
next micro-batch's forward reuses the same blocks: the host holds the power-of-two sizes of one
forward's offloaded tensors, from the first step on.

The simulation's twin (:class:`trainfit.model.offload.SimulatedOffload`) lists those tensors'
bytes in the order they are packed.  A plan row extrapolated from small simulations
(:mod:`trainfit.memory.extrapolate`) has no list of its own: it is made from the small ones.  In
depth, the larger small stack's list is the smaller one with its extra layers' tensors inserted
at one place, and the full stack's has that insert once for every further step of layers
(:func:`deeper`; the rounded total alone would be linear there too).  In the micro-batch each
tensor's bytes are affine (activations scale with it) but its power of two is not, so the lists
are paired tensor by tensor and each is interpolated between the two simulated micro-batches
(:func:`at_batch`).  Where the lists do not line up so (a tensor offloaded at one micro-batch and
under TRL's 1 KiB threshold at the other), the pinned bytes are stated as a bound: those of the
upper simulated micro-batch's list (each of its tensors at least as large as the row's), or twice
its bytes copied (a power of two is less than twice what it rounds).

Premises, stated with the figure: the batch shape is fixed (trainfit's collator pads to
``seq_len``; batches padded to their longest sample request blocks of other sizes, which stay
cached, up to twice the figure), PyTorch's defaults for ``pinned_max_round_threshold`` and
``pinned_max_cached_size`` (unlimited: every block rounded and cached; ``PYTORCH_ALLOC_CONF``
can lower them, not read here), and the offload hooks around the forward only, as trainfit's
step sets them.  TRL's ``SFTTrainer`` keeps them through the backward: with reentrant
checkpointing each block's re-run forward then offloads its own tensors, in blocks of other sizes
(2.3 × the forward's pinned bytes with TRL's manager at test size) — not sized (:func:`unsized`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainfit.memory.sharded import local
from trainfit.memory.wrap import flat_parameters, wrap_units
from trainfit.model.offload import MIN_OFFLOAD_BYTES


@dataclass(frozen=True, kw_only=True)
class HostActivations:
    """The saved activations one rank's activation offload keeps in host RAM (predicted)."""

    copied_bytes: int
    """Bytes one micro-batch's forward pass copies to the host (and its backward copies back)."""
    pinned_bytes: int
    """Pinned host memory held: each copied tensor's bytes rounded up to a power of two by
    PyTorch's host caching allocator (where not ``exact``: at most)."""
    tensors: int | None
    """How many tensors one forward pass copies (None where not ``exact``: not known)."""
    exact: bool
    """``pinned_bytes`` rounds each tensor; False: a bound on them (:func:`extrapolated`)."""


def pow2_ceil(n: int) -> int:
    """``c10::llvm::PowerOf2Ceil``: the least power of two ≥ ``n`` (0 for 0)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def host_activations_of_sizes(sizes: Sequence[int]) -> HostActivations:
    """The host side of one forward pass that offloaded tensors of ``sizes`` bytes."""
    return HostActivations(copied_bytes=sum(sizes), pinned_bytes=sum(map(pow2_ceil, sizes)),
                           tensors=len(sizes), exact=True)


def deeper(small: list[int], large: list[int], small_layers: int, large_layers: int,
           layers: int) -> list[int] | None:
    """The list of a stack of ``layers`` from those of two smaller stacks of the same layers:
    ``large`` is ``small`` with the tensors of ``large_layers - small_layers`` more layers
    inserted at one place; the stack of ``layers`` has that insert as many times as it has
    more layers — the premise of every fit in depth here (:mod:`trainfit.memory.extrapolate`:
    what one more layer adds beyond the small stacks is what the last one added).  Not that the
    insert repeats the block before it: TRL's dedup makes the second layer unlike the later ones
    (the RoPE tables it passes to every layer are offloaded again by the second, then kept
    on the device as duplicates).  None where ``large`` is not ``small`` with one insert, or
    ``layers`` is not a whole number of inserts more.  Where the insert could sit at several
    places (a periodic run) every place makes the same list: the first is taken."""
    if large == small:  # the extra layers offload nothing
        return list(small)
    step, extra = large_layers - small_layers, layers - small_layers
    n = len(large) - len(small)
    if step <= 0 or extra < 0 or extra % step or n <= 0:
        return None
    # the common prefix and suffix must cover ``small``: the insert sits between them
    pairs = zip(small, large, strict=False)  # ``large`` is the longer
    head = next((i for i, (a, b) in enumerate(pairs) if a != b), len(small))
    back = zip(reversed(small), reversed(large), strict=False)
    tail = next((i for i, (a, b) in enumerate(back) if a != b), len(small))
    if head + tail < len(small):
        return None
    q = head  # any q in [len(small) - tail, head] makes the same list
    return small[:q] + large[q:q + n] * (extra // step) + small[q:]


def at_batch(lo: list[int], hi: list[int], lo_batch: int, hi_batch: int,
             batch: int) -> list[int] | None:
    """Each tensor's bytes at ``batch``, affine between its bytes at two micro-batches (None where
    the two lists are not the same tensors: another length); those that come out under TRL's
    ``min_offload_size`` stay on the device (TRL tests a tensor's logical size, the list holds
    what is copied: a broadcast tensor's storage, smaller — such a tensor near the threshold
    could be kept where TRL copies it; plan's rows interpolate between micro-batches ≥ 2, where
    none was seen)."""
    if batch in (lo_batch, hi_batch):  # a simulated micro-batch: its own list
        return list(lo if batch == lo_batch else hi)
    if len(lo) != len(hi):
        return None
    span = hi_batch - lo_batch
    # a + (b - a)·(batch − lo)/span, rounded up to a whole byte, in integers (exact)
    sizes = (-(-(a * span + (b - a) * (batch - lo_batch)) // span)
             for a, b in zip(lo, hi, strict=True))
    return [s for s in sizes if s >= MIN_OFFLOAD_BYTES]


def _full_depth(small: Any, large: Any, full_layers: int) -> list[int] | None:
    """The full stack's list at one simulated micro-batch, from the points at its two depths
    (the same point twice for a stack simulated at full depth)."""
    a, b = small.sim.info.get("offloaded_sizes"), large.sim.info.get("offloaded_sizes")
    if a is None or b is None:
        return None
    if small.layers == large.layers:
        return list(a) if small.layers == full_layers else None
    return deeper(a, b, small.layers, large.layers, full_layers)


def extrapolated(points: Sequence[Any], full_layers: int, batch: int,
                 copied_at: Callable[[int], int]) -> HostActivations:
    """A row extrapolated from small simulations: ``points`` are its four
    (:meth:`trainfit.memory.bilinear.BilinearModel.segment`), ordered (L1, b1), (L2, b1),
    (L1, b2), (L2, b2), each with its ``sim.info["offloaded_sizes"]``; ``copied_at(b)``: the
    bytes copied at micro-batch ``b``, fitted as every other term (where the lists do not line
    up)."""
    lo_batch, hi_batch = points[0].batch, points[2].batch
    lo = _full_depth(points[0], points[1], full_layers) if batch != hi_batch else None
    hi = _full_depth(points[2], points[3], full_layers)
    if batch == lo_batch and lo is not None:
        return host_activations_of_sizes(lo)
    sizes = hi if batch == hi_batch else (
        None if lo is None or hi is None else at_batch(lo, hi, lo_batch, hi_batch, batch))
    if sizes is not None:
        return host_activations_of_sizes(sizes)
    # the bound: the upper micro-batch's tensors hold the row's, each at least as large
    top = 2 * copied_at(hi_batch)
    return HostActivations(copied_bytes=max(0, copied_at(batch)), tensors=None, exact=False,
                           pinned_bytes=min(top, sum(map(pow2_ceil, hi))) if hi else top)


def unsized(job: Any) -> str | None:
    """Why the host bytes of ``job``'s activation offload are not predicted (None: they are)."""
    if job.activation_offload and job.ckpt_reentrant and job.grad_ckpt != "off":
        return ("with reentrant checkpointing TRL's SFTTrainer keeps the offload hooks on "
                "through the backward, where each block's re-run forward offloads its own "
                "tensors into pinned blocks of other sizes (2.3 × the forward's with TRL's "
                "manager at test size): host bytes unknown")
    return None


def host_fields(job: Any, host: HostActivations | None) -> dict[str, Any]:
    """MemoryPrediction's ``host_activation_*`` fields for ``job``: None bytes where they are
    not predicted (:func:`unsized`), the defaults without an activation offload."""
    if unsized(job):
        return {"host_activation_bytes": None}
    if host is None:
        return {}
    return {"host_activation_bytes": host.pinned_bytes,
            "host_activation_copied_bytes": host.copied_bytes,
            "host_activation_exact": host.exact}


def host_clause(job: Any, host: HostActivations | None) -> str:
    """The memory note's clause on the host side of ``job``'s activation offload."""
    why = unsized(job)
    return f"; {why}" if why else f"; {host_words(host)}" if host else ""


def host_words(host: HostActivations) -> str:
    """One clause: what the host holds, predicted, in GiB."""
    gib = 2**30
    copied = f"{host.copied_bytes / gib:.2f} GiB copied each way per micro-batch"
    shape = ("; for batches of one shape: batches padded to their own longest sample take "
             "blocks of other sizes too, which stay cached, up to twice that")
    if host.exact:
        return (f"the host holds them in pinned memory: {host.pinned_bytes / gib:.2f} GiB per "
                f"rank (predicted: {host.tensors} tensors, {copied}, each rounded up to a power "
                f"of two by PyTorch's pinned-memory cache{shape})")
    return (f"the host holds them in pinned memory: at most {host.pinned_bytes / gib:.2f} GiB "
            f"per rank (predicted: {copied}; PyTorch's pinned-memory cache rounds each tensor up "
            f"to a power of two — which tensors was not extrapolated{shape})")


def host_activations_of_row(model: Any, batch: int) -> HostActivations:
    """A row of a :class:`~trainfit.memory.bilinear.BilinearModel` at micro-batch ``batch``."""

    def copied_at(b: int) -> int:
        return model.eval_at(lambda p: sum(p.sim.info.get("offloaded_sizes", ())), b)

    return extrapolated(model.segment(batch), model.full_layers, batch, copied_at)


def pinned_shards(job: Any, model: Any) -> tuple[list[int], int] | None:
    """The bytes of each pinned host tensor FSDP's CPU offload (``offload: all``) makes on one
    rank, and those of them the GPU-side difference (:func:`trainfit.memory.ranks.host_offload_bytes`)
    does not count; None without the offload.  FSDP2 pins each parameter's padded shard
    (``_fsdp_param.py``: ``padded_sharded_param.pin_memory()``) and copies each gradient shard
    to the host with ``non_blocking=True``, into a pinned tensor (``_fsdp_collectives.py``:
    ``foreach_reduce``); FSDP1 pins each unit's flat shard, one per dtype, and a ``_cpu_grad``
    of its size for every flat parameter, frozen or not (``_flat_param.py``: a frozen unit's is
    the uncounted part).  All through PyTorch's pinned-memory cache (``at::getHostAllocator``),
    which rounds each up to a power of two; the optimizer's states are made on the host by
    ``zeros_like``, not pinned.  On one rank of the simulated step (FSDP2 through the fake
    process group) a parameter is its shard; otherwise (a real process group exists: the
    analytic per-rank model) the shard is its ``ceil(dim0 / ranks)`` rows."""
    if job.offload != "all" or job.sharding != "fsdp":
        return None
    ranks = max(job.ranks, 1)
    if job.fsdp_flat:
        flats = [(shard, grad) for unit in wrap_units(model)
                 for _, shard, grad in flat_parameters(unit, ranks)]
        return [b for b, _ in flats] * 2, sum(b for b, grad in flats if not grad)
    params = list(model.parameters())
    sharded = any(local(p) is not p for p in params)

    def shard(p: Any, padded: bool) -> int:
        t = local(p)
        if sharded:
            return t.untyped_storage().nbytes() if padded else t.nbytes
        rows = p.shape[0] if p.dim() else 1
        return -(-rows // ranks) * (p.numel() // max(rows, 1)) * p.element_size()

    return ([shard(p, True) for p in params] + [shard(p, False) for p in params
                                                if p.requires_grad], 0)


def pinned_extra_bytes(pinned: tuple[list[int], int] | None) -> int:
    """What :func:`pinned_shards`' power-of-two blocks hold beyond the host bytes already
    counted: each block's rounding, and the tensors not counted at all."""
    if pinned is None:
        return 0
    sizes, uncounted = pinned
    return sum(pow2_ceil(s) - s for s in sizes) + uncounted
