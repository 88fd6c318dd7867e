"""The ceilings MFU is measured against: this host's CPU GEMM rate (measured, the best seen) or the
GPU's published dense peak for the dtype (catalog), and the rule that an MFU above 100 % is never
stated (the ceiling was wrong, not the step)."""

from __future__ import annotations

import functools
import time

import torch

from trainfit.cache import read_json
from trainfit.hardware.gpus import find_gpu_by_device_name
from trainfit.speed import cpu as cpu_speed


def cpu_peak_flops(dtype: torch.dtype = torch.float32, threads: int | None = None) -> float:
    """This host's dense GEMM ceiling (the peak MFU is relative to): the best rate ever seen here —
    trainfit.speed.cpu's cached curve and a fresh best of 5 timings at 1024³ and 2048³ (2 at the
    first size whose call is slow, then no larger), whichever is
    higher. A measured rate can only be below the true peak (a busy moment slows it), so the
    maximum is the honest ceiling; a single quick timing on a busy host made MFU read 154 %.
    ``threads``: the pool the measured step had (a script's own torch.set_num_threads), timed at
    that count (an audit: the doctor's own count put a 1-thread script's MFU against a 2-thread
    peak)."""
    if threads is None or threads == torch.get_num_threads():
        return _peak_at(dtype, torch.get_num_threads())
    before = torch.get_num_threads()
    torch.set_num_threads(max(threads, 1))
    try:
        return _peak_at(dtype, torch.get_num_threads())
    finally:
        torch.set_num_threads(before)


@functools.lru_cache(maxsize=8)  # once per dtype, thread count and process: the ceiling
def _peak_at(dtype: torch.dtype, threads: int) -> float:
    """:func:`cpu_peak_flops` at ``threads`` (the pool's size now: the cache's key)."""
    cached = 0.0
    d = read_json(cpu_speed.cache_file())  # None when missing or corrupt
    try:
        if isinstance(d, dict) and d.get("threads") == torch.get_num_threads() \
                and d.get("torch") == torch.__version__:
            name = "bf16" if dtype == torch.bfloat16 else "fp32"
            cached = max(r for _, r in d["gemm_rate_curve"][name])
    except (ValueError, KeyError, TypeError):
        pass
    best_rate = 0.0
    for n in (1024, 2048):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        t0 = time.perf_counter()
        torch.mm(a, b)
        # a slow call (this CPU's bf16: 2.4 s at 1024³, ~20 s at 2048³) is timed twice and ends
        # the sizes: past cpu_speed.GEMM_CALL_CAP_S the rate has stopped rising
        slow = time.perf_counter() - t0 > cpu_speed.GEMM_CALL_CAP_S
        for _ in range(2 if slow else 5):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best_rate = max(best_rate, 2.0 * n**3 / (time.perf_counter() - t0))
        if slow:
            break
    return max(cached, best_rate)


def cpu_bf16_fast() -> bool:
    """Whether this CPU multiplies bf16 natively (oneDNN's bf16 path: AVX-512 BW/VL/DQ, AMX, or
    Arm bf16), PyTorch's own check. Without it bf16 GEMMs are emulated: this machine's kind (AVX2)
    measured ~1 GFLOP/s for bf16 against ~100 for fp32 (speed/cpu.py)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: nothing native either
        return False


def bounded_mfu(achieved_flops_s: float, peak_flops_s: float | None) -> float | None:
    """Model FLOPs utilisation, or None when it cannot be stated: no peak, or the step achieved
    more than the peak — then the peak is what is wrong (a ceiling measured too low), and an MFU
    above 100 % would be a bug printed as a measurement."""
    if not peak_flops_s or achieved_flops_s <= 0:
        return None
    mfu = achieved_flops_s / peak_flops_s
    return mfu if mfu <= 1.0 else None


def gpu_peak_flops(dtype: str) -> float | None:
    try:
        gpu = find_gpu_by_device_name(torch.cuda.get_device_name(),
                                      torch.cuda.get_device_properties(0).total_memory)
        return gpu.peak_flops(dtype) if gpu is not None else None
    except Exception:  # an unknown card: MFU is then unknown, never guessed
        return None
