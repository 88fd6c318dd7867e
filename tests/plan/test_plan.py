"""plan over a grid: micro-batches keep the effective batch, fit decisions follow memory."""

import pytest

from trainfit.hardware.gpus import find_gpu, generic_gpu
from trainfit.job import JobError, JobSpec
from trainfit.plan.grid import plan
from trainfit.render.words import plan_notes, plan_reason, plan_versus


def test_grid_keeps_effective_batch_and_marks_largest(tiny_llama):
    # checkpointing fixed: every precision's group, half the simulations (the whole default
    # grid: test_plan_current.py, test_cli_current_flag_and_bad_current_in_a_file)
    job = JobSpec(model="t", seq_len=64, effective_batch=8, grad_ckpt="off")
    res = plan(job, tiny_llama, find_gpu("a100-80gb"))
    # amp-fp16 is left out on a card with bf16 (the same tensors and rate as amp-bf16), and said
    assert {r.job.precision for r in res.rows} == {"fp32", "amp-bf16", "bf16-true"}
    assert res.precisions_not_planned == ["amp-fp16"]
    assert any(n.startswith("amp-fp16 not planned: on ") for n in plan_notes(res))
    for r in res.rows:
        assert r.job.micro_batch * r.job.grad_accum == 8
    assert sorted({r.job.micro_batch for r in res.rows}) == [1, 2, 4, 8]
    rec = res.rows[res.recommended_index]
    assert rec.how == "simulated" and rec.memory.fits
    # every row has a predicted speed on a known GPU, and the pick is the fastest that fits
    assert all(r.speed is not None and r.speed.tokens_per_s > 0 for r in res.rows)
    fitting = [r for r in res.rows if r.memory.fits]
    assert rec.speed.tokens_per_s == max(r.speed.tokens_per_s for r in fitting)
    assert rec.rank == 1


def test_checkpointing_lowers_the_peak(tiny_llama):
    job = JobSpec(model="t", seq_len=128, effective_batch=4, precision="fp32")
    res = plan(job, tiny_llama, find_gpu("a100-80gb"), verify=False)
    by = {(r.job.grad_ckpt, r.job.micro_batch): r.memory.peak_allocated_bytes
          for r in res.rows}
    assert by[("full", 4)] < by[("off", 4)]


def test_nothing_fits_says_so(tiny_llama):
    job = JobSpec(model="t", seq_len=64, effective_batch=4, precision="fp32", grad_ckpt="off")
    # a known Ampere card made tiny (a generic card's worst-case Hopper workspaces would
    # change the shares below)
    import dataclasses

    res = plan(job, tiny_llama, dataclasses.replace(find_gpu("a10g"), memory_bytes=2**20))
    assert res.recommended_index is None
    assert "nothing fits" in plan_reason(res)
    # what to try: only what the smallest configuration does not use yet
    said = plan_reason(res)
    # and what cuts a tenth of its peak: the activations checkpointing frees are 6 % of it here
    # (2.4 of 37.9 MB, cuBLAS's workspaces 17), what a shorter sequence cuts 10.4 %
    assert "try --method lora/qlora, a shorter --seq-len, an 8-bit optimizer " \
        "or more ranks with --sharding fsdp" in said
    from trainfit.render.words import _what_to_try

    sharded = JobSpec(model="t", seq_len=64, method="qlora", grad_ckpt="full", ranks=2,
                      sharding="fsdp", optimizer="adamw-8bit")
    assert _what_to_try(sharded) == "a shorter --seq-len, more ranks or --offload all"
    assert "--offload optimizer" in _what_to_try(sharded.replace(
        method="lora", quant=None, sharding="zero2"))
    z3 = sharded.replace(sharding="zero3", offload="optimizer", optimizer="adamw")
    assert _what_to_try(z3).endswith("more ranks or --offload all")
    assert "--offload" not in _what_to_try(z3.replace(offload="all"))
    # what dominates the smallest row's peak is cut first: a 1B LoRA at 8,192 tokens (weights
    # 2.3 of 37 GiB) was told to try QLoRA before a shorter sequence
    from types import SimpleNamespace

    GIB = 2**30
    lora = JobSpec(model="t", seq_len=8192, method="lora", grad_ckpt="full")
    long_row = SimpleNamespace(job=lora, memory=SimpleNamespace(breakdown={
        "parameters": 2 * GIB, "optimizer": GIB // 10, "activations": 10 * GIB,
        "temporaries": 20 * GIB}, peak_phase="backward"))
    # (QLoRA's 4-bit weights would cut at most 6 % of that peak: not offered at all, nor FSDP,
    # which divides only them; the fp32 logits — the temporaries — chunked first: an audit's
    # 65,536-token Qwen LoRA was told to halve its sequence where chunks fit)
    assert _what_to_try(long_row) == "--lm-head-chunk 4096 or a shorter --seq-len"
    long_row.memory.breakdown["parameters"] = 5 * GIB
    assert _what_to_try(long_row).startswith("--lm-head-chunk 4096, a shorter --seq-len, "
                                             "--method qlora")
    assert _what_to_try(long_row).endswith("more ranks with --sharding fsdp")
    long_row.memory.breakdown["parameters"] = 40 * GIB
    assert _what_to_try(long_row).startswith("--lm-head-chunk 4096, --method qlora, "
                                             "a shorter --seq-len")
    # at an optimizer-phase peak the temporaries are the optimizer's: no chunked head (a review)
    long_row.memory.peak_phase = "optimizer"
    assert "--lm-head-chunk" not in _what_to_try(long_row)
    # a saver that cuts under a tenth of the peak is not offered: Mixtral QLoRA (16-bit
    # experts, 87 of 90 GiB) was told to try an 8-bit optimizer and a shorter sequence
    mixtral = SimpleNamespace(job=JobSpec(model="t", seq_len=1024, method="qlora",
                                          grad_ckpt="full"),
                              memory=SimpleNamespace(breakdown={
                                  "parameters": 87 * GIB, "optimizer": GIB // 20,
                                  "activations": GIB, "temporaries": GIB}))
    assert _what_to_try(mixtral) == "more ranks with --sharding fsdp"


