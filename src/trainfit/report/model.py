"""Dataclasses of the report as computed (build.py); its inputs as read are inputs.py's.

Names carry the unit and whether a number is predicted or measured; ``None`` is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainfit.report.inputs import (
    EvalPoint,
    Finding,
    LadderStep,
    OomEvent,
    Probe,
    SegmentRow,
)

GIB = 2**30
"""GiB = 2^30 bytes (what CUDA and nvidia-smi call GB/MiB-based sizes), not 10^9."""


# --- the report -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryBar:
    """One predicted configuration: its device peak split into stacked components (GiB)."""

    micro_batch: int
    grad_accum: int
    components_gib: dict[str, float]
    predicted_device_gib: float | None
    fits: bool | None
    pick: bool


@dataclass(frozen=True)
class Point:
    """One point on a chart: GiB for memory, tokens/s for throughput."""

    micro_batch: int
    value: float
    label: str
    status: str = "ok"


@dataclass
class Family:
    """Configurations that differ only in micro-batch and accumulation (one chart panel)."""

    key: tuple[Any, ...]
    label: str
    bars: list[MemoryBar] = field(default_factory=list)
    memory_predicted_gib: list[Point] = field(default_factory=list)
    memory_measured_gib: list[Point] = field(default_factory=list)
    tokens_per_s_predicted: list[Point] = field(default_factory=list)
    tokens_per_s_measured: list[Point] = field(default_factory=list)


@dataclass(frozen=True)
class SeedRow:
    """One row of the seed-002-style table."""

    setting: str
    micro_batch: int
    grad_accum: int
    device_predicted_gib: float | None
    device_measured_gib: float | None
    host_ram_measured_gib: float | None
    tokens_per_s_predicted: float | None
    tokens_per_s_measured: float | None
    speed_up_predicted: float | None
    speed_up_measured: float | None
    epoch_predicted_s: float | None
    epoch_measured_s: float | None
    fits_predicted: bool | None
    status_measured: str | None
    pick: str
    """``""``, ``plan`` (predicted pick), ``tune`` (measured pick) or ``plan + tune``."""
    undecided: bool = False
    """A change to tune's pick its search could not decide (not a measured gain)."""
    reserved_predicted_gib: float | None = None
    """The plan's predicted reserved peak: shown where its device peak is unknown (no GPU
    named), so the page keeps a predicted memory figure (an audit: it had none)."""


@dataclass(frozen=True)
class SeedTable:
    rows: list[SeedRow]
    reference: str
    """What the speed-up is relative to."""
    dataset_tokens: int | None
    dataset_tokens_source: str
    no_gpu: bool = False
    """The plan named no GPU: its predicted device peak is the reserve, without the CUDA
    context it cannot know (plan's own words)."""


@dataclass(frozen=True)
class Pick:
    source: str
    """``plan`` (predicted) or ``tune`` (measured)."""
    setting: str
    micro_batch: int
    grad_accum: int
    why: list[str]
    device_predicted_gib: float | None
    device_measured_gib: float | None
    tokens_per_s_predicted: float | None
    tokens_per_s_measured: float | None
    reserved_predicted_gib: float | None = None
    """As :attr:`SeedRow.reserved_predicted_gib`."""


@dataclass
class Section:
    """One model on one GPU: a plan and/or a tune of it."""

    slug: str
    title: str
    sources: list[str]
    capacity_gib: float | None
    capacity_source: str
    margin: float | None
    families: list[Family]
    table: SeedTable
    picks: list[Pick]
    ladder: list[LadderStep]
    probes: list[Probe]
    notes: list[str]
    throughput_unknown_reason: str | None = None
    capacity_label: str = "GPU memory"
    """What the capacity is: a GPU's memory, or (tune on a CPU) the memory limit standing in
    for one."""
    on_cpu: bool = False
    """Measured on a CPU (tune without a plan): its peaks are live tensor bytes, not a GPU's."""
    probes_on_cpu: bool = False
    """tune's probes ran on a CPU (with or without a plan): their peaks are live tensor bytes."""


