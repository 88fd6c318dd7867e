"""--json's errors: one object on stdout ({"error", "hint", "exit_code"}, docs/json-formats.md)
for every command's bad input, a usage error click cannot parse too; rank 0 alone under torchrun."""

import json

import pytest
from typer.testing import CliRunner

from trainfit.cli.main import app

runner = CliRunner()

@pytest.mark.parametrize("args", [
    ["plan", "gpt2", "--gpu", "t5000", "--json"],
    ["tune", "missing.yaml", "--json"],
    ["train", "missing.yaml", "--json"],
])
def test_an_error_under_json_is_a_json_document_on_stdout_too(args):
    """An audit: --json's reader got an empty stdout on bad input (the error was text alone)."""
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert set(doc) == {"error", "hint", "exit_code"} and doc["exit_code"] == 2
    assert doc["error"] and doc["hint"]
    assert f"error: {doc['error']}" in res.stderr  # the text line as before


def test_a_usage_error_under_json_is_a_json_document_too(monkeypatch):
    """A review: `plan --seq-len abc --json` (click's usage error) printed no JSON, though
    docs/json-formats.md promises one object for every --json error."""
    import sys

    from typer import rich_utils

    from trainfit.cli.startup import one_line_usage_errors

    monkeypatch.setattr(rich_utils, "rich_format_error", rich_utils.rich_format_error)
    one_line_usage_errors()
    args = ["plan", "gpt2", "--seq-len", "abc", "--json"]
    monkeypatch.setattr(sys, "argv", ["trainfit", *args])
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert doc["exit_code"] == 2 and "invalid value for '--seq-len'" in doc["error"]
    assert f"hint: {doc['hint']}" in res.stderr
    # a --json of the user's own command (after --) is not trainfit's
    monkeypatch.setattr(sys, "argv", ["trainfit", "plan", "--seq-len", "abc", "--", "x", "--json"])
    res = runner.invoke(app, ["plan", "--seq-len", "abc", "--", "x", "--json"])
    assert res.exit_code == 2 and res.stdout == ""


def test_under_torchrun_rank_0_alone_prints_the_error_object(monkeypatch):
    """A review: every rank of a torchrun printed the error JSON (two documents on one stdout)."""
    args = ["plan", "gpt2", "--gpu", "t5000", "--json"]
    monkeypatch.setenv("RANK", "1")
    # a RANK without WORLD_SIZE (a cluster's pod index) is no torchrun rank: the object printed
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and json.loads(res.stdout)["exit_code"] == 2
    monkeypatch.setenv("WORLD_SIZE", "2")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and res.stdout == "" and "unknown GPU" in res.stderr
    monkeypatch.setenv("RANK", "0")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and json.loads(res.stdout)["exit_code"] == 2


def test_an_error_without_json_leaves_stdout_empty():
    res = CliRunner().invoke(app, ["plan", "gpt2", "--gpu", "t5000"])
    assert res.exit_code == 2 and res.stdout == "" and "unknown GPU" in res.stderr


def test_doctor_and_monitor_errors_under_json_are_json_too(tmp_path):
    res = CliRunner().invoke(app, ["doctor", str(tmp_path / "missing.yaml"), "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["exit_code"] == 2
    res = CliRunner().invoke(app, ["monitor", "--duration", "0", "--json"])
    assert res.exit_code == 2 and "--duration 0" in json.loads(res.stdout)["error"]


def test_the_nproc_launcher_prints_one_object_for_several_errors_and_a_dead_rank(
        monkeypatch, capsys, tmp_path):
    """train --nproc --json: the ranks print no error object; the launcher prints one, the first
    error with every one under ``errors``, and a dead rank's exit code (1)."""
    from pathlib import Path

    from trainfit.cli import train as train_cli
    from trainfit.run.launch import Launched, RankError, RankFailure

    got = Launched(exit_code=1, errors=[RankError(rank=0, message="bad data", hint="fix it")],
                   failure=RankFailure(how="killed by signal 9",
                                       newest_checkpoint=Path("run/checkpoint-2")))
    monkeypatch.setattr(train_cli, "launch", lambda *a, **k: got)
    assert train_cli._launch(2, "cpu", None, "job.yaml", str(tmp_path), as_json=True) == 1
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["exit_code"] == 1 and doc["error"] == "bad data" and doc["hint"] == "fix it"
    assert [e["error"] for e in doc["errors"]][1].startswith(
        "a process of the run ended abnormally (killed by signal 9")
    assert f"continue with --resume {tmp_path}" in doc["errors"][1]["hint"]
    assert out.err.count("error: ") == 2
    assert train_cli._launch(2, "cpu", None, "job.yaml", str(tmp_path), as_json=False) == 1
    assert capsys.readouterr().out == ""
