"""plan with the configuration the user runs now (``current``, ``--current``): its row among the
grid's, the pick stated against it, and the ▲ mark through the full-size simulations that
replace or join the grid's rows (trainfit.plan.rows, trainfit.plan.grid)."""

import pytest

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec
from trainfit.plan.grid import plan
from trainfit.render.words import plan_versus


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
