"""Timing a step on a shared machine (trainfit.speed.host_timing): the step in reference ops
cancels the machine's own drift, the load read says when another process shares its CPUs, and
the fastest reference seen is kept per machine."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import namedtuple

import pytest

from trainfit.speed import host_timing
from trainfit.speed.host_timing import machine_reference_op_s, others_cpu_s, time_step


class Drifting:
    """A fake machine whose speed changes from repeat to repeat: a step of ``ops`` reference ops
    and the reference loop both take ``speed`` × their cost; ``neighbour`` slows the step alone
    (cache contention: the reference loop's tiny working set does not feel it)."""

    def __init__(self, ops: float, speeds: list[float], neighbour: float = 1.0) -> None:
        self.ops, self.speeds, self.neighbour, self.i = ops, speeds, neighbour, 0

    def speed(self) -> float:
        return self.speeds[self.i % len(self.speeds)]

    def step(self) -> float:
        self.i += 1
        return self.ops * 10e-6 * self.speed() * self.neighbour

    def reference(self) -> float:
        return 10e-6 * self.speed()


@pytest.fixture()
def quick(monkeypatch, load_at):
    monkeypatch.setattr(host_timing, "LOAD_WINDOW_S", 0.0)
    monkeypatch.setattr(host_timing, "allowed_cpus", lambda: [0, 1])
    monkeypatch.setattr(host_timing, "others_cpu_s", load_at(0.0))


def test_the_machines_drift_cancels_in_reference_ops(quick) -> None:
    """The machine at full, half and a third of its speed in turn: the fastest repeat is the
    full-speed one, but the cost in reference ops is the same whatever the speed was."""
    m = Drifting(5000, [1.0, 2.0, 3.0])
    t = time_step(m.step, m.reference)
    assert t.step_ops == pytest.approx(5000, rel=0.35)  # neighbours of a repeat differ in speed
    slow = Drifting(5000, [2.0])
    assert time_step(slow.step, slow.reference).step_ops == pytest.approx(5000)
    assert time_step(slow.step, slow.reference).fastest_s == pytest.approx(0.1)
    assert time_step(slow.step, slow.reference).reference_op_s == pytest.approx(20e-6)


def test_a_neighbour_is_not_cancelled_but_read_as_load(monkeypatch, quick, load_at) -> None:
    """A neighbour slows the step 2× and not the reference loop: the ratio rises, so the load
    decides — three busy rounds, the result's load the quietest round's."""
    monkeypatch.setattr(host_timing, "others_cpu_s", load_at(1.0))
    # the fake's reading over a round of ~15 µs is jittered by the reads' own pauses (0.16 cores
    # seen: a round read quiet, 1 in ~1000 runs): the load is pinned where it is read
    monkeypatch.setattr(host_timing.LoadMeter, "cores", lambda self: 1.0)
    rounds = []
    real = host_timing.timed_round
    monkeypatch.setattr(host_timing, "timed_round",
                        lambda *a: rounds.append(real(*a)) or rounds[-1])
    m = Drifting(5000, [1.0], neighbour=2.0)
    t = time_step(m.step, m.reference)
    assert len(rounds) == host_timing.BUSY_ROUNDS
    assert t.step_ops == pytest.approx(10000)
    assert t.busy_cores == pytest.approx(1.0, abs=0.05) and t.cpus == 2
    assert t.busy_cores > host_timing.BUSY_SHARE * t.cpus


def test_a_quiet_round_ends_the_rounds_and_alone_gives_the_cost(monkeypatch, quick) -> None:
    """Busy (the step slowed 2×), then quiet: two rounds; the cost is the quiet round's."""
    loads = iter([1.5, 0.0])
    neighbour = iter([2.0, 1.0])
    real = host_timing.timed_round

    def round_(step, cpus, reference):
        m.neighbour = next(neighbour)
        r = real(step, cpus, reference)
        r.load = next(loads)
        return r
    monkeypatch.setattr(host_timing, "timed_round", round_)
    m = Drifting(5000, [1.0])
    t = time_step(m.step, m.reference)
    assert t.step_ops == pytest.approx(5000) and t.busy_cores == 0.0


def test_a_round_fills_the_load_window(monkeypatch, quick) -> None:
    """A short step is repeated until the load has been read over LOAD_WINDOW_S of wall time."""
    # 0.2 s: nine 2 ms sleeps woken late on a crowded machine (> 5.5 ms each) filled 0.05 s
    monkeypatch.setattr(host_timing, "LOAD_WINDOW_S", 0.2)

    def step() -> float:
        time.sleep(0.002)
        return 0.002
    r = host_timing.timed_round(step, [0], lambda: 1e-5)
    assert len(r.times) > host_timing.REPEATS
    assert len(r.refs) == len(r.times) + 1  # a reference before and after every repeat


def test_a_load_that_cannot_be_read_counts_as_quiet(monkeypatch) -> None:
    def broken(cpus: list[int]) -> tuple[float, float]:
        raise PermissionError("/proc/stat")
    monkeypatch.setattr(host_timing, "others_cpu_s", broken)
    monkeypatch.setattr(host_timing, "LOAD_WINDOW_S", 0.0)
    r = host_timing.timed_round(lambda: 0.01, [0], lambda: 1e-5)
    assert r.load == 0.0 and len(r.times) == host_timing.REPEATS


def test_other_processes_cpu_is_read_on_this_process_cpus_only(monkeypatch) -> None:
    """Busy = every state but idle and iowait on the allowed CPUs (guest is inside user on
    Linux: not counted twice); this process's own CPU time is returned apart."""
    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
    per_cpu = [T(10, 1, 5, 100, 7, 1, 1, 2, 3, 1), T(20, 0, 10, 50, 9, 0, 0, 0, 0, 0),
               T(1000, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    own = namedtuple("P", "user system children_user children_system")(4.0, 1.0, 99.0, 99.0)
    monkeypatch.setattr(host_timing.psutil, "cpu_times", lambda percpu=False: per_cpu)
    monkeypatch.setattr(host_timing.psutil, "Process",
                        lambda: type("P", (), {"cpu_times": lambda self: own})())
    busy, mine = others_cpu_s([0, 1])
    assert busy == (10 + 1 + 5 + 1 + 1 + 2) + (20 + 10)  # CPU 2 is not this process's
    assert mine == 5.0


def test_another_process_spinning_is_seen() -> None:
    """A process spinning beside this one (which sleeps), read over 0.8 s, takes a share of
    this process's CPUs well above what a stray tick adds."""
    cpus = host_timing.allowed_cpus()
    spin = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)  # its interpreter started
        busy0, own0 = others_cpu_s(cpus)
        t0 = time.perf_counter()
        time.sleep(0.8)
        busy1, own1 = others_cpu_s(cpus)
        others = ((busy1 - busy0) - (own1 - own0)) / (time.perf_counter() - t0)
    finally:
        spin.kill()
        spin.wait()
    assert others > 0.5  # the spinner alone: a core, or its share of two busy ones


def test_the_machines_reference_is_kept_and_only_lowered(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path))
    assert machine_reference_op_s() is None  # no quiet measurement yet
    assert machine_reference_op_s(20e-6) == 20e-6
    assert machine_reference_op_s(30e-6) == 20e-6
    assert machine_reference_op_s() == 20e-6
    assert machine_reference_op_s(8e-6) == 8e-6
    assert machine_reference_op_s(12e-6) == 8e-6  # read from the cache: another process alike


def test_the_reference_is_the_median_of_the_quiet_rounds(monkeypatch, quick) -> None:
    """One reference loop far below the rest (this VM: 1 in 2,000 at 37 % below the median)
    moves neither the cost nor the reference; a busy round's references are not used."""
    refs = iter([10e-6] * 5 + [6e-6] + [10e-6] * 1000)
    m = Drifting(5000, [1.0])
    t = time_step(m.step, lambda: next(refs))
    assert t.reference_op_s == pytest.approx(10e-6)
    assert t.step_ops == pytest.approx(5000, rel=0.01)


def test_the_reference_loop_leaves_the_random_stream_alone() -> None:
    import torch

    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    assert host_timing.reference_op_s(10) > 0
    assert torch.equal(torch.rand(2), expected)


def test_another_hosts_reference_can_be_given(monkeypatch, tmp_path) -> None:
    """Planning on one machine for another: the given reference op is the one used, and the
    machine's own is neither read nor written."""
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path))
    monkeypatch.setenv(host_timing.HOST_ENV, "1.83e-05")
    assert machine_reference_op_s(9e-6) == 1.83e-05
    assert not list(tmp_path.rglob("reference-*.json"))
    monkeypatch.setenv(host_timing.HOST_ENV, "fast")  # not a number: this machine's
    assert machine_reference_op_s(9e-6) == 9e-6
    assert host_timing.H100_HOST_REFERENCE_OP_S == pytest.approx(7.3 * 2.50e-6, rel=0.01)


