"""Predicted vs published training throughput: every case trainfit can be asked.

Cases: ``throughput_published.json`` (168) and ``data/throughput_heldout.json`` (158, collected
later, never used to set a constant).  :mod:`speed_cases` maps each to what ``trainfit plan`` is
given — job fields, model (catalog, or a transformers config with the case's dims), GPU, plan's
``--interconnect`` — and says what it substituted; cases with a feature trainfit does not model
are listed as unsupported, or scored apart as ``fused/compiled`` (see speed_cases' docstring).

Speed is predicted as ``plan`` predicts a grid row: four small simulations of the job
(``trainfit.memory.extrapolate.fit_group``), re-timed at the case's micro-batch and accumulation
(``BilinearModel.speed``) on the GPU, plus the gradient synchronisation of its ranks over the
interconnect (``trainfit.plan.row_speed.synced``).  Cases that differ only in micro-batch,
accumulation, GPU of one compute capability or interconnect share one fit.  Every number here is
the public functions' output: a change to the speed model shows up on the next run.

Tokens/s are per GPU.  Error = predicted / measured − 1.  MFU: measured as the source published it
(its own FLOP formula and peak), predicted by trainfit's (PaLM 6N + 12·L·H·Q·T, the GPU's dense
peak); ``measured_mfu_trainfit`` is the measured speed under trainfit's formula.

Run: ``python benchmarks/speed_published.py [--workers 2] [--cases ID ...]``
→ results/speed_published.{json,md}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
ORDER_GAP = 0.10
"""Pairs of one group whose measured speeds differ by more than this are order-checked."""


def _gpu(m: Any) -> Any:
    """The catalog GPU with plan's ``--interconnect`` applied (as the CLI does: a link given,
    which plan takes across hosts too; trainfit.cli.gpu_arg.with_interconnect)."""
    from trainfit.hardware.gpus import find_gpu
    from trainfit.speed.comm import INTERCONNECTS_GBS

    gpu = find_gpu(m.gpu)
    if m.interconnect:
        gpu = dataclasses.replace(gpu, interconnect=f"{m.interconnect} (given)",
                                  interconnect_gbs=INTERCONNECTS_GBS[m.interconnect])
    return gpu


_DEVICES: dict[str, Any] = {}
"""One DeviceSpeed per GPU for the worker's life: the speed model caches by ``id(dev)``."""


def _score(m: Any, fit: Any, src: Any) -> dict[str, Any]:
    from types import SimpleNamespace

    from trainfit.job import JobSpec
    from trainfit.plan.row_speed import synced
    from trainfit.speed.host import host_step
    from trainfit.speed.predict import model_flops_per_token
    from trainfit.speed.roofline import DeviceSpeed

    gpu = _gpu(m)
    job = JobSpec(model=src.name, **m.job)
    p = fit.predict(job.micro_batch, accumulating=(job.grad_accum or 1) > 1)
    fpt = model_flops_per_token(src.config, p["total_params"], p["trainable_params"], job.seq_len,
                                job.method == "full")
    dev = _DEVICES.setdefault(gpu.name, DeviceSpeed.from_gpu(gpu))
    # the speed of a run that fits without the allocator's retries: these runs ran; plan would
    # replay the row's full-depth trace at the card's limit and call a step that retries unknown
    mem = SimpleNamespace(**p, per_rank=getattr(fit.points[0].sim, "per_rank", False),
                          alloc_retries=0)
    fit.host = host_step(job, src)  # the step's code measured on this CPU (plan does the same)
    sp = synced(fit.speed(dev, job, fpt), job, mem, gpu)
    notes = list(m.notes)
    if m.n_params and abs(p["total_params"] / m.n_params - 1) > 0.02:
        notes.append(f"planned model has {p['total_params'] / 1e6:,.0f} M parameters, the case "
                     f"{m.n_params / 1e6:,.0f} M")
    tps = None if sp.tokens_per_s is None else sp.tokens_per_s / job.ranks
    mfu = sp.mfu
    if tps is not None and m.timed_interval:
        # the source's time includes evaluation forwards (a third of a step each: 2N of the 6N
        # FLOPs per token, PaLM appendix B); its tokens count the training steps only
        steps, forwards = m.timed_interval
        share = steps / (steps + forwards / 3)
        tps *= share
        mfu = None if mfu is None else mfu * share
    return _row(m, notes, predicted_tokens_per_s=tps, predicted_mfu=mfu,
                step_time_s=sp.step_time_s, bound=sp.bound, sync_s=sp.sync_s,
                sync_exposed_s=sp.sync_exposed_s,
                interconnect=gpu.interconnect.removesuffix(" (given)"),
                unknown_reason=sp.unknown_reason, host_busy_cores=sp.host_busy_cores,
                host_busy=sp.host_busy)


