"""Fixtures of the speed tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


@pytest.fixture()
def load_at() -> Callable[[float], Callable[[list[int]], tuple[float, float]]]:
    """Makes a fake ``trainfit.speed.host_timing.others_cpu_s``: other processes use ``cores``
    of CPU per second of wall time."""
    def make(cores: float) -> Callable[[list[int]], tuple[float, float]]:
        def fake(cpus: list[int]) -> tuple[float, float]:
            own = time.process_time()
            return own + cores * time.perf_counter(), own
        return fake
    return make
