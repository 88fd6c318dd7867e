"""A run's progress: step / total, tokens/s, elapsed and the time left, from the steps recorded.

:class:`StepProgress` keeps the numbers (measured: wall time since the run's first step, so
evaluation and checkpoint time are in the estimate as they will be in the rest of the run);
:class:`ProgressLog` prints one line on stderr at the first step, then at most one every
``every_s`` seconds, and at the last — for a run whose output goes to a pipe or a log file,
where the live view is off. The live view shows :meth:`StepProgress.line` above its step line.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

LOG_EVERY_S = 10.0
"""Piped: the most one progress line per this many seconds (and the first and last step)."""


def duration_words(seconds: float) -> str:
    """``75`` → ``1 min 15 s``; ``4000`` → ``1 h 07 min``; under a second with its digits
    (``0.3`` → ``0.3 s``: a tiny dataset's epoch read "0 s", a review)."""
    if seconds < 0.5:
        return f"{seconds:.2g} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


@dataclass
class StepProgress:
    """Steps done in this run against the total, with the measured rate."""

    total_steps: int
    start_step: int = 0
    """The step the run started (or resumed) from."""
    step: int = 0
    loss: float | None = None
    tokens: int = 0
    """Tokens of the steps done in this run."""
    _t_first: float | None = field(default=None, repr=False)
    _t_last: float = field(default=0.0, repr=False)
    _first_step_s: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self.step = self.start_step

    def record(self, step: int, *, tokens: int, step_time_s: float, loss: float | None) -> None:
        now = time.monotonic()
        if self._t_first is None and step - 1 > self.start_step:
            self.start_step = step - 1  # a trainer that resumed: its first step says from where
        if self._t_first is None:
            # the rate is timed from the end of the first step: its start-up (compile, warm-up,
            # the first batch) is not what the remaining steps cost
            self._t_first, self._first_step_s = now, step_time_s
        else:
            self.tokens += tokens
        self._t_last = now
        self.step, self.loss = step, loss

    @property
    def done(self) -> int:
        """Steps completed in this run."""
        return self.step - self.start_step

    @property
    def elapsed_s(self) -> float:
        if self._t_first is None:
            return 0.0
        return self._t_last - self._t_first + self._first_step_s

    @property
    def seconds_per_step(self) -> float | None:
        """Wall time per step after the first (None before the second step)."""
        if self._t_first is None or self.done < 2:
            return None
        return (self._t_last - self._t_first) / (self.done - 1)

    @property
    def tokens_per_s(self) -> float | None:
        if self._t_first is None or self._t_last <= self._t_first:
            return None
        return self.tokens / (self._t_last - self._t_first)

    @property
    def eta_s(self) -> float | None:
        per = self.seconds_per_step
        return None if per is None else per * max(0, self.total_steps - self.step)

    def line(self) -> str:
        pct = 100 * self.step / self.total_steps if self.total_steps else 100.0
        parts = [f"step {self.step}/{self.total_steps} ({pct:.0f} %)"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        tps = self.tokens_per_s
        last = bool(self.total_steps) and self.step >= self.total_steps
        if tps is not None:
            # not "on average": the run's summary averages over its whole wall time, start-up
            # included (a QA run read 1,613 here and ~480 there); evaluations and saves between
            # steps are in it
            parts.append(f"{tps:,.0f} tokens/s since the first step")
        elif not last:  # a placeholder promises a later line; the last has none (an audit)
            parts.append("tokens/s after the first step")
        parts.append(f"elapsed {duration_words(self.elapsed_s)}")
        eta = self.eta_s
        if eta is not None:
            parts.append(f"ETA {duration_words(eta)}")
        elif not last:
            parts.append("ETA after the second step")
        return " · ".join(parts) + " (measured)"


class ProgressLog:
    """Prints :meth:`StepProgress.line` to ``stream`` at the first step, then at most every
    ``every_s`` seconds, and at the last step."""

    def __init__(self, progress: StepProgress, every_s: float = LOG_EVERY_S,
                 stream: TextIO | None = None) -> None:
        self.progress = progress
        self.every_s = every_s
        self.stream = stream if stream is not None else sys.stderr
        self._last: float | None = None
        self.lines = 0

    def step(self) -> None:
        """Call after each recorded step."""
        now = time.monotonic()
        p = self.progress
        due = self._last is None or now - self._last >= self.every_s \
            or p.step >= p.total_steps
        if due:
            print(p.line(), file=self.stream, flush=True)
            self._last = now
            self.lines += 1
