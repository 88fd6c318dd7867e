"""psutil readings: process-tree RSS includes children and survives children that exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from fake_nvml import CHILD_BYTES

from trainfit.monitor import host
from trainfit.monitor.host import (
    HostProbe,
    process_alive,
    process_tree,
    process_tree_pids,
    process_tree_rss_bytes,
)

NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max: never a process


def test_tree_rss_includes_spawned_child(child_process):
    own_rss = psutil.Process().memory_info().rss
    tree_rss = process_tree_rss_bytes(os.getpid())
    assert child_process.pid in process_tree_pids(os.getpid())
    assert tree_rss is not None and tree_rss > own_rss
    # the child's 96 MiB are resident in the tree, beyond our own RSS (ours may move a little meanwhile)
    assert tree_rss - own_rss > CHILD_BYTES * 0.9
    child_rss = process_tree_rss_bytes(child_process.pid)
    assert child_rss is not None and child_rss > CHILD_BYTES


def test_exited_children_and_missing_pids():
    # A child that has exited but is not yet reaped (a zombie) must not break the reading.
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(1000):  # up to 10 s for the child to exit
            if psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.01)
        assert process_tree_rss_bytes(os.getpid()) is not None
        assert process_alive(zombie.pid) is False
    finally:
        zombie.wait()
    assert process_tree_rss_bytes(zombie.pid) is None   # reaped: gone
    assert process_tree_rss_bytes(NO_SUCH_PID) is None
    assert process_tree_pids(NO_SUCH_PID) == set()
    assert process_alive(os.getpid()) is True


def test_host_reading_numbers():
    r = HostProbe(pid=os.getpid()).read()
    vm = psutil.virtual_memory()
    assert r.ram_total_bytes == vm.total
    assert 0 < r.ram_used_bytes <= r.ram_total_bytes
    assert r.swap_used_bytes >= 0
    assert 0.0 <= r.cpu_percent <= 100.0
    assert r.process_rss_bytes is not None and r.process_rss_bytes > 0
    assert HostProbe(pid=None).read().process_rss_bytes is None


@pytest.mark.parametrize("proc_children", [True, False])
def test_tree_walk_matches_psutil_and_prunes_exited(child_process, monkeypatch, proc_children):
    # proc_children=False: the psutil fallback for kernels without /proc/PID/task/TID/children.
    monkeypatch.setattr(host, "_PROC_CHILDREN", proc_children and host._PROC_CHILDREN)
    me = os.getpid()
    cache: dict[int, psutil.Process] = {}
    expected = {me} | {p.pid for p in psutil.Process(me).children(recursive=True)}
    assert child_process.pid in expected
    assert {p.pid for p in process_tree(me, cache)} == expected
    child_process.kill()
    child_process.wait()
    assert child_process.pid not in {p.pid for p in process_tree(me, cache)}
    assert child_process.pid not in cache


def test_the_cpu_window_read_in_another_thread_is_the_hosts(monkeypatch):
    """psutil 7 keeps ``cpu_percent(interval=None)``'s window per thread: opened in the main
    thread and read in a sampler thread it said 0 % on a busy host.  CpuWindow's is its own:
    fake cpu times of a host at 75 % read 75 % from any thread."""
    import threading
    from collections import namedtuple

    import psutil

    from trainfit.monitor.host import CpuWindow

    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
    times = iter([T(100, 0, 0, 100, 0, 0, 0, 0, 0, 0), T(175, 0, 0, 125, 0, 0, 0, 0, 5, 0)])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(times))
    win = CpuWindow()
    got = []
    t = threading.Thread(target=lambda: got.append(win.read()))
    t.start()
    t.join()
    assert got == [75.0]  # busy 75 of 100 ticks (guest is inside user)
