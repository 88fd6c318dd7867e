"""plan's host measurement on a shared machine: the machine's drift, a neighbour, and what it says.

``trainfit.speed.host`` times one micro-step of the job's code at a tiny width on this CPU (the
host side of a launch-bound GPU step; ``trainfit.speed.host_timing``: the step in reference ops,
the load read).  This measures, for two code paths of the throughput benchmark
(``speed_cases``: BERT-large AMP fp16 with checkpointing, the V100 rows; Llama-2-7B LoRA with
checkpointing), the same measurement (``host._measure``) in two conditions that alternate
``PAIRS`` times:

* **quiet**: nothing else running (run it on an otherwise idle machine);
* **neighbour**: one other process multiplying 512 × 512 fp32 matrices on one thread.

Each condition is measured twice per pair: as plan measures (torch's intra-op pool at one
thread, ``host.one_thread``) and with the pool at the machine's thread count (what plan did
before: some of the tiny step's ops open an OpenMP parallel region whose join waits for the
pool's thread on the core the neighbour holds).

Per measurement: the fastest repeat as timed (CPU seconds, at the machine's speed then), the
step's cost in reference ops, the median reference op, the load the measurement read
(``busy_cores`` of ``cpus``) and whether it marked itself busy.  The quiet rows show the
machine's own drift (the seconds move far more than the reference ops); the neighbour rows show
what a neighbour adds to the cost in reference ops at either pool size, and that it is read as
load; and what plan reads (the cost × the machine's reference after the run).

Run: ``python benchmarks/host_busy.py`` → results/host_busy.{json,md} (~8 min, idle machine).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
CASES = ("hf_perf_gpu_one_bert_large_bs1_ga4_gc_fp16_adamw",
         "katheryne_1xrtx3090_llama2-7b_lora_bs2_s512")
PAIRS = 4
NEIGHBOUR = ("import torch, time\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\n"
             "t = time.time()\nwhile time.time() - t < 600: a @ a\n")


def reference_over_view(pairs: int = 200) -> dict[str, float]:
    """The reference op over a view op (a dispatcher call, no kernel), timed in interleaved
    pairs: how ``H100_HOST_REFERENCE_OP_S`` is derived from the H100 host's view op."""
    import torch

    from trainfit.speed.host_timing import reference_op_s

    m = torch.randn(8, 8)

    def view_s(n: int = 2000) -> float:
        t0 = time.thread_time()
        for _ in range(n):
            m.transpose(0, 1)
        return (time.thread_time() - t0) / n
    ratios, refs, views = [], [], []
    for _ in range(pairs):
        v0, r, v1 = view_s(), reference_op_s(), view_s()
        ratios.append(r / ((v0 + v1) / 2))
        refs.append(r)
        views.append(v0)
    q = statistics.quantiles(ratios, n=10)
    return {"pairs": pairs, "median": statistics.median(ratios), "p10": q[0], "p90": q[-1],
            "reference_op_s_median": statistics.median(refs),
            "view_s_median": statistics.median(views)}


def _case(case_id: str) -> tuple[Any, Any, Any, Any]:
    sys.path.insert(0, str(ROOT))
    from speed_cases import build_source, load_cases, map_case
    from trainfit.job import JobSpec
    from trainfit.speed import host

    for file, c in load_cases():
        if c["id"] == case_id:
            m = map_case(file, c)
            src = build_source(m.model)
            job = JobSpec(model=src.name, **m.job)
            return host.tiny_job(job, host.TOKENS), src, host.shrunk_config(src.config), job
    raise SystemExit(f"host_busy: no case {case_id}")


def measure_once(tj: Any, src: Any, cfg: Any, pool: bool = False) -> dict[str, Any]:
    """plan's measurement: on one intra-op thread, or (``pool``) with torch's pool at the
    machine's thread count, as ``host._measure`` takes either."""
    from trainfit.speed import host

    hs = host._measure(tj, src, cfg, pool)
    assert hs is not None, "the tiny step did not run"
    hs.at_machine_speed()  # as plan reads it: a quiet measurement may lower the reference
    return {"fastest_s": hs.fastest_s, "step_ops": hs.step_ops,
            "reference_op_s": hs.reference_op_s, "busy_cores": hs.busy_cores, "cpus": hs.cpus,
            "busy": hs.busy, "kernels": hs.kernels, "at": time.strftime("%H:%M:%S")}


