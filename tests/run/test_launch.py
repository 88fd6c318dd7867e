"""run/launch.py's pure parts: the ranks' command line, their errors said once, exit codes."""

import json

from trainfit.run import launch as launch_mod


def test_rank_argv_drops_nproc_in_either_spelling():
    assert launch_mod.rank_argv(["train", "j.yaml", "--nproc", "2", "--out", "o"]) == [
        "train", "j.yaml", "--out", "o"]
    assert launch_mod.rank_argv(["train", "j.yaml", "--nproc=2"]) == ["train", "j.yaml"]


def test_the_ranks_errors_are_said_once_lowest_rank_first(tmp_path):
    for rank, msg in ((1, "same"), (0, "same"), (2, "other")):
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(
            {"rank": rank, "message": msg, "hint": "fix" if rank == 0 else None}))
    (tmp_path / ".rank-3.json").write_text("{half")  # a write not renamed yet: not read
    (tmp_path / "rank-4.json").write_text("{corrupt")
    errors = launch_mod._rank_errors(tmp_path)
    assert [(e.rank, e.message, e.hint) for e in errors] == [(0, "same", "fix"),
                                                             (2, "other", None)]


def test_launch_refuses_a_job_of_other_ranks_before_starting_anything(tmp_path, monkeypatch):
    import pytest

    from trainfit.job import JobError, JobSpec

    started = []
    monkeypatch.setattr(launch_mod, "_run_torchrun", lambda *a: started.append(a) or (0, None))
    job = JobSpec(model="tiny-llama", effective_batch=2, micro_batch=1, ranks=1)
    with pytest.raises(JobError, match="--nproc 2 but the job says ranks 1"):
        launch_mod.launch(2, "cpu", job, "j.yaml", tmp_path, ["train", "j.yaml", "--nproc", "2"])
    assert not started


def test_a_dead_rank_names_the_newest_checkpoint(tmp_path, monkeypatch):
    from trainfit.job import JobSpec

    monkeypatch.setattr(launch_mod, "_run_torchrun", lambda *a: (-9, None))
    monkeypatch.setattr(launch_mod, "check_nproc", lambda *a: None)
    job = JobSpec(model="tiny-llama", effective_batch=2, micro_batch=1, ranks=2)
    got = launch_mod.launch(2, "cpu", job, "j.yaml", tmp_path / "missing", ["train"])
    assert got.exit_code == 1 and got.failure is not None
    assert got.failure.how == "killed by signal 9" and got.failure.newest_checkpoint is None
