"""From the simulated step to the three peaks a user sees, per rank, and whether it fits.

* ``peak_allocated_bytes`` — ``torch.cuda.max_memory_allocated``: the simulated tensor peak plus
  cuBLAS workspaces (allocated through the caching allocator and kept for the process lifetime).
* ``peak_reserved_bytes`` — ``max_memory_reserved``: the simulated alloc/free trace replayed
  through the caching-allocator model (:mod:`trainfit.memory.allocator`) plus the workspaces.
* ``peak_device_bytes`` — what ``nvidia-smi`` shows: reserved + CUDA context (GPU catalog) + paged
  optimizer states in managed memory (on the device while they fit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from trainfit.hardware.gpus import EAGER_MODULE_LOADING_EXTRA_BYTES, GpuSpec
from trainfit.job import DEFAULT_MARGIN, JobSpec
from trainfit.memory.allocator import replay
from trainfit.memory.bands import ErrorBand, band_for
from trainfit.memory.card_limit import at_card_limit, expandable_reserve, held_reserve
from trainfit.memory.compiled import compile_note
from trainfit.memory.depth_trace import Trace
from trainfit.memory.host_offload import (
    HostActivations,
    host_activations_of_sizes,
    host_clause,
    host_fields,
)
from trainfit.memory.host_offload import pinned_extra_bytes as pinned_extra
from trainfit.memory.loading import load_reserve, loading_notes
from trainfit.memory.ranks import host_offload_bytes, rank_phases
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.memory.wrap import records_wrap, wrap_reserve
from trainfit.memory.zero_host import zero_host_extra_bytes
from trainfit.model.source import ModelSource

CUBLAS_WORKSPACE_BYTES_PRE_HOPPER = 4096 * 1024 * 2 + 16 * 1024 * 8
"""CUBLAS_WORKSPACE_CONFIG default ":4096:2:16:8" (aten/src/ATen/cuda/CublasHandlePool.cpp)."""
CUBLAS_WORKSPACE_BYTES_HOPPER = 4096 * 1024 * 8
"""Default ":4096:8" on compute capability ≥ 9.0."""
CUBLAS_HANDLES = 2
"""One handle per thread issuing matmuls: the Python thread (forward) and the autograd engine's
device thread (backward), each with its own workspace."""

NCCL_BYTES_NVSWITCH = 1_060_000_000
"""8× H100 (NVLink 4, NVSwitch): NCCL's memory after communicator init and the first collectives,
1.06 GB (NVIDIA/nccl#1685, before any all_to_all).  Outside PyTorch's allocator: nvidia-smi only."""
NCCL_BYTES_NVLINK = 688_000_000
"""4× A100 NVLink: 544 MB (2-GPU groups) / 688 MB (> 2 GPUs) per GPU for one communicator and its
all-reduce (NVIDIA/nccl#964); taken for NVLink 2/3 boxes."""
NCCL_CHANNEL_PEER_BYTES = 12 * 2**20
"""One ring channel's buffers per connected peer: SIMPLE 4 MiB + LL128 4.69 MiB + LL 0.5 MiB,
rounded to 10 MiB, + 2 MiB send/control (nccl src/init.cc computeBuffSizes; allocation sizes
10485760 and 2097152 B in nccl#1685's ALLOC log)."""
NCCL_PCIE_CHANNELS = 4
"""Rings NCCL builds over PCIe (2-4 on consumer boxes; the larger taken: under-predicting memory
is the worse error).  An estimate: no published measurement for PCIe cards was found."""


def nccl_bytes(gpu: GpuSpec | None, ranks: int) -> tuple[int, str]:
    """NCCL's own GPU memory per rank for the one communicator DDP/FSDP use (0 for one rank)."""
    if ranks <= 1 or gpu is None:
        return 0, ""
    link = gpu.interconnect or ""
    if link.startswith("nvlink4") or link.startswith("nvlink5"):
        return NCCL_BYTES_NVSWITCH, "NCCL (NVSwitch, published 8× H100 reading)"
    if link.startswith("nvlink"):
        return NCCL_BYTES_NVLINK, "NCCL (NVLink, published 4× A100 reading)"
    n = NCCL_PCIE_CHANNELS * 2 * NCCL_CHANNEL_PEER_BYTES
    return n, f"NCCL ({NCCL_PCIE_CHANNELS} ring channels × 2 peers × 12 MiB, estimated)"


UNKNOWN_CC_OF_A_CARD = (7, 5)
"""The compute capability simulated for a card whose own is not known (``generic-16gb``), for
its fp32 and fp16 rows: a pre-Ampere one, whose SDPA takes no flash kernel (grouped-query heads
fall to the math kernel, which stores the T×T scores): the kernels that hold the most memory,
since a generic card must never be under-predicted (an audit: generic-16gb ran flash and fitted
a row a T4 does not)."""
UNKNOWN_CC_OF_A_BF16_CARD = (9, 0)
"""... and for its bf16 rows: every card with bf16 is Ampere or newer (flash for grouped heads,
never the math kernel); Hopper's cuDNN kernel, the most memory of theirs (a review: a generic
card's bf16 rows simulated pre-Ampere held the T×T scores, 10× an H100's at 8,192 tokens)."""


def cublas_workspace_bytes(gpu: GpuSpec | None) -> int:
    cc = _cc(gpu)
    # an unknown card: Hopper's larger workspaces (the most memory)
    hopper = (cc is None and gpu is not None) or (cc is not None and cc >= (9, 0))
    per = CUBLAS_WORKSPACE_BYTES_HOPPER if hopper else CUBLAS_WORKSPACE_BYTES_PRE_HOPPER
    return per * CUBLAS_HANDLES


def target_for(gpu: GpuSpec | None, precision: str | None = None,
               attention: str | None = None) -> SimTarget:
    """The simulated device: the card's compute capability; a card without a known one
    (generic) is taken at :data:`UNKNOWN_CC_OF_A_CARD` (:data:`UNKNOWN_CC_OF_A_BF16_CARD` for a
    bf16 ``precision`` or flash-attention-2 ``attention``, which runs on Ampere or newer only:
    its fp16 rows took torch's math kernel, a review), no card at all at Ampere's."""
    cc = _cc(gpu)
    if cc is None and gpu is not None:
        newer = "bf16" in (precision or "") or attention == "flash-attention-2"
        cc = UNKNOWN_CC_OF_A_BF16_CARD if newer else UNKNOWN_CC_OF_A_CARD
    return SimTarget(device="cuda", compute_capability=cc or (8, 0))


def _cc(gpu: GpuSpec | None) -> tuple[int, int] | None:
    if gpu is None or not gpu.compute_capability:
        return None
    major, _, minor = gpu.compute_capability.partition(".")
    return int(major), int(minor or 0)


@dataclass
class MemoryPrediction:
    """Predicted peaks of one configuration on one GPU, per rank, bytes."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_device_bytes: int
    breakdown: dict[str, int]
    """At the allocated peak: parameters, gradients, optimizer, activations, temporaries, buffers,
    workspaces; plus managed (paged optimizer states, outside the allocator)."""
    peak_phase: str
    fits: bool | None
    """Device peak ≤ (1 − margin) × capacity, and under the error band; judged on the reserve
    the step asks for (a row that runs only by releasing the cache at the card's limit, with
    ``alloc_retries``, has no margin: False); None without a GPU."""
    headroom_bytes: int | None
    capacity_bytes: int | None
    margin: float
    total_params: int
    trainable_params: int
    sdpa_kernels: dict[str, int]
    sim_time_s: float
    model_notes: list[str] = field(default_factory=list)
    """How reserved and device were derived, and what each number leaves out."""
    error_band_kind: str = ""
    """single-/multi-GPU × method: which published cases the band below was measured on."""
    error_band_under: float = 0.0
    """How far below published peaks predictions of this kind came (benchmarks/bands.py)."""
    error_band_cases: int = 0
    error_band_within: int = 0
    """Of ``error_band_cases``, how many came no further under than ``error_band_under``."""
    peak_device_upper_bytes: int = 0
    """The device peak raised by ``error_band_under``: what the fit is decided on."""
    alloc_retries: int = 0
    """Times the simulated step reached the card's limit, released the allocator's cached blocks
    and retried (``num_alloc_retries``); each release synchronizes the GPU (0: never reached)."""
    reserved_before_step_bytes: int | None = None
    """Predicted ``memory_reserved`` before the first step, when FSDP1's wrap is done (the job's
    ``fsdp_init``: :mod:`trainfit.memory.wrap`) or a QLoRA model's 4-bit weights are made
    (``quant_lib``: :mod:`trainfit.memory.loading`); None without either history."""
    reserved_expandable_bytes: int | None = None
    """The step's reserve with ``expandable_segments:True`` for a job planned without it
    (:mod:`trainfit.memory.expandable`); None where not replayed (the job has it, an
    extrapolated row other than its group's ▲ one, or the card's limit was reached: its note
    gives that allocator's verdict)."""
    host_offload_bytes: int = 0
    """Host RAM the job's CPU offload (``offload``: FSDP CPUOffload, ZeRO offload_optimizer /
    offload_param) holds per rank (:func:`host_offload_bytes`; FSDP's pinned shards in the
    power-of-two blocks PyTorch's pinned-memory cache gives them:
    :func:`trainfit.memory.host_offload.pinned_shards`; ZeRO's host-only and pinned buffers:
    :mod:`trainfit.memory.zero_host`); 0 without one."""
    host_activation_bytes: int | None = 0
    """Pinned host RAM the job's activation offload holds per rank: each saved tensor it copies,
    rounded up to a power of two (:mod:`trainfit.memory.host_offload`); 0 without one, None where
    not known (:func:`trainfit.memory.host_offload.unsized` says why, in the notes)."""
    host_activation_copied_bytes: int = 0
    """Bytes one micro-batch's forward pass copies to the host with activation offload (and its
    backward copies back); 0 without one."""
    host_activation_exact: bool = True
    """``host_activation_bytes`` rounds each offloaded tensor; False: its bound, twice the bytes
    copied (the tensors were not extrapolated: :mod:`trainfit.memory.host_offload`)."""
    matmul_params: int = 0
    """Weights the step's matmuls use, counted on the simulated model (MFU's N:
    :func:`trainfit.model.workload.matmul_params`); 0 where not counted (the formula's N then)."""
    packed_4bit_params: int = 0
    """Of ``total_params``, the values stored packed 4-bit (QLoRA's quantized linears): half a
    byte each in FSDP's / ZeRO-3's gathers, the rest at their width."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def finish(job: JobSpec, source: ModelSource, gpu: GpuSpec | None, *, tensor_peak_bytes: int,
           reserved_replay_bytes: int, breakdown: dict[str, int], managed_bytes: int,
           peak_phase: str, total_params: int, trainable_params: int,
           sdpa_kernels: dict[str, int], sim_time_s: float, how: str,
           margin: float = DEFAULT_MARGIN, eager_module_loading: bool = False,
           phase_breakdowns: dict[str, dict[str, int]] | None = None,
           per_rank: bool = False, quant_state_bytes: int = 0,
           trace: Trace | Callable[[], Trace | None] | None = None,
           compile_untraced: list[str] | None = None,
           compile_partitioned: bool | None = None,
           reserved_floor_bytes: int = 0, setup_events: int | None = None,
           matmul_params: int = 0,
           host_activations: HostActivations | None = None,
           pinned_extra_bytes: int = 0, largest_trainable_numel: int = 0,
           largest_param_bytes: int | None = None,
           packed_4bit_params: int = 0, expandable_figure: bool = False) -> MemoryPrediction:
    """Turn simulated tensor bytes into the allocated / reserved / device peaks and the fit.

    ``tensor_peak_bytes`` is the one-process allocated peak (whole blocks), ``breakdown`` what was
    alive at it, ``reserved_replay_bytes`` the caching allocator's reserve for that trace,
    ``phase_breakdowns`` the breakdown at every phase's peak (for data parallelism), ``trace``
    the step's alloc/free events and streams, or a function that makes them (None where it
    cannot): replayed again at the card's limit when the reserve would pass it; its first
    ``setup_events`` come before the step (the model's loading); ``host_activations``: what an
    activation offload holds in host RAM (None without one); ``pinned_extra_bytes``: what the
    power-of-two blocks of FSDP's pinned offloaded shards take beyond them
    (:func:`trainfit.memory.host_offload.pinned_shards`); ``expandable_figure``: the step's
    reserve with expandable segments is replayed from a trace made on demand too (a plan's ▲
    rows).  Every breakdown term is ≥ 0 and the terms other than ``managed`` sum to the allocated peak."""

    work = cublas_workspace_bytes(gpu)
    # Whole blocks the allocator hands out beyond the tensors' 512 B-rounded bytes (an unsplit
    # remainder ≤ 1 MiB of a large block stays in it: CUDACachingAllocator.cpp, shouldSplit).
    blocks = max(0, tensor_peak_bytes - sum(breakdown.values()))
    # the one-process peak first (one rank, DDP: it stays the peak), then every phase's own
    phases = {peak_phase: breakdown, **{k: v for k, v in (phase_breakdowns or {}).items()
                                        if k != peak_phase}}
    per_phase, dp_notes = rank_phases(job, source, phases, trainable_params, per_rank,
                                      quant_state_bytes, largest_trainable_numel,
                                      largest_param_bytes)
    phase = max(per_phase, key=lambda k: sum(per_phase[k].values()))
    terms = per_phase[phase]
    host = host_offload_bytes(job, source, phases, per_phase, trainable_params, per_rank,
                              quant_state_bytes, largest_trainable_numel, largest_param_bytes)
    host += pinned_extra_bytes + zero_host_extra_bytes(
        job, trainable_params, largest_trainable_numel) if host else 0
    allocated = sum(terms.values()) + blocks + work
    # The allocator's reserve above the allocated peak, from the one-process trace.
    # ``reserved_floor_bytes``: what a smaller micro-batch of the same plan group reserves (a
    # larger one never needs less; the reserve over the peak can fall as the batch grows)
    reserved = max(held_reserve(allocated, reserved_replay_bytes, tensor_peak_bytes),
                   reserved_floor_bytes)
    dev = _device_side(job, gpu, trace, allocated=allocated, tensor_peak_bytes=tensor_peak_bytes,
                       reserved=reserved, managed_bytes=managed_bytes,
                       eager_module_loading=eager_module_loading,
                       expandable_figure=expandable_figure)
    reserved, context, on_device = dev.reserved, dev.context, dev.on_device
    device = dev.resident + on_device
    notes = [*_peak_notes(how, work, context if gpu is not None else None,
                          (on_device, managed_bytes), (dev.nccl, dev.nccl_note)),
             *dp_notes, *([dev.limit_note] if dev.limit_note else []),
             *([dev.saving] if dev.saving else [])]
    notes += _step_notes(job, compile_untraced, compile_partitioned, host_activations)
    before_step, reserve_notes = wrap_reserve(job, trace) if records_wrap(job, per_rank) else \
        load_reserve(job, trace, setup_events, getattr(source, "stored_quant", None) is not None)
    notes += reserve_notes
    cap = gpu.memory_bytes if gpu else None
    if per_rank or (job.sharding.startswith("zero") and job.ranks > 1):
        notes += loading_notes(job, source, gpu, terms, quant_state_bytes)
    band = band_for(job)
    # judged on the reserve the step asks for: a row that runs only by the allocator releasing
    # its cache at the card's limit has no margin left (an audit: such a row fitted a 3090 and
    # not a card 1 GiB larger, where the same step's reserve stood)
    fits, headroom, fit_note = _fit(band, cap, dev.asked_resident, margin)
    if dev.retries:  # asked past the card (card_limit.at_card_limit): never fits
        fit_note += ("; judged on the reserve the step asks for "
                     f"({dev.asked_reserved / 2**30:.2f} GiB): at the card's limit it runs only "
                     "by releasing the allocator's cache, with no margin")
    notes.append(fit_note)
    return MemoryPrediction(
        peak_allocated_bytes=allocated, peak_reserved_bytes=reserved, peak_device_bytes=device,
        breakdown=_full_breakdown(terms, work, managed_bytes, blocks),
        peak_phase=phase.split("@")[0], fits=fits,
        headroom_bytes=headroom,
        capacity_bytes=cap, margin=margin, total_params=total_params,
        error_band_kind=band.kind, error_band_under=band.under, error_band_cases=band.cases,
        error_band_within=band.within,
        peak_device_upper_bytes=round(device * (1 + band.under)), alloc_retries=dev.retries,
        trainable_params=trainable_params, sdpa_kernels=sdpa_kernels, sim_time_s=sim_time_s,
        model_notes=notes, reserved_before_step_bytes=before_step,
        reserved_expandable_bytes=dev.with_expandable, matmul_params=matmul_params,
        packed_4bit_params=packed_4bit_params,
        host_offload_bytes=host, **host_fields(job, host_activations))


@dataclass(frozen=True)
class _DeviceSide:
    """The card's side of a peak: the reserve once the card's limit is met, and what the process
    holds beside it."""

    reserved: int
    context: int
    nccl: int
    nccl_note: str
    retries: int
    limit_note: str
    with_expandable: int | None
    saving: str
    on_device: int
    asked_reserved: int
    """The reserve the step asks for before the card's limit (= ``reserved`` without retries)."""

    @property
    def resident(self) -> int:
        """What the process holds on the card outside managed memory."""
        return self.reserved + self.context + self.nccl

    @property
    def asked_resident(self) -> int:
        """:attr:`resident` with the reserve the step asks for: what ``fits`` is judged on."""
        return self.asked_reserved + self.context + self.nccl


def _device_side(job: JobSpec, gpu: GpuSpec | None,
                 trace: Trace | Callable[[], Trace | None] | None, *, allocated: int,
                 tensor_peak_bytes: int, reserved: int, managed_bytes: int,
                 eager_module_loading: bool, expandable_figure: bool = False) -> _DeviceSide:
    context = (gpu.cuda_context_bytes if gpu else 0) + (
        EAGER_MODULE_LOADING_EXTRA_BYTES if eager_module_loading else 0)
    nccl, nccl_note = nccl_bytes(gpu, job.ranks)
    room = None if gpu is None else gpu.memory_bytes - context - nccl  # what cudaMalloc can get
    retries, limit_note, asked = 0, "", reserved
    if trace is not None and room is not None:
        reserved, retries, limit_note = at_card_limit(
            trace, room, allocated, tensor_peak_bytes, reserved, job.expandable_segments)
    with_expandable, saving = (None, "") if job.expandable_segments or limit_note else \
        expandable_reserve(trace, room, allocated, tensor_peak_bytes, reserved,
                           make_trace=expandable_figure)
    resident = reserved + context + nccl
    # paged optimizer states live in CUDA managed memory: resident while the card has room,
    # paged out to the host under pressure (bitsandbytes' paged optimizers exist for that), so
    # they are counted in the device peak up to the free capacity and never decide the fit
    on_device = managed_bytes if gpu is None else max(0, min(managed_bytes,
                                                             gpu.memory_bytes - resident))
    return _DeviceSide(reserved=reserved, context=context, nccl=nccl, nccl_note=nccl_note,
                       retries=retries, limit_note=limit_note, with_expandable=with_expandable,
                       saving=saving, on_device=on_device, asked_reserved=asked)


def _full_breakdown(terms: dict[str, int], work: int, managed_bytes: int, blocks: int
                    ) -> dict[str, int]:
    """The breakdown a prediction states: the rank's terms, the workspaces, managed memory, and
    where present the allocator's whole-block rounding and the data-parallel extra (last)."""
    out = {**{k: v for k, v in terms.items() if k != "data_parallel"},
           "workspaces": work, "managed": managed_bytes}
    if blocks:
        out["allocator_blocks"] = blocks
    if terms.get("data_parallel"):
        out["data_parallel"] = terms["data_parallel"]
    return out


def _step_notes(job: JobSpec, compile_untraced: list[str] | None,
                compile_partitioned: bool | None, host: HostActivations | None = None
                ) -> list[str]:
    """What the simulated step ran that the peaks depend on: torch.compile, activation offload
    (``host``: what it holds in host RAM), the legacy RoPE tables."""
    notes = []
    if job.compile:
        notes.append(compile_note(job, compile_untraced or [], compile_partitioned))
    if job.activation_offload:
        notes.append("activation offload: TRL's OffloadActivations simulated (saved tensors of "
                     "≥ 1 KiB that are not weights, and not the output head's, wait in host "
                     "memory; the last 5 saved stay on the GPU until 5 more are saved or the forward "
                     "ends); the host↔GPU copies are not timed (the rows' speed: unknown)"
                     + host_clause(job, host))
    if job.packs_rows:
        n = (job.micro_batch or 1) * job.seq_len
        copy = ("a float copy of it in each SDPA layer, kept for the backward "
                f"({2 * n * n / 2**20:,.0f} MiB each in 16 bits)" if job.attention != "eager"
                else "its additive float copy")
        notes.append(f"padding-free: each micro-batch simulated as one row of {n:,} positions "
                     "with the (1, 1, N, N) block-causal mask transformers builds from "
                     f"position_ids ({n * n / 2**20:,.0f} MiB) and {copy}: memory and "
                     "attention time grow with the micro-batch squared (flash_attention_2, "
                     "--attention flash-attention-2, takes the packing with no mask)")
    elif job.padding_free and not job.masks_packing:
        notes.append("padding-free under flash attention: its varlen kernel reads the packing "
                     "from position_ids, so the micro-batch is simulated as separate rows (the "
                     "same memory)")
    elif job.padding_free:
        notes.append("padding-free at micro-batch 1: its row is one sequence, for which "
                     "transformers builds no mask — simulated as the plain row (with packing, "
                     "a bin of several documents has the mask at any micro-batch)")
    if job.rope_cache != "none":
        notes.append(f"rope_cache {job.rope_cache}: each layer holds transformers < 4.40's cos "
                     "and sin tables (max_position_embeddings × head_dim), booked as buffers")
    if job.expand_kv:
        notes.append("expand_kv: k and v copied to the query heads before attention (torchtune's "
                     "model code), the copies kept for the backward in every layer")
    if job.fused_qkv:
        notes.append("fused_qkv: q, k and v simulated as one projection split into views, as "
                     "lit-gpt's model code computes them (with multi-head attention the saved "
                     "values keep the whole output alive); LoRA on them as its LoRAQKVLinear")
    return notes


def _peak_notes(how: str, work: int, context: int | None, managed: tuple[int, int],
                nccl: tuple[int, str]) -> list[str]:
    """How the allocated, reserved and device peaks were made; ``context``: the CUDA context's
    bytes (None: no GPU named — unknown, not 0), ``managed``: (resident, all) bytes of paged
    optimizer states, ``nccl``: (bytes, what)."""
    on_device, managed_bytes = managed
    nccl_bytes_, nccl_note = nccl
    return [
        f"{how}; allocated = live tensor bytes (512 B blocks) + cuBLAS workspaces "
        f"({work / 2**20:.0f} MiB)",
        "reserved: the step's alloc/free trace replayed through the caching-allocator model",
        (f"device: reserved + CUDA context ({context / 2**20:.0f} MiB, GPU catalog): the "
         "process's row in nvidia-smi (its header's 'Memory-Usage' also counts the memory the "
         "driver keeps for itself, NVML total − CUDA total: 480 MiB on an H100, measured)"
         if context is not None else
         "device: unknown without a GPU — reserved + the CUDA context, which depends on the "
         "card (--gpu NAME counts it): nvidia-smi would show more than reserved")
        + (f" + paged optimizer states in managed memory ({on_device / 2**30:.2f} of "
           f"{managed_bytes / 2**30:.2f} GiB resident: the rest pages to the host; not part of "
           "the fit)" if managed_bytes else "")
        + (f" + {nccl_note}: {nccl_bytes_ / 2**30:.2f} GiB, outside PyTorch's allocator"
           if nccl_bytes_ else ""),
    ]


def _fit(band: ErrorBand, cap: int | None, resident: int, margin: float
         ) -> tuple[bool | None, int | None, str]:
    """(fits, headroom, note): the device peak raised by how far predictions of this kind have
    come below published measurements, or by the margin asked for, whichever leaves more room."""
    limit = None if cap is None else int(cap * min(1 - margin, 1 / (1 + band.under)))
    seen = (f"predictions of this kind came at most {band.under:.0%} under the published peak "
            f"in {band.within} of {band.cases} cases (errors {band.min_error:+.0%} … "
            f"{band.max_error:+.0%})" if band.cases else
            f"no published case of this kind: the widest band, {band.under:.0%}")
    note = (f"error band ({band.kind}): {seen}; fits = device peak × (1 + {band.under:.0%}) and "
            f"≤ (1 − {margin:.0%}) of the GPU")
    if limit is None:
        return None, None, note
    return resident <= limit, limit - resident, note


def predict_memory(job: JobSpec, source: ModelSource, gpu: GpuSpec | None,
                   margin: float = DEFAULT_MARGIN, eager_module_loading: bool = False,
                   op_hook: Any = None) -> MemoryPrediction:
    """One configuration, simulated at full size (exact; seconds to tens of seconds)."""
    target = target_for(gpu, job.precision, job.attention)
    sim = simulate_step(job, source, target, record_events=True, op_hook=op_hook)
    rep = replay(sim.events, sim.event_streams, expandable=job.expandable_segments)
    # the allocator counts whole blocks (an unsplit remainder ≤ 1 MiB stays in the block)
    return finish(job, source, gpu,
                  tensor_peak_bytes=max(sim.peak_allocated_bytes, rep.peak_allocated_bytes),
                  reserved_replay_bytes=rep.peak_reserved_bytes, breakdown=sim.breakdown,
                  managed_bytes=sim.managed_bytes, peak_phase=sim.peak_phase,
                  total_params=sim.total_params, trainable_params=sim.trainable_params,
                  sdpa_kernels=sim.sdpa_kernels, sim_time_s=sim.sim_time_s,
                  how="simulated at full size", margin=margin,
                  eager_module_loading=eager_module_loading,
                  phase_breakdowns=sim.phase_breakdowns, per_rank=sim.per_rank,
                  quant_state_bytes=sim.quant_state_bytes,
                  trace=(sim.events, sim.event_streams),
                  setup_events=sim.event_phases[0][0] if sim.event_phases else None,
                  compile_untraced=sim.info.get("compile_untraced"),
                  compile_partitioned=sim.info.get("compile_partitioned"),
                  matmul_params=sim.info.get("matmul_params", 0),
                  packed_4bit_params=sim.info.get("packed_4bit_params", 0),
                  host_activations=host_activations_of_sizes(sim.info["offloaded_sizes"])
                  if "offloaded_sizes" in sim.info else None,
                  pinned_extra_bytes=pinned_extra(sim.info.get("pinned_shards")),
                  largest_trainable_numel=sim.info.get("largest_trainable_numel", 0),
                  largest_param_bytes=sim.info.get("largest_param_bytes"))
