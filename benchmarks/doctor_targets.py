"""The targets of ``trainfit doctor`` (issue 6), measured on this machine.

1. Input-bound (seed 003's loader: rows tokenized in ``__getitem__``, ``num_workers=0``):
   a. as a trainfit job (``doctor_jobs/input_bound.yaml``): doctor names it, applies the fix
      (pre-tokenized memory-mapped token file + packing, workers chosen by measurement) and measures
      again — before/after interleaved over 3 rounds (B A B A B A);
   b. as someone else's script (``doctor_jobs/input_bound.py`` via ``trainfit doctor -- python …``):
      named; the printed fix applied by hand (``--fixed``) and both measured by the doctor,
      interleaved over 3 runs each.
   Target: named input-bound, fixed tokens/s ≥ 2× (or the ceiling explained), data wait < 5 %.
2. Launch-bound (micro-batch 1 × 16) — as a script and as a trainfit job — and sync-bound
   (``.item()`` per token every micro-step) — as a script: each named, with its fix.
3. The doctor's own overhead on the measured steps ≤ 3 %: its own figure (hook calls × the timed
   cost of one + the sampler's CPU time) and, as a check, each script's own step times with and
   without the doctor (interleaved, 3 runs each).

All runs use 1 torch thread: on this shared 2-core host two OpenMP threads wait for each other
whenever another process takes a core (steps then slow down by 10-100×, see the results' notes);
one thread keeps the other core for the data loader or the neighbours.

    python benchmarks/doctor_targets.py        # ~6 min; writes benchmarks/results/doctor_targets.{json,md}
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch: this process and every child

import torch

from trainfit.doctor.command import doctor_command
from trainfit.doctor.result import DoctorResult
from trainfit.doctor.run import doctor_job

HERE = Path(__file__).resolve().parent
JOBS = HERE / "doctor_jobs"
OUT = HERE / "results"
REPEATS = 3
AB_REPEATS = 5
"""The overhead check compares two noisy timings: more pairs than the other comparisons."""
STEPS = 8
WARMUP = 2


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs)}


def script(name: str, *extra: str) -> list[str]:
    return [sys.executable, str(JOBS / f"{name}.py"), *extra]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def summary(r: DoctorResult) -> dict[str, Any]:
    return {"named": [f.bottleneck for f in r.findings], "bottleneck": r.findings[0].bottleneck,
            "fix": r.findings[0].fix, "predicted_gain_fraction": r.findings[0].gain_fraction,
            "evidence": r.findings[0].evidence, "step_time_s": r.before.step_time_s,
            "tokens_per_s": r.before.tokens_per_s, "data_wait_fraction": r.before.data_wait_fraction,
            "overhead_fraction": r.overhead_fraction, "doctor": r.to_dict()}


def job_target(name: str) -> dict[str, Any]:
    print(f"[{time.strftime('%X')}] trainfit job {name} (load {load()})", flush=True)
    r = doctor_job(JOBS / f"{name}.yaml", steps=STEPS, warmup=WARMUP, repeats=REPEATS)
    assert r.after is not None
    out = summary(r)
    out.update(
        applied=r.applied, notes=r.notes, after_named=[f.bottleneck for f in r.after_findings],
        before={"step_time_s": r.before.step_time_s, "step_time_spread_s": r.before.step_time_spread_s,
                "tokens_per_s": r.before.tokens_per_s, "tokens_per_s_spread": r.before.tokens_per_s_spread,
                "data_wait_fraction": r.before.data_wait_fraction, "rounds": r.before.rounds},
        after={"step_time_s": r.after.step_time_s, "step_time_spread_s": r.after.step_time_spread_s,
               "tokens_per_s": r.after.tokens_per_s, "tokens_per_s_spread": r.after.tokens_per_s_spread,
               "data_wait_fraction": r.after.data_wait_fraction, "rounds": r.after.rounds},
        gain=r.after.tokens_per_s / r.before.tokens_per_s if r.before.tokens_per_s else None)
    return out


def script_target(name: str, steps_arg: int) -> dict[str, Any]:
    """The script and its --fixed variant under the doctor, interleaved REPEATS times each."""
    before: list[DoctorResult] = []
    after: list[DoctorResult] = []
    for k in range(REPEATS):
        print(f"[{time.strftime('%X')}] script {name} round {k + 1} (load {load()})", flush=True)
        before.append(doctor_command(script(name, "--steps", str(steps_arg)), steps=STEPS, warmup=WARMUP))
        after.append(doctor_command(script(name, "--steps", str(steps_arg), "--fixed"), steps=STEPS,
                                    warmup=WARMUP))
    first = before[0]
    out = summary(first)
    names = [r.findings[0].bottleneck for r in before]
    tb = [r.before.tokens_per_s or 0.0 for r in before]
    ta = [r.before.tokens_per_s or 0.0 for r in after]
    out.update(
        bottleneck_each_run=names, fixed_named=[r.findings[0].bottleneck for r in after],
        before={"tokens_per_s": spread(tb), "step_time_s": spread([r.before.step_time_s for r in before]),
                "data_wait_fraction": spread([r.before.data_wait_fraction or 0.0 for r in before])},
        after={"tokens_per_s": spread(ta), "step_time_s": spread([r.before.step_time_s for r in after]),
               "data_wait_fraction": spread([r.before.data_wait_fraction or 0.0 for r in after])},
        gain=statistics.median(ta) / statistics.median(tb),
        overhead_fraction=spread([r.overhead_fraction or 0.0 for r in before]))
    return out


def own_step_times(cmd: list[str], doctored: bool) -> float:
    """Median of the script's own step times over the doctor's measured window."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    full = [*cmd, "--times-out", path]
    if doctored:
        doctor_command(full, steps=STEPS, warmup=WARMUP, stop=False)
    else:
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL)
    times = json.loads(Path(path).read_text())
    os.unlink(path)
    return statistics.median(times[WARMUP:WARMUP + STEPS])


