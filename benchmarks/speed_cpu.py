"""Predicted vs measured step time of real training steps on this CPU.

The CPU is measured once (GEMM rate curve, bandwidth, eager op cost: trainfit.speed.cpu), the
step's operations are recorded from a full-size data-less simulation with CPU semantics, and the
same roofline that predicts GPUs predicts the step time.  Ground truth: the real step (same
train_step) on real tensors, 2 warm-up then 5 timed optimizer steps, median; the whole grid is run
twice, interleaved, and the median of the two medians is compared (timing noise on this 2-core
machine reaches ~35 %, docs/notes/cpu-timing-noise.md; the spread is reported).

Run: ``python benchmarks/speed_cpu.py`` → results/speed_cpu.{json,md} (~5 min).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results"
SEQ = 256


def grid() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for model in ("llama-h256-l4", "gpt2-h256-l4", "t5-d256-l3"):
        for mb, ckpt in itertools.product((1, 4, 8), ("off", "full")):
            out.append((model, {"method": "full", "micro_batch": mb, "grad_ckpt": ckpt}))
        for mb in (2, 8):
            out.append((model, {"method": "lora", "micro_batch": mb, "grad_ckpt": "off"}))
    return out


def measure(job: Any, source: Any, steps: int = 5, warmup: int = 2) -> float:

    from trainfit.engine.step import repeat_batches, train_step
    from trainfit.memory.cpu_truth import materialize_on_cpu
    from trainfit.model.batch import make_batch
    from trainfit.model.workload import build_model_on_meta, make_optimizer

    model, _ = build_model_on_meta(job, source)
    materialize_on_cpu(model)
    opt = make_optimizer(job, [p for p in model.parameters() if p.requires_grad], simulate=False)
    batch = make_batch(source, job.micro_batch, job.seq_len)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        train_step(model, opt, repeat_batches(batch, job.grad_accum), grad_accum=job.grad_accum,
                   autocast=contextlib.nullcontext, max_grad_norm=job.max_grad_norm)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cpu_truth import models  # the same small models as the memory benchmark
    from trainfit.job import JobSpec
    from trainfit.memory.simulate import SimTarget, simulate_step
    from trainfit.speed.cpu import cpu_speed
    from trainfit.speed.host import host_step
    from trainfit.speed.ops import OpRecorder
    from trainfit.speed.predict import model_flops_per_token, predict_speed_exact

    dev = cpu_speed()
    srcs = models()
    rows = []
    for name, kw in grid():
        job = JobSpec(model=name, seq_len=SEQ, precision="fp32", grad_accum=1, **kw)
        rec = OpRecorder(replay=True)
        sim = simulate_step(job, srcs[name], SimTarget(device="cpu"), op_hook=rec)
        fpt = model_flops_per_token(srcs[name].config, sim.total_params, sim.trainable_params,
                                    SEQ, job.method == "full")
        pred = predict_speed_exact(dev, rec.ops, job.micro_batch, 1, SEQ, 1, fpt,
                                   host=host_step(job, srcs[name], pool=True))
        rows.append({"model": name, "config": kw, "job": job, "predicted_step_s": pred.step_time_s,
                     "measured": []})
    for _ in range(2):  # interleaved repeats
        for r in rows:
            r["measured"].append(measure(r["job"], srcs[r["model"]]))
    for r in rows:
        r["measured_step_s"] = statistics.median(r["measured"])
        r["spread"] = (max(r["measured"]) - min(r["measured"])) / r["measured_step_s"]
        r["error"] = r["predicted_step_s"] / r["measured_step_s"] - 1
        del r["job"]
        print(f"{r['model']:14s} {r['config']} pred {r['predicted_step_s']:.3f}s "
              f"meas {r['measured_step_s']:.3f}s {r['error']:+.1%}", flush=True)
    agree = total = 0
    for a, b in itertools.combinations(rows, 2):
        if a["model"] != b["model"]:
            continue
        ma, mb = a["measured_step_s"], b["measured_step_s"]
        if abs(ma - mb) / min(ma, mb) > 0.10:
            total += 1
            agree += (ma < mb) == (a["predicted_step_s"] < b["predicted_step_s"])
    errs = [abs(r["error"]) for r in rows]
    summary = {"configs": len(rows), "median_abs_error": statistics.median(errs),
               "max_abs_error": max(errs), "order_pairs_gt_10pct": total,
               "order_agreement": agree / total if total else None, "device": dev.source}
    OUT.mkdir(exist_ok=True)
    (OUT / "speed_cpu.json").write_text(json.dumps({"summary": summary, "results": rows}, indent=1))
    lines = ["# Predicted vs measured step time on this CPU", "",
             "Regenerate: `python benchmarks/speed_cpu.py`. fp32, seq 256, AdamW (fused), "
             "2 interleaved repeats of (2 warm-up + 5 timed steps, median).", "",
             f"- {summary['configs']} configurations, 3 models: median |error| "
             f"{summary['median_abs_error']:.1%}, max {summary['max_abs_error']:.1%}",
             f"- order of pairs whose measured times differ by > 10 %: {agree} of {total} correct",
             f"- device: {dev.source}", "",
             "| model | configuration | measured step (s) | spread | predicted step (s) | error |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        lines.append(f"| {r['model']} | {cfg} | {r['measured_step_s']:.3f} | {r['spread']:.0%} | "
                     f"{r['predicted_step_s']:.3f} | {r['error']:+.1%} |")
    (OUT / "speed_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
