"""The contradictions users reported in ``plan``'s tables, each pinned where it was fixed (issue:
predictions people can stake a GPU-hour on): a negative FSDP breakdown term, extrapolation under
a convex peak, a Falcon ``config.json`` with ``head_dim``, a ladder rung that raised the peak, and
the reported catalog plans.  The checks themselves are the invariant sweep's
(:mod:`test_invariants`)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from test_invariants import (  # noqa: F401  (_one_process: the sweep's autouse fixture, here too)
    GPU,
    SEQ,
    Checked,
    _arch_configs,
    _one_process,
    check_plan,
)

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobError, JobSpec
from trainfit.memory.extrapolate import fit_group
from trainfit.memory.predict import predict_memory, target_for
from trainfit.model.source import ModelSource
from trainfit.plan.grid import plan
from trainfit.plan.result import PlanRow


def test_fsdp_breakdown_has_no_negative_term_and_sums_to_the_peak() -> None:
    """Was: ``data_parallel −36.22 GiB`` (FSDP's savings booked as one negative term, from the
    one-process peak's mix).  Now the sharded terms are divided and the gathered layers added."""
    cfg, task = _arch_configs()["llama"]
    src = ModelSource("llama", cfg, task, "local")
    job = JobSpec(model="llama", seq_len=SEQ, method="full", precision="amp-bf16", micro_batch=4,
                  grad_accum=1, ranks=8, sharding="fsdp")
    m = predict_memory(job, src, GPU)
    assert all(v >= 0 for v in m.breakdown.values()), m.breakdown
    assert sum(v for k, v in m.breakdown.items() if k != "managed") == m.peak_allocated_bytes
    one = predict_memory(job.replace(ranks=1, sharding="none"), src, GPU)
    assert m.peak_allocated_bytes < one.peak_allocated_bytes


def test_extrapolation_follows_the_peak_to_large_micro_batches() -> None:
    """Was: 11.8 MB predicted at micro-batch 64 against 20.8 MB simulated (the line through 2 and
    3 under a convex peak), and micro-batch 2 predicted below 1."""
    from trainfit.memory.simulate import simulate_step

    cfg, task = _arch_configs()["llama"]
    src = ModelSource("llama", cfg, task, "local")
    job = JobSpec(model="llama", seq_len=SEQ, method="full", precision="amp-fp16",
                  grad_ckpt="full", micro_batch=1, grad_accum=1)
    m = fit_group(job, src, target_for(GPU), high_batch=64)
    prev = 0
    for b in (1, 2, 8, 64):
        pred = m.predict(b, accumulating=False)["peak_allocated_bytes"]
        sim = simulate_step(job.replace(micro_batch=b, effective_batch=None), src, target_for(GPU))
        assert pred >= sim.peak_allocated_bytes and pred >= prev, (b, pred, sim.peak_allocated_bytes)
        prev = pred


def test_falcon_config_json_with_head_dim(tmp_path: Any) -> None:
    """Was: AttributeError "property 'head_dim' of 'FalconConfig' object has no setter"."""
    import json

    from trainfit.model.source import resolve_model

    fields = {"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "head_dim": 16, "vocab_size": 512,
              "new_decoder_architecture": True, "num_kv_heads": 2}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(fields))
    src = resolve_model(str(p))
    assert src.config.head_dim == 16 and type(src.config).__name__ == "FalconConfig"
    res = plan(JobSpec(model=str(p), seq_len=SEQ, micro_batch=2, grad_accum=1,
                       precision="amp-bf16", grad_ckpt="off"), src, GPU)
    assert res.rows[0].memory.fits
    p.write_text(json.dumps({**fields, "head_dim": 32}))  # not what Falcon derives: refused
    with pytest.raises(JobError, match="derives head_dim = 16"):
        resolve_model(str(p))


def test_ladder_measures_from_the_start_and_skips_a_rung_that_saves_nothing() -> None:
    """Was: "gradient checkpointing on" raising the peak 54.72 → 55.37 GiB (Mistral-7B, 3090):
    the start was an extrapolated row, the rung a full-size simulation, and checkpointing does
    not lower a peak made of weights, gradients and optimizer states."""
    from trainfit.plan.ladder import build_ladder

    start = JobSpec(model="m", seq_len=512, micro_batch=4, grad_accum=1, precision="bf16-true",
                    grad_ckpt="off")
    seen: list[JobSpec] = []

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        seen.append(j)
        peak = 100 if j.grad_ckpt == "off" else 101  # checkpointing saves nothing here
        if j.optimizer == "adamw-8bit":
            peak -= 40
        return peak, 1.0, peak <= 70

    rungs = build_ladder(start, evaluate)
    assert seen[0] is start
    assert [r.change.split(" ")[0] for r in rungs] == ["8-bit"]
    assert rungs[-1].fits


