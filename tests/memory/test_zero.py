"""DeepSpeed ZeRO-2/3 per rank (memory/zero.py): analytic terms over the one-process step."""

from __future__ import annotations

import pytest

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobError, JobSpec
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


def _blocks(nbytes: int) -> int:
    return -(-nbytes // 512) * 512


def test_zero_terms_per_rank(tiny_llama):
    """ZeRO-2 keeps the bf16 parameters whole and partitions the gradients (2 Ψ_t / N bytes),
    the fp32 master and the states; ZeRO-3 partitions the parameters too, but a model this small
    (far under the reuse distance) stays gathered from forward to backward on top of its
    partition; both hold less per rank than DDP's whole copies."""
    gpu = find_gpu("a100-80gb")
    base = dict(model="t", seq_len=32, micro_batch=2, grad_accum=1, precision="amp-bf16",
                grad_ckpt="off", ranks=4)
    ddp = predict_memory(JobSpec(**base), tiny_llama, gpu)
    z2 = predict_memory(JobSpec(**base, sharding="zero2"), tiny_llama, gpu)
    z3 = predict_memory(JobSpec(**base, sharding="zero3"), tiny_llama, gpu)
    n = z2.trainable_params
    # each term in whole 512-byte allocator blocks (n = 1,056,640: 528,320 B → 528,384)
    assert z2.breakdown["gradients"] == _blocks(-(-n * 2 // 4))
    whole = z2.breakdown["parameters"]
    assert z3.breakdown["parameters"] == _blocks(-(-whole // 4) + whole)
    assert z2.peak_allocated_bytes < ddp.peak_allocated_bytes
    assert z3.peak_allocated_bytes < ddp.peak_allocated_bytes
    assert any("ZeRO-2 over 4 ranks" in note for note in z2.model_notes)
    lora = predict_memory(JobSpec(**base, sharding="zero3", method="lora"), tiny_llama, gpu)
    assert any("memory_efficient_linear" in note for note in lora.model_notes)
    assert not any("memory_efficient_linear" in note for note in z3.model_notes)


GIB = 2**30


def test_zero3_keeps_what_is_reused_within_the_distance():
    """DeepSpeed's release rule over a forward → backward trace (bf16, 2 bytes per element):
    a module stays gathered when 2 × the elements after it stay under 1e9, and the prefetcher,
    which outruns the forward, keeps up to stage3_max_live_parameters (1e9) gathered for the
    backward, and past it by up to its largest parameter.  Llama-2-7B (32 layers of 202 M,
    untied head of 131 M): 1e9 + the head; Llama-2-70B (80 × 856 M, head 262 M): the cap + the
    head (1.26 B), more than the head and the last layer the window keeps (1.12 B); a small
    model: everything."""
    from trainfit.memory.zero import zero3_gathered_bytes

    def gathered(layer_numel, layers, vocab_numel, tied=False, prefetch=0, largest=-1):
        # the largest parameter: the head (these models' layers are split in 7 projections,
        # none as large), unless given
        largest = vocab_numel * 2 if largest == -1 else largest
        ends = (0, vocab_numel * 2) if tied else (vocab_numel * 2, vocab_numel * 2)
        return zero3_gathered_bytes(layer_numel * 2 * layers + sum(ends), layers=layers,
                                    end_bytes=ends, compute_bytes=2, prefetch_bytes=prefetch,
                                    largest_param_bytes=largest)

    l7, v7 = 202_383_360, 32000 * 4096
    # the window keeps the head and the last two layers (536 M), the prefetcher up to
    # stage3_max_live_parameters (1e9): the prefetcher's
    # stage3_max_live_parameters alone (a cap passed by nothing), then passed by up to its
    # largest parameter, the head (131 M), less an element
    assert gathered(l7, 32, v7, largest=0) == 10**9 * 2
    assert gathered(l7, 32, v7) == 10**9 * 2 + v7 * 2 - 2
    # not known: the larger of the end modules and a whole layer
    assert gathered(l7, 32, v7, largest=None) == 10**9 * 2 + l7 * 2 - 2
    l70, v70 = 855_654_400, 32000 * 8192
    # the window keeps the head and the last layer (1.12 B); the cap + the head is more
    assert gathered(l70, 80, v70, largest=0) == v70 * 2 + l70 * 2
    assert gathered(l70, 80, v70) == 10**9 * 2 + v70 * 2 - 2
    # a head past half the distance (256 k × 8192): no layer comes back in reach, only the head
    # (2.1 B elements, over the cap + a projection: the window's)
    assert gathered(l70, 80, 256_000 * 8192, largest=235 * 10**6 * 2) == 256_000 * 8192 * 2
    # only a head smaller than a layer kept (Qwen's 152 k vocabulary at 4096, 70B layers): the
    # layer in flight is the larger, and the prefetcher's 1e9 + the head larger still
    assert gathered(l70, 80, 152_064 * 4096) == 10**9 * 2 + 152_064 * 4096 * 2 - 2
    # Llama-3.2-1B-like (16 × 60 M, tied 263 M embedding): the window keeps the tied head and
    # the last 4 layers; the cap + the embedding passes its 1.22 B: the whole model, no bucket
    tied = gathered(60_000_000, 16, 128256 * 2048, tied=True, prefetch=10)
    assert tied == 60_000_000 * 2 * 16 + 128256 * 2048 * 2
    # what past the cap is the bound (said in the plan's note): there the whole model past the
    # cap (the note had gone where the model, not the cap + the largest, was the smaller)
    from trainfit.memory.zero import zero3_gathered

    whole = 60_000_000 * 2 * 16 + 128256 * 2048 * 2
    assert zero3_gathered(whole, layers=16, end_bytes=(0, 128256 * 2048 * 2), compute_bytes=2,
                          prefetch_bytes=10, largest_param_bytes=128256 * 2048 * 2)[1] == \
        whole - 10**9 * 2
    # none under the cap; not known: None
    assert zero3_gathered(4_200_000, layers=4, end_bytes=(200_000, 0), compute_bytes=2,
                          prefetch_bytes=0)[1] == 0
    assert zero3_gathered(whole, layers=16, end_bytes=(0, 128256 * 2048 * 2), compute_bytes=2,
                          prefetch_bytes=10)[1] is None
    # a frozen embedding whose output needs no gradient has no backward: released after its
    # forward (LoRA without checkpointing)
    assert zero3_gathered_bytes(4_200_000, layers=4, end_bytes=(200_000, 0), compute_bytes=2,
                                prefetch_bytes=0, embed_in_backward=False) == 4_000_000
    # under half the distance, all of it (the prefetch capped by the whole)
    assert gathered(1_000_000, 4, 100_000, prefetch=10**9) == (4_000_000 + 200_000) * 2


def test_zero3_linear_keeps_a_frozen_projections_input():
    """ZeRO-3's linear (DeepSpeed's LinearFunctionForZeroStage3, as zero.py writes it) keeps the
    input of a frozen projection alive for the backward, which plain autograd frees; its
    gradients are F.linear's, and F.linear is restored after."""
    import weakref

    import torch

    from trainfit.memory.zero import zero3_linear

    torch.manual_seed(0)
    frozen = torch.nn.Linear(64, 32).requires_grad_(False)
    x = torch.randn(4, 8, 64, requires_grad=True)

    def run() -> tuple[bool, torch.Tensor]:
        h = x * 2.0  # the projection's input: an intermediate only the graph can keep
        alive = weakref.ref(h)
        y = frozen(h)
        del h
        kept = alive() is not None
        (grad,) = torch.autograd.grad(y.square().sum(), x)
        return kept, grad

    original = torch.nn.functional.linear
    kept_plain, grad_plain = run()
    with zero3_linear():
        kept_zero3, grad_zero3 = run()
    assert (kept_plain, kept_zero3) == (False, True)
    torch.testing.assert_close(grad_zero3, grad_plain)
    assert torch.nn.functional.linear is original


def test_deepspeeds_fp16_mode_is_timed_in_fp16(tiny_llama):
    """DeepSpeed's fp16 mode halves the module; its simulated twin is bf16-true (the same bytes),
    whose matmuls were recorded as bf16: on a T4, which has no bf16, every ZeRO amp-fp16 row's
    speed came out unknown. The ops are now fp16, as the GPU runs them; bf16 mode stays bf16."""
    from trainfit.speed.ops import OpRecorder
    from trainfit.speed.predict import predict_speed_exact
    from trainfit.speed.roofline import DeviceSpeed

    gpu = find_gpu("t4")
    for precision, want, not_want in (("amp-fp16", "fp16", "bf16"), ("amp-bf16", "bf16", "fp16")):
        job = JobSpec(model="t", seq_len=32, micro_batch=2, grad_accum=1, precision=precision,
                      grad_ckpt="off", ranks=2, sharding="zero2")
        rec = OpRecorder()
        predict_memory(job, tiny_llama, gpu, op_hook=rec)
        gemms = {op.dtype for op in rec.ops if op.gemm is not None and op.phase != "optimizer"}
        assert want in gemms and not_want not in gemms
        if precision == "amp-fp16":
            speed = predict_speed_exact(DeviceSpeed.from_gpu(gpu), rec.ops, 2, 1, 32, 2, 1e6)
            assert speed.tokens_per_s is not None and speed.tokens_per_s > 0


def test_extrapolated_zero3_rows_do_not_keep_the_whole_gradient():
    """The one-process twin's backward peaks at its end (every gradient made) at micro-batch 1
    and at its start at 2 at the small depths the rows are fitted from: the whole gradient was
    booked as temporaries every rank holds, +31 % over the full-size simulation at micro-batch 2
    (Llama-3-70B on 8 ranks: 265 GiB against 166).  A ZeRO rank drops the gradient: the rows
    now come within the allocator's whole-block rounding of the full-size simulation."""
    from transformers import LlamaConfig

    from trainfit.model.source import ModelSource
    from trainfit.plan.grid import plan

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=40,
                      num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                      max_position_embeddings=256)
    src = ModelSource("z", cfg, "causal-lm", "local")
    gpu = find_gpu("h100-sxm")
    job = JobSpec(model="z", seq_len=256, effective_batch=64, method="full",
                  precision="amp-bf16", grad_ckpt="full", ranks=8, sharding="zero3")
    rows = [r for r in plan(job, src, gpu, verify=False, ladder=False).rows
            if r.how == "extrapolated"]
    assert {r.job.micro_batch for r in rows} >= {1, 2}
    for r in rows:
        if r.job.micro_batch > 2:  # 1 peaks at backward's end, 2 at its start
            continue
        full = predict_memory(r.job, src, gpu)
        # the twin's whole-block rounding at its own peak, not the rank's: up to 1.3 % under
        assert abs(r.memory.peak_allocated_bytes / full.peak_allocated_bytes - 1) < 0.02, \
            (r.job.micro_batch, r.memory.breakdown, full.breakdown)


def test_zero3_steps_one_sub_group_at_a_time():
    """An audit: ZeRO-3's step was booked a fp32 copy of the whole gradient partition (Llama-3.1-8B
    on 2 ranks: 15 GiB, the run refused at 75.9 GiB against DeepSpeed's own 69.3 GiB estimate).
    stage3.py makes one sub-group's fp32 gradient at a time (its bf16 flat copy alive for the
    cast) and frees it before the next; ZeRO-2 casts the whole partition, its flat copy alive
    too.  With the fused AdamW (no temporaries of its own) the cast is the step's moment."""
    from trainfit.memory.zero_step import SUB_GROUP_SIZE, step_temporary_bytes

    def temp(part: int, largest: int, compute: int, stage3: bool, impl: str = "fused") -> int:
        job = JobSpec(model="llama-3.1-8b", optimizer_impl=impl)
        return step_temporary_bytes(job, partition=part, largest_partition=largest,
                                    compute_bytes=compute, stage3=stage3)

    part, largest = 4_015_263_744, 262_668_288  # 8.03 B / 2; the 128k × 4096 embedding / 2
    most = SUB_GROUP_SIZE + largest - 1
    assert temp(part, largest, 2, True) == most * 6
    assert temp(part, largest, 2, False) == part * 6
    # a partition under one sub-group: all of it; fp32 compute: the flat copy is the cast
    assert temp(10**6, 10**5, 2, True) == 6 * 10**6
    assert temp(10**6, 10**5, 4, True) == 4 * 10**6
    # torch's foreach AdamW (HF optim "adamw_torch") beside the fp32 gradient: one partition-
    # sized temporary; for-loop: two.  ZeRO-2's 16-bit gradient buffer stays (HF's second group
    # holds views of it), as ZeRO-3's does
    assert temp(10**6, 10**5, 2, True, "foreach") == 8 * 10**6
    assert temp(10**6, 10**5, 2, True, "forloop") == 12 * 10**6
    assert temp(10**6, 10**5, 2, False, "forloop") == 12 * 10**6
    # ZeRO-3 in fp16: the overflow check's bool over the whole partition, past 6 sub-groups
    def fp16(part: int) -> int:
        job = JobSpec(model="llama-3.1-70b", precision="amp-fp16")
        return step_temporary_bytes(job, partition=part, largest_partition=10**8,
                                    compute_bytes=2, stage3=True)
    assert fp16(8_750_000_000) == 8_750_000_000 and fp16(10**9) == 6 * 10**9

    # and zero_phases books it at the step only
    from trainfit.memory.zero import zero_phases

    job = JobSpec(model="llama-3.1-8b", seq_len=2048, micro_batch=1, effective_batch=8,
                  grad_ckpt="full", precision="amp-bf16", ranks=2, sharding="zero3")
    phases = {"forward": {"parameters": 2 * 2 * part, "temporaries": 123},
              "optimizer": {"parameters": 2 * 2 * part, "optimizer": 8 * 2 * part}}
    out, _ = zero_phases(job, phases, trainable_params=2 * part, quant_state_bytes=0,
                         hidden=4096, layers=32, compute_bytes=2,
                         largest_trainable_numel=2 * largest)
    assert out["optimizer"]["temporaries"] == -(-most * 6 // 512) * 512
    assert out["forward"]["temporaries"] == 512
    # the step holds the partitions only: the gathered layers are released first
    assert out["optimizer"]["parameters"] < out["forward"]["parameters"]
    assert out["optimizer"]["parameters"] == -(-2 * part // 512) * 512


def test_the_optimizer_on_a_flat_partition_is_measured():
    """DeepSpeed gives its optimizer 1-D fp32 tensors: what they keep and make, per element, from
    the job's optimizer run on one (AdamW: two fp32 states; Adafactor cannot factor a vector:
    a full second moment, where the model's matrices would keep two small ones)."""
    from trainfit.memory.zero_step import flat_optimizer_bytes

    adamw = {impl: flat_optimizer_bytes("adamw", impl) for impl in ("fused", "foreach", "forloop")}
    assert [round(a.states_per_element, 3) for a in adamw.values()] == [8.0, 8.0, 8.0]
    assert [a.temporaries_per_element for a in adamw.values()] == [0.0, 4.0, 8.0]
    assert round(flat_optimizer_bytes("adafactor", "fused").states_per_element, 3) == 4.0
    assert round(flat_optimizer_bytes("sgd", "fused").states_per_element, 3) == 4.0
    # bitsandbytes' 8-bit states: 2 bytes, two fp32 scales per 256-element block (+ its maps)
    assert 2.031 <= flat_optimizer_bytes("adamw-8bit", "fused").states_per_element < 2.05
    # a paged optimizer's states are managed memory, outside the allocator
    assert flat_optimizer_bytes("paged-adamw", "fused").states_per_element == 0.0
    # SGD's L2 decay: grad + wd · param as a new tensor, but in the fused kernel; AdamW's
    # decoupled decay is in place whatever the implementation
    sgd = [flat_optimizer_bytes("sgd", impl, wd).temporaries_per_element
           for impl in ("foreach", "forloop", "fused") for wd in (0.0, 0.01)]
    assert sgd == [0.0, 4.0, 0.0, 4.0, 0.0, 0.0]
    # no momentum, no state (HF's optim="sgd")
    assert flat_optimizer_bytes("sgd", "foreach", 0.0, 0.0).states_per_element == 0.0
    assert [flat_optimizer_bytes("adamw", impl, 0.01).temporaries_per_element
            for impl in ("fused", "foreach", "forloop")] == [0.0, 4.0, 8.0]


def test_zero3_says_when_it_saves_no_parameter_memory():
    """A review: Qwen2.5-1.5B QLoRA on 2 ranks came 0.4 GiB above DDP under ZeRO-3, unsaid. Under
    the reuse distance every module stays gathered, so the partition comes on top of a whole
    copy: said, with the figures; an 8B model (partly kept) is not told so."""
    from trainfit.memory.zero import zero_phases

    def notes(params: int, layers: int, method: str = "qlora") -> tuple[int, int, list[str]]:
        job = JobSpec(model="llama-3.1-8b", seq_len=1024, micro_batch=1, effective_batch=8,
                      grad_ckpt="full", precision="amp-bf16", ranks=2, sharding="zero3",
                      method=method)
        phases = {"backward": {"parameters": params, "activations": 10**6}}
        out, said = zero_phases(job, phases, trainable_params=10**6, quant_state_bytes=0,
                                hidden=1536, layers=layers, compute_bytes=2,
                                end_bytes=(params // 10, params // 10))
        return out["backward"]["parameters"], params, [n for n in said if "saves no" in n]

    held, whole, said = notes(1_070_000_000, 28)  # ~1.07 GB of 4-bit layers and bf16 ends
    assert held > whole and len(said) == 1
    assert f"{held / 2**30:.2f} GiB per rank" in said[0] and "--sharding none or zero2" in said[0]
    held, whole, said = notes(16_000_000_000, 32, "full")  # 8 B parameters in bf16
    assert held < whole and said == []


def test_the_configs_bucket_sizes_are_the_ranks():
    """DeepSpeed's reduce bucket is ``reduce_bucket_size`` elements of the gradient dtype (ZeRO-3:
    one, made at init; ZeRO-2: two with overlap_comm, counted two) and the prefetch bucket
    ``stage3_prefetch_bucket_size``: "auto" (hidden², 0.9 hidden²) unless the job gives the
    config's numbers — DeepSpeed's own defaults (5e8, 5e7) where an accelerate config without a
    DeepSpeed file leaves them out (a review: 1 GiB a rank missing at hidden 4096)."""
    from trainfit.memory.zero import zero_phases

    def run(sharding: str, **over) -> tuple[dict[str, int], list[str]]:
        job = JobSpec(model="llama-3.1-8b", seq_len=1024, micro_batch=1, effective_batch=8,
                      grad_ckpt="full", precision="amp-bf16", ranks=8, sharding=sharding,
                      method="full", **over)
        phases = {"backward": {"parameters": 16 * 2**30, "activations": 10**6}}
        out, said = zero_phases(job, phases, trainable_params=8 * 10**9, quant_state_bytes=0,
                                hidden=4096, layers=32, compute_bytes=2,
                                end_bytes=(2**30, 2**30), largest_param_bytes=2**30)
        return out["backward"], said

    auto, _ = run("zero3")
    given, said = run("zero3", zero_reduce_bucket=500_000_000)
    # one bf16 bucket of 5e8 elements against hidden² = 16,777,216
    assert given["data_parallel"] - auto["data_parallel"] == (500_000_000 - 4096**2) * 2
    assert any("500,000,000 elements (954 MiB, zero_reduce_bucket" in n
               for n in said)
    z2_auto, _ = run("zero2")
    z2, _ = run("zero2", zero_reduce_bucket=200_000_000)  # the HF docs' ZeRO-2 example's
    assert z2["data_parallel"] - z2_auto["data_parallel"] == 2 * (200_000_000 - 4096**2) * 2
    # the prefetch bucket rides with what ZeRO-3 keeps gathered: more, never less
    more, _ = run("zero3", zero_prefetch_bucket=50_000_000)
    assert more["parameters"] >= auto["parameters"]
    with pytest.raises(JobError, match="zero3 only"):
        JobSpec(model="gpt2", ranks=2, sharding="zero2", zero_prefetch_bucket=5)
    with pytest.raises(JobError, match="zero2 or zero3 only"):
        JobSpec(model="gpt2", ranks=2, sharding="fsdp", zero_reduce_bucket=5)
