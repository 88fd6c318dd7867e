"""train --nproc N (torchrun, gloo ranks on CPU): the same losses as one rank, and how the
launcher says a rank's error, a rank's death and a signal."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainfit.job import JobSpec
from trainfit.run.loop import RunOptions, train


@pytest.fixture()
def job(micro_model_json, chat_jsonl):
    return JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                   precision="fp32", data=str(chat_jsonl))


def test_two_ranks_gloo_match_one_rank(job, tmp_path):
    """torchrun, 2 CPU ranks (gloo, DDP): the same losses as 1 rank with the same effective batch,
    and both ranks took the same OOM decision."""
    one = train(job.replace(micro_batch=2), RunOptions(out_dir=tmp_path / "one", max_steps=3))
    p = tmp_path / "job2.yaml"
    p.write_text(yaml.safe_dump(job.replace(ranks=2, micro_batch=2).to_dict()))
    out = tmp_path / "two"
    proc = subprocess.run([sys.executable, "-m", "trainfit.cli.main", "train", str(p), "--out",
                           str(out), "--max-steps", "3", "--nproc", "2", "--inject-oom-at", "1",
                           "--save-every", "3", "--no-live", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads((out / "train.json").read_text())
    assert d["losses"] == pytest.approx(one.losses, rel=1e-5)
    # rank 0 alone prints the run: one JSON document (every rank printed its own before)
    assert json.loads(proc.stdout)["losses"] == d["losses"]
    assert [e["micro_batch_after"] for e in d["oom_events"]] == [1]
    # the last step is a --save-every step: one checkpoint, taken by both ranks together (the
    # final save was decided from rank 0's own list, and rank 0 waited in it for ever)
    assert [Path(c).name for c in d["checkpoints"]] == ["checkpoint-3"]


def test_a_ranks_error_under_nproc_is_said_once_with_exit_2(job, tmp_path):
    """An error the ranks find (a --resume directory with no checkpoint): one error line and its
    hint, exit 2 — every rank printed it, then torchrun's ChildFailedError dump, exit 1 (an
    audit)."""
    p = tmp_path / "job2.yaml"
    p.write_text(yaml.safe_dump(job.replace(ranks=2, micro_batch=2).to_dict()))
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "trainfit.cli.main", "train", str(p), "--out",
                           str(tmp_path / "o"), "--nproc", "2", "--no-live", "--resume",
                           str(empty), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and str(empty) in errors[0], proc.stderr[-2000:]
    # --json: the launcher's one error object on stdout (a review: stdout was empty)
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 2 and f"error: {doc['error']}" == errors[0] and doc["hint"]
    assert "ChildFailedError" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_rank_that_dies_under_nproc_is_said_with_the_way_on(job, tmp_path):
    """A rank killed (the kernel's OOM killer): one error line naming the rank, the signal and
    the newest checkpoint, and a --resume hint, exit 1 as train --help documents (torchrun's log
    lines alone before)."""
    import signal
    import time

    import psutil

    p = tmp_path / "job2.yaml"
    p.write_text(yaml.safe_dump(job.replace(ranks=2, micro_batch=2).to_dict()))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainfit.cli.main", "train", str(p), "--out",
                             str(out), "--max-steps", "100000", "--nproc", "2", "--no-live",
                             "--save-every", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (out / "checkpoint-2").is_dir():
        time.sleep(0.2)
    ranks = [c for c in psutil.Process(proc.pid).children(recursive=True)
             if "trainfit.cli.main" in c.cmdline() and "trainfit.run.torchrun" not in c.cmdline()]
    killed = max(ranks, key=lambda r: r.pid)
    rank = killed.environ()["RANK"]
    killed.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-2000:]
    errors = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "a process of the run ended abnormally" in errors[0], err[-2000:]
    # the rank and its signal named (torchrun's SIGTERM to the other rank is not the cause;
    # "torchrun exit code 1" before: an audit)
    assert f"(rank {rank} killed by signal 9 (SIGKILL);" in errors[0], errors[0]
    assert f"hint: continue with --resume {out}" in err


def test_a_signal_to_the_nproc_launcher_reaches_the_ranks(job, tmp_path):
    """``train --nproc 2``: SIGTERM to trainfit's own process (a scheduler's kill) — the ranks
    save a checkpoint together and stop, exit 143; then SIGINT to it alone on the resumed run,
    exit 130. An audit: SIGTERM left both ranks training, orphaned; SIGINT did nothing."""
    import signal
    import time

    import psutil

    p = tmp_path / "job2.yaml"
    p.write_text(yaml.safe_dump(job.replace(ranks=2, micro_batch=2).to_dict()))
    out = tmp_path / "run"

    def run_until_signalled(sig, extra, after_step, where=None):
        proc = subprocess.Popen([sys.executable, "-m", "trainfit.cli.main", "train", str(p),
                                 "--out", str(where or out), "--max-steps", "100000", "--nproc",
                                 "2", "--no-live", *extra], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        log = (where or out) / "monitor.jsonl"
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if not after_step:
                if any("trainfit.run.torchrun" in c.cmdline()
                       for c in psutil.Process(proc.pid).children()):
                    break  # torchrun started: signalled while it or the ranks still start
            elif log.exists() and any((json.loads(x).get("step") or 0) >= after_step
                                    for x in log.read_text().splitlines() if x.strip()):
                break
            time.sleep(0.2)
        family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=240)
        _, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, [a.cmdline() for a in alive]  # no rank left running
        return proc.returncode, stderr

    code, err = run_until_signalled(signal.SIGTERM, [], 2)
    assert code == 143, err[-2000:]
    d = json.loads((out / "train.json").read_text())
    assert d["stopped"] == "interrupted" and d["signal"] == "SIGTERM"
    first = d["steps"]
    assert (out / f"checkpoint-{first}").is_dir()
    code, err = run_until_signalled(signal.SIGINT, ["--resume", str(out)], first + 1)
    assert code == 130, err[-2000:]
    d = json.loads((out / "train.json").read_text())
    assert d["signal"] == "SIGINT" and d["steps"] > first and (out / f"checkpoint-{d['steps']}").is_dir()
    # a SIGTERM once torchrun runs, while it or the ranks still start: 143 as for one
    # process, no traceback (a review: 241, or 1)
    code, err = run_until_signalled(signal.SIGTERM, [], 0, where=tmp_path / "early")
    assert code == 143 and "Traceback" not in err, err[-2000:]


def test_the_failed_rank_is_named_with_its_signal_not_torchruns_sigterm():
    """The rank a signal killed is the cause; torchrun's SIGTERM to the others is listed too
    (at the same second, a lower rank); a rank that exited is named with its code."""
    from trainfit.run.launch import _how

    assert _how([{"rank": 0, "exit_code": -15, "timestamp": 5},
                 {"rank": 1, "exit_code": -9, "timestamp": 5}]) == \
        "rank 1 killed by signal 9 (SIGKILL)"
    assert _how([{"rank": 1, "exit_code": -15, "timestamp": 7}]) == \
        "rank 1 killed by signal 15 (SIGTERM)"
    assert _how([{"rank": 1, "exit_code": 1, "timestamp": 6},
                 {"rank": 0, "exit_code": 1, "timestamp": 7}]) == "rank 1 exited with code 1"
    assert _how([]) is None
    # the other rank's answer to torchrun's SIGTERM (trainfit's ranks exit 143) is no cause
    assert _how([{"rank": 0, "exit_code": 143, "timestamp": 5},
                 {"rank": 1, "exit_code": 1, "timestamp": 5}]) == "rank 1 exited with code 1"
