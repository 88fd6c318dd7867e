"""plan over a grid: micro-batches keep the effective batch, fit decisions follow memory."""

import pytest

from trainfit.hardware.gpus import find_gpu, generic_gpu
from trainfit.job import JobError, JobSpec
from trainfit.plan import plan


def test_grid_keeps_effective_batch_and_marks_largest(tiny_llama):
    job = JobSpec(model="t", seq_len=64, effective_batch=8)
    res = plan(job, tiny_llama, find_gpu("a100-80gb"))
    assert {r.job["precision"] for r in res.rows} == {"fp32", "amp-fp16", "amp-bf16", "bf16-true"}
    for r in res.rows:
        assert r.job["micro_batch"] * r.job["grad_accum"] == 8
    assert sorted({r.job["micro_batch"] for r in res.rows}) == [1, 2, 4, 8]
    rec = res.rows[res.recommended_index]
    assert rec.how == "simulated" and rec.memory.fits
    # every row has a predicted speed on a known GPU, and the pick is the fastest that fits
    assert all(r.speed is not None and r.speed.tokens_per_s > 0 for r in res.rows)
    fitting = [r for r in res.rows if r.memory.fits]
    assert rec.speed.tokens_per_s == max(r.speed.tokens_per_s for r in fitting)
    assert rec.rank == 1


def test_checkpointing_lowers_the_peak(tiny_llama):
    job = JobSpec(model="t", seq_len=128, effective_batch=4, precision="fp32")
    res = plan(job, tiny_llama, find_gpu("a100-80gb"), verify=False)
    by = {(r.job["grad_ckpt"], r.job["micro_batch"]): r.memory.peak_allocated_bytes
          for r in res.rows}
    assert by[("full", 4)] < by[("off", 4)]


def test_nothing_fits_says_so(tiny_llama):
    job = JobSpec(model="t", seq_len=64, effective_batch=4)
    res = plan(job, tiny_llama, generic_gpu(0.001))
    assert res.recommended_index is None
    assert "nothing fits" in res.reason


def test_bf16_on_t4_is_refused(tiny_llama):
    with pytest.raises(JobError, match="no bf16"):
        plan(JobSpec(model="t", precision="bf16-true"), tiny_llama, find_gpu("t4"))


def test_t4_grid_has_no_bf16(tiny_llama):
    res = plan(JobSpec(model="t", seq_len=64, effective_batch=2), tiny_llama, find_gpu("t4"),
               verify=False)
    assert {r.job["precision"] for r in res.rows} == {"fp32", "amp-fp16"}


def test_qlora_without_bitsandbytes_is_refused(tiny_llama, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(JobError, match="needs bitsandbytes"):
        plan(JobSpec(model="t", method="qlora"), tiny_llama, find_gpu("t4"))