def test_threads_fitted_to_a_busy_host(monkeypatch):
    """Other processes on 1.5 of 2 cores: torch's pool goes from 2 threads to 1 (the cores left);
    a quiet host, or OMP_NUM_THREADS set by the user, keeps it."""
    import torch

    from trainfit.speed import host_timing as ht

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(ht, "allowed_cpus", lambda: [0, 1])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(ht.LoadMeter, "cores", lambda self: 1.5)
        assert ht.threads_for_load(window_s=0.0) == (1, 2, 1.5, 2)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.setattr(ht.LoadMeter, "cores", lambda self: 0.1)
        assert ht.threads_for_load(window_s=0.0) is None and torch.get_num_threads() == 2
        monkeypatch.setattr(ht.LoadMeter, "cores", lambda self: 1.5)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert ht.threads_for_load(window_s=0.0) is None and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_load_meter_around_a_tree_counts_its_children_as_its_own():
    """doctor's watch: a child's CPU time is the watched tree's own (tree_cpu_s counts the
    children it waited for), not another process's; a tree gone before the end reads unknown
    (None), where :meth:`cores` reads quiet (0.0)."""
    import os
    import resource
    import subprocess
    import sys

    from trainfit.speed.host_timing import LoadMeter, allowed_cpus, tree_cpu_s

    before, kids0 = tree_cpu_s(os.getpid()), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "sum(range(10**7))"], check=True)
    after, kids1 = tree_cpu_s(os.getpid()), resource.getrusage(resource.RUSAGE_CHILDREN)
    child_s = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
    assert child_s > 0.02 and after - before >= 0.9 * child_s
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    around_gone = LoadMeter(allowed_cpus(), tree_of=gone.pid)
    gone.wait()
    assert around_gone.measured() is None and around_gone.cores() == 0.0


