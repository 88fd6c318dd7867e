"""What a probe measured: plain dataclasses (no torch), read by the search and the renderers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(kw_only=True)
class Measured:
    peak_allocated_bytes: int | None
    """Measured peak of live tensor bytes (CUDA: max_memory_allocated; CPU: tracked live bytes)."""
    peak_reserved_bytes: int | None
    """CUDA max_memory_reserved; None on CPU (no caching allocator)."""
    peak_device_bytes: int | None
    """CUDA device memory in use at the end (all processes, cudaMemGetInfo); None on CPU."""
    host_rss_bytes: int
    """Peak resident memory of this process and its data-loader workers."""
    step_time_s: float | None
    """Median optimizer-step time over the timed steps (data wait included); None for a
    memory-only probe."""
    step_time_spread_s: float | None
    """max − min of the timed steps."""
    tokens_per_s: float | None
    """Positions computed per second (micro × seq_len × accumulation × ranks / step time); a
    script's tune (``step_source`` "script"): its batches' non-padding tokens per second."""
    samples_per_s: float | None
    data_wait_fraction: float | None
    """Share of the step spent waiting for the next batch."""
    compile_time_s: float | None = None
    """torch.compile: first compiled step minus a steady step (None: not compiled)."""
    alloc_retries: int | None = None
    """CUDA: times the caching allocator hit the card during the probe, released its cache and
    retried (``num_alloc_retries``: each release synchronizes the GPU); None on CPU."""
    step_times_s: list[float] = field(default_factory=list)


@dataclass(kw_only=True)
class ProbeResult:
    status: str
    """ok | oom | over-host-ram"""
    measured: Measured | None
    oom_phase: str | None = None
    detail: str = ""
    probe_time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.measured is not None:
            d["measured"].pop("step_times_s", None)
        return d


@dataclass(frozen=True)
class SearchNote:
    """Something the search did not do, or did by rule, with the numbers that decided it. ``kind``
    names the rule (``pruned``, ``workers_not_probed``, ``excluded_micro`` …; the renderer's
    ``note_words`` has one sentence per kind); ``data`` holds its numbers and fields."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)
