"""A real tiny trainfit job with seed 003's loader: named input-bound, fixed, measured again."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from trainfit.doctor import fixes
from trainfit.doctor.run import doctor_job
from trainfit.report.load import load_inputs


def test_input_bound_job_is_named_fixed_and_remeasured(input_bound_yaml, one_thread, tmp_path):
    r = doctor_job(input_bound_yaml, steps=3, warmup=1, repeats=1)
    assert r.findings[0].bottleneck == "input-bound"
    assert r.findings[0].evidence["data_wait_fraction"] >= 0.2
    assert r.before.data_wait_fraction >= 0.2
    assert any("pre-tokenized" in a for a in r.applied) and any("packing" in a for a in r.applied)
    assert r.after is not None and r.after.data_wait_fraction < r.before.data_wait_fraction
    assert r.overhead_fraction is not None and 0 <= r.overhead_fraction < 0.03
    d = r.to_dict()
    assert d["kind"] == "doctor" and d["steps_measured"] == 3
    assert set(d["split"]) == {"data_wait_s", "h2d_copy_s", "forward_s", "backward_s", "optimizer_s",
                               "sync_s", "logging_io_s", "idle_s", "other_s", "step_time_s",
                               "parts_scale", "step_time_spread_s"}
    assert d["split"]["idle_s"] is None  # no device queue on a CPU
    # the report reads what the doctor writes
    p = tmp_path / "doctor.json"
    p.write_text(json.dumps(d))
    inputs = load_inputs([str(p)])
    assert inputs.doctors[0].findings[0].bottleneck == "input-bound"
    assert inputs.doctors[0].findings[0].detail == r.findings[0].detail != ""
    # a second doctor run maps the cached token file instead of tokenizing again
    calls = fixes.TOKENIZE_CALLS
    r2 = doctor_job(input_bound_yaml, steps=3, warmup=1, repeats=1)
    assert fixes.TOKENIZE_CALLS == calls
    assert any("reused from the cache" in a for a in r2.applied)


def test_bad_job_files(tmp_path):
    from trainfit.cli.main import app

    runner = CliRunner()
    bad = tmp_path / "bad.yaml"
    bad.write_text("doctor: {tokenize: sometimes}\nmodel: llama-tiny-58m\n")
    res = runner.invoke(app, ["doctor", str(bad)])
    assert res.exit_code == 2 and "doctor.tokenize" in res.output
    res = runner.invoke(app, ["doctor", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "no such file" in res.output
    (tmp_path / "dir.yaml").mkdir()  # an audit: "no such file" of a directory
    res = runner.invoke(app, ["doctor", str(tmp_path / "dir.yaml")])
    assert res.exit_code == 2 and "is a directory, not a job file" in res.output
    nodata = tmp_path / "nodata.yaml"
    nodata.write_text("model: llama-tiny-58m\n")
    res = runner.invoke(app, ["doctor", str(nodata)])
    assert res.exit_code == 2 and "no data" in res.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_round_carries_the_cards_reserved_peak(input_bound_yaml):
    """On a GPU the round measures the card's own peak (what needless-recompute reads against
    the card's capacity), from its first step: not the host's RSS, not an earlier round's."""
    from trainfit.doctor.inject import MIN_MEASURED_STEPS
    from trainfit.doctor.measure import JobRunner
    from trainfit.doctor.run import _job_to_examine
    from trainfit.model.source import resolve_model

    steps = MIN_MEASURED_STEPS  # the fewest doctor measures (a run on an H200 found 2 refused)
    _, job, _, _ = _job_to_examine(input_bound_yaml, None, "eager", None, steps)
    runner = JobRunner(job, resolve_model(job.model), torch.device("cuda"), data_path=job.data)
    first = runner.measure(job, runner.data("eager", job), steps=steps, warmup=1, profile=False)
    assert first.device_peak_reserved_bytes is not None
    assert first.device_peak_reserved_bytes >= torch.cuda.max_memory_allocated() > 0
    torch.cuda.empty_cache()
    again = runner.measure(job, runner.data("eager", job), steps=steps, warmup=1, profile=False)
    assert 0 < again.device_peak_reserved_bytes <= 2 * first.device_peak_reserved_bytes


def test_a_spread_over_one_round_is_unknown_not_zero():
    """An audit: doctor --json gave before_spread 0.0 after one round; a spread needs two."""
    from trainfit.doctor.result import Metrics, _spread

    one = Metrics(step_time_s=1.0, tokens_per_s=100.0, data_wait_fraction=None,
                  gpu_util_percent=None)
    assert _spread(one) == {"step_time_s": None, "tokens_per_s": None, "rounds": 1}
    two = Metrics(step_time_s=1.0, tokens_per_s=100.0, data_wait_fraction=None,
                  gpu_util_percent=None, step_time_spread_s=0.1, tokens_per_s_spread=9.0,
                  rounds=2)
    assert _spread(two) == {"step_time_s": 0.1, "tokens_per_s": 9.0, "rounds": 2}


