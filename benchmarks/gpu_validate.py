"""plan's predictions against the same training steps measured on a real GPU.

Two phases, so the measurements outlive the model that scores them:

* **measure** (where CUDA is): trainfit's probe of each configuration on the device
  (``Probe.run``: ``max_memory_allocated``, ``max_memory_reserved``, ``cudaMemGetInfo`` used at
  the end, the median of 10 timed steps) and NVML's reading of the device's used memory right
  after → ``results/gpu_measured.json`` (rewritten after every case, so a run cut short keeps
  what it measured), with the device name, torch and CUDA versions.
* **compare** (anywhere, no GPU): ``plan``'s full-size simulation of each measured configuration
  on the catalog entry of the device name recorded (memory: allocated / reserved / device peaks;
  speed: step time and tokens/s) → ``results/gpu_validate.{json,md}``, errors as
  predicted / measured − 1. Re-run it after a change to the model: ``--compare``.

The models are built from their configurations (no download; the weights are drawn on the
device — the values change neither bytes nor FLOPs — so a 7B model is ready in seconds rather
than the minutes ``init_weights``' CPU draw takes); the data is the repo's
``examples/data/tiny_text.jsonl`` through the built-in byte tokenizer, packed to the sequence.

Without CUDA (and without ``--compare``) it says so, writes nothing and exits 1.
``python benchmarks/gpu_validate.py`` (~4 min on an H100) measures and compares;
``--quick`` measures the first three cases; ``--launch`` the launch-bound ones, ``--attention``
the long-sequence ones and ``--expandable`` steps run with expandable segments (each added to the
file); ``--name h200`` keeps another device's measurements in files of their own
(gpu_measured_h200.json, gpu_validate_h200.*); ``--compare --here`` on the GPU's host scores
the measurements with host steps timed on that CPU, as a user's plan there would
(gpu_validate*_here.*); ``--device cpu --quick`` runs
the measuring code on this CPU as a dry run (nothing written); ``--out DIR`` writes the
measurements there instead.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "tiny_text.jsonl"
GIB = 2**30

# (model, method, seq_len, micro-batch, grad accumulation, precision, checkpointing)
CASES = [
    # small to 1B models, full and LoRA, the three precisions, checkpointing on/off, accumulation
    # (gradients alive across micro-steps), an encoder-decoder
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
    # the same tokens per step at three sequence lengths: attention's share grows with S
    ("llama-3.2-1b", "full", 512, 16, 1, "bf16-true", "off"),
    ("llama-3.2-1b", "full", 2048, 4, 1, "bf16-true", "off"),
    ("llama-3.2-1b", "full", 8192, 1, 1, "bf16-true", "off"),
    # fp16 with a GradScaler; a 256k vocabulary; full fine-tuning with fp32 master weights
    ("gpt2-medium", "full", 1024, 8, 1, "amp-fp16", "off"),
    ("gemma-2b", "lora", 1024, 4, 1, "bf16-true", "off"),
    ("qwen2.5-1.5b", "full", 2048, 4, 1, "amp-bf16", "full"),
    # 7B LoRA: long-context checkpointed, and short context where the fixed costs dominate
    ("mistral-7b-v0.1", "lora", 2048, 4, 1, "bf16-true", "full"),
    ("mistral-7b-v0.1", "lora", 512, 1, 1, "bf16-true", "off"),
    ("llama-2-7b", "lora", 1024, 4, 1, "amp-bf16", "full"),
]
LAUNCH_CASES = [
    # launch-bound: a few dozen tokens per step, so the step is the CPU's enqueueing of its ops
    # (``--launch``: measured after CASES and added to the same file)
    ("llama-tiny-58m", "full", 32, 1, 1, "fp32", "off"),
    ("gpt2", "full", 64, 1, 1, "amp-bf16", "off"),
    ("t5-small", "full", 32, 1, 1, "amp-bf16", "off"),
    ("llama-3.2-1b", "lora", 32, 1, 1, "bf16-true", "off"),
    ("qwen2.5-0.5b", "full", 64, 1, 2, "amp-bf16", "full"),
    ("mistral-7b-v0.1", "lora", 64, 1, 1, "bf16-true", "full"),
]
RESERVE_CASES = [
    # re-measured after the probe empties the allocator's cache before its meter (before, the
    # weights' drawing on the device left cached blocks in the measured reserve)
    ("llama-tiny-58m", "full", 512, 8, 1, "fp32", "off"),
    ("llama-3.2-1b", "lora", 1024, 4, 1, "bf16-true", "full"),
    ("gpt2-medium", "full", 1024, 8, 1, "amp-fp16", "off"),
    ("llama-3.2-1b", "lora", 32, 1, 1, "bf16-true", "off"),
    ("mistral-7b-v0.1", "lora", 64, 1, 1, "bf16-true", "full"),
    ("llama-2-7b", "lora", 1024, 4, 1, "amp-bf16", "full"),
]
ATTENTION_CASES = [
    # head_dim 128 at 8k positions per step: the attention kernel SDPA picks carries the step
    # (``--attention``: added to the same file)
    ("mistral-7b-v0.1", "lora", 8192, 1, 1, "bf16-true", "full"),
    ("qwen2.5-1.5b", "full", 8192, 1, 1, "bf16-true", "full"),
    ("qwen2.5-1.5b", "full", 1024, 8, 1, "bf16-true", "full"),
    # fp32 with grouped-query heads and no mask: transformers passes enable_gqa, the
    # memory-efficient kernel cannot take it, SDPA runs its math kernel and keeps the S×S
    # scores (simulated as that kernel since 2026-11-30; not yet measured on a GPU)
    ("llama-3.2-1b", "full", 1024, 2, 1, "fp32", "off"),
]
EXPANDABLE = "expandable"
EXPANDABLE_CASES = [
    # the same steps run with PyTorch's expandable segments (the job's ``expandable_segments``,
    # which the probe turns on through ``use_job_allocator``), so the reserve that
    # memory/expandable.py replays is checked against the allocator's own (``--expandable``)
    (*case, EXPANDABLE) for case in [
        ("llama-tiny-58m", "full", 512, 8, 1, "fp32", "off"),
        ("gpt2", "full", 1024, 8, 1, "amp-bf16", "off"),
        ("t5-small", "full", 256, 16, 1, "amp-bf16", "off"),
        ("qwen2.5-0.5b", "full", 1024, 4, 2, "amp-bf16", "full"),
        ("gpt2-medium", "full", 1024, 8, 1, "amp-fp16", "off"),
        ("llama-3.2-1b", "full", 2048, 4, 1, "bf16-true", "off"),
        ("qwen2.5-1.5b", "full", 2048, 4, 1, "amp-bf16", "full"),
        ("mistral-7b-v0.1", "lora", 512, 1, 1, "bf16-true", "off"),
        ("llama-2-7b", "lora", 1024, 4, 1, "amp-bf16", "full"),
    ]
]


def _err(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else pred / meas - 1


def errors(predicted: dict, measured: dict) -> dict:
    """predicted / measured − 1 of each compared figure (device: the probe's used memory at the end)."""
    return {"allocated": _err(predicted["peak_allocated_bytes"], measured["peak_allocated_bytes"]),
            "reserved": _err(predicted["peak_reserved_bytes"], measured["peak_reserved_bytes"]),
            "device": _err(predicted["peak_device_bytes"], measured["device_used_bytes_at_end"]),
            "tokens_per_s": _err(predicted["tokens_per_s"], measured["tokens_per_s"])}


def _job(case: tuple):
    from trainfit.job import JobSpec

    model, method, seq, micro, accum, precision, ckpt, *allocator = case
    return JobSpec(model=model, method=method, seq_len=seq, micro_batch=micro, grad_accum=accum,
                   effective_batch=micro * accum, precision=precision, grad_ckpt=ckpt,
                   data=str(DATA), expandable_segments=allocator == [EXPANDABLE])


def case_dict(case: tuple) -> dict[str, Any]:
    model, method, seq, micro, accum, precision, ckpt, *allocator = case
    return {"model": model, "method": method, "seq_len": seq, "micro_batch": micro,
            "grad_accum": accum, "precision": precision, "grad_ckpt": ckpt,
            **({"expandable_segments": True} if allocator == [EXPANDABLE] else {})}


def case_tuple(c: dict[str, Any]) -> tuple:
    return (c["model"], c["method"], c["seq_len"], c["micro_batch"], c["grad_accum"],
            c["precision"], c["grad_ckpt"]) + ((EXPANDABLE,) if c.get("expandable_segments") else ())


@contextlib.contextmanager
def _weights_drawn_on(dev: torch.device) -> Iterator[None]:
    """``init_weights`` draws every weight on the CPU (so that every device gets the same values):
    ~100 s for a 7B model. Here the values do not matter (bytes and FLOPs do not depend on them),
    so while the probe builds its model, ``torch.randn`` draws on the device instead."""
    orig = torch.randn

    def randn(*args: Any, **kw: Any) -> torch.Tensor:
        kw.pop("generator", None)
        kw.setdefault("device", dev)
        return orig(*args, **kw)

    torch.randn = randn  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.randn = orig  # type: ignore[assignment]


def measure_case(case: tuple, dev: torch.device, nvml: Any) -> dict[str, Any]:
    """The probe of ``case`` on ``dev``: trainfit's own measured step (no prediction)."""
    import trainfit.tune.probe as probe_mod
    from trainfit.data.load import load_data
    from trainfit.model.source import resolve_model

    job = _job(case)
    src = resolve_model(job.model)
    data = load_data(job, src)
    build = probe_mod.build_real

    def build_fast(*args: Any, **kw: Any) -> Any:
        with _weights_drawn_on(dev):
            return build(*args, **kw)

    probe_mod.build_real = build_fast
    try:
        probe = probe_mod.Probe(src, data, dev)
        r = probe.run(job, timed_steps=10)
        # whether the step really ran on expandable segments (the allocator's own record)
        expandable_seen = dev.type == "cuda" and any(
            s.get("is_expandable") for s in torch.cuda.memory_snapshot())
        reading = nvml.read([dev.index or 0])[0] if nvml is not None and nvml.available else None
    except Exception as err:  # one broken case must not lose the others' measurements
        return {"case": case_dict(case), "status": "error",
                "detail": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}",
                "measured": None}
    finally:
        probe_mod.build_real = build
        probe = None  # type: ignore[assignment]
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    m = r.measured
    return {"case": case_dict(case), "status": r.status, "detail": r.detail,
            "probe_time_s": r.probe_time_s,
            **({"expandable_segments_seen": expandable_seen} if job.expandable_segments else {}),
            "measured": None if m is None else {
                "peak_allocated_bytes": m.peak_allocated_bytes,
                "peak_reserved_bytes": m.peak_reserved_bytes,
                "device_used_bytes_at_end": m.peak_device_bytes,
                "nvml_used_bytes_after": reading.memory_used_bytes if reading else None,
                "step_time_s": m.step_time_s, "step_time_spread_s": m.step_time_spread_s,
                "step_times_s": m.step_times_s,
                "tokens_per_s": m.tokens_per_s, "data_wait_fraction": m.data_wait_fraction,
                "alloc_retries": m.alloc_retries}}