def test_bf16_on_t4_is_refused(tiny_llama):
    with pytest.raises(JobError, match="no bf16"):
        plan(JobSpec(model="t", precision="bf16-true"), tiny_llama, find_gpu("t4"))


def test_t4_grid_has_no_bf16(tiny_llama):
    res = plan(JobSpec(model="t", seq_len=64, effective_batch=2, grad_ckpt="off"), tiny_llama,
               find_gpu("t4"), verify=False)
    assert {r.job.precision for r in res.rows} == {"fp32", "amp-fp16"}
    assert res.precisions_not_planned == []  # no bf16 here: amp-fp16 is the 16-bit choice
    from trainfit.plan.inputs import grid_precisions

    # a generic card: rates unknown, so amp-fp16 is not known to match amp-bf16: kept
    assert grid_precisions(generic_gpu(16)) == (["fp32", "amp-fp16", "amp-bf16", "bf16-true"], [])


def test_qlora_without_bitsandbytes_is_refused(tiny_llama, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(JobError, match="needs bitsandbytes"):
        plan(JobSpec(model="t", method="qlora"), tiny_llama, find_gpu("t4"))


def test_ladder_when_nothing_fits():
    """A GPU too small for a full fine-tune of GPT-2 at 1024 tokens: the ladder climbs until a rung
    fits, each rung with its predicted memory."""
    import dataclasses

    from trainfit.model.source import resolve_model

    src = resolve_model("gpt2")
    job = JobSpec(model="gpt2", seq_len=1024, micro_batch=1, grad_accum=2, precision="fp32",
                  grad_ckpt="off")
    gpu = find_gpu("a100-80gb")
    off = plan(job, src, gpu, verify=False).rows[0].memory.peak_device_bytes
    ck = plan(job.replace(grad_ckpt="full"), src, gpu, verify=False).rows[0].memory.peak_device_bytes
    assert ck < off
    # between the two: the allocator's setting (rung 1) lowers the peak (4.49 → 4.21 GiB: the
    # unused rests of the default segments) but not enough; checkpointing (rung 2) makes it fit
    grown = job.replace(expandable_segments=True)
    offx = plan(grown, src, gpu, verify=False).rows[0].memory.peak_device_bytes
    ckx = plan(grown.replace(grad_ckpt="full"), src, gpu, verify=False).rows[0].memory
    small = dataclasses.replace(gpu, memory_bytes=int((off + ck) / 2 / 0.9))
    res = plan(job, src, small, verify=False)
    assert res.recommended_index is None
    assert [r.change.split("=")[0] for r in res.ladder][:1] == ["PYTORCH_CUDA_ALLOC_CONF"]
    assert [r.peak_device_bytes for r in res.ladder] == [offx, ckx.peak_device_bytes]
    assert [r.fits for r in res.ladder] == [False, True]
    assert res.ladder[1].change.startswith("gradient checkpointing")
    assert not any(r.alters_learning for r in res.ladder)
    assert ckx.peak_allocated_bytes <= ckx.peak_reserved_bytes < ck  # pages over the live blocks
    assert "the memory-saving ladder reaches a fit" in plan_reason(res)
    d = res.to_dict()
    assert d["ladder"][-1]["fits"] is True and "alters_learning" in d["ladder"][0]


def test_dataset_time_and_epochs_error(tiny_llama, monkeypatch):
    job = JobSpec(model="tiny-llama", seq_len=128, micro_batch=2, grad_accum=2, precision="amp-bf16",
                  grad_ckpt="off")
    res = plan(job, tiny_llama, find_gpu("a100-80gb"), dataset_tokens=1_000_000, epochs=2)
    c = res.to_dict()["configs"][0]
    assert c["time_for_dataset_s"] == pytest.approx(2_000_000 / c["tokens_per_s"])
    # said in a unit it does not round to nothing (an audit: 17 s printed "0.00 h")
    import io

    from rich.console import Console

    import trainfit.render.plan as render
    from trainfit.monitor.progress import duration_words

    buf = io.StringIO()
    monkeypatch.setattr(render, "_console", lambda: Console(file=buf, width=400))
    render.render_plan(res)
    printed = buf.getvalue()
    pick = res.rows[res.recommended_index]
    t = res.time_for_dataset_s({"tokens_per_s": pick.speed.tokens_per_s})
    assert t < 3600 and f"tokens: {duration_words(t)} (predicted)" in printed
    assert "0.00 h" not in printed
    with pytest.raises(JobError, match="needs the dataset size"):
        plan(job, tiny_llama, find_gpu("a100-80gb"), epochs=2)


def test_an_unknown_speed_up_says_why(tiny_llama):
    """Seed 002 (two GeForce cards) printed 'no known peak for this GPU' though the peak is known:
    the unknown is the link (no peer-to-peer), and the sentence names it."""
    res = plan(JobSpec(model="t", seq_len=64, effective_batch=8, precision="amp-bf16", ranks=2,
                       grad_ckpt="off"), tiny_llama, find_gpu("3090"),
               current=JobSpec(model="t", seq_len=64, micro_batch=1, grad_accum=4, ranks=2,
                               precision="amp-bf16", grad_ckpt="off"))
    assert res.speedup_vs_current is None
    words = plan_versus(res)
    assert "speed-up unknown" in words and "peer-to-peer" in words
    assert "no known peak" not in words
    # the table's legend said the same wrong thing (a 70B QLoRA over two RTX 4090s, 2026-11-30)
    from io import StringIO

    from rich.console import Console

    from trainfit.render.plan import _legend

    out = StringIO()
    _legend(Console(file=out, width=400), res, [], False)
    assert "tokens/s and MFU: unknown (2 ranks but" in out.getvalue()
    assert "peer-to-peer" in out.getvalue() and "no known peak" not in out.getvalue()
    # --json carries each row's reason
    assert all("peer-to-peer" in c["speed_unknown_reason"] for c in res.to_dict()["configs"])


def test_a_row_without_speed_among_rows_with_one_says_why(tiny_llama):
    """Seed 000's quickstart printed 'unknown' on one row (the allocator retrying at the T4's
    limit) with no word of why, since other rows had a speed: the legend names the row and the
    reason."""
    import dataclasses
    from io import StringIO

    from rich.console import Console

    from trainfit.render.plan import _legend
    from trainfit.speed.predict import unknown_speed

    res = plan(JobSpec(model="t", seq_len=64, effective_batch=4, precision="amp-bf16",
                       grad_ckpt="off"), tiny_llama, find_gpu("a10g"))
    assert all(r.speed is not None and r.speed.tokens_per_s for r in res.rows)
    out = StringIO()
    _legend(Console(file=out, width=400), res, [], True)
    assert "tokens/s unknown" not in out.getvalue()
    row = res.rows[0]
    res.rows[0] = dataclasses.replace(row, speed=unknown_speed(1.0, "the allocator retries"))
    out = StringIO()
    _legend(Console(file=out, width=400), res, [], True)
    j = row.job
    assert (f"tokens/s unknown on {j.precision} {j.grad_ckpt} {j.micro_batch}×{j.grad_accum}: "
            "the allocator retries") in out.getvalue()
    # a row over the card keeps its speed, for comparing rows, said as such (an audit read it as
    # a speed it would reach, beside the "unknown" of a row at the card's limit)
    assert "a row that does not fit" not in out.getvalue()
    big = res.rows[-1]
    res.rows[-1] = dataclasses.replace(big, memory=dataclasses.replace(big.memory, fits=False))
    out = StringIO()
    _legend(Console(file=out, width=400), res, [], True)
    assert "tokens/s of a row that does not fit: its step as if the GPU had room" \
        in out.getvalue()


def test_the_json_speed_fields_have_one_shape_with_or_without_a_gpu(tiny_llama):
    """An audit: without a GPU ``bound`` was null where a card without a known peak said
    "unknown"; ``speed_unknown_reason`` and ``sync_note`` were "" on one row and null on
    another for the same nothing."""
    from trainfit.plan.result import NO_GPU_SPEED

    job = JobSpec(model="t", seq_len=64, effective_batch=4, precision="amp-bf16", grad_ckpt="off")
    none = plan(job, tiny_llama, None, verify=False).to_dict()["configs"]
    assert none and all((c["bound"], c["speed_unknown_reason"], c["sync_note"], c["tokens_per_s"])
                        == ("unknown", NO_GPU_SPEED, None, None) for c in none)
    known = plan(job, tiny_llama, find_gpu("a10g"), verify=False).to_dict()["configs"]
    assert all(c["tokens_per_s"] > 0 and c["speed_unknown_reason"] is None
               and c["sync_note"] is None and c["bound"] != "unknown" for c in known)


def test_amp_fp16_left_out_on_bf16_cards_is_amp_bf16s_twin(tiny_llama):
    """Why the grid may leave amp-fp16 out on a card with bf16 (plan.inputs.grid_precisions):
    planned on its own it comes out as amp-bf16 does but for its GradScaler — peaks above by
    the scaler's scalars alone (a few 512-byte blocks), and fewer tokens/s (its unscale reads
    and writes every gradient): never a row amp-bf16 would not beat."""
    got = {}
    for p in ("amp-fp16", "amp-bf16"):
        res = plan(JobSpec(model="t", seq_len=64, micro_batch=4, grad_accum=2, precision=p,
                           grad_ckpt="off"), tiny_llama, find_gpu("a100-80gb"), ladder=False)
        assert res.precisions_not_planned == []  # fixed by the user: planned, nothing left out
        row = res.rows[0]
        got[p] = (row.memory.peak_allocated_bytes, row.memory.peak_reserved_bytes,
                  row.memory.peak_device_bytes, row.speed.tokens_per_s)
    fp16, bf16 = got["amp-fp16"], got["amp-bf16"]
    assert 0 < fp16[0] - bf16[0] <= 8 * 512, got  # allocated
    # reserved and device: at most one more 2 MiB segment of the small pool
    assert all(0 <= a - b <= 2 << 20 for a, b in zip(fp16[1:3], bf16[1:3], strict=True)), got
    assert fp16[3] < bf16[3]


def test_a_multi_rank_plans_tokens_per_second_say_they_are_all_ranks_together(tiny_llama):
    from rich.console import Console

    from trainfit.render.plan import plan_table

    job = JobSpec(model="t", seq_len=64, micro_batch=2, grad_accum=1, precision="amp-bf16",
                  grad_ckpt="off", ranks=2)
    res = plan(job, tiny_llama, find_gpu("a100-80gb"), verify=False)
    pick = res.rows[res.recommended_index]
    assert pick.speed.step_time_s == pytest.approx(2 * 2 * 64 / pick.speed.tokens_per_s)
    assert f"(2 ranks together: {pick.speed.tokens_per_s / 2:,.0f} per GPU)" in plan_reason(res)
    con = Console(record=True, width=200)
    plan_table(con, res)
    assert "tokens/s of the 2 ranks together," in con.export_text()  # the title wraps


def test_under_zero_bf16_true_is_amp_bf16_and_planned_once(tiny_llama):
    """An audit: under --sharding zero2/zero3 the bf16-true group was an exact copy of amp-bf16's
    (DeepSpeed's one bf16 mode, an fp32 master partition either way), unsaid."""
    from trainfit.render.words import plan_notes

    job = JobSpec(model="t", seq_len=64, micro_batch=2, grad_ckpt="off", ranks=2,
                  sharding="zero2")
    res = plan(job, tiny_llama, find_gpu("a100-80gb-sxm"), verify=False, ladder=False)
    assert {r.job.precision for r in res.rows} == {"fp32", "amp-bf16"}
    assert "bf16-true" in res.precisions_not_planned
    assert any(n.startswith("bf16-true not planned: DeepSpeed's bf16 mode") for n in
               plan_notes(res))
    # a current bf16-true configuration is its amp-bf16 row (a review: hidden, and the pick
    # offered "bf16-true → amp-bf16" as a change)
    cur = plan(job, tiny_llama, find_gpu("a100-80gb-sxm"), verify=False, ladder=False,
               current=job.replace(precision="bf16-true"))
    assert cur.current.job.precision == "amp-bf16"
    assert not any(c.field == "precision" and c.before == "bf16-true"
                   for c in cur.changes_vs_current)
    fsdp = plan(job.replace(sharding="fsdp"), tiny_llama, find_gpu("a100-80gb-sxm"), verify=False,
                ladder=False)
    assert "bf16-true" in {r.job.precision for r in fsdp.rows}


def test_a_largest_fitting_rows_expandable_reserve_is_its_full_size_simulations():
    """An extrapolated ▲ row states the reserve with expandable segments, replayed from its
    full-depth trace, as its full-size simulation does (an audit: only full-size rows had it)."""
    from transformers import LlamaConfig

    from trainfit.memory.predict import predict_memory
    from trainfit.model.source import ModelSource

    cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                      max_position_embeddings=512)
    src = ModelSource("mid-llama", cfg, "causal-lm", "local")
    gpu = find_gpu("generic-4gb")
    res = plan(JobSpec(model="mid-llama", seq_len=256, precision="amp-bf16", grad_ckpt="off",
                       method="full"), src, gpu, verify=False)
    top = [r for r in res.rows if r.largest_fitting]
    assert len(top) == 1 and top[0].how == "extrapolated" and top[0].job.micro_batch == 8
    assert all(r.memory.reserved_expandable_bytes is None for r in res.rows
               if not r.largest_fitting)
    exact = predict_memory(top[0].job, src, gpu)
    got = top[0].memory.reserved_expandable_bytes
    assert got == pytest.approx(exact.reserved_expandable_bytes, rel=0.01)
    # below the default allocator's reserve, never below the live bytes
    assert top[0].memory.peak_allocated_bytes <= got <= top[0].memory.peak_reserved_bytes


