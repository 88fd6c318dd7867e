"""Overhead of the monitor's sampler on a real CPU training loop, and the cost of its two entry points.

A tiny Llama (hidden 128, 2 layers, vocab 2000) trained with AdamW on random tokens, 4 × 128 tokens per
step. Arm "off": the plain loop. Arm "on": the same loop with a ``Sampler`` (interval 0.5 s, JSONL log)
running in its thread and ``record_step`` called every step with every field. The arms alternate in pairs
whose order flips every pair (on/off, off/on, ...) so a drift of the machine hits both alike; timing on
this 2-core machine moves by up to ~35 % between repeats (docs/notes/cpu-timing-noise.md), so the
overhead of the loop is reported per pair with its spread and the stable figures are the direct timings
of ``record_step`` and ``sample_once`` (µs, median of batches) and the CPU time the sampler thread used.

No GPU here: ``sample_once`` runs without NVML (psutil and the log only); NVML calls are not measured.

Run: ``python benchmarks/monitor_overhead.py`` → results/monitor_overhead.{json,md} (~2 min, quiet machine).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results"
PAIRS = 40
STEPS_PER_RUN = 20  # < 1 s per run: short runs, many pairs, so both arms meet the same load
WARMUP_STEPS = 5
INTERVAL_S = 0.5
CLEAN_FACTOR = 1.5
MICRO_BATCH, SEQ_LEN, VOCAB = 4, 128, 2000


def cpu_name() -> str:
    from trainfit.speed.cpu import cpu_model_name

    return cpu_model_name()


def build() -> tuple[Any, Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [torch.randint(0, VOCAB, (MICRO_BATCH, SEQ_LEN)) for _ in range(8)]
    return model, opt, batches


def run(model: Any, opt: Any, batches: list[Any], steps: int,
        sampler: Any | None) -> list[float]:
    """``steps`` optimizer steps; returns each step's wall time (s), measured with perf_counter."""
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        batch = batches[i % len(batches)]
        t_data = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        t1 = time.perf_counter()
        if sampler is not None:
            sampler.record_step(step=i, loss=loss_value, tokens=MICRO_BATCH * SEQ_LEN, samples=MICRO_BATCH,
                                step_time_s=t1 - t0, data_wait_s=t_data - t0, mfu=None,
                                peak_allocated_bytes=None, peak_reserved_bytes=None)
        times.append(time.perf_counter() - t0)  # includes record_step: its cost is part of the overhead
    return times


def time_record_step(batches: int = 7, calls: int = 50_000) -> list[float]:
    """Per-call µs of record_step, one value per batch (sampler not started: the call itself)."""
    from trainfit.monitor import Sampler

    s = Sampler(live=False)
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for i in range(calls):
            s.record_step(step=i, loss=2.0, tokens=512, samples=4, step_time_s=0.05, data_wait_s=0.001,
                          mfu=0.3, peak_allocated_bytes=1 << 30, peak_reserved_bytes=1 << 31)
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out


def time_sample_once(log_dir: Path, batches: int = 7, calls: int = 40) -> list[float]:
    """Per-call µs of sample_once with a JSONL log, following this process (one value per batch)."""
    from trainfit.monitor import Sampler

    s = Sampler(live=False, log_path=log_dir / "sample_once.jsonl")
    s.sample_once()  # the first sample waits for a measurable CPU-percent window: not timed
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for i in range(calls):
            s.record_step(step=i, loss=2.0, tokens=512, samples=4, step_time_s=0.05)
            s.sample_once()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    s.stop()
    return out


def spread(values: list[float]) -> tuple[float, float]:
    return min(values), max(values)


