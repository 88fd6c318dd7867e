"""CPU kernel replay: keys keep layouts, replays run the recorded op, the cache round-trips, and the
roofline uses a measured time when there is one."""

import json

import pytest
import torch

from trainfit.speed import cpu_kernels
from trainfit.speed.cpu_kernels import KernelTimer, replay_key, time_replay
from trainfit.speed.ops import OpRecord, OpRecorder
from trainfit.speed.roofline import DeviceSpeed, op_device_time


def test_keys_keep_the_layout_of_each_operand():
    a, w = torch.empty(16, 8), torch.empty(4, 8)
    nt = replay_key("mm.default", (a, w.t()), {})
    nn = replay_key("mm.default", (a, w.t().contiguous()), {})
    assert nt != nn
    assert nt[1][1] == ("T", (8, 4), (1, 8), "float32")
    assert replay_key("_local_scalar_dense.default", (a,), {}) is None


def test_replay_runs_the_op_with_its_scalars_and_dtypes():
    x = torch.empty(4, 10)
    key = replay_key("_log_softmax_backward_data.default", (x, x, 1, torch.float32), {})
    assert time_replay(key, reps=1) > 0
    bad = ("mm.default", (("T", (2, 3), (3, 1), "float32"), ("T", (5, 2), (2, 1), "float32")), ())
    with pytest.raises(RuntimeError):
        time_replay(bad, reps=1)  # shapes that do not multiply


def test_timer_caches_on_disk_and_refuses_other_machines(tmp_path, monkeypatch):
    from trainfit.speed import host_timing

    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path))
    # a quiet machine: a timing taken while CI's other workers ran would be marked busy and
    # (rightly) timed again by the next process, which is the next test's case, not this one
    monkeypatch.setattr(host_timing, "others_cpu_s", lambda cpus: (0.0, 0.0))
    calls = []
    monkeypatch.setattr(cpu_kernels, "time_replay", lambda key: calls.append(key) or 0.25)
    key = replay_key("mm.default", (torch.empty(4, 4), torch.empty(4, 4)), {})
    timer = KernelTimer({"cpu": "x", "threads": 2})
    assert timer(key) == 0.25 and timer(key) == 0.25 and len(calls) == 1
    timer.save()
    assert json.loads((tmp_path / "cpu_kernels.json").read_text())["times_s"]
    assert KernelTimer({"cpu": "x", "threads": 2})(key) == 0.25 and len(calls) == 1
    assert KernelTimer({"cpu": "x", "threads": 1})(key) == 0.25 and len(calls) == 2


def test_a_kernel_timed_on_a_busy_machine_is_timed_again_and_the_lower_kept(tmp_path,
                                                                          monkeypatch):
    """Other processes on the CPUs while a kernel was replayed: the time is kept but marked busy,
    and the next process times it once more (lower kept), until a quiet timing clears the mark;
    a quiet timing is never repeated."""
    from trainfit.speed import host_timing

    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path))
    timings = iter([0.9, 0.5, 0.7, 0.6])  # busy, busy, quiet, (never asked)
    busy = iter([True, True, False])
    # other processes' CPU seconds: a million more over a busy replay, none over a quiet one
    clock = {"t": 0.0}

    def others(cpus):
        return clock["t"], 0.0

    def replay(key):
        t = next(timings)
        clock["t"] += 1e6 if next(busy) else 0.0
        return t

    monkeypatch.setattr(host_timing, "others_cpu_s", others)
    monkeypatch.setattr(cpu_kernels, "time_replay", replay)
    key = replay_key("mm.default", (torch.empty(4, 4), torch.empty(4, 4)), {})
    ident = {"cpu": "x", "threads": 2}
    first = KernelTimer(ident)
    assert first(key) == 0.9 and first(key) == 0.9  # once per process
    first.save()
    assert json.loads((tmp_path / "cpu_kernels.json").read_text())["busy"] == [repr(key)]
    assert first.used_busy  # a prediction made with it is a busy host's (tune prunes none)
    second = KernelTimer(ident)
    assert second(key) == 0.5 and second.busy_keys() == {repr(key)} and second.used_busy
    second.save()
    third = KernelTimer(ident)
    assert third(key) == 0.5 and third.busy_keys() == set()  # quiet 0.7: the lower 0.5 kept
    assert not third.used_busy
    third.save()
    assert KernelTimer(ident)(key) == 0.5  # quiet now: not timed again (0.6 never asked)


def test_a_measured_kernel_time_replaces_the_roofline():
    dev = DeviceSpeed(name="cpu", peak_flops={"fp32": 1e9}, bandwidth_bytes_s=1e9, sm_count=None,
                      asynchronous=False, op_overhead_s=1e-5, gemm_efficiency=1.0,
                      kernel_timer=lambda key: 0.5)
    op = OpRecord("mm", "forward", 2e9, 0.0, "fp32", (1, 1000, 1000, 1000), True,
                  replay=("mm.default", (), ()))
    assert op_device_time(dev, op) == pytest.approx(0.5 - 1e-5)
    plain = OpRecord("mm", "forward", 2e9, 0.0, "fp32", (1, 1000, 1000, 1000), True)
    assert op_device_time(dev, plain) == pytest.approx(2.0)  # no replay key: 2 GFLOP at 1 GFLOP/s


def test_the_recorder_keeps_replay_keys_only_when_asked(tiny_llama):
    from trainfit.job import JobSpec
    from trainfit.memory.simulate import SimTarget, simulate_step

    job = JobSpec(model="t", seq_len=32, micro_batch=2, precision="fp32")
    with_keys, without = OpRecorder(replay=True), OpRecorder()
    simulate_step(job, tiny_llama, SimTarget(device="cpu"), op_hook=with_keys)
    simulate_step(job, tiny_llama, SimTarget(device="cpu"), op_hook=without)
    mms = [o for o in with_keys.ops if o.name == "mm"]
    assert mms and all(o.replay and o.replay[0] == "mm.default" for o in mms)
    assert all(o.replay is None for o in without.ops)
    assert all(o.replay is None for o in with_keys.ops if not o.kernel)