def predict_case(c: dict[str, Any], gpu: Any, output_held: bool = False) -> dict[str, Any]:
    """``plan``'s full-size simulation of the measured configuration on ``gpu``
    (``output_held``: the measured step kept the model's output through its backward pass, as
    trainfit's step did before it released it, commit e7e10aa)."""
    from trainfit.job import DEFAULT_MARGIN
    from trainfit.model.source import resolve_model
    from trainfit.plan.grid import _exact_row

    job = _job(case_tuple(c)).replace(output_in_backward=output_held)
    row = _exact_row((job, resolve_model(job.model), gpu, DEFAULT_MARGIN))
    mem, spd = row.memory, row.speed
    return {"peak_allocated_bytes": mem.peak_allocated_bytes,
            "peak_reserved_bytes": mem.peak_reserved_bytes,
            "peak_device_bytes": mem.peak_device_bytes, "peak_phase": mem.peak_phase,
            "step_time_s": spd.step_time_s if spd else None,
            "tokens_per_s": spd.tokens_per_s if spd else None,
            "bound": spd.bound if spd else None}


def compare(measured_doc: dict[str, Any], path: Path | None = None) -> dict[str, Any]:
    """Every measured row beside its prediction on the catalog entry of the measured device
    (``path``: the document is written there after every row, so a run cut short keeps them)."""
    from trainfit.hardware.gpus import find_gpu_by_device_name

    gpu = find_gpu_by_device_name(measured_doc["device"], measured_doc.get("total_memory_bytes"))
    doc = {**{k: v for k, v in measured_doc.items() if k != "rows"},
           "gpu_spec": getattr(gpu, "name", None), "rows": []}
    for r in measured_doc["rows"]:
        held = not r.get("step_releases_output", False)  # rows measured before e7e10aa
        row = {**r, "predicted": predict_case(r["case"], gpu, held)}
        if r["measured"] is not None:
            row["error"] = errors(row["predicted"], r["measured"])
        doc["rows"].append(row)
        print(json.dumps({"case": r["case"], "error": row.get("error")}), flush=True)
        if path is not None:
            path.write_text(json.dumps(doc, indent=1, default=str))
    return doc


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / GIB:.2f}"


