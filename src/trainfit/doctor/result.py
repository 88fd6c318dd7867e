"""What a doctor run found: the split, the findings, the before/after metrics, and the numbers the
terminal shows beside them (± half the spread, after ÷ before) — computed here so that
:mod:`trainfit.render.doctor` only formats.

``DoctorResult.to_dict()`` is the ``kind: "doctor"`` JSON of docs/json-formats.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainfit.doctor.observation import Finding
from trainfit.doctor.split import Split
from trainfit.speed.compare import Comparison


@dataclass(kw_only=True)
class Metrics:
    """The before/after row (docs/json-formats.md): medians over the rounds, all measured."""

    step_time_s: float
    tokens_per_s: float | None
    data_wait_fraction: float | None
    gpu_util_percent: float | None
    step_time_spread_s: float = 0.0
    """max − min of the rounds' median step times (0 with one round)."""
    tokens_per_s_spread: float = 0.0
    rounds: int = 1

    def to_dict(self) -> dict[str, float | None]:
        return {"step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
                "data_wait_fraction": self.data_wait_fraction, "gpu_util_percent": self.gpu_util_percent}

    def half_spread(self, spread: float) -> float | None:
        """The ± beside a median: half the rounds' spread; None with one round or no spread (a
        single round has no spread worth stating)."""
        return spread / 2 if self.rounds > 1 and spread else None


def ratio(after: float | None, before: float | None) -> float | None:
    """after ÷ before; None where either is unknown or ``before`` is zero (no change to state)."""
    return after / before if after is not None and before else None


@dataclass(frozen=True)
class Compared:
    """One row of the before/after comparison, keyed by its :class:`Metrics` field."""

    key: str
    before: float | None
    before_pm: float | None
    """± half the before rounds' spread (None: not stated)."""
    after: float | None = None
    after_pm: float | None = None
    change: float | None = None
    """after ÷ before (None: not measured after, or no ratio)."""


@dataclass(kw_only=True)
class DoctorResult:
    target: str
    kind: str
    """job | command"""
    device: str
    steps_measured: int
    split: Split
    findings: list[Finding]
    before: Metrics
    after: Metrics | None = None
    after_findings: list[Finding] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    overhead_fraction: float | None = None
    notes: list[str] = field(default_factory=list)
    round_bottlenecks: list[str] = field(default_factory=list)
    """The bottleneck each 'before' round named on its own (two or more rounds: whether the verdict
    held across the repeats of this run); a command's halves of its measured window (of each
    run's window when it ran twice: :attr:`command_runs`)."""
    command_runs: int | None = None
    """``doctor -- CMD``: the runs whose measured windows the verdict rests on (2 when the host
    was busy and the second run measured: the verdict must repeat in another process; a second
    run that failed is in the notes); None for a job."""
    gain: Comparison | None = None
    """Whether the applied fixes made the step faster, decided from the interleaved rounds
    (``faster`` / ``not_faster`` / ``undecided``; None: nothing applied)."""

    @property
    def gain_words(self) -> str | None:
        """``faster`` | ``slower`` (not faster, and the median round slower beyond the noise) |
        ``not_faster`` | ``undecided``; None without a comparison."""
        g = self.gain
        if g is None:
            return None
        if g.verdict == "not_faster" and g.median is not None and g.median < 1 - g.noise:
            return "slower"
        return g.verdict

    @property
    def verdict_stable(self) -> bool | None:
        """True when every 'before' round named the same bottleneck; None with one round."""
        if len(self.round_bottlenecks) < 2:
            return None
        return len(set(self.round_bottlenecks)) == 1

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "doctor", "form": self.kind, "target": self.target, "device": self.device,
                "steps_measured": self.steps_measured,
                "split": self.split.to_dict(), "findings": [f.to_dict() for f in self.findings],
                "before": self.before.to_dict(),
                "after": self.after.to_dict() if self.after is not None else None,
                "applied": list(self.applied), "overhead_fraction": self.overhead_fraction,
                "round_bottlenecks": list(self.round_bottlenecks),
                "command_runs": self.command_runs,
                "verdict_stable": self.verdict_stable,
                "gain": None if self.gain is None else {
                    "verdict": self.gain_words, "ratios": list(self.gain.ratios),
                    "noise": self.gain.noise},
                # a spread over rounds needs two: one round's is unknown, not 0 (an audit)
                "before_spread": _spread(self.before),
                "after_spread": None if self.after is None else _spread(self.after),
                "after_findings": [f.to_dict() for f in self.after_findings],
                "notes": list(self.notes)}

    @property
    def after_bottleneck(self) -> Finding | None:
        """What limits the step once the fixes are in (the first finding is the bottleneck)."""
        return self.after_findings[0] if self.after_findings else None

    def compared(self) -> list[Compared]:
        """The before/after rows: step time and tokens/s with their ± (rounds' spread), the data
        wait, and the GPU utilisation where the sampler saw a GPU before."""
        b, a = self.before, self.after
        rows = [self._row("step_time_s", b.step_time_spread_s, a.step_time_spread_s if a else 0.0),
                self._row("tokens_per_s", b.tokens_per_s_spread, a.tokens_per_s_spread if a else 0.0),
                self._row("data_wait_fraction", 0.0, 0.0)]
        if b.gpu_util_percent is not None:
            rows.append(self._row("gpu_util_percent", 0.0, 0.0))
        return rows

    def _row(self, key: str, before_spread: float, after_spread: float) -> Compared:
        b = getattr(self.before, key)
        if self.after is None:
            return Compared(key, b, self.before.half_spread(before_spread))
        a = getattr(self.after, key)
        return Compared(key, b, self.before.half_spread(before_spread), a,
                        self.after.half_spread(after_spread), ratio(a, b))


def _spread(m: Metrics) -> dict[str, Any]:
    """The rounds' spread of a measurement (null under two rounds: nothing to spread)."""
    known = m.rounds >= 2
    return {"step_time_s": m.step_time_spread_s if known else None,
            "tokens_per_s": m.tokens_per_s_spread if known else None, "rounds": m.rounds}
