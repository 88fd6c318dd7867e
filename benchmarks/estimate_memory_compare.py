"""accelerate ``estimate-memory`` vs trainfit ``plan`` vs published GPU measurements.

accelerate's CLI (``accelerate estimate-memory MODEL``) downloads the model's config from the Hub,
builds ``AutoModel.from_config(config, torch_dtype=float32)`` under ``init_empty_weights`` (meta
device), sums its parameter and buffer bytes with ``accelerate.utils.calculate_maximum_sizes`` and
prints, per dtype, "Training using Adam" = ``max(estimate_training_usage(fp32 size, dtype))``:
4 × the fp32 size for ``float32`` (weights + gradients + 2 Adam states, i.e. 16 bytes/parameter) and
2 × the fp32 size for ``float16`` (mixed precision: the max of its model / gradient / optimizer
terms, 8 bytes/parameter); ``int8`` / ``int4`` print "N/A". It has no term for activations, batch,
sequence length, LoRA, quantized training, the CUDA context or the caching allocator.

There is no network here, so this script runs the CLI's own code (``gather_data`` and
``estimate_command`` from ``accelerate.commands.estimate``) with only its Hub fetch replaced: the
empty model is built the CLI's way from trainfit's catalog config of the same model. The printed
table is stored per model, so the numbers are what the CLI prints.

trainfit's side is not re-run: ``results/calibration.json`` already holds, per published case, the
measured peak and trainfit's like-for-like prediction (``max_memory_allocated`` against the
predicted allocated peak, nvidia-smi against the predicted device peak) and its fits verdict.

dtype given to accelerate: ``float32`` for fp32 training, ``float16`` (its mixed-precision row) for
amp-fp16 / amp-bf16 / bf16-true, which is the closest row its CLI offers (no bfloat16 choice); for
QLoRA the ``int4`` row would print "N/A" for training, recorded as such beside the float16 number.

Run: ``python benchmarks/estimate_memory_compare.py`` → results/estimate_memory_compare.{json,md}
(meta-device models only: ~1 min, no GPU, no download).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
CALIBRATION = OUT / "calibration.json"
PUBLISHED = ROOT / "data" / "published.json"
GIB = 2**30

# the CLI's dtype choices are float32/float16/int8/int4: its float16 row is its mixed-precision row
DTYPE_FOR_PRECISION = {"fp32": "float32", "amp-fp16": "float16", "amp-bf16": "float16",
                       "bf16-true": "float16"}


def _empty_model(model_name: str) -> Any:
    """The CLI's ``create_empty_model`` for library ``transformers``, minus the Hub: same class
    (``AutoModel``), same fp32 dtype, same ``init_empty_weights`` context."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModel

    from trainfit.model.source import resolve_model

    config = copy.deepcopy(resolve_model(model_name).config)
    with init_empty_weights():
        return AutoModel.from_config(config, torch_dtype=torch.float32)


def accelerate_estimate(model_name: str) -> dict[str, Any]:
    """What ``accelerate estimate-memory`` computes and prints for ``model_name``."""
    import accelerate
    import accelerate.commands.estimate as est
    from accelerate.utils import calculate_maximum_sizes

    model = _empty_model(model_name)
    total_size, largest_layer = calculate_maximum_sizes(model)
    dtypes = ["float32", "float16", "int8", "int4"]
    args = argparse.Namespace(model_name=model_name, library_name="transformers", dtypes=dtypes,
                              trust_remote_code=False)
    original = est.create_empty_model
    # only the Hub fetch is replaced: gather_data / estimate_command are accelerate's own code
    est.create_empty_model = lambda *a, **k: model
    try:
        rows = est.gather_data(argparse.Namespace(**vars(args)))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            est.estimate_command(argparse.Namespace(**vars(args)))
    finally:
        est.create_empty_model = original
    per_dtype = {}
    for dtype, largest, total, training in rows:
        train = max(training.values())
        per_dtype[dtype] = {
            "largest_layer_bytes": largest, "total_size_bytes": total,
            "training_bytes": None if train == -1 else train,
            "training_as_printed": "N/A" if train == -1 else est.convert_bytes(train),
        }
    return {"accelerate_version": accelerate.__version__, "model_class": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "fp32_total_size_bytes": total_size, "largest_layer": [largest_layer[0], largest_layer[1]],
            "dtypes": per_dtype, "cli_output": printed.getvalue()}


