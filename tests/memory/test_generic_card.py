"""A card known only by its size (``generic-16gb``) is never predicted to hold more than a real card
of that size: its capacity is the catalog's least share, its kernels those holding the most memory
(an audit: generic-16gb ran SDPA's flash kernel and fitted a row a T4 does not)."""

from __future__ import annotations

from trainfit.hardware.gpus import find_gpu, generic_gpu
from trainfit.job import JobSpec
from trainfit.memory.predict import predict_memory, target_for


def test_a_generic_card_is_predicted_at_its_worst_kernels_and_least_capacity(tiny_llama):
    generic, t4, a100 = generic_gpu(16), find_gpu("t4"), find_gpu("a100-80gb-sxm")
    assert generic.memory_bytes <= t4.memory_bytes
    assert target_for(generic).compute_capability == (7, 5)
    # bf16 rows: every bf16 card is Ampere or newer: Hopper's kernels, not the math kernel (a
    # review: 13.08 GiB against an H100's 1.29 at 8,192 tokens)
    assert target_for(generic, "amp-bf16").compute_capability == (9, 0)
    assert target_for(find_gpu("a100-80gb-sxm"), "amp-bf16").compute_capability == (8, 0)
    job = JobSpec(model="t", seq_len=256, micro_batch=4, precision="amp-fp16", grad_ckpt="off")
    on_generic = predict_memory(job, tiny_llama, generic)
    on_t4 = predict_memory(job, tiny_llama, t4)
    on_a100 = predict_memory(job.replace(precision="amp-bf16"), tiny_llama, a100)
    assert on_generic.sdpa_kernels == on_t4.sdpa_kernels != on_a100.sdpa_kernels
    assert on_generic.peak_allocated_bytes >= on_t4.peak_allocated_bytes
    bf16 = job.replace(precision="amp-bf16", seq_len=1024)
    generic_bf16 = predict_memory(bf16, tiny_llama, generic_gpu(80))
    for card in ("a100-80gb-sxm", "h100-sxm"):
        real = predict_memory(bf16, tiny_llama, find_gpu(card))
        assert real.peak_allocated_bytes <= generic_bf16.peak_allocated_bytes
        assert generic_bf16.peak_allocated_bytes < 2 * real.peak_allocated_bytes