def run() -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    import torch

    from trainfit.speed import host_timing as ht
    from trainfit.speed.cpu import cpu_model_name

    pool = torch.get_num_threads()
    out: dict[str, Any] = {"cpu": cpu_model_name(), "cpus": len(ht.allowed_cpus()),
                           "busy_share": ht.BUSY_SHARE, "load_window_s": ht.LOAD_WINDOW_S,
                           "busy_rounds": ht.BUSY_ROUNDS, "pairs": PAIRS, "pool_threads": pool,
                           "cases": {}}
    for case_id in CASES:
        tj, src, cfg, job = _case(case_id)
        runs: dict[str, list[dict[str, Any]]] = {"quiet": [], "neighbour": []}
        pooled: dict[str, list[dict[str, Any]]] = {"quiet": [], "neighbour": []}
        for i in range(PAIRS):
            # the two pool sizes in alternating order (ABBA), so the machine's drift within a
            # pair does not fall on one of them
            order = ((runs, False), (pooled, True)) if i % 2 == 0 else \
                ((pooled, True), (runs, False))
            for into, use_pool in order:
                into["quiet"].append(measure_once(tj, src, cfg, use_pool))
            spin = subprocess.Popen([sys.executable, "-c", NEIGHBOUR])
            try:
                time.sleep(1.0)  # its interpreter and torch imported, the loop running
                for into, use_pool in order:
                    into["neighbour"].append(measure_once(tj, src, cfg, use_pool))
            finally:
                spin.kill()
                spin.wait()
            time.sleep(0.5)
        pmed = {c: statistics.median(r["step_ops"] for r in pooled[c]) for c in pooled}
        med = {k: {c: statistics.median(r[k] for r in runs[c]) for c in runs}
               for k in ("fastest_s", "step_ops", "reference_op_s")}
        out["cases"][case_id] = {
            "job": {k: getattr(job, k) for k in ("method", "precision", "grad_ckpt")},
            "runs": runs, "medians": med, "pool_runs": pooled,
            "pool_step_ops_medians": pmed,
            "pool_neighbour_step_ops_over_quiet": pmed["neighbour"] / pmed["quiet"],
            "one_thread_over_pool_quiet_step_ops": med["step_ops"]["quiet"] / pmed["quiet"],
            "one_thread_over_pool_quiet_by_pair": [
                a["step_ops"] / b["step_ops"]
                for a, b in zip(runs["quiet"], pooled["quiet"], strict=True)],
            "pool_quiet_reference_op_s_median": statistics.median(
                r["reference_op_s"] for r in pooled["quiet"]),
            "quiet_fastest_s_range": [min(r["fastest_s"] for r in runs["quiet"]),
                                      max(r["fastest_s"] for r in runs["quiet"])],
            "quiet_step_ops_range": [min(r["step_ops"] for r in runs["quiet"]),
                                     max(r["step_ops"] for r in runs["quiet"])],
            "neighbour_step_ops_over_quiet": med["step_ops"]["neighbour"]
            / med["step_ops"]["quiet"],
            "neighbour_fastest_over_quiet": med["fastest_s"]["neighbour"]
            / med["fastest_s"]["quiet"],
            "quiet_marked_busy": sum(r["busy"] for r in runs["quiet"]),
            "neighbour_marked_busy": sum(r["busy"] for r in runs["neighbour"]),
        }
        print(case_id, json.dumps({k: v for k, v in out["cases"][case_id].items()
                                   if k not in ("runs", "pool_runs", "job")}), flush=True)
    out["reference_over_view"] = reference_over_view()
    ref = ht.machine_reference_op_s()
    out["machine_reference_op_s"] = ref
    for c in out["cases"].values():
        c["quiet_fb_s_at_machine_reference"] = [r["step_ops"] * ref for r in c["runs"]["quiet"]]
    return out


