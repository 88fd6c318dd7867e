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
                               "sync_s", "logging_io_s", "idle_s", "other_s", "step_time_s"}
    assert d["split"]["idle_s"] is None  # no device queue on a CPU
    # the report reads what the doctor writes
    p = tmp_path / "doctor.json"
    p.write_text(json.dumps(d))
    inputs = load_inputs([str(p)])
    assert inputs.doctors[0].findings[0].bottleneck == "input-bound"
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
