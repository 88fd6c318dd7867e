"""Predicted step time, tokens/s, MFU and GPU busy fraction of a configuration.

The ops of the first micro-step (forward, backward) and of the optimizer step are recorded at the
same four small points as memory (layers L ∈ {1, 2} × micro-batch B ∈ {b1, b2}).  Matching the op
sequences of b1 and b2 tells which dimensions of each op grow with the batch; the ops of any B are
rebuilt from that, timed on the device (:mod:`trainfit.speed.roofline`), and the per-layer cost is
extrapolated to the full depth.  A step is ``grad_accum`` micro-steps plus one optimizer step.

MFU (PaLM, appendix B): model FLOPs per token = 6·N + 12·L·H·Q·T with N the matmul parameters
(all linear layers incl. the output head, not the embedding lookup), recomputation not counted.
With LoRA the frozen weights still run forward and the input-gradient half of backward, but have no
weight gradient: model FLOPs per token = 4·N_frozen + 6·N_trainable + 12·L·H·Q·T.  HFU counts what
the device actually executes (recorded matmul and attention FLOPs, recomputation included).  For
full fine-tuning HFU = MFU + the recomputation; with LoRA, 4·N_frozen is an upper bound — autograd
skips the input gradient of a frozen matmul whose input needs none (the first layer's
projections of the embedding), so a prediction's model FLOPs are the lesser of the formula and
the FLOPs the step executes, which keeps MFU ≤ HFU (GPT-J-6B QLoRA on a 3090, no checkpointing:
the formula gave MFU 52.4 % against HFU 51.6 %, a QA run; both 51.6 % now).  A measured MFU
(doctor) keeps the formula: its step's executed FLOPs are not recorded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from trainfit.speed.host import HostStep
from trainfit.speed.ops import OpRecord
from trainfit.speed.roofline import (
    DeviceSpeed,
    op_device_time,
    op_host_time,
    skips_causal_half,
)


@dataclass
class SpeedPrediction:
    step_time_s: float | None
    """One optimizer step: all accumulation micro-steps + optimizer (predicted, seconds)."""
    tokens_per_s: float | None
    samples_per_s: float | None
    mfu: float | None
    hfu: float | None
    device_busy_fraction: float | None
    """Fraction of the step a kernel runs (what nvidia-smi "GPU-Util" approximates)."""
    bound: str
    """launch-bound (the host's launches outlast the device's forward + backward), compute-bound
    (matmuls and attention hold ≥ half the device time: :data:`MATMUL_BOUND_FRACTION`),
    memory-bound (the rest: elementwise, norms, copies, the optimizer), communication-bound (the
    exposed gradient exchange is over half the step: :func:`trainfit.speed.comm.with_sync`), or
    unknown."""
    model_flops_per_token: float
    unknown_reason: str = ""
    sync_s: float | None = None
    """ranks > 1: time of the gradient collectives per step (trainfit.speed.comm), seconds."""
    sync_exposed_s: float | None = None
    """The part of ``sync_s`` not hidden behind compute, included in ``step_time_s``."""
    sync_contention_s: float | None = None
    """What the hidden part of ``sync_s`` adds by taking memory bandwidth from compute, included
    in ``step_time_s`` (:mod:`trainfit.speed.comm`), seconds per step (None: one rank)."""
    sync_note: str = ""
    unaligned_gemm_s: float = 0.0
    """Seconds of the step that 16-bit GEMMs with unaligned rows take beyond their aligned time
    (:attr:`trainfit.speed.ops.OpRecord.aligned`; predicted)."""
    unaligned_dims: tuple[int, ...] = ()
    """Their dimensions that are not a multiple of 8 elements (e.g. a 50,257 vocabulary)."""
    host_fb_s: float | None = None
    """Host seconds of one micro-step's forward + backward (predicted: the larger of the
    op-level count and the measured run of the step's code, :mod:`trainfit.speed.host`)."""
    host_measured: bool = False
    """The step's code was measured (:mod:`trainfit.speed.host`): ``host_fb_s`` is that run's,
    or the op-level count where it stayed the larger (autocast's casts at an H100 host's cost);
    False: the op-level count alone, which misses the model's own Python."""
    host_busy_cores: float | None = None
    """The measured run's :attr:`trainfit.speed.host.HostStep.busy_cores`: CPU cores other
    processes used while it was timed (None: not measured)."""
    host_busy: bool = False
    """Every round of it was busy (:attr:`trainfit.speed.host.HostStep.busy`): the host time may
    be too slow."""
    optimizer_s: float | None = None
    """Seconds of ``step_time_s`` the optimizer step takes, once per step whatever the
    accumulation (predicted; one rank's: its shard under FSDP and ZeRO, every parameter
    under DDP)."""
    framework_host_s: float | None = None
    """Host seconds per micro-step of the training framework's own Python around the step —
    DeepSpeed ZeRO's hooks (:mod:`trainfit.speed.zero_hooks`) — included in ``host_fb_s``
    (predicted; None: none modelled)."""
    mfu_peak_dtype: str | None = None
    """The dtype whose peak FLOP/s MFU and HFU are shares of: the one most of the step's matmul
    FLOPs run in (:func:`dominant_dtype`) — not always the precision's (an MoE's experts run
    their grouped matmuls in the fp32 master weights under autocast), so MFU is not comparable
    between rows of different peaks (an audit: an amp-bf16 row at 70 % beside bf16-true's 23 %,
    4.8× faster)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _scale(v1: float, v2: float, b1: int, b2: int, b: int) -> float:
    return v1 + (v2 - v1) * (b - b1) / (b2 - b1)


def _check_same_sequence(ops1: list[OpRecord], ops2: list[OpRecord]) -> None:
    if len(ops1) != len(ops2) or any(x.name != y.name for x, y in zip(ops1, ops2, strict=True)):
        raise ValueError("op sequences differ between micro-batches")


def ops_at_batch(ops1: list[OpRecord], ops2: list[OpRecord], b1: int, b2: int, b: int
                 ) -> list[OpRecord]:
    """The op list at micro-batch ``b`` from the lists recorded at ``b1`` and ``b2``."""
    _check_same_sequence(ops1, ops2)
    out = []
    for x, y in zip(ops1, ops2, strict=True):
        gemm = None
        if x.gemm is not None and y.gemm is not None:
            gemm = tuple(max(1, round(_scale(p, q, b1, b2, b))) for p, q in zip(x.gemm, y.gemm,
                                                                              strict=True))
        out.append(OpRecord(x.name, x.phase, max(0.0, _scale(x.flops, y.flops, b1, b2, b)),
                            max(0.0, _scale(x.bytes, y.bytes, b1, b2, b)), x.dtype, gemm, x.kernel,
                            max(0.0, _scale(x.elements, y.elements, b1, b2, b)),
                            seq=x.seq, causal=x.causal, aligned=x.aligned and y.aligned,
                            head_dim=x.head_dim))
    return out


FUSED_KERNEL = "fused_elementwise"
PAD_KERNEL = "pad_mm_copy"


def fuse_elementwise(ops: list[OpRecord]) -> list[OpRecord]:
    """The forward/backward ops as ``torch.compile`` runs them: Inductor fuses each run of
    elementwise and reduction ops between two matmul/attention kernels into one generated kernel
    that reads the run's inputs and writes its outputs once (torch/_inductor/scheduler.py fuses
    pointwise and reduction nodes of the same iteration space), and launches it without eager
    dispatch.  A run's traffic is modelled as its largest op's (a fused chain still reads and
    writes the largest tensor it touches once); view ops vanish.  GEMMs, attention and the
    optimizer (already a fused or foreach kernel) are kept as they are.  Upper bound of the
    speed-up: Inductor also fuses across some matmul epilogues, which is not counted.

    A 16-bit GEMM with unaligned rows is padded: Inductor's ``pad_mm`` pass (on by default,
    ``torch._inductor.config.shape_padding``) copies the operands that carry the odd dimension
    into buffers padded to the alignment and runs the aligned kernel.  The copies are counted as
    one more pass over the GEMM's operands (a kernel reading and writing ``op.bytes``)."""
    out: list[OpRecord] = []
    run: list[OpRecord] = []

    def close() -> None:
        if run:
            big = max(run, key=lambda o: o.bytes)
            out.append(OpRecord(FUSED_KERNEL, big.phase, 0.0, big.bytes, big.dtype, None, True,
                                max(o.elements for o in run)))
            run.clear()

    for op in ops:
        if op.gemm is not None and not op.aligned:
            close()
            out.append(OpRecord(PAD_KERNEL, op.phase, 0.0, op.bytes, op.dtype, None, True,
                                op.elements))
            out.append(dataclasses.replace(op, aligned=True))
        elif op.phase == "optimizer" or op.gemm is not None or op.flops:
            close()
            out.append(op)
        elif op.kernel:
            if run and run[-1].phase != op.phase:
                close()
            run.append(op)
    close()
    return out