def _row(m: Any, notes: list[str], **pred: Any) -> dict[str, Any]:
    tps = pred.get("predicted_tokens_per_s")
    err = None if tps is None else tps / m.measured_tokens_per_s - 1
    mfu = pred.get("predicted_mfu")
    measured_mfu = None if err is None or mfu is None else mfu / (1 + err)
    if measured_mfu is not None and measured_mfu > 1.0:
        # the published tokens/s would need more FLOP/s than the card's dense peak under the
        # FLOP count of the configuration as pinned: a figure above its physical limit is an
        # inconsistency of the source or of the pinning (a shorter sequence, another model, a
        # different card), not a measurement to score a prediction against
        m = dataclasses.replace(m, unsupported=[
            *m.unsupported, f"published figure above the GPU's peak (it implies MFU "
            f"{measured_mfu:.0%} under trainfit's FLOP count of the configuration as pinned)"])
        err = None
    return {"id": m.id, "group": m.group, "file": m.file, "gpu": m.gpu, "gpu_text": m.gpu_text,
            "family": m.family, "gpus": m.gpus, "scale": m.scale, "bucket": m.bucket,
            "confidence": m.confidence,
            "measured_tokens_per_s": m.measured_tokens_per_s, "predicted_tokens_per_s": tps,
            "error": err, "measured_mfu": m.measured_mfu, "predicted_mfu": mfu,
            "measured_mfu_trainfit": measured_mfu,
            **pred, "unsupported": m.unsupported, "approximated": m.approximated, "notes": notes,
            "model_note": m.model_note, "job": m.job, "model": m.model}


def _measure_hosts(cases: list[Any]) -> None:
    """Worker: the host step of every case (trainfit.speed.host), into the cache."""
    warnings.filterwarnings("ignore")
    from speed_cases import build_source
    from trainfit.job import JobSpec
    from trainfit.speed.host import host_step

    sources: dict[str, Any] = {}
    for m in cases:
        try:
            key = json.dumps(m.model, sort_keys=True, default=str)
            src = sources.get(key) or build_source(m.model)
            sources[key] = src
            host_step(JobSpec(model=src.name, **m.job), src, again=True)
        except Exception:  # reported by the case's own prediction
            continue


def predict_group(cases: list[Any]) -> tuple[list[dict[str, Any]], float]:
    """Worker: fit the group's simulation once, then every case of it. (rows, CPU seconds)."""
    t0 = time.process_time()
    warnings.filterwarnings("ignore")
    import torch

    from speed_cases import build_source
    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec
    from trainfit.memory.extrapolate import fit_group
    from trainfit.memory.predict import target_for

    torch.set_num_threads(1)  # fake tensors compute nothing; two workers share two cores
    first = cases[0]
    try:
        src = build_source(first.model)
        fit = fit_group(JobSpec(model=src.name, **first.job), src, target_for(find_gpu(first.gpu)))
    except Exception as err:  # the case is reported with the error, the run goes on
        return [_row(m, [*m.notes, f"error: {type(err).__name__}: {err}"]) for m in cases], \
            time.process_time() - t0
    rows = []
    for m in cases:
        try:
            rows.append(_score(m, fit, src))
        except Exception as err:
            rows.append(_row(m, [*m.notes, f"error: {type(err).__name__}: {err}"]))
    return rows, time.process_time() - t0


def stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [r["error"] for r in rows]
    if not errs:
        return {"cases": 0}
    a = sorted(abs(e) for e in errs)
    p90 = statistics.quantiles(a, n=10, method="inclusive")[-1] if len(a) > 1 else a[0]
    return {"cases": len(a), "median_abs_error": statistics.median(a), "p90_abs_error": p90,
            "max_abs_error": a[-1], "median_signed_error": statistics.median(errs)}


