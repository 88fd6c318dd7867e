"""plan's predictions against the same training steps measured on a real GPU (run where CUDA is).

For each case: ``plan``'s full-size simulation of the configuration on this GPU (found by the name
CUDA reports; memory: allocated / reserved / device peaks; speed: step time and tokens/s) beside
trainfit's probe of the same step on the same device (``Probe.run``: ``max_memory_allocated``,
``max_memory_reserved``, ``cudaMemGetInfo`` used at the end, the median of 10 timed steps) and
NVML's reading of the device's used memory right after. The models are built from their
configurations (no download); the data is the repo's ``examples/data/tiny_text.jsonl`` through the
built-in byte tokenizer (the step's shapes are what matter, not the text).

Without CUDA it says so, writes nothing and exits 1. Regenerate where a GPU is:
``python benchmarks/gpu_validate.py`` (~5–10 min on an H100) → results/gpu_validate.{json,md}.
``--quick`` runs the first three cases only.
"""

from __future__ import annotations

import datetime
import gc
import json
import statistics
import sys
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "tiny_text.jsonl"
GIB = 2**30

# (model, method, seq_len, micro-batch, grad accumulation, precision, checkpointing): small to
# 1B models, full and LoRA, the three precisions, checkpointing on/off, accumulation (gradients
# alive across micro-steps), an encoder-decoder.
CASES = [
    ("llama-tiny-58m", "full", 512, 8, 1, "fp32", "off"),
    ("llama-tiny-58m", "full", 512, 8, 2, "amp-bf16", "off"),
    ("llama-tiny-58m", "full", 512, 16, 1, "bf16-true", "full"),
    ("gpt2", "full", 1024, 8, 1, "amp-bf16", "off"),
    ("gpt2", "full", 1024, 8, 1, "amp-bf16", "full"),
    ("t5-small", "full", 256, 16, 1, "amp-bf16", "off"),
    ("qwen2.5-0.5b", "full", 1024, 4, 2, "amp-bf16", "full"),
    ("qwen2.5-0.5b", "lora", 1024, 8, 1, "bf16-true", "off"),
    ("llama-3.2-1b", "lora", 1024, 4, 1, "bf16-true", "full"),
    ("tinyllama-1.1b", "full", 1024, 2, 1, "bf16-true", "full"),
]


def _err(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else pred / meas - 1


def errors(predicted: dict, measured: dict) -> dict:
    """predicted / measured − 1 of each compared figure (device: the probe's used memory at the end)."""
    return {"allocated": _err(predicted["peak_allocated_bytes"], measured["peak_allocated_bytes"]),
            "reserved": _err(predicted["peak_reserved_bytes"], measured["peak_reserved_bytes"]),
            "device": _err(predicted["peak_device_bytes"], measured["device_used_bytes_at_end"]),
            "tokens_per_s": _err(predicted["tokens_per_s"], measured["tokens_per_s"])}


def run_case(case: tuple, dev: torch.device, gpu, nvml) -> dict:
    from trainfit.data.load import load_data
    from trainfit.job import DEFAULT_MARGIN, JobSpec
    from trainfit.model.source import resolve_model
    from trainfit.plan.grid import _exact_row
    from trainfit.tune.probe import Probe

    model, method, seq, micro, accum, precision, ckpt = case
    job = JobSpec(model=model, method=method, seq_len=seq, micro_batch=micro, grad_accum=accum,
                  effective_batch=micro * accum, precision=precision, grad_ckpt=ckpt,
                  data=str(DATA))
    src = resolve_model(model)
    row = _exact_row((job, src, gpu, DEFAULT_MARGIN))
    data = load_data(job, src)
    probe = Probe(src, data, dev)
    r = probe.run(job, timed_steps=10)
    reading = nvml.read([dev.index or 0])[0] if nvml.available else None
    del probe
    gc.collect()
    torch.cuda.empty_cache()
    mem, spd = row.memory, row.speed
    m = r.measured
    out = {"case": {"model": model, "method": method, "seq_len": seq, "micro_batch": micro,
                    "grad_accum": accum, "precision": precision, "grad_ckpt": ckpt},
           "status": r.status, "detail": r.detail,
           "predicted": {"peak_allocated_bytes": mem.peak_allocated_bytes,
                         "peak_reserved_bytes": mem.peak_reserved_bytes,
                         "peak_device_bytes": mem.peak_device_bytes, "peak_phase": mem.peak_phase,
                         "step_time_s": spd.step_time_s if spd else None,
                         "tokens_per_s": spd.tokens_per_s if spd else None},
           "measured": None if m is None else {
               "peak_allocated_bytes": m.peak_allocated_bytes,
               "peak_reserved_bytes": m.peak_reserved_bytes,
               "device_used_bytes_at_end": m.peak_device_bytes,
               "nvml_used_bytes_after": reading.memory_used_bytes if reading else None,
               "step_time_s": m.step_time_s, "step_time_spread_s": m.step_time_spread_s,
               "tokens_per_s": m.tokens_per_s, "data_wait_fraction": m.data_wait_fraction}}
    if m is not None:
        out["error"] = errors(out["predicted"], out["measured"])
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / GIB:.2f}"


