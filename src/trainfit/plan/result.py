"""What ``trainfit plan`` returns: one row per candidate configuration and the plan around them
(typed results, apart from the grid that computes them and from the renderers that print them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainfit.job import JobSpec
from trainfit.memory.predict import MemoryPrediction
from trainfit.plan.checks import HostRamCheck, ObservedCheck
from trainfit.plan.context import OffloadCheck, PlanAssumptions
from trainfit.speed.bands import SpeedBand
from trainfit.speed.predict import SpeedPrediction

NO_GPU_SPEED = "no GPU named: --gpu NAME predicts speed"


def _speed_fields(speed: dict[str, Any] | None) -> dict[str, Any]:
    """A row's speed for --json, the same shape with or without a GPU (an audit: ``bound`` was
    null without one and "unknown" on a card without a known peak; ``speed_unknown_reason`` and
    ``sync_note`` "" or null for the same nothing): ``bound`` "unknown" when not predicted;
    ``speed_unknown_reason`` null when the speed is known, else why; ``sync_note`` null without
    a gradient exchange."""
    keys = ("step_time_s", "tokens_per_s", "samples_per_s", "mfu", "hfu", "device_busy_fraction",
            "bound", "sync_s", "sync_exposed_s", "sync_contention_s", "sync_note", "optimizer_s",
            "framework_host_s")
    out = {k: (speed or {}).get(k) for k in keys}
    out["bound"] = out["bound"] or "unknown"
    out["sync_note"] = out["sync_note"] or None
    out["speed_unknown_reason"] = ((speed.get("unknown_reason") or None) if speed is not None
                                   else NO_GPU_SPEED)
    return out


@dataclass
class PlanRow:
    job: JobSpec
    """This configuration (micro_batch, grad_accum, precision, grad_ckpt ... all set)."""
    memory: MemoryPrediction
    how: str
    """``simulated`` (full-size run of the step) or ``extrapolated`` (from four small runs)."""
    speed: SpeedPrediction | None = None
    largest_fitting: bool = False
    """The largest micro-batch of its (precision, checkpointing) group that fits (▲); never set
    on a row that does not fit."""
    recommended: bool = False
    rank: int | None = None
    """1 = fastest predicted configuration that fits, among rows of the same effective batch."""
    shown: bool = True
    """Worth a line of the table: near its group's fitting frontier (trainfit.plan.rows)."""


@dataclass(frozen=True)
class FieldChange:
    """One job field that differs between two configurations (what the user would change)."""

    field: str
    before: Any
    after: Any


COMPARED_FIELDS = ("method", "effective_batch", "micro_batch", "grad_accum", "grad_ckpt",
                   "precision", "attention", "optimizer", "optimizer_impl")
"""The fields the pick is compared on against the user's current configuration."""


