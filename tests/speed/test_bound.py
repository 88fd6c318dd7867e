"""The step's bottleneck label: the largest share of its time, by one rule shared with doctor."""

from __future__ import annotations

from trainfit.doctor.findings import MATMUL_COMPUTE_FRACTION
from trainfit.speed.comm import SyncTime, with_sync
from trainfit.speed.predict import MATMUL_BOUND_FRACTION, PhaseTimes, speed_from_times
from trainfit.speed.roofline import DeviceSpeed

GPU = DeviceSpeed(name="g", peak_flops={"bf16": 100e12}, bandwidth_bytes_s=1e12, sm_count=100,
                  asynchronous=True)


def _speed(matmul_s: float, hw_flops: float = 0.0):
    """1 s of device time per micro-step, ``matmul_s`` of it in matmuls; 0.1 s of host time."""
    times = PhaseTimes({"fb": 1.0, "optimizer": 0.0}, {"fb": 0.1, "optimizer": 0.0}, hw_flops,
                       False, matmul_s=matmul_s)
    return speed_from_times(GPU, times, 100e12, micro_batch=1, grad_accum=1, seq_len=1000,
                            ranks=1, flops_per_token=hw_flops / 1000)


def test_the_label_is_the_largest_share_not_an_mfu_line():
    """MFU 40 % with most of the device time in elementwise kernels was called compute-bound by
    the old 'MFU > 30 %' rule; MFU 20 % with 80 % of it in matmuls, memory-bound."""
    assert MATMUL_BOUND_FRACTION == MATMUL_COMPUTE_FRACTION  # plan and doctor: one line
    low = _speed(matmul_s=0.3, hw_flops=40e12)
    assert low.mfu and abs(low.mfu - 0.4) < 1e-9 and low.bound == "memory-bound"
    high = _speed(matmul_s=0.8, hw_flops=20e12)
    assert abs(high.mfu - 0.2) < 1e-9 and high.bound == "compute-bound"
    assert _speed(matmul_s=0.5).bound == "compute-bound"  # the line itself is compute


def test_an_exposed_exchange_over_half_the_step_is_communication_bound():
    base = _speed(matmul_s=0.8, hw_flops=20e12)
    hidden = with_sync(base, SyncTime("all-reduce", 1e9, 1.5, 0.9, "bucketed"))
    assert hidden.bound == "compute-bound" and abs(hidden.step_time_s - 1.9) < 1e-9
    exposed = with_sync(base, SyncTime("all-reduce", 1e9, 1.5, 1.1, "bucketed"))
    assert exposed.bound == "communication-bound" and abs(exposed.step_time_s - 2.1) < 1e-9