def write_md(doc: dict) -> None:
    lines = [f"# plan's predictions vs the same steps measured on a {doc['device']}", "",
             f"Measured {doc['date']} by `python benchmarks/gpu_validate.py` (torch {doc['torch']}, "
             f"CUDA {doc['cuda']}; trainfit's GPU entry: {doc['gpu_spec']}). Predicted = `plan`'s "
             "full-size simulation; measured = `Probe.run` of the same step (allocated / reserved: "
             "`torch.cuda.max_memory_*` peaks; device: `cudaMemGetInfo` used at the end of the probe, "
             "all processes; tokens/s: median of 10 timed steps). GiB = 2^30 bytes; error = "
             "predicted / measured − 1.", "",
             "| model | method | seq | micro×accum | precision | ckpt | allocated GiB pred / meas "
             "(err) | reserved GiB pred / meas (err) | device GiB pred / meas (err) | tokens/s pred / "
             "meas (err) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        c, p, m = r["case"], r["predicted"], r["measured"]
        head = (f"| {c['model']} | {c['method']} | {c['seq_len']} | {c['micro_batch']}×"
                f"{c['grad_accum']} | {c['precision']} | {c['grad_ckpt']} |")
        if m is None:
            lines.append(f"{head} {_gib(p['peak_allocated_bytes'])} / {r['status']} | | | |")
            continue
        e = r["error"]
        tps_p = "unknown" if p["tokens_per_s"] is None else f"{p['tokens_per_s']:,.0f}"
        lines.append(
            f"{head} {_gib(p['peak_allocated_bytes'])} / {_gib(m['peak_allocated_bytes'])} "
            f"({_pct(e['allocated'])}) | {_gib(p['peak_reserved_bytes'])} / "
            f"{_gib(m['peak_reserved_bytes'])} ({_pct(e['reserved'])}) | "
            f"{_gib(p['peak_device_bytes'])} / {_gib(m['device_used_bytes_at_end'])} "
            f"({_pct(e['device'])}) | {tps_p} / {m['tokens_per_s']:,.0f} ({_pct(e['tokens_per_s'])}) |")
    for key in ("allocated", "reserved", "device", "tokens_per_s"):
        errs = [abs(r["error"][key]) for r in doc["rows"] if r.get("error") and
                r["error"][key] is not None]
        if errs:
            lines.append(f"\n- {key}: median |error| {statistics.median(errs):.1%}, max "
                         f"{max(errs):.1%} over {len(errs)} cases (measured vs predicted)")
    (OUT / "gpu_validate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_validate: no CUDA device here; nothing measured, nothing written "
              "(run it on a machine with a GPU)")
        return 1
    import warnings

    from trainfit.hardware.gpus import find_gpu_by_device_name
    from trainfit.monitor.nvml import Nvml

    warnings.filterwarnings("ignore")
    dev = torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name(dev)
    gpu = find_gpu_by_device_name(name, torch.cuda.get_device_properties(dev).total_memory)
    nvml = Nvml().open()
    cases = CASES[:3] if "--quick" in sys.argv else CASES
    rows = []
    for case in cases:
        rows.append(run_case(case, dev, gpu, nvml))
        print(json.dumps(rows[-1], default=str), flush=True)
    nvml.close()
    doc = {"device": name, "gpu_spec": getattr(gpu, "name", None), "torch": torch.__version__,
           "cuda": torch.version.cuda, "date": datetime.date.today().isoformat(), "rows": rows}
    OUT.mkdir(exist_ok=True)
    (OUT / "gpu_validate.json").write_text(json.dumps(doc, indent=1, default=str))
    write_md(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
