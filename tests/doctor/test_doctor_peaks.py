"""MFU is never above 100 %: an achieved rate above the ceiling means the ceiling was measured
wrong (a busy host's quick timing), and MFU is then unknown, not 154 %."""

from __future__ import annotations

import pytest
import torch

from trainfit.doctor import peaks


def test_bounded_mfu():
    assert peaks.bounded_mfu(50e9, 100e9) == pytest.approx(0.5)
    assert peaks.bounded_mfu(100e9, 100e9) == pytest.approx(1.0)
    assert peaks.bounded_mfu(154e9, 100e9) is None  # the doctor's reported 154 %: never stated
    assert peaks.bounded_mfu(50e9, None) is None and peaks.bounded_mfu(0.0, 100e9) is None


def test_cpu_ceiling_is_the_best_rate_seen(tmp_path, monkeypatch):
    """A cached curve far below what this host does now cannot lower the ceiling: the measured
    best of the fresh timings wins (and a cached higher rate would win over a slow moment)."""
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path))
    import json

    peaks._peak_at.cache_clear()
    (tmp_path / "cpu_speed.json").write_text(json.dumps({
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "gemm_rate_curve": {"fp32": [[64, 1.0]], "bf16": [[64, 1.0]]}}))
    fresh = peaks.cpu_peak_flops(torch.float32)
    assert fresh > 1e6  # measured now, not the 1 FLOP/s of the stale cache
    peaks._peak_at.cache_clear()
    (tmp_path / "cpu_speed.json").write_text(json.dumps({
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "gemm_rate_curve": {"fp32": [[64, 1e18]], "bf16": [[64, 1e18]]}}))
    assert peaks.cpu_peak_flops(torch.float32) == 1e18
    peaks._peak_at.cache_clear()
