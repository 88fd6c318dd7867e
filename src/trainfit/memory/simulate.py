"""Predict ``max_memory_allocated`` by running the real training step on data-less tensors.

The model is built on ``meta`` (with PEFT and the 4-bit twin applied there — PEFT cannot wrap a
model built inside the fake mode), its parameters become fake CPU tensors, and ``train_step`` runs
two optimizer steps (states appear in the first, the steady state is the second) of
``min(grad_accum, 2)`` micro-steps each (from the second micro-step on, every micro-step allocates
the same: gradients exist and are accumulated in place) under :class:`LiveBytesTracker`, with the
target device's allocation behaviour imposed by :mod:`trainfit.memory.semantics`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from trainfit.engine.step import repeat_batches, train_step
from trainfit.job import JobError, JobSpec
from trainfit.memory.allocator import K_MIN_BLOCK
from trainfit.memory.compiled import compiled_blocks
from trainfit.memory.host_offload import pinned_shards
from trainfit.memory.legacy_saves import legacy_saves
from trainfit.memory.loading import (
    add_legacy_rope_caches,
    add_rope_caches,
    book_loaded,
    records_loading,
)
from trainfit.memory.sdpa_choice import AttentionTarget
from trainfit.memory.semantics import device_semantics
from trainfit.memory.sharded import fake_world, fsdp_bookkeeping, fsdp_simulable, local, shard_model
from trainfit.memory.tracker import LiveBytesTracker
from trainfit.memory.wrap import record_wrap, records_wrap
from trainfit.memory.zero import compute_job, master_bytes_per_param, zero3_linear
from trainfit.memory.zero_host import zero3_param_blocks
from trainfit.model.batch import make_batch, row_lengths
from trainfit.model.chunked_head import ChunkedHeadLM
from trainfit.model.in_backward import InBackwardOptimizer
from trainfit.model.offload import simulated_offload, with_offload
from trainfit.model.runtime import scaler_for
from trainfit.model.source import ModelSource
from trainfit.model.standins import is_quant_state
from trainfit.model.towers import tower_parameters
from trainfit.model.workload import (
    DTYPES,
    build_model_on_meta,
    cpu_autocast,
    make_optimizer,
)


@dataclass(frozen=True, kw_only=True)
class SimTarget:
    """The device whose allocations the simulation reproduces."""

    device: str = "cuda"
    """``cuda`` (GPU semantics imposed) or ``cpu`` (this machine's semantics, for validation)."""
    compute_capability: tuple[int, int] | None = (8, 0)
    """Decides whether flash attention exists (≥ 8.0)."""

    @property
    def block_bytes(self) -> int:
        # every block the CUDA caching allocator hands out is a multiple of kMinBlockSize
        return K_MIN_BLOCK if self.device == "cuda" else 1


@dataclass
class SimResult:
    peak_allocated_bytes: int
    """Predicted ``torch.cuda.max_memory_allocated()`` over two steps (bytes)."""
    peak_phase: str
    """forward / backward / optimizer: where the peak happens."""
    breakdown: dict[str, int]
    """What was alive at the peak, by category (bytes)."""
    phase_peaks: dict[str, int]
    managed_bytes: int
    """Paged optimizer states in CUDA managed memory (not in allocator statistics)."""
    steady_bytes: int
    """Bytes alive between steps (weights, optimizer states, buffers)."""
    largest_block_bytes: int
    """The largest single allocation (for the fragmentation model)."""
    total_params: int
    trainable_params: int
    sdpa_kernels: dict[str, int]
    micro_steps_simulated: int
    sim_time_s: float
    info: dict[str, Any] = field(default_factory=dict)
    phase_breakdowns: dict[str, dict[str, int]] = field(default_factory=dict)
    """Phase key → bytes by category at that phase's peak (each sums to its ``phase_peaks``)."""
    events: list[tuple[int, int]] = field(default_factory=list, repr=False)
    """The alloc/free trace when asked for (for the caching-allocator replay)."""
    event_streams: dict[int, int] = field(default_factory=dict, repr=False)
    """Block id → stream of the allocations not on the default stream (FSDP's collectives)."""
    event_phases: list[tuple[int, str]] = field(default_factory=list, repr=False)
    """(index into ``events``, phase) where each phase begins."""
    quant_state_bytes: int = 0
    """bitsandbytes' quantization state (absmax, nested absmax, codes): whole on every rank."""
    per_rank: bool = False
    """The step ran sharded over the job's ranks (FSDP through a fake process group): every
    number is already one rank's."""


def _to_fake(model: torch.nn.Module, fake_mode: FakeTensorMode) -> None:
    """Replace every meta parameter/buffer by a fake CPU tensor, keeping tied weights tied."""
    done: dict[int, torch.Tensor] = {}
    with fake_mode:
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) not in done:
                    done[id(p)] = torch.nn.Parameter(
                        torch.empty(p.shape, dtype=p.dtype, device="cpu"),
                        requires_grad=p.requires_grad)
                mod._parameters[name] = done[id(p)]
            for name, b in list(mod._buffers.items()):
                if b is None:
                    continue
                if id(b) not in done:
                    done[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
                mod._buffers[name] = done[id(b)]


def _classify_states(optimizer: torch.optim.Optimizer, tracker: LiveBytesTracker) -> None:
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                tracker.reclassify(local(v), "optimizer")


def _track_inputs(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]],
                  tracker: LiveBytesTracker, job: JobSpec, loads: bool) -> int:
    """Count what exists before the step: parameters (shared ones once; those FSDP1's wrap
    flattened are already booked as their unit's flat shard), buffers, the distinct micro-batches
    (token ids, kilobytes).  A QLoRA job's
    loading (:mod:`trainfit.memory.loading`) books them module by module, each 4-bit weight
    inside its quantizer's history; otherwise all parameters, then all buffers.
    Returns the bytes of bitsandbytes' quantization state (booked as parameters)."""
    quant_state = 0
    seen: set[int] = set()

    def book(module: torch.nn.Module, recurse: bool) -> None:
        nonlocal quant_state
        for p in module.parameters(recurse=recurse):
            if id(p) not in seen:
                seen.add(id(p))
                tracker.track(local(p), "parameters")
        for name, b in module.named_buffers(recurse=recurse):
            if id(b) in seen:
                continue
            seen.add(id(b))
            # the 4-bit twin keeps its frozen weights as buffers: they are parameters to a user
            state = is_quant_state(name)
            packed = name.rsplit(".", 1)[-1] == "weight_packed"
            tracker.track(b, "parameters" if state or packed else "buffers")
            if state:
                quant_state += b.numel() * b.element_size()

    if loads:
        book_loaded(job, model, tracker, lambda module: book(module, recurse=False))
    book(model, recurse=True)
    if job.empty_cache_before_step:
        tracker.empty_cache()  # after the loading / the wrap, before the first batch
    for batch in batches:
        for t in batch.values():
            tracker.track(t, "buffers")
    return quant_state


