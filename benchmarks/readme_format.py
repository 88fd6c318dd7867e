"""The figures' formatting shared by ``make_readme.py`` and its sections: results files read as
JSON (None while their script has not written them), percentages, and the median and spread of a
measurement kept with every repeat."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

NOTES = "docs/notes/cpu-timing-noise.md"  # relative to the repository root
"""The project's note on this machine's timing noise, quoted wherever a ratio of timings is shown."""


def load(results: Path, name: str) -> Any:
    """A results file's content, or None when its script has not written it yet."""
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def pct(x: float | None, digits: int = 1, sign: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.{digits}%}" if sign else f"{x:.{digits}%}"


def med(v: float | list[float] | None) -> float | None:
    """A measured figure as a scalar: tune_targets keeps every repeat, the page shows the median."""
    if v is None or isinstance(v, int | float):
        return v
    return statistics.median(v) if v else None


def spread(v: float | list[float] | None) -> float | None:
    """(max − min) / median of the repeats: the noise a pick / best ratio must beat to mean anything."""
    if not isinstance(v, list) or len(v) < 2 or not statistics.median(v):
        return None
    return (max(v) - min(v)) / statistics.median(v)


def not_yet(script: str) -> str:
    return f"_not yet measured — run `python benchmarks/{script}`._"
