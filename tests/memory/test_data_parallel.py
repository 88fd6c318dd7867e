"""Per-rank memory under DDP and FSDP (analytic adjustment of the simulated single-rank step)."""

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec
from trainfit.memory.predict import predict_memory


def test_fsdp_shards_weights_and_states(tiny_llama):
    gpu = find_gpu("a100-80gb")
    base = dict(model="t", seq_len=64, micro_batch=2, grad_accum=1, precision="fp32",
                grad_ckpt="off")
    one = predict_memory(JobSpec(**base), tiny_llama, gpu)
    ddp = predict_memory(JobSpec(**base, ranks=4), tiny_llama, gpu)
    fsdp = predict_memory(JobSpec(**base, ranks=4, sharding="fsdp"), tiny_llama, gpu)
    assert ddp.peak_allocated_bytes >= one.peak_allocated_bytes  # + gradient buckets
    assert fsdp.peak_allocated_bytes < one.peak_allocated_bytes
    assert ddp.breakdown["data_parallel"] == 4 * one.trainable_params  # fp32 bucket copies
    assert any("FSDP over 4 ranks" in n for n in fsdp.model_notes)
