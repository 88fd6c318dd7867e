"""DeepSpeed ZeRO-2/3 per rank (memory/zero.py): analytic terms over the one-process step."""

from __future__ import annotations

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec
from trainfit.memory.predict import predict_memory
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.memory.zero import compute_job


def test_a_rank_runs_its_own_micro_steps(tiny_llama):
    """One rank keeping the job's effective batch would accumulate `ranks` times as many
    micro-steps (JobSpec.replace): a one-micro-step ZeRO row was simulated with two, the
    gradients alive through a second forward."""
    job = JobSpec(model="t", seq_len=32, micro_batch=2, effective_batch=4, ranks=2,
                  sharding="zero2", precision="amp-bf16", grad_ckpt="off")
    assert job.grad_accum == 1
    one = compute_job(job)
    assert (one.grad_accum, one.ranks, one.sharding, one.precision) == (1, 1, "none", "bf16-true")
    assert simulate_step(job, tiny_llama, SimTarget()).micro_steps_simulated == 1
    acc = job.replace(effective_batch=8, grad_accum=None)
    assert acc.grad_accum == 2 and compute_job(acc).grad_accum == 2


def test_zero_terms_per_rank(tiny_llama):
    """ZeRO-2 keeps the bf16 parameters whole and partitions the gradients (2 Ψ_t / N bytes),
    the fp32 master and the states; ZeRO-3 partitions the parameters too; both hold less per
    rank than DDP's whole copies."""
    gpu = find_gpu("a100-80gb")
    base = dict(model="t", seq_len=32, micro_batch=2, grad_accum=1, precision="amp-bf16",
                grad_ckpt="off", ranks=4)
    ddp = predict_memory(JobSpec(**base), tiny_llama, gpu)
    z2 = predict_memory(JobSpec(**base, sharding="zero2"), tiny_llama, gpu)
    z3 = predict_memory(JobSpec(**base, sharding="zero3"), tiny_llama, gpu)
    n = z2.trainable_params
    assert z2.breakdown["gradients"] == -(-n * 2 // 4)
    assert z3.breakdown["parameters"] < z2.breakdown["parameters"]
    assert z3.peak_allocated_bytes < z2.peak_allocated_bytes < ddp.peak_allocated_bytes
    assert any("ZeRO-2 over 4 ranks" in note for note in z2.model_notes)
