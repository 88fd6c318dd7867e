"""At the card's limit the caching allocator releases its cache and retries: a step whose
unbounded reserve passes the card still runs when its allocated bytes fit, at a cost."""

from __future__ import annotations

import dataclasses

import pytest

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec
from trainfit.memory.predict import predict_memory
from trainfit.plan.row_speed import synced
from trainfit.speed.predict import SpeedPrediction

JOB = JobSpec(model="t", seq_len=256, micro_batch=48, precision="bf16-true", grad_ckpt="full")


def _card(room_bytes: int):
    gpu = find_gpu("a10g")
    return dataclasses.replace(gpu, memory_bytes=gpu.cuda_context_bytes + room_bytes)


def test_reserved_is_held_at_the_card_with_retries_counted(tiny_llama):
    roomy = predict_memory(JOB, tiny_llama, find_gpu("a10g"))
    assert roomy.alloc_retries == 0
    gap = roomy.peak_reserved_bytes - roomy.peak_allocated_bytes
    assert gap > 20 * 2**20  # whole cached segments the allocator can hand back
    card = _card(roomy.peak_allocated_bytes + int(gap * 0.6))
    tight = predict_memory(JOB, tiny_llama, card)
    assert tight.alloc_retries >= 1
    assert tight.peak_allocated_bytes == roomy.peak_allocated_bytes
    assert tight.peak_allocated_bytes <= tight.peak_reserved_bytes < roomy.peak_reserved_bytes
    assert tight.peak_device_bytes <= card.memory_bytes
    assert any("num_alloc_retries" in n for n in tight.model_notes)
    # no margin left: not fitting, judged on the reserve the step asks for (an audit: such a row
    # fitted a card and not one 1 GiB larger, where the step's own reserve stood); the table
    # says "limit", not a bare "no" beside a device peak under its fit line
    assert tight.fits is False and roomy.fits is True
    gpu = find_gpu("a10g")
    asked = roomy.peak_reserved_bytes + gpu.cuda_context_bytes
    assert tight.headroom_bytes == int(card.memory_bytes * 0.9) - asked
    assert any("judged on the reserve the step asks for" in n for n in tight.model_notes)
    from trainfit.plan.result import PlanRow
    from trainfit.render.plan import _row_cells

    row = PlanRow(job=JOB, memory=tight, speed=None, how="simulated")
    assert _row_cells(row)[7] == "limit"
    # the speed of such a step is not predicted: each release synchronizes the GPU
    fast = SpeedPrediction(step_time_s=1.0, tokens_per_s=1e4, samples_per_s=1.0, mfu=0.3,
                           hfu=0.3, device_busy_fraction=0.9, bound="compute-bound",
                           model_flops_per_token=1.0)
    sp = synced(fast, JOB, tight, card)
    assert sp.tokens_per_s is None and "num_alloc_retries" in sp.unknown_reason
    assert synced(fast, JOB, roomy, find_gpu("a10g")).tokens_per_s == 1e4


def test_a_card_the_live_bytes_do_not_fit_stays_out_of_memory(tiny_llama):
    roomy = predict_memory(JOB, tiny_llama, find_gpu("a10g"))
    card = _card(roomy.peak_allocated_bytes - 2**20)
    tight = predict_memory(JOB, tiny_llama, card)
    assert tight.alloc_retries == 0 and tight.fits is False
    assert tight.peak_reserved_bytes == roomy.peak_reserved_bytes  # what the step would need


