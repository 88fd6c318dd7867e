"""plan's --json as the script tests read it: a plan run through the CLI, its rows' peaks keyed
by (precision, checkpointing, micro-batch, accumulation), and a job file to compare against."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from trainfit.cli.main import app

PEAKS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes")


def plan_json(args: list[str]) -> dict:
    res = CliRunner().invoke(app, ["plan", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def peak_rows(d: dict) -> dict[tuple, tuple]:
    return {(c["precision"], c["grad_ckpt"], c["micro_batch"], c["grad_accum"]):
            tuple(c[k] for k in PEAKS) for c in d["configs"]}


def job_file(tmp_path, fields: dict, current: dict) -> str:
    import yaml

    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump({**fields, "current": current}))
    return str(p)
