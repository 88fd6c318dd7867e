"""A full-depth alloc/free trace built from two small depths replays like the full-depth step."""

from __future__ import annotations

from typing import Any

import pytest

from trainfit.job import JobSpec
from trainfit.memory.allocator import replay
from trainfit.memory.batch_trace import batch_trace
from trainfit.memory.bilinear import SEGMENT_SLACK_BYTES
from trainfit.memory.depth_trace import deeper_trace, malformed
from trainfit.memory.extrapolate import fit_group
from trainfit.memory.predict import predict_memory
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.depth import with_layers


def _qwen(layers: int) -> Any:
    from transformers import Qwen2Config

    from trainfit.model.source import ModelSource

    # sizes of a small real model: a layer's tensors then differ in size from the head's and
    # the embedding's, as at 7B (at toy sizes many coincide, and the alignment of the two
    # traces can be ambiguous: then no trace is synthesized and the share model is kept)
    cfg = Qwen2Config(hidden_size=512, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                      max_position_embeddings=4096, tie_word_embeddings=False)
    return ModelSource("q", cfg, "causal-lm", "config", "")


_TRACES: dict[tuple[str, int, int], tuple[Any, ...]] = {}
_WARM: set[str] = set()


def _trace(job: JobSpec, layers: int, micro: int | None = None
           ) -> tuple[Any, ...]:
    """The step's (events, streams, phases), simulated once per process: several tests read the
    same traces, and depth_trace's functions never change their inputs (plan reuses a fitted
    group's traces for every row the same way)."""
    key = (repr(job), layers, micro or job.micro_batch)
    if key not in _TRACES:
        if key[0] not in _WARM:
            # the first step a process simulates allocates a few one-time blocks more: warm up
            simulate_step(job, with_layers(_qwen(8), 2), SimTarget(device="cuda"))
            _WARM.add(key[0])
        sim = simulate_step(job.replace(micro_batch=key[2], effective_batch=None),
                            with_layers(_qwen(8), layers), SimTarget(device="cuda"),
                            record_events=True)
        _TRACES[key] = (sim.events, sim.event_streams, sim.event_phases)
    return _TRACES[key]


JOBS = {
    "amp-fp16 checkpointed, accumulating": JobSpec(
        model="q", method="full", seq_len=256, micro_batch=3, grad_accum=2, precision="amp-fp16",
        grad_ckpt="full"),
    "LoRA bf16, one micro-step": JobSpec(
        model="q", method="lora", lora_targets="q,v", seq_len=256, micro_batch=4, grad_accum=1,
        precision="bf16-true"),
    "8-rank FSDP amp-bf16 (collective streams)": JobSpec(
        model="q", method="full", ranks=8, sharding="fsdp", seq_len=256, micro_batch=2,
        grad_accum=2, precision="amp-bf16"),
    "2-rank FSDP1 LoRA after its wrap (history before the step)": JobSpec(
        model="q", method="lora", lora_targets="q,v", ranks=2, sharding="fsdp",
        fsdp_init="wrap-sync", seq_len=256, micro_batch=2, grad_accum=1,
        precision="bf16-true"),
}


@pytest.mark.parametrize("name", ["LoRA bf16, one micro-step",
                                  "8-rank FSDP amp-bf16 (collective streams)",
                                  "2-rank FSDP1 LoRA after its wrap (history before the step)"])
def test_synthesized_trace_replays_as_the_deeper_step(name: str) -> None:
    job = JOBS[name]
    lo, hi, deep = (_trace(job, n) for n in (3, 4, 7))
    trace = deeper_trace(lo, hi, 3)
    assert trace is not None
    assert len(trace[0]) == len(deep[0])
    assert malformed(trace[0]) == malformed(deep[0])
    got, want = replay(*trace[:2]), replay(*deep[:2])
    # the allocator's peaks of the synthesized 7-layer trace are the simulated 7-layer step's
    assert (got.peak_allocated_bytes, got.peak_reserved_bytes) == \
        (want.peak_allocated_bytes, want.peak_reserved_bytes)