@dataclass(frozen=True)
class TrainSummary:
    path: str
    setting: str
    micro_batch: int | None
    grad_accum: int | None
    steps: int | None
    samples_seen: int | None
    tokens_seen: int | None
    wall_time_s: float | None
    tokens_per_s_measured: float | None
    final_loss: float | None
    oom_events: list[OomEvent]
    checkpoints: list[str]
    resumed_from: str | None
    ran_at: list[str] = field(default_factory=list)
    """The micro-batch × accumulation the run moved to, in order, when it left the job's own
    (an OOM split, a resume at another micro-batch); empty when it ran at the job's."""
    ended: str = "unknown"
    """How the run ended, in words (an interrupted run reads as one: a QA run's report showed
    it like a finished run)."""
    ranks: int = 1
    """Processes that trained the run (the job's ``ranks``): the micro-batch is each one's, the
    tokens all of theirs (report said neither: an audit)."""
    segments: int = 1
    losses: list[float | None] = field(default_factory=list)
    evals: list[EvalPoint] = field(default_factory=list)
    segment_rows: list[SegmentRow] = field(default_factory=list)
    slug: str = "train"
    """The loss figure's name."""
    unrecorded_steps: int = 0
    """Steps whose loss and wall time the record does not hold (TrainInput's)."""


@dataclass(frozen=True)
class TimelineSeries:
    label: str
    time_s: list[float]
    values: list[float]
    """NaN where a reading is missing and at each gap, so lines break instead of interpolating."""


@dataclass(frozen=True)
class TimelinePanel:
    title: str
    unit: str
    series: list[TimelineSeries]
    limit: float | None = None
    limit_label: str = ""


@dataclass(frozen=True)
class Timeline:
    slug: str
    path: str
    samples: int
    duration_s: float
    median_interval_s: float | None
    gaps_s: list[tuple[float, float]]
    panels: list[TimelinePanel]


@dataclass(frozen=True)
class DoctorRow:
    metric: str
    unit: str
    before: float | None
    after: float | None
    change_fraction: float | None


@dataclass(frozen=True)
class DoctorSection:
    slug: str
    path: str
    target: str
    steps_measured: int | None
    split_s: list[tuple[str, float | None]]
    step_time_s: float | None
    findings: list[Finding]
    rows: list[DoctorRow]
    applied: list[str]
    overhead_fraction: float | None
    verdict: str | None = None
    """Doctor's verdict on the applied fixes from its interleaved rounds: faster | slower |
    not_faster | undecided; None: nothing applied (or a file from before it was written)."""
    device: str | None = None
    """Where doctor measured (cpu | cuda…); None in a file from before it was written."""
    verdict_ratios: list[float] = field(default_factory=list)
    """tokens/s after ÷ before in each interleaved round (measured)."""
    verdict_noise: float | None = None
    """The noise the run measured, as a fraction."""
    parts_scale: float | None = None
    """Doctor's factor (< 1) on each part when the parts' medians summed past the median step;
    None: 1, or a file from before it was written."""
    notes: list[str] = field(default_factory=list)
    """Doctor's own notes, as it printed them (report dropped them: an audit)."""
    round_bottlenecks: list[str] = field(default_factory=list)
    """The bottleneck each 'before' round named alone (two or more: whether the verdict held)."""
    form: str = "job"
    """``job`` or ``command``: a command's rounds are the halves of its one measured window."""
    command_runs: int | None = None
    """``doctor -- CMD``'s runs (2 on a busy host); None for a job or an older file."""


@dataclass
class Report:
    title: str
    sources: list[tuple[str, str]]
    sections: list[Section]
    trains: list[TrainSummary]
    timelines: list[Timeline]
    doctors: list[DoctorSection]
    warnings: list[str]