def _step_batches(job: JobSpec, source: ModelSource, batch_fn: Any
                  ) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """(the distinct micro-batches, the micro-batches one simulated step runs, in order): what
    ``batch_fn`` builds — one micro-batch, run ``min(grad_accum, 2)`` times, or a list of them
    with their own shapes, one micro-step each — or random token ids (with the padding mask of
    a ``padded`` job)."""
    got = batch_fn() if batch_fn is not None else \
        make_batch(source, job.micro_batch or 1, job.seq_len, packed=job.packs_rows,
                   padded=job.padded)
    if isinstance(got, list):
        return got, got
    return [got], list(repeat_batches(got, min(job.grad_accum or 1, 2)))


def _first_step(job: JobSpec, model: torch.nn.Module, optimizer: Any,
                trainable: list[torch.nn.Parameter], tracker: LiveBytesTracker,
                full_step: Any, flat_states: bool) -> None:
    """The step before the steady one. When the loop holds the previous output (``full_step``
    given), it must really run. Otherwise it matters only for creating the optimizer states (its
    forward/backward run without states, so they peak lower than the steady state): they are
    created by one optimizer step on zero gradients, as the first real step would — for the
    parameters a gradient reaches: a multimodal model's tower takes no part in a text step, and
    the optimizer makes no state for a parameter without a gradient (torch's AdamW skips
    ``p.grad is None``).  DeepSpeed's ZeRO does make them (``flat_states``): its optimizer steps
    one flat fp32 partition of every trainable parameter, zero-filled where no gradient came
    (``initialize_optimizer_states``)."""
    if full_step is not None:
        full_step()
    else:
        if not flat_states:
            unused = {id(p) for p in tower_parameters(model)}
            trainable = [p for p in trainable if id(p) not in unused]
        tracker.set_phase("optimizer")
        # stepped in the backward, the first step makes each parameter's states while only its
        # own gradient exists: all the zero gradients at once would be a peak no run has
        one_at_a_time = isinstance(optimizer, InBackwardOptimizer)
        for p in trainable:
            p.grad = torch.zeros_like(p)
            tracker.reclassify(local(p.grad), "gradients")
            if one_at_a_time:
                optimizer.step()  # steps the one parameter holding a gradient, frees it
        optimizer.step()
        optimizer.zero_grad(set_to_none=job.grads_to_none)
    _classify_states(optimizer, tracker)