def test_ladder_undoes_an_earlier_change_to_learning_the_last_rung_made_needless() -> None:
    """An audit: Llama-3.1-8B on a T4 ended with "sequence 2048 → 1024" and QLoRA, where QLoRA
    alone fits at the full sequence (10.68 GiB of a 13.27 fit line). Once a rung fits, each
    earlier learning-altering rung is taken back where the last still fits without it."""
    from trainfit.plan.ladder import build_ladder

    start = JobSpec(model="m", seq_len=2048, micro_batch=1, grad_accum=8, precision="amp-fp16",
                    grad_ckpt="full", method="lora", lora_r=16, lora_alpha=32,
                    optimizer="adamw", lora_targets=["q", "v"])

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = (20 if j.method == "lora" else 9) + (0 if j.seq_len == 2048 else -2) \
            + (0 if j.optimizer == "adamw" else -1) + (0 if j.lora_r == 16 else -1)
        return peak, 300.0 * 2048 / j.seq_len, peak <= 11

    rungs = build_ladder(start, evaluate)
    changes = [r.change for r in rungs]
    qlora = next(i for i, c in enumerate(changes) if c.startswith("QLoRA"))
    undone = changes[qlora + 1:]
    # latest first; QLoRA alone (9) fits: every earlier learning change is taken back
    assert undone[0].startswith("undo “sequence 2048 → 1024 tokens”"), changes
    seq = next(i for i, c in enumerate(changes) if c.startswith("sequence"))
    assert rungs[qlora + 1].undoes == seq and rungs[qlora + 1].to_dict()["undoes"] == seq
    assert all(r.undoes is None for r in rungs[:qlora + 1])
    assert any(c.startswith("undo “LoRA rank 16 → 8”") for c in undone)
    last = rungs[-1]
    assert last.fits and not last.alters_learning and last.peak_device_bytes == 9
    assert (last.job["seq_len"], last.job["method"], last.job["lora_r"]) == (2048, "qlora", 16)
    assert all(r.fits for r in rungs[qlora:])
    # one that is still needed stays: QLoRA at 12 needs the shorter sequence (10)
    def tight(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = (20 if j.method == "lora" else 12) + (0 if j.seq_len == 2048 else -2)
        return peak, 1.0, peak <= 11
    kept = build_ladder(start, tight)
    assert kept[-1].change.startswith("QLoRA") and kept[-1].job["seq_len"] == 1024
    # a change costing only time is taken back too, after those to learning (Mistral-7B on a
    # 3090 ended LoRA with activation offloading, its speed unknown)
    def with_ckpt(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = (20 if j.method == "lora" else 8) + (0 if j.grad_ckpt == "off" else -3)
        return peak, 1.0, peak <= 11
    rungs = build_ladder(start.replace(grad_ckpt="off"), with_ckpt)
    undone = [r.change for r in rungs if r.undoes is not None]
    assert undone and undone[-1].startswith("undo “gradient checkpointing on")
    assert rungs[-1].job["grad_ckpt"] == "off" and rungs[-1].fits


def test_reported_qwen_7b_full_fsdp_8_ranks_on_h100() -> None:
    """The report: ``data_parallel −36.22 GiB``; checkpointed amp-bf16 8×1 allocating 17.95 GiB
    but reserving 102.28; bf16-true checkpointed 4×1 below 1×1 (catalog scale: the two reported
    checkpointed groups, ~1 min; benchmarks/invariants.py checks the whole plan)."""
    from trainfit.model.source import resolve_model

    src = resolve_model("qwen2.5-7b")
    by: dict[tuple[str, str, int], PlanRow] = {}
    for precision in ("amp-bf16", "bf16-true"):
        res = plan(JobSpec(model="qwen2.5-7b", method="full", ranks=8, sharding="fsdp",
                           precision=precision, grad_ckpt="full"), src, find_gpu("h100"),
                   ladder=False, verify=False)  # the pick's re-simulation: test_plan
        c = Checked()
        check_plan(c, res)
        assert not c.violations, c.examples
        by |= {(r.job.precision, r.job.grad_ckpt, r.job.micro_batch): r for r in res.rows}
    # the reserve of that row simulated at full size (one rank through FSDP2, its alloc/free
    # trace replayed per stream) — the extrapolated row's reserve is bounded by check_plan
    exact = predict_memory(by[("amp-bf16", "full", 8)].job, src, find_gpu("h100"))
    assert exact.peak_reserved_bytes < 1.5 * exact.peak_allocated_bytes
    assert by[("bf16-true", "full", 4)].memory.peak_allocated_bytes >= \
        by[("bf16-true", "full", 1)].memory.peak_allocated_bytes


def test_reported_mistral_7b_on_3090() -> None:
    """The report: bf16-true 1×1 needing more than 4×1, and the ladder's "checkpointing on"
    raising the peak (catalog scale: the reported bf16-true group and its ladder, ~1 min)."""
    from trainfit.model.source import resolve_model

    src = resolve_model("mistral-7b")
    res = plan(JobSpec(model="mistral-7b", precision="bf16-true", grad_ckpt="off"), src,
               find_gpu("3090"))
    c = Checked()
    check_plan(c, res)
    assert not c.violations, c.examples
    by = {(r.job.precision, r.job.grad_ckpt, r.job.micro_batch): r.memory for r in res.rows}
    assert by[("bf16-true", "off", 1)].peak_device_bytes <= \
        by[("bf16-true", "off", 4)].peak_device_bytes
    # each change lowers the peak; a rung taking back a change the fit made needless (undoes)
    # raises it again, and still fits
    peaks = [r.peak_device_bytes for r in res.ladder if r.undoes is None]
    assert res.ladder and res.ladder[-1].fits
    assert all(b < a for a, b in itertools.pairwise(peaks))
    assert all(r.fits for r in res.ladder if r.undoes is not None)


def test_ladder_offers_the_optimizer_step_in_backward_for_a_full_fine_tune() -> None:
    """A full fine-tune whose peak is the gradients beside the states: the rung after the 8-bit
    optimizer steps each parameter in the backward (clipping off: it alters the updates, said)."""
    from trainfit.plan.ladder import build_ladder

    start = JobSpec(model="m", seq_len=512, micro_batch=4, grad_accum=1, precision="bf16-true",
                    grad_ckpt="full", optimizer="sgd")

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = 100 - (30 if j.optimizer_in_backward else 0)
        return peak, 1.0, peak <= 70

    rungs = build_ladder(start, evaluate)
    assert len(rungs) == 1 and rungs[0].change.startswith("optimizer step in the backward pass")
    assert rungs[0].alters_learning and rungs[0].fits and rungs[0].peak_device_bytes == 70
    assert rungs[0].job["optimizer_in_backward"] and rungs[0].job["max_grad_norm"] is None
    # accumulation rules it out: no such rung
    acc = build_ladder(start.replace(micro_batch=2, grad_accum=2), evaluate)
    assert not any(r.job["optimizer_in_backward"] for r in acc)


def test_ladder_offers_lora_before_a_shorter_sequence_or_4_bit_weights() -> None:
    """Gemma-2B full on a T4: the ladder went from the optimizer rungs straight to a shorter
    sequence and QLoRA; LoRA over the 16-bit base — the usual first answer — was never tried."""
    from trainfit.plan.ladder import build_ladder

    start = JobSpec(model="m", seq_len=1024, micro_batch=1, grad_accum=1, precision="amp-fp16",
                    grad_ckpt="full", max_grad_norm=1.0)

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = 100 - (20 if j.optimizer == "adamw-8bit" else 0)
        peak -= 40 if j.method == "lora" else 0
        return peak, 1.0, peak <= 45

    rungs = build_ladder(start, evaluate)
    changes = [r.change.split(" ")[0] for r in rungs]
    assert changes[-1] == "LoRA" and rungs[-1].fits and rungs[-1].alters_learning
    assert not any(c in ("sequence", "QLoRA:") for c in changes)
    lora = rungs[-1].job
    assert (lora["method"], lora["lora_r"], lora["max_grad_norm"]) == ("lora", 16, 1.0)


def test_ladder_keeps_its_qlora_and_fsdp_rungs_for_a_torchtune_build() -> None:
    """A job built as torchtune builds (clone_layers): the QLoRA rung takes torchtune's 4-bit
    weights (torchao), the FSDP rung torchtune's distributed build (no copies on the GPU); both
    were refused by JobSpec's checks and silently left out (review of the clone_layers change)."""
    from trainfit.plan.ladder import build_ladder

    start = JobSpec(model="m", method="lora", seq_len=512, micro_batch=1, grad_accum=2,
                    precision="bf16-true", grad_ckpt="full", lora_r=8, lora_targets=["q", "v"],
                    clone_layers=True)

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = 100 - (30 if j.method == "qlora" else 0) - (60 if j.sharding == "fsdp" else 0)
        return peak, 1.0, peak <= 30

    rungs = build_ladder(start, evaluate)
    qlora = next(r.job for r in rungs if r.change.startswith("QLoRA"))
    assert (qlora["quant_lib"], qlora["clone_layers"]) == ("torchao", True)
    fsdp = next(r.job for r in rungs if r.change.startswith("FSDP"))
    assert (fsdp["sharding"], fsdp["clone_layers"]) == ("fsdp", False)


def test_ladder_tries_the_expandable_allocator_first_and_keeps_it():
    """Where the default segments' unused rests are the excess, the allocator's setting is the
    first rung (it alters neither speed nor what is learned) and the rungs after it keep it."""
    from trainfit.plan.ladder import build_ladder

    start = JobSpec(model="m", seq_len=512, micro_batch=4, grad_accum=1, precision="bf16-true",
                    grad_ckpt="off")

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = 100 - (8 if j.expandable_segments else 0) - (20 if j.grad_ckpt == "full" else 0)
        return peak, 1.0, peak <= 75

    rungs = build_ladder(start, evaluate)
    assert [r.change.split("=")[0] for r in rungs[:1]] == ["PYTORCH_CUDA_ALLOC_CONF"]
    assert [r.peak_device_bytes for r in rungs] == [92, 72]
    assert not rungs[0].alters_learning and rungs[-1].fits
    assert rungs[-1].job["expandable_segments"] and rungs[-1].job["grad_ckpt"] == "full"
    # a job already planned with it gets no such rung
    again = build_ladder(start.replace(expandable_segments=True), evaluate)
    assert not any(r.change.startswith("PYTORCH_CUDA_ALLOC_CONF") for r in again)


def test_sharded_ladder_offers_cpu_offload_and_more_ranks_that_change_the_batch() -> None:
    """A 70B QLoRA over two RTX 4090s (2026-11-30): the ladder offered no CPU offload — how
    Answer.AI fits it on two 24 GB cards — and no "more ranks" rung, since the row's effective
    batch of 2 does not split over 4 ranks. Now the rung grows the batch, says so, and is marked
    as altering learning; a batch that splits is kept with less accumulation."""
    from trainfit.plan.ladder import build_ladder

    start = JobSpec(model="m", seq_len=2048, micro_batch=1, grad_accum=1, precision="bf16-true",
                    grad_ckpt="full", method="qlora", ranks=2, sharding="fsdp")

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = 100 - (45 if j.offload != "none" else 0) - (30 if j.ranks == 4 else 0)
        return peak, None, peak <= 25

    rungs = build_ladder(start, evaluate)
    assert [r.change.split(" ")[0] for r in rungs] == ["CPU", "FSDP"]
    assert rungs[0].job["offload"] == "all" and not rungs[0].alters_learning
    assert rungs[1].change == "FSDP over 4 ranks (effective batch 2 → 4)"
    assert (rungs[1].job["ranks"], rungs[1].job["effective_batch"]) == (4, 4)
    assert rungs[1].alters_learning and rungs[1].fits and rungs[1].job["offload"] == "all"
    # an effective batch that splits over the new ranks is kept, with less accumulation
    kept = build_ladder(start.replace(grad_accum=4, effective_batch=None), evaluate)
    assert (kept[1].job["effective_batch"], kept[1].job["grad_accum"]) == (8, 2)
    assert kept[1].change == "FSDP over 4 ranks" and not kept[1].alters_learning
    # ZeRO-2 offers only the optimizer's offload, and more ranks of ZeRO-2 after it (a rung
    # switching to FSDP kept offload=optimizer, which FSDP does not take, and vanished)
    z2 = build_ladder(start.replace(method="lora", quant=None, sharding="zero2"), evaluate)
    assert z2[0].job["offload"] == "optimizer" and z2[0].change.startswith(
        "CPU offload of the optimizer")
    assert z2[1].change.startswith("DeepSpeed ZeRO-2 over 4 ranks")
    assert (z2[1].job["sharding"], z2[1].job["offload"]) == ("zero2", "optimizer")


def test_ladder_shards_the_ranks_a_job_has_before_changing_what_is_learned() -> None:
    """A review: a 4×H100 DDP full fine-tune (153 GiB a rank) was sent to 8-bit AdamW, then LoRA,
    where FSDP on the same 4 ranks fit at 45 GiB; and the reason line read "more ranks"."""
    from trainfit.plan.ladder import build_ladder
    from trainfit.render.words import _what_to_try

    start = JobSpec(model="m", seq_len=512, micro_batch=1, grad_accum=1, ranks=4,
                    precision="amp-bf16", grad_ckpt="full", optimizer="adamw")

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = 150 if j.sharding == "none" else 45
        return peak, 1.0, peak <= 70

    rungs = build_ladder(start, evaluate)
    changes = [r.change for r in rungs]
    assert len(rungs) == 1 and changes[0].startswith("FSDP over the 4 ranks you have")
    assert rungs[0].fits and not rungs[0].alters_learning
    assert (rungs[0].job["sharding"], rungs[0].job["ranks"]) == ("fsdp", 4)
    assert _what_to_try(start).startswith("--sharding fsdp (or zero3) over its 4 ranks")
    assert "over its" not in _what_to_try(start.replace(ranks=1, effective_batch=None))


def test_zero_offload_takes_no_bitsandbytes_optimizer_and_the_ladder_drops_it() -> None:
    """A review: the ladder stacked 8-bit AdamW under ZeRO-3's CPU offload, and the flags took it
    — under ZeRO-Offload accelerate swaps any optimizer for DeepSpeed's CPU Adam (fp32 states on
    the host: map_pytorch_optim_to_deepspeed), so planning another is not what runs."""
    from trainfit.job import JobError
    from trainfit.plan.ladder import build_ladder

    for opt in ("adamw-8bit", "paged-adamw", "sgd", "adafactor"):
        with pytest.raises(JobError, match="accelerate replaces it with DeepSpeed's CPU Adam"):
            JobSpec(model="m", ranks=2, sharding="zero3", offload="all", optimizer=opt)
    start = JobSpec(model="m", seq_len=512, micro_batch=1, grad_accum=1, ranks=4,
                    sharding="zero3", precision="bf16-true", grad_ckpt="full", optimizer="adamw")

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = 100 - (10 if j.optimizer == "adamw-8bit" else 0) - (80 if j.offload == "all" else 0)
        return peak, 1.0, peak <= 40

    rungs = build_ladder(start, evaluate)
    if not rungs[0].change.startswith("8-bit"):  # bitsandbytes not installed: no 8-bit rung
        pytest.skip("bitsandbytes not importable")
    last = rungs[-1]
    assert last.change.startswith("CPU offload") and last.fits
    assert "the optimizer: DeepSpeed's CPU Adam (accelerate swaps it in" in last.change
    assert (last.job["offload"], last.job["optimizer"]) == ("all", "adamw")


def test_the_ladder_chunks_the_output_head_before_shortening_the_sequence() -> None:
    """An audit: a 1.5B Qwen LoRA at 65,536 tokens (148 GiB, 74 of it the fp32 logits) was told
    to halve its sequence, where checkpointing + the head in chunks fit in 53 GiB with the same
    learning. The chunked head is a rung before anything that alters what is learned."""
    from trainfit.plan.ladder import build_ladder

    start = JobSpec(model="m", seq_len=65536, micro_batch=1, grad_accum=1, method="lora",
                    precision="bf16-true", grad_ckpt="off")

    def evaluate(j: JobSpec) -> tuple[int, float | None, bool | None]:
        peak = 148 if j.grad_ckpt != "full" else (53 if j.lm_head_chunk else 120)
        return peak, 1.0, peak <= 70

    rungs = build_ladder(start, evaluate)
    assert [r.change.split(" (")[0] for r in rungs] == [
        "gradient checkpointing on", "output head and loss in chunks of 4,096 tokens"]
    assert rungs[-1].fits and not any(r.alters_learning for r in rungs)
    assert rungs[-1].job["lm_head_chunk"] == 4096
