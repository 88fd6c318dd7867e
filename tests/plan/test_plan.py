"""plan over a grid: micro-batches keep the effective batch, fit decisions follow memory."""

import pytest

from trainfit.hardware.gpus import find_gpu, generic_gpu
from trainfit.job import JobError, JobSpec
from trainfit.plan.grid import plan
from trainfit.render.words import plan_notes, plan_reason, plan_versus


def test_grid_keeps_effective_batch_and_marks_largest(tiny_llama):
    # checkpointing fixed: every precision's group, half the simulations (the whole default
    # grid: test_cli_current_flag_and_bad_current_in_a_file)
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


def test_the_pick_is_stated_against_the_current_configuration(tiny_llama):
    gpu = find_gpu("a10g")
    base = JobSpec(model="t", seq_len=64, effective_batch=8, precision="amp-bf16")
    cur = JobSpec(model="t", seq_len=64, micro_batch=1, grad_accum=8, grad_ckpt="full",
                  precision="amp-bf16")
    res = plan(base, tiny_llama, gpu, current=cur)
    pick = res.rows[res.recommended_index]
    assert res.current is not None and res.current.how == "simulated"
    assert res.current.job.micro_batch == 1 and res.current.job.grad_ckpt == "full"
    assert res.speedup_vs_current == pytest.approx(
        pick.speed.tokens_per_s / res.current.speed.tokens_per_s)
    assert res.speedup_vs_current > 1.0  # checkpointing off and a bigger micro-batch
    assert f"micro-batch 1→{pick.job.micro_batch}" in plan_versus(res)
    assert "checkpointing full→off" in plan_versus(res) and "× tokens/s" in plan_versus(res)
    assert "effective batch" not in plan_versus(res)  # both 8: not a change
    d = res.to_dict()
    assert d["current"]["tokens_per_s"] == pytest.approx(res.current.speed.tokens_per_s)


def test_a_current_micro_batch_the_grid_does_not_show_is_a_row_and_can_be_the_pick(tiny_llama):
    """A review: --current at micro-batch 3 × 4 (effective 12) was simulated but had no row (the
    grid shows powers of two and ▲), so the pick, 4 × 3, was called the fastest that fits while
    predicted slower than the current run. The current configuration now joins its group: shown,
    ranked, a candidate for the pick; ▲ stays on each group's largest fitting micro-batch."""
    gpu = find_gpu("a10g")
    base = JobSpec(model="t", seq_len=64, effective_batch=12, precision="amp-bf16",
                   grad_ckpt="off")
    cur = JobSpec(model="t", seq_len=64, micro_batch=3, grad_accum=4, grad_ckpt="off",
                  precision="amp-bf16")
    res = plan(base, tiny_llama, gpu, current=cur)
    threes = [r for r in res.rows if r.job.micro_batch == 3]
    assert len(threes) == 1 and threes[0].how == "simulated" and threes[0].shown
    assert threes[0].memory.peak_device_bytes == res.current.memory.peak_device_bytes
    assert [r.job.micro_batch for r in res.rows] == sorted(r.job.micro_batch for r in res.rows)
    fitting = [r for r in res.rows if r.memory.fits]
    pick = res.rows[res.recommended_index]
    assert pick.speed.tokens_per_s == max(r.speed.tokens_per_s for r in fitting)
    assert [r.job.micro_batch for r in res.rows if r.largest_fitting] == \
        [max(r.job.micro_batch for r in fitting)]
    assert threes[0].rank == sorted(fitting, key=lambda r: -r.speed.tokens_per_s).index(
        threes[0]) + 1
    if pick is threes[0]:
        assert res.speedup_vs_current == pytest.approx(1.0) and not res.changes_vs_current