def compare(calibration: dict[str, Any], estimates: dict[str, dict[str, Any]],
            capacity: dict[str, int]) -> dict[str, Any]:
    """Per-case rows and the summary (pure: numbers in, numbers out)."""
    rows = []
    for r in calibration["results"]:
        job = r["job"]
        dtype = DTYPE_FOR_PRECISION[job["precision"]]
        acc = estimates[job["model"]]["dtypes"][dtype]
        acc_bytes = acc["training_bytes"]
        measured = None if r["oom_case"] else r["measured_bytes"]
        truth_fits = not r["oom_case"]
        acc_fits = acc_bytes <= capacity[r["gpu"]]
        rows.append({
            "id": r["id"], "gpu": r["gpu"], "gpu_capacity_bytes": capacity[r["gpu"]],
            "model": job["model"], "method": job["method"], "precision": job["precision"],
            "confidence": r["confidence"], "compare": r["compare"], "oom_case": r["oom_case"],
            "measured_bytes": measured,
            "trainfit_predicted_bytes": r["predicted_bytes"], "trainfit_error": r["error"],
            "trainfit_fits": r["predicted_fits"],
            "accelerate_dtype": dtype, "accelerate_training_bytes": acc_bytes,
            "accelerate_training_as_printed": acc["training_as_printed"],
            "accelerate_int4_training_as_printed": (
                estimates[job["model"]]["dtypes"]["int4"]["training_as_printed"]
                if job["method"] == "qlora" else None),
            "accelerate_error": None if measured is None else acc_bytes / measured - 1,
            "accelerate_fits": acc_fits, "truth_fits": truth_fits,
            "trainfit_right_side": r["predicted_fits"] == truth_fits,
            "accelerate_right_side": acc_fits == truth_fits,
        })

    def stats(sel: list[dict[str, Any]], key: str) -> dict[str, float | None]:
        errs = [abs(x[key]) for x in sel if x[key] is not None]
        return {"median_abs_error": statistics.median(errs) if errs else None,
                "max_abs_error": max(errs) if errs else None}

    # the scored set is calibration.py's: measured, high/medium confidence
    scored = [x for x in rows if x["measured_bytes"] is not None
              and x["confidence"] in ("high", "medium")]
    measured = [x for x in rows if x["measured_bytes"] is not None]
    summary: dict[str, Any] = {
        "cases": len(rows), "scored_high_medium": len(scored), "measured": len(measured),
        "oom_cases": sum(x["oom_case"] for x in rows),
        "trainfit": {**stats(scored, "trainfit_error"),
                     "median_abs_error_all_measured": stats(measured, "trainfit_error")["median_abs_error"],
                     "right_side_of_capacity": sum(x["trainfit_right_side"] for x in rows),
                     "fits_called_fits": sum(x["trainfit_fits"] for x in measured),
                     "oom_called_oom": sum(not x["trainfit_fits"] for x in rows if x["oom_case"])},
        "accelerate": {**stats(scored, "accelerate_error"),
                       "median_abs_error_all_measured":
                           stats(measured, "accelerate_error")["median_abs_error"],
                       "right_side_of_capacity": sum(x["accelerate_right_side"] for x in rows),
                       "fits_called_fits": sum(x["accelerate_fits"] for x in measured),
                       "oom_called_oom": sum(not x["accelerate_fits"] for x in rows if x["oom_case"])},
    }
    for method in ("full", "lora", "qlora"):
        sel = [x for x in scored if x["method"] == method]
        summary[f"by_method_{method}"] = {
            "scored": len(sel),
            "trainfit_median_abs_error": stats(sel, "trainfit_error")["median_abs_error"],
            "accelerate_median_abs_error": stats(sel, "accelerate_error")["median_abs_error"]}
    return {"summary": summary, "results": rows}


def _pct(x: float | None, sign: bool = False) -> str:
    return "n/a" if x is None else (f"{x:+.1%}" if sign else f"{x:.1%}")


