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
(:mod:`trainfit.memory.extrapolate`) has no list of its own: it is made from the small ones,
tensor by tensor, since a power of two is not linear in anything — in depth, the larger small
stack's list is the smaller one with its extra layers' tensors inserted at one place, and the
full stack's has that insert once for every further step of layers (:func:`deeper`); in the
micro-batch each tensor's bytes are affine (activations scale with it), so they are
interpolated index by index between the two simulated micro-batches.  Where the lists do not
line up so (a tensor offloaded at one micro-batch and under TRL's 1 KiB threshold at the
other), the pinned bytes are stated as their bound: twice the bytes copied (a power of two is
less than twice what it rounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainfit.model.offload import MIN_OFFLOAD_BYTES


@dataclass(frozen=True, kw_only=True)
class HostActivations:
    """The saved activations one rank's activation offload keeps in host RAM (predicted)."""

    copied_bytes: int
    """Bytes one micro-batch's forward pass copies to the host (and its backward copies back)."""
    pinned_bytes: int
    """Pinned host memory held: each copied tensor's bytes rounded up to a power of two by
    PyTorch's host caching allocator, or twice ``copied_bytes`` where not ``exact``."""
    tensors: int
    """How many tensors one forward pass copies (0 where not ``exact``)."""
    exact: bool
    """``pinned_bytes`` rounds each tensor; False: the bound ``2 × copied_bytes``."""


def pow2_ceil(n: int) -> int:
    """``c10::llvm::PowerOf2Ceil``: the least power of two ≥ ``n`` (0 for 0)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def of_sizes(sizes: Sequence[int]) -> HostActivations:
    """The host side of one forward pass that offloaded tensors of ``sizes`` bytes."""
    return HostActivations(copied_bytes=sum(sizes), pinned_bytes=sum(map(pow2_ceil, sizes)),
                           tensors=len(sizes), exact=True)


def bound(copied_bytes: int) -> HostActivations:
    """Where the tensors themselves are not known: ``copied_bytes`` and the bound on their
    pinned blocks."""
    return HostActivations(copied_bytes=copied_bytes, pinned_bytes=2 * copied_bytes, tensors=0,
                           exact=False)


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
    places (a periodic run), the one whose rounded total is largest is taken (the safe side)."""
    step, extra = large_layers - small_layers, layers - small_layers
    n = len(large) - len(small)
    if extra == 0:
        return list(small)
    if step <= 0 or extra < 0 or extra % step or n <= 0:
        return None
    copies = extra // step
    best: list[int] | None = None
    for q in range(len(small) + 1):
        if large[:q] == small[:q] and large[q + n:] == small[q:]:
            made = small[:q] + large[q:q + n] * copies + small[q:]
            if best is None or sum(map(pow2_ceil, made)) > sum(map(pow2_ceil, best)):
                best = made
    return best


def at_batch(lo: list[int], hi: list[int], lo_batch: int, hi_batch: int,
             batch: int) -> list[int] | None:
    """Each tensor's bytes at ``batch``, affine between its bytes at two micro-batches (None where
    the two lists are not the same tensors: another length); those that come out under TRL's
    ``min_offload_size`` stay on the device."""
    if batch in (lo_batch, hi_batch):  # a simulated micro-batch: its own list
        return list(lo if batch == lo_batch else hi)
    if len(lo) != len(hi):
        return None
    span = hi_batch - lo_batch
    # a + (b - a)·(batch − lo)/span, rounded up to a whole byte, in integers (exact)
    sizes = (-(-(a * span + (b - a) * (batch - lo_batch)) // span)
             for a, b in zip(lo, hi, strict=True))
    return [s for s in sizes if s >= MIN_OFFLOAD_BYTES]


def extrapolated(points: Sequence[Any], full_layers: int, batch: int,
                 copied_bytes: int) -> HostActivations:
    """A row extrapolated from small simulations: ``points`` are its four
    (:meth:`trainfit.memory.extrapolate.BilinearModel.segment`), ordered (L1, b1), (L2, b1),
    (L1, b2), (L2, b2), each with its ``sim.info["offloaded_sizes"]``; ``copied_bytes``: their
    sums fitted as every other term (the bound's basis where the lists do not line up)."""
    lists = [p.sim.info.get("offloaded_sizes") for p in points]
    if any(s is None for s in lists):
        return bound(copied_bytes)
    full = []
    for small, large in ((points[0], points[1]), (points[2], points[3])):
        made = deeper(small.sim.info["offloaded_sizes"], large.sim.info["offloaded_sizes"],
                      small.layers, large.layers, full_layers) \
            if large.layers != small.layers else small.sim.info["offloaded_sizes"]
        if made is None:
            return bound(copied_bytes)
        full.append(made)
    sizes = at_batch(full[0], full[1], points[0].batch, points[2].batch, batch)
    return bound(copied_bytes) if sizes is None else of_sizes(sizes)


def host_words(host: HostActivations) -> str:
    """One clause: what the host holds, predicted, in GiB."""
    gib = 2**30
    copied = f"{host.copied_bytes / gib:.2f} GiB copied each way per micro-batch"
    if host.exact:
        return (f"the host holds them in pinned memory: {host.pinned_bytes / gib:.2f} GiB per "
                f"rank (predicted: {host.tensors} tensors, {copied}, each rounded up to a power "
                "of two by PyTorch's pinned-memory cache)")
    return (f"the host holds them in pinned memory: at most {host.pinned_bytes / gib:.2f} GiB "
            f"per rank (predicted: {copied}; PyTorch's pinned-memory cache rounds each tensor up "
            "to a power of two, under twice its bytes — which tensors was not extrapolated)")


def of_model(model: Any, batch: int) -> HostActivations:
    """A row of a :class:`~trainfit.memory.extrapolate.BilinearModel` at micro-batch ``batch``."""
    copied = model.eval_at(lambda p: sum(p.sim.info.get("offloaded_sizes", ())), batch)
    return extrapolated(model.segment(batch), model.full_layers, batch, max(0, copied))
