"""TensorBoard scalars, when tensorboard is installed (the ``hf`` extra): the step metrics fed to the
sampler come back from the event file unchanged."""

from __future__ import annotations

import importlib.util

import pytest

from trainfit.monitor import Sampler

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                reason="tensorboard not installed (pip install -e '.[hf]')")


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_step_metrics_reach_tensorboard(no_nvml, tmp_path):
    s = Sampler(tensorboard_dir=tmp_path / "tb", live=False, interval_s=10.0)
    s.open()
    for step, loss in ((1, 3.0), (2, 2.5)):
        s.record_step(step=step, loss=loss, tokens=1024, samples=4, step_time_s=0.5, data_wait_s=0.25)
        s.sample_once()
        s.sample_once()  # no step ended (a save): the step's metrics are not drawn again (an audit)
    s.stop()
    tags = _scalars(tmp_path / "tb")
    assert tags["train/loss"] == [(1, 3.0), (2, 2.5)]
    assert len(tags["host/host_ram_used_bytes"]) >= 4  # the host's readings at every sample
    assert tags["train/tokens_per_s"] == [(1, pytest.approx(2048.0)), (2, pytest.approx(2048.0))]
    assert tags["train/data_wait_fraction"][-1][1] == pytest.approx(0.5)
    assert "host/host_ram_used_bytes" in tags and not any(t.startswith("gpu") for t in tags)


def test_a_resumed_runs_readings_before_its_first_step_sit_at_its_start(no_nvml, tmp_path):
    """Host readings taken before a resumed segment's first step were drawn at steps 0, 1, 2 …,
    over the earlier segment's (an audit): they sit at the step the run starts from."""
    from trainfit.monitor.progress import StepProgress

    s = Sampler(tensorboard_dir=tmp_path / "tb", live=False, interval_s=10.0)
    s.progress = StepProgress(total_steps=10, start_step=7)
    s.open()
    s.sample_once()
    s.sample_once()
    s.record_step(step=8, loss=2.0, tokens=64, samples=4, step_time_s=0.5)
    s.sample_once()
    s.stop()
    tags = _scalars(tmp_path / "tb")
    assert [st for st, _ in tags["host/host_ram_used_bytes"]][:3] == [7, 7, 8]
    assert tags["train/loss"] == [(8, 2.0)]


def test_train_writes_tensorboard(micro_model_json, chat_jsonl, tmp_path):
    from trainfit.job import JobSpec
    from trainfit.run.loop import RunOptions, train

    job = JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                  precision="fp32", data=str(chat_jsonl))
    res = train(job, RunOptions(out_dir=tmp_path / "run", max_steps=2, eval_fraction=0.25,
                                monitor_interval_s=0.05))
    tags = _scalars(tmp_path / "run" / "tensorboard")
    # every sample carries the last step's numbers; the last one is the run's last loss
    assert tags["train/loss"][-1] == (2, pytest.approx(res.losses[-1]))
    assert tags["eval/eval_loss"] == [(2, pytest.approx(res.evals[-1]["eval_loss"]))]
