"""The error band of memory predictions per kind of run, from the published cases the benchmarks
scored (calibration.py's and heldout_memory.py's results, high/medium confidence only) and the
steps gpu_validate.py measured on a GPU here (their device peak: cudaMemGetInfo's used memory).

A kind is (single-GPU or multi-GPU) × (full, LoRA, QLoRA).  For each: how many cases, the signed
errors' range, and ``under``: how far below a measured peak a prediction of that kind has come
(the 95th percentile of the under-predictions when there are ≥ 20 cases, else the worst one).
``plan`` reads them (src/trainfit/memory/bands.json) to print the band beside each peak and to
decide ``fits`` with it: a configuration fits when its predicted device peak, raised by the band's
``under``, stays inside the GPU (or by the --margin, when that is larger).  A kind without cases
takes the widest band of all (unsure: widen, never shrink).

Run: ``python benchmarks/bands.py`` (reads benchmarks/results/{calibration,heldout_memory,
gpu_validate}.json)
→ src/trainfit/memory/bands.json and benchmarks/results/bands.md.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
BANDS = ROOT.parent / "src" / "trainfit" / "memory" / "bands.json"
KINDS = [(s, m) for s in ("single", "multi") for m in ("full", "lora", "qlora")]


def _rows() -> list[dict[str, Any]]:
    rows = []
    cal = json.loads((RESULTS / "calibration.json").read_text())["results"]
    for r in cal:
        if r.get("error") is not None and r.get("confidence") in ("high", "medium"):
            rows.append({"id": r["id"], "scale": "single", "method": r["job"]["method"],
                         "error": r["error"], "file": "calibration"})
    held = json.loads((RESULTS / "heldout_memory.json").read_text())["results"]
    for r in held:
        if r.get("scored") and r.get("error") is not None \
                and r.get("confidence") in ("high", "medium"):
            rows.append({"id": r["id"], "scale": "multi" if (r.get("ranks") or 1) > 1 else "single",
                         "method": r["method"], "error": r["error"], "file": "heldout"})
    gpu = RESULTS / "gpu_validate.json"
    if gpu.exists():  # the same steps measured on a GPU here (benchmarks/gpu_validate.py)
        doc = json.loads(gpu.read_text())
        for r in doc["rows"]:
            err = (r.get("error") or {}).get("device")
            if err is not None:
                c = r["case"]
                rows.append({"id": f"gpu_validate:{doc['device']}:" + ":".join(map(str, c.values())),
                             "scale": "single", "method": c["method"], "error": err,
                             "file": "gpu_validate"})
    return rows


def _under(errors: list[float]) -> float:
    unders = sorted(max(0.0, -e) for e in errors)
    if not unders:
        return 0.0
    if len(unders) >= 20:
        return unders[min(len(unders) - 1, math.ceil(0.95 * len(unders)) - 1)]
    return unders[-1]


def bands(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for scale, method in KINDS:
        errs = [r["error"] for r in rows if r["scale"] == scale and r["method"] == method]
        under = _under(errs)
        out[f"{scale}-{method}"] = {
            "cases": len(errs), "under": round(under, 4),
            # the cases the band covers: the 95th percentile leaves the worst out of it
            "within": sum(1 for e in errs if -e <= under),
            "min_error": round(min(errs), 4) if errs else None,
            "max_error": round(max(errs), 4) if errs else None,
            "median_abs_error": round(sorted(abs(e) for e in errs)[len(errs) // 2], 4)
            if errs else None}
    widest = max(b["under"] for b in out.values())
    for b in out.values():
        if not b["cases"]:
            b["under"] = widest
            b["note"] = "no published case of this kind: the widest band of all"
    return out


def fit_outcomes(b: dict[str, Any]) -> list[tuple[str, int, int, int, int]]:
    """What each fit rule says of the held-out runs with a published outcome (high/medium
    confidence, supported): (rule, OOMs predicted not to fit, OOMs, trained runs predicted to
    fit, trained runs).  The band comes from these same cases' errors (in-sample), so the table
    shows the trade it makes, not an independent check of it."""
    held = json.loads((RESULTS / "heldout_memory.json").read_text())["results"]
    runs = [r for r in held if r.get("outcome") in ("OOM", "trained") and not r.get("unsupported")
            and r.get("confidence") in ("high", "medium") and r.get("predicted_device_bytes")]
    rules = {
        "point prediction: device peak ≤ the card": lambda dev, cap, under: dev <= cap,
        "with the band: device peak × (1 + under) ≤ the card":
            lambda dev, cap, under: dev * (1 + under) <= cap,
        "plan's default: the band and ≤ 90 % of the card":
            lambda dev, cap, under: dev <= cap * min(0.9, 1 / (1 + under)),
    }
    out = []
    for name, fits in rules.items():
        verdicts = [(r["outcome"], fits(r["predicted_device_bytes"], r["capacity_bytes"], b[
            f"{'multi' if (r.get('ranks') or 1) > 1 else 'single'}-{r['method']}"]["under"]))
            for r in runs]
        oom = [f for o, f in verdicts if o == "OOM"]
        ran = [f for o, f in verdicts if o == "trained"]
        out.append((name, oom.count(False), len(oom), ran.count(True), len(ran)))
    return out


def main() -> int:
    rows = _rows()
    b = bands(rows)
    BANDS.write_text(json.dumps({"source": "benchmarks/bands.py over results/calibration.json and "
                                           "results/heldout_memory.json (high/medium confidence)",
                                 "bands": b}, indent=1) + "\n")
    lines = ["# Memory prediction error band per kind of run", "",
             "Regenerate: `python benchmarks/bands.py` (after calibration.py and heldout_memory.py)."
             " `under` = how far below the measured peak a prediction of that kind has come (95th "
             "percentile of the under-predictions with ≥ 20 cases, else the worst): plan raises "
             "the predicted device peak by it to decide `fits`.", "",
             "| kind | cases | under (used for fits) | cases within it | error range | "
             "median \\|error\\| |",
             "|---|---|---|---|---|---|"]
    for k, v in b.items():
        rng = "—" if v["min_error"] is None else f"{v['min_error']:+.1%} … {v['max_error']:+.1%}"
        med = "—" if v["median_abs_error"] is None else f"{v['median_abs_error']:.1%}"
        lines.append(f"| {k} | {v['cases']} | {v['under']:.1%} | {v['within']} | {rng} | {med} |")
    lines += ["", "What the fit rule says of the held-out runs with a published outcome (high/medium "
              "confidence; the band is fitted on these same cases, so this shows its trade, not "
              "an independent check):", "",
              "| fit rule | OOM runs predicted not to fit | trained runs predicted to fit |",
              "|---|---|---|"]
    for name, oom_ok, oom, ran_ok, ran in fit_outcomes(b):
        lines.append(f"| {name} | {oom_ok} of {oom} | {ran_ok} of {ran} |")
    (RESULTS / "bands.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
