"""Predicted vs NEW published GPU training memory: cases nobody here calibrated on.

``data/heldout_memory.json`` (93 cases collected after the model was built: torchtune READMEs
0.1–0.5, torchtitan's performance table, Answer.AI's fsdp_qlora benchmarks, PEFT's FSDP/DeepSpeed
docs, Hugging Face's 2022 FSDP/DeepSpeed blog posts, lit-gpt's Oct-2023 resource tables).  Each case
is mapped to a JobSpec + GPU + the peak its source printed (:mod:`heldout_mapping`, which states
every approximation per case) and predicted with ``predict_memory`` at full size:

* compared like with like: ``max_memory_allocated`` / torchtune's peak active ↔ predicted
  allocated, ``max_memory_reserved`` ↔ reserved, nvidia-smi / monitoring screenshots ↔ device;
  error = predicted / measured − 1 (negative: under-predicted, the worst error);
* OOM runs must be predicted not to fit and trained runs to fit: device peak ≤ the card's
  capacity, WITHOUT plan's 10 % margin (also reported with it);
* cases needing what JobSpec cannot express (CPU offload, optimizer-in-backward, activation
  offloading, selective checkpointing, fp32 frozen base, unpinned sequence length) are listed as
  unsupported and left out of the scored figures; their prediction as mapped is still shown
  (``--no-unsupported`` skips it).

Run: ``python benchmarks/heldout_memory.py [--cases ID ...] [--workers 2] [--no-unsupported]``
→ results/heldout_memory.{json,md} (a ``--cases`` subset is printed only; ``--cases ... --update``
re-runs those cases into the previous full run's results, each row naming its trainfit commit).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from heldout_mapping import framework_of, map_case  # noqa: E402
from heldout_models import build_gpu, build_source  # noqa: E402

DATA = ROOT / "data" / "heldout_memory.json"
OUT = ROOT / "results"
GIB = 2**30
UNDER_LIMIT = -0.05
"""An under-prediction beyond 5 % is counted separately (under-predicting is the worst error)."""
PLAN_MARGIN = 0.10


def outcome_of(case: dict[str, Any]) -> str:
    m = case["measured"]
    if m["outcome"] == "OOM":
        return "OOM"
    return "trained" if m.get("peak_memory_bytes") is not None else "trained (fits only)"


def _row(case: dict[str, Any], mapping: Any) -> dict[str, Any]:
    return {
        "id": case["id"], "framework": framework_of(case), "gpu": mapping.gpu_overrides.get(
            "name", mapping.gpu), "ranks": case["ranks"], "method": case["method"],
        "sharding": case["sharding"], "precision": case["precision"].split()[0],
        "compare": mapping.compare, "measured_bytes": case["measured"].get("peak_memory_bytes"),
        "outcome": outcome_of(case), "confidence": case["confidence"],
        "unsupported": mapping.unsupported, "skipped": mapping.skip,
        "mapping_notes": list(mapping.notes), "job": mapping.job, "failed": None,
        "predicted_allocated_bytes": None, "predicted_reserved_bytes": None,
        "predicted_device_bytes": None, "predicted_bytes": None, "error": None,
        "capacity_bytes": None, "predicted_fits": None, "predicted_fits_with_margin": None,
        "outcome_predicted_correctly": None, "scored": False,
        "published_reserved_before_step_bytes": case["measured"].get(
            "reserved_after_model_init_bytes") or PUBLISHED_AFTER_WRAP.get(case["id"]),
    }


def run_case(item: tuple[dict[str, Any], bool]) -> dict[str, Any]:
    """One case: mapping → prediction → comparison (errors are recorded, never raised)."""
    case, predict_unsupported = item
    warnings.filterwarnings("ignore")
    from trainfit.job import JobSpec
    from trainfit.memory.predict import predict_memory

    t0 = time.perf_counter()
    mapping = map_case(case)
    row = _row(case, mapping)
    if mapping.skip or (mapping.unsupported and not predict_unsupported):
        return row
    try:
        job = JobSpec(**mapping.job)
        source, model_notes = build_source(mapping)
        gpu = build_gpu(mapping)
        pred = predict_memory(job, source, gpu, margin=0.0,
                              eager_module_loading=mapping.eager_modules)
    except Exception as err:  # a case trainfit cannot run is a finding, not a crash
        row["failed"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"
        return row
    row["mapping_notes"] += model_notes
    compared = {"allocated": pred.peak_allocated_bytes, "reserved": pred.peak_reserved_bytes,
                "device": pred.peak_device_bytes}[mapping.compare]
    measured = row["measured_bytes"]
    cap = gpu.memory_bytes
    row.update(
        predicted_allocated_bytes=pred.peak_allocated_bytes,
        predicted_reserved_bytes=pred.peak_reserved_bytes,
        predicted_device_bytes=pred.peak_device_bytes, predicted_bytes=compared,
        error=compared / measured - 1 if measured else None, capacity_bytes=cap,
        predicted_fits=pred.peak_device_bytes <= cap,
        predicted_fits_with_margin=pred.peak_device_bytes <= (1 - PLAN_MARGIN) * cap,
        predicted_reserved_before_step_bytes=pred.reserved_before_step_bytes,
        breakdown_bytes=pred.breakdown, peak_phase=pred.peak_phase,
        model_notes=pred.model_notes, total_params=pred.total_params,
        trainable_params=pred.trainable_params, sim_time_s=time.perf_counter() - t0)
    fits = row["predicted_fits"]
    row["outcome_predicted_correctly"] = (not fits) if row["outcome"] == "OOM" else fits
    row["scored"] = not mapping.unsupported and row["error"] is not None
    return row


def _cost(case: dict[str, Any]) -> float:
    """Rough simulation cost, to hand the slowest cases out first."""
    m = case["model"]
    params = m.get("extra", {}).get("param_count") or 12 * m["hidden_size"] ** 2 * m[
        "num_hidden_layers"]
    return params * (2.0 if case["ranks"] > 1 else 1.0)


def supported(r: dict[str, Any]) -> bool:
    return not r["unsupported"] and not r["skipped"] and not r["failed"]


def _group(rows: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [r for r in rows if r["scored"]]
    errs = [r["error"] for r in scored]
    worst = min(scored, key=lambda r: r["error"], default=None)
    oom = [r for r in rows if r["outcome"] == "OOM" and r["predicted_fits"] is not None]
    ran = [r for r in rows if r["outcome"] != "OOM" and r["predicted_fits"] is not None]
    return {
        "cases": len(rows), "scored": len(scored),
        "median_abs_error": statistics.median(abs(e) for e in errs) if errs else None,
        "median_signed_error": statistics.median(errs) if errs else None,
        "worst_under_error": worst["error"] if worst and worst["error"] < 0 else None,
        "worst_under_id": worst["id"] if worst and worst["error"] < 0 else None,
        "under_by_more_than_5pct": sum(e < UNDER_LIMIT for e in errs),
        "oom_cases": len(oom), "oom_predicted_not_fitting": sum(not r["predicted_fits"]
                                                                for r in oom),
        "trained_cases": len(ran), "trained_predicted_fitting": sum(bool(r["predicted_fits"])
                                                                     for r in ran),
        "trained_predicted_fitting_with_margin": sum(bool(r["predicted_fits_with_margin"])
                                                     for r in ran),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if supported(r)]
    groups: dict[str, Any] = {"all supported": _group(ok), "all supported, high/medium "
                              "confidence": _group([r for r in ok if r["confidence"] != "low"])}
    for scope, pick in (("single-GPU", lambda r: r["ranks"] == 1),
                        ("multi-GPU", lambda r: r["ranks"] > 1)):
        groups[scope] = _group([r for r in ok if pick(r)])
        for method in ("full", "lora", "qlora"):
            groups[f"{scope} {method}"] = _group([r for r in ok if pick(r)
                                                  and r["method"] == method])
    for method in ("full", "lora", "qlora"):
        groups[method] = _group([r for r in ok if r["method"] == method])
    blocked: dict[str, list[str]] = {}
    for r in rows:
        for feat in r["unsupported"]:
            blocked.setdefault(feat, []).append(r["id"])
    return {"groups": groups, "unsupported_features": blocked,
            "unsupported_cases": sum(bool(r["unsupported"]) for r in rows),
            "failed": {r["id"]: r["failed"] for r in rows if r["failed"]},
            "skipped": {r["id"]: r["skipped"] for r in rows if r["skipped"]}}


def _gib(v: int | None) -> str:
    return "—" if v is None else f"{v / GIB:.2f}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.1%}"


def _outcome_cell(r: dict[str, Any]) -> str:
    if r["predicted_fits"] is None:
        return r["outcome"]
    verdict = "✓" if r["outcome_predicted_correctly"] else "✗"
    return f"{r['outcome']}: predicted {'fits' if r['predicted_fits'] else 'OOM'} {verdict}"


PUBLISHED_AFTER_WRAP = {"fsdp_qlora_bench_3090_llama2-7b_qlora_ctx512_bs1": round(3.72 * 2**30)}
"""``reserved_after_model_wrap`` where the source states it in prose (Answer.AI's
benchmarks_03_2024.md: "It's actually about 3.72GiB (see reserved_after_model_wrap)"); a case's
``measured.reserved_after_model_init_bytes`` otherwise (torchtune 0.1's tutorials)."""


def render(rows: list[dict[str, Any]], summary: dict[str, Any], wall_s: float) -> str:
    lines = [
        "# Predicted vs new published GPU memory (held-out cases)", "",
        "Regenerate: `python benchmarks/heldout_memory.py` (no GPU; 25–60 min on 2 shared cores). Cases: "
        "`benchmarks/data/heldout_memory.json` (not used to build or calibrate the model). "
        "Measured = the source's published peak; predicted = trainfit's simulation at full "
        "size. Error = predicted / measured − 1 of the peak the source printed (allocated ↔ "
        "`max_memory_allocated` or peak active, reserved ↔ `max_memory_reserved`, device ↔ "
        "nvidia-smi); GiB = 2^30 bytes. Fits = predicted device peak ≤ the card's capacity (no "
        "margin; `fits_with_margin` in the JSON uses plan's 10 %). Unsupported cases are listed "
        "but not scored.", "",
        f"trainfit {summary.get('trainfit', '?')}; wall time of the runs behind these rows (a "
        f"full run, plus any `--update` of some cases): {wall_s / 60:.1f} min.",
        "",
        "| group | scored | median \\|error\\| | median error | worst under-prediction | "
        "under by > 5 % | OOM runs predicted OOM | trained runs predicted to fit |",
        "|---|---|---|---|---|---|---|---|"]
    for name, g in summary["groups"].items():
        worst = "—" if g["worst_under_id"] is None else \
            f"{_pct(g['worst_under_error'])} ({g['worst_under_id']})"
        mae = "—" if g["median_abs_error"] is None else f"{g['median_abs_error']:.1%}"
        lines.append(f"| {name} | {g['scored']} | {mae} | {_pct(g['median_signed_error'])} | "
                     f"{worst} | "
                     f"{g['under_by_more_than_5pct']} | {g['oom_predicted_not_fitting']} of "
                     f"{g['oom_cases']} | {g['trained_predicted_fitting']} of "
                     f"{g['trained_cases']} |")
    lines += ["", f"Unsupported: {summary['unsupported_cases']} cases (a case may need several):",
              "", "| feature | cases | ids |", "|---|---|---|"]
    for feat, ids in sorted(summary["unsupported_features"].items(), key=lambda kv: -len(kv[1])):
        lines.append(f"| {feat} | {len(ids)} | {', '.join(ids)} |")
    for title, items in (("Failed (trainfit could not run the mapped job)", summary["failed"]),
                         ("Not predicted", summary["skipped"])):
        if items:
            lines += ["", f"{title}:", ""] + [f"- {k}: {v}" for k, v in items.items()]
    worst = sorted((r for r in rows if r["scored"] and r["error"] < 0), key=lambda r: r["error"])
    lines += ["", "## Worst under-predictions (scored cases)", "",
              "| case | peak | measured (GiB) | predicted (GiB) | error | conf. |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['id']} | {r['compare']} | {_gib(r['measured_bytes'])} | "
              f"{_gib(r['predicted_bytes'])} | {_pct(r['error'])} | {r['confidence']} |"
              for r in worst[:10]]
    wrapped = [r for r in rows if r.get("predicted_reserved_before_step_bytes")]
    if wrapped:
        lines += ["", "## The reserve left before the first step: FSDP1's wrap, the loading",
                  "", "Predicted `memory_reserved` once FSDP1 has built every unit on the GPU "
                  "(`fsdp_init`, src/trainfit/memory/wrap.py) or, on one rank, once the model "
                  "is loaded: QLoRA's 4-bit weights made (`quant_lib`), torchtune's layers "
                  "deep-copied from one (`clone_layers`) (src/trainfit/memory/loading.py); "
                  "published where the source logged it.", "",
                  "| case | predicted (GiB) | published (GiB) | the case's peak | measured / "
                  "predicted (GiB) |", "|---|---|---|---|---|"]
        lines += [f"| {r['id']} | {_gib(r['predicted_reserved_before_step_bytes'])} | "
                  f"{_gib(r.get('published_reserved_before_step_bytes'))} | {r['compare']} | "
                  f"{_gib(r['measured_bytes'])} / {_gib(r['predicted_bytes'])} |"
                  for r in wrapped]
    lines += ["", "## Every case", "",
              "| case | GPU | ranks | method | sharding | peak | measured | pred. allocated | "
              "pred. reserved | pred. device | error | outcome | conf. | unsupported |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = _pct(r["error"]) + ("" if r["scored"] or r["error"] is None else " (not scored)")
        lines.append(
            f"| {r['id']} | {r['gpu']} | {r['ranks']} | {r['method']} | {r['sharding']} | "
            f"{r['compare']} | {_gib(r['measured_bytes'])} | "
            f"{_gib(r['predicted_allocated_bytes'])} | {_gib(r['predicted_reserved_bytes'])} | "
            f"{_gib(r['predicted_device_bytes'])} | {err} | {_outcome_cell(r)} | "
            f"{r['confidence']} | {', '.join(r['unsupported']) or r['failed'] or ''} |")
    lines += ["", "## Mapping notes", "", "<details><summary>per case</summary>", ""]
    for r in rows:
        lines.append(f"- **{r['id']}**: " + "; ".join(r["mapping_notes"]))
    lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def preload() -> None:
    """Import trainfit's simulation code here, before forking: every worker (also those the pool
    forks anew) then runs the code of one moment even if src/ changes during the run."""
    import importlib
    import pkgutil

    import trainfit

    rooms = tuple(f"trainfit.{r}" for r in ("job", "hardware", "model", "data", "engine",
                                             "speed", "memory"))
    for mod in pkgutil.walk_packages(trainfit.__path__, "trainfit."):
        if mod.name.startswith(rooms):
            try:
                importlib.import_module(mod.name)
            except ImportError:  # an optional dependency: the run reports what it needs
                pass


def trainfit_version() -> str:
    """The commit the prediction ran on, and whether src/ had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT.parent, capture_output=True,
                              text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + (" + uncommitted src/ changes" if git("status", "--porcelain", "src").strip()
                   else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", help="case ids (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-unsupported", action="store_true",
                    help="do not simulate unsupported cases (they are still listed)")
    ap.add_argument("--update", action="store_true",
                    help="re-run --cases and replace (or add) just them in results/heldout_memory.json")
    args = ap.parse_args(argv)
    previous = OUT / "heldout_memory.json"
    if args.update and (not args.cases or not previous.exists()):
        print("error: --update needs --cases and a previous full run's results", file=sys.stderr)
        print(f"hint: run without --update first (writes {previous})", file=sys.stderr)
        return 2
    cases = json.loads(DATA.read_text())["cases"]
    if args.cases:
        unknown = sorted(set(args.cases) - {c["id"] for c in cases})
        if unknown:
            print(f"error: unknown case id {unknown[0]}", file=sys.stderr)
            print(f"hint: the ids are in {DATA}", file=sys.stderr)
            return 2
        cases = [c for c in cases if c["id"] in args.cases]
    if args.workers < 1:
        print(f"error: --workers {args.workers}: must be ≥ 1", file=sys.stderr)
        return 2
    order = {c["id"]: i for i, c in enumerate(cases)}
    version = trainfit_version()
    preload()
    work = [(c, not args.no_unsupported) for c in sorted(cases, key=_cost, reverse=True)]
    t0 = time.perf_counter()
    rows = []
    with multiprocessing.get_context("fork").Pool(args.workers, maxtasksperchild=8) as pool:
        for row in pool.imap_unordered(run_case, work, chunksize=1):
            rows.append(row)
            print(f"[{len(rows)}/{len(work)} {time.perf_counter() - t0:5.0f}s] {row['id']}: "
                  f"{_pct(row['error'])} {row['failed'] or ''}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    for r in rows:
        r["trainfit"] = version
    if args.update:  # the re-run cases replace theirs; every row says which trainfit it ran
        old = json.loads(previous.read_text())
        merged = {r["id"]: r for r in old["results"]} | {r["id"]: r for r in rows}
        listed = [c["id"] for c in json.loads(DATA.read_text())["cases"]]
        # the data file's cases in its order: a re-run one replaces its row, a new one joins, a
        # case no longer listed goes
        rows = [merged[cid] for cid in listed if cid in merged]
        order = {cid: i for i, cid in enumerate(listed)}
        wall += old["summary"].get("wall_time_s", 0.0)
    rows.sort(key=lambda r: order[r["id"]])
    summary = summarize(rows)
    summary["wall_time_s"] = wall
    summary["trainfit"] = " / ".join(sorted({r.get("trainfit", "?") for r in rows}))
    text = render(rows, summary, wall)
    if args.cases and not args.update:  # a subset is printed, never written over a full run
        print(text)
        return 0
    OUT.mkdir(exist_ok=True)
    (OUT / "heldout_memory.json").write_text(json.dumps({"summary": summary, "results": rows},
                                                        indent=1, default=str))
    (OUT / "heldout_memory.md").write_text(text)
    print(text.split("\n## Every case")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
