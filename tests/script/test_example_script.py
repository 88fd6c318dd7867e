"""The README's offline own-script example (examples/own_script/): the model it writes, the script
run as it is, and ``trainfit plan -- python finetune_lora.py`` reading it — so the example a
newcomer copies keeps working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from trainfit.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own_script"
DATA = ROOT / "examples" / "data" / "tiny_text.jsonl"


def test_the_example_script_runs_and_plan_reads_it(tmp_path):
    model = tmp_path / "tiny-llama"
    made = subprocess.run([sys.executable, str(EXAMPLE / "make_local_model.py"), str(model)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    assert "2.8 M parameters" in made.stdout
    again = subprocess.run([sys.executable, str(EXAMPLE / "make_local_model.py"), str(model)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "already holds a model" in again.stderr
    cmd = [sys.executable, str(EXAMPLE / "finetune_lora.py"), "--model", str(model),
           "--data", str(DATA), "--out", str(tmp_path / "run")]
    # the script trains as it is (two steps here), with no trainfit in it
    ran = subprocess.run([*cmd, "--steps", "2"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "'train_loss'" in ran.stdout + ran.stderr
    res = CliRunner().invoke(app, ["plan", "--json", "--gpu", "t4", "--", *cmd])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    cur = got["plan"]["current"]
    assert (cur["micro_batch"], cur["grad_accum"], cur["grad_ckpt"]) == (2, 4, "off")
    assert got["model_check"]["equal"], got["model_check"]
    pick = next(c for c in got["plan"]["configs"] if c["recommended"])
    assert pick["micro_batch"] * pick["grad_accum"] == 8 and pick["fits"]
    assert 0 < pick["peak_device_bytes"] < 14.75 * 2**30
    assert {c["keyword"] for c in got["changes"]} >= {"per_device_train_batch_size"}
    lora = got["read"]["lora"]
    assert len(lora["adapted"]) == 16  # 4 layers × q, k, v, o
