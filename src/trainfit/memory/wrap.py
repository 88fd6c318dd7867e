"""What FSDP1's wrapping leaves in the CUDA caching allocator before the first step.

``FullyShardedDataParallel`` given a model on the host (or on ``meta`` with a ``param_init_fn``)
and a ``device_id`` builds its units one at a time (torch/distributed/fsdp/_init_utils.py,
``_init_param_handle_from_module``), in the order ``_recursive_wrap`` reaches them — the blocks
from the first to the last, then the root:

1. ``_move_module_to_device`` copies the unit's parameters (those no nested unit holds) to the
   GPU one by one: a block of each parameter's full size;
2. with ``sync_module_states``, ``_sync_module_params_and_buffers`` broadcasts them from rank 0
   through ``_broadcast_coalesced`` (``PARAM_BROADCAST_BUCKET_SIZE``, 250 MiB): each bucket of
   several tensors is flattened into a tensor of its own (a bucket of one tensor is a view of
   it: ``flatten_dense_tensors``), two buckets in flight (c10d ``broadcast_coalesced``).  NCCL
   runs on its own stream and ProcessGroupNCCL ``recordStream``s each broadcast's input there, so
   a freed bucket (or a parameter broadcast in place, freed in 4) goes back to the pool only once
   the allocator sees the broadcast done: ``BroadcastWork::finish``'s ``wait()`` makes the default
   stream wait without blocking the host, and nothing syncs it before the next unit's first
   parameter copy from the host (a blocking copy: ``stream_synchronize``), so the blocks of 3 and
   4 are cut while the buckets are still held; the next ``malloc``'s ``process_events`` frees
   them (the first step's, after the root's).  With CPU offload the unit's own shard copy to the
   host (5) is that synchronisation: its buckets and in-place tensors go before the next unit;
3. ``FlatParamHandle`` concatenates the parameters into the unit's flat parameter (its full size,
   one per dtype);
4. ``shard()`` clones this rank's chunk (``ceil(numel / ranks)`` elements) and frees the full
   flat parameter; the parameters copied in 1 die when the handle is built.  NO_SHARD keeps the
   flat parameter whole;
5. with CPU offload, ``flat_param_to("cpu")`` copies the shard to pageable host memory (a
   blocking copy) and frees it on the GPU.

All of it is on the default stream, and the allocator keeps every freed block in its segment:
after the wrap the reserve holds each shard and the segments the largest transients made — the
root's embedding and head, copied and then flattened, above all.  Answer.AI's fsdp_qlora logs it
(``reserved_after_model_wrap``): 3.72 GiB for Llama-2-7B QLoRA on 2 ranks, whose shards are
about 1.9 GiB; the reserved peak of its training starts there (``reset_peak_memory_stats`` does
not release segments).

In the simulation the step's parameters are then views into their unit's flat shard (booked once,
as FSDP1 holds them), and the wrap's own blocks go into the trace as history (ids ≥
:data:`trainfit.memory.allocator.HISTORY_UID`: they shape the reserve, never the step's allocated
bytes).  The unit's buffers are copied in step 1 too, after its parameters, and stay whole (booked
in the unit's turn: transformers < 4.40's per-layer RoPE tables, ``rope_cache``), and are
broadcast before its parameters, in buckets of their own dtype.  bitsandbytes' quantization
state is no buffer but an attribute of the weight, made where it was quantized — on Answer.AI's
rank 0 before the wrap — so it is booked first.  With both, and the buckets held until the
allocator sees their broadcast done (2), Answer.AI's Llama-2-7B QLoRA leaves 3.75 GiB reserved
after the wrap, predicted, against the 3.72 GiB it logged (3.40 with the buckets freed at once:
the root's [norm, lm_head] bucket, 250 MiB, was then reused by the root's shard, and layer 0's
by its flat parameter).  The simulation follows rank 0, the rank that copies the weights from the
host and whose reserve Answer.AI logs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from trainfit.engine.dist import shard_units
from trainfit.job import JobSpec
from trainfit.memory.allocator import reserve_after_history
from trainfit.memory.depth_trace import Trace
from trainfit.model.standins import is_quant_state

BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024
"""torch/distributed/fsdp/_init_utils.py ``PARAM_BROADCAST_BUCKET_SIZE``."""
BROADCASTS_IN_FLIGHT = 2
"""torch/csrc/distributed/c10d/comm.cpp ``broadcast_coalesced``: ``max_in_flight``."""


def records_wrap(job: JobSpec, sharded: bool) -> bool:
    """Whether the job's weights reach the GPU through FSDP1's wrap (``fsdp_init``), over more
    than one rank (FSDP over one rank is not run: :meth:`trainfit.engine.dist.Dist.wrap`).
    ``sharded``: the step runs as one rank of it (through the fake process group); FSDP's
    analytic per-rank model (a real process group exists) divides whole-model bytes itself, so it
    gets no history. NO_SHARD's flat parameters are whole on every rank."""
    if job.fsdp_init == "sharded" or job.ranks <= 1:
        return False
    return job.sharding == "none" or (job.sharding == "fsdp" and sharded)