def _free_sets(events: list[tuple[int, int]]) -> list[Any]:
    """The trace as allocations (by index) and, between them, the set of blocks each run of
    frees frees (by the index that made them): two traces that free the same blocks at the same
    moments give the same list, whatever ids they use (the order inside a run of frees does not
    change what the allocator holds after it)."""
    made: dict[int, int] = {}
    out: list[Any] = []
    run: set[tuple[int | None, int]] = set()
    for i, (uid, delta) in enumerate(events):
        if delta > 0:
            if run:
                out.append(frozenset(run))
                run = set()
            made[uid] = i
            out.append(("alloc", i, delta))
        else:
            run.add((made.get(uid), -delta))
    return out + ([frozenset(run)] if run else [])


@pytest.mark.parametrize("name", list(JOBS))
def test_synthesized_trace_frees_the_blocks_the_deeper_step_frees(name: str) -> None:
    """Not only the peaks: each free takes the block the 7-layer step frees (the chains of
    passed-on blocks, depth_trace._chains, from a middle layer's run, _centred).  Pairing each
    run's free with the copy before it left the peaks right in two of these but freed other
    blocks at 1,483 of 1,682 moments (LoRA) and 3,578 of 6,773 (FSDP); the checkpointed
    accumulating step's trace then freed blocks not live and missed the allocated peak, and
    at catalog scale a reserve read 156 MiB under the full-depth step (test below)."""
    job = JOBS[name]
    lo, hi, deep = (_trace(job, n) for n in (3, 4, 7))
    trace = deeper_trace(lo, hi, 3)
    assert trace is not None
    assert _free_sets(trace[0]) == _free_sets(deep[0])
    # frees of blocks made before the trace began: a fixed number per layer (the guard
    # full_depth_trace keeps against a wrongly chained trace)
    implied = malformed(hi[0]) + 3 * (malformed(hi[0]) - malformed(lo[0]))
    assert malformed(trace[0]) == implied == malformed(deep[0])


def test_the_block_a_layer_passes_two_layers_on_is_chained() -> None:
    """Mistral-7B bf16-true, 512 tokens, micro-batch 1, one micro-step: the inserted run (one
    rotation of a layer's events) makes a hidden state that the run after next frees, so the
    block made just before the first run is freed by the second copy.  The synthesized
    32-layer trace replays to the 32-layer simulation's allocated peak and reserve (the
    pairing with the copy before read the reserve 1,052 MiB against 1,228 MiB)."""
    from trainfit.hardware.gpus import find_gpu
    from trainfit.memory.predict import target_for
    from trainfit.model.source import resolve_model

    src = resolve_model("mistral-7b")
    target = target_for(find_gpu("3090"))
    job = JobSpec(model="mistral-7b", precision="bf16-true", grad_ckpt="off", micro_batch=1,
                  grad_accum=1, seq_len=512)
    lo, hi, deep = (simulate_step(job, with_layers(src, n) if n < 32 else src, target,
                                  record_events=True) for n in (2, 3, 32))
    trace = deeper_trace(*((t.events, t.event_streams, t.event_phases) for t in (lo, hi)), 29)
    assert trace is not None
    got, want = replay(*trace[:2]), replay(deep.events, deep.event_streams)
    assert (got.peak_allocated_bytes, got.peak_reserved_bytes) == \
        (want.peak_allocated_bytes, want.peak_reserved_bytes)
    assert want.peak_reserved_bytes - want.peak_allocated_bytes > 1200 * 2**20


