"""benchmarks/zero_hooks.py runs DeepSpeed's ZeRO-3 on one gloo rank, and what it counts is what
runs: the modules whose forward a forward pass calls (where DeepSpeed's hooks fire) and the
parameters DeepSpeed partitioned (not ``ds_persist``) equal trainfit's counts
(speed/zero_hooks.py) — the container rule, the threshold rule and the module walk, checked
against the run and DeepSpeed's own state.  The time is not asserted (a benchmark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEEPSPEED = sorted((ROOT / "build" / "reference").glob("deepspeed-*"))


@pytest.mark.skipif(not DEEPSPEED, reason="DeepSpeed not installed in build/reference "
                    "(scripts/test.sh installs it)")
@pytest.mark.parametrize("case", [2, 6])  # full with checkpointing; LoRA r16 checkpointed
def test_zero3_counts_are_what_deepspeed_hooked(case):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0", "ZERO_HOOKS_ROUNDS": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29680 + case), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(DEEPSPEED[-1])])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "zero_hooks.py"), "--case",
                           str(case)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
    assert row["modules"] == row["modules_run"]
    assert row["partitioned"] == row["deepspeed_partitioned"]
    assert row["partitioned"] < sum(1 for _ in range(row["modules"]))  # norms persist
    assert row["checkpointed"] and row["fetches"] > 2 * row["partitioned"]
    assert row["deepspeed_ops"] > 0 and row["plain_ops"] > 0
