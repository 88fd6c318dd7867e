"""What one eager PyTorch op costs the CPU on the machine this runs on (with a GPU): the host side
of the speed model (``trainfit.speed.roofline.EAGER_OP_OVERHEAD_S`` / ``EAGER_VIEW_OVERHEAD_S``).

A step of a small model, or of a big one at a small micro-batch, is launch-bound: the GPU waits
for the CPU to enqueue the next kernel, and the step takes (ops × CPU cost per op). Each figure is
the median over ``ROUNDS`` rounds of ``N`` calls on tiny tensors (the GPU finishes each kernel in
~2-3 µs, so the CPU is the bottleneck), timed on the host clock:

* ``kernel_nograd``: an elementwise op that allocates its output, no autograd;
* ``view``: a metadata op (``transpose``), no kernel;
* ``kernel_autograd``: the same elementwise op recording autograd history (a forward op);
* ``backward_per_node``: ``backward()`` through a chain of ``N`` such ops, per node (the C++
  autograd engine launches each backward kernel, no Python);
* ``linear_module``: an ``nn.Linear`` call (Python module dispatch + addmm), no autograd;
* ``reference_op_cpu``: trainfit's reference op on CPU tensors (``speed/host_timing.py``), and a
  view op timed beside it;
* ``fused_adamw_param``: ``torch.optim.AdamW(fused=True)`` over ``N`` tiny parameters, per
  parameter; ``foreach_adamw_param``: the same with ``foreach=True``.

Also the CPU's model name and clock (``/proc/cpuinfo``). ``--device cpu`` is a dry run.
``python benchmarks/gpu_launch_overhead.py --out DIR [--name N]`` → DIR/gpu_launch[_N].json.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

N = 2000
ROUNDS = 7


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def per_call(dev: torch.device, fn: Callable[[], Any], n: int = N) -> dict[str, float]:
    """Seconds per call: the host's enqueue time (CPU cost) and the wall time to the last kernel's
    end (≥ the CPU cost when the GPU keeps up), medians over the rounds."""
    fn()
    _sync(dev)
    enq, wall = [], []
    for _ in range(ROUNDS):
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        _sync(dev)
        t2 = time.perf_counter()
        enq.append((t1 - t0) / n)
        wall.append((t2 - t0) / n)
    return {"host_s": statistics.median(enq), "wall_s": statistics.median(wall),
            "host_spread_s": max(enq) - min(enq)}


def backward_chain(dev: torch.device, n: int = N) -> dict[str, float]:
    x = torch.randn(64, device=dev, requires_grad=True)
    fwd, bwd = [], []
    for _ in range(ROUNDS):
        _sync(dev)
        t0 = time.perf_counter()
        y = x
        for _ in range(n):
            y = y * 1.0001
        _sync(dev)
        t1 = time.perf_counter()
        y.sum().backward()
        _sync(dev)
        t2 = time.perf_counter()
        x.grad = None
        fwd.append((t1 - t0) / n)
        bwd.append((t2 - t1) / n)
    return {"forward_s": statistics.median(fwd), "backward_s": statistics.median(bwd),
            "backward_spread_s": max(bwd) - min(bwd)}


def optimizer_per_param(dev: torch.device, impl: str, n: int = 500) -> dict[str, float]:
    params = [torch.nn.Parameter(torch.randn(64, device=dev)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn_like(p)
    kw = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    if impl == "fused" and dev.type == "cpu":
        kw = {"foreach": False}
    opt = torch.optim.AdamW(params, lr=1e-4, **kw)
    r = per_call(dev, opt.step, n=20)
    return {k: v / n for k, v in r.items()}


def reference_loop() -> dict[str, float]:
    """trainfit's reference op (``trainfit.speed.host_timing.reference_op_s``: CPU tensors, so
    this host's dispatcher and autograd alone) and a view op beside it, in ROUNDS × 20
    interleaved pairs (``host_busy.reference_over_view``): the training host's
    ``H100_HOST_REFERENCE_OP_S``, measured."""
    from host_busy import reference_over_view

    return reference_over_view(ROUNDS * 20)


def cpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key, val = key.strip(), val.strip()
        if key == "model name" and "model" not in info:
            info["model"] = val
        elif key == "cpu MHz" and "mhz" not in info:
            info["mhz"] = float(val)
    info["logical_cpus"] = text.count("processor\t:")
    return info


def measure(dev: torch.device) -> dict[str, Any]:
    x = torch.randn(64, device=dev)
    xg = torch.randn(64, device=dev, requires_grad=True)
    m = torch.randn(8, 8, device=dev)
    lin = torch.nn.Linear(64, 64, device=dev)
    rows: dict[str, Any] = {}
    rows["kernel_nograd"] = per_call(dev, lambda: torch.add(x, 1.0))
    rows["view"] = per_call(dev, lambda: m.transpose(0, 1))
    rows["kernel_autograd"] = per_call(dev, lambda: xg * 1.0001)
    with torch.no_grad():
        rows["linear_module"] = per_call(dev, lambda: lin(x))
    rows["backward_per_node"] = backward_chain(dev)
    rows["reference_op_cpu"] = reference_loop()
    rows["fused_adamw_param"] = optimizer_per_param(dev, "fused")
    rows["foreach_adamw_param"] = optimizer_per_param(dev, "foreach")
    return {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "cpu": cpu_info(), "torch": torch.__version__, "python": sys.version.split()[0],
            "date": datetime.date.today().isoformat(), "n": N, "rounds": ROUNDS, "rows": rows}


def main(argv: list[str]) -> int:
    cpu = "--device" in argv and argv[argv.index("--device") + 1] == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("gpu_launch_overhead: no CUDA device here; nothing measured, nothing written")
        return 1
    dev = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    doc = measure(dev)
    print(json.dumps(doc, indent=1))
    if not cpu and "--out" in argv:
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        # ``--name h200``: another host's costs, in gpu_launch_h200.json
        name = f"_{argv[argv.index('--name') + 1]}" if "--name" in argv else ""
        (out / f"gpu_launch{name}.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