def _observed_optimizer(job: JobSpec, trainable: list[torch.nn.Parameter],
                        tracker: LiveBytesTracker) -> tuple[list[Any], Any]:
    """The job's optimizer, with each gradient booked as such once accumulated (hooks registered
    before the optimizer's own: with optimizer_in_backward its hook steps and frees the gradient)
    and paged states in the tracker's managed memory; returns (hooks, optimizer)."""
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p: tracker.reclassify(p.grad, "gradients")) for p in trainable]
    optimizer = make_optimizer(job, trainable, simulate=True)
    for opt in getattr(optimizer, "optimizers", [optimizer]):  # one per parameter in backward
        if hasattr(opt, "managed_ctx"):
            opt.managed_ctx = tracker.managed
    return hooks, optimizer


def simulate_step(job: JobSpec, source: ModelSource, target: SimTarget | None = None,
                  steps: int = 2, record_events: bool = False, op_hook: Any = None,
                  batch_fn: Any = None) -> SimResult:
    """``batch_fn``: builds the micro-batch inside the fake mode (the real data's keys and shapes,
    e.g. with an attention mask); default: unpadded random token ids.  A list of micro-batches
    instead makes each simulated step run them in turn, one micro-step each (batches padded to
    different lengths: benchmarks/variable_length.py replays the reserve they leave).

    FSDP over several ranks runs as one rank of them (:mod:`trainfit.memory.sharded`): the
    result is that rank's (``per_rank``)."""
    sharded = fsdp_simulable(job)
    # the user's job decides the loading: ZeRO's one-process step below is not how it loads
    loads = records_loading(job, records_wrap(job, sharded))
    # ZeRO-3's linear keeps every input for the backward (zero.py: zero3_linear)
    linear = zero3_linear() if job.sharding == "zero3" else contextlib.nullcontext()
    flat_states = job.sharding in ("zero2", "zero3")
    host_job = job  # the user's job: its offload decides what the host holds (_info)
    if hasattr(op_hook, "optimizer_partition"):
        op_hook.optimizer_partition = None  # a recorder used again: set below for ZeRO only
        op_hook.dtype_alias = {}
        # FSDP1's parameters are views of its gathered flat buffer: FSDP2's copy-out, which the
        # simulated step runs, is no kernel there (JobSpec.fsdp_version)
        op_hook.fsdp_copy_out = not job.fsdp_flat
    if flat_states:
        if job.precision == "amp-fp16" and hasattr(op_hook, "dtype_alias"):
            # DeepSpeed's fp16 mode halves the module (engine: module.half()); its twin below
            # is bf16-true, the same bytes, but the GPU runs fp16 kernels (a T4 has no bf16)
            op_hook.dtype_alias = {"bf16": "fp16"}
        ranks = job.ranks
        job = compute_job(job)  # DeepSpeed's per-rank terms are added to this step (zero.py)
        if hasattr(op_hook, "optimizer_partition"):
            # its optimizer steps this rank's fp32 partition, not the twin's every parameter
            op_hook.optimizer_partition = (ranks, master_bytes_per_param(job) > 0)
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    try:
        with fake_world(job.ranks) if sharded else contextlib.nullcontext() as mesh, linear:
            result = _simulate(job, source, target or SimTarget(), steps, record_events, op_hook,
                               batch_fn, mesh, loads, flat_states, host_job)
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
        # a shape read from the data (a per-expert loop over the tokens routed to it: DBRX,
        # JetMoE, eager experts) — a traceback before (an audit)
        raise JobError(f"--model {source.name}: its forward takes a tensor's shape from the "
                       f"values of the data ({type(e).__name__}: {e.func}; e.g. a loop over "
                       "the tokens routed to each expert), which a data-less simulation cannot "
                       "run", "where transformers offers it, set the config's "
                       "experts_implementation to grouped_mm; or measure the real step with "
                       "trainfit tune") from None
    if flat_states and hasattr(op_hook, "add_partition_copies"):
        op_hook.add_partition_copies(result.trainable_params)
    return result


