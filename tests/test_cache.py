"""The cache directory is read at call time (TRAINFIT_CACHE, XDG_CACHE_HOME, ~/.cache) and an
unwritable one never fails a command: it is measured again next time."""

from __future__ import annotations

import os

import pytest

from trainfit import cache
from trainfit.speed import cpu_kernels


def test_directory_follows_the_environment_at_call_time(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINFIT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "trainfit"
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path / "own"))
    assert cache.cache_path("cpu_speed.json") == tmp_path / "own" / "cpu_speed.json"
    monkeypatch.delenv("TRAINFIT_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_root() == tmp_path / "home" / ".cache" / "trainfit"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_directory_is_not_an_error(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("TRAINFIT_CACHE", str(ro / "cache"))
    assert cache.write_json(cache.cache_path("x.json"), {"a": 1}) is False
    assert list(ro.iterdir()) == []


def test_a_file_in_the_way_is_not_an_error(tmp_path, monkeypatch):
    """(Works as root too: a regular file where the directory should be.)"""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TRAINFIT_CACHE", str(blocker / "cache"))
    assert cache.write_json(cache.cache_path("x.json"), {"a": 1}) is False
    timer = cpu_kernels.KernelTimer({"cpu": "test"})
    timer._times["k"], timer._dirty = 1.0, True
    timer.save()  # no exception; stays dirty to be saved another time
    assert timer._dirty and blocker.read_text() == "not a directory"


def test_round_trip_and_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path))
    p = cache.cache_path("x.json")
    assert cache.write_json(p, {"a": 1}) and cache.read_json(p) == {"a": 1}
    p.write_text("{not json")
    assert cache.read_json(p) is None
    assert [f.name for f in tmp_path.iterdir()] == ["x.json"]  # no temporary left behind
