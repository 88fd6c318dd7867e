"""The error band of a speed prediction: how close predictions of this scale of run have come to
the published throughputs the benchmarks scored (benchmarks/speed_bands.py writes bands.json
beside this module from benchmarks/results/speed_published.json).  ``plan`` states it beside its
tokens/s: the ≥ 8-GPU model is checked within a few percent, the single-GPU one is not yet, and a
user choosing between rows should know which of the two they are reading."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files


@dataclass(frozen=True)
class SpeedBand:
    kind: str
    """single (1 GPU), few (2-7 GPUs), many (≥ 8 GPUs), or compiled (torch.compile, any scale)."""
    cases: int
    """Published throughputs of this kind the band was measured on."""
    median_abs_error: float
    """Median |predicted / measured − 1| (fraction)."""
    p90_abs_error: float
    """9 in 10 predictions of this kind came within this (fraction)."""
    median_signed_error: float
    """Median predicted / measured − 1: positive = predictions faster than measured."""

    @property
    def description(self) -> str:
        return {"single": "single-GPU", "few": "2-7-GPU", "many": "≥ 8-GPU",
                "compiled": "torch.compile"}[self.kind]


@lru_cache(maxsize=1)
def _bands() -> dict[str, dict[str, float]]:
    return json.loads(files("trainfit.speed").joinpath("bands.json").read_text())["bands"]


def speed_band_for(ranks: int, compiled: bool) -> SpeedBand:
    kind = "compiled" if compiled else ("single" if ranks <= 1 else
                                        "few" if ranks < 8 else "many")
    b = _bands()[kind]
    return SpeedBand(kind, int(b["cases"]), float(b["median_abs_error"]),
                     float(b["p90_abs_error"]), float(b["median_signed_error"]))