def overhead_check(name: str) -> dict[str, Any]:
    plain, doc = [], []
    steps = WARMUP + STEPS + 3
    for k in range(AB_REPEATS):
        print(f"[{time.strftime('%X')}] overhead A/B {name} round {k + 1} (load {load()})", flush=True)
        plain.append(own_step_times(script(name, "--steps", str(steps)), doctored=False))
        doc.append(own_step_times(script(name, "--steps", str(steps)), doctored=True))
    ratios = [d / p - 1 for d, p in zip(doc, plain, strict=True)]
    return {"plain_step_s": spread(plain), "doctored_step_s": spread(doc),
            "ab_overhead_fraction": statistics.median(doc) / statistics.median(plain) - 1,
            "pairwise_fraction": spread(ratios)}


def main() -> None:
    t0 = time.time()
    res: dict[str, Any] = {"kind": "doctor-targets", "date": time.strftime("%Y-%m-%d %H:%M"),
                           "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": 1,
                           "load_before": load(), "steps": STEPS, "warmup": WARMUP, "repeats": REPEATS,
                           "ab_repeats": AB_REPEATS}
    res["input_bound_job"] = job_target("input_bound")
    res["launch_bound_job"] = job_target("launch_bound")
    res["input_bound_script"] = script_target("input_bound", 40)
    res["launch_bound_script"] = script_target("launch_bound", 20)
    res["sync_bound_script"] = script_target("sync_bound", 20)
    res["overhead_ab"] = {n: overhead_check(n) for n in ("input_bound", "launch_bound", "sync_bound")}
    res["load_after"] = load()
    res["wall_s"] = time.time() - t0
    res["targets"] = targets(res)
    OUT.mkdir(exist_ok=True)
    (OUT / "doctor_targets.json").write_text(json.dumps(res, indent=1))
    (OUT / "doctor_targets.md").write_text(markdown(res))
    print(markdown(res))


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    ij, isc = r["input_bound_job"], r["input_bound_script"]
    overheads = {k: r[k]["overhead_fraction"] for k in ("input_bound_job", "launch_bound_job")}
    overheads.update({k: r[k]["overhead_fraction"]["max"] for k in
                      ("input_bound_script", "launch_bound_script", "sync_bound_script")})
    return [
        {"target": "input-bound job named input-bound", "value": ij["bottleneck"],
         "met": ij["bottleneck"] == "input-bound"},
        {"target": "input-bound job: fixed tokens/s ≥ 2× (measured)", "value": round(ij["gain"], 2),
         "met": ij["gain"] >= 2.0},
        {"target": "input-bound job: data wait after < 5 % (measured)",
         "value": round(ij["after"]["data_wait_fraction"], 4),
         "met": ij["after"]["data_wait_fraction"] < 0.05},
        {"target": "input-bound script named input-bound (every run)", "value": isc["bottleneck_each_run"],
         "met": all(n == "input-bound" for n in isc["bottleneck_each_run"])},
        {"target": "input-bound script: fix applied by hand, tokens/s ≥ 2× (measured)",
         "value": round(isc["gain"], 2), "met": isc["gain"] >= 2.0},
        {"target": "input-bound script: data wait after < 5 % (measured, median)",
         "value": round(isc["after"]["data_wait_fraction"]["median"], 4),
         "met": isc["after"]["data_wait_fraction"]["median"] < 0.05},
        {"target": "launch-bound job named launch-bound", "value": r["launch_bound_job"]["bottleneck"],
         "met": r["launch_bound_job"]["bottleneck"] == "launch-bound"},
        {"target": "launch-bound script named launch-bound (every run)",
         "value": r["launch_bound_script"]["bottleneck_each_run"],
         "met": all(n == "launch-bound" for n in r["launch_bound_script"]["bottleneck_each_run"])},
        {"target": "sync-bound script named sync-bound (every run)",
         "value": r["sync_bound_script"]["bottleneck_each_run"],
         "met": all(n == "sync-bound" for n in r["sync_bound_script"]["bottleneck_each_run"])},
        {"target": "doctor overhead ≤ 3 % of a measured step (its own measure, worst run)",
         "value": {k: round(v, 4) for k, v in overheads.items()}, "met": max(overheads.values()) <= 0.03},
    ]


def pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f} %"


def tps(d: dict[str, float]) -> str:
    return f"{d['median']:,.0f} ({d['min']:,.0f}–{d['max']:,.0f})"


def ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def markdown(r: dict[str, Any]) -> str:
    ij, lj = r["input_bound_job"], r["launch_bound_job"]
    jb, ja = ij["before"], ij["after"]
    lines = [
        "# `trainfit doctor` targets (issue 6)", "",
        f"Measured {r['date']} on this {r['cpu_count']}-core CPU host, torch {r['torch']}, 1 torch thread, "
        f"{r['warmup']} warm-up + {r['steps']} measured steps per run, {r['repeats']} interleaved repeats. "
        f"Load average before {r['load_before']}, after {r['load_after']} (other engineers share the host). "
        f"Regenerate: `python benchmarks/doctor_targets.py` ({r['wall_s'] / 60:.0f} min). "
        "All numbers are measured unless a column says predicted.", "",
        "## Targets", "", "| target | value | met |", "|---|---|---|"]
    for t in r["targets"]:
        lines.append(f"| {t['target']} | {t['value']} | {'yes' if t['met'] else 'NO'} |")
    lines += [
        "", "## Input-bound, as a trainfit job (`doctor_jobs/input_bound.yaml`, fix applied by doctor)", "",
        "| | before (lazy tokenization) | after | change |", "|---|---|---|---|",
        f"| step time | {ms(jb['step_time_s'])} (spread {ms(jb['step_time_spread_s'])}) | "
        f"{ms(ja['step_time_s'])} (spread {ms(ja['step_time_spread_s'])}) | "
        f"{ja['step_time_s'] / jb['step_time_s']:.2f}× |",
        f"| tokens/s | {jb['tokens_per_s']:,.0f} (spread {jb['tokens_per_s_spread']:,.0f}) | "
        f"{ja['tokens_per_s']:,.0f} (spread {ja['tokens_per_s_spread']:,.0f}) | {ij['gain']:.2f}× |",
        f"| data wait | {pct(jb['data_wait_fraction'])} | {pct(ja['data_wait_fraction'])} | |",
        "", f"Spread = max − min of the {r['repeats']} rounds' medians. Named: {ij['named']} "
        f"(predicted gain {pct(ij['predicted_gain_fraction'])}). Applied:", ""]
    lines += [f"- {a}" for a in ij["applied"]] + [f"- note: {n}" for n in ij["notes"]]
    lines += ["", f"After the fix the step is named {ij['after_named'][:1]}: the next bottleneck.", "",
              "## Scripts run as `trainfit doctor -- python doctor_jobs/<name>.py` "
              "(fix applied by hand as `--fixed`)", "",
              "| script | named (each run) | predicted gain of the fix | tokens/s before | "
              "tokens/s with the fix | gain | data wait before → after | doctor overhead (max) |",
              "|---|---|---|---|---|---|---|---|"]
    keys = ("input_bound_script", "launch_bound_script", "sync_bound_script")
    for key in keys:
        s = r[key]
        wait = s["before"]["data_wait_fraction"]["median"], s["after"]["data_wait_fraction"]["median"]
        lines.append(f"| {key.removesuffix('_script')} | {', '.join(s['bottleneck_each_run'])} | "
                     f"{pct(s['predicted_gain_fraction'])} | {tps(s['before']['tokens_per_s'])} | "
                     f"{tps(s['after']['tokens_per_s'])} | {s['gain']:.2f}× | {pct(wait[0])} → "
                     f"{pct(wait[1])} | {pct(s['overhead_fraction']['max'])} |")
    lines += ["", "tokens/s: median (min–max) of 3 runs; a run = the doctor's median over its measured "
              "steps. The launch-bound prediction is for the fix it names (a 4× micro-batch); the "
              "`--fixed` script goes to 16×.", "", "Fixes named:", ""]
    for key in keys:
        s = r[key]
        lines.append(f"- **{s['bottleneck']}** ({key.removesuffix('_script')}): {s['fix']}")
    lb, la = lj["before"], lj["after"]
    lines += [
        "", "## Launch-bound, as a trainfit job (`doctor_jobs/launch_bound.yaml`)", "",
        f"Named {lj['named']}; applied: {'; '.join(lj['applied']) or 'nothing'}. tokens/s "
        f"{lb['tokens_per_s']:,.0f} → {la['tokens_per_s']:,.0f} ({lj['gain']:.2f}×, spreads "
        f"{lb['tokens_per_s_spread']:,.0f} / {la['tokens_per_s_spread']:,.0f}).",
        "", "## Doctor's overhead", "",
        "Its own figure (hook calls × the timed cost of one call, + the sampler thread's CPU time, per "
        "measured step) is in the tables above. The check below times each script with its own clock, "
        "with and without the doctor (interleaved), over the doctor's measured window; CPU timing "
        "moves by up to ~35 % between repeats here, so this check only bounds the overhead within "
        f"that noise ({r.get('ab_repeats', 3)} pairs each, median of the pairs' medians).", "",
        "| script | own step time, plain | own step time, under doctor | A/B difference | "
        "pairwise (min–max) |", "|---|---|---|---|---|"]
    for name, o in r["overhead_ab"].items():
        lines.append(f"| {name} | {ms(o['plain_step_s']['median'])} | {ms(o['doctored_step_s']['median'])} | "
                     f"{pct(o['ab_overhead_fraction'])} | {pct(o['pairwise_fraction']['min'])} – "
                     f"{pct(o['pairwise_fraction']['max'])} |")
    lines += [
        "", "## How the jobs are made input-bound on a CPU", "",
        "Seed 003's A6000 computes a GPT-2-medium token in ~50 ns; a pure-Python tokenizer spends "
        "~1 µs per token, so the loader dominates. On this CPU the same model would compute for "
        "milliseconds per token, so the benchmark shrinks the model (hidden 16, 1 layer) and keeps "
        "the real loader: ByT5's tokenizer (pure Python, `transformers.ByT5Tokenizer`) tokenizing each "
        "row in `__getitem__`. The data-to-compute ratio stays below a GPU's: the emulation is "
        "conservative. The sync-bound script keeps a per-token loss table in Python "
        "(`table[tok.item()] += val.item()` every micro-step): on this CPU each `.item()` costs only "
        "its host work, on a GPU each one also drains the kernel queue.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
