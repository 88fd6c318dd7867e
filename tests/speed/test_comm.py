"""ranks > 1: collective bytes and the exposed synchronisation time, and unknown interconnects."""

import dataclasses

import pytest

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobError, JobSpec
from trainfit.plan.grid import plan
from trainfit.speed.comm import DDP_BUCKET_BYTES, RING_BUS_EFFICIENCY, sync_time


def test_ddp_ring_all_reduce_bytes_and_overlap():
    gb = 4e9
    s = sync_time(ranks=4, sharding="none", grad_accum=8, grad_bytes=gb, param_bytes=gb,
                  link_gbs=100.0, micro_step_s=1.0)
    assert s.bytes_per_rank == pytest.approx(2 * 3 / 4 * gb)  # 2(N-1)/N
    assert s.comm_s == pytest.approx(6e9 / (100e9 * RING_BUS_EFFICIENCY))
    # 80 ms of all-reduce hides under 667 ms of backward except the last bucket
    assert s.exposed_s == pytest.approx(2 * 3 / 4 * DDP_BUCKET_BYTES / (100e9 * RING_BUS_EFFICIENCY))
    slow = sync_time(ranks=4, sharding="none", grad_accum=8, grad_bytes=gb, param_bytes=gb,
                     link_gbs=1.0, micro_step_s=1.0)
    assert slow.exposed_s == pytest.approx(slow.comm_s - 2 / 3)  # longer than the backward
    assert sync_time(ranks=1, sharding="none", grad_accum=1, grad_bytes=gb, param_bytes=gb,
                     link_gbs=1.0, micro_step_s=1.0) is None


def test_fsdp_gathers_every_micro_step():
    s = sync_time(ranks=2, sharding="fsdp", grad_accum=4, grad_bytes=1e9, param_bytes=2e9,
                  link_gbs=10.0, micro_step_s=0.1)
    per_micro = 0.5 * (2 * 2e9 + 1e9)
    assert s.bytes_per_rank == pytest.approx(4 * per_micro)
    assert s.exposed_s == pytest.approx(4 * (per_micro / (10e9 * RING_BUS_EFFICIENCY) - 0.1))


def test_fsdp_under_no_sync_reduce_scatters_in_the_last_micro_step_only():
    """HF Trainer / accelerate accumulate under FSDP's no_sync (JobSpec.fsdp_no_sync): the
    earlier micro-steps keep their unsharded gradients and only gather. A review: the flag
    doubled the memory and left every micro-step's reduce-scatter in the time. ZeRO-3 has no
    such mode: the flag is FSDP's."""
    kw = dict(ranks=2, grad_accum=4, grad_bytes=1e9, param_bytes=2e9, link_gbs=10.0,
              micro_step_s=0.1)
    s = sync_time(sharding="fsdp", reduce_once=True, **kw)
    bus = 10e9 * RING_BUS_EFFICIENCY
    gather, reduce = 0.5 * 2 * 2e9, 0.5 * 1e9
    assert s.bytes_per_rank == pytest.approx(4 * gather + reduce)
    assert s.exposed_s == pytest.approx(3 * (gather / bus - 0.1) + (gather + reduce) / bus - 0.1)
    assert "reduce-scatter in the last" in s.collective
    every = sync_time(sharding="fsdp", **kw)
    assert every.exposed_s - s.exposed_s == pytest.approx(3 * reduce / bus)
    assert sync_time(sharding="zero3", reduce_once=True, **kw).bytes_per_rank == pytest.approx(
        sync_time(sharding="zero3", **kw).bytes_per_rank)