FAMILIES = ("V100", "A100", "H100/H200", "consumer/workstation Ampere", "Ada", "Blackwell", "other")
SPLITS: list[tuple[str, Any]] = [
    ("all", lambda r: True), ("plain", lambda r: r["bucket"] == "plain"),
    ("fused/compiled", lambda r: r["bucket"] == "fused/compiled"),
    *[(s, lambda r, s=s: r["scale"] == s) for s in ("1 GPU", "2-7 GPUs", "≥ 8 GPUs")],
    # the targets are read as the memory ones are: on high/medium-confidence cases
    *[(f"{s}, high/medium", lambda r, s=s: r["scale"] == s and r.get("confidence") != "low")
      for s in ("1 GPU", "2-7 GPUs", "≥ 8 GPUs")],
    *[(f, lambda r, f=f: r["family"] == f) for f in FAMILIES],
    # the issue asks for the figures by method too
    *[(f"method: {m}", lambda r, m=m: (r.get("job") or {}).get("method") == m)
      for m in ("full", "lora", "qlora")],
    *[(f"method: {m}, high/medium", lambda r, m=m: (r.get("job") or {}).get("method") == m
       and r.get("confidence") != "low") for m in ("full", "lora", "qlora")],
    ("file: published", lambda r: r["file"] == "published"),
    ("file: heldout", lambda r: r["file"] == "heldout")]


def order_check(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per group: [pairs whose predicted order matches the measured, pairs measured > 10 % apart];
    a predicted tie counts as a miss."""
    out: dict[str, list[int]] = {}
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            ma, mb = a["measured_tokens_per_s"], b["measured_tokens_per_s"]
            if a["group"] != b["group"] or abs(ma - mb) / min(ma, mb) <= ORDER_GAP:
                continue
            pa, pb = a["predicted_tokens_per_s"], b["predicted_tokens_per_s"]
            g = out.setdefault(a["group"], [0, 0])
            g[0] += pa != pb and (ma < mb) == (pa < pb)
            g[1] += 1
    return out


def summarize(rows: list[dict[str, Any]], wall_s: float, cpu_s: float,
              source: dict[str, Any]) -> dict[str, Any]:
    from trainfit.speed.host_timing import HOST_ENV

    scored = [r for r in rows if r["error"] is not None]
    plain = [r for r in scored if r["bucket"] == "plain"]
    order = order_check(scored)
    reasons: dict[str, list[str]] = {}
    for r in rows:
        for why in r["unsupported"] or ([] if r["error"] is not None else ["error / unknown speed"]):
            reasons.setdefault(why.split(" (")[0], []).append(r["id"])
    return {**stats(plain), "headline": "plain cases (no approximated feature)",
            "order_pairs_gt_10pct": sum(v[1] for v in order.values()),
            "order_agreement": sum(v[0] for v in order.values()), "order_by_group": order,
            "cases_total": len(rows), "scored": len(scored), "fused_compiled": len(scored) - len(plain),
            "not_scored": {k: len(v) for k, v in reasons.items()}, "not_scored_ids": reasons,
            "splits": {name: {"plain": stats([r for r in plain if f(r)]),
                              "scored": stats([r for r in scored if f(r)])} for name, f in SPLITS},
            "host_set_time": sum(1 for r in scored if r.get("host_busy_cores") is not None),
            "host_busy_ids": [r["id"] for r in scored if r.get("host_busy")],
            "host_reference_op_s": float(os.environ.get(HOST_ENV) or 0),
            "wall_time_s": wall_s, "worker_cpu_time_s": cpu_s, "source": source}


def _merges(source: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``--cases … --merge`` since the full run, oldest first."""
    return list(source.get("merged") or [])


def _merged(source: dict[str, Any]) -> str:
    return "".join(
        f"; {len(m['cases'])} case(s) re-run since (`--cases … --merge`) at "
        f"{m['source']['commit'][:10]} + {len(m['source']['src_modified'])} modified file(s): "
        + ", ".join(m["cases"]) for m in _merges(source))


def _source_state() -> dict[str, Any]:
    """The commit and the files of src/ modified in the working tree when the workers' snapshot
    was imported (the speed model is being changed: the numbers belong to this state)."""
    import subprocess

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT.parent, capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "HEAD"),
            "src_modified": git("status", "--porcelain", "src").splitlines()}


def _pct(v: float | None, sign: str = "") -> str:
    return "" if v is None else f"{v:{sign}.1%}"


def _notes(r: dict[str, Any]) -> str:
    return "; ".join([*r["approximated"], *r["unsupported"], *r["notes"]]).replace("|", "/")