def test_a_cpu_memory_limit_is_read_against_live_tensor_bytes(micro_model_json, text_jsonl,
                                                              tmp_path, one_thread):
    """An audit: doctor read a job file's memory_limit (tune's: live tensor bytes) against the
    process's RSS — 1.42 GiB of interpreter and libraries against 2.5 GiB hid that checkpointing
    was needless. It now measures the step's live tensors, as tune and train count them (the
    simulation of the same step, exact on CPU, agrees); a limit given as a size is read too."""
    from trainfit.data import builtin_tokenizer, read_rows, tokenize_rows
    from trainfit.job import JobSpec
    from trainfit.model.source import resolve_model
    from trainfit.tune.tuner import CpuPredictor

    job = tmp_path / "job.yaml"
    job.write_text(f"model: {micro_model_json}\ndata: {text_jsonl}\nseq_len: 32\nmicro_batch: 2\n"
                   "grad_accum: 2\nprecision: fp32\ngrad_ckpt: full\nmemory_limit: 64MiB\n")
    r = doctor_job(job, steps=3, warmup=1, repeats=1)
    (f,) = [f for f in r.findings if f.bottleneck == "needless-recompute"]
    assert f.evidence["memory_capacity_bytes"] == 64 * 2**20
    src = resolve_model(str(micro_model_json))
    data = tokenize_rows(read_rows(text_jsonl), builtin_tokenizer(), seq_len=32, task=src.task)
    want = CpuPredictor(src, data)(JobSpec(model=str(micro_model_json), data="x", seq_len=32,
                                           micro_batch=2, grad_accum=2, precision="fp32",
                                           grad_ckpt="full")).peak_allocated_bytes
    # 2,331,552 measured against 2,330,528 simulated when written (+0.04 %)
    assert f.evidence["peak_memory_bytes"] == pytest.approx(want, rel=0.01)
    assert f.evidence["peak_memory_bytes"] < 2**24  # not the process's RSS (hundreds of MiB)
    assert any("grad_ckpt full → off" in a and "within the memory_limit" in a for a in r.applied)


def test_checkpointing_stays_on_where_its_removal_would_break_the_limit():
    """needless-recompute is applied only after the step without checkpointing is measured
    within the CPU memory limit (the rounds themselves run without the limit's tracker)."""
    from types import SimpleNamespace as NS

    from trainfit.doctor.run import _apply_fixes
    from trainfit.job import JobSpec

    job = JobSpec(model="m", data="d", seq_len=32, micro_batch=2, grad_accum=2, grad_ckpt="full")
    for need, kept in ((3 * 2**20, True), (2**20 // 2, False)):
        bench = NS(job=job, before_mode="eager", lazy=False, capacity=2**20,
                   live_peak=lambda j, n=need: n)
        notes: list[str] = []
        after, _, applied = _apply_fixes(bench, ["needless-recompute"], None, notes)
        assert (after.grad_ckpt == "full") is kept
        assert any("checkpointing kept" in n and "over the memory_limit" in n for n in notes) is kept
        assert bool(applied) is not kept


def test_a_larger_micro_batch_over_the_limit_is_not_probed():
    """An audit: under memory_limit 3MiB doctor applied micro-batch 16 and called it faster
    (+252 %), where train under the same limit split it back to 2 — the rounds run without the
    limit's tracker, so no OOM came on the CPU. A larger micro-batch is measured against the
    limit first: over it, not probed, and said."""
    from types import SimpleNamespace as NS

    from trainfit.doctor.run import _probe_micro_batch
    from trainfit.job import JobSpec

    job = JobSpec(model="m", data="d", seq_len=32, micro_batch=1, effective_batch=16)
    measured: list[int] = []

    def measure(j, mode, label, n=None, profile=True):
        measured.append(j.micro_batch)
        return NS(tokens_per_s=300.0)

    for per_sample, want in ((2**20, 4), (4 * 2**20, None)):
        measured.clear()
        bench = NS(job=job, before_mode="eager", capacity=5 * 2**20, measure=measure,
                   live_peak=lambda j, b=per_sample: j.micro_batch * b)
        notes: list[str] = []
        probe = _probe_micro_batch(bench, NS(tokens_per_s=100.0), notes)
        # 16 holds 16 MiB (over 5): not run; 4 holds 4 MiB: probed, +200 %
        assert (probe[0] if probe else None) == want
        assert 16 not in measured
        assert any("micro-batch 16 not probed" in n and "over the memory_limit" in n
                   for n in notes)
    assert measured == [] and any("micro-batch 4 not probed" in n for n in notes)


def test_the_live_peak_of_a_fresh_configuration_is_its_steady_steps(micro_model_json, text_jsonl,
                                                                   one_thread):
    """A review: the live peak of the configuration a fix would run was measured on its first
    step, whose forward and backward run before AdamW's states exist (3 % low), and doctor took
    checkpointing off under a limit the run then broke. It is the steady step's, as the
    simulation of the same step gives it."""
    import torch

    from trainfit.data import builtin_tokenizer, read_rows, tokenize_rows
    from trainfit.doctor.measure import JobRunner
    from trainfit.job import JobSpec
    from trainfit.model.source import resolve_model
    from trainfit.tune.tuner import CpuPredictor

    job = JobSpec(model=str(micro_model_json), data=str(text_jsonl), seq_len=32, micro_batch=4,
                  grad_accum=1, precision="fp32", grad_ckpt="off")
    src = resolve_model(str(micro_model_json))
    runner = JobRunner(job, src, torch.device("cpu"), data_path=str(text_jsonl))
    data = runner.data("eager", job)
    fresh = runner.live_peak_bytes(job, data)
    again = runner.live_peak_bytes(job, data)  # states exist now
    tok = tokenize_rows(read_rows(text_jsonl), builtin_tokenizer(), seq_len=32, task=src.task)
    want = CpuPredictor(src, tok)(job).peak_allocated_bytes
    assert fresh == again
    assert fresh == pytest.approx(want, rel=0.01)
