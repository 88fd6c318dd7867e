"""Time of each recorded operation on a device: a roofline with named, sourced efficiencies.

GPU op time = max(compute, memory traffic); matmuls pay tile/wave quantization (a 128×128 output
tile per SM per wave — NVIDIA "Matrix Multiplication Background User's Guide"), so small
micro-batches cannot fill the GPU; every op also costs eager PyTorch time on the CPU (dispatch +
launch). The GPU runs asynchronously: a phase takes max(Σ GPU time, Σ CPU time) — when the CPU
side dominates the step is launch-bound (seed 000: a T4 at 22 % utilisation).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from trainfit.hardware.gpus import GpuSpec
from trainfit.speed.kernels import GEMM_UNALIGNED_HALF, FamilyKernels, kernels_for
from trainfit.speed.ops import OpRecord, op_class

GEMM_TILE = 128
"""Output tile edge of cuBLAS/CUTLASS tensor-core GEMMs (NVIDIA matmul performance guide)."""
GEMM_EFFICIENCY = 0.80
"""A GPU whose family is unknown (no compute capability in the catalog): A100's training GEMM
rate (:mod:`trainfit.speed.kernels` has each family's, from published kernel benchmarks)."""
ATTENTION_EFFICIENCY = {"cudnn": 0.55, "flash": 0.55, "efficient": 0.35, "flash_cpu": 1.0}
"""An unknown family's attention, on the flop counter's count (causal not halved); ``flash_cpu``:
this CPU's kernel, whose time is measured (the rate is folded into the replay)."""
BANDWIDTH_EFFICIENCY = 0.80
"""An unknown family's elementwise kernels: A100's fraction of peak DRAM bandwidth."""
EAGER_OP_OVERHEAD_S = 10e-6
"""CPU cost of one eager aten op with a kernel launch (dispatcher + autograd + launch: 5-10 µs,
H. He, "Making Deep Learning Go Brrrr From First Principles", overhead section; measured on an
H100's host, a 2.1 GHz Xeon with torch 2.11 and Python 3.12: 10.7 µs without autograd, 8.9 µs
recording it — benchmarks/gpu_launch_overhead.py, results/gpu_launch.json)."""
EAGER_BACKWARD_OP_OVERHEAD_S = 15e-6
"""A backward op with a kernel: launched by the autograd engine's device thread, one node at a
time (measured there: 15.1 µs per node of a chain of multiplications, against 8.9 µs for the
same op in the forward)."""
EAGER_VIEW_OVERHEAD_S = 2.5e-6
"""A view/metadata op (no kernel): measured there, 2.5 µs.

Launch-bound steps of transformers models measured on that H100 took 1.5-3× these op-level
costs: the Python of the model's own code around its ops, which :mod:`trainfit.speed.host`
measures by running the step's code at a tiny width (the op-level count stays its floor)."""


@dataclass(frozen=True, kw_only=True)
class DeviceSpeed:
    name: str
    peak_flops: dict[str, float | None]
    """Dense matmul FLOP/s by compute dtype (fp32 = no TF32: torch's default for matmul)."""
    bandwidth_bytes_s: float | None
    sm_count: int | None
    asynchronous: bool
    """GPU: the CPU enqueues ahead of the device.  CPU: everything is sequential."""
    op_overhead_s: float = EAGER_OP_OVERHEAD_S
    backward_op_overhead_s: float = EAGER_BACKWARD_OP_OVERHEAD_S
    """A GPU's backward kernels (the autograd engine's device thread); a CPU device's are timed
    with its own ``op_overhead_s``."""
    view_overhead_s: float = EAGER_VIEW_OVERHEAD_S
    gemm_efficiency: float = GEMM_EFFICIENCY
    gemm_efficiency_fp32: float | None = None
    """IEEE fp32 GEMMs (CUDA cores) where the family's rate differs (None: ``gemm_efficiency``)."""
    gemm_unaligned: float = GEMM_UNALIGNED_HALF
    """A 16-bit GEMM with unaligned rows, as a fraction of the aligned rate
    (:data:`trainfit.speed.kernels.GEMM_UNALIGNED_HALF`)."""
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    autograd_overhead_s: float = 0.0
    """Extra CPU cost of a forward op that records autograd history."""
    bandwidth_curve: list[tuple[float, float]] | None = None
    """Measured (bytes moved, bytes/s) points: caches make small working sets faster."""
    elementwise_rates: dict[str, float] | None = None
    """Measured elements/s of compute-heavy elementwise classes (``rng``, ``transcendental``):
    on a CPU random numbers and exp/log cost compute, not bandwidth; on a GPU they are
    bandwidth-bound (None)."""
    gemm_rate_curve: dict[str, list[tuple[float, float]]] | None = None
    """Measured (GEMM FLOPs, achieved FLOP/s) points per dtype, for devices without a wave model
    (this CPU): achieved rate interpolated in log(FLOPs)."""
    kernels: FamilyKernels | None = None
    """The GPU family's kernel rates (:mod:`trainfit.speed.kernels`); None: one rate for all."""
    kernel_timer: Any = field(default=None, compare=False, repr=False)
    """This CPU: measured seconds of a heavy op replayed at its recorded shapes and layouts
    (:class:`trainfit.speed.cpu_kernels.KernelTimer`); None on a GPU."""
    source: str = ""

    @classmethod
    def from_gpu(cls, gpu: GpuSpec) -> DeviceSpeed:
        bw = gpu.memory_bandwidth_gbs * 1e9 if gpu.memory_bandwidth_gbs else None
        k = kernels_for(gpu.compute_capability, gpu.name)
        extra: dict[str, Any] = {} if k is None else {
            "kernels": k, "gemm_efficiency": k.gemm_efficiency,
            "gemm_efficiency_fp32": k.gemm_efficiency_fp32,
            "gemm_unaligned": k.gemm_unaligned,
            "bandwidth_efficiency": k.bandwidth_efficiency}
        return cls(name=gpu.name, peak_flops={d: gpu.peak_flops(d) for d in ("fp32", "bf16", "fp16")},
                   bandwidth_bytes_s=bw, sm_count=gpu.sm_count, asynchronous=True,
                   source=f"GPU catalog: {gpu.source}"
                   + ("" if k is None else f"; kernel rates: {k.family} ({k.source})"), **extra)


def gemm_time(dev: DeviceSpeed, gemm: tuple[int, int, int, int], dtype: str,
              aligned: bool = True) -> float | None:
    """``aligned``: False for a GEMM cuBLAS must run with its unaligned kernels
    (:attr:`trainfit.speed.ops.OpRecord.aligned`; 16-bit dtypes only, on a GPU)."""
    peak = dev.peak_flops.get(dtype)
    if not peak:
        return None
    b, m, n, k = gemm
    flops = 2.0 * b * m * n * k
    if dev.gemm_rate_curve and dtype in dev.gemm_rate_curve:
        return flops / _interp_rate(dev.gemm_rate_curve[dtype], flops / b)
    eff = dev.gemm_efficiency_fp32 if dtype == "fp32" and dev.gemm_efficiency_fp32 else \
        dev.gemm_efficiency
    if not aligned and dtype in ("bf16", "fp16"):
        eff *= dev.gemm_unaligned
    if not dev.sm_count:
        return flops / (peak * eff)
    tiles = b * math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
    waves = math.ceil(tiles / dev.sm_count)
    split = split_k(tiles, k, dev.sm_count)
    per_tile_flops = 2.0 * GEMM_TILE * GEMM_TILE * math.ceil(k / split)
    t = waves * per_tile_flops / (peak / dev.sm_count) / eff
    if split > 1 and dev.bandwidth_bytes_s:
        # the fp32 partial sums of every slice written and read back by the reduction kernel
        t += 8.0 * split * b * m * n / (dev.bandwidth_bytes_s * dev.bandwidth_efficiency)
    return t


def split_k(tiles: int, k: int, sm_count: int) -> int:
    """Slices of the K dimension a GEMM whose output tiles cannot fill one wave is split into.

    With fewer output tiles than SMs, cuBLAS and CUTLASS partition K across thread blocks
    ("split-K": each block computes a partial sum over K/s, a second kernel reduces them —
    CUTLASS docs/efficient_gemm.md, "Parallelized Reductions"), so a 512-token micro-batch does
    not run on 32 of 80 SMs: BERT-large fp32 on a V100 at micro-batch 1 ran 13 % slower per
    token than at 4 (HF perf_train_gpu_one), where one 128×128 tile per SM and no split said
    28 %.  The split fills the SMs without a second wave and keeps each slice at least one
    tile deep in K (``GEMM_TILE``); with a wave or more of tiles no split is taken (the wave
    quantization stands)."""
    if tiles >= sm_count:
        return 1
    return max(1, min(sm_count // tiles, k // GEMM_TILE))


def _interp_rate(curve: list[tuple[float, float]], flops: float) -> float:
    pts = sorted(curve)
    if flops <= pts[0][0]:
        return pts[0][1] * flops / pts[0][0] if flops < pts[0][0] / 8 else pts[0][1]
    for (f0, r0), (f1, r1) in itertools.pairwise(pts):
        if flops <= f1:
            w = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
            return r0 + w * (r1 - r0)
    return pts[-1][1]


def op_device_time(dev: DeviceSpeed, op: OpRecord) -> float | None:
    """Seconds the device spends on ``op`` (None: a needed peak is unknown)."""
    if not op.kernel:
        return 0.0
    if dev.kernel_timer is not None and op.replay is not None:
        t = dev.kernel_timer(op.replay)
        if t is not None:  # measured with one eager call's overhead, which op_host_time counts
            return max(t - dev.op_overhead_s, 0.0)
    if dev.bandwidth_curve:
        mem = op.bytes / _interp_rate(dev.bandwidth_curve, op.bytes) if op.bytes else 0.0
    else:
        mem = None if dev.bandwidth_bytes_s is None else op.bytes / (
            dev.bandwidth_bytes_s * dev.bandwidth_efficiency)
    compute = 0.0
    if dev.elementwise_rates and op.gemm is None and not op.flops:
        rate = dev.elementwise_rates.get(op_class(op.name))
        if rate:
            compute = op.elements / rate
    if op.gemm is not None:
        t = gemm_time(dev, op.gemm, op.dtype if op.dtype != "other" else "fp32", op.aligned)
        if t is None:
            return None
        compute = t
    elif op.flops:
        peak = dev.peak_flops.get(op.dtype if op.dtype != "other" else "fp32")
        if not peak:
            return None
        if op.name.startswith("convolution"):
            # a convolution is no attention kernel (timed as one at sequence 0, ~0.1 % of peak:
            # an audit); cuDNN's convolutions at an unknown family's attention rate, a bound the
            # memory time below usually passes (a depthwise conv moves more than it computes)
            compute = op.flops / (peak * ATTENTION_EFFICIENCY["flash"])
        else:
            compute = op.flops / (peak * attention_efficiency(dev, op))
        if skips_causal_half(dev, op):
            compute /= 2.0
    if mem is None:
        return None if not compute else compute
    return max(compute, mem)


def skips_causal_half(dev: DeviceSpeed, op: OpRecord) -> bool:
    """A known family's flash kernel skips the masked half of causal attention, which the FLOP
    counter counts: timed at half (op_device_time), and not executed (speed.predict's HFU
    guard)."""
    return op.gemm is None and bool(op.flops) and op.causal and dev.kernels is not None


def attention_efficiency(dev: DeviceSpeed, op: OpRecord) -> float:
    """The fraction of peak an attention kernel runs at (on the counted FLOPs for an unknown
    family, on the executed ones — causal halved — for a known family)."""
    kind = "flash_cpu" if "for_cpu" in op.name else "cudnn" if "cudnn" in op.name else (
        "flash" if "flash" in op.name else "efficient")
    k = dev.kernels
    if k is None or kind == "flash_cpu":
        return ATTENTION_EFFICIENCY[kind]
    attn = (k.cudnn if kind == "cudnn" else None) or \
        (k.flash if kind in ("cudnn", "flash") else None) or k.efficient
    return attn.efficiency(op.seq, op.head_dim or 128)


def op_host_time(dev: DeviceSpeed, op: OpRecord) -> float:
    if not op.kernel:
        base = dev.view_overhead_s
    elif op.phase == "backward" and dev.asynchronous:
        base = dev.backward_op_overhead_s
    else:
        base = dev.op_overhead_s
    return base + (dev.autograd_overhead_s if op.phase == "forward" else 0.0)
