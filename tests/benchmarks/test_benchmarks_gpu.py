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


def test_gpu_kernels_table_states_the_shape_models_time_against_the_measured():
    """gpu_kernels' GEMM rows carry the speed model's own time for that shape (waves, split-K,
    the unaligned factor) over the measured time; rows without a rate say so."""
    spec = importlib.util.spec_from_file_location("gpu_kernels", BENCH / "gpu_kernels.py")
    assert spec and spec.loader
    gk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gk)
    from trainfit.hardware.gpus import find_gpu
    from trainfit.speed.roofline import DeviceSpeed, gemm_time

    gpu = find_gpu("h100-sxm")
    model_s = gemm_time(DeviceSpeed.from_gpu(gpu), (1, 8192, 4096, 4096), "bf16")
    rows = [{"kernel": "gemm", "label": "7B qkv/o", "mode": "bf16", "m": 8192, "n": 4096,
             "k": 4096, "time_s": 2 * model_s, "tflops": 1.0},
            {"kernel": "gemm", "label": "head unaligned", "mode": "bf16", "m": 8192, "n": 50257,
             "k": 768, "time_s": 1e-3, "tflops": 1.0},
            {"kernel": "gemm", "label": "best", "mode": "tf32", "m": 8, "n": 8, "k": 8,
             "time_s": 1e-6, "tflops": 1.0}]
    assert gk.shape_ratio(gpu, rows[0]) == pytest.approx(0.5)
    # the unaligned head is timed with the family's unaligned factor: slower than aligned
    aligned = gemm_time(DeviceSpeed.from_gpu(gpu), (1, 8192, 50257, 768), "bf16")
    assert gk.shape_ratio(gpu, rows[1]) == pytest.approx(
        gemm_time(DeviceSpeed.from_gpu(gpu), (1, 8192, 50257, 768), "bf16", False) / 1e-3)
    assert gk.shape_ratio(gpu, rows[1]) > aligned / 1e-3
    assert gk.shape_ratio(gpu, rows[2]) is None
    md = gk.render({"device": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 85520809984,
                    "date": "d", "torch": "t", "cuda": "c", "rows": rows})
    assert "= 0.50 |" in md and md.count("| — |") >= 1
    assert "over the 2 GEMMs it times: median" in md