def wrap_units(model: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """Each FSDP unit's own parameters, in the order the wrap builds them: the blocks of
    :func:`trainfit.engine.dist.shard_units` (a parameter belongs to the innermost block holding
    it) in the model's order, then the root's (every parameter no block holds), each once."""
    return [params for params, _ in units_and_buffers(model)]


def units_and_buffers(model: torch.nn.Module
                      ) -> list[tuple[list[torch.nn.Parameter], list[torch.Tensor]]]:
    """:func:`wrap_units` with each unit's own buffers beside its parameters (the root's: every
    buffer no block holds), less the 4-bit twin's quantization state (bitsandbytes keeps it
    beside the weight, made where the weight was quantized, before the wrap)."""
    claimed: set[int] = set()
    owned: list[tuple[torch.nn.Module, list[torch.nn.Parameter], list[torch.Tensor]]] = []

    def bufs(m: torch.nn.Module) -> list[torch.Tensor]:
        return [b for n, b in m.named_buffers() if id(b) not in claimed and not is_quant_state(n)]

    for block in shard_units(model):  # innermost first
        own = [p for p in block.parameters() if id(p) not in claimed]
        own_bufs = bufs(block)
        claimed.update(id(t) for t in [*own, *own_bufs])
        owned.append((block, own, own_bufs))
    # post-order, as _recursive_wrap builds them: a unit after every unit nested in it
    order = {id(m): i for i, m in enumerate(model.modules())}
    owned.sort(key=lambda e: (max(order[id(m)] for m in e[0].modules()), -order[id(e[0])]))
    root = [p for p in model.parameters() if id(p) not in claimed]
    root_bufs = bufs(model)
    return [(own, b) for _, own, b in owned if own] + ([(root, root_bufs)] if root else [])


def flat_parameters(params: list[torch.nn.Parameter], ranks: int
                    ) -> list[tuple[int, int, bool]]:
    """A unit's flat parameters, one per dtype in the order the unit's parameters first have
    it: (the flat parameter's bytes, one rank's shard of it — ``ceil(numel / ranks)`` elements
    —, whether it requires a gradient: any member does)."""
    groups: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault(p.dtype, []).append(p)
    out = []
    for dtype, ps in groups.items():
        n = sum(p.numel() for p in ps)
        out.append((n * dtype.itemsize, -(-n // ranks) * dtype.itemsize,
                    any(p.requires_grad for p in ps)))
    return out


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()  # a DTensor's numel is the whole parameter's


def _broadcast(tracker: Any, params: list[torch.Tensor]
               ) -> tuple[list[tuple[int, int]], set[int]]:
    """``_broadcast_coalesced``'s flattened buckets of the unit's buffers then parameters (FSDP's
    ``module_states``), two in flight (bucketed per dtype, a bucket closed once it reaches the
    size: c10d ``compute_bucket_assignment_by_size``).  Returns the flattened buckets' blocks
    ``(uid, bytes)``, released by ``BroadcastWork`` but held by the NCCL stream's use (the
    caller frees them once the host has synchronised), and the indices of the tensors broadcast
    in place (a bucket of one), whose own blocks the NCCL stream holds as well."""
    buckets: list[tuple[int, list[int]]] = []  # (index of its first tensor, its tensors)
    open_: dict[torch.dtype, tuple[int, list[int]]] = {}
    for i, p in enumerate(params):
        _, b = open_.setdefault(p.dtype, (i, []))
        b.append(i)
        if sum(_nbytes(params[j]) for j in b) >= BROADCAST_BUCKET_BYTES:
            buckets.append(open_.pop(p.dtype))
    buckets = sorted(buckets + list(open_.values()))  # by their first tensor, as c10d sorts
    held: list[tuple[int, int]] = []
    in_place: set[int] = set()
    flight: deque[tuple[int | None, int]] = deque()
    for _, b in buckets:
        if len(flight) >= BROADCASTS_IN_FLIGHT:
            uid, n = flight.popleft()
            if uid is not None:
                held.append((uid, n))
        n = sum(_nbytes(params[j]) for j in b)
        # a bucket of one tensor is broadcast in place (a view), but takes its turn in flight
        if len(b) == 1:
            in_place.add(b[0])
        flight.append((tracker.history(n), n) if len(b) > 1 else (None, 0))
    held += [(uid, n) for uid, n in flight if uid is not None]
    return held, in_place


def _free(tracker: Any, blocks: list[tuple[int, int]]) -> None:
    """Free history blocks ``(uid, bytes)``."""
    for uid, n in blocks:
        tracker.history(n, uid)


def record_wrap(job: JobSpec, model: torch.nn.Module, tracker: Any) -> list[torch.Tensor]:
    """Record the wrap's history in ``tracker`` (before the step's inputs are tracked) and book
    each unit's flat shard (NO_SHARD: its flat parameter) as the parameters' bytes; returns those
    flat tensors, which the caller keeps alive through the step.  Called inside the simulation's
    FakeTensorMode (the flat tensors are fake)."""
    ranks = job.ranks if job.sharding == "fsdp" else 1
    offload = job.offload == "all"
    kept: list[torch.Tensor] = []
    # the quantization state exists before the wrap: each weight was quantized on the GPU
    for n, b in model.named_buffers():
        if is_quant_state(n):
            tracker.track(b, "parameters")
    # blocks the NCCL stream still holds: freed once the next unit's first copy from the host
    # (blocking: it synchronises the default stream, which waited on the broadcast) is made, or,
    # offloading, once the unit's shard is copied to the host
    held: list[tuple[int, int]] = []
    for params, buffers in units_and_buffers(model):
        moved = []
        for p in params:
            moved.append((tracker.history(_nbytes(p)), _nbytes(p)))
            _free(tracker, held)
            held = []
        for b in buffers:  # _move_states_to_device: the parameters, then the buffers
            tracker.track(b, "buffers")
        in_place: set[int] = set()
        if job.fsdp_init == "wrap-sync":  # module_states: buffers first
            held, states = _broadcast(tracker, [*buffers, *params])
            in_place = {i - len(buffers) for i in states if i >= len(buffers)}
        for flat_bytes, shard_bytes, _ in flat_parameters(params, ranks):
            if offload:  # the shard goes to the host: every block here is transient
                flat = tracker.history(flat_bytes)
                shard = tracker.history(shard_bytes)
                tracker.history(flat_bytes, flat)
                tracker.history(shard_bytes, shard)
                # that copy to the host (flat_param_to("cpu"): pageable, blocking) synchronises
                # the host with the default stream, which waited on the broadcast: the buckets
                # are free from the next malloc on
                _free(tracker, held)
                held = []
                continue
            flat = tracker.history(flat_bytes) if ranks > 1 else None
            kept.append(torch.empty(shard_bytes, dtype=torch.uint8))
            tracker.track(kept[-1], "parameters")
            if flat is not None:
                tracker.history(flat_bytes, flat)
        if not offload:
            for p in params:
                tracker.adopt(p, "parameters")
        for i, (uid, n) in enumerate(moved):
            if i in in_place and not offload:  # broadcast in place: the NCCL stream holds it
                held.append((uid, n))
            else:
                tracker.history(n, uid)
    _free(tracker, held)  # the root's: the first step's malloc sees their broadcast done
    return kept


def wrap_reserve(job: JobSpec, trace: Trace | Callable[[], Trace | None] | None
                 ) -> tuple[int | None, list[str]]:
    """(reserved bytes before the first step, its note) of a job with an ``fsdp_init`` wrap
    whose full trace (events, streams) is at hand; (None, []) otherwise."""
    after = reserve_after_history(trace[0], trace[1], expandable=job.expandable_segments) \
        if job.fsdp_init != "sharded" and isinstance(trace, tuple) else None
    if after is None:
        return None, []
    emptied = (" once the cache is emptied (empty_cache_before_step: the segments the shards "
               "split stay)") if job.empty_cache_before_step else ""
    return after[0], [f"FSDP1's wrap (fsdp_init {job.fsdp_init}): {after[0] / 2**30:.2f} GiB "
                      f"reserved before the first step{emptied}, {after[1] / 2**30:.2f} GiB of it "
                      "in use (the flat shards), predicted; the step's reserved peak starts from "
                      "it"]