def group_of(c: dict[str, Any]) -> str:
    """Which list a measured case comes from: the configurations, the launch-bound ones, the
    long-sequence ones."""
    t = case_tuple(c)
    return "launch-bound" if t in LAUNCH_CASES else "long sequence" if t in ATTENTION_CASES \
        else "expandable segments" if t in EXPANDABLE_CASES else "configurations"


def _summary(rows: list[dict], key: str) -> str:
    errs = [r["error"][key] for r in rows if r.get("error") and r["error"][key] is not None]
    if not errs:
        return ""
    under = sum(e < -0.05 for e in errs)
    return (f"median |error| {statistics.median(abs(e) for e in errs):.1%}, max "
            f"{max(abs(e) for e in errs):.1%} over {len(errs)} cases"
            + (f", {under} predicted more than 5 % under" if key != "tokens_per_s" else ""))


def write_md(doc: dict, name: str = "", out: Path | None = None) -> None:
    from trainfit.speed.host_timing import H100_HOST_REFERENCE_OP_S, HOST_ENV

    lines = [f"# plan's predictions vs the same steps measured on a {doc['device']}", "",
             f"Measured {doc['date']} by `python benchmarks/gpu_validate.py` (torch {doc['torch']}, "
             f"CUDA {doc['cuda']}; trainfit's GPU entry: {doc['gpu_spec']}). Predicted = `plan`'s "
             "full-size simulation (`python benchmarks/gpu_validate.py --compare` re-scores the "
             "measurements with the model as it is now); measured = `Probe.run` of the same step "
             "(allocated / reserved: `torch.cuda.max_memory_*` peaks over the metered step and 10 "
             "timed steps; device: `cudaMemGetInfo` used at the end of the probe, all processes; "
             "tokens/s: median of 10 timed steps, spread = slowest − fastest). GiB = 2^30 bytes; "
             "error = predicted / measured − 1. Launch-bound rows: the step's code is timed on "
             "the machine that predicts, in reference ops, and read at "
             + (f"the GPU host's reference op, {float(os.environ[HOST_ENV]) * 1e6:.1f} µs "
                + ("(`H100_HOST_REFERENCE_OP_S`, derived: trainfit/speed/host_timing.py)"
                   if float(os.environ[HOST_ENV]) == H100_HOST_REFERENCE_OP_S else
                   f"(timed on that host by `gpu_launch_overhead.py`: gpu_launch{name}.json)")
                if os.environ.get(HOST_ENV) else "that machine's own reference op") + ".", "",
             "| model | method | seq | micro×accum | precision | ckpt | allocated GiB pred / meas "
             "(err) | reserved GiB pred / meas (err) | device GiB pred / meas (err) | tokens/s pred / "
             "meas (err) | predicted bound, measured spread | group |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        c, p, m = r["case"], r["predicted"], r["measured"]
        head = (f"| {c['model']} | {c['method']} | {c['seq_len']} | {c['micro_batch']}×"
                f"{c['grad_accum']} | {c['precision']} | {c['grad_ckpt']} |")
        if m is None:
            lines.append(f"{head} {_gib(p['peak_allocated_bytes'])} / {r['status']} | | | | | "
                         f"{group_of(c)} |")
            continue
        e = r["error"]
        tps_p = "unknown" if p["tokens_per_s"] is None else f"{p['tokens_per_s']:,.0f}"
        spread = m.get("step_time_spread_s")
        noise = "" if spread is None or not m.get("step_time_s") else \
            f"{spread / m['step_time_s']:.0%} of the median"
        lines.append(
            f"{head} {_gib(p['peak_allocated_bytes'])} / {_gib(m['peak_allocated_bytes'])} "
            f"({_pct(e['allocated'])}) | {_gib(p['peak_reserved_bytes'])} / "
            f"{_gib(m['peak_reserved_bytes'])} ({_pct(e['reserved'])}) | "
            f"{_gib(p['peak_device_bytes'])} / {_gib(m['device_used_bytes_at_end'])} "
            f"({_pct(e['device'])}) | {tps_p} / {m['tokens_per_s']:,.0f} ({_pct(e['tokens_per_s'])}) "
            f"| {p.get('bound', '')}, {noise} | {group_of(c)} |")
    groups = sorted({group_of(r["case"]) for r in doc["rows"]})
    for key in ("allocated", "reserved", "device", "tokens_per_s"):
        text = _summary(doc["rows"], key)
        if text:
            lines.append(f"\n- {key}: {text} (measured vs predicted)")
            if len(groups) > 1:
                for g in groups:
                    sub = _summary([r for r in doc["rows"] if group_of(r["case"]) == g], key)
                    if sub:
                        lines.append(f"  - {g}: {sub}")
    (out or OUT).joinpath(f"gpu_validate{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def measure(dev: torch.device, cases: list[tuple], out: Path | None,
            name: str = "") -> dict[str, Any]:
    """Probe every case on ``dev``; the document is rewritten after each case (``out``)."""
    import warnings

    from trainfit.monitor.nvml import Nvml

    warnings.filterwarnings("ignore")
    nvml = Nvml().open() if dev.type == "cuda" else None
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                           "total_memory_bytes": torch.cuda.get_device_properties(dev).total_memory
                           if dev.type == "cuda" else None,
                           "torch": torch.__version__, "cuda": torch.version.cuda,
                           "transformers": _version("transformers"), "peft": _version("peft"),
                           "date": datetime.date.today().isoformat(), "rows": []}
    prior = None if out is None else out / f"gpu_measured{name}.json"
    if prior is not None and prior.exists():  # more cases on the same device: added to its file
        old = json.loads(prior.read_text())
        if old.get("device") == doc["device"]:
            mine = {json.dumps(case_dict(c), sort_keys=True) for c in cases}
            doc["rows"] = [r for r in old["rows"] if json.dumps(r["case"], sort_keys=True) not in mine]
    for case in cases:
        doc["rows"].append({**measure_case(case, dev, nvml), "step_releases_output": True})
        print(json.dumps(doc["rows"][-1], default=str), flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"gpu_measured{name}.json").write_text(json.dumps(doc, indent=1, default=str))
    if nvml is not None:
        nvml.close()
    return doc


