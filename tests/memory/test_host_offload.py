"""What activation offloading holds in host RAM (memory/host_offload.py): each tensor the twin
offloads, rounded up to a power of two as PyTorch's pinned-memory cache does; an extrapolated
plan row gives what the full-size simulation of the same row gives."""

import pytest
from transformers import LlamaConfig

from trainfit.job import JobSpec
from trainfit.memory.extrapolate import fit_group
from trainfit.memory.host_offload import (
    at_batch,
    deeper,
    extrapolated,
    host_activations_of_row,
    host_activations_of_sizes,
    pow2_ceil,
)
from trainfit.memory.predict import predict_memory
from trainfit.memory.simulate import SimTarget
from trainfit.model.source import ModelSource


def test_pow2_ceil_is_pytorchs_power_of_two():
    assert [pow2_ceil(n) for n in (0, 1, 2, 3, 1024, 1025, 3 * 2**20)] == \
        [0, 1, 2, 4, 1024, 2048, 4 * 2**20]
    h = host_activations_of_sizes([1024, 1536, 5000])
    assert (h.copied_bytes, h.pinned_bytes, h.tensors, h.exact) == (7560, 1024 + 2048 + 8192, 3,
                                                                    True)


def test_deeper_repeats_what_the_last_layers_added():
    # TRL's dedup: the second layer offloads the RoPE tables again (r), the later ones do not
    first, second, later, tail = [8, 4, 4], [8, 2, 2, 4, 4], [8, 4, 4], [99]
    small = first + second + tail  # 2 layers
    large = first + second + later + tail  # 3
    assert deeper(small, large, 2, 3, 5) == first + second + later * 3 + tail
    assert deeper(small, large, 2, 3, 2) == small
    assert deeper(small, large, 2, 3, 4) == first + second + later * 2 + tail
    # a step of 2 layers: 9 is not a whole number of steps more
    assert deeper(small, large, 2, 4, 9) is None
    # not an insert: a tensor of the small stack changed
    assert deeper(small, [7, *large[1:]], 2, 3, 5) is None


def test_deeper_inserts_between_the_common_head_and_tail():
    # a periodic run: the insert could sit at any of three places; each makes this list
    small, large = [9, 3, 5, 3, 5, 7], [9, 3, 5, 3, 5, 3, 5, 7]
    assert deeper(small, large, 2, 3, 4) == [9, 3, 5, 3, 5, 3, 5, 3, 5, 7]
    # extra layers that offload nothing: the list as it is, at any depth (exact, not a bound)
    assert deeper([4, 4], [4, 4], 2, 3, 30) == [4, 4]
    # one tensor changed beside the insert: not an insert
    assert deeper([1, 2, 3], [1, 2, 2, 4], 2, 3, 5) is None


def test_at_batch_is_affine_per_tensor_and_drops_what_falls_under_trls_threshold():
    lo, hi = [2048, 1024, 4096], [6144, 3072, 4096]  # at micro-batch 2 and 6
    assert at_batch(lo, hi, 2, 6, 4) == [4096, 2048, 4096]
    assert at_batch(lo, hi, 2, 6, 1) == [1024, 4096]  # 512 B stays on the device
    assert at_batch(lo, hi, 2, 6, 6) == hi
    assert at_batch(lo, hi[:2], 2, 6, 4) is None  # not the same tensors
    assert at_batch(lo, hi[:2], 2, 6, 2) == lo  # a simulated micro-batch: its own list


