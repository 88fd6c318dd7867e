"""A row's speed beyond its ops: unknown, with the cause, where host copies are not timed."""

from __future__ import annotations

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec
from trainfit.memory.predict import predict_memory
from trainfit.plan.row_speed import synced
from trainfit.speed.predict import SpeedPrediction

FAST = SpeedPrediction(step_time_s=1.0, tokens_per_s=1e4, samples_per_s=1.0, mfu=0.3, hfu=0.3,
                       device_busy_fraction=0.9, bound="compute-bound", model_flops_per_token=1.0)


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
