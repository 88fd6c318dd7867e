"""This machine's CPU as a training device: measured once, cached.

GEMM throughput (fp32, bf16) at several sizes, memory bandwidth (a large copy), and the cost of one
eager op — the same quantities the GPU catalog gives for a GPU, but measured, because CPUs vary too
much to tabulate. Cached in ``cpu_speed.json`` of the cache directory (trainfit.cache:
``~/.cache/trainfit``) keyed by CPU model, torch version and thread count."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import torch

from trainfit.cache import cache_path, read_json, write_json
from trainfit.speed.cpu_kernels import KernelTimer
from trainfit.speed.ops import KernelCounter
from trainfit.speed.roofline import DeviceSpeed


def cache_file() -> Path:
    """This CPU's measured speed, in the cache directory as it is now (trainfit.cache)."""
    return cache_path("cpu_speed.json")
GEMM_SIZES = ((64, 256, 256), (256, 256, 1024), (512, 1024, 1024), (1024, 1024, 1024),
              (2048, 1024, 2048))
"""(M, N, K) shapes measured: from launch-dominated to saturated."""
BANDWIDTH_SIZES = (256 * 2**10, 2 * 2**20, 16 * 2**20, 128 * 2**20)
"""Tensor sizes (bytes) for the bandwidth curve: L2, L3, beyond."""
GEMM_CALL_CAP_S = 0.25
"""A GEMM size whose one call takes longer than this ends the curve: larger sizes are not measured
and the curve extends flat from it (trainfit.speed.roofline._interp_rate). Such a call is far past
the launch-dominated range, where the rate has stopped rising. Why a cap: this CPU's bf16 GEMM runs
at ~1 GFLOP/s (no native bf16: measured 0.7-1.3 GFLOP/s at every size), and the full curve took
2 min of eight 11.7 s calls at 2048×1024×2048. Each user's first ``tune`` paid for that."""
MEASURE_BUDGET_S = 1.0
"""Seconds of timed calls per measured point, beyond its warm-up: the number of repeats is cut
(never below 3) so that a slow call is timed fewer times."""
CACHE_VERSION = 7
VIEW_OVERHEAD_FRACTION = 0.3
"""A view (no kernel) costs this fraction of a kernel's eager overhead (EAGER_VIEW_OVERHEAD_S /
EAGER_OP_OVERHEAD_S of trainfit.speed.roofline)."""


def cpu_model_name() -> str:
    """The CPU's marketing name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _median_time(fn: Any, reps: int = 7, budget_s: float | None = None) -> float:
    """Median time of ``reps`` runs after one warm-up: the median, not the minimum, because the
    training step it predicts runs under the same noise (docs/notes/cpu-timing-noise.md).
    ``budget_s``: fewer repeats (odd, at least 3) when the warm-up says ``reps`` would take longer."""
    t0 = time.perf_counter()
    fn()
    warm_s = time.perf_counter() - t0
    if budget_s is not None and warm_s * reps > budget_s:
        reps = max(3, int(budget_s / max(warm_s, 1e-9)) | 1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _eager_overhead_s() -> float:
    """Host seconds per eager kernel in a training step: forward + backward of a stack of tiny
    Linear/GELU modules (compute negligible), divided by its kernels (views count
    ``VIEW_OVERHEAD_FRACTION``).  It includes what a step pays per op beyond the dispatcher —
    module calls, autograd recording and the backward engine's per-node cost — which a bare
    ``z + 1`` loop misses (measured: 8 µs per op from such a loop; small-batch steps ran 25-31 %
    slower than predicted with it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(32)
                                  for m in (torch.nn.Linear(8, 8), torch.nn.GELU())])
    x = torch.randn(4, 8)

    def step() -> None:
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
    counter = KernelCounter()
    with counter:
        step()
    t = _median_time(step, reps=9)
    return t / (counter.kernels + VIEW_OVERHEAD_FRACTION * counter.views)


def measure() -> dict[str, Any]:
    curve: dict[str, list[tuple[float, float]]] = {}
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        pts = []
        for m, n, k in GEMM_SIZES:
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            t = _median_time(lambda a=a, b=b: torch.mm(a, b), budget_s=MEASURE_BUDGET_S)
            pts.append((2.0 * m * n * k, 2.0 * m * n * k / t))
            if t > GEMM_CALL_CAP_S:
                break  # saturated: the curve extends flat from here (GEMM_CALL_CAP_S)
        curve[name] = pts
    op = _eager_overhead_s()
    # bandwidth by working-set size: small tensors live in cache (an elementwise op reads and
    # writes: 2 × size bytes per clone)
    bw_curve = []
    for size in BANDWIDTH_SIZES:
        x = torch.empty(size // 4)
        reps = max(1, (64 * 2**20) // size)

        def copies(x: torch.Tensor = x, reps: int = reps) -> None:
            for _ in range(reps):
                x.mul(1.0)
        t = _median_time(copies, reps=3)
        per_op = max(t / reps - op, 1e-9)  # the eager cost is counted apart
        bw_curve.append((2.0 * size, 2.0 * size / per_op))
    bandwidth = bw_curve[-1][1]
    # compute-heavy elementwise classes (elements/s), in the working-set range of a step
    z = torch.empty(4 * 2**20)
    rates = {"rng": z.numel() / _median_time(lambda: z.bernoulli_(0.9)),
             "transcendental": z.numel() / _median_time(lambda: torch.exp(z)),
             "softmax": z.numel() / _median_time(lambda: torch.log_softmax(z.view(1024, -1), -1))}

    return {"cpu": cpu_model_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "version": CACHE_VERSION,
            "gemm_rate_curve": curve, "bandwidth_bytes_s": bandwidth,
            "bandwidth_curve": bw_curve, "op_overhead_s": op, "elementwise_rates": rates,
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def cpu_speed(refresh: bool = False) -> DeviceSpeed:
    key = {"cpu": cpu_model_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "version": CACHE_VERSION}
    data = None
    cached = None if refresh else read_json(cache_file())
    if isinstance(cached, dict) and all(cached.get(k) == v for k, v in key.items()):
        data = cached
    if data is None:
        data = measure()
        write_json(cache_file(), data)  # unwritable: measured again next time, never an error
    curve = {k: [tuple(p) for p in v] for k, v in data["gemm_rate_curve"].items()}
    peaks = {k: max(r for _, r in v) for k, v in curve.items()}
    peaks.setdefault("fp16", None)
    return DeviceSpeed(name="cpu", peak_flops=peaks, bandwidth_bytes_s=data["bandwidth_bytes_s"],
                       sm_count=None, asynchronous=False, op_overhead_s=data["op_overhead_s"],
                       view_overhead_s=data["op_overhead_s"] * VIEW_OVERHEAD_FRACTION, gemm_efficiency=1.0,
                       bandwidth_efficiency=1.0, gemm_rate_curve=curve,
                       bandwidth_curve=[tuple(p) for p in data["bandwidth_curve"]],
                       elementwise_rates=data["elementwise_rates"],
                       kernel_timer=KernelTimer(key),
                       source=f"measured on {data['cpu']} ({data['threads']} threads) "
                              f"at {data['measured_at']}")