def test_zero2_reduces_every_micro_step_and_gathers_once():
    """QA: ZeRO-2 was timed as DDP (one all-reduce per step under no_sync), but DeepSpeed refuses
    no_sync under ZeRO-2: every micro-step all-reduces the gradients' buckets (DeepSpeed 0.19.8's
    defaults), the updated partitions are all-gathered once, and (overlap_comm false by default
    below stage 3) none of it hides."""
    bus = 10e9 * RING_BUS_EFFICIENCY
    s = sync_time(ranks=2, sharding="zero2", grad_accum=8, grad_bytes=3e9, param_bytes=3e9,
                  link_gbs=10.0, micro_step_s=0.05)
    # each bucket all-reduced (use_multi_rank_bucket_allreduce: true), every micro-step
    assert s.bytes_per_rank == pytest.approx(8 * 2 * 0.5 * 3e9 + 0.5 * 3e9)
    assert s.exposed_s == s.comm_s == pytest.approx(s.bytes_per_rank / bus)
    ddp = sync_time(ranks=2, sharding="none", grad_accum=8, grad_bytes=3e9, param_bytes=3e9,
                    link_gbs=10.0, micro_step_s=0.05)
    assert s.bytes_per_rank == pytest.approx(8.5 * ddp.bytes_per_rank)
    z3 = sync_time(ranks=2, sharding="zero3", grad_accum=1, grad_bytes=1e9, param_bytes=2e9,
                   link_gbs=10.0, micro_step_s=0.1)
    assert "ZeRO-3" in z3.collective and "FSDP" not in z3.collective
    # its hooks are host time (speed/zero_hooks.py); what is not timed is said (an audit: ZeRO-3
    # read 36 % ahead of FSDP and ZeRO-2 on a launch-bound step); FSDP's rows count their copies
    assert "per-module hooks" in z3.overlap and "framework_host_s" in z3.overlap
    assert "leans high" in z3.overlap and "device copies" in z3.overlap
    fsdp = sync_time(ranks=2, sharding="fsdp", grad_accum=1, grad_bytes=1e9, param_bytes=2e9,
                     link_gbs=10.0, micro_step_s=0.1)
    assert "hooks" not in fsdp.overlap
    # its device copies (each gathered parameter cat out of the flat buffer, twice a
    # micro-step; each gradient into the reduce bucket, cat and div_ for the reduce-scatter),
    # read and written on side streams:
    # their HBM time on top of the collectives' own, on a busy device (FSDP2's are kernels of
    # its simulated step)
    kw = dict(ranks=2, grad_accum=1, grad_bytes=1e9, param_bytes=2e9, link_gbs=300.0,
              micro_step_s=0.1, hbm_gbs=2000.0)
    z3, fsdp = sync_time(sharding="zero3", **kw), sync_time(sharding="fsdp", **kw)
    assert z3.exposed_s == fsdp.exposed_s == 0.0
    assert z3.contention_s - fsdp.contention_s == pytest.approx((2.0 * 2 * 2e9 + 6.0 * 1e9)
                                                                / 2000e9)
    # an idle device absorbs them: a step the GPU is busy for a third of
    idle = sync_time(sharding="zero3", device_share=1 / 3, **kw)
    assert idle.contention_s == 0.0


def test_plan_slows_a_pcie_pair_and_unknown_link_is_unknown(tiny_llama):
    job = JobSpec(model="t", seq_len=64, micro_batch=2, grad_accum=1, grad_ckpt="off",
                  precision="fp32", ranks=2)
    gpu = find_gpu("rtx-a6000")  # PCIe gen4, peer-to-peer (a GeForce card has none: see below)
    fast = plan(job, tiny_llama, dataclasses.replace(gpu, interconnect_gbs=1e9)).rows[0].speed
    two = plan(job, tiny_llama, gpu).rows[0].speed
    assert two.sync_s > 0 and two.sync_exposed_s > fast.sync_exposed_s
    assert two.step_time_s - two.sync_exposed_s == pytest.approx(
        fast.step_time_s - fast.sync_exposed_s)  # the same step, only the link differs
    assert two.tokens_per_s == pytest.approx(2 * 2 * 64 / two.step_time_s)
    no_link = dataclasses.replace(gpu, interconnect="unknown", interconnect_gbs=None)
    unknown = plan(job, tiny_llama, no_link).rows[0].speed
    assert unknown.tokens_per_s is None and "interconnect is unknown" in unknown.unknown_reason


def test_geforce_without_p2p_makes_multi_rank_speed_unknown_until_the_link_is_given(tiny_llama):
    """GeForce cards stage NCCL through host memory: the slot's PCIe figure is not the link.
    Unknown (said) until a measured bus bandwidth is given, which then sets the sync time."""
    import dataclasses

    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec
    from trainfit.plan.grid import plan
    from trainfit.speed.comm import RING_BUS_EFFICIENCY, peer_to_peer

    gpu = find_gpu("rtx-3090")
    assert not peer_to_peer(gpu) and peer_to_peer(find_gpu("a100-80gb"))
    job = JobSpec(model="t", seq_len=64, micro_batch=2, grad_accum=1, ranks=2,
                  precision="amp-bf16", grad_ckpt="off")
    row = plan(job, tiny_llama, gpu, ladder=False).rows[0]
    assert row.speed.step_time_s is None and "peer-to-peer" in row.speed.unknown_reason
    slow = dataclasses.replace(gpu, interconnect="2.7 GB/s measured (given)",
                               interconnect_gbs=2.7 / RING_BUS_EFFICIENCY)
    fast = dataclasses.replace(gpu, interconnect="27 GB/s measured (given)",
                               interconnect_gbs=27 / RING_BUS_EFFICIENCY)
    t_slow, t_fast = (plan(job, tiny_llama, g, ladder=False).rows[0].speed for g in (slow, fast))
    assert t_slow.sync_s == pytest.approx(10 * t_fast.sync_s, rel=1e-6)
    assert t_slow.step_time_s > t_fast.step_time_s
    # a PCIe generation named is the slot, not the host-memory path (a review: --interconnect
    # pcie4 timed a GeForce pair at 31.5 GB/s): unknown, and the hint asks for a measured figure
    from trainfit.cli.gpu_arg import with_interconnect

    named = plan(job, tiny_llama, with_interconnect(gpu, "pcie4"), ladder=False).rows[0].speed
    assert named.step_time_s is None and "peer-to-peer" in named.unknown_reason
    assert "nccl-tests' busbw" in named.unknown_reason and "nvlink3)" not in named.unknown_reason
    # an NVLink named on a PCIe board is its bridge, NCCL's P2P at the bridge's speed (112.5 GB/s
    # both ways: a review saw the A100 board's 300 per direction); no connector, refused
    bridge = with_interconnect(gpu, "nvlink3")
    assert (bridge.interconnect, bridge.interconnect_gbs, bridge.link_ranks) == (
        "nvlink3-bridge (given)", 56.25, 2)
    bridged = plan(job, tiny_llama, bridge, ladder=False).rows[0]
    assert bridged.speed.step_time_s is not None and bridged.speed.sync_s == pytest.approx(
        t_fast.sync_s * 27 / (56.25 * RING_BUS_EFFICIENCY), rel=1e-6)
    with pytest.raises(JobError, match="RTX 3080 has no NVLink connector"):
        with_interconnect(find_gpu("rtx-3080-10gb"), "nvlink3")