def test_a_tree_gone_by_the_end_keeps_the_load_of_its_last_sample(monkeypatch):
    """doctor -- CMD: the command's tree is gone when the watch ends, and the others' load read
    None, so two busy loops beside it went unsaid (an audit). The last sample while the tree
    lived stands for the end: 3.0 other CPU-seconds over 2 s = 1.5 cores."""
    from trainfit.speed import host_timing as ht

    reads = iter([(10.0, 1.0), (14.0, 2.0), None])  # start, a sample at 2 s, the end: gone
    monkeypatch.setattr(ht, "_load", lambda cpus, tree_of=None: next(reads))
    clock = iter([0.0, 2.0, 3.0])
    monkeypatch.setattr(ht.time, "perf_counter", lambda: next(clock))
    meter = ht.LoadMeter([0, 1], tree_of=123)
    meter.sample()
    assert meter.measured() == pytest.approx(1.5)


def test_the_cores_others_used_are_at_most_the_cpus_watched(monkeypatch):
    """An audit: "other processes used 2.1 of 2 CPU cores" (measured): the busy counters and the
    wall clock are read a moment apart. A measured figure above its limit is clamped to it."""
    from trainfit.speed import host_timing as ht

    reads = iter([(100.0, 0.0), (100.0 + 2.1 * 1.0, 0.0)])
    monkeypatch.setattr(ht, "_load", lambda cpus, tree_of=None: next(reads))
    clock = iter([0.0, 1.0])
    monkeypatch.setattr(ht.time, "perf_counter", lambda: next(clock))
    meter = ht.LoadMeter([0, 1])
    assert meter.measured() == 2.0
