"""plan's simulation pool (plan/workers.py) on work that builds no model: the conftest turns the
pool off for every other test, since a test process forked after building models can deadlock."""

from __future__ import annotations

import os

import pytest

from trainfit.plan.workers import MAX_WORKERS, SimulationWorkers


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_the_pool_returns_results_in_order_from_other_processes(monkeypatch):
    monkeypatch.delenv("TRAINFIT_WORKERS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    done: list[int] = []
    pool = SimulationWorkers(5)
    try:
        assert pool.size == 2
        out = pool.map(_square, [3, 1, 4, 1, 5], on_done=done.append)
    finally:
        pool.close()
    assert [v for v, _ in out] == [9, 1, 16, 1, 25]
    assert done == [1, 2, 3, 4, 5]
    assert os.getpid() not in {pid for _, pid in out}


@pytest.mark.parametrize(("tasks", "cpus", "env", "size"), [
    (1, 8, None, 1),          # one task: no pool
    (20, 64, None, MAX_WORKERS),
    (6, 3, None, 3),
    (6, 8, "1", 1),           # TRAINFIT_WORKERS=1: in this process
])
def test_the_pool_size(monkeypatch, tasks, cpus, env, size):
    if env is None:
        monkeypatch.delenv("TRAINFIT_WORKERS", raising=False)
    else:
        monkeypatch.setenv("TRAINFIT_WORKERS", env)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    pool = SimulationWorkers(tasks)
    try:
        assert pool.size == size
        assert (pool._pool is None) == (size == 1)
        assert [v for v, _ in pool.map(_square, [2, 3])] == [4, 9]
    finally:
        pool.close()
    assert pool._pool is None