def test_hidden_traffic_takes_memory_bandwidth_from_compute():
    """NCCL stores what it receives and reads it back (2× an all-gather's bus bytes, 3× a
    reduction's: NVIDIA/nccl#1428): the hidden part of the traffic costs the step that much of
    the card's memory bandwidth; what is exposed is already serial and costs nothing more."""
    from trainfit.speed.comm import GATHER_HBM_FACTOR, REDUCE_HBM_FACTOR

    hbm = 2000.0  # GB/s
    hidden = sync_time(ranks=8, sharding="fsdp", grad_accum=3, grad_bytes=52e9, param_bytes=26e9,
                       link_gbs=300.0, micro_step_s=2.0, hbm_gbs=hbm)
    assert hidden.exposed_s == 0.0
    gathered, reduced = 7 / 8 * 2 * 26e9, 7 / 8 * 52e9
    assert hidden.contention_s == pytest.approx(
        3 * (GATHER_HBM_FACTOR * gathered + REDUCE_HBM_FACTOR * reduced) / (hbm * 1e9))
    assert f"slows compute by {hidden.contention_s:.3g} s per step" in hidden.overlap
    # comm twice the compute: the collective is the longer, the slowed compute (+ its half of
    # the traffic) still ends first, nothing is added
    comm_micro = (gathered + reduced) / (300e9 * RING_BUS_EFFICIENCY)
    half = sync_time(ranks=8, sharding="fsdp", grad_accum=3, grad_bytes=52e9, param_bytes=26e9,
                     link_gbs=300.0, micro_step_s=comm_micro / 2, hbm_gbs=hbm)
    assert half.exposed_s == pytest.approx(3 * comm_micro / 2) and half.contention_s == 0.0
    # comm just under the compute: the micro-step ends when the slowed compute does
    near = sync_time(ranks=8, sharding="fsdp", grad_accum=3, grad_bytes=52e9, param_bytes=26e9,
                     link_gbs=300.0, micro_step_s=comm_micro * 1.01, hbm_gbs=hbm)
    assert near.contention_s == pytest.approx(hidden.contention_s)
    # a host-bound step: the idle device absorbs the traffic first
    idle = sync_time(ranks=8, sharding="fsdp", grad_accum=3, grad_bytes=52e9, param_bytes=26e9,
                     link_gbs=300.0, micro_step_s=2.0, hbm_gbs=hbm, device_share=0.5)
    assert idle.contention_s == pytest.approx(3 * max(0.0, 1.0 + hidden.contention_s / 3 - 2.0))
    assert sync_time(ranks=8, sharding="fsdp", grad_accum=3, grad_bytes=52e9, param_bytes=26e9,
                     link_gbs=300.0, micro_step_s=2.0).contention_s == 0.0  # bandwidth unknown
    # ZeRO-2 (overlap_comm off) hides nothing, so nothing contends; DDP's hidden all-reduce does
    assert sync_time(ranks=2, sharding="zero2", grad_accum=8, grad_bytes=3e9, param_bytes=3e9,
                     link_gbs=10.0, micro_step_s=0.05, hbm_gbs=hbm).contention_s == 0.0
    ddp = sync_time(ranks=4, sharding="none", grad_accum=1, grad_bytes=4e9, param_bytes=4e9,
                    link_gbs=100.0, micro_step_s=1.0, hbm_gbs=hbm)
    moved = 2 * 3 / 4 * 4e9
    share = 1 - ddp.exposed_s / ddp.comm_s
    assert ddp.contention_s == pytest.approx(
        share * (GATHER_HBM_FACTOR + REDUCE_HBM_FACTOR) * moved / 2 / (hbm * 1e9))
    assert sync_time(ranks=4, sharding="none", grad_accum=1, grad_bytes=4e9, param_bytes=4e9,
                     link_gbs=100.0, micro_step_s=1.0, hbm_gbs=hbm,
                     device_share=0.5).contention_s == 0.0  # its idle half absorbs ~7 ms
    # an all-reduce longer than the backward ends on its own: the slowed backward is under it
    assert sync_time(ranks=4, sharding="none", grad_accum=1, grad_bytes=4e9, param_bytes=4e9,
                     link_gbs=1.0, micro_step_s=1.0, hbm_gbs=hbm).contention_s == 0.0
