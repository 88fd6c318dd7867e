"""The CUDA caching allocator's own record of trainfit's probe step (where CUDA is), for the
configurations whose measured peaks ``gpu_validate`` found the prediction furthest from: every
alloc / free / segment event with its size and stream (``torch.cuda.memory._record_memory_history``,
no stack traces), to set beside the simulation's event list of the same step
(``simulate_step(record_events=True)``) and find where the two part.

``python benchmarks/gpu_memory_trace.py --out DIR`` → DIR/gpu_memory_traces.pkl.gz: {case label:
{"case", "measured", "trace": [(action, addr, size, stream), ...], "segments": [...]}};
``--steps N`` runs N more steps after the metered one (the allocator's state over a run),
``--only 0,2`` picks cases by index, ``--kernels`` lists the kernels the probe ran (profiler).
Without CUDA it says so and exits 1.
"""

from __future__ import annotations

import gc
import gzip
import pickle
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_validate import _job, _weights_drawn_on, case_dict

CASES = [
    ("t5-small", "full", 256, 16, 1, "amp-bf16", "off"),            # allocated −16 %
    ("llama-3.2-1b", "lora", 1024, 4, 1, "bf16-true", "full"),      # reserved −0.94 GiB
    ("gpt2-medium", "full", 1024, 8, 1, "amp-fp16", "off"),         # reserved −1.46 GiB
    ("llama-tiny-58m", "full", 512, 8, 1, "fp32", "off"),           # reserved −0.45 GiB
]


def _kernels(prof: Any) -> list[tuple[str, int, float]]:
    """(kernel name, calls, device ms) of every device kernel the profiled region ran."""
    rows = [(e.key[:120], e.count, e.self_device_time_total / 1e3) for e in prof.key_averages()
            if getattr(e, "self_device_time_total", 0) > 0]
    return sorted(rows, key=lambda r: -r[2])


def trace_case(case: tuple, dev: torch.device, steps: int = 0, kernels: bool = False
               ) -> dict[str, Any]:
    """``steps``: timed steps after the metered one (the allocator's state over several steps);
    ``kernels``: also the device kernels the probe ran (profiler)."""
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
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=2_000_000)
    prof: Any = None
    try:
        probe = probe_mod.Probe(src, data, dev)
        if kernels:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                r = probe.run(job, timed_steps=steps)
        else:
            r = probe.run(job, timed_steps=steps)
        snap = torch.cuda.memory._snapshot(dev)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        probe_mod.build_real = build
        gc.collect()
        torch.cuda.empty_cache()
    traces = snap["device_traces"][dev.index or 0]
    m = r.measured
    return {"case": case_dict(case), "status": r.status, "steps": steps,
            "kernels": _kernels(prof) if prof is not None else None,
            "measured": None if m is None else {"peak_allocated_bytes": m.peak_allocated_bytes,
                                                "peak_reserved_bytes": m.peak_reserved_bytes},
            "trace": [(e["action"], e["addr"], e["size"], e["stream"]) for e in traces],
            "segments": [{k: s.get(k) for k in ("address", "total_size", "stream", "segment_type",
                                                "allocated_size", "active_size")}
                         for s in snap["segments"]]}


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("gpu_memory_trace: no CUDA device here; nothing measured, nothing written")
        return 1
    import warnings

    warnings.filterwarnings("ignore")
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path(".")
    dev = torch.device("cuda", torch.cuda.current_device())
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__}
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 0
    only = [int(i) for i in argv[argv.index("--only") + 1].split(",")] if "--only" in argv else None
    for i, case in enumerate(CASES):
        if only is not None and i not in only:
            continue
        label = " ".join(map(str, case)) + (f" +{steps} steps" if steps else "")
        try:
            doc[label] = trace_case(case, dev, steps, kernels="--kernels" in argv)
            print(label, doc[label]["status"], len(doc[label]["trace"]), "events",
                  doc[label]["measured"], flush=True)
        except Exception as err:  # keep the other cases' traces
            print(label, "error:", type(err).__name__, str(err)[:200], flush=True)
        name = argv[argv.index("--name") + 1] if "--name" in argv else "gpu_memory_traces"
        with gzip.open(out / f"{name}.pkl.gz", "wb") as f:
            pickle.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