def test_a_padding_free_plan_holds_the_mask_and_times_attention_over_the_packed_row(tiny_llama):
    """--padding-free (TRL's packing): each micro-batch one row of micro × seq positions with its
    (1, 1, N, N) mask — every row holds more than the same row unpacked, the excess grows faster
    than the micro-batch, attention over N × N (no causal skip, no flash kernel with a mask)
    makes the step slower, and the plan says so."""
    job = JobSpec(model="t", seq_len=128, effective_batch=8, precision="amp-bf16",
                  grad_ckpt="off")
    gpu = find_gpu("a100-80gb")
    packed = plan(job.replace(padding_free=True), tiny_llama, gpu, verify=False)
    rows = plan(job, tiny_llama, gpu, verify=False)

    def by(res):
        return {r.job.micro_batch: r for r in res.rows}

    p, u = by(packed), by(rows)
    excess = {m: p[m].memory.peak_allocated_bytes - u[m].memory.peak_allocated_bytes
              for m in (1, 2, 4, 8)}
    # micro-batch 1: one sequence, for which transformers builds no mask (a review: it was
    # simulated with one, 11.6 % over the CPU run)
    assert excess[1] == 0 and all(excess[m] > 0 for m in (2, 4, 8)), excess
    assert excess[8] > 2 * excess[4] > 0
    assert p[8].speed.step_time_s > u[8].speed.step_time_s
    assert all(r.job.padding_free for r in packed.rows)
    pick = packed.rows[packed.recommended_index]
    n = pick.job.micro_batch * 128
    assert any(x.startswith(f"padding-free: each micro-batch simulated as one row of {n:,} "
                            "positions") for x in pick.memory.model_notes), pick.memory.model_notes


def test_the_offload_rung_of_a_zero_sgd_job_takes_deepspeeds_adam_without_sgds_momentum():
    """Under ZeRO the CPU-offload rung steps DeepSpeed's CPU Adam: SGD's momentum goes with SGD
    (JobSpec refuses it on another optimizer, which had left the rung out unsaid)."""
    from trainfit.plan.ladder import _steps

    job = JobSpec(model="t", optimizer="sgd", sgd_momentum=0.0, sharding="zero2", ranks=2,
                  precision="amp-bf16", micro_batch=1, grad_accum=1)
    offload = [f for change, f, _ in _steps(job) if change.startswith("CPU offload")]
    assert len(offload) == 1
    rung = JobSpec(**{**job.to_dict(), **offload[0]})
    assert (rung.optimizer, rung.offload, rung.sgd_momentum) == ("adamw", "optimizer", 0.9)
    with pytest.raises(JobError, match="--sgd-momentum given with --optimizer adamw"):
        job.replace(optimizer="adamw")
