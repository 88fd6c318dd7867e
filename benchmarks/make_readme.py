"""Regenerate ``benchmarks/README.md`` from ``benchmarks/results/*.json``.

The page puts trainfit next to the tools it replaces (accelerate ``estimate-memory`` and
``find_executable_batch_size``, HF ``auto_find_batch_size``, Lightning ``BatchSizeFinder``) and
summarizes the published and CPU ground truths. Every number comes from a results file written by
a benchmark script, so re-running the scripts and then this one keeps the page true; a results file
that does not exist yet is rendered as "not yet measured" with the command that produces it.
Lightning's ``BatchSizeFinder`` is measured by ``tune_targets.py`` (``lightning_finder.py``) when
Lightning is installed (``pip install -e .[bench]``); only while its results carry no Lightning run
are the project's notes quoted instead, labelled so.

Run: ``python benchmarks/make_readme.py`` (reads JSON only; < 1 s) → benchmarks/README.md
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from readme_format import NOTES, load, med, not_yet, pct, spread
from readme_lightning import lightning_section

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"

# (script, what it measures, result page); the order is the regeneration order: estimate_memory_compare
# reads calibration.json, so it runs after calibration.py
SCRIPTS: list[tuple[str, str, str]] = [
    ("cpu_truth.py", "simulated peak vs the same step run for real on this CPU (profiler alloc/free "
     "replay), {cpu_truth_configs} configurations: full / LoRA, fp32 / amp-bf16 / bf16-true, "
     "checkpointing, AdamW for-loop / foreach / fused, Adafactor, SGD, accumulation, chunked head, "
     "Llama / GPT-2 / T5", "results/cpu_truth.md"),
    ("calibration.py", "predicted vs published GPU measurements (`benchmarks/data/published.json`, "
     "{calibration_cases} cases: HF docs BERT-large on a V100, litgpt LoRA/QLoRA/full on an A10G), "
     "like-for-like peaks", "results/calibration.md"),
    ("heldout_memory.py", "predicted vs published peak memory of cases never used to build the model "
     "(`data/heldout_memory.json`: litgpt, torchtune, HF + peft + bitsandbytes with FSDP and "
     "DeepSpeed, Answer.AI fsdp_qlora; 1-8 GPUs), split single/multi-GPU × method",
     "results/heldout_memory.md"),
    ("litgpt_model_code.py", "lit-gpt's own phi-1.5 LoRA code (PyPI wheel) run on this CPU against "
     "trainfit's stand-in for the held-out lit-gpt cases: bytes held per token and layer, and per "
     "sample, against the published slope", "results/litgpt_model_code.md"),
    ("variable_length.py", "the reserve a step leaves when its micro-batches are padded to "
     "different lengths (torchtune 0.1's padded alpaca cases, full size, replayed through the "
     "allocator model) against the same step with every micro-batch at the cap",
     "results/variable_length.md"),
    ("bands.py", "the error band per kind of run from calibration + held-out errors "
     "(→ `src/trainfit/memory/bands.json`, which `plan` decides `fits` with), and what each fit "
     "rule says of the published outcomes", "results/bands.md"),
    ("invariants.py", "the invariants of `tests/plan/test_invariants.py` on the plans users "
     "reported, and extrapolated rows against full-size simulations", "results/invariants.md"),
    ("planner_speed.py", "`plan` over a {planner_configs}-configuration grid of Llama-2-7B LoRA, and "
     "extrapolated vs full-size simulation", "results/planner_speed.md"),
    ("speed_published.py", "predicted vs published tokens/s per GPU of every case it can map "
     "(`throughput_published.json`: {throughput_cases} cases with pinned configurations, and the "
     "held-out `data/throughput_heldout.json`; V100 to H100, 1 to 128 GPUs, split plain / "
     "fused-compiled / unsupported)", "results/speed_published.md"),
    ("speed_bands.py", "the speed error band per scale (1 / 2-7 / ≥ 8 GPUs, compiled) from "
     "speed_published's errors (→ `src/trainfit/speed/bands.json`, which `plan` states beside its "
     "tokens/s; speed_published.py runs it)", "results/speed_published.md"),
    ("speed_cpu.py", "predicted vs measured step time of real training steps on this CPU (3 models × 8 "
     "configurations, interleaved repeats)", "results/speed_cpu.md"),
    ("seed_plans.py", "the five seed scenarios planned → `examples/README.md`", "../examples/README.md"),
    ("monitor_overhead.py", "the monitor's sampler on a real CPU training loop (on/off pairs) and the "
     "direct cost of `record_step` / `sample_once`", "results/monitor_overhead.md"),
    ("tune_targets.py", "`tune` vs an exhaustive grid, vs accelerate's `find_executable_batch_size` and "
     "vs Lightning's `BatchSizeFinder` on real small models on this CPU with a memory limit",
     "results/tune_targets.md"),
    ("estimate_memory_compare.py", "accelerate `estimate-memory` vs trainfit `plan` vs the published "
     "GPU peaks (reads `calibration.json`; meta-device models only)", "results/estimate_memory_compare.md"),
    ("doctor_targets.py", "the doctor on the jobs in `doctor_jobs/`: diagnosis and the measured effect "
     "of its fix", "results/doctor_targets.md"),
    ("newcomer.py", "the README's commands as a newcomer runs them on a fresh clone (80- and 100-column "
     "terminal, piped): emit's seconds and validity, plan's header, cut numbers, rows shown, "
     "third-party noise, progress lines, the seeds' answers", "results/newcomer.md"),
    ("zero_hooks.py", "DeepSpeed ZeRO-2/3's hooks on one gloo rank of this CPU: the host cost a "
     "micro-step pays around the plain step (reference ops), fitted to the model's counts "
     "(module calls, partitioned parameters fetched, gradient hooks: `speed/zero_hooks.py`), and "
     "those counts against what DeepSpeed hooked", "results/zero_hooks.md"),
]

# cited from the transformers source, pinned in pyproject.toml
HF_CITATION = (
    "HF `Trainer(auto_find_batch_size=True)` is this same function: `Trainer.train` wraps "
    "`_inner_training_loop` in `transformers.trainer_utils.find_executable_batch_size("
    "self._inner_training_loop, self._train_batch_size, args.auto_find_batch_size)` "
    "(transformers 5.23.0 `trainer.py`), which returns "
    "`accelerate.utils.find_executable_batch_size(function=..., starting_batch_size=...)` "
    "(`trainer_utils.py`). accelerate 1.15.0 retries the whole step with the batch × 0.9 after each OOM; "
    "the batch it finds is the per-device batch, with no accumulation to keep the effective batch.")


def scripts_table(results: Path) -> list[str]:
    cal, cpu, plan = load(results, "calibration"), load(results, "cpu_truth"), load(results, "planner_speed")
    thr_path = HERE / "throughput_published.json"
    fill = {
        "cpu_truth_configs": cpu["summary"]["configs"] if cpu else "?",
        "calibration_cases": cal["summary"]["cases"] if cal else "?",
        "planner_configs": plan["summary"]["configurations"] if plan else "?",
        "throughput_cases": len(json.loads(thr_path.read_text())["cases"]) if thr_path.exists() else "?",
    }
    lines = ["| script | what it measures | result |", "|---|---|---|"]
    for script, what, page in SCRIPTS:
        produced = page.startswith("..") or (HERE / page).exists()
        link = f"[{page}]({page})" if produced else f"{page} (not yet produced)"
        lines.append(f"| `{script}` | {what.format(**fill)} | {link} |")
    return lines


def _error_summary(rows: list[dict], key: str) -> str:
    errs = [r["error"][key] for r in rows if r["error"][key] is not None]
    return (f"median |error| {pct(statistics.median(abs(e) for e in errs))}, "
            f"{sum(e < -0.05 for e in errs)} of {len(errs)} more than 5 % under") if errs else "n/a"


def gpu_line(results: Path) -> list[str]:
    """The scripts that need CUDA, outside the CPU regeneration loop (``gpu_run.sh`` runs them):
    a paragraph per device measured (``gpu_validate.json``, ``gpu_validate_<name>.json``)."""
    lines: list[str] = []
    for path in sorted(results.glob("gpu_validate*.json")):
        d, page = load(results, path.stem), f"results/{path.stem}.md"
        rows = [r for r in d["rows"] if r.get("error")]
        name = path.stem.removeprefix("gpu_validate_")
        lines += [
            f"`gpu_validate.py{' --name ' + name if name != path.stem else ''}` + `bash "
            f"gpu_run.sh` (need a CUDA device; measured once on a {d['device']}, torch "
            f"{d['torch']}; `--compare` re-scores the measurements anywhere): `plan`'s predicted "
            f"peaks and tokens/s against trainfit's probe of the same steps, {len(rows)} rows — "
            f"allocated {_error_summary(rows, 'allocated')}; reserved "
            f"{_error_summary(rows, 'reserved')}; device {_error_summary(rows, 'device')}; "
            f"tokens/s median |error| "
            f"{pct(statistics.median(abs(r['error']['tokens_per_s']) for r in rows))}. "
            f"[{page}]({page}).", ""]
    if not lines:
        return ["`gpu_validate.py` (needs a CUDA device): not yet measured — run "
                "`bash benchmarks/gpu_run.sh` where one is."]
    lines[-2] += (" Kernel rates, SDPA's choice and the host's cost per op: "
                  "[docs/notes/gpu-measurements.md](../docs/notes/gpu-measurements.md).")
    return lines[:-1]


def memory_section(results: Path) -> list[str]:
    lines = ["### Memory estimation: accelerate `estimate-memory` vs trainfit `plan` vs published GPU peaks",
             ""]
    d = load(results, "estimate_memory_compare")
    if d is None:
        return [*lines, not_yet("estimate_memory_compare.py"), ""]
    s, t, a = d["summary"], d["summary"]["trainfit"], d["summary"]["accelerate"]
    lines += [
        "Ground truth: the peaks published for real GPU runs (measured; "
        "`benchmarks/data/published.json`). trainfit: the like-for-like predicted peak of `plan`'s "
        "simulation (`max_memory_allocated` or "
        "nvidia-smi, as the source measured). accelerate: the \"Training using Adam\" figure its CLI prints "
        f"(accelerate {d['accelerate_version']}; float32 row for fp32 runs, float16 — its mixed-precision "
        "row — otherwise; weights + gradients + Adam states of the full model, no activations, no LoRA, "
        "no quantized training). Errors are predicted / measured − 1.", "",
        "| | accelerate `estimate-memory` (predicted) | trainfit `plan` (predicted) |", "|---|---|---|",
        f"| median \\|error\\| vs measured peak, {s['scored_high_medium']} scored cases | "
        f"{pct(a['median_abs_error'])} | {pct(t['median_abs_error'])} |",
        f"| max \\|error\\|, same cases | {pct(a['max_abs_error'])} | {pct(t['max_abs_error'])} |",
    ]
    for m in ("full", "lora", "qlora"):
        b = s[f"by_method_{m}"]
        lines.append(f"| median \\|error\\|, {m} ({b['scored']} cases) | "
                     f"{pct(b['accelerate_median_abs_error'])} | {pct(b['trainfit_median_abs_error'])} |")
    lines += [
        f"| right side of the GPU's capacity (fits / OOM), of {s['cases']} cases | "
        f"{a['right_side_of_capacity']} | {t['right_side_of_capacity']} |",
        f"| runs that fit (measured) called fitting, of {s['measured']} | {a['fits_called_fits']} | "
        f"{t['fits_called_fits']} |",
        f"| runs that ran out of memory called OOM, of {s['oom_cases']} | {a['oom_called_oom']} | "
        f"{t['oom_called_oom']} |",
        "| accounts for activations, batch, sequence, LoRA/QLoRA, allocator, CUDA context | no | yes |",
        "", "Selected cases (GiB; measured = published peak):", "",
        "| case | method | measured | trainfit predicted (error) | accelerate predicted (error) |",
        "|---|---|---|---|---|",
    ]
    by_id = {r["id"]: r for r in d["results"]}
    for cid in ("hf_perf_gpu_one_bert_large_bs4_fp32_adamw", "litgpt_confighub_A10G_tiny-llama_full",
                "litgpt_confighub_A10G_llama-2-7b_lora", "litgpt_confighub_A10G_llama-2-7b_qlora",
                "litgpt_confighub_A10G_llama-3.1-8b_full"):
        r = by_id.get(cid)
        if r is None:
            continue
        meas = "OOM" if r["oom_case"] else f"{r['measured_bytes'] / 2**30:.2f}"
        lines.append(f"| {cid} | {r['method']} | {meas} | {r['trainfit_predicted_bytes'] / 2**30:.2f} "
                     f"({pct(r['trainfit_error'], sign=True)}) | "
                     f"{r['accelerate_training_bytes'] / 2**30:.2f} "
                     f"({pct(r['accelerate_error'], sign=True)}) |")
    lines += ["", "Every case: [results/estimate_memory_compare.md](results/estimate_memory_compare.md).", ""]
    return lines


def _cfg(c: dict[str, Any]) -> str:
    return (f"{c['micro_batch']}×{c['grad_accum']}, ckpt {c['grad_ckpt']}, {c['optimizer_impl']}, "
            f"workers {c['num_workers']}")


def batch_section(results: Path) -> list[str]:
    lines = ["### Batch-size finding: accelerate `find_executable_batch_size` / HF `auto_find_batch_size` "
             "vs trainfit `tune`", "", HF_CITATION, ""]
    rows = load(results, "tune_targets")
    if rows is None:
        return [*lines, not_yet("tune_targets.py"), ""]
    lines += [
        "Measured by `tune_targets.py` on this CPU (real steps of real small models, fp32, AdamW, a memory "
        "limit as the CPU stand-in for a GPU's capacity; tokens/s re-measured interleaved, median of the "
        "repeats). Probe time = wall seconds spent probing (measured).", "",
        "| model | effective batch asked | accelerate: batch chosen | tries | probe time (s) | "
        "effective batch kept | tokens/s of its choice | trainfit tune: pick (micro×accum) | probes | "
        "probe time (s) | "
        "effective batch kept | tokens/s of the pick |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, p = r["accelerate"], r["pick"]
        eff = r.get("effective_batch")
        kept = "yes" if eff is None or p["micro_batch"] * p["grad_accum"] == eff else "no"
        tried = a["tried"]
        acc_tps, pick_tps = med(a.get("tokens_per_s_remeasured")), med(r["remeasured_pick_tokens_per_s"])
        lines.append(
            f"| {r['model']} | {eff if eff is not None else 'n/a'} | {a['chosen_batch']} | "
            f"{len(tried) if isinstance(tried, list) else tried} | {a['probe_time_s']:.1f} | "
            f"{'yes' if a['effective_batch_kept'] else 'no'} | "
            + ("n/a" if acc_tps is None else f"{acc_tps:,.0f}")
            + f" | {_cfg(p)} | {r['tune_probes']} | {r['tune_probe_time_s']:.1f} | {kept} | "
            + ("n/a" if pick_tps is None else f"{pick_tps:,.0f}") + " |")
    lines += ["", "tune against the exhaustive grid of the same knobs (measured):", "",
              "| model | grid probes | grid probe time (s) | tune probe time / grid's | grid best (finalists "
              "re-measured) | "
              "pick / grid best tokens/s | repeat noise (pick, best) | max \\|error\\| of tune's predicted "
              "peak vs measured |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['grid_probes']} | {r['grid_probe_time_s']:.1f} | "
                     f"{pct(r['tune_time_fraction_of_grid'], 0)} | {_cfg(r['grid_best'])} | "
                     f"{pct(r['pick_vs_best'])} | {pct(spread(r['remeasured_pick_tokens_per_s']), 0)}, "
                     f"{pct(spread(r.get('remeasured_best_tokens_per_s')), 0)} | "
                     f"{pct(r.get('memory_max_rel_error'), 2)} |")
    return [*lines, "", "accelerate's tokens/s are at the batch it found, with no accumulation: a different "
            "effective batch, i.e. a different training run from the one asked for. The grid's best is the "
            "fastest, by median of 5 rotated rounds, of the grid's 3 fastest points by their single probe "
            "and tune's pick, re-measured side by side (a single probe per point picks its winner partly "
            "by luck). A pick / best ratio "
            "inside the repeat noise (the spread (max − min) / median of the interleaved repeats, "
            f"`{NOTES}`) is not a measured difference.", "",
            "Details: [results/tune_targets.md](results/tune_targets.md).", ""]


def truth_section(results: Path) -> list[str]:
    lines = ["### The published measurements used, and the CPU ground truth", "",
             "| benchmark | ground truth (measured) | trainfit (predicted) | cases | median \\|error\\| | "
             "max \\|error\\| | also |", "|---|---|---|---|---|---|---|"]
    cal, sp, cpu, sc = (load(results, n)
                        for n in ("calibration", "speed_published", "cpu_truth", "speed_cpu"))
    thr = HERE / "throughput_published.json"
    n_thr = len(json.loads(thr.read_text())["cases"]) if thr.exists() else None
    if cal:
        s = cal["summary"]
        lines.append(f"| [calibration](results/calibration.md) | published GPU peak memory (HF docs "
                     f"V100, litgpt A10G) | peak memory | {s['cases']} ({s['scored_high_medium']} scored) | "
                     f"{pct(s['median_abs_error'])} | {pct(s['max_abs_error'])} | OOM cases predicted not to "
                     f"fit: {s['oom_predicted_not_fitting']} of {s['oom_cases']} |")
    if sp:
        s = sp["summary"]
        lines.append(f"| [speed_published](results/speed_published.md) | published tokens/s per GPU "
                     f"(llm-foundry, torchtitan, torchtune, fsdp_qlora, HF docs ...) | tokens/s | "
                     f"{s['cases']} plain ({s.get('scored', s['cases'])} scored) | "
                     f"{pct(s['median_abs_error'])} | {pct(s['max_abs_error'])} | order of pairs differing "
                     f"> 10 %: {s['order_agreement']} of {s['order_pairs_gt_10pct']}; "
                     f"`throughput_published.json` holds {n_thr} cases |")
    held = load(results, "heldout_memory")
    if held:
        g = held["summary"]["groups"]
        s, multi, single = (g["all supported, high/medium confidence"], g["multi-GPU"],
                            g["single-GPU"])
        lines.append(f"| [heldout_memory](results/heldout_memory.md) | published GPU peak memory "
                     f"not used to build the model (litgpt, torchtune, HF + FSDP / DeepSpeed, "
                     f"fsdp_qlora; 1-8 GPUs) | peak memory | {s['cases']} high/medium "
                     f"({s['scored']} scored) | {pct(s['median_abs_error'])} | "
                     f"{pct(-s['worst_under_error'])} under | single-GPU "
                     f"{pct(single['median_abs_error'])}, multi-GPU "
                     f"{pct(multi['median_abs_error'])}; under by > 5 %: "
                     f"{s['under_by_more_than_5pct']}; OOMs predicted not to fit "
                     f"{s['oom_predicted_not_fitting']} of {s['oom_cases']}; trained runs "
                     f"predicted to fit {s['trained_predicted_fitting']} of {s['trained_cases']} |")
    if cpu:
        s = cpu["summary"]
        lines.append(f"| [cpu_truth](results/cpu_truth.md) | peak live bytes of the real step on this CPU | "
                     f"peak memory | {s['configs']} | {pct(s['median_abs_error'], 4)} | "
                     f"{pct(s['max_abs_error'], 4)} | within 1 %: {s['within_1pct']} of {s['configs']} |")
    if sc:
        s = sc["summary"]
        # speed_cpu writes the agreement as a fraction, speed_published as a count: show a count
        order = s["order_agreement"]
        if isinstance(order, float) and order <= 1:
            order = round(order * s["order_pairs_gt_10pct"])
        lines.append(f"| [speed_cpu](results/speed_cpu.md) | step time of real steps on this CPU | "
                     f"step time | {s['configs']} | {pct(s['median_abs_error'])} | "
                     f"{pct(s['max_abs_error'])} | order of "
                     f"pairs differing > 10 %: {order} of "
                     f"{s['order_pairs_gt_10pct']} |")
    plan = load(results, "planner_speed")
    if plan:
        s = plan["summary"]
        lines += ["", f"Planner speed (measured wall time, {s['cores']} cores): {s['configurations']} "
                  f"configurations of {s['model']} on {s['gpu']} in {s['plan_wall_time_s']:.1f} s; "
                  f"extrapolated vs full-size simulation: allocated max |error| "
                  f"{pct(s['max_abs_allocated_error'], 2)}, reserved {pct(s['max_abs_reserved_error'], 2)}."]
    return [*lines, ""]


def _scalar_rows(d: Any) -> list[tuple[str, Any]]:
    """The doctor's result format is its script's: show its scalar summary fields as written."""
    summary = d.get("summary", d) if isinstance(d, dict) else None
    if not isinstance(summary, dict):
        return []
    return [(k, v) for k, v in summary.items() if isinstance(v, int | float | str | bool)]


def doctor_monitor_section(results: Path) -> list[str]:
    lines = ["### Doctor and monitor", ""]
    mon = load(results, "monitor_overhead")
    if mon is None:
        lines += [not_yet("monitor_overhead.py"), ""]
    else:
        q = mon["overhead_percent_per_pair_quartiles"]
        lines += [
            f"Monitor ([results/monitor_overhead.md](results/monitor_overhead.md); {mon['device']}):", "",
            "| figure | value |", "|---|---|",
            f"| `record_step` per call (measured) | {mon['record_step_us']:.2f} µs |",
            f"| `sample_once` per call, no NVML (measured) | {mon['sample_once_us']:.0f} µs |",
            f"| overhead these direct costs give at a {mon['workload']['interval_s']} s interval "
            f"(predicted from the measured costs) | {mon['expected_overhead_percent']:.3f} % of step time |",
            f"| sampler thread CPU time / wall time (measured) | "
            f"{mon['sampler_thread_cpu_fraction'] * 100:.3f} % |",
            f"| loop A/B, sampler on vs off, per-pair median (measured) | "
            f"{mon['overhead_percent_per_pair_median']:+.2f} % (middle half {q[0]:+.2f} … {q[1]:+.2f} %: "
            "timing noise here exceeds the effect) |", ""]
    doc = load(results, "doctor_targets")
    if doc is None:
        return [*lines, "Doctor: " + not_yet("doctor_targets.py"), ""]
    rows = _scalar_rows(doc)
    lines += ["Doctor ([results/doctor_targets.md](results/doctor_targets.md)); fields as "
              "`doctor_targets.py` writes them (measured on this CPU unless the field says predicted; "
              "units in the field "
              "name or in the results page):", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in rows]
    if isinstance(doc, list) or (isinstance(doc, dict) and not rows):
        lines.append(f"| entries | {len(doc)} |")
    return [*lines, ""]


def render(results: Path = RESULTS) -> str:
    """The whole page from the results directory (pure: reads files, writes nothing)."""
    names = " ".join(s[:-3] for s, _, _ in SCRIPTS)
    sections: list[Callable[[], list[str]]] = [
        lambda: memory_section(results), lambda: batch_section(results),
        lambda: lightning_section(results),
        lambda: truth_section(results), lambda: doctor_monitor_section(results)]
    lines = [
        "# Benchmarks", "",
        "<!-- generated by benchmarks/make_readme.py from benchmarks/results/*.json: edit that script -->",
        "",
        "Scripts that measure what the tests cannot assert (accuracy against ground truth, wall time, "
        "trainfit against the tools it replaces). Each writes `results/<name>.json` and `results/<name>.md`; "
        "none needs a GPU except `gpu_validate.py`.", "", *scripts_table(results), "",
        *gpu_line(results), "",
        "## trainfit next to the tools it replaces", "",
        "Measured = observed on real hardware (a published GPU run, or this CPU); predicted = computed "
        "without running the job (trainfit `plan`, accelerate `estimate-memory`).", ""]
    for section in sections:
        lines += section()
    lines += [
        "## Regenerate", "",
        "This page, from the results files (seconds): `python benchmarks/make_readme.py`", "",
        "The results, then this page (about an hour on 2 cores; `tune_targets.py` ~50 min, `calibration.py` "
        "~10 min; `tune_targets.py --lightning-only` re-measures only Lightning's finder, ~10 min):", "",
        "```bash",
        f"for b in {names}; do python benchmarks/$b.py; done && python benchmarks/make_readme.py", "```", "",
        f"Timings on this 2-core machine vary by up to ~35 % between runs (`{NOTES}`): read wall times "
        "as such.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    README.write_text(render())
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