def render(rows: list[dict[str, Any]], s: dict[str, Any]) -> str:
    def cells(st: dict[str, Any]) -> str:
        if not st.get("cases"):
            return "0 | | | "
        return (f"{st['cases']} | {st['median_abs_error']:.1%} | {st['p90_abs_error']:.1%} | "
                f"{st['median_signed_error']:+.1%}")

    L = ["# Predicted vs published training throughput (tokens/s per GPU)", "",
         "Regenerate: `python benchmarks/speed_published.py` (cases: `throughput_published.json`, "
         "`data/throughput_heldout.json`; mapping: `speed_cases.py`). Measured = the source's "
         "published number; predicted = trainfit `plan`'s speed model for that configuration "
         "(small simulations re-timed at the case's micro-batch + gradient sync over the "
         "interconnect). Error = predicted / measured − 1.", "",
         f"- {s['cases_total']} cases: {s['scored'] - s['fused_compiled']} plain, "
         f"{s['fused_compiled']} fused/compiled (torch.compile, fused kernels, selective AC or the "
         "optimizer in the backward: scored apart), "
         f"{s['cases_total'] - s['scored']} not scored ({_reasons(s)})",
         f"- plain: median |error| {_pct(s.get('median_abs_error'))}, p90 "
         f"{_pct(s.get('p90_abs_error'))}, max {_pct(s.get('max_abs_error'))}, median signed "
         f"{_pct(s.get('median_signed_error'), '+')}",
         f"- order within a group (scored pairs measured > 10 % apart): {s['order_agreement']} of "
         f"{s['order_pairs_gt_10pct']} predicted in the measured order (a predicted tie is a miss): "
         + ", ".join(f"{g} {a}/{n}" for g, (a, n) in sorted(s["order_by_group"].items())),
         *[f"- **{note}**" for note in s.get("run_notes", [])],
         f"- host time measured (plan's run of the step's code on this CPU, trainfit/speed/host.py)"
         f" set the forward + backward of {s.get('host_set_time', 0)} scored cases, read at a "
         f"GPU host's reference op of {s.get('host_reference_op_s', 0) * 1e6:.1f} µs "
         "(`H100_HOST_REFERENCE_OP_S`, trainfit/speed/host_timing.py); measured "
         f"while other processes kept this CPU busy: {len(s.get('host_busy_ids', []))}"
         + "".join(f" {i}" for i in s.get("host_busy_ids", [])),
         f"- run: {s['wall_time_s']:.0f} s wall, {s['worker_cpu_time_s']:.0f} s CPU in the workers; "
         f"source {s['source']['commit'][:10]} + {len(s['source']['src_modified'])} modified "
         "file(s) under src/" + _merged(s['source']),
         "", "| split | plain n | median \\|err\\| | p90 \\|err\\| | median signed | scored n | "
         "median \\|err\\| | p90 \\|err\\| | median signed |", "|---|---|---|---|---|---|---|---|---|"]
    for name, v in s["splits"].items():
        L.append(f"| {name} | {cells(v['plain'])} | {cells(v['scored'])} |")
    scored = [r for r in rows if r["error"] is not None]
    L += ["", "## Worst 10 per GPU family (scored cases)", ""]
    for fam in FAMILIES:
        worst = sorted((r for r in scored if r["family"] == fam), key=lambda r: -abs(r["error"]))[:10]
        if worst:
            L += [f"### {fam}", "", "| case | GPUs | measured | predicted | error | MFU measured / "
                  "predicted (trainfit's formula) | bound | sync exposed | bucket / notes |",
                  "|---|---|---|---|---|---|---|---|---|"]
            L += [f"| {r['id']} | {r['gpus']} | {r['measured_tokens_per_s']:,.0f} | "
                  f"{r['predicted_tokens_per_s']:,.0f} | {r['error']:+.1%} | "
                  f"{_pct(r['measured_mfu_trainfit'])} / {_pct(r['predicted_mfu'])} | {r['bound']} | "
                  f"{_exposed(r)} | {r['bucket']}: {_notes(r)} |" for r in worst]
            L.append("")
    L += ["## Every case", "", "Model stand-ins: " + "; ".join(sorted({r["model_note"] for r in rows
                                                                        if r["model_note"]})), "",
          "| case | GPU × n | measured | predicted | error | measured MFU (source) | predicted MFU "
          "| bucket | mapping notes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pred = "" if r["predicted_tokens_per_s"] is None else f"{r['predicted_tokens_per_s']:,.0f}"
        err = "" if r["error"] is None else f"{r['error']:+.1%}"
        L.append(f"| {r['id']} | {r['gpu'] or '—'} × {r['gpus']} | {r['measured_tokens_per_s']:,.0f} | "
                 f"{pred} | {err} | {_pct(r['measured_mfu'])} | {_pct(r.get('predicted_mfu'))} | "
                 f"{r['bucket']} | {_notes(r)} |")
    return "\n".join(L) + "\n"


def _reasons(s: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(s["not_scored"].items(), key=lambda kv: -kv[1]))


def _exposed(r: dict[str, Any]) -> str:
    if not r.get("sync_exposed_s") or not r.get("step_time_s"):
        return "0"
    return f"{r['sync_exposed_s'] / r['step_time_s']:.0%} of step"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cases", nargs="*", help="only these case ids (a partial run writes nothing)")
    ap.add_argument("--render", action="store_true",
                    help="re-make the summary and the markdown from the committed results (no "
                         "case is run: a new split of the same rows)")
    ap.add_argument("--merge", action="store_true",
                    help="with --cases: replace those cases' rows in the committed results and "
                         "rewrite the summary (the run line says which cases were re-run)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    if args.render:
        old = json.loads((OUT / "speed_published.json").read_text())
        rows, was = old["results"], old["summary"]
        summary = summarize(rows, was["wall_time_s"], was["worker_cpu_time_s"], was["source"])
        summary["host_reference_op_s"] = was["host_reference_op_s"]  # the run's, not this env's
        (OUT / "speed_published.json").write_text(json.dumps({"summary": summary, "results": rows},
                                                             indent=1))
        (OUT / "speed_published.md").write_text(render(rows, summary))
        return 0
    # Every trainfit module the workers use, imported once here, before the pool forks: all workers
    # then run one snapshot of the source even if it is edited during the run (a worker importing
    # a module later got a newer one than the parent's JobSpec: AttributeError).  These imports
    # build no model and load neither transformers nor peft, so forking after them is safe (plan
    # does the same); the snapshot's commit and modified files go into the summary.
    import trainfit.memory.extrapolate
    import trainfit.plan.grid  # noqa: F401
    from speed_cases import load_cases, map_case
    from trainfit.speed.host_timing import H100_HOST_REFERENCE_OP_S, HOST_ENV

    # the published runs' hosts are not this VM: every measured host step is read at one stated
    # GPU host's speed (the H100 host's reference op), not at whatever speed this VM ran at
    os.environ.setdefault(HOST_ENV, repr(H100_HOST_REFERENCE_OP_S))

    source = _source_state()

    mapped = [map_case(f, c) for f, c in load_cases()]
    if args.cases:
        mapped = [m for m in mapped if m.id in set(args.cases)]
    groups: dict[str, list[Any]] = {}
    for m in mapped:
        if not m.unsupported:
            groups.setdefault(m.group_key(), []).append(m)
    # the slowest fits (QLoRA's 4-bit twins, then the most cases) first: the workers end together
    work = sorted(groups.values(), key=lambda g: (g[0].job["method"] != "qlora", -len(g)))
    t0, cpu, rows = time.perf_counter(), 0.0, []
    ctx = multiprocessing.get_context("fork")
    # plan's host side, measured first, one case after the other, alone (a step's CPU time
    # measured beside a simulation on the other core came out 2-4× its own): the workers then
    # read it from the cache
    with ctx.Pool(1) as pool:
        pool.map(_measure_hosts, [[m for g in work for m in g]])
    with ctx.Pool(max(1, args.workers), maxtasksperchild=50) as pool:
        for i, (got, cpu_s) in enumerate(pool.imap_unordered(predict_group, work), 1):
            rows += got
            cpu += cpu_s
            print(f"[{i}/{len(work)}] " + ", ".join(f"{r['id']} {_pct(r['error'], '+') or 'n/a'}"
                                                   for r in got), flush=True)
    rows += [_row(m, m.notes) for m in mapped if m.unsupported]  # listed, no prediction
    if args.cases and args.merge:
        old = json.loads((OUT / "speed_published.json").read_text())
        new = {r["id"]: r for r in rows}
        rows = [new.get(r["id"], r) for r in old["results"]]
        was = old["summary"]["source"]
        source = {**was, "merged": [*_merges(was), {"cases": sorted(new), "source": source}]}
        t0 -= old["summary"]["wall_time_s"]
        cpu += old["summary"]["worker_cpu_time_s"]
    else:
        by_id = {m.id: i for i, m in enumerate(mapped)}
        rows.sort(key=lambda r: by_id[r["id"]])
    summary = summarize(rows, time.perf_counter() - t0, cpu, source)
    print(render(rows, summary).split("\n| split")[0])
    if args.cases and not args.merge:
        return 0
    OUT.mkdir(exist_ok=True)
    (OUT / "speed_published.json").write_text(json.dumps({"summary": summary, "results": rows},
                                                         indent=1))
    (OUT / "speed_published.md").write_text(render(rows, summary))
    import speed_bands  # the bands plan prints come from these results: never out of step

    return speed_bands.main()


if __name__ == "__main__":
    sys.exit(main())
