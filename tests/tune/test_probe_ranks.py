"""Probe under torchrun (2 gloo ranks on CPU, DDP): a rank that runs out of memory alone — in a
forward, or in the backward whose all-reduce the other rank is already waiting in — does not leave
the other rank hanging: both report the OOM and go on to the next probe, whose collectives still
line up. A rank alone over the host-RAM budget, likewise.

The ranks get different memory limits (what differs between GPUs in real life: another process
on one of them, fragmentation), set from the peaks the same probes measure in one process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

import trainfit
from trainfit.data.load import load_data
from trainfit.engine.dist import leave_together
from trainfit.job import JobSpec
from trainfit.model.runtime import build_real
from trainfit.model.source import resolve_model
from trainfit.tune.probe import Probe

# micro-batch × accumulation per rank (effective batch 8 over 2 ranks)
SPLITS = ((4, 1), (2, 2), (1, 4))


def _job(model: str, data: str) -> JobSpec:
    return JobSpec(model=model, seq_len=32, effective_batch=8, ranks=2, precision="fp32",
                   grad_ckpt="off", data=data)


def _result(r) -> dict:
    m = r.measured
    return {"status": r.status, "phase": r.oom_phase, "detail": r.detail,
            "tokens_per_s": m.tokens_per_s if m else None,
            "peak_allocated_bytes": m.peak_allocated_bytes if m else None}


def _worker(spec_path: Path) -> None:
    """One rank: the probes in order, each under this rank's limit for it; results as JSON."""
    spec = json.loads(spec_path.read_text())
    rank = int(os.environ["RANK"])
    job = _job(spec["model"], spec["data"])
    src = resolve_model(spec["model"])
    data = load_data(job, src)
    probe = Probe(src, data, torch.device("cpu"))
    out = []
    all_reduces = []
    for k, ((m, a), limits) in enumerate(zip(spec["splits"], spec["limits"], strict=True)):
        probe.memory_limit_bytes = limits[rank]
        out.append(_result(probe.run(job.replace(micro_batch=m, grad_accum=a), timed_steps=1)))
        if k == 0:  # the DDP wrapper exists now (the probe's own, reached for the test's count)
            def count(state, bucket):
                all_reduces.append(1)
                return allreduce_hook(state, bucket)
            probe._wl.step_model.register_comm_hook(None, count)
    # rank 1 alone over the host-RAM budget (1 byte), then a probe that fits everywhere
    probe.memory_limit_bytes = None
    probe.max_host_ram_bytes = 1 if rank == 1 else None
    out.append(_result(probe.run(job.replace(micro_batch=1, grad_accum=4), timed_steps=1)))
    probe.max_host_ram_bytes = None
    out.append(_result(probe.run(job.replace(micro_batch=1, grad_accum=4), timed_steps=1)))
    out.append({"gradient_all_reduces": len(all_reduces)})
    Path(spec["results"], f"rank{rank}.json").write_text(json.dumps(out))


def test_one_rank_oom_does_not_hang_the_other(tmp_path, micro_model_json, text_jsonl):
    job = _job(str(micro_model_json), str(text_jsonl))
    src = resolve_model(job.model)
    data = load_data(job, src)
    one = Probe(src, data, torch.device("cpu"))
    peak = {m: one.run(job.replace(micro_batch=m, grad_accum=a), timed_steps=0)
            .measured.peak_allocated_bytes for m, a in SPLITS}
    assert peak[4] > peak[2] > peak[1]
    # under DDP each rank also holds the gradient buckets: one fp32 copy of every gradient
    buckets = 4 * build_real(job, src, torch.device("cpu")).trainable_params
    splits = [(4, 1), (2, 2), (1, 4), (1, 4)]
    limits = [
        # rank 1 runs out at its peak, in the backward (DDP's gradient all-reduce, where rank 0,
        # which fits, used to wait forever)
        [None, peak[4] + buckets - 1],
        # rank 0 runs out in the forward, rank 1 fits and goes on towards the all-reduce
        [(peak[2] + peak[1]) // 2 + buckets, None],
        # rank 1 runs out while the weights are counted, before any step
        [None, 1000],
        [None, None],  # fits everywhere, timed through DDP
    ]
    results = tmp_path / "results"
    results.mkdir()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": job.model, "data": job.data, "splits": splits,
                                "limits": limits, "results": str(results)}))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(
        [str(Path(trainfit.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    # its own session: on a timeout (a hang: what this test guards against) the ranks are killed
    # with torchrun, not left waiting in gloo
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=2", __file__, str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    r0, r1 = (json.loads((results / f"rank{k}.json").read_text()) for k in (0, 1))
    assert (r1[0]["status"], r1[0]["phase"]) == ("oom", "backward")
    assert r0[0]["status"] == "oom" and "another rank" in r0[0]["detail"]
    assert (r0[1]["status"], r0[1]["phase"]) == ("oom", "forward")
    assert r1[1]["status"] == "oom" and "another rank" in r1[1]["detail"]
    assert (r1[2]["status"], r1[2]["phase"]) == ("oom", "setup")
    assert r0[2]["status"] == "oom" and "another rank" in r0[2]["detail"]
    # fits on both, timed through DDP (the collectives still line up); the slowest rank's speed
    # and the worst peak, agreed: the single-process peak + the buckets
    assert r0[3]["status"] == r1[3]["status"] == "ok"
    assert r0[3]["tokens_per_s"] == pytest.approx(r1[3]["tokens_per_s"], rel=1e-9)
    assert r0[3]["tokens_per_s"] > 0
    assert r0[3]["peak_allocated_bytes"] == r1[3]["peak_allocated_bytes"] == peak[1] + buckets
    # rank 1 alone over the host-RAM budget: both take it; the next probe runs on both
    assert r1[4]["status"] == "over-host-ram" and "--max-host-ram" in r1[4]["detail"]
    assert r0[4]["status"] == "over-host-ram" and "another rank" in r0[4]["detail"]
    assert r0[5]["status"] == r1[5]["status"] == "ok"
    # DDP's gradient all-reduce (one bucket: the micro model's gradients are < 25 MB), counted from
    # after the first probe: once per timed step of the three probes that ran (accumulation under
    # no_sync), never in a metered step
    assert r0[6]["gradient_all_reduces"] == r1[6]["gradient_all_reduces"] == 3


if __name__ == "__main__":  # a torchrun rank (see the test)
    _worker(Path(sys.argv[1]))
    leave_together()  # every rank has written its results