def _row(micro, fits, marked=False, ckpt="off", effective=12, **fields):
    from types import SimpleNamespace

    from trainfit.plan.result import PlanRow

    job = JobSpec(model="t", seq_len=64, micro_batch=micro, grad_accum=effective // micro,
                  precision="amp-bf16", grad_ckpt=ckpt, **fields)
    return PlanRow(job, SimpleNamespace(fits=fits), "extrapolated", largest_fitting=marked)


def test_the_largest_fitting_mark_follows_full_size_simulations():
    """▲ moves to a larger micro-batch of its group that a full-size simulation found to fit
    (the current configuration's row), and off a row that does not fit."""
    from trainfit.plan.rows import mark_largest_fitting

    rows = [_row(1, True), _row(2, True, marked=True), _row(3, True), _row(4, False),
            _row(1, True, ckpt="full"), _row(2, False, marked=True, ckpt="full"),
            _row(4, False, ckpt="full", optimizer="sgd")]
    mark_largest_fitting(rows)
    assert [(r.job.micro_batch, r.job.grad_ckpt) for r in rows if r.largest_fitting] == \
        [(3, "off"), (1, "full")]


def test_a_dropped_mark_goes_to_the_candidate_below_not_to_the_power_of_two():
    """A review: the pick's full-size simulation took ▲ off 18 of 36 and the mark fell to 4 (the
    largest row shown) while 12, 9 and 6 were predicted to fit; the candidate below, 12, is made
    a row of its group and takes it. Where the candidate below is shown (4 below 6 of 12), that
    row takes it."""
    from trainfit.plan.grid import _Grid

    made = []

    def grid_of(micro_all):
        g = _Grid(JobSpec(model="t", seq_len=64, effective_batch=36), None, None, 0.1, None,
                  ["amp-bf16"], ["off"], micro_all)
        g._groups[("amp-bf16", "off")] = (None, {})
        g.extrapolated_row = lambda p, c, m: made.append(m) or _row(m, True, effective=36)
        return g

    rows = [_row(m, True, effective=36) for m in (1, 2, 4)] + [
        _row(m, False, effective=36) for m in (18, 36)]
    grid_of([1, 2, 3, 4, 6, 9, 12, 18, 36]).mark_below(rows, rows[3])
    assert made == [12]
    assert [(r.job.micro_batch, r.largest_fitting) for r in rows] == [
        (1, False), (2, False), (4, False), (12, True), (18, False), (36, False)]
    rows = [_row(m, True) for m in (1, 2, 4)] + [_row(6, False), _row(12, False)]
    grid_of([1, 2, 3, 4, 6, 12]).mark_below(rows, rows[3])
    assert made == [12] and [r.job.micro_batch for r in rows if r.largest_fitting] == [4]
    # the candidate below is shown and does not fit (the current run's simulation): passed over
    rows = [_row(m, True) for m in (1, 2)] + [_row(4, False), _row(6, False), _row(12, False)]
    grid_of([1, 2, 3, 4, 6, 12]).mark_below(rows, rows[3])
    assert made == [12, 3]
    assert [(r.job.micro_batch, r.largest_fitting) for r in rows] == [
        (1, False), (2, False), (3, True), (4, False), (6, False), (12, False)]


def test_a_current_run_that_differs_in_more_than_the_split_is_no_grid_row():
    """A review: a current run with activation offload (a field outside the few the rows
    compared) took the place of a grid row of the same split, and joined the grid at another;
    now every field but the split must match."""
    from trainfit.plan.rows import add_current_row, take_exact_row

    rows = [_row(m, True) for m in (1, 2, 4)]
    offload = _row(3, True, activation_offload=True)
    offload.how = "simulated"
    add_current_row(rows, offload)
    assert [r.job.micro_batch for r in rows] == [1, 2, 4]
    same_split = _row(2, True, activation_offload=True)
    same_split.how = "simulated"
    take_exact_row(rows, same_split)
    assert all(r.how == "extrapolated" for r in rows)
    plain = _row(3, True)
    plain.how = "simulated"
    add_current_row(rows, plain)
    assert [(r.job.micro_batch, r.how) for r in rows] == [
        (1, "extrapolated"), (2, "extrapolated"), (3, "simulated"), (4, "extrapolated")]


