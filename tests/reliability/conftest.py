"""Fixtures of the reliability suite: the micro model's job as a file, and the CLI run in-process
with its error lines split out (helpers: reliability_tools.py)."""

from __future__ import annotations

import pytest
from reliability_tools import Cli, write_job


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Real CPU steps with one intra-op thread (two stall each other on this shared 2-core host:
    a step of the micro model takes ~0.5 s instead of ~0.02 s)."""


@pytest.fixture()
def cli(monkeypatch, tmp_path):
    """``cli(*args)`` runs ``trainfit ARGS`` in this process (typer's runner) with the cache in a
    directory of its own (plan/tune may write there; the run directories are what is watched)."""
    from typer.testing import CliRunner

    from trainfit.cli.main import app

    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path / "_cache"))
    runner = CliRunner()

    def run(*args: str) -> Cli:
        r = runner.invoke(app, [str(a) for a in args])
        return Cli(r.exit_code, r.stdout, r.stderr)

    return run


@pytest.fixture()
def job_file(tmp_path, micro_model_json, chat_jsonl):
    return write_job(tmp_path / "job.yaml", micro_model_json, chat_jsonl)
