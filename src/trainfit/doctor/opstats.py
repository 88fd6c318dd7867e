"""What one profiled step did: how many ops it dispatched (kernel launches on a GPU), how much of
their time was matrix multiplication, and — on CUDA — how long the device was busy.

Runs on a step *after* the measured window (the profiler slows the step it watches), inside the
training process; imports only torch and the standard library (it runs in foreign scripts too).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

MATMUL_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_addmm_activation",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward",
    "aten::_flash_attention_backward", "aten::_efficient_attention_forward",
    "aten::_efficient_attention_backward", "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward", "aten::_cudnn_attention_forward",
    "aten::_cudnn_attention_backward", "aten::convolution",
    "aten::_convolution", "aten::mkldnn_convolution", "aten::cudnn_convolution",
    "aten::convolution_backward"})
"""Ops whose own time is dense matrix work (the work MFU counts)."""
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
"""A value pulled to the host: accounted as a sync point, not as a launch."""


def start_profile(cuda: bool) -> Any:
    # torch inside each function: hooks imports this module before the user's script has
    # imported torch (or in a process that never does)
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts, record_shapes=False, with_stack=False)
    with _quiet_stderr():
        prof.__enter__()
    return prof


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Kineto prints a line to fd 2 on every start and stop; keep it out of the user's terminal."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def stop_profile(prof: Any, cuda: bool) -> dict[str, float | None]:
    """Stop ``prof`` (after one step, synchronised on CUDA) and summarise it."""
    import torch  # lazy: see start_profile

    if cuda:
        torch.cuda.synchronize()
    with _quiet_stderr():
        prof.__exit__(None, None, None)
    return summarize(prof.events(), cuda)


def summarize(events: Any, cuda: bool) -> dict[str, float | None]:
    import torch  # lazy: see start_profile

    cpu_type = torch.autograd.DeviceType.CPU
    ops = 0
    op_s = 0.0
    matmul_s = 0.0
    kernels = 0
    spans: list[tuple[float, float]] = []
    for e in events:
        if e.device_type == cpu_type:
            if not e.name.startswith("aten::") or e.name in SYNC_OPS:
                continue
            t = e.self_cpu_time_total * 1e-6
            # a call from Python or from the autograd engine pays the full fixed cost of an op;
            # the ops a composite calls inside C++ (aten::linear → aten::t + aten::addmm) much less:
            # count the outermost aten calls only; time is counted exclusive of children
            parent = e.cpu_parent
            if parent is None or not parent.name.startswith("aten::"):
                ops += 1
            op_s += t
            if e.name in MATMUL_OPS:
                matmul_s += t
        elif cuda:
            kernels += 1
            spans.append((e.time_range.start * 1e-6, e.time_range.end * 1e-6))
    busy = None
    if cuda:
        busy = 0.0
        end = float("-inf")
        for a, b in sorted(spans):  # union of kernel intervals: overlapping streams count once
            if b <= end:
                continue
            busy += b - max(a, end)
            end = b
    return {"ops_per_step": float(ops), "op_time_s": op_s,
            "matmul_time_fraction": matmul_s / op_s if op_s > 0 else None,
            "kernels_per_step": float(kernels) if cuda else None, "device_busy_s": busy}
