"""benchmarks/gpu_validate.py: without CUDA it measures and writes nothing; its table states each
error as predicted / measured − 1 (the measuring itself runs only where a GPU is)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
GIB = 2**30


@pytest.fixture()
def gv(tmp_path, monkeypatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_validate", BENCH / "gpu_validate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path / "results")
    return module


def test_without_cuda_nothing_is_written(gv, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the script would measure")
    assert gv.main() == 1
    assert "no CUDA device" in capsys.readouterr().out
    assert not gv.OUT.exists()


def test_table_errors_are_predicted_over_measured(gv):
    gv.OUT.mkdir()
    row = {"case": {"model": "gpt2", "method": "full", "seq_len": 1024, "micro_batch": 8,
                    "grad_accum": 1, "precision": "amp-bf16", "grad_ckpt": "off"},
           "status": "ok", "detail": "",
           "predicted": {"peak_allocated_bytes": 9 * GIB, "peak_reserved_bytes": 10 * GIB,
                         "peak_device_bytes": 11 * GIB, "peak_phase": "backward",
                         "step_time_s": 0.5, "tokens_per_s": 16384.0},
           "measured": {"peak_allocated_bytes": 10 * GIB, "peak_reserved_bytes": 10 * GIB,
                        "device_used_bytes_at_end": 10 * GIB, "nvml_used_bytes_after": None,
                        "step_time_s": 0.4, "step_time_spread_s": 0.01, "tokens_per_s": 20480.0,
                        "data_wait_fraction": 0.0}}
    row["error"] = gv.errors(row["predicted"], row["measured"])
    gv.write_md({"device": "NVIDIA H100 80GB HBM3", "gpu_spec": "h100-sxm", "torch": "x",
                 "cuda": "y", "date": "d", "rows": [row]})
    md = (gv.OUT / "gpu_validate.md").read_text()
    assert "| 9.00 / 10.00 (-10.0%) | 10.00 / 10.00 (+0.0%) | 11.00 / 10.00 (+10.0%) |" in md
    assert "16,384 / 20,480 (-20.0%)" in md
    assert "allocated: median |error| 10.0%" in md