def _synthetic(layers: int, stack_bytes: int) -> tuple[list[tuple[int, int]], dict, list]:
    """A step of ``layers`` layers: each makes an activation (4 KiB) kept to the backward,
    then a per-tensor norm each (512 B) and their stacked list (``stack_bytes``), as
    clip_grad_norm makes them, all freed."""
    ev: list[tuple[int, int]] = []
    uid = iter(range(1, 10_000))
    acts = [next(uid) for _ in range(layers)]
    ev += [(a, 4096) for a in acts]
    ev += [(a, -4096) for a in reversed(acts)]
    norms = [next(uid) for _ in range(layers)]
    ev += [(n, 512) for n in norms]
    stack = next(uid)
    ev += [(stack, stack_bytes), (stack, -stack_bytes)]
    ev += [(n, -512) for n in reversed(norms)]
    return ev, {}, [(0, "forward"), (layers, "backward"), (2 * layers, "optimizer")]


def test_a_block_of_one_value_per_tensor_grows_with_the_depth() -> None:
    """clip_grad_norm's stacked per-tensor norms cross a 512-byte block between depths (Gemma-3
    at 14 and 20 layers: 1,024 and 1,536 bytes): the traces differ by more than the inserted
    layers, and they were not aligned (Gemma-3's stacks were simulated whole).  The block is
    resized in the shallow trace, the rest aligns, and the synthesized trace makes it grown by
    a bound on its growth per run (the difference + 512: both sizes are rounded up to 512-byte
    blocks) — never smaller than the deeper step's.  A block that shrinks, or
    larger than a per-tensor list can be, still stops the alignment."""
    from trainfit.memory.depth_trace import layer_runs

    lo, hi = _synthetic(4, 1024), _synthetic(5, 1536)
    runs = layer_runs(lo, hi)
    # 1,024 → 1,536 bytes: it grew by less than 1,024 a run (both sizes rounded up to 512)
    assert runs is not None and list(runs.grown.values()) == [1024]
    trace = deeper_trace(lo, hi, 3)
    assert trace is not None
    sizes = sorted({d for _, d in trace[0] if d > 0})
    assert sizes == [512, 4096, 1536 + 3 * 1024]
    want = _synthetic(8, 2048)
    assert replay(*trace[:2]).peak_allocated_bytes >= replay(want[0], {}).peak_allocated_bytes
    assert layer_runs(_synthetic(4, 1536), _synthetic(5, 1024)) is None  # shrinks
    assert layer_runs(_synthetic(4, 128 * 1024), _synthetic(5, 256 * 1024)) is None


def test_traces_of_different_steps_are_not_synthesized() -> None:
    job = JOBS["LoRA bf16, one micro-step"]
    other = job.replace(micro_batch=5, effective_batch=None)
    # one more sample changes every activation's size: not one layer's events inserted
    assert deeper_trace(_trace(job, 3), _trace(other, 4), 3) is None


def test_grid_rows_take_the_full_depth_trace() -> None:
    """At a simulated micro-batch the extrapolated row's allocated peak and reserve are the
    full-depth simulation's (within the cuBLAS workspaces predict_memory adds)."""
    job = JOBS["8-rank FSDP amp-bf16 (collective streams)"]
    src = _qwen(8)
    model = fit_group(job, src, SimTarget(device="cuda", compute_capability=(9, 0)),
                      high_batch=8)
    for micro, accumulating in ((2, True), (8, False)):
        traced = model.trace_peaks(micro, accumulating)
        assert traced is not None
        row = model.predict(micro, accumulating)
        full = predict_memory(job.replace(micro_batch=micro, grad_accum=2 if accumulating else 1),
                              src, None)
        work = full.breakdown["workspaces"]
        assert row["peak_allocated_bytes"] == full.peak_allocated_bytes - work
        assert row["reserved_bytes"] - row["peak_allocated_bytes"] >= \
            full.peak_reserved_bytes - full.peak_allocated_bytes


@pytest.mark.parametrize("name", ["LoRA bf16, one micro-step",
                                  "8-rank FSDP amp-bf16 (collective streams)"])