def _version(pkg: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def host_reference_op_s(name: str = "", out: Path | None = None) -> float | None:
    """The reference op (speed/host_timing.py) as ``gpu_launch_overhead.py`` timed it on the GPU's
    own host, in seconds (None: that run did not time it)."""
    path = (out or OUT) / f"gpu_launch{name}.json"
    if not path.exists():
        return None
    ref = json.loads(path.read_text())["rows"].get("reference_op_cpu") or {}
    return ref.get("reference_op_s_median")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # ``--name h200``: another device's measurements, in gpu_measured_h200.json and
    # gpu_validate_h200.{json,md} (the H100's stay in the unsuffixed files)
    name = f"_{argv[argv.index('--name') + 1]}" if "--name" in argv else ""
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else OUT
    if "--compare" in argv:
        from trainfit.speed.host_timing import H100_HOST_REFERENCE_OP_S, HOST_ENV

        # re-scored away from the GPU's host: its measured host steps are read at that host's
        # reference op, not at this machine's: measured there where gpu_launch_overhead.py timed
        # it (gpu_launch{name}.json), else the H100 host's (derived, speed/host_timing.py)
        # ``--here``: on the GPU's own host, as a user's plan runs — its host steps measured at
        # this CPU's own speed, no reference op carried between machines (gpu_validate*_here.*)
        here = "--here" in argv
        if not here:
            os.environ.setdefault(HOST_ENV, repr(host_reference_op_s(name, out) or
                                                 H100_HOST_REFERENCE_OP_S))
        out_name = name + ("_here" if here else "")
        doc = compare(json.loads((out / f"gpu_measured{name}.json").read_text()),
                      out / f"gpu_validate{out_name}.json")
        write_md(doc, out_name, out)
        return 0
    cases = LAUNCH_CASES if "--launch" in argv else ATTENTION_CASES if "--attention" in argv \
        else RESERVE_CASES if "--reserve" in argv else EXPANDABLE_CASES if "--expandable" in argv \
        else CASES[:3] if "--quick" in argv else CASES
    if "--device" in argv and argv[argv.index("--device") + 1] == "cpu":
        measure(torch.device("cpu"), [(m, me, 64, 2, a, "fp32", ck, *al)
                                      for m, me, _, _, a, _, ck, *al in cases], None)
        return 0
    if not torch.cuda.is_available():
        print("gpu_validate: no CUDA device here; nothing measured, nothing written "
              "(run it on a machine with a GPU)")
        return 1
    doc = measure(torch.device("cuda", torch.cuda.current_device()), cases, out, name)
    if out == OUT:
        doc = compare(doc, OUT / f"gpu_validate{name}.json")
        write_md(doc, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