def test_a_fixed_micro_batch_keeps_the_current_split_out_of_the_grid(tiny_llama):
    """A review: a job file fixing micro-batch 1 × 12 with a current 3 × 4 got the current split
    as its pick; with the micro-batch fixed the current run is compared against, not planned."""
    base = JobSpec(model="t", seq_len=64, micro_batch=1, grad_accum=12, grad_ckpt="off")
    cur = JobSpec(model="t", seq_len=64, micro_batch=3, grad_accum=4, grad_ckpt="off",
                  precision="amp-bf16")
    res = plan(base, tiny_llama, find_gpu("a10g"), current=cur)
    assert {r.job.micro_batch for r in res.rows} == {1}
    assert res.rows[res.recommended_index].job.micro_batch == 1
    assert any(c.field == "micro_batch" for c in res.changes_vs_current)


def test_a_different_effective_batch_is_said(tiny_llama):
    """Seeds 002/003 compared a current configuration of another effective batch (16 → 64,
    120 → 128) without saying so: the change is named."""
    res = plan(JobSpec(model="t", seq_len=64, effective_batch=8, precision="amp-bf16",
                       grad_ckpt="off"), tiny_llama,
               find_gpu("a10g"), current=JobSpec(model="t", seq_len=64, micro_batch=1, grad_accum=4,
                                                 precision="amp-bf16", grad_ckpt="off"))
    assert any(c.field == "effective_batch" and (c.before, c.after) == (4, 8)
               for c in res.changes_vs_current)
    assert "effective batch 4→8" in plan_versus(res)


def test_cli_current_with_another_effective_batch_plans_the_grid_at_it(tiny_config_json,
                                                                         monkeypatch):
    """--current --micro-batch 4 --grad-accum 2 --effective-batch 16: the current run is 4 × 2
    (8), the grid keeps 16 — as a job file's current: block does (the flags were refused: a QA
    run)."""
    from typer.testing import CliRunner

    import trainfit.plan.grid as grid
    from trainfit.cli.main import app
    from trainfit.job import JobError

    seen = {}

    def fake_plan(job, source, spec, **kw):
        seen.update(grid=job, current=kw["current"])
        raise JobError("stop here", "test")
    monkeypatch.setattr(grid, "plan", fake_plan)
    r = CliRunner().invoke(app, ["plan", str(tiny_config_json), "--gpu", "a10g", "--seq-len", "64",
                                 "--micro-batch", "4", "--grad-accum", "2", "--precision", "fp32",
                                 "--current", "--effective-batch", "16"])
    assert "stop here" in r.output, r.output
    assert seen["grid"].effective_batch == 16 and seen["grid"].micro_batch is None
    cur = seen["current"]
    assert (cur.micro_batch, cur.grad_accum, cur.effective_batch) == (4, 2, 8)
    # the micro-batch alone with the effective batch: the grid is still every micro-batch (a
    # derived accumulation carried into it fixed one: a review)
    r = CliRunner().invoke(app, ["plan", str(tiny_config_json), "--gpu", "a10g", "--seq-len", "64",
                                 "--micro-batch", "4", "--precision", "fp32", "--current",
                                 "--effective-batch", "64"])
    assert "stop here" in r.output, r.output
    assert seen["grid"].micro_batch is None and seen["grid"].effective_batch == 64
    assert (seen["current"].micro_batch, seen["current"].grad_accum) == (4, 16)
    # --max-grad-norm none is a value, not a field left out: the grid does not clip either (a
    # review: it clipped at the default 1.0, and the current run matched none of its rows)
    r = CliRunner().invoke(app, ["plan", str(tiny_config_json), "--gpu", "a10g", "--seq-len", "64",
                                 "--micro-batch", "3", "--grad-accum", "4", "--precision", "fp32",
                                 "--current", "--max-grad-norm", "none"])
    assert "stop here" in r.output, r.output
    assert seen["grid"].max_grad_norm is None and seen["current"].max_grad_norm is None
    assert seen["grid"].effective_batch == 12