def render_md(data: dict[str, Any]) -> str:
    s, t, a = data["summary"], data["summary"]["trainfit"], data["summary"]["accelerate"]
    lines = [
        "# accelerate estimate-memory vs trainfit plan vs published GPU measurements", "",
        "Regenerate: `python benchmarks/estimate_memory_compare.py` (meta-device models, ~1 min). "
        "Measured = published GPU peak (`benchmarks/data/published.json`); trainfit = predicted "
        "like-for-like peak from `results/calibration.json`; accelerate = \"Training using Adam\" "
        f"as its CLI prints it (accelerate {data['accelerate_version']}, `AutoModel` built on the meta "
        "device from the same config; dtype float32 for fp32 runs, float16 — its mixed-precision row "
        "— otherwise). accelerate has no term for activations, LoRA or quantized training.", "",
        f"- cases: {s['cases']} ({s['measured']} measured, {s['oom_cases']} OOM); "
        f"scored (high/medium confidence, measured): {s['scored_high_medium']}",
        f"- median |error| (scored): trainfit **{_pct(t['median_abs_error'])}**, "
        f"accelerate **{_pct(a['median_abs_error'])}**; max |error|: trainfit "
        f"{_pct(t['max_abs_error'])}, accelerate {_pct(a['max_abs_error'])}",
        f"- right side of the GPU's capacity (fits / OOM), all {s['cases']} cases: trainfit "
        f"**{t['right_side_of_capacity']}**, accelerate **{a['right_side_of_capacity']}** "
        f"(measured runs called fitting: {t['fits_called_fits']} / {a['fits_called_fits']} of "
        f"{s['measured']}; OOM runs called OOM: {t['oom_called_oom']} / {a['oom_called_oom']} of "
        f"{s['oom_cases']})",
    ]
    for m in ("full", "lora", "qlora"):
        b = s[f"by_method_{m}"]
        lines.append(f"- {m} ({b['scored']} scored): median |error| trainfit "
                     f"{_pct(b['trainfit_median_abs_error'])}, accelerate "
                     f"{_pct(b['accelerate_median_abs_error'])}")
    lines += ["", "| case | GPU (capacity GiB) | method | measured (GiB) | trainfit predicted (GiB) | "
              "error | accelerate estimate (GiB, dtype) | error | fits? measured / trainfit / "
              "accelerate |", "|---|---|---|---|---|---|---|---|---|"]

    def yn(v: bool) -> str:
        return "yes" if v else "no"

    for r in data["results"]:
        meas = "OOM" if r["oom_case"] else f"{r['measured_bytes'] / GIB:.2f}"
        lines.append(
            f"| {r['id']} | {r['gpu']} ({r['gpu_capacity_bytes'] / GIB:.2f}) | {r['method']} | {meas} | "
            f"{r['trainfit_predicted_bytes'] / GIB:.2f} | {_pct(r['trainfit_error'], True)} | "
            f"{r['accelerate_training_bytes'] / GIB:.2f} ({r['accelerate_dtype']}) | "
            f"{_pct(r['accelerate_error'], True)} | {yn(r['truth_fits'])} / {yn(r['trainfit_fits'])} / "
            f"{yn(r['accelerate_fits'])} |")
    lines += ["", "QLoRA cases: accelerate's `int4` row prints \"N/A\" for training; the float16 "
              "number above is what its CLI offers for a bf16 run of the same model. The CLI's "
              "\"GB\" are GiB (it divides by 1024).", "",
              "What the CLI prints (one model, for reference):", "", "```"]
    first = next(iter(data["models"].values()))
    lines += [first["cli_output"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    warnings.filterwarnings("ignore")
    from trainfit.hardware.gpus import find_gpu

    calibration = json.loads(CALIBRATION.read_text())
    # every published case calibration.py evaluates must be here: a missing one means stale results
    published = {c["id"] for c in json.loads(PUBLISHED.read_text())["cases"]}
    missing = published - {r["id"] for r in calibration["results"]}
    if missing:
        raise SystemExit(f"calibration.json lacks {sorted(missing)}: re-run benchmarks/calibration.py")
    models = sorted({r["job"]["model"] for r in calibration["results"]})
    estimates = {m: accelerate_estimate(m) for m in models}
    capacity = {g: find_gpu(g).memory_bytes for g in {r["gpu"] for r in calibration["results"]}}
    data = compare(calibration, estimates, capacity)
    data["accelerate_version"] = next(iter(estimates.values()))["accelerate_version"]
    data["models"] = estimates
    OUT.mkdir(exist_ok=True)
    (OUT / "estimate_memory_compare.json").write_text(json.dumps(data, indent=1))
    md = render_md(data)
    (OUT / "estimate_memory_compare.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
