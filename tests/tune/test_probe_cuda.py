"""The CUDA path of the probe, tune and NVML on a real GPU (skipped without CUDA).

Run where a GPU is: ``pytest tests/test_probe_cuda.py -v``. The model is the catalog's
llama-tiny-58m (built from its configuration, no download), large enough that the allocator's
workspaces do not dominate the peak, small enough for any GPU of ≥ 8 GiB.
The tolerances are those the issue asks of a prediction on a GPU; measurements across GPUs go in
``benchmarks/gpu_validate.py`` (results/gpu_validate.*).
"""

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.data.load import load_data
from trainfit.job import JobSpec
from trainfit.model.source import resolve_model
from trainfit.tune.probe import Probe
from trainfit.tune.tuner import TuneOptions, _gpu_predictor, _isolated_probe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DATA = Path(__file__).resolve().parents[2] / "examples" / "data" / "tiny_text.jsonl"
MODEL = "llama-tiny-58m"


def _job(**kw) -> JobSpec:
    base = dict(model=MODEL, seq_len=256, effective_batch=8, micro_batch=4, precision="fp32",
                grad_ckpt="off", data=str(DATA))
    return JobSpec(**{**base, **kw})


@pytest.fixture(scope="module")
def setup():
    src = resolve_model(MODEL)
    data = load_data(_job(), src)
    dev = torch.device("cuda", torch.cuda.current_device())
    return src, data, dev


def _precisions() -> list[str]:
    return ["fp32", "amp-bf16", "bf16-true"] if torch.cuda.is_bf16_supported() else ["fp32"]


@pytest.mark.parametrize("precision", _precisions())
@pytest.mark.parametrize("ckpt", ["off", "full"])
def test_cuda_probe_peaks_and_prediction(setup, precision, ckpt):
    src, data, dev = setup
    job = _job(precision=precision, grad_ckpt=ckpt)
    r = Probe(src, data, dev).run(job, timed_steps=3)
    assert r.status == "ok", r.detail
    m = r.measured
    # the three peaks nest: tensors ≤ the allocator's segments ≤ the device's used memory
    assert 0 < m.peak_allocated_bytes <= m.peak_reserved_bytes <= m.peak_device_bytes
    assert m.tokens_per_s > 0 and m.step_time_s > 0 and 0 <= m.data_wait_fraction < 1
    assert m.alloc_retries == 0  # a 58M model on a ≥ 8 GiB card never reaches the limit
    pred = _gpu_predictor(src, torch.cuda.get_device_name(dev),
                          torch.cuda.get_device_properties(dev).total_memory)(job)
    err = abs(pred.peak_allocated_bytes - m.peak_allocated_bytes) / m.peak_allocated_bytes
    assert err <= 0.10, (precision, ckpt, pred.peak_allocated_bytes, m.peak_allocated_bytes)
    err_r = abs(pred.peak_reserved_bytes - m.peak_reserved_bytes) / m.peak_reserved_bytes
    assert err_r <= 0.15, (precision, ckpt, pred.peak_reserved_bytes, m.peak_reserved_bytes)


def test_cuda_oom_caught_and_recovered_in_process(setup):
    """A per-process cap makes micro-batch 8 run out of memory for real; the probe reports it, frees,
    and the next probe in the same process runs."""
    src, data, dev = setup
    probe = Probe(src, data, dev)
    fits = probe.run(_job(micro_batch=1), timed_steps=0)
    assert fits.status == "ok"
    total = torch.cuda.get_device_properties(dev).total_memory
    cap = fits.measured.peak_reserved_bytes * 1.3
    torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0), dev)
    try:
        big = probe.run(_job(micro_batch=8, effective_batch=8), timed_steps=0)
        assert big.status == "oom", big
        again = probe.run(_job(micro_batch=1), timed_steps=0)
        assert again.status == "ok"
        assert again.measured.peak_allocated_bytes == fits.measured.peak_allocated_bytes
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)


def test_isolated_cuda_probe_matches_in_process(setup):
    src, data, dev = setup
    job = _job()
    iso = _isolated_probe(src, data, TuneOptions(device=str(dev), isolate=True))(job, 0)
    inproc = Probe(src, data, dev).run(job, timed_steps=0)
    assert iso.status == inproc.status == "ok"
    a, b = iso.measured.peak_allocated_bytes, inproc.measured.peak_allocated_bytes
    assert abs(a - b) / b <= 0.01, (a, b)


def test_nvml_reads_the_device_torch_uses(setup):
    from trainfit.monitor.nvml import Nvml

    _, _, dev = setup
    nv = Nvml().open()
    assert nv.available, nv.reason
    try:
        hold = torch.empty(512 * 2**20, dtype=torch.uint8, device=dev)  # 512 MiB held
        torch.cuda.synchronize(dev)
        free, total = torch.cuda.mem_get_info(dev)
        idx = dev.index if os.environ.get("CUDA_VISIBLE_DEVICES") is None else None
        readings = nv.read(None if idx is None else [idx], pids={os.getpid()})
        r = readings[0]
        assert abs(r.memory_total_bytes - total) / total < 0.05
        # NVML counts the memory the driver reserves for itself in both its total and its used
        # (H100, driver 580: 85,520,809,984 vs CUDA's 85,017,493,504 bytes, and the 503,316,480
        # between them in used too — measured): beyond it, NVML's used is cudaMemGetInfo's
        driver_reserved = r.memory_total_bytes - total
        used_by_cuda = r.memory_used_bytes - driver_reserved
        assert abs(used_by_cuda - (total - free)) / (total - free) < 0.05
        assert r.memory_used_bytes >= hold.numel()
        assert r.util_percent is not None and 0 <= r.util_percent <= 100
    finally:
        nv.close()


def test_tune_cli_on_cuda(tmp_path):
    out = tmp_path / "trainfit.yaml"
    res = CliRunner().invoke(app, ["tune", "--model", MODEL, "--seq-len", "256",
                                   "--effective-batch", "8", "--data", str(DATA), "--device", "cuda",
                                   "--memory-limit", "4GiB", "--knobs", "grad_ckpt",
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout[res.stdout.index("{"):])
    m = d["pick"]["measured"]
    assert m["peak_reserved_bytes"] is not None and m["peak_reserved_bytes"] <= 4 * 2**30
    assert d["pick"]["micro_batch"] * d["pick"]["grad_accum"] == 8
    assert out.exists()