@dataclass
class PlanResult:
    model: str
    model_origin: str
    model_note: str
    gpu: str | None
    gpu_display_name: str | None
    gpu_memory_bytes: int | None
    margin: float
    total_params: int
    trainable_params: int
    rows: list[PlanRow]
    recommended_index: int | None
    smallest_device_bytes: int | None
    """The smallest predicted device peak over the rows (what "nothing fits" is measured by)."""
    plan_time_s: float
    ladder: list[Any] = field(default_factory=list)
    """When nothing fits: :class:`trainfit.plan.ladder.Rung` s, cumulative, up to the first that
    fits, then the rungs that take back an earlier change it made needless (``undoes``): the
    answer is the last rung."""
    dataset_tokens: int | None = None
    epochs: float | None = None
    current: PlanRow | None = None
    """The user's current configuration, simulated at full size (when one was given)."""
    changes_vs_current: list[FieldChange] = field(default_factory=list)
    """The pick against the current configuration: the fields to change (empty: no change)."""
    speedup_vs_current: float | None = None
    """Predicted tokens/s of the pick ÷ that of the current configuration (None: unknown)."""
    assumptions: PlanAssumptions | None = None
    """What every row shares (method, quantisation, sequence length, effective batch, ranks ...)
    and the library versions the simulation ran."""
    offload: OffloadCheck | None = None
    """Whether HF's device_map="auto" would offload the pick's weights; whether it runs on the GPU."""
    observed: ObservedCheck | None = None
    """A device number the user saw at the current configuration, against the prediction."""
    host_ram: HostRamCheck | None = None
    """The host RAM the pick needs that can be stated, against what the user has free."""
    speed_band: SpeedBand | None = None
    """How close speed predictions of this scale of run came to published throughputs (None: no
    GPU named, no speed predicted)."""
    link: str | None = None
    """The link the rows' gradient synchronisation was timed over: its name as given, measured or
    taken from the GPU catalog (None: one rank, or no GPU named)."""
    link_gbs: float | None = None
    """That link's bandwidth per GPU and direction, GB/s (None: unknown)."""
    precisions_not_planned: list[str] = field(default_factory=list)
    """Precisions the grid left out because another planned one matches them on this GPU, or the
    job cannot run them (:func:`trainfit.plan.inputs.grid_precisions`: amp-fp16 on a card with
    bf16, fp32 under flash-attention-2)."""
    gpu_memory_source: str | None = None
    """Where the GPU's capacity comes from (the catalog's source; ``ESTIMATE: …`` for a generic
    card known by its sold size)."""
    numerics_kept: dict[str, Any] | None = None
    """The fastest row trained in pure bf16 where the current configuration keeps fp32 weights,
    passed over because its predicted gain is inside the median error of such predictions
    (:func:`keep_fp32_weights`): ``{precision, tokens_per_s, gain, median_abs_error}`` (the
    pick's gain over the kept row, predicted); None where nothing was passed over."""

    @property
    def pick(self) -> PlanRow | None:
        return None if self.recommended_index is None else self.rows[self.recommended_index]

    def to_dict(self) -> dict[str, Any]:
        ladder = [r.to_dict() for r in self.ladder]
        cur = self.current
        d = asdict(self)
        d["ladder"] = ladder
        d["current"] = None if cur is None else {
            **cur.job.to_dict(), **{k: getattr(cur.memory, k) for k in (
                "peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "fits")},
            **_speed_fields(asdict(cur.speed) if cur.speed else None)}
        configs = []
        for row in d.pop("rows"):
            mem = row["memory"]
            configs.append({**row["job"], **{k: mem[k] for k in (
                "peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "breakdown",
                "peak_phase", "fits", "headroom_bytes", "alloc_retries",
                "reserved_expandable_bytes", "error_band_kind", "error_band_under",
                "error_band_cases", "peak_device_upper_bytes", "host_offload_bytes",
                "host_activation_bytes", "host_activation_copied_bytes",
                "host_activation_exact")}, "how": row["how"],
                "largest_fitting": row["largest_fitting"], "recommended": row["recommended"],
                "rank": row["rank"],
                # what the rank orders by: a row without a predicted speed (no GPU, a card
                # without a known peak) is ordered by preference alone — an audit read ranks
                # 1…32 beside null tokens/s as "fastest"
                "rank_basis": None if row["rank"] is None else (
                    "predicted_tokens_per_s" if (row["speed"] or {}).get("tokens_per_s")
                    else "preference"),
                "shown": row["shown"], **_speed_fields(row["speed"]),
                "time_for_dataset_s": self.time_for_dataset_s(row["speed"]),
                "model_notes": mem["model_notes"]})
        d["configs"] = configs
        if self.gpu is None:
            # the device peak is reserved + the CUDA context, and the context depends on the card
            # (0.5-0.8 GiB over the catalog): without one it is unknown, not the reserve alone
            # under a name that says device (an audit's F2)
            d["smallest_device_bytes"] = None
            for c in configs:
                c["peak_device_bytes"] = None
                c["peak_device_upper_bytes"] = None
            if d["current"]:
                d["current"]["peak_device_bytes"] = None
        return d

    def time_for_dataset_s(self, speed: dict[str, Any] | None) -> float | None:
        """Predicted wall time for ``epochs`` over ``dataset_tokens`` (None when either is
        unknown)."""
        tps = (speed or {}).get("tokens_per_s")
        if not tps or self.dataset_tokens is None:
            return None
        return self.dataset_tokens * (self.epochs or 1.0) / tps


def smallest_row(rows: list[PlanRow]) -> PlanRow:
    """The configuration with the smallest predicted device peak: where nothing fits, the one the
    "nothing fits" line sizes, the ladder starts from and the header names the kernels of."""
    return min(rows, key=lambda r: r.memory.peak_device_bytes)
