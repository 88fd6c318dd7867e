"""A row's speed beyond its ops: unknown, with the cause, where host copies are not timed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec
from trainfit.memory.predict import predict_memory
from trainfit.plan.row_speed import synced
from trainfit.speed.predict import SpeedPrediction

FAST = SpeedPrediction(step_time_s=1.0, tokens_per_s=1e4, samples_per_s=1.0, mfu=0.3, hfu=0.3,
                       device_busy_fraction=0.9, bound="compute-bound", model_flops_per_token=1.0)


def _timed(step_s: float, optimizer_s: float = 0.0) -> SpeedPrediction:
    """FAST with another step and optimizer time."""
    return FAST.__class__(**{**FAST.to_dict(), "step_time_s": step_s, "optimizer_s": optimizer_s})


def _counts(trainable: int, total: int, packed: int = 0) -> SimpleNamespace:
    """The parameter counts ``synced`` reads off a memory prediction."""
    return SimpleNamespace(alloc_retries=0, trainable_params=trainable, total_params=total,
                           packed_4bit_params=packed)


def test_activation_offload_leaves_the_speed_unknown_with_the_cause(tiny_llama):
    """The audit's phi-2 on an A6000: activation offload was priced at −1 % while the step moved
    tens of GiB over PCIe; its copies are not timed, so its speed is unknown, as --offload's."""
    job = JobSpec(model="t", seq_len=64, micro_batch=2, precision="bf16-true", grad_ckpt="full")
    gpu = find_gpu("rtx-a6000")
    mem = predict_memory(job, tiny_llama, gpu)
    assert synced(FAST, job, mem, gpu).tokens_per_s == 1e4
    off = job.replace(activation_offload=True)
    sp = synced(FAST, off, predict_memory(off, tiny_llama, gpu), gpu)
    assert sp.tokens_per_s is None and sp.step_time_s is None
    assert "activation offload" in sp.unknown_reason and "not timed" in sp.unknown_reason
    assert sp.model_flops_per_token == 1.0


def test_sharded_gathers_count_what_is_stored_and_hide_under_fb_only():
    """An audit: QLoRA's gathers were priced at 4.5 bits for every value (Mixtral's 45 B bf16
    experts: 3.5× too few bytes), and the collectives were hidden under the optimizer step too,
    which runs after the last reduce-scatter."""
    gpu = find_gpu("h100-sxm")
    job = JobSpec(model="t", seq_len=2048, micro_batch=1, effective_batch=4, ranks=4,
                  sharding="fsdp", method="qlora", precision="amp-bf16", grad_ckpt="full")
    sp = synced(_timed(10.0), job, _counts(0, 46_700_000_000, 1_600_000_000), gpu)
    frac, bus = 3 / 4, gpu.interconnect_gbs * 1e9 * 0.75  # RING_BUS_EFFICIENCY
    gathered = 1.6e9 * 0.5 + 45.1e9 * 2
    assert sp.sync_s == pytest.approx(frac * 2 * gathered / bus, rel=1e-3)
    # the optimizer's share of the step hides nothing: a longer optimizer, more exposed
    ddp = job.replace(method="full", quant=None, sharding="zero3")
    short = synced(_timed(0.6, 0.1), ddp, _counts(46_700_000_000, 46_700_000_000), gpu)
    # one micro-step (4 samples over 4 ranks): hidden under its 0.5 s forward + backward only
    assert short.sync_s > 0.6
    assert short.sync_exposed_s == pytest.approx(short.sync_s - 0.5, rel=1e-9)


def test_fsdp_frozen_grads_reduce_scatter_the_whole_units_gradient():
    """FSDP1 with frozen and trainable weights in one flat parameter (JobSpec.fsdp_frozen_grads,
    litgpt's LoRA) reduce-scatters gradients for the frozen weights too. A review: the memory
    held them, the time reduced the adapters' alone."""
    gpu = find_gpu("a100-40gb-sxm")
    job = JobSpec(model="t", seq_len=1024, micro_batch=1, effective_batch=4, ranks=4,
                  sharding="fsdp", method="lora", precision="amp-bf16", grad_ckpt="off")
    mem = _counts(10_000_000, 1_000_000_000)
    frozen = job.replace(fsdp_frozen_grads=True)
    lora, whole = (synced(_timed(1.0), j, mem, gpu) for j in (job, frozen))
    frac, bus = 3 / 4, gpu.interconnect_gbs * 1e9 * 0.75  # RING_BUS_EFFICIENCY
    # fp32 gradients (FSDP's reduce dtype): 4 B for each of the frozen weights more, once (one
    # micro-step: 4 samples over 4 ranks)
    assert whole.sync_s - lora.sync_s == pytest.approx(frac * 4 * 990_000_000 / bus, rel=1e-9)
    # a step too short to hide it: the time grows by it
    lora, whole = (synced(_timed(0.01), j, mem, gpu) for j in (job, frozen))
    assert whole.step_time_s - lora.step_time_s == pytest.approx(
        frac * 4 * 990_000_000 / bus, rel=0.05)


