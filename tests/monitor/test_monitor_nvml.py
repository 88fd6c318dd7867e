"""NVML wrapper against a fake pynvml: readings, per-process memory of our tree only, failures → None."""

from __future__ import annotations

import os
import sys

from fake_nvml import FOREIGN_PID, GIB, make_fake_pynvml

from trainfit.monitor.host import process_tree_pids
from trainfit.monitor.nvml import Nvml
from trainfit.monitor.sampler import Sampler


def test_readings_and_process_memory_counts_only_our_tree(monkeypatch, child_process):
    me, child = os.getpid(), child_process.pid
    fake = make_fake_pynvml(processes={
        # GPU 0: we have a compute and a graphics context (same memory, listed twice), our child 2 GiB,
        # a foreign process 7 GiB.
        0: {"compute": [(me, 10 * GIB), (child, 2 * GIB), (FOREIGN_PID, 7 * GIB)],
            "graphics": [(me, 10 * GIB)]},
        # GPU 1: only a foreign process; the graphics list is not supported.
        1: {"compute": [(FOREIGN_PID, 5 * GIB)]},
    })
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nv = Nvml().open()
    assert nv.available and nv.reason is None
    assert nv.names == {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA A10G"}  # bytes names decoded
    tree = process_tree_pids(me)
    assert {me, child} <= tree and FOREIGN_PID not in tree
    g0, g1 = nv.read(pids=tree)
    assert (g0.index, g0.util_percent, g0.memory_used_bytes, g0.memory_total_bytes) == (0, 87.0, 40 * GIB,
                                                                                         80 * GIB)
    assert g0.power_w == 350.5 and g0.sm_clock_mhz == 1980
    assert g0.process_memory_bytes == 12 * GIB      # 10 (once) + 2, not the foreign 7
    assert g1.power_w is None                       # NVML "Not Supported" → None, the rest still read
    assert (g1.util_percent, g1.sm_clock_mhz) == (12.0, 1710)
    assert g1.process_memory_bytes == 0             # listed fine, none of ours
    assert nv.read(pids=None)[0].process_memory_bytes is None  # nothing followed
    assert [g.index for g in nv.read(indices=[1])] == [1]
    nv.close()
    assert fake.shutdowns == 1


def test_unknown_process_memory_is_none(monkeypatch):
    me = os.getpid()
    fake = make_fake_pynvml(processes={0: {"compute": [(me, None)]}})  # WDDM: no per-process number
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nv = Nvml().open()
    g0, g1 = nv.read(pids={me})
    assert g0.process_memory_bytes is None
    assert g1.process_memory_bytes is None          # neither list readable on GPU 1


def test_process_memory_nvml_cannot_tell_is_unknown_not_zero(monkeypatch):
    """A measured 0 only when NVML lists processes of this pid namespace and none is ours:
    unknown when the compute list is unsupported, when one of ours has no number, and inside a
    container, where NVML lists the host's pids (a review: each read 0, or a partial sum)."""
    me, host_pid = os.getpid(), 4_194_305  # above Linux's largest pid_max (2^22): exists nowhere
    fake = make_fake_pynvml(processes={
        0: {"graphics": [(me, 3 * GIB)]},                  # compute list not supported
        1: {"compute": [(host_pid, 9 * GIB)]}})            # the host's pid, from a container
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nv = Nvml().open()
    g0, g1 = nv.read(pids={me})
    assert g0.process_memory_bytes is None and g1.process_memory_bytes is None
    fake = make_fake_pynvml(processes={0: {"compute": [(me, None), (me + 1, 2 * GIB)]},
                                       1: {"compute": [(FOREIGN_PID, 5 * GIB)]}})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nv = Nvml().open()
    g0, g1 = nv.read(pids={me, me + 1})
    assert g0.process_memory_bytes is None               # not the 2 GiB of the other alone
    assert g1.process_memory_bytes == 0                  # pid 1 is of this namespace: none ours


def test_init_failure_says_why(no_nvml):
    nv = Nvml().open()
    assert nv.available is False and nv.reason == "Driver Not Loaded"
    assert nv.read() == []


def test_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` sees when not installed
    nv = Nvml().open()
    assert nv.available is False and "pynvml not importable" in (nv.reason or "")


def test_sampler_without_nvml_has_null_gpu_columns(no_nvml):
    s = Sampler(live=False)
    rows = s.sample_once()
    s.stop()
    assert len(rows) == 1
    assert all(rows[0][c] is None for c in rows[0] if c.startswith("gpu_") or c == "process_gpu_memory_bytes")
    assert rows[0]["host_ram_total_bytes"] > 0
    assert s.gpu_available is False
    assert s.gpu_note == "no NVIDIA GPU visible (NVML: Driver Not Loaded); showing the host only"
    # a CPU run reads no GPU by design: said as such, not as a missing driver (an audit)
    cpu = Sampler(live=False, gpu_indices=[])
    cpu.sample_once()
    cpu.stop()
    assert cpu.gpu_note == "a CPU run: no GPU read; showing the host only"


def test_a_lost_gpu_and_a_mig_card_are_said(monkeypatch):
    """An audit: a GPU that fell off the bus read n/a like a reading the card lacks, with no
    word; a card in MIG mode was shown as a whole card with utilisation n/a and no word why."""
    import sys

    from fake_nvml import FakeNVMLError

    fake = make_fake_pynvml()
    reads = {"n": 0}
    memory = fake.nvmlDeviceGetMemoryInfo

    def memory_then_lost(h: int):
        if h == 1:
            reads["n"] += 1
            if reads["n"] > 1:
                err = FakeNVMLError("GPU is lost")
                err.value = 15  # NVML_ERROR_GPU_IS_LOST
                raise err
        return memory(h)

    fake.nvmlDeviceGetMemoryInfo = memory_then_lost
    fake.nvmlDeviceGetMigMode = lambda h: (1, 1) if h == 0 else (0, 0)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = Sampler(live=False, follow_process=False)
    first = s.sample_once()
    assert first[1]["gpu_memory_total_bytes"] == 24 * GIB and s.notes == []
    second = s.sample_once()
    s.close()
    assert second[1]["gpu_memory_total_bytes"] is None
    assert len(s.notes) == 1 and s.notes[0].startswith("GPU 1: NVML lost the GPU at time_s ")
    assert s.gpu_note.startswith("GPU 0 in MIG mode: the memory shown is the whole card's")
    s.sample_once()
    assert len(s.notes) == 1  # said once
