"""Dataclasses of the report's inputs, as read from the files (load.py): a plan, a tune, a train
record, a monitor log, a doctor result. The report computed from them is model.py's.

Names carry the unit and whether a number is predicted or measured; ``None`` is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    step_source: str = "job"
    """``job``: tokens/s counts positions, padding included; ``script``: the script's batches'
    non-padding tokens (tune/tuner.py ``TuneResult.step_source``)."""
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
    failure: str | None = None
    """Why a failed run stopped: its record's ``failed: …`` note (an out-of-memory at
    micro-batch 1 is not among the OOM events survived; None otherwise)."""


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
    gain_fraction: float | None
    gain_measured: bool = False
    """``gain_fraction`` is a probe's measurement, not a prediction."""
    detail: str = ""
    """Doctor's reading of the evidence, with what the gain is (e.g. an upper bound); "" in a
    file from before it was written."""
    gain_upper_bound: bool = False
    """``gain_fraction`` is an upper bound (the named cost all gone): shown "≤"."""


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
    """The bottleneck each 'before' round named alone (a command's: each half of its window)."""
    form: str = "job"
    """``job`` or ``command`` (``doctor -- CMD``); ``job`` in a file from before it was written."""
    command_runs: int | None = None
    """``doctor -- CMD``'s runs (2 on a busy host); None for a job or an older file."""


@dataclass
class Inputs:
    plans: list[PlanInput] = field(default_factory=list)
    tunes: list[TuneInput] = field(default_factory=list)
    trains: list[TrainInput] = field(default_factory=list)
    doctors: list[DoctorInput] = field(default_factory=list)
    monitors: list[MonitorLog] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
