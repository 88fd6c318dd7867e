"""This CPU's time for the heavy kernels of a step, measured at the step's own shapes and layouts.

On a GPU, tile/wave quantization and a catalogued peak predict a GEMM well. A CPU's BLAS has no such
simple model: at equal FLOPs, the grad-weight GEMM ``mm(dyᵀ, x)`` (transposed operand, long K, small
output) ran 1.3-2× slower than the square curve of :mod:`trainfit.speed.cpu`, and the CPU flash-
attention kernels reached ~45 % of the GEMM rate, not 100 % (measured with torch.profiler on
llama-h256-l4: the curve alone under-predicted the step by 25 %). So each distinct heavy op of the
simulated step (its name, shapes, strides, dtypes and scalar arguments, as recorded from the data-
less run) is replayed once on random tensors and timed; results are cached in ``cpu_kernels.json``
of the cache directory (trainfit.cache: ``~/.cache/trainfit``) keyed by CPU model, torch version and
thread count. This is the CPU's "matmul FLOP/s measured once", made exact for the shapes that occur."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from trainfit.cache import cache_path, read_json, write_json

NOT_REPLAYED = frozenset({"_local_scalar_dense", "item", "nonzero", "_to_copy", "copy_"})
"""Kernels timed by the roofline instead: host syncs, data-dependent output sizes, and copies
whose cost is a device transfer on the target."""
CACHE_VERSION = 1
REPS = 9
WARMUP = 3
"""Calls before timing: the first calls pay thread-pool wake-up and weight packing (measured:
the first of 5 timed calls of a 3 ms GEMM took 4.3 ms)."""
SLOW_CALL_S = 0.1
"""An op whose first call takes longer than this is warmed up once and timed 3 times: its first-
call costs are a small part of it, and 12 calls of a 1 s op (a bf16 GEMM on a CPU without native
bf16 runs at ~1 GFLOP/s) would cost more than the step they predict."""


def _cache_path() -> Path:
    return cache_path("cpu_kernels.json")


def _arg_key(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return ("T", tuple(a.shape), tuple(a.stride()), str(a.dtype).removeprefix("torch."))
    if isinstance(a, (torch.dtype, torch.layout, torch.memory_format)):
        return ("D", str(a).removeprefix("torch."))
    if isinstance(a, torch.device):
        return ("V",)
    if isinstance(a, (list, tuple)):
        return ("L", tuple(_arg_key(x) for x in a))
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    return ("?", repr(a))


def replay_key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """What a replay needs: the op and its arguments' metadata (no data)."""
    if name.partition(".")[0] in NOT_REPLAYED:
        return None
    return (name, tuple(_arg_key(a) for a in args),
            tuple(sorted((k, _arg_key(v)) for k, v in kwargs.items())))


def _materialize(k: Any, gen: torch.Generator) -> Any:
    if isinstance(k, tuple) and k and k[0] == "T":
        _, shape, stride, dtype = k
        dt = getattr(torch, dtype)
        t = torch.empty_strided(shape, stride, dtype=dt)
        if dt.is_floating_point:
            t.normal_(generator=gen)
        else:
            t.zero_()
        return t
    if isinstance(k, tuple) and k and k[0] == "D":
        return getattr(torch, k[1])
    if isinstance(k, tuple) and k and k[0] == "V":
        return torch.device("cpu")
    if isinstance(k, tuple) and k and k[0] == "L":
        return [_materialize(x, gen) for x in k[1]]
    if isinstance(k, tuple) and k and k[0] == "?":
        raise ValueError(f"cannot replay argument {k[1]}")
    return k


def time_replay(key: tuple[Any, ...], reps: int = REPS) -> float:
    """Median seconds of one call of the op on random tensors of the recorded layout."""
    name, arg_keys, kw_keys = key  # name: "packet.overload"
    gen = torch.Generator().manual_seed(0)
    args = [_materialize(k, gen) for k in arg_keys]
    kwargs = {k: _materialize(v, gen) for k, v in kw_keys}
    packet_name, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet_name), overload or "default")
    with torch.no_grad():
        t0 = time.perf_counter()
        op(*args, **kwargs)
        if time.perf_counter() - t0 > SLOW_CALL_S:
            warmup, reps = 1, min(reps, 3)
        else:
            warmup = WARMUP
        for _ in range(warmup - 1):  # first-call packing, page faults of the outputs
            op(*args, **kwargs)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            op(*args, **kwargs)
            times.append(time.perf_counter() - t0)
    # the median, not the minimum: the step it predicts runs under the same noise
    return sorted(times)[len(times) // 2]


def timed_under_load(key: tuple[Any, ...]) -> tuple[float, bool]:
    """(:func:`time_replay` of ``key``, whether other processes used more than
    ``BUSY_SHARE`` of this process's CPUs meanwhile)."""
    from trainfit.speed.host_timing import BUSY_SHARE, LoadMeter, allowed_cpus

    cpus = allowed_cpus()
    meter = LoadMeter(cpus)
    t = time_replay(key)
    return t, meter.cores() > BUSY_SHARE * len(cpus)


class KernelTimer:
    """Measured CPU seconds per replay key, cached on disk across processes.

    A timing taken while other processes used the CPUs (``others_cpu_s`` over the replay, as
    the host step measures its rounds: :mod:`trainfit.speed.host_timing`) is kept but marked busy,
    and timed once more by the next process that needs it, the lower time kept: a busy machine
    only adds, and a cache filled under load would otherwise keep every later CPU prediction
    pessimistic (a tune's budget refused on a probe predicted 5-17x too slow)."""

    def __init__(self, ident: dict[str, Any]) -> None:
        self.ident = {**ident, "version": CACHE_VERSION}
        self._times: dict[str, float] = {}
        self._busy: set[str] = set()
        self._retimed: set[str] = set()
        self._dirty = False
        self.used_busy = False
        """Whether a time this timer gave was measured on a busy machine (both times it was
        taken): a prediction made with it is a busy host's."""
        data = read_json(_cache_path())
        try:
            if isinstance(data, dict) and data.get("ident") == self.ident:
                self._times = {str(k): float(v) for k, v in data.get("times_s", {}).items()}
                self._busy = {str(k) for k in data.get("busy", [])} & set(self._times)
        except (ValueError, AttributeError, TypeError):
            self._times, self._busy = {}, set()

    def __call__(self, key: tuple[Any, ...]) -> float | None:
        skey = repr(key)
        t = self._times.get(skey)
        if t is None or (skey in self._busy and skey not in self._retimed):
            try:
                measured, busy = timed_under_load(key)
            except (RuntimeError, ValueError, TypeError, AttributeError):
                return t  # not replayable here: the caller falls back to the roofline
            self._retimed.add(skey)
            t = measured if t is None else min(t, measured)
            self._times[skey] = t
            # both measurements busy: the kept one is still a busy machine's; one quiet: the
            # kept time is at most a quiet one
            if busy:
                self._busy.add(skey)
            else:
                self._busy.discard(skey)
            self._dirty = True
        self.used_busy = self.used_busy or skey in self._busy
        return t

    def busy_keys(self) -> set[str]:
        """Keys whose kept time was measured on a busy machine."""
        return set(self._busy)

    def save(self) -> None:
        if not self._dirty:
            return
        if write_json(_cache_path(), {"ident": self.ident, "times_s": self._times,
                                      "busy": sorted(self._busy)}):
            self._dirty = False
