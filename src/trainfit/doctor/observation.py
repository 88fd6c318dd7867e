"""What doctor's rules read (:class:`Observation`: the measured step split and what the
profile and the sampler saw) and what they name (:class:`Finding`); the rules are
:mod:`trainfit.doctor.findings`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainfit.doctor.split import Split
from trainfit.doctor.watch import HostSummary


@dataclass
class Finding:
    bottleneck: str
    evidence: dict[str, float | None]
    fix: str
    gain_fraction: float | None
    detail: str = ""
    """One line of prose for the table (the JSON carries the numbers)."""
    gain_upper_bound: bool = False
    """``gain_fraction`` assumes the named cost all goes, which its fix cannot promise (some of
    it is needed work, or the fix only shrinks it): said "at most" beside it (an audit: a
    loader's "+250 %" headed a fix that predicted its wait 17 → 11 ms)."""

    @property
    def gain_measured(self) -> bool:
        """The gain is a probe's measurement (the larger micro-batch run for a few steps), not the
        rule's prediction: ``gain_fraction`` then holds the measured figure."""
        return self.evidence.get("probe_measured_gain_fraction") is not None

    def to_dict(self) -> dict[str, Any]:
        # the detail is kept: it says what the gain is (an upper bound where some of the part is
        # needed work), which report shows beside it (an audit: report dropped that wording)
        d = asdict(self)
        d["gain_measured"] = self.gain_measured
        return d


@dataclass(kw_only=True)
class Observation:
    """Everything the rules read; None = not known on this target/device."""

    split: Split
    device: str
    """cpu | cuda"""
    trainfit_job: bool
    """A trainfit job (fixes can be applied) or someone else's command (fixes are printed)."""
    tokens_per_step: float | None = None
    micro_steps_per_step: float | None = None
    sync_calls_per_step: float = 0.0
    """Sync points in the training loop itself (.item(), .tolist(), float(t), .cpu() of a GPU tensor)."""
    model_sync_calls_per_step: float = 0.0
    log_calls_per_step: float = 0.0
    ops_per_step: float | None = None
    op_overhead_s: float | None = None
    """Measured fixed cost of dispatching one op on this host (trainfit.speed.cpu)."""
    matmul_time_fraction: float | None = None
    mfu: float | None = None
    peak_flops: float | None = None
    """The ceiling the MFU is relative to (FLOP/s, measured on this host; None: not stated)."""
    recompute_s: float = 0.0
    peak_memory_bytes: int | None = None
    """The measured peak read against ``memory_capacity_bytes``: on a GPU the card's (a trainfit
    job's reserved peak over the round; another command's allocated peak, from its hooks), on the
    CPU the process's RSS — or, under a job's ``memory_limit``, the live tensor bytes of one step,
    which is what that limit caps."""
    memory_capacity_bytes: int | None = None
    params_on_cpu_fraction: float | None = None
    num_workers: int | None = None
    cpu_count: int = 1
    lazy_tokenization: bool = False
    micro_batch: int | None = None
    max_micro_batch: int | None = None
    """The largest micro-batch the effective batch allows (trainfit jobs)."""
    measured_micro_batch_gain: tuple[int, float] | None = None
    """(micro-batch, measured tokens/s gain fraction) from probing a larger micro-batch."""
    padding_fraction: float | None = None
    optimizer_fused: bool | None = None
    optimizer_name: str | None = None
    """The torch.optim class another command steps (AdamW, SGD …); None for a trainfit job."""
    computes_in: str | None = None
    """What the measured step's multiplies ran in: its autocast dtype, else its weights' dtype
    (bfloat16, float16, float32; None: not known)."""
    bf16_fast: bool | None = None
    """Whether bf16 matrix multiplies run fast here: False on a CPU without bf16/AVX-512 matrix
    instructions (PyTorch's own check, doctor/peaks.py), where they are emulated — this machine's
    kind: ~1 GFLOP/s against fp32's ~100, a tune audit measured a 28× slower step; None unknown
    (a GPU: bf16 is its fast path where the catalog gives a bf16 peak)."""
    host: HostSummary | None = None
    extra: dict[str, float] = field(default_factory=dict)


def gain_from_removing(fraction_removed: float) -> float:
    """The throughput gain when a cost of this share of the step disappears and nothing else
    changes: 1 / (1 − fraction) − 1 (0.5 = 1.5× the tokens/s)."""
    return 1.0 / max(1.0 - fraction_removed, 1e-6) - 1.0


def rounded(x: float | None, nd: int = 6) -> float | None:
    """A finding's evidence number, rounded for the JSON (None stays None)."""
    return None if x is None else round(float(x), nd)