@pytest.mark.parametrize("gpu_name, ranks, known", [
    ("h100-sxm", 8, True), ("h100-sxm", 16, False), ("a100-80gb-pcie", 64, False),
    ("h100-nvl", 2, True), ("h100-nvl", 4, False), ("gh200-96gb", 2, False)])
def test_ranks_past_one_host_sync_over_a_link_the_catalog_does_not_know(gpu_name, ranks, known):
    """The catalog's link joins one host's GPUs (an H100 NVL's bridge a pair): more ranks sync
    over the network between hosts, which no datasheet gives. A review: 64 ranks were timed on
    one NVLink domain. Unknown, said, until --interconnect gives the link; given, it is timed."""
    from trainfit.cli.gpu_arg import with_interconnect

    gpu = find_gpu(gpu_name)
    job = JobSpec(model="t", seq_len=1024, micro_batch=1, grad_accum=1, ranks=ranks,
                  sharding="fsdp", precision="amp-bf16", grad_ckpt="off")
    mem = _counts(1_000_000_000, 1_000_000_000)
    sp = synced(_timed(1.0), job, mem, gpu)
    assert (sp.step_time_s is not None) == known
    if known:
        return
    assert sp.tokens_per_s is None and "--interconnect GBPS (the measured all-gather bus " \
        "bandwidth" in sp.unknown_reason
    assert {8: "joins 8 of them: the network between hosts", 2: "joins 2 of them: the path "
            "between the pairs", 1: "how many GPUs one NVIDIA GH200 480GB node joins"}[
                gpu.link_ranks] in sp.unknown_reason
    given = synced(_timed(1.0), job, mem, with_interconnect(gpu, "50GB/s"))
    assert given.step_time_s is not None and given.sync_s > 0
    # and plan's JSON names no link it did not time over
    from trainfit.plan.grid import _link

    assert _link(gpu, ranks) == {} and _link(with_interconnect(gpu, "50GB/s"), ranks) == {
        "link": "50 GB/s measured (given)", "link_gbs": pytest.approx(50 / 0.75)}


@pytest.mark.parametrize("gpu_name, link, ranks, ok", [
    ("h100-sxm", "nvlink4", 8, True), ("h100-sxm", "nvlink4", 16, False),
    ("h100-sxm", "pcie5", 9, False), ("h100-sxm", "40GB/s", 64, True),
    ("rtx-3090", "nvlink3", 2, True), ("rtx-3090", "nvlink3", 4, False),
    ("gh200-96gb", "nvlink4", 4, True), ("gh200-96gb", "nvlink4", 5, False),
    # a PCIe link named joins a host's 8, whatever the card's own NVLink reach (a review)
    ("h100-nvl", "pcie5", 4, True), ("h100-nvl", "nvlink4", 4, False),
    ("gh200-96gb", "pcie5", 2, True), ("b200", "nvlink5", 8, True)])
def test_a_link_named_joins_one_host(gpu_name, link, ranks, ok):
    """A link's name is one host's (a bridge's pair's): more ranks sync over what joins the
    hosts, which only a measured bus bandwidth gives (a review: --interconnect nvlink4 timed 16
    ranks on one NVLink domain). Refused with the fix, before any work."""
    from trainfit.cli.gpu_arg import gpu_spec
    from trainfit.job import JobError

    if ok:
        assert gpu_spec(gpu_name, {}, link, ranks=ranks).link_ranks >= (
            ranks if "GB/s" not in link else 1)
        return
    with pytest.raises(JobError, match=f"--interconnect {link} with {ranks} ranks: .* joins "
                       r"\d GPUs; the others sync over") as e:
        gpu_spec(gpu_name, {}, link, ranks=ranks)
    assert "--interconnect 50GB/s" in e.value.hint


def test_a_b200_takes_nvlink5_only_and_a_link_of_no_figure_is_not_named():
    """A review: a B200 (compute capability 10.0) took nvlink2-4 at their figures; and a generic
    card's JSON named an "unknown" link its unknown speed was not timed over."""
    from trainfit.cli.gpu_arg import with_interconnect
    from trainfit.hardware.gpus import generic_gpu
    from trainfit.job import JobError
    from trainfit.plan.grid import _link

    b200 = find_gpu("b200")
    assert with_interconnect(b200, "nvlink5").interconnect_gbs == 900.0
    with pytest.raises(JobError, match=r"--interconnect nvlink4: a NVIDIA B200 .* has nvlink5"):
        with_interconnect(b200, "nvlink4")
    assert _link(generic_gpu(24), 2) == {}