def test_lists_that_do_not_line_up_give_a_bound_from_the_upper_micro_batch():
    """A tensor under TRL's 1 KiB at micro-batch 2 and copied at 4: the row at 3 cannot pair
    them; its pinned bytes are bounded by the list at 4 (each tensor at least as large), or by
    twice the bytes copied there, whichever is less."""
    class P:
        def __init__(self, layers, batch, sizes):
            self.layers, self.batch = layers, batch
            self.sim = type("S", (), {"info": {"offloaded_sizes": sizes}})()

    pts = [P(2, 2, [2048, 2048]), P(3, 2, [2048, 2048, 2048]),
           P(2, 4, [4096, 4096, 1500]), P(3, 4, [4096, 4096, 4096, 1500])]
    copied = {3: 30_000, 4: 30_172}.__getitem__
    h = extrapolated(pts, 8, 3, copied)
    hi = 8 * 4096 + 2048  # the full stack's list at 4: 8 layers' tensors and the 1500
    assert (h.exact, h.copied_bytes, h.pinned_bytes, h.tensors) == (False, 30_000, hi, None)
    # at a simulated micro-batch the row is its own list, exact
    assert extrapolated(pts, 8, 4, copied).pinned_bytes == hi
    assert extrapolated(pts, 8, 4, copied).exact


def test_reentrant_checkpointing_leaves_the_host_bytes_unknown(tiny_llama):
    """TRL's trainer offloads the re-run forward's tensors too under reentrant checkpointing:
    the host bytes are unknown, said so, and the host-RAM check keeps them among the unknowns."""
    from trainfit.plan.checks import host_ram_check

    job = JobSpec(model="x", method="lora", seq_len=64, micro_batch=2, grad_accum=1,
                  precision="bf16-true", grad_ckpt="full", activation_offload=True,
                  ckpt_reentrant=True)
    mem = predict_memory(job, tiny_llama, None)
    assert mem.host_activation_bytes is None
    assert "host bytes unknown" in " ".join(mem.model_notes)
    h = host_ram_check(job, 10**6, 10**10, activation_bytes=mem.host_activation_bytes)
    assert "reentrant checkpointing: not sized" in h.unknown
    assert h.activation_offload_bytes_per_rank == 0
    # non-reentrant: sized
    sized = predict_memory(job.replace(ckpt_reentrant=False), tiny_llama, None)
    assert sized.host_activation_bytes > sized.host_activation_copied_bytes > 0


@pytest.fixture(scope="module")
def small_llama():
    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    return ModelSource("small", cfg, "causal-lm", "local")


@pytest.mark.parametrize("ckpt", ["off", "full"])
def test_extrapolated_rows_hold_what_the_full_size_step_holds(small_llama, ckpt):
    """Plan's rows from 2- and 3-layer simulations at micro-batches 1, 2, 3 and 16 against the
    8-layer step simulated whole: the same tensors, byte for byte, at a micro-batch simulated
    (1, 16) and at ones between (5: 1.6 × rounding with checkpointing — the blocks' inputs of
    5 × 128 × 256 × 2 B round up to a power of two)."""
    kw = dict(model="x", method="lora", seq_len=128, grad_accum=1, precision="bf16-true",
              grad_ckpt=ckpt, activation_offload=True)
    model = fit_group(JobSpec(micro_batch=4, **kw), small_llama,
                      SimTarget(device="cuda", compute_capability=(8, 0)), high_batch=16)
    assert model.layer_extrapolated
    for b in (1, 5, 16):
        full = predict_memory(JobSpec(micro_batch=b, **kw), small_llama, None)
        row = host_activations_of_row(model, b)
        assert row.exact
        assert (row.pinned_bytes, row.copied_bytes) == (full.host_activation_bytes,
                                                        full.host_activation_copied_bytes)
        assert full.host_activation_copied_bytes < full.host_activation_bytes < \
            2 * full.host_activation_copied_bytes
    assert "pinned memory" in " ".join(full.model_notes)


