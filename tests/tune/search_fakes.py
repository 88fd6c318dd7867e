"""Fake probes and predictions for the search's tests (tests/tune/test_search.py,
test_tuner.py): memory linear in the micro-batch, out of memory above 10 GiB, tokens/s given."""

from trainfit.job import JobSpec
from trainfit.tune.result import Measured, ProbeResult
from trainfit.tune.search import Predicted

GIB = 2**30


def fake(mem_per_sample, base, tps_of, calls, wait_of=lambda j: 0.0):
    def probe(job: JobSpec, timed: int) -> ProbeResult:
        calls.append((job.micro_batch, job.attention, timed))
        peak = base + mem_per_sample * job.micro_batch
        if peak > 10 * GIB:
            return ProbeResult(status="oom", measured=None)
        tps = tps_of(job) if timed else None
        return ProbeResult(status="ok", measured=Measured(
            peak_allocated_bytes=peak, peak_reserved_bytes=None, peak_device_bytes=None,
            host_rss_bytes=1, step_time_s=1000 / tps if tps else None,
            step_time_spread_s=0.0 if tps else None, tokens_per_s=tps, samples_per_s=None,
            data_wait_fraction=wait_of(job) if tps else None))
    return probe


def pred(mem_per_sample, base, tps_of):
    def p(job):
        return Predicted(peak_allocated_bytes=base + mem_per_sample * job.micro_batch,
                         tokens_per_s=tps_of(job))
    return p