def test_trace_interpolated_in_the_micro_batch_replays_as_the_simulated_one(name: str) -> None:
    """Between two micro-batches (≥ 2) the step allocates the same blocks in the same order,
    weight-sized or proportional to the micro-batch: the interpolated trace replays like the
    one simulated there, and so does the full-depth trace made from interpolated ones."""
    job = JOBS[name]
    lo, hi, mid = (_trace(job, 3, b) for b in (2, 9, 5))
    got = batch_trace(lo, 2, hi, 9, 5)
    assert got is not None
    assert [abs(d) for _, d in got[0]] == [abs(d) for _, d in mid[0]]
    deep = _trace(job, 7, 5)
    made = deeper_trace(got, batch_trace(_trace(job, 4, 2), 2, _trace(job, 4, 9), 9, 5), 3)
    assert made is not None
    a, b = replay(*made[:2]), replay(*deep[:2])
    # the LoRA step's full-depth synthesis at micro-batch 5 is 512 KiB (0.06 %) short of the
    # 7-layer step's allocated peak, from simulated traces as from interpolated ones
    assert abs(a.peak_allocated_bytes - b.peak_allocated_bytes) <= 512 * 1024
    assert a.peak_reserved_bytes == b.peak_reserved_bytes


def test_traces_of_other_blocks_are_not_interpolated() -> None:
    """Micro-batch 1 skips a few copies, so its trace is another sequence of blocks than 2's."""
    job = JOBS["LoRA bf16, one micro-step"]
    one, two, three = (_trace(job, 3, b) for b in (1, 2, 3))
    assert batch_trace(two, 2, three, 3, 2) is not None
    assert batch_trace(one, 1, three, 3, 2) is None


def test_grid_rows_between_simulated_micro_batches_are_the_full_size_replay() -> None:
    """A row between the simulated micro-batches (3 and 8) has the full-size simulation's
    allocated peak and reserved total (within a block), not a chord and a bound."""
    job = JOBS["LoRA bf16, one micro-step"]
    src = _qwen(8)
    model = fit_group(job, src, SimTarget(device="cuda", compute_capability=(8, 0)), high_batch=8,
                      rows=[(m, False) for m in (1, 2, 4, 6, 8)])
    assert {p.batch for p in model.points + model.low + model.high} == {1, 2, 3, 8}
    for micro in (5, 6):
        row = model.predict(micro, False)
        full = predict_memory(job.replace(micro_batch=micro, effective_batch=None), src, None)
        work = full.breakdown["workspaces"]
        # within one 512 KiB block of the full-size step (the LoRA synthesis at micro-batch 5)
        assert abs(row["peak_allocated_bytes"] - (full.peak_allocated_bytes - work)) <= 512 * 1024
        reserved = row["reserved_bytes"] - SEGMENT_SLACK_BYTES
        assert full.peak_reserved_bytes - work <= reserved <= full.peak_reserved_bytes - work + \
            512 * 1024