def test_a_replay_that_runs_out_while_the_live_bytes_fit_says_so(tiny_llama):
    """Room for the live bytes but not for the fragments the replay leaves: the reserve the
    step asks for stands (not fitting), and the note says why and what measures it."""
    roomy = predict_memory(JOB, tiny_llama, find_gpu("a10g"))
    gap = roomy.peak_reserved_bytes - roomy.peak_allocated_bytes
    # where between the allocated peak and the reserve the replay runs out is the order's
    # doing (not monotonic): the first of a few capacities just above the allocated peak
    tight = next(t for f in (20, 10, 5) if (t := predict_memory(
        JOB, tiny_llama, _card(roomy.peak_allocated_bytes + gap // f))).alloc_retries == 0)
    assert tight.fits is False
    assert tight.peak_reserved_bytes == roomy.peak_reserved_bytes
    note = next(n for n in tight.model_notes if n.startswith("at the card's limit"))
    assert "runs out even after releasing its cache" in note and "trainfit tune" in note
    assert "expandable_segments:True" in note  # the setting that returns split segments' pages


def test_plan_json_rows_carry_the_retries(tiny_llama):
    from trainfit.plan.grid import plan

    res = plan(JobSpec(model="t", seq_len=64, effective_batch=4, precision="amp-bf16",
                       grad_ckpt="off"), tiny_llama, find_gpu("a10g"), verify=False, ladder=False)
    configs = res.to_dict()["configs"]
    assert configs and all(c["alloc_retries"] == 0 for c in configs)  # room on an A10G


def test_the_run_out_note_gives_the_expandable_allocators_verdict_and_the_flag_predicts_it(
        tiny_llama):
    """Where the default allocator runs out on fragments, the note replays the same trace with
    expandable segments; a job with ``expandable_segments`` is predicted by that replay."""
    roomy = predict_memory(JOB, tiny_llama, find_gpu("a10g"))
    gap = roomy.peak_reserved_bytes - roomy.peak_allocated_bytes
    card, tight = next((c, t) for f in (20, 10, 5) if (t := predict_memory(
        JOB, tiny_llama, c := _card(roomy.peak_allocated_bytes + gap // f))).alloc_retries == 0)
    note = next(n for n in tight.model_notes if n.startswith("at the card's limit"))
    grown = predict_memory(JOB.replace(expandable_segments=True), tiny_llama, card)
    # every block split to its own size (should_split: a rest ≥ 512 B in both pools), where the
    # default keeps a large block's rest ≤ 1 MiB in it
    assert 0 <= roomy.peak_allocated_bytes - grown.peak_allocated_bytes <= 2**20
    if "replayed so, it runs out too" in note:
        assert grown.fits is False
    else:
        said = float(note.split("replayed so, the step runs, reserving ")[1].split(" GiB")[0])
        assert grown.peak_reserved_bytes / 2**30 == pytest.approx(said, abs=0.006)
        assert grown.peak_reserved_bytes <= card.memory_bytes - card.cuda_context_bytes
    # with room, the expandable allocator's reserve: pages of 20 MiB over what the step holds
    free = predict_memory(JOB.replace(expandable_segments=True), tiny_llama, find_gpu("a10g"))
    assert grown.peak_allocated_bytes <= free.peak_reserved_bytes < roomy.peak_reserved_bytes


def test_a_segment_pinned_by_a_small_tensor_runs_out_by_default_and_runs_with_expandable():
    """60 MiB freed, 2 MiB placed in its front, then 70 MiB, on 100 MiB of room: the default
    allocator needs a new 70 MiB segment and cannot return the split 60 (out of memory); with
    expandable segments the free 58 MiB at the end grows by one 20 MiB page (80 reserved)."""
    from trainfit.memory.card_limit import at_card_limit

    mib = 2**20
    trace = ([(1, 60 * mib), (1, -60 * mib), (2, 2 * mib), (3, 70 * mib)], {})
    reserved, retries, note = at_card_limit(trace, 100 * mib, 72 * mib, 72 * mib, 130 * mib)
    assert (reserved, retries) == (130 * mib, 0)  # what the step asks for: not fitting
    assert "replayed so, the step runs, reserving 0.08 GiB (predicted, 0 release(s)" in note
    # a job with expandable segments: the same replay made its reserve, 80 — room enough
    got = at_card_limit(trace, 100 * mib, 72 * mib, 72 * mib, 80 * mib,
                         expandable=True)
    assert got == (80 * mib, 0, "")


def test_a_default_plan_gives_the_expandable_reserve_a_plan_with_the_setting_predicts(
        tiny_llama, monkeypatch):
    """The reserve a default-segment plan states for expandable segments is the reserve a plan
    made with the setting predicts for the same step (the same trace, the same composition)."""
    default = predict_memory(JOB, tiny_llama, find_gpu("a10g"))
    grown = predict_memory(JOB.replace(expandable_segments=True), tiny_llama, find_gpu("a10g"))
    assert default.alloc_retries == 0 and grown.reserved_expandable_bytes is None
    assert default.reserved_expandable_bytes == grown.peak_reserved_bytes
    assert default.peak_allocated_bytes <= default.reserved_expandable_bytes
    # the note appears only where the saving is one the GPU check could tell apart: not this
    # tiny step's few MiB, unless the thresholds are lowered to it
    import trainfit.memory.expandable as expandable

    saved = default.peak_reserved_bytes - default.reserved_expandable_bytes
    assert 0 < saved < expandable.SAVING_NOTE_MIN_BYTES

    def noted(m) -> bool:
        return any("expandable_segments:True (--expandable-segments) the step would reserve" in n
                   for n in m.model_notes)

    assert not noted(default)
    monkeypatch.setattr(expandable, "SAVING_NOTE_MIN_BYTES", saved)
    monkeypatch.setattr(expandable, "SAVING_NOTE_MIN_FRACTION", 0.0)
    assert noted(predict_memory(JOB, tiny_llama, find_gpu("a10g")))
    # a card the live bytes alone pass: no allocator setting helps, none is named
    small = predict_memory(JOB, tiny_llama, _card(default.peak_allocated_bytes - 2**20))
    assert small.reserved_expandable_bytes is None and not noted(small)


def test_the_saving_note_names_the_reserve_only_past_both_thresholds():
    from trainfit.memory.expandable import (
        SAVING_NOTE_MIN_BYTES,
        SAVING_NOTE_MIN_FRACTION,
        saving_note,
    )

    assert (SAVING_NOTE_MIN_BYTES, SAVING_NOTE_MIN_FRACTION) == (256 * 2**20, 0.02)
    gib = 2**30
    assert saving_note(18 * gib, int(16.8 * gib)).startswith(
        "with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert "16.80 GiB instead of 18.00 (predicted, 1.20 GiB less" in saving_note(
        18 * gib, int(16.8 * gib))
    assert saving_note(40 * gib, int(39.4 * gib)) == ""  # 0.6 GiB: 1.5 % of the reserve
    assert saving_note(4 * gib, 4 * gib - 200 * 2**20) == ""  # 5 %, but 200 MiB
    assert saving_note(4 * gib, 5 * gib) == ""  # more with expandable: nothing to name
