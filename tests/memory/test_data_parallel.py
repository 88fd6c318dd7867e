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


def test_ddp_wrap_keeps_one_copy_of_the_gradients_alive(one_rank_group):
    """The mechanism behind DDP_BUCKET_FACTOR (and the probe's bucket stand-in under torchrun),
    measured on CPU: what DistributedDataParallel's construction leaves allocated (the profiler's
    allocation records, net of frees) is one flat copy of the trainable gradients — frozen
    parameters get none."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile

    from trainfit.memory.ranks import DDP_BUCKET_FACTOR

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))
    model[0].weight.requires_grad_(False)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    # init_sync=False: without the broadcast of the weights at construction, a transient whose
    # buffer gloo may free after the window closes (then counted as live)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        ddp = DDP(model, init_sync=False)
    live = sum(e.self_cpu_memory_usage for e in prof.key_averages())
    # a few bytes of bookkeeping tensors (counts, flags) besides the buckets
    assert abs(live - DDP_BUCKET_FACTOR * grad_bytes) <= 256, (live, grad_bytes)
    del ddp


def test_compiled_job_says_what_its_memory_is(tiny_llama):
    """torch.compile under autocast: the blocks run as AOTAutograd's partition (they trace with
    the CUDA autocast policy), the peak is not above the eager step's, and the prediction says
    how it was made (tests/memory/test_compiled.py checks the saved set against torch.compile)."""

    job = JobSpec(model="t", seq_len=64, micro_batch=2, precision="amp-bf16")
    eager = predict_memory(job, tiny_llama, find_gpu("a10g"))
    compiled = predict_memory(job.replace(compile=True), tiny_llama, find_gpu("a10g"))
    assert compiled.peak_allocated_bytes <= eager.peak_allocated_bytes
    note = next(n for n in compiled.model_notes if "torch.compile" in n)
    assert "min-cut partitioner" in note and "could not be traced" not in note
    assert not any("torch.compile" in n for n in eager.model_notes)


def test_fsdp_cpu_offload_leaves_the_quantization_state_on_the_gpu(tiny_llama):
    """FSDP's CPU offload moves parameters; bitsandbytes' quantization state is an attribute of
    the 4-bit weight (absmax: one byte per block of 64 after double quantization), so it stays
    on the GPU, whole on every rank: the offloaded rank's parameter term is that state alone."""
    gpu = find_gpu("a100-80gb")
    base = dict(model="t", method="qlora", seq_len=64, micro_batch=2, precision="bf16-true",
                ranks=2, sharding="fsdp", max_grad_norm=None)
    kept = predict_memory(JobSpec(**base), tiny_llama, gpu)
    off = predict_memory(JobSpec(**base, offload="all"), tiny_llama, gpu)
    cfg = tiny_llama.config
    h, kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.hidden_size // cfg.num_attention_heads
    quantized = cfg.num_hidden_layers * (2 * h * h + 2 * h * kv + 3 * h * cfg.intermediate_size)
    state = off.breakdown["parameters"]
    assert quantized // 64 <= state < quantized // 64 + 2048 * 7 * cfg.num_hidden_layers
    assert state < kept.breakdown["parameters"] // 10
    assert off.breakdown["optimizer"] == 0 < kept.breakdown["optimizer"]
    assert off.peak_allocated_bytes == kept.peak_allocated_bytes - (
        kept.breakdown["parameters"] - state) - kept.breakdown["optimizer"]
    assert any("quantization state on the GPU" in n for n in off.model_notes)


def test_the_quantization_state_is_neither_a_parameter_nor_a_buffer_of_bitsandbytes_layer():
    """Why FSDP (which shards, offloads and broadcasts a module's parameters and buffers) leaves
    the quantization state whole where it was made: on a real bitsandbytes 4-bit layer it is an
    attribute of the weight.  The simulation's twin holds the same tensors (shapes, dtypes)."""
    import bitsandbytes as bnb
    import torch

    from trainfit.model.standins import Linear4bitSim

    bf16 = torch.bfloat16
    lin = bnb.nn.Linear4bit(256, 512, bias=False, compute_dtype=bf16, quant_storage=bf16,
                            compress_statistics=True)
    lin.weight = bnb.nn.Params4bit(torch.randn(512, 256, dtype=bf16), requires_grad=False,
                                   quant_type="nf4", quant_storage=bf16,
                                   compress_statistics=True, module=lin).to("cpu")
    qs = lin.weight.quant_state
    state = {"absmax": qs.absmax, "code": qs.code, "absmax2": qs.state2.absmax,
             "code2": qs.state2.code}
    held = {t.untyped_storage().data_ptr() for t in [*lin.parameters(), *lin.buffers()]}
    assert not any(t.untyped_storage().data_ptr() in held for t in state.values())
    assert [n for n, _ in lin.named_parameters()] == ["weight"] and not list(lin.buffers())
    twin = dict(Linear4bitSim(256, 512, False, bf16, True, device="cpu",
                              quant_storage=bf16).named_buffers())
    assert {k: (tuple(t.shape), t.dtype) for k, t in state.items()} == \
        {k: (tuple(twin[k].shape), twin[k].dtype) for k in state}