def _place(model: torch.nn.Module, job: JobSpec, mesh: Any, fake_mode: FakeTensorMode,
           tracker: LiveBytesTracker) -> Any:
    """Give the meta model fake storage; returns the context that books FSDP's own buffers
    (a no-op context without FSDP)."""
    if mesh is None:
        _to_fake(model, fake_mode)
        return contextlib.nullcontext()
    # FSDP shards the meta parameters; to_empty makes the local shards fake (ties kept)
    shard_model(model, job, mesh)
    with fake_mode:
        model.to_empty(device="cpu")
    return fsdp_bookkeeping(tracker)


def _stack_model(job: JobSpec, source: ModelSource, bf16: bool = True
                 ) -> tuple[torch.nn.Module, Any]:
    """The model on meta as the user's stack holds it: torchtune's per-layer RoPE caches,
    transformers < 4.40's RoPE tables, a compiled step's chunked loss (``bf16``: the target has
    bf16, :func:`trainfit.model.workload.qlora_compute_dtype`)."""
    model, info = build_model_on_meta(job, source, bf16=bf16)
    if job.clone_layers:
        add_rope_caches(model, source)
    if job.rope_cache != "none":
        add_legacy_rope_caches(model, source, DTYPES[job.rope_cache])
    if job.compile and isinstance(model, ChunkedHeadLM):
        model.partitioned_loss = True  # a compiled step's chunked loss (model/chunked_head.py)
    return model, info


def _info(job: JobSpec, model: torch.nn.Module, info: Any, untraced: list[str] | None,
          offload: Any) -> dict[str, Any]:
    """SimResult.info: what the model build found, torch.compile's partition, and what the host
    holds (memory/host_offload.py): the tensors the last forward's activation offload copied,
    FSDP CPU offload's pinned shards, ZeRO-3 offload_param's pinned partitions (ZeRO's flat host
    buffers are sized from the whole model: memory/zero_host.py).  ``job``: the user's (a ZeRO
    job's step is simulated as its one-process twin, which offloads nothing)."""
    pinned = pinned_shards(job, model)
    blocks = zero3_param_blocks(job, model)
    if blocks is not None:
        pinned = (blocks, 0)
    return {"quantized_linears": info.quantized_linears, "matmul_params": info.matmul_params,
            "packed_4bit_params": info.packed_4bit_params,
            "lora_target_modules": info.lora_target_modules,
            "compile_partitioned": untraced is not None, "compile_untraced": list(untraced or []),
            "largest_trainable_numel": max((p.numel() for p in model.parameters()
                                            if p.requires_grad), default=0),
            # ZeRO-3's prefetcher passes its live cap by up to one parameter (memory/zero.py);
            # a 4-bit weight packed in uint8 is a buffer of the stand-in, bitsandbytes' Params4bit
            # a parameter (a review)
            "largest_param_bytes": max((t.numel() * t.element_size() for t in (
                *model.parameters(), *(b for n, b in model.named_buffers()
                                       if n.endswith("weight_packed")))), default=0),
            **({"offloaded_sizes": list(offload.offloaded_sizes)} if offload else {}),
            **({"pinned_shards": pinned} if pinned is not None else {})}


def _attention_target(job: JobSpec, source: ModelSource, target: SimTarget,
                      batches: list[dict[str, Any]], padded: bool) -> AttentionTarget:
    """What the step's attention calls are answered by: the target device, the job's attention
    and the batch's masks (``padded``: the batch is :func:`trainfit.model.batch.make_batch`'s,
    whose rows :func:`row_lengths` knows; a data set's are not known)."""
    return AttentionTarget(
        device=target.device, compute_capability=target.compute_capability,
        prefer={"eager": "sdpa", "flash-attention-2": "sdpa-flash"}.get(job.attention,
                                                                         job.attention),
        flash_attention_2=job.attention == "flash-attention-2",
        padded_rows=row_lengths(job.micro_batch or 1, job.seq_len, job.padded) if padded else (),
        padded_length=job.seq_len,
        compiled=job.compile and job.compile_builds_mask,
        packed=job.packs_rows, decoder_only=source.task == "causal-lm",
        expand_kv=job.expand_kv,
        # a mask in the data: padded, transformers cannot skip it
        batch_mask=any(key in ("attention_mask", "decoder_attention_mask")
                       for batch in batches for key in batch),
        batch_mask_causal=any(
            "decoder_attention_mask" in batch or (
                "attention_mask" in batch and source.task != "seq2seq-lm") for batch in batches))


