"""One job schema: every command's job flags, the docs and tune's knob list come from JobSpec."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.job import JobSpec
from trainfit.job.fields import (
    COMMAND_LINE_ONLY,
    DEFAULT_KNOBS,
    KNOB_NAMES,
    fields_markdown,
    fixed_knobs,
    job_fields,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "job-fields.md"


def test_every_field_is_described():
    names = [f.name for f in job_fields()]
    assert names == [f.name for f in dataclasses.fields(JobSpec)]
    assert all(f.help for f in job_fields())


def test_the_doc_is_current():
    assert DOC.read_text() == fields_markdown(), "run: python -m trainfit.job.fields > docs/job-fields.md"


def test_the_doc_names_every_file_only_key():
    """An audit: the README points at docs/job-fields.md for "the full table", which left out
    the keys a file carries beside the job fields (gpu, memory_limit, backend, current, …)."""
    from trainfit.job.fields import FILE_KEYS_HELP
    from trainfit.job.files import FILE_ONLY_KEYS

    assert set(FILE_KEYS_HELP) == set(FILE_ONLY_KEYS)
    text = DOC.read_text()
    assert all(f"| `{k}` |" in text for k in FILE_ONLY_KEYS)


@pytest.mark.parametrize("command", ["plan", "tune"])
def test_every_job_field_is_a_flag_of_the_job_commands(command):
    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300"}).output
    for f in job_fields():
        if f.name not in COMMAND_LINE_ONLY:
            assert f.flag in out, (command, f.flag)
    assert "--trust-remote-code" in out


def test_a_flag_overrides_the_file_and_none_clears(tmp_path, tiny_config_json):
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {tiny_config_json}\nmethod: qlora\nquant: nf4\nseq_len: 64\n"
                   "effective_batch: 8\nmicro_batch: 8\nprecision: amp-bf16\ngrad_ckpt: off\n")
    r = CliRunner().invoke(app, ["plan", str(job), "--method", "lora", "--quant", "none",
                                 "--seq-len", "32", "--json"])
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)["configs"][0]
    assert (c["method"], c["quant"], c["seq_len"]) == ("lora", None, 32)


def test_knob_registry():
    assert set(DEFAULT_KNOBS) < set(KNOB_NAMES) and "compile" not in DEFAULT_KNOBS
    assert fixed_knobs({"prefetch_factor"}) == {"loader"}
    assert fixed_knobs({"optimizer", "precision"}) == {"optimizer_8bit", "precision"}
    # the flags' values: `none` clears the file's value and leaves the knob to the search
    assert fixed_knobs({"grad_ckpt": None, "precision": None, "micro_batch": 4}) == \
        fixed_knobs({"micro_batch"})
    assert "grad_ckpt" in fixed_knobs({"grad_ckpt": "full"})
    r = CliRunner().invoke(app, ["tune", "gpt2", "--knobs", "warp"])
    assert r.exit_code == 2 and "--knobs warp: unknown" in r.output
