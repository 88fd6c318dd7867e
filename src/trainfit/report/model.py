"""Dataclasses of the report: the inputs as read (load.py) and the report as computed (build.py).

Names carry the unit and whether a number is predicted or measured; ``None`` is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 2**30
"""GiB = 2^30 bytes (what CUDA and nvidia-smi call GB/MiB-based sizes), not 10^9."""


# --- inputs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanConfig:
    index: int
    job: dict[str, Any]
    micro_batch: int
    grad_accum: int
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    peak_device_bytes: int | None
    breakdown: dict[str, int]
    fits: bool | None
    step_time_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    rank: int | None
    recommended: bool
    how: str | None
    speed_unknown_reason: str | None = None
    """Why the plan has no tokens/s for this row (plan --json's; None: not given or known)."""


@dataclass(frozen=True)
class LadderStep:
    change: str
    peak_device_bytes: int | None
    tokens_per_s: float | None
    fits: bool | None
    alters_learning: bool | None


@dataclass(frozen=True)
class PlanInput:
    """All numbers predicted."""

    path: str
    model: str
    gpu: str | None
    gpu_memory_bytes: int | None
    margin: float | None
    recommended_index: int | None
    reason: str | None
    notes: list[str]
    configs: list[PlanConfig]
    ladder: list[LadderStep]


@dataclass(frozen=True)
class Measured:
    peak_allocated_bytes: float | None = None
    peak_reserved_bytes: float | None = None
    peak_device_bytes: float | None = None
    host_rss_bytes: float | None = None
    step_time_s: float | None = None
    step_time_spread_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    data_wait_fraction: float | None = None


@dataclass(frozen=True)
class Predicted:
    peak_allocated_bytes: float | None = None
    peak_reserved_bytes: float | None = None
    peak_device_bytes: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None


@dataclass(frozen=True)
class Probe:
    index: int
    stage: str | None
    job: dict[str, Any]
    micro_batch: int
    grad_accum: int
    num_workers: int | None
    compile: bool | None
    status: str
    measured: Measured | None
    predicted: Predicted | None
    probe_time_s: float | None
    pin_memory: bool | None = None


@dataclass(frozen=True)
class TunePick:
    job: dict[str, Any]
    micro_batch: int
    grad_accum: int
    num_workers: int | None
    pin_memory: bool | None
    compile: bool | None
    measured: Measured | None
    predicted: Predicted | None


@dataclass(frozen=True)
class TuneBaseline:
    micro_batch: int
    grad_accum: int
    measured: Measured | None


@dataclass(frozen=True)
class TuneInput:
    path: str
    device: str
    device_name: str | None
    memory_limit_bytes: int | None
    margin: float | None
    search_time_s: float | None
    dataset_samples: int | None
    dataset_tokens: int | None
    pick: TunePick | None
    probes: list[Probe]
    baseline: TuneBaseline | None
    notes: list[str]
    undecided: list[UndecidedChange] = field(default_factory=list)
    """The changes to the pick its search could not decide (``undecided``, ``not_compared``,
    ``contradicted`` notes): their rows are marked, not read as faster (an audit)."""


@dataclass(frozen=True)
class UndecidedChange:
    """A change tune's search could not decide, from one of its notes."""

    probe: int | None
    """The index of the probe that measured the changed configuration (None: a file from before
    the notes named it; then the probe is found as the pick with ``changes`` made)."""
    changes: dict[str, Any]
    """The changed fields and their values, relative to the best configuration at the time."""


@dataclass(frozen=True)
class OomEvent:
    """One OOM train recovered from; in an evaluation (``phase`` eval) the two batch fields hold
    the evaluation batch before and after."""

    step: int | None
    phase: str | None
    micro_batch_before: int | None
    micro_batch_after: int | None
    grad_accum_after: int | None = None


@dataclass(frozen=True)
class TrainInput:
    path: str
    job: dict[str, Any]
    steps: int | None
    samples_seen: int | None
    tokens_seen: int | None
    wall_time_s: float | None
    final_loss: float | None
    oom_events: list[OomEvent]
    checkpoints: list[str]
    resumed_from: str | None
    monitor_log: str | None
    segment_ends: list[tuple[int, int, int | None]] = field(default_factory=list)
    """(step, micro-batch, accumulation) each segment's last step ran at (train.json's segments;
    empty for a record written before they were kept)."""
    stopped: str | None = None
    """train.json's ``stopped``: completed | interrupted | diverged | failed | …"""
    signal: str | None = None
    segments: int = 1
    """Runs the record joins (a resume into the same directory appends a segment)."""
    losses: list[float | None] = field(default_factory=list)
    """Each optimizer step's training loss, from step 1 (None: not finite, or not recorded),
    measured."""
    evals: list[EvalPoint] = field(default_factory=list)
    segment_rows: list[SegmentRow] = field(default_factory=list)
    unrecorded_steps: int = 0
    """The first steps, run by a segment whose checkpoint carried no history (an older
    trainfit): their losses are None as not recorded, not as non-finite."""


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation of train.json's ``evals`` (measured)."""

    step: int
    eval_loss: float | None
    eval_perplexity: float | None


@dataclass(frozen=True)
class SegmentRow:
    """One run of train.json's ``segments``: the steps it trained, how it stopped, what it
    resumed from."""

    segment: int
    start_step: int
    end_step: int | None
    stopped: str | None
    resumed_from: str | None


@dataclass(frozen=True)
class MonitorLog:
    """Columns of docs/json-formats.md, one value per sample (``None`` = no reading); measured."""

    path: str
    columns: dict[str, list[float | None]]
    run_devices: list[str] = field(default_factory=list)
    """Where the train run that wrote the log ran, one per segment that says (train.json's
    segments); empty for a bare ``monitor`` log or an older record: then read from the rows."""
    memory_limit_bytes: int | None = None
    """The run's ``--memory-limit`` (a CPU run's stand-in capacity), when its segments agree."""

    @property
    def samples(self) -> int:
        """Sampling instants: the sampler writes a row per GPU at each (a review: 3 samples on
        2 GPUs read as 6)."""
        return len(set(self.columns["time_s"]))


@dataclass(frozen=True)
class Finding:
    bottleneck: str
    evidence: dict[str, float | None]
    fix: str
    predicted_gain_fraction: float | None
    gain_measured: bool = False
    """``predicted_gain_fraction`` is a probe's measurement, not a prediction."""
    detail: str = ""
    """Doctor's reading of the evidence, with what the gain is (e.g. an upper bound); "" in a
    file from before it was written."""


@dataclass(frozen=True)
class DoctorInput:
    path: str
    target: str
    steps_measured: int | None
    split: dict[str, float | None]
    findings: list[Finding]
    before: dict[str, float | None]
    after: dict[str, float | None] | None
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
    """Doctor's own notes (a verdict that did not hold, a busy host, a run that ended early)."""
    round_bottlenecks: list[str] = field(default_factory=list)
    """The bottleneck each 'before' round named alone."""


@dataclass
class Inputs:
    plans: list[PlanInput] = field(default_factory=list)
    tunes: list[TuneInput] = field(default_factory=list)
    trains: list[TrainInput] = field(default_factory=list)
    doctors: list[DoctorInput] = field(default_factory=list)
    monitors: list[MonitorLog] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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


@dataclass(frozen=True)
class SeedTable:
    rows: list[SeedRow]
    reference: str
    """What the speed-up is relative to."""
    dataset_tokens: int | None
    dataset_tokens_source: str


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


@dataclass
class Report:
    title: str
    sources: list[tuple[str, str]]
    sections: list[Section]
    trains: list[TrainSummary]
    timelines: list[Timeline]
    doctors: list[DoctorSection]
    warnings: list[str]