@dataclass
class PhaseTimes:
    device_s: dict[str, float]
    host_s: dict[str, float]
    hw_flops: float
    unknown: bool
    unaligned_s: float = 0.0
    """Device seconds of a micro-step spent by unaligned 16-bit GEMMs beyond their aligned time."""
    unaligned_dims: frozenset[int] = frozenset()
    matmul_s: float = 0.0
    """Device seconds of a micro-step's forward + backward in matmuls and attention kernels (the
    ops with FLOPs): its share of the step's device time names the step compute-bound."""
    skipped_flops: float = 0.0
    """FLOPs of ``hw_flops`` no kernel executes: the masked half of causal attention, which the
    count keeps (PaLM's convention, as MFU's) and a known family's flash kernels skip."""


MATMUL_BOUND_FRACTION = 0.5
"""Matmul share of the step's device time at or above which a step that is not launch-bound is
compute-bound (below: memory-bound) — doctor's line for a measured step
(:data:`trainfit.doctor.findings.MATMUL_COMPUTE_FRACTION`), so plan and doctor name one step
alike. The largest share, not an MFU threshold: a 30 % MFU line called a step whose time went to
its gradient exchange or its elementwise kernels compute-bound."""


def time_ops(dev: DeviceSpeed, ops: list[OpRecord]) -> PhaseTimes:
    device = {"fb": 0.0, "optimizer": 0.0}
    host = {"fb": 0.0, "optimizer": 0.0}
    flops = skipped = 0.0
    unknown = False
    unaligned_s, odd = 0.0, set[int]()
    matmul_s = 0.0
    for op in ops:
        key = "optimizer" if op.phase == "optimizer" else "fb"
        t = op_device_time(dev, op)
        if t is None:
            unknown = True
            t = 0.0
        device[key] += t
        host[key] += op_host_time(dev, op)
        if op.gemm is not None and not op.aligned and op.phase != "optimizer":
            aligned = op_device_time(dev, dataclasses.replace(op, aligned=True)) or 0.0
            if t > aligned:
                unaligned_s += t - aligned
                odd |= {d for d in op.gemm[1:] if d % 8}
        if op.phase != "optimizer" and (op.gemm is not None or op.flops):
            matmul_s += t
        if op.phase != "optimizer":
            # counted as MFU's model FLOPs count them (PaLM's 12·L·H·Q·T: attention as if
            # unmasked), so that HFU = MFU + the recomputation in full fine-tuning; the
            # roofline still times a flash kernel's causal half skipped (op_device_time)
            flops += op.flops
            if skips_causal_half(dev, op):
                skipped += op.flops / 2.0
    if dev.kernel_timer is not None:
        dev.kernel_timer.save()
    return PhaseTimes(device, host, flops, unknown, unaligned_s, frozenset(odd), matmul_s,
                      skipped)


