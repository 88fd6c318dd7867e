"""The error band of speed predictions per scale of run, from the published throughputs
speed_published.py scored.

A scale is 1 GPU, 2-7 GPUs or ≥ 8 GPUs (plain cases: no feature trainfit approximates), plus
``compiled`` (torch.compile and fused-kernel stacks, any scale).  For each: the cases, the median
and the 90th percentile of |predicted / measured − 1|, and the median signed error.  ``plan``
reads them (src/trainfit/speed/bands.json) and says, beside its tokens/s, how close predictions
of that scale have come — so a single-GPU ranking, whose median error is far above the ≥ 8-GPU
one, is read as the guide it is and checked with ``trainfit tune``.

Run: ``python benchmarks/speed_bands.py`` (reads benchmarks/results/speed_published.json;
speed_published.py runs it after each full run) → src/trainfit/speed/bands.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from speed_published import stats

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "speed_published.json"
BANDS = ROOT.parent / "src" / "trainfit" / "speed" / "bands.json"
SCALES = {"1 GPU": "single", "2-7 GPUs": "few", "≥ 8 GPUs": "many"}


def _band(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """speed_published's own statistics of these rows (the numbers its report prints), rounded,
    with the signed range."""
    st = stats(rows)
    errors = [r["error"] for r in rows]
    return {"cases": st["cases"],
            **{k: round(st[k], 4) for k in ("median_abs_error", "p90_abs_error",
                                            "median_signed_error")},
            "min_error": round(min(errors), 4), "max_error": round(max(errors), 4)}


def bands(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    scored = [r for r in rows if r.get("error") is not None]
    out = {key: _band([r for r in scored if r["bucket"] == "plain" and r["scale"] == scale])
           for scale, key in SCALES.items()}
    out["compiled"] = _band([r for r in scored if r["bucket"] == "fused/compiled"])
    return out


def main() -> int:
    out = bands(json.loads(RESULTS.read_text())["results"])
    BANDS.write_text(json.dumps({
        "source": "benchmarks/speed_bands.py over results/speed_published.json (plain cases per "
                  "scale; compiled = torch.compile / fused-kernel stacks)",
        "bands": out}, indent=1) + "\n")
    for k, b in out.items():
        print(f"{k:9s} {b['cases']:4d} cases  median |error| {b['median_abs_error']:.1%}  "
              f"p90 {b['p90_abs_error']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
