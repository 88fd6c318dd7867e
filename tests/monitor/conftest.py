"""Fixtures of the monitor tests: NVML that cannot start, a child process holding memory."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fake_nvml import CHILD_CODE, make_fake_pynvml


@pytest.fixture(autouse=True)
def _all_cards_visible(monkeypatch):
    """The fake NVML's cards as CUDA would see them unrestricted: a CUDA_VISIBLE_DEVICES of the
    machine running the tests (a CPU runner may set it empty) would pick another, or none."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture()
def no_nvml(monkeypatch):
    """NVML whose init fails as on a host without a driver."""
    fake = make_fake_pynvml(init_error="Driver Not Loaded")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture()
def child_process():
    """A spawned child of this test process holding CHILD_BYTES resident."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD_CODE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()