def phase_time(dev: DeviceSpeed, t: PhaseTimes, phase: str) -> float:
    """One phase's seconds (``fb``: one micro-step's forward + backward; ``optimizer``): the
    host and the device overlap on a GPU (asynchronous launches) and add up on a CPU."""
    if dev.asynchronous:
        return max(t.device_s[phase], t.host_s[phase])
    return t.device_s[phase] + t.host_s[phase]


def combine(dev: DeviceSpeed, t: PhaseTimes, grad_accum: int) -> tuple[float, float]:
    """(step time, device busy time) for ``grad_accum`` micro-steps + the optimizer."""
    busy = grad_accum * t.device_s["fb"] + t.device_s["optimizer"]
    return grad_accum * phase_time(dev, t, "fb") + phase_time(dev, t, "optimizer"), busy


def model_flops_per_token(config: Any, total_params: int, trainable_params: int, seq_len: int,
                          full_finetune: bool, inactive_params: int = 0,
                          matmul_params: int = 0) -> float:
    """PaLM's 6N + 12·L·H·Q·T with N = matmul parameters (see the module docstring) a token
    runs through: ``inactive_params``, the routed experts it does not use, are not in N
    (:mod:`trainfit.model.experts`). ``matmul_params``: N counted on the built model (lookup
    tables, norms and biases left out: :func:`trainfit.model.workload.matmul_params`); without
    it, every parameter but the untied input embedding."""
    hidden = getattr(config, "hidden_size", None) or getattr(config, "d_model", None) \
        or getattr(config, "n_embd", 0)
    vocab = int(getattr(config, "vocab_size", 0))
    layers = int(getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers", None)
                 or getattr(config, "n_layer", 0))
    heads = int(getattr(config, "num_attention_heads", None) or getattr(config, "num_heads", None)
                or getattr(config, "n_head", 1))
    head_dim = int(getattr(config, "head_dim", None) or (hidden // max(heads, 1)))
    tied = bool(getattr(config, "tie_word_embeddings", False))
    # the input embedding is a lookup, not a matmul; when tied it is also the output head
    whole = matmul_params or (total_params if tied else total_params - vocab * hidden)
    n_matmul = max(whole - inactive_params, 0)
    attention = 12.0 * _softmax_attention_layers(config, layers) * heads * head_dim * seq_len
    if full_finetune:
        return 6.0 * n_matmul + attention
    frozen = max(n_matmul - trainable_params, 0)
    return 4.0 * frozen + 6.0 * trainable_params + attention


def _softmax_attention_layers(config: Any, layers: int) -> int:
    """Layers whose attention is PaLM's 12·H·Q·T term: transformers' ``layer_types`` where the
    config lists them (a hybrid's ``linear_attention`` — Mamba, gated delta rules — computes no
    T×T scores; sliding-window layers count whole, PaLM's convention; Mamba's are all linear),
    else every layer (a config with no head count — a module:factory model — is one head of
    the hidden size: the same 12·L·d·T). An audit found granite-4.0-h-1b's 4 attention layers
    counted as 40, and pure Mamba's hidden size taken as one attention head."""
    types = getattr(config, "layer_types", None)
    if isinstance(types, list | tuple) and types:
        return sum(1 for t in types if "attention" in str(t) and "linear" not in str(t))
    return layers


def unknown_speed(flops_per_token: float, reason: str) -> SpeedPrediction:
    """Speed that cannot be predicted: every time and rate unknown, with the reason."""
    return SpeedPrediction(step_time_s=None, tokens_per_s=None, samples_per_s=None, mfu=None,
                           hfu=None, device_busy_fraction=None, bound="unknown",
                           model_flops_per_token=flops_per_token, unknown_reason=reason)


def fb_kernels(ops: list[OpRecord]) -> int:
    """Kernels of the recorded forward + backward (the host pays a launch for each)."""
    return sum(1 for op in ops if op.kernel and op.phase != "optimizer")


def with_host(dev: DeviceSpeed, times: PhaseTimes, host: HostStep | None,
              sim_kernels: float) -> bool:
    """Raise the forward + backward's host time to the measured run's (:mod:`trainfit.speed.
    host`) where that is larger; True when it was.  The op-level count stays the floor: it is
    what the ops alone cost."""
    if host is None:
        return False
    measured = host.host_s(sim_kernels, dev.op_overhead_s, gpu=dev.asynchronous)
    if measured <= times.host_s["fb"]:
        return False
    times.host_s["fb"] = measured
    return True


def speed_from_times(dev: DeviceSpeed, times: PhaseTimes, dtype_peak: float | None,
                     micro_batch: int, grad_accum: int, seq_len: int, ranks: int,
                     flops_per_token: float, host: HostStep | None = None,
                     host_set: bool = True, framework_host_s: float = 0.0,
                     peak_dtype: str | None = None) -> SpeedPrediction:
    """``dtype_peak``: the peak MFU and HFU are measured against (:func:`dominant_peak`);
    ``host``: the measured run of the step's code (None: not measured); ``host_set``: it set
    the host time (:func:`with_host`; else the op-level floor stayed above it);
    ``framework_host_s``: host seconds per micro-step of the framework's hooks around the
    step (DeepSpeed ZeRO's: :mod:`trainfit.speed.zero_hooks`), added to the forward +
    backward's host time."""
    times.host_s["fb"] += framework_host_s
    if times.unknown:
        return unknown_speed(flops_per_token,
                             "the GPU's peak for this dtype or its bandwidth is unknown")
    step, busy = combine(dev, times, grad_accum)
    tps = micro_batch * grad_accum * seq_len * ranks / step
    # with LoRA, 4·N_frozen counts an input gradient autograd skips (a frozen matmul whose input
    # needs none: the first layer's projections of the embedding): the FLOPs the step executes
    # bound the model's, so MFU ≤ HFU (an audit: MFU 0.770 against HFU 0.761 on a Falcon-7B
    # LoRA row). Full fine-tuning executes at least 6N + attention (the backward's attention
    # as its kernels run it, above PaLM's count): unchanged there
    executed_per_token = times.hw_flops / (micro_batch * seq_len)
    if 0 < executed_per_token < flops_per_token:
        flops_per_token = executed_per_token
    mfu = None if not dtype_peak else flops_per_token * tps / ranks / dtype_peak
    hfu = None if not dtype_peak else times.hw_flops * grad_accum / step / dtype_peak
    bound = "launch-bound" if times.host_s["fb"] > times.device_s["fb"] else (
        "compute-bound" if busy and grad_accum * times.matmul_s / busy >= MATMUL_BOUND_FRACTION
        else "memory-bound")
    # the FLOPs the kernels execute (causal attention's masked half skipped) faster than the
    # peak allows is a modelling error, never a prediction: the step time is impossible, so the
    # speed is unknown, said (a review: the MFU alone went blank and the tokens/s behind it was
    # still printed). Not with kernels replayed (tune): their times are measurements
    executed = (times.hw_flops - times.skipped_flops) * grad_accum / step / dtype_peak \
        if dtype_peak else 0.0
    if executed > 1.0 and dev.kernel_timer is None:
        return unknown_speed(flops_per_token,
                             f"the step was timed faster than the {peak_dtype or 'dtype'} peak "
                             f"allows ({executed:.0%} of it in the FLOPs its kernels execute): "
                             "a modelling error in trainfit, not a prediction (please report "
                             "it)")
    # MFU and HFU count causal attention whole (PaLM's 12·L·H·Q·T): above 100 % where the
    # skipped half is most of the step, a convention's figure, not the card's: stated as unknown
    # (doctor.peaks.bounded_mfu does the same with measured steps)
    mfu = None if mfu is not None and mfu > 1.0 else mfu
    hfu = None if hfu is not None and hfu > 1.0 else hfu
    return SpeedPrediction(step, tps, tps / seq_len, mfu, hfu, busy / step, bound, flops_per_token,
                           mfu_peak_dtype=peak_dtype if dtype_peak else None,
                           unaligned_gemm_s=grad_accum * times.unaligned_s,
                           unaligned_dims=tuple(sorted(times.unaligned_dims)),
                           host_fb_s=times.host_s["fb"], host_measured=host is not None,
                           host_busy_cores=None if host is None else host.busy_cores,
                           # a busy machine's measurement matters where it set the time
                           host_busy=host is not None and host.busy and host_set,
                           optimizer_s=phase_time(dev, times, "optimizer"),
                           framework_host_s=framework_host_s or None)


def predict_speed_exact(dev: DeviceSpeed, ops: list[OpRecord], micro_batch: int, grad_accum: int,
                        seq_len: int, ranks: int, flops_per_token: float,
                        compiled: bool = False, host: HostStep | None = None,
                        framework_host_s: float = 0.0) -> SpeedPrediction:
    """From the ops of a full-size simulation of exactly this configuration (``compiled``: as
    ``torch.compile`` runs them, :func:`fuse_elementwise`; ``host``: the step's code measured,
    :mod:`trainfit.speed.host`; ``framework_host_s``: :func:`speed_from_times`)."""
    if compiled:
        ops = fuse_elementwise(ops)
    times = time_ops(dev, ops)
    # the measured step taken into account also where the op-level floor stays above it
    # (autocast's casts counted at an H100 host's cost): the row is then not the per-op count
    # alone, "an upper bound" (an audit)
    host_set = with_host(dev, times, host, fb_kernels(ops))
    return speed_from_times(dev, times, dominant_peak(dev, ops), micro_batch,
                            grad_accum, seq_len, ranks, flops_per_token,
                            host, host_set, framework_host_s, peak_dtype=dominant_dtype(ops))


def _split(dev: DeviceSpeed, lo: list[OpRecord], hi: list[OpRecord]
           ) -> tuple[list[tuple[OpRecord, OpRecord]], dict[str, tuple[float, float]],
                      dict[str, float]]:
    """Ops whose device time needs their shape at each batch (GEMMs, attention, CPU compute
    classes) apart from the rest, whose time is bytes / bandwidth and so affine in the batch:
    those are summed once (a grid of 40 rows would otherwise re-time every op 40 times)."""
    _check_same_sequence(lo, hi)
    shaped: list[tuple[OpRecord, OpRecord]] = []
    bytes_sum = {"fb": (0.0, 0.0), "optimizer": (0.0, 0.0)}
    host = {"fb": 0.0, "optimizer": 0.0}
    for x, y in zip(lo, hi, strict=True):
        key = "optimizer" if x.phase == "optimizer" else "fb"
        host[key] += op_host_time(dev, x)
        simple = x.kernel and x.gemm is None and not x.flops and not (
            dev.elementwise_rates or dev.bandwidth_curve)
        if simple:
            b0, b1 = bytes_sum[key]
            bytes_sum[key] = (b0 + x.bytes, b1 + y.bytes)
        elif x.kernel:
            shaped.append((x, y))
    return shaped, bytes_sum, host


def predict_speed(dev: DeviceSpeed, op_points: list[list[OpRecord]], layers: tuple[int, int],
                  batches: tuple[int, int], full_layers: int, micro_batch: int, grad_accum: int,
                  seq_len: int, ranks: int, flops_per_token: float,
                  cache: dict[Any, Any] | None = None, compiled: bool = False,
                  host: HostStep | None = None, framework_host_s: float = 0.0
                  ) -> SpeedPrediction:
    """``op_points``: op lists at (L1,b1), (L2,b1), (L1,b2), (L2,b2); ``compiled``: as
    ``torch.compile`` runs them (:func:`fuse_elementwise`); ``host``: the step's code measured
    at full depth (:mod:`trainfit.speed.host`); ``framework_host_s``: :func:`speed_from_times`."""
    (l1, l2), (b1, b2) = layers, batches
    if compiled:
        op_points = [fuse_elementwise(ops) for ops in op_points]
    per_l = []
    for idx, (lo, hi) in enumerate(((op_points[0], op_points[2]), (op_points[1], op_points[3]))):
        key = (id(dev), idx, compiled, b1, b2)  # each batch segment its own pairing
        if cache is not None and key in cache:
            shaped, bytes_sum, host_sums = cache[key]
        else:
            shaped, bytes_sum, host_sums = _split(dev, lo, hi)
            if cache is not None:
                cache[key] = (shaped, bytes_sum, host_sums)
        rebuilt = ops_at_batch([x for x, _ in shaped], [y for _, y in shaped], b1, b2,
                               micro_batch)
        t = time_ops(dev, rebuilt)
        bw = None if dev.bandwidth_bytes_s is None else dev.bandwidth_bytes_s * \
            dev.bandwidth_efficiency
        for k, (x, y) in bytes_sum.items():
            if x or y:
                if bw is None:
                    t.unknown = True
                else:
                    t.device_s[k] += max(0.0, _scale(x, y, b1, b2, micro_batch)) / bw
        t.host_s = dict(host_sums)
        per_l.append(t)
    t1, t2 = per_l
    span = (l2 - l1) or 1
    f = (full_layers - l1) / span if l2 != l1 else 0.0
    times = PhaseTimes(
        {k: t1.device_s[k] + f * (t2.device_s[k] - t1.device_s[k]) for k in t1.device_s},
        {k: t1.host_s[k] + f * (t2.host_s[k] - t1.host_s[k]) for k in t1.host_s},
        t1.hw_flops + f * (t2.hw_flops - t1.hw_flops), t1.unknown or t2.unknown,
        max(0.0, t1.unaligned_s + f * (t2.unaligned_s - t1.unaligned_s)),
        t1.unaligned_dims | t2.unaligned_dims,
        max(0.0, t1.matmul_s + f * (t2.matmul_s - t1.matmul_s)),
        max(0.0, t1.skipped_flops + f * (t2.skipped_flops - t1.skipped_flops)))
    k1, k2 = fb_kernels(op_points[0]), fb_kernels(op_points[1])
    host_set = with_host(dev, times, host, k1 + f * (k2 - k1))
    return speed_from_times(dev, times, dominant_peak(dev, op_points[0], op_points[1], f),
                            micro_batch, grad_accum, seq_len, ranks, flops_per_token,
                            host, host_set, framework_host_s,
                            peak_dtype=dominant_dtype(op_points[0], op_points[1], f))


def _flops_by_dtype(ops: list[OpRecord]) -> dict[str, float]:
    by: dict[str, float] = {}
    for op in ops:
        if op.flops and op.phase != "optimizer":
            by[op.dtype] = by.get(op.dtype, 0.0) + op.flops
    return by


def dominant_peak(dev: DeviceSpeed, ops: list[OpRecord], deeper: list[OpRecord] | None = None,
                  f: float = 0.0) -> float | None:
    """The peak of the dtype most matmul FLOPs run in; with ``deeper`` (the ops of a deeper
    small simulation) at the full depth, ``f`` = (L − L1) / (L2 − L1) layer steps beyond ``ops``.

    The dtype mix moves with depth: QLoRA with fp32 LoRA weights and head runs its 4-bit base
    matmuls in bf16, so at 2 layers the fp32 head dominates and at 28 the bf16 base does.
    Taking the small simulation's dominant dtype put extrapolated Qwen2.5-7B QLoRA rows at MFU
    2.2-3.8 (the fp32 peak, 1/16 of bf16's) where the full-size simulation said 0.14."""
    dtype = dominant_dtype(ops, deeper, f)
    return None if dtype is None else dev.peak_flops.get(dtype)


def dominant_dtype(ops: list[OpRecord], deeper: list[OpRecord] | None = None,
                   f: float = 0.0) -> str | None:
    """The dtype most matmul FLOPs run in (:func:`dominant_peak`'s; ``other`` read as fp32)."""
    by = _flops_by_dtype(ops)
    if deeper is not None:
        by2 = _flops_by_dtype(deeper)
        by = {d: by.get(d, 0.0) + f * (by2.get(d, 0.0) - by.get(d, 0.0)) for d in {*by, *by2}}
    if not by:
        return None
    dtype = max(by, key=by.get)
    return dtype if dtype != "other" else "fp32"
