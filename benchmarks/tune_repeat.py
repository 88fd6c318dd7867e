"""Does the same tune give the same answer? The README's `trainfit tune` run N times on a quiet host
and N times on a loaded one (a second process burning one core), each run a fresh CLI process.

Reports how many picks agree, the speed-ups tune reported against the user's current
configuration with the interleaved rounds they were measured in, and what tune said it could not
decide. Targets (issue "a newcomer's first hour"): ≥ 4 of 5 identical picks on both hosts, and no
reported speed-up outside the spread of its own rounds.

Writes benchmarks/results/tune_repeat.{json,md}. Takes ~2 minutes a run on this 2-core machine:
run it alone (`python benchmarks/tune_repeat.py --runs 5`); `--md-only` rewrites the table.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
README_TUNE = ["tune", "llama-tiny-58m", "--data", str(ROOT / "examples" / "data" / "tiny_text.jsonl"),
               "--seq-len", "64", "--effective-batch", "8", "--micro-batch", "1", "--device", "cpu",
               "--memory-limit", "1.2GiB", "--json"]
PICK_FIELDS = ("micro_batch", "grad_accum", "precision", "grad_ckpt", "attention", "optimizer",
               "optimizer_impl", "num_workers", "prefetch_factor", "pin_memory", "compile")


def one_run() -> dict[str, Any]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run([sys.executable, "-m", "trainfit.cli.main", *README_TUNE], cwd=cwd,
                              capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    d = json.loads(proc.stdout)
    vs = d.get("vs_baseline") or {}
    return {"wall_s": time.perf_counter() - t0,
            "pick": None if d["pick"] is None else {k: d["pick"][k] for k in PICK_FIELDS},
            "reported_speedup": vs.get("median_ratio") if vs.get("verdict") == "faster" else None,
            "rounds": vs.get("ratios"), "verdict": vs.get("verdict"), "noise": vs.get("noise"),
            "undecided": [n for n in d["search_notes"] if n["kind"] == "undecided"],
            # candidates measured again after a suspect single probe (then dropped or compared)
            "second_looks": [n for n in d["search_notes"] if n["kind"] in ("second_look", "outlier")],
            "probes": len(d["probes"])}


def burner() -> subprocess.Popen:
    """A second process burning one core for as long as it lives (the 'loaded host')."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    picks = collections.Counter(json.dumps(r["pick"], sort_keys=True) for r in runs)
    most, count = picks.most_common(1)[0]
    inside = [r["reported_speedup"] is None or (min(r["rounds"]) <= r["reported_speedup"]
                                                <= max(r["rounds"])) for r in runs]
    speedups = [r["reported_speedup"] for r in runs if r["reported_speedup"] is not None]
    return {"runs": len(runs), "identical_picks": count, "most_common_pick": json.loads(most),
            "distinct_picks": len(picks),
            "reported_speedups": speedups,
            "reported_speedup_range": [min(speedups), max(speedups)] if speedups else None,
            "speedups_inside_their_rounds": sum(inside),
            "undecided_notes": sum(len(r["undecided"]) for r in runs),
            "second_looks": sum(len(r.get("second_looks", [])) for r in runs),
            "median_wall_s": sorted(r["wall_s"] for r in runs)[len(runs) // 2]}


def markdown(res: dict[str, Any]) -> str:
    lines = ["# tune, repeated: the same job, the same answer?", "",
             "`" + "trainfit " + " ".join(a if "/" not in a else "examples/data/tiny_text.jsonl"
                                          for a in README_TUNE) + "`, each run a fresh process. "
             "Loaded = a second process burning one of the 2 cores throughout. Measured by "
             "`python benchmarks/tune_repeat.py`.", "",
             "| host | runs | identical picks | distinct picks | reported speed-ups vs current "
             "(min–max) | speed-ups inside their own rounds | 'could not decide' notes | "
             "candidates measured again after one probe | median s/run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for host in ("quiet", "loaded"):
        s = res.get(host, {}).get("summary")
        if not s:
            continue
        rng = s["reported_speedup_range"]
        lines.append(f"| {host} | {s['runs']} | {s['identical_picks']} | {s['distinct_picks']} | "
                     + ("—" if rng is None else f"{rng[0]:.2f}×–{rng[1]:.2f}×")
                     + f" | {s['speedups_inside_their_rounds']} of {s['runs']} | "
                     f"{s['undecided_notes']} | {s.get('second_looks', '—')} | "
                     f"{s['median_wall_s']:.0f} |")
    for host in ("quiet", "loaded"):
        s = res.get(host, {}).get("summary")
        if s:
            p = s["most_common_pick"]
            lines += ["", f"{host}: most common pick — " + ", ".join(f"{k} {v}" for k, v in p.items())
                      if p else f"{host}: nothing fits"]
    lines += ["", "Candidates measured again after one probe: the search's `second_look` (its "
              "prediction said faster, its one probe did not) and `outlier` (its one probe far "
              "below its prediction's pace) notes, summed over the runs; each was then dropped "
              "or compared in interleaved rounds."]
    lines += ["", "Targets: ≥ 4 of 5 identical picks on both hosts; every reported speed-up inside "
              "the range of the interleaved rounds it was measured in."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--md-only", action="store_true")
    ap.add_argument("--hosts", default="quiet,loaded")
    args = ap.parse_args()
    path = OUT / "tune_repeat.json"
    res: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if not args.md_only:
        for host in args.hosts.split(","):
            load = burner() if host == "loaded" else None
            try:
                runs = []
                for i in range(args.runs):
                    runs.append(one_run())
                    print(f"{host} run {i + 1}: pick {runs[-1]['pick']}, speed-up "
                          f"{runs[-1]['reported_speedup']}, rounds {runs[-1]['rounds']}", flush=True)
            finally:
                if load is not None:
                    load.kill()
            res[host] = {"runs": runs, "summary": summarise(runs)}
        OUT.mkdir(exist_ok=True)
        path.write_text(json.dumps(res, indent=1))
    (OUT / "tune_repeat.md").write_text(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
