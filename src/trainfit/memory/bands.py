"""The error band of a memory prediction: how far predictions of this kind of run have come below
the published measurements the benchmarks scored (benchmarks/bands.py writes bands.json beside
this module; benchmarks/results/bands.md shows it).  ``plan`` prints it beside each peak and
decides ``fits`` with it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files

from trainfit.job import JobSpec


@dataclass(frozen=True)
class ErrorBand:
    kind: str
    """single-GPU or multi-GPU × full / lora / qlora."""
    under: float
    """How far below the measured peak predictions of this kind have come (fraction)."""
    cases: int
    """Published cases of this kind the band was measured on (0: the widest band, unsure)."""
    min_error: float | None
    max_error: float | None
    within: int = 0
    """Of ``cases``, how many came no further under than ``under`` (the 95th percentile of the
    under-predictions leaves the worst out when there are ≥ 20 cases)."""


@lru_cache(maxsize=1)
def _bands() -> dict[str, dict[str, float]]:
    return json.loads(files("trainfit.memory").joinpath("bands.json").read_text())["bands"]


def band_for(job: JobSpec) -> ErrorBand:
    kind = f"{'multi' if job.ranks > 1 else 'single'}-{job.method}"
    b = _bands()[kind]
    return ErrorBand(kind, float(b["under"]), int(b["cases"]), b.get("min_error"),
                     b.get("max_error"), int(b.get("within", b["cases"])))
