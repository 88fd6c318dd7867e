"""The step-time split: an exclusive phase clock shared by the in-process observer (trainfit jobs)
and the hooks injected into someone else's script.

Accounting is *exclusive*: phases nest (a ``.item()`` inside a forward, a DataLoader wait inside a
micro-step loop) and every interval of wall time is charged to exactly one phase — the innermost
one open — so the parts always add up to the step time. Time in no named phase is ``other``
(Python between the library calls: zero_grad, schedulers, the loop itself).

This module imports only the standard library: it runs inside foreign processes too.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

PHASES = ("data_wait", "h2d_copy", "forward", "backward", "optimizer", "sync", "logging_io")
"""Measured phases; ``other`` is the rest of the step, ``idle`` comes from a device profile."""
SPLIT_KEYS = ("data_wait_s", "h2d_copy_s", "forward_s", "backward_s", "optimizer_s", "sync_s",
              "logging_io_s", "idle_s", "other_s", "step_time_s")
"""The ``split`` object of ``trainfit doctor --json`` (docs/json-formats.md), in that order."""
OTHER = "other"


class PhaseClock:
    """Charges wall time to the innermost open phase; ``end_step`` closes one optimizer step.

    ``active`` is False outside the measured window: then every hook returns at once (the cost of
    instrumentation is paid only on measured steps, and counted there — see ``calls``).
    """

    __slots__ = ("_acc", "_stack", "_step_t0", "_sync_samples", "_t", "active", "calls", "counters",
                 "sync_n")

    SYNC_TIME_FIRST = 8
    SYNC_TIME_EVERY = 64
    """Sync points are counted every time but timed only the first 8 of a step and then 1 in 64;
    the rest are charged the timed ones' mean (a loop calling .item() per token makes thousands of
    calls per step, and timing each would cost more than the doctor's 3 % budget)."""
    OWN_PHASES = frozenset({"forward", "backward", "optimizer"})
    """Sync points inside these are the model's or the optimizer's, not the training loop's."""

    def __init__(self) -> None:
        self.active = False
        self._stack: list[str] = [OTHER]
        self._t = time.perf_counter()
        self._step_t0 = self._t
        self._acc: dict[str, float] = dict.fromkeys((*PHASES, OTHER), 0.0)
        self.calls = 0
        """Hook invocations in this step (× the calibrated cost per call = the doctor's overhead)."""
        self.counters: dict[str, float] = {}
        self.sync_n = 0
        """Sync points seen in this step (each one counted; see SYNC_TIME_EVERY for the timing)."""
        self._sync_samples: list[tuple[str, int]] = []

    def start(self) -> None:
        """Open the measured window at a step boundary (the stack is at its base there)."""
        self.active = True
        self._stack = [OTHER]
        self._reset(time.perf_counter())

    def _reset(self, now: float) -> None:
        self._t = now
        self._step_t0 = now
        for k in self._acc:
            self._acc[k] = 0.0
        self.calls = 0
        self.counters = {}
        self.sync_n = 0
        self._sync_samples = []

    # push, pop, set_base and end_step each charge the time since the last event to the open
    # phase with the same two lines, written out in each: they run on every hook call of a
    # measured step, where a shared method call would add to the overhead being measured
    def push(self, phase: str) -> None:
        now = time.perf_counter()
        self._acc[self._stack[-1]] += now - self._t
        self._t = now
        self._stack.append(phase)
        self.calls += 1

    def pop(self) -> None:
        now = time.perf_counter()
        self._acc[self._stack[-1]] += now - self._t
        self._t = now
        if len(self._stack) > 1:
            self._stack.pop()

    def set_base(self, phase: str) -> None:
        """The loop's own phase (train_step's observer calls): replaces the bottom of the stack."""
        now = time.perf_counter()
        self._acc[self._stack[-1]] += now - self._t
        self._t = now
        self._stack[0] = phase
        self.calls += 1

    @property
    def phase(self) -> str:
        return self._stack[-1]

    @property
    def base(self) -> str:
        return self._stack[0]

    def sync_timed(self, n: int) -> None:
        """Open a timed sync point (the caller pops): the ``n``-th of this step, which stands for
        itself and the untimed ones since the previous timed one."""
        self._sync_samples.append((self._stack[-1], 1 if n <= self.SYNC_TIME_FIRST else self.SYNC_TIME_EVERY))
        self.push("sync")

    def _settle_syncs(self) -> None:
        """Charge the untimed sync points the timed ones' mean, taken from the phase the timed one
        standing for them ran in (so the parts still add up to the step)."""
        samples = self._sync_samples
        total = self.sync_n
        weight = sum(w for _, w in samples) or 1
        scale = total / weight  # the tail after the last timed call, spread evenly
        mean = self._acc["sync"] / len(samples) if samples else 0.0
        loop = inner = 0.0
        for ph, w in samples:
            n = w * scale
            if ph in self.OWN_PHASES:
                inner += n
            else:
                loop += n
            est = min((n - 1) * mean, self._acc.get(ph, 0.0))
            if est > 0:
                self._acc[ph] -= est
                self._acc["sync"] += est
        self.counters["sync_timed"] = float(len(samples))
        if loop:
            self.counters["sync_calls"] = round(loop, 1)
        if inner:
            self.counters["model_sync_calls"] = round(inner, 1)

    def count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def end_step(self) -> StepRecord:
        """Close the step at this instant and start the next one."""
        now = time.perf_counter()
        self._acc[self._stack[-1]] += now - self._t
        if self.sync_n:
            self._settle_syncs()
        rec = StepRecord(phases_s={k: v for k, v in self._acc.items()},
                         step_time_s=now - self._step_t0, hook_calls=self.calls,
                         counters=dict(self.counters))
        self._stack = [OTHER]
        self._reset(now)
        return rec