def test_fsdp_offload_pins_its_shards_in_power_of_two_blocks():
    """FSDP's CPU offload pins FSDP2's per-parameter shards and FSDP1's per-unit flat shards,
    with their gradients (FSDP1: a ``_cpu_grad`` for every flat parameter, frozen or not), each
    a power-of-two block; an extrapolated plan row's extra equals the full-size step's."""
    from trainfit.memory.host_offload import pinned_extra_bytes
    from trainfit.memory.simulate import simulate_step

    cfg = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    src = ModelSource("small", cfg, "causal-lm", "local")
    kw = dict(model="x", method="full", seq_len=32, micro_batch=2, grad_accum=1,
              precision="amp-bf16", grad_ckpt="off", ranks=8, sharding="fsdp", offload="all")
    target = SimTarget(device="cuda")

    def pinned(**more):
        return simulate_step(JobSpec(**{**kw, **more}), src, target).info["pinned_shards"]

    per_param, uncounted = pinned(fsdp_version="2")
    n_params = 9 * 8 + 3  # per block q k v o gate up down and 2 norms; embed, norm, head
    assert len(per_param) == 2 * n_params and uncounted == 0
    # FSDP2's shards: dim 0 over the ranks, fp32 — gate and up's 344 rows → 43 × 128 × 4 B,
    # down's 128 → 16 × 344 × 4 B, the same 22,016 B (a 32 KiB block each), with the gradients
    assert per_param.count(43 * 128 * 4) == 3 * 2 * 8
    units, uncounted = pinned(fsdp_version="1")
    assert len(units) == 2 * (8 + 1) and uncounted == 0  # 8 blocks and the root, each its grad
    assert sum(units) == sum(per_param)  # the same bytes (no unit needs padding here)
    # LoRA under FSDP1: the frozen root's flat parameter gets its _cpu_grad too, uncounted on
    # the GPU side (its gradient is no gradient there)
    assert pinned(fsdp_version="1", method="lora")[1] > 0
    model = fit_group(JobSpec(**kw), src, target)
    assert model.layer_extrapolated
    assert model.eval([pinned_extra_bytes(p.sim.info["pinned_shards"]) for p in model.points],
                      2) == pinned_extra_bytes((per_param, 0)) > 0
    assert "pinned_shards" not in simulate_step(JobSpec(**{**kw, "offload": "none"}), src,
                                                target).info