def _canonical(events: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Block ids renumbered by first appearance (two simulations number their blocks apart)."""
    ids: dict[int, int] = {}
    return [(ids.setdefault(uid, len(ids)), delta) for uid, delta in events]


_SGD_KEEPING_GRADIENTS = {"optimizer": "sgd", "grads_to_none": False, "max_grad_norm": None}
"""An optimizer phase that allocates nothing: its idle mark falls at its own index."""


@pytest.mark.parametrize("arch,precision,ckpt,fields", [
    ("llama", "fp32", "off", {}), ("llama", "amp-bf16", "full", {"method": "lora"}),
    ("llama", "bf16-true", "off", {"method": "qlora", "quant": "nf4"}),
    ("gpt2", "amp-fp16", "full", {}), ("t5", "bf16-true", "full", {"method": "lora"}),
    ("t5", "amp-bf16", "off", {}), ("llama", "fp32", "off", _SGD_KEEPING_GRADIENTS)])
def test_one_micro_step_trace_cut_from_two_is_the_simulated_one(
        request: pytest.FixtureRequest, arch: str, precision: str, ckpt: str,
        fields: dict[str, Any]) -> None:
    """The trace plan takes for a row without accumulation, cut from the accumulating point's
    trace, is the one-micro-step step's own, event for event (and so is its replay)."""
    from trainfit.memory.batch_trace import one_micro_step_trace

    src = request.getfixturevalue(f"tiny_{arch}")
    job = JobSpec(model=arch, seq_len=32, micro_batch=2, grad_accum=2, precision=precision,
                  grad_ckpt=ckpt, **fields)
    two = simulate_step(job, src, SimTarget(), record_events=True)
    one = simulate_step(job.replace(grad_accum=1), src, SimTarget(), record_events=True)
    cut = one_micro_step_trace((two.events, two.event_streams, two.event_phases))
    assert cut is not None
    assert _canonical(cut[0]) == _canonical(one.events)
    assert cut[2] == one.event_phases
    assert replay(cut[0], cut[1]).peak_reserved_bytes == \
        replay(one.events, one.event_streams).peak_reserved_bytes
    # a one-micro-step trace has nothing to cut
    assert one_micro_step_trace((one.events, one.event_streams, one.event_phases)) is None


@pytest.mark.parametrize("fields", [{"hold_outputs": True}, {"ranks": 2, "sharding": "fsdp"}])
def test_no_cut_where_the_first_step_ran_in_full(tiny_llama, fields: dict[str, Any]) -> None:
    """A loop holding its outputs, and FSDP's sharded step, run their first step in full: the
    trace holds that step's micro-steps too, and no cut is made (plan simulates those)."""
    from trainfit.memory.batch_trace import one_micro_step_trace

    job = JobSpec(model="t", seq_len=32, micro_batch=2, grad_accum=2, precision="fp32",
                  grad_ckpt="off", **fields)
    two = simulate_step(job, tiny_llama, SimTarget(), record_events=True)
    assert one_micro_step_trace((two.events, two.event_streams, two.event_phases)) is None


def test_an_extrapolated_row_at_the_cards_limit_is_the_full_size_simulation() -> None:
    """Past the card the allocator releases its cache and retries: an extrapolated plan row
    replays its full-depth trace at the card's limit, as the full-size simulation does (Qwen2.5-7B
    QLoRA, 2-rank FSDP, amp-bf16 checkpointed, micro-batch 64 on an A100-80GB: the row read
    15.7 GiB over its allocated peak, the full-size simulation 2.8 GiB after one retry)."""
    import dataclasses

    from trainfit.hardware.gpus import find_gpu
    from trainfit.plan.grid import plan

    job = JOBS["LoRA bf16, one micro-step"].replace(micro_batch=None, effective_batch=8,
                                                     grad_ckpt="off")
    src = _qwen(8)
    roomy_gpu = find_gpu("a10g")

    def row(gpu: Any) -> Any:
        got = plan(job, src, gpu, verify=False, ladder=False)  # the rows are checked, not the pick
        return next(r for r in got.rows if r.job.micro_batch == 4 and r.how == "extrapolated")

    roomy = row(roomy_gpu).memory
    gap = roomy.peak_reserved_bytes - roomy.peak_allocated_bytes
    assert gap > 20 * 2**20
    card = dataclasses.replace(roomy_gpu, memory_bytes=roomy_gpu.memory_bytes
                               - (roomy_gpu.memory_bytes - roomy.peak_device_bytes)
                               - int(gap * 0.4))
    tight = row(card).memory
    full = predict_memory(job.replace(micro_batch=4, effective_batch=None, grad_accum=2), src,
                          card)
    assert full.alloc_retries >= 1
    assert tight.alloc_retries == full.alloc_retries
    assert tight.peak_allocated_bytes == full.peak_allocated_bytes
    assert tight.peak_reserved_bytes == full.peak_reserved_bytes  # the same trace, capped
    assert tight.peak_reserved_bytes < roomy.peak_reserved_bytes
