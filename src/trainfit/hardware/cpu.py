"""This machine's CPU as a training device: measured once, cached.

GEMM throughput (fp32, bf16) at several sizes, memory bandwidth (a large copy), and the cost of
one eager op — the same quantities the GPU catalog gives for a GPU, but measured, because CPUs
vary too much to tabulate.  Cached in ``~/.cache/trainfit/cpu_speed.json`` keyed by CPU model,
torch version and thread count.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from trainfit.speed.roofline import DeviceSpeed

CACHE = Path(os.environ.get("TRAINFIT_CACHE", Path.home() / ".cache" / "trainfit")) / "cpu_speed.json"
GEMM_SIZES = ((64, 256, 256), (256, 256, 1024), (512, 1024, 1024), (1024, 1024, 1024),
              (2048, 1024, 2048))
"""(M, N, K) shapes measured: from launch-dominated to saturated."""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _best(fn: Any, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure() -> dict[str, Any]:
    curve: dict[str, list[tuple[float, float]]] = {}
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        pts = []
        for m, n, k in GEMM_SIZES:
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            t = _best(lambda a=a, b=b: torch.mm(a, b))
            pts.append((2.0 * m * n * k, 2.0 * m * n * k / t))
        curve[name] = pts
    x = torch.empty(64 * 2**20 // 4)
    t = _best(lambda: x.clone())
    bandwidth = 2 * x.numel() * 4 / t
    y = torch.ones(8, requires_grad=True)
    n_ops = 2000

    def many() -> None:
        z = y
        for _ in range(n_ops):
            z = z + 1.0
    op = _best(many, reps=3) / n_ops
    return {"cpu": _cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "gemm_rate_curve": curve, "bandwidth_bytes_s": bandwidth, "op_overhead_s": op,
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def cpu_speed(refresh: bool = False) -> DeviceSpeed:
    key = {"cpu": _cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    data = None
    if CACHE.is_file() and not refresh:
        try:
            cached = json.loads(CACHE.read_text())
            if all(cached.get(k) == v for k, v in key.items()):
                data = cached
        except (json.JSONDecodeError, OSError):
            data = None
    if data is None:
        data = measure()
        try:
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            CACHE.write_text(json.dumps(data, indent=1))
        except OSError:
            pass
    curve = {k: [tuple(p) for p in v] for k, v in data["gemm_rate_curve"].items()}
    peaks = {k: max(r for _, r in v) for k, v in curve.items()}
    peaks.setdefault("fp16", None)
    return DeviceSpeed(name="cpu", peak_flops=peaks, bandwidth_bytes_s=data["bandwidth_bytes_s"],
                       sm_count=None, asynchronous=False, op_overhead_s=data["op_overhead_s"],
                       view_overhead_s=data["op_overhead_s"] * 0.3, gemm_efficiency=1.0,
                       bandwidth_efficiency=1.0, gemm_rate_curve=curve,
                       source=f"measured on {data['cpu']} ({data['threads']} threads) "
                              f"at {data['measured_at']}")