def test_zero2_offload_keeps_a_16_bit_partition_and_the_largest_parameters_buffer_on_the_host():
    """ZeRO-2's offload_optimizer also makes, on the host, a 16-bit twin of the rank's partition
    (the updated weights' way back to the GPU) and a 16-bit buffer of the largest trainable
    parameter (DeepSpeed stage_1_and_2.py); unpinned: all of it uncounted bytes, sized from the
    whole model's trainable count — an extrapolated plan row gets the full-size step's bytes."""
    from trainfit.memory.simulate import simulate_step
    from trainfit.memory.zero_host import zero_host_extra_bytes

    cfg = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    src = ModelSource("small", cfg, "causal-lm", "local")
    kw = dict(model="x", method="full", seq_len=32, micro_batch=2, grad_accum=1,
              precision="amp-bf16", grad_ckpt="off", ranks=4, sharding="zero2",
              offload="optimizer", zero_pin_memory=False)  # pinned: the test below
    target = SimTarget(device="cuda")
    full = simulate_step(JobSpec(**kw), src, target)
    n = full.trainable_params
    assert "pinned_shards" not in full.info  # nothing per parameter: all of it flat buffers
    assert zero_host_extra_bytes(JobSpec(**kw), n, 1000 * 128) == 2 * (-(-n // 4) + 1000 * 128)
    model = fit_group(JobSpec(**kw), src, target)
    assert model.layer_extrapolated
    assert model.eval([p.sim.trainable_params for p in model.points], 2) == n
    # fp32 mode: 4 B each (DeepSpeed's fp32 clone of the partition is counted with the GPU-side
    # terms the offload moves: memory.zero); no offload: nothing
    fp32 = JobSpec(**{**kw, "precision": "fp32"})
    assert zero_host_extra_bytes(fp32, n, 1000 * 128) == 4 * (-(-n // 4) + 1000 * 128)
    assert zero_host_extra_bytes(JobSpec(**{**kw, "offload": "none"}), n, 1000 * 128) == 0


def test_zero2_offload_stages_gradients_through_a_gpu_buffer_and_accumulates_on_the_host():
    """DeepSpeed's ZeRO-2 offload keeps temp_grad_buffer_for_gpu_offload, the largest trainable
    parameter in 16 bits, on the GPU (a review: missing, ~1 GiB for a 128k-vocabulary 8B), and
    with accumulation a host buffer of every parameter of the rank's partition at its full
    numel (accumulated_grads_in_cpu; at most the partition and twice the largest parameter)."""
    cfg = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    src = ModelSource("small", cfg, "causal-lm", "local")
    kw = dict(model="x", method="full", seq_len=32, micro_batch=2, grad_accum=1,
              precision="amp-bf16", grad_ckpt="off", ranks=4, sharding="zero2",
              zero_pin_memory=False)
    embed = 1000 * 128  # the largest trainable parameter (embedding; the head the same size)
    on = predict_memory(JobSpec(**kw), src, None)
    off = predict_memory(JobSpec(**{**kw, "offload": "optimizer"}), src, None)
    assert off.breakdown["buffers"] - on.breakdown["buffers"] == 2 * embed
    acc = predict_memory(JobSpec(**{**kw, "offload": "optimizer", "grad_accum": 2}), src, None)
    n = off.trainable_params
    assert acc.host_offload_bytes - off.host_offload_bytes == 2 * (-(-n // 4) + 2 * embed)
    # LoRA: the largest trainable parameter is an adapter's, not the embedding
    lora = predict_memory(JobSpec(**{**kw, "method": "lora", "offload": "optimizer"}), src, None)
    lora_on = predict_memory(JobSpec(**{**kw, "method": "lora"}), src, None)
    assert 0 < lora.breakdown["buffers"] - lora_on.breakdown["buffers"] < 2 * embed // 10


def test_zero2_pin_memory_rounds_each_pinned_partition_up_to_a_power_of_two():
    """DeepSpeed's offload_optimizer pin_memory (0.19's default, and trainfit's): the fp32
    partition, its fp32 gradient, the 16-bit twin and the staging buffer are each a pinned block
    (PyTorch's pinned cache rounds up to a power of two); the optimizer states are not pinned.
    Only for ZeRO-2 with an offload: elsewhere the flag is refused."""
    from typer.testing import CliRunner

    from trainfit.cli.main import app
    from trainfit.memory.host_offload import pow2_ceil
    from trainfit.memory.zero_host import zero2_accumulation_bytes

    cfg = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    src = ModelSource("small", cfg, "causal-lm", "local")
    kw = dict(model="x", method="full", seq_len=32, micro_batch=2, grad_accum=1,
              precision="amp-bf16", grad_ckpt="off", ranks=4, sharding="zero2",
              offload="optimizer")
    plain = predict_memory(JobSpec(**kw, zero_pin_memory=False), src, None)
    pinned = predict_memory(JobSpec(**kw), src, None)  # DeepSpeed 0.19's default: pinned
    part = -(-plain.trainable_params // 4)
    blocks = [4 * part, 4 * part, 2 * part, 2 * 1000 * 128]
    assert pinned.host_offload_bytes - plain.host_offload_bytes == \
        sum(pow2_ceil(b) - b for b in blocks) > 0
    assert pinned.peak_device_bytes == plain.peak_device_bytes  # host memory only
    acc = JobSpec(**{**kw, "grad_accum": 2})
    assert zero2_accumulation_bytes(acc, 10**6, 10**4) == 2 * zero2_accumulation_bytes(
        acc.replace(zero_pin_memory=False), 10**6, 10**4) > 0  # a bound: under twice its bytes
    res = CliRunner().invoke(app, ["plan", "gpt2", "--gpu", "t4", "--zero-pin-memory"])
    assert res.exit_code == 2 and "for ZeRO-2/3 with an offload" in res.output
    # the --no- form too (an audit: accepted in silence under FSDP)
    res = CliRunner().invoke(app, ["plan", "gpt2", "--gpu", "t4", "--ranks", "2", "--sharding",
                                   "fsdp", "--no-zero-pin-memory"])
    assert res.exit_code == 2 and "--no-zero-pin-memory: DeepSpeed's offload pin_memory" in \
        res.output


def test_zero3_offload_pins_its_gradient_buffers_and_holds_the_parameters_twice():
    """ZeRO-3 (DeepSpeed 0.19.8 stage3.py, partition_parameters.py): with offload_optimizer the
    16-bit grad_partitions_flat_buffer and each sub-group's fp32 gradient are pinned blocks;
    with offload_param zero.Init pins every non-persistent parameter's partition, and the
    optimizer's flat 16-bit buffer of the trainable ones (pinned always) comes on top while
    PyTorch's pinned cache keeps the per-parameter blocks.  An extrapolated plan row gets the
    full-size step's bytes; a 7B rank's sub-groups are 1e9-element blocks."""
    from trainfit.memory.host_offload import pinned_extra_bytes
    from trainfit.memory.simulate import simulate_step
    from trainfit.memory.zero_host import (
        SUB_GROUP_SIZE,
        sub_group_pinned_bytes,
        zero_host_extra_bytes,
    )

    cfg = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    src = ModelSource("small", cfg, "causal-lm", "local")
    kw = dict(model="x", method="full", seq_len=32, micro_batch=2, grad_accum=1,
              precision="amp-bf16", grad_ckpt="off", ranks=4, sharding="zero3",
              offload="optimizer")
    target = SimTarget(device="cuda")
    opt = predict_memory(JobSpec(**kw), src, None)
    plain = predict_memory(JobSpec(**kw, zero_pin_memory=False), src, None)
    part = -(-opt.trainable_params // 4)
    assert plain.host_offload_bytes > 0
    assert opt.host_offload_bytes - plain.host_offload_bytes == \
        pow2_ceil(2 * part) - 2 * part + pow2_ceil(4 * part) - 4 * part > 0  # one sub-group
    full = JobSpec(**{**kw, "offload": "all"})
    blocks = simulate_step(full, src, target).info["pinned_shards"]
    # every parameter: zero.Init partitions before the engine marks any persistent
    assert len(blocks[0]) == 9 * 8 + 3 and blocks[1] == 0
    assert sorted(blocks[0])[-1] == 1000 * 128 // 4 * 2  # the embedding's partition, bf16
    every = predict_memory(full, src, None)
    every_plain = predict_memory(full.replace(zero_pin_memory=False), src, None)
    # pinned: the per-parameter blocks' rounding, and the flat buffer on top of them
    assert every.host_offload_bytes - every_plain.host_offload_bytes == \
        opt.host_offload_bytes - plain.host_offload_bytes + pinned_extra_bytes(blocks) + 2 * part
    # unpinned, the flat buffer (pinned always) takes the freed per-parameter tensors' place
    assert zero_host_extra_bytes(full.replace(zero_pin_memory=False), opt.trainable_params,
                                 1000 * 128) == pow2_ceil(2 * part) - 2 * part
    assert "pinned_shards" not in simulate_step(JobSpec(**kw), src, target).info
    model = fit_group(full, src, target)
    assert model.layer_extrapolated
    assert model.eval([pinned_extra_bytes(p.sim.info["pinned_shards"]) for p in model.points],
                      2) == pinned_extra_bytes(blocks)
    # a 7B model's rank partition over 2 ranks: 1e9-element sub-groups closing at most a
    # parameter past it, then the rest — the most their fp32 blocks can hold: 3 of 4 GiB and
    # the rest's 2 GiB (1.45 GiB of rounding; a review found 0.45 said)
    assert SUB_GROUP_SIZE == 10**9
    assert sub_group_pinned_bytes(3_369_992_192, 65_536_000) == 3 * 2**32 + 2**31
    assert sub_group_pinned_bytes(10**6, 10**4) == pow2_ceil(4 * 10**6)