def test_cli_current_flag_and_bad_current_in_a_file(tiny_config_json, tmp_path):
    import json

    from typer.testing import CliRunner

    from trainfit.cli.main import app

    # --current plans the whole grid around the knobs given (32 simulations): at 2 layers
    two = tmp_path / "two" / "config.json"
    two.parent.mkdir()
    two.write_text(json.dumps({**json.loads(tiny_config_json.read_text()),
                               "num_hidden_layers": 2}))
    r = CliRunner().invoke(app, ["plan", str(two), "--gpu", "a10g", "--seq-len", "64",
                                 "--micro-batch", "2", "--grad-accum", "4", "--grad-ckpt", "full",
                                 "--precision", "amp-bf16", "--current", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["current"]["micro_batch"], d["current"]["grad_accum"]) == (2, 4)
    # the table's row of the current configuration is its full-size simulation: one number
    same = [c for c in d["configs"] if (c["precision"], c["grad_ckpt"], c["micro_batch"],
                                        c["grad_accum"]) == ("amp-bf16", "full", 2, 4)]
    assert len(same) == 1 and same[0]["how"] == "simulated"
    assert same[0]["peak_device_bytes"] == d["current"]["peak_device_bytes"]
    # without the knobs of the current run there is no baseline: refused, not made up
    bare = CliRunner().invoke(app, ["plan", str(two), "--gpu", "a10g", "--seq-len", "64",
                                    "--effective-batch", "8", "--current"])
    assert bare.exit_code == 2
    assert "--current: the configuration you run now needs --micro-batch and --precision" \
        in bare.output
    assert len(d["configs"]) > 1  # the grid around it, not just the one configuration
    # the whole default grid: every precision of the A10G with checkpointing off and on
    assert {(c["precision"], c["grad_ckpt"]) for c in d["configs"]} == {
        (p, c) for p in ("fp32", "amp-bf16", "bf16-true") for c in ("off", "full")}
    assert all(c["micro_batch"] * c["grad_accum"] == 8 for c in d["configs"])
    assert d["speedup_vs_current"] >= 0.99
    # simulated rows and ▲ ones state the expandable allocator's reserve, other rows null
    exact = [c for c in d["configs"] if c["how"] == "simulated" or c["largest_fitting"]]
    assert exact and all(c["reserved_expandable_bytes"] >= c["peak_allocated_bytes"]
                         for c in exact)
    assert all(c["reserved_expandable_bytes"] is None for c in d["configs"]
               if c["how"] != "simulated" and not c["largest_fitting"])
    bad = tmp_path / "job.yaml"
    bad.write_text(f"model: {tiny_config_json}\nseq_len: 64\neffective_batch: 8\ngpu: a10g\n"
                   "current: 4\n")
    r = CliRunner().invoke(app, ["plan", str(bad)])
    assert r.exit_code == 2 and "`current` must be a mapping" in r.output


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
    planned on its own it comes out as amp-bf16 does — the same peaks to the byte, the same
    tokens/s."""
    got = {}
    for p in ("amp-fp16", "amp-bf16"):
        res = plan(JobSpec(model="t", seq_len=64, micro_batch=4, grad_accum=2, precision=p,
                           grad_ckpt="off"), tiny_llama, find_gpu("a100-80gb"), ladder=False)
        assert res.precisions_not_planned == []  # fixed by the user: planned, nothing left out
        row = res.rows[0]
        got[p] = (row.memory.peak_allocated_bytes, row.memory.peak_reserved_bytes,
                  row.memory.peak_device_bytes, row.speed.tokens_per_s)
    assert got["amp-fp16"] == got["amp-bf16"]


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