def _simulate(job: JobSpec, source: ModelSource, target: SimTarget, steps: int,
              record_events: bool, op_hook: Any, batch_fn: Any, mesh: Any,
              loads: bool, flat_states: bool = False, host_job: JobSpec | None = None
              ) -> SimResult:
    t0 = time.perf_counter()
    cc = target.compute_capability
    model, info = _stack_model(job, source, bf16=cc is None or tuple(cc) >= (8, 0))
    fake_mode = FakeTensorMode(allow_non_fake_inputs=mesh is not None)
    tracker = LiveBytesTracker(block_bytes=target.block_bytes)
    bookkeeping = _place(model, job, mesh, fake_mode, tracker)
    tracker.record_events = record_events
    if op_hook is not None:
        op_hook.active = False  # only the steady-state step is timed
    trainable = [p for p in model.parameters() if p.requires_grad]
    # activation offloading: TRL's manager as it acts on device memory (model/offload.py)
    offload = simulated_offload(model) if job.activation_offload else None
    autocast = with_offload(cpu_autocast(job), offload)

    with fake_mode:
        hooks, optimizer = _observed_optimizer(job, trainable, tracker)
        batches, step_batches = _step_batches(job, source, batch_fn)
        attn = _attention_target(job, source, target, batches, padded=batch_fn is None)
        micro = len(step_batches)
        # FSDP1's wrap: its history in the allocator trace, the parameters as flat shards
        flats = record_wrap(job, model, tracker) if records_wrap(job, mesh is not None) else []
        quant_state = _track_inputs(model, batches, tracker, job, loads)
        # torch.compile: each block runs as AOTAutograd's partition of it (memory/compiled.py)
        blocks = compiled_blocks(job, model, tracker, sharded=mesh is not None)
        with device_semantics(attn) as ops, legacy_saves(job.softmax_saves_input), \
                bookkeeping, tracker, blocks as untraced:
            carry: dict[str, Any] | None = {} if job.hold_outputs else None
            # amp-fp16's GradScaler, as tune and train run it (one for the run: its scale lives
            # on across the steps); asked of the user's job, as ZeRO's one-process twin has
            # sharding none and DeepSpeed's own scaler is not simulated
            scaler = scaler_for(host_job or job, torch.device("cpu"), simulate=True)

            def run_step() -> None:
                train_step(model, optimizer, iter(step_batches), grad_accum=micro,
                           autocast=autocast, max_grad_norm=job.max_grad_norm, scaler=scaler,
                           grads_to_none=job.grads_to_none, observer=tracker, carry=carry,
                           keep_output=job.output_in_backward)

            if steps > 1:
                # a sharded step runs its first step in full: FSDP makes the gradients on its
                # reduce-scatter stream, and the allocator reuses blocks within a stream only
                _first_step(job, model, optimizer, trainable, tracker,
                            run_step if carry is not None or mesh is not None else None,
                            flat_states)
            if op_hook is not None:
                tracker.op_hook = op_hook
                op_hook.active = True
            run_step()
            tracker.op_hook = None
            _classify_states(optimizer, tracker)
            carry = None
        for h in hooks:
            h.remove()
        steady = sum(tracker.live_breakdown().values()) - tracker.managed_bytes
        del flats  # kept alive through the step: the parameters' bytes
    return _result(tracker, steady, micro, time.perf_counter() - t0,
                   _info(host_job or job, model, info, untraced, offload), ops.kernels_used,
                   info, quant_state, per_rank=mesh is not None)


def _result(tracker: LiveBytesTracker, steady: int, micro: int, sim_time_s: float,
            step_info: dict[str, Any], kernels: dict[str, Any], info: Any, quant_state: int,
            per_rank: bool) -> SimResult:
    """The step's result as the tracker saw it."""
    return SimResult(
        peak_allocated_bytes=tracker.peak.peak_bytes,
        peak_phase=tracker.peak.phase,
        breakdown=tracker.peak.breakdown(),
        phase_peaks=dict(tracker.phase_peaks),
        phase_breakdowns={k: dict(v) for k, v in tracker.phase_breakdowns.items()},
        managed_bytes=tracker.peak_managed_bytes,
        steady_bytes=steady,
        largest_block_bytes=max(tracker.peak.sizes, default=0),
        total_params=info.total_params,
        trainable_params=info.trainable_params,
        sdpa_kernels=dict(kernels),
        micro_steps_simulated=micro,
        sim_time_s=sim_time_s,
        info=step_info,
        events=tracker.events,
        event_streams=tracker.event_streams,
        event_phases=tracker.event_phases,
        quant_state_bytes=quant_state,
        per_rank=per_rank,
    )