@dataclass
class StepRecord:
    """One measured optimizer step."""

    phases_s: dict[str, float]
    """Seconds per phase (exclusive; they add up to ``step_time_s``), ``other`` included."""
    step_time_s: float
    hook_calls: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    """``tokens`` (non-padding input tokens), ``micro_steps``, ``sync_calls``, ``recompute_s`` …"""

    def to_dict(self) -> dict[str, Any]:
        return {"phases_s": self.phases_s, "step_time_s": self.step_time_s,
                "hook_calls": self.hook_calls, "counters": self.counters}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        return cls(phases_s={k: float(v) for k, v in d["phases_s"].items()},
                   step_time_s=float(d["step_time_s"]), hook_calls=int(d.get("hook_calls", 0)),
                   counters={k: float(v) for k, v in d.get("counters", {}).items()})


@dataclass(kw_only=True)
class Split:
    """Median seconds per step of each part (measured). The medians of the parts need not add up
    exactly to the median step; ``other_s`` is taken as step − Σ(named parts) so the table adds up."""

    data_wait_s: float
    h2d_copy_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    sync_s: float
    logging_io_s: float
    idle_s: float | None
    """Device idle between kernels inside the step (CUDA profile); None on a CPU, which has no
    queue to run dry: its unattributed host time is ``other_s``."""
    other_s: float
    step_time_s: float
    step_time_spread_s: float
    """max − min over the measured steps (CPU timing moves by up to ~35 % between repeats)."""
    parts_scale: float = 1.0
    """1, or the factor (< 1) each part's median was scaled by because the medians, each taken
    alone, summed past the median step (a noisy host); said beside the split (an audit: it was
    silent)."""

    def to_dict(self) -> dict[str, float | None]:
        # the steps' spread too (an audit: the JSON had the median step and no ±)
        return {**{k: getattr(self, k) for k in SPLIT_KEYS}, "parts_scale": self.parts_scale,
                "step_time_spread_s": self.step_time_spread_s}

    def fraction(self, key: str) -> float:
        v = getattr(self, key)
        return (v or 0.0) / self.step_time_s if self.step_time_s > 0 else 0.0


def median_split(records: Iterable[StepRecord], idle_s: float | None = None) -> Split:
    recs = list(records)
    if not recs:
        raise ValueError("no measured steps")

    def med(phase: str) -> float:
        return statistics.median(r.phases_s.get(phase, 0.0) for r in recs)

    times = [r.step_time_s for r in recs]
    step = statistics.median(times)
    parts = {p: med(p) for p in PHASES}
    named = sum(parts.values()) + (idle_s or 0.0)
    k = 1.0
    if named > step > 0:
        # each part's median is taken alone, so on a noisy host they can sum past the median
        # step (a QA run: 108 % of it): the parts are then scaled to it, in their medians'
        # proportions, so the split is one step's and its shares sum to 100 %
        k = step / named
        parts = {p: v * k for p, v in parts.items()}
        idle_s = None if idle_s is None else idle_s * k
        named = step
    return Split(data_wait_s=parts["data_wait"], h2d_copy_s=parts["h2d_copy"],
                 forward_s=parts["forward"], backward_s=parts["backward"],
                 optimizer_s=parts["optimizer"], sync_s=parts["sync"],
                 logging_io_s=parts["logging_io"], idle_s=idle_s,
                 other_s=max(step - named, 0.0), step_time_s=step,
                 step_time_spread_s=max(times) - min(times), parts_scale=k)