def render(doc: dict[str, Any]) -> str:
    L = ["# plan's host measurement on a shared machine", "",
         "Regenerate: `python benchmarks/host_busy.py` (idle machine, ~8 min). The host time of a "
         "launch-bound step is the step's own code run at a tiny width on this CPU "
         "(`trainfit/speed/host.py`, `host_timing.py`): CPU time of the thread per repeat, over "
         "the reference loops timed before and after it (cost in reference ops, the median), "
         "read in seconds at the fastest reference this machine has run. Here it is measured "
         f"{doc['pairs']} times quiet and {doc['pairs']} times beside a neighbour (one process "
         "multiplying 512 × 512 fp32 matrices on one thread), alternating; each time as plan "
         "measures (torch's intra-op pool at 1 thread) and with the pool at the machine's "
         f"{doc.get('pool_threads', '?')} threads (plan before one_thread). busy = other "
         f"processes took more than {doc['busy_share']:.1%} of the {doc['cpus']} CPUs over "
         f"≥ {doc['load_window_s']} s in every one of up to {doc['busy_rounds']} rounds. "
         f"CPU: {doc['cpu']}. All figures measured.", "",
         "| case | condition | pool threads | time | fastest repeat (ms, as timed) | "
         "cost (reference ops) | median reference op (µs) | load read (cores) | marked busy |",
         "|---|---|---|---|---|---|---|---|---|"]
    for cid, c in doc["cases"].items():
        j = c["job"]
        for runs, threads in ((c["runs"], "1 (plan)"),
                              (c.get("pool_runs", {}), str(doc.get("pool_threads")))):
            for cond in ("quiet", "neighbour"):
                for r in runs.get(cond, []):
                    L.append(f"| {cid} ({j['method']} {j['precision']} ckpt {j['grad_ckpt']}) | "
                             f"{cond} | {threads} | {r['at']} | {r['fastest_s'] * 1e3:.1f} | "
                             f"{r['step_ops']:,.0f} | {r['reference_op_s'] * 1e6:.2f} | "
                             f"{r['busy_cores']:.2f} | {'yes' if r['busy'] else 'no'} |")
    rv = doc["reference_over_view"]
    L += ["", f"Reference op over a view op (`m.transpose`, a dispatcher call with no kernel), "
          f"{rv['pairs']} interleaved pairs: median {rv['median']:.2f}, p10 {rv['p10']:.2f}, p90 "
          f"{rv['p90']:.2f} (reference {rv['reference_op_s_median'] * 1e6:.2f} µs, view "
          f"{rv['view_s_median'] * 1e6:.2f} µs, medians): × the H100 host's view op (2.50 µs, "
          "results/gpu_launch.json) gives its reference op, `H100_HOST_REFERENCE_OP_S`."]
    L += ["", f"Machine reference after the run (the lowest median reference of a quiet "
          f"measurement here): {doc['machine_reference_op_s'] * 1e6:.2f} µs per op.", "",
          "| case | quiet: fastest repeat (ms), lowest … highest | quiet: cost (reference "
          "ops), lowest … highest | quiet: what plan reads (ms: cost × machine reference) | "
          "neighbour / quiet: fastest repeat | neighbour / quiet: cost | "
          "marked busy: quiet / neighbour | pool at the machine's threads: neighbour / quiet "
          "cost | quiet cost: 1 thread / the pool (median; by pair) | quiet median reference op "
          "(µs): 1 thread / the pool |", "|---|---|---|---|---|---|---|---|---|---|"]
    for cid, c in doc["cases"].items():
        lo, hi = c["quiet_fastest_s_range"]
        olo, ohi = c["quiet_step_ops_range"]
        fb = c["quiet_fb_s_at_machine_reference"]
        L.append(f"| {cid} | {lo * 1e3:.1f} … {hi * 1e3:.1f} | {olo:,.0f} … {ohi:,.0f} | "
                 f"{min(fb) * 1e3:.1f} … {max(fb) * 1e3:.1f} | "
                 f"{c['neighbour_fastest_over_quiet']:.2f}× | "
                 f"{c['neighbour_step_ops_over_quiet']:.2f}× | {c['quiet_marked_busy']} of "
                 f"{doc['pairs']} / {c['neighbour_marked_busy']} of {doc['pairs']} | "
                 f"{c['pool_neighbour_step_ops_over_quiet']:.2f}× | "
                 f"{c['one_thread_over_pool_quiet_step_ops']:.2f}; "
                 + ", ".join(f"{x:.2f}" for x in c.get("one_thread_over_pool_quiet_by_pair", []))
                 + f" | {c['medians']['reference_op_s']['quiet'] * 1e6:.1f} / "
                 f"{c.get('pool_quiet_reference_op_s_median', 0) * 1e6:.1f} |")
    return "\n".join(L) + "\n"


def main() -> int:
    doc = run()
    OUT.mkdir(exist_ok=True)
    (OUT / "host_busy.json").write_text(json.dumps(doc, indent=1))
    (OUT / "host_busy.md").write_text(render(doc))
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