def quartiles(values: list[float]) -> list[float]:
    """25th and 75th percentiles: the middle half, which a few pairs hit by other load do not stretch."""
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def main() -> int:
    warnings.filterwarnings("ignore")
    import torch

    from trainfit.monitor import Sampler

    load_before = os.getloadavg()[0]
    model, opt, batches = build()
    run(model, opt, batches, WARMUP_STEPS, None)
    log_dir = Path(tempfile.mkdtemp(prefix="monitor_overhead_"))
    per_run: list[dict[str, Any]] = []
    sampler_cpu_s = sampler_wall_s = 0.0
    samples_taken = 0
    for pair in range(PAIRS):
        order = ("on", "off") if pair % 2 == 0 else ("off", "on")
        for arm in order:
            if arm == "on":
                s = Sampler(interval_s=INTERVAL_S, log_path=log_dir / f"run{pair}.jsonl", live=False)
                t0 = time.perf_counter()
                s.start()
                times = run(model, opt, batches, STEPS_PER_RUN, s)
                s.stop()
                sampler_wall_s += time.perf_counter() - t0
                sampler_cpu_s += s.sample_cpu_s
                samples_taken += s.samples
            else:
                times = run(model, opt, batches, STEPS_PER_RUN, None)
            per_run.append({"pair": pair, "arm": arm, "median_step_s": statistics.median(times),
                            "max_step_s": max(times), "steps": len(times)})
            print(f"pair {pair} {arm:3s}: median step {per_run[-1]['median_step_s'] * 1e3:.1f} ms "
                  "(measured)", flush=True)

    med = {arm: statistics.median(r["median_step_s"] for r in per_run if r["arm"] == arm)
           for arm in ("on", "off")}
    pair_overhead = []
    for pair in range(PAIRS):
        on = next(r for r in per_run if r["pair"] == pair and r["arm"] == "on")
        off = next(r for r in per_run if r["pair"] == pair and r["arm"] == "off")
        pair_overhead.append((on["median_step_s"] / off["median_step_s"] - 1.0) * 100.0)
    # Pairs that other processes hit: either arm slower than CLEAN_FACTOR × the fastest run. Reported
    # apart (not hidden): the question is the sampler's cost, not what else ran on the machine.
    fastest_s = min(r["median_step_s"] for r in per_run)
    clean = [pair_overhead[p] for p in range(PAIRS)
             if all(r["median_step_s"] <= CLEAN_FACTOR * fastest_s for r in per_run if r["pair"] == p)]
    arm_spread = {}
    for arm in ("on", "off"):
        v = [r["median_step_s"] for r in per_run if r["arm"] == arm]
        arm_spread[arm] = (max(v) / min(v) - 1.0) * 100.0

    rec_us = time_record_step()
    samp_us = time_sample_once(log_dir)
    rec_med, samp_med = statistics.median(rec_us), statistics.median(samp_us)
    # What the direct costs predict: one record_step per step, one sample_once per interval.
    expected_percent = (rec_med * 1e-6 / med["off"] + samp_med * 1e-6 / INTERVAL_S) * 100.0
    result = {
        "kind": "benchmark", "name": "monitor_overhead",
        "device": f"{cpu_name()} ({torch.get_num_threads()} torch threads), no GPU",
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        # Other work on this shared 2-core machine shows here: a load above 2 means the loop competed.
        "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
        "python": sys.version.split()[0], "torch": torch.__version__,
        "workload": {"model": "LlamaForCausalLM hidden 128, 2 layers, vocab 2000", "optimizer": "AdamW",
                     "micro_batch": MICRO_BATCH, "seq_len": SEQ_LEN, "steps_per_run": STEPS_PER_RUN,
                     "pairs": PAIRS, "interval_s": INTERVAL_S, "log": "jsonl"},
        "step_time_off_s": med["off"], "step_time_on_s": med["on"],
        "overhead_percent": (med["on"] / med["off"] - 1.0) * 100.0,
        "overhead_percent_per_pair": pair_overhead,
        "overhead_percent_per_pair_median": statistics.median(pair_overhead),
        "overhead_percent_per_pair_spread": spread(pair_overhead),
        "overhead_percent_per_pair_quartiles": quartiles(pair_overhead),
        "clean_pairs": len(clean), "clean_factor": CLEAN_FACTOR,
        "overhead_percent_clean_pairs_median": statistics.median(clean) if clean else None,
        "overhead_percent_clean_pairs_spread": list(spread(clean)) if clean else None,
        "run_to_run_spread_percent": arm_spread,
        "record_step_us": rec_med, "record_step_us_spread": spread(rec_us),
        "sample_once_us": samp_med, "sample_once_us_spread": spread(samp_us),
        "sampler_thread_cpu_fraction": sampler_cpu_s / sampler_wall_s if sampler_wall_s else None,
        "samples_taken": samples_taken,
        "expected_overhead_percent": expected_percent,
        "runs": per_run,
    }
    OUT.mkdir(exist_ok=True)
    result["overhead_percent_per_pair_spread"] = list(result["overhead_percent_per_pair_spread"])
    (OUT / "monitor_overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    (OUT / "monitor_overhead.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def _pct(r: dict[str, Any], what: str) -> str:
    v = r[f"overhead_percent_clean_pairs_{what}"]
    if v is None:
        return "n/a"
    return f"{v:+.2f} %" if what == "median" else f"{v[0]:+.2f} % … {v[1]:+.2f} %"


def markdown(r: dict[str, Any]) -> str:
    w = r["workload"]
    lo, hi = r["overhead_percent_per_pair_spread"]
    rlo, rhi = r["record_step_us_spread"]
    slo, shi = r["sample_once_us_spread"]
    q1, q3 = r["overhead_percent_per_pair_quartiles"]
    lines = [
        "# Monitor overhead (measured)", "",
        "Regenerate: `python benchmarks/monitor_overhead.py`. "
        f"{w['model']}, {w['optimizer']}, {w['micro_batch']} × {w['seq_len']} tokens per step, "
        f"{w['pairs']} pairs of runs (sampler on / off, order flipped every pair) × {w['steps_per_run']} "
        f"steps, sampler interval {w['interval_s']} s with a {w['log']} log and `record_step` every step.",
        f"Device: {r['device']}, measured {r['measured_at']}; 1-minute load average before / after "
        f"{r['load_average_1min_before_after'][0]:.1f} / {r['load_average_1min_before_after'][1]:.1f} "
        "(2 cores: above 2, other processes competed with the loop).", "",
        f"**Summary:** the direct costs predict {r['expected_overhead_percent']:.2f} % of step time and the "
        f"sampler thread used {r['sampler_thread_cpu_fraction'] * 100:.2f} % of one core (target ≤ 1 %); the "
        f"loop A/B measured {r['overhead_percent_per_pair_median']:+.2f} % per pair (median), "
        f"middle half {q1:+.2f} % … {q3:+.2f} %: timing noise on this shared 2-core machine is larger than "
        "the effect, so the A/B bounds it rather than resolves it.", "",
        "## Training loop, sampler on vs off", "",
        "| | median step time (ms, measured) |", "|---|---|",
        f"| off | {r['step_time_off_s'] * 1e3:.2f} |",
        f"| on | {r['step_time_on_s'] * 1e3:.2f} |", "",
        f"- overhead of the medians: **{r['overhead_percent']:+.2f} %** of step time; per pair median "
        f"{r['overhead_percent_per_pair_median']:+.2f} %, middle half {q1:+.2f} % … {q3:+.2f} %, "
        f"full spread {lo:+.2f} % … {hi:+.2f} % (every pair in the JSON).",
        f"- pairs where both arms ran within {r['clean_factor']} × the fastest run's median (the others "
        f"met other load): {r['clean_pairs']} of {w['pairs']}, per pair median {_pct(r, 'median')}, "
        f"spread {_pct(r, 'spread')}.",
        "- run-to-run spread of the median step time within one arm (max / min − 1): "
        f"off {r['run_to_run_spread_percent']['off']:.1f} %, on {r['run_to_run_spread_percent']['on']:.1f} %"
        " — a loop overhead smaller than this is noise here.",
        f"- sampler thread CPU time / wall time while it ran: "
        f"{r['sampler_thread_cpu_fraction'] * 100:.3f} % ({r['samples_taken']} samples).", "",
        "## Direct costs (the stable numbers)", "",
        "| call | median µs per call (measured) | spread over 7 batches (µs) |", "|---|---|---|",
        f"| `record_step` (every field) | {r['record_step_us']:.2f} | {rlo:.2f} … {rhi:.2f} |",
        f"| `sample_once` (psutil + process tree + JSONL write, no NVML) | {r['sample_once_us']:.0f} | "
        f"{slo:.0f} … {shi:.0f} |", "",
        f"Overhead these predict: record_step / step time + sample_once / interval = "
        f"**{r['expected_overhead_percent']:.3f} %** of step time (target ≤ 1 %).",
        "NVML readings are not included (no GPU on this machine).", "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