def median_counter(records: Iterable[StepRecord], key: str) -> float:
    """The median per step of one counter (0 where a step did not count it, or no steps)."""
    vals = [r.counters.get(key, 0.0) for r in records]
    return statistics.median(vals) if vals else 0.0


def median_hook_calls(records: Iterable[StepRecord]) -> float:
    """The median hook calls per step (× the calibrated cost of one = the doctor's own overhead)."""
    vals = [float(r.hook_calls) for r in records]
    return statistics.median(vals) if vals else 0.0


def median_or_none(xs: list[float]) -> float | None:
    """The median, or None for no values: a part that was not measured is unknown, never 0."""
    return statistics.median(xs) if xs else None


def input_fraction(split: Split) -> float:
    """(median data wait + median host→device copy) / median step: the step's share spent on its
    input, as the split table states it and the input-bound rule reads it. Both the in-process
    rounds and a foreign run read it this way; the before/after rows used the median of each
    step's share, and one report said 0.7 % and 2.2 % of the same steps (an audit)."""
    return (split.data_wait_s + split.h2d_copy_s) / split.step_time_s if split.step_time_s > 0 \
        else 0.0


def device_idle_s(profile: dict[str, Any] | None, records: list[StepRecord]) -> float | None:
    """CUDA: the measured median step minus the device's busy time in the profiled step; None
    without a device profile (a CPU has no kernel queue to run dry)."""
    if not profile or profile.get("device_busy_s") is None or not records:
        return None
    step = statistics.median(r.step_time_s for r in records)
    return max(step - float(profile["device_busy_s"]), 0.0)


def calibrate_hook_cost_s(n: int = 2000) -> float:
    """Seconds one hook invocation costs (a push/pop pair on a live clock, as the hooks do), so
    the doctor's overhead on a step = its hook calls × this. Timed here rather than by running the
    job twice, because two runs of the same CPU job differ by more than the overhead itself."""
    clock = PhaseClock()
    clock.start()
    per_call = []
    for _ in range(5):  # the median over repeats, as for every CPU timing here
        t0 = time.perf_counter()
        for _ in range(n):
            if clock.active:
                clock.push("sync")
                clock.pop()
        per_call.append((time.perf_counter() - t0) / n)
    return statistics.median(per_call)


# The wrappers that charge a call to a phase of the clock: the hooks injected into a script
# (doctor/hooks.py) wrap library calls with them.

def synced(clock: PhaseClock, fn: Any, cond: Any = None) -> Any:
    """A sync point: counted always, timed as PhaseClock.SYNC_TIME_EVERY says (the untimed path is
    a counter increment: loops call .item() per token, thousands of times a step)."""
    first, mask = PhaseClock.SYNC_TIME_FIRST, PhaseClock.SYNC_TIME_EVERY - 1
    assert PhaseClock.SYNC_TIME_EVERY & mask == 0, "a power of two: the test is a bit mask"
    if cond is None:  # .item(), .tolist(), float(t): no arguments, the leanest wrapper
        @functools.wraps(fn)
        def bare(self: Any) -> Any:
            if clock.active:
                n = clock.sync_n = clock.sync_n + 1
                if n <= first or not n & mask:
                    return _timed_sync(clock, n, fn, self)
            return fn(self)
        return bare

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        if clock.active and cond(a):
            n = clock.sync_n = clock.sync_n + 1
            if n <= first or not n & mask:
                return _timed_sync(clock, n, fn, *a, **k)
        return fn(*a, **k)
    return wrapper


def _timed_sync(clock: PhaseClock, n: int, fn: Any, *a: Any, **k: Any) -> Any:
    """The ``n``-th sync point of the step, one that is timed (both of synced's wrappers)."""
    clock.sync_timed(n)
    try:
        return fn(*a, **k)
    finally:
        clock.pop()


def timed(clock: PhaseClock, phase: str, fn: Any, counter: str | None = None) -> Any:
    """``fn`` charged to ``phase`` while the clock runs: every hook that times a call is this one
    (print, torch.save, clipping, backward, the data wait, host→device copies)."""
    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        if not clock.active:
            return fn(*a, **k)
        if counter:
            clock.count(counter)
        clock.push(phase)
        try:
            return fn(*a, **k)
        finally:
            clock.pop()
    return wrapper
