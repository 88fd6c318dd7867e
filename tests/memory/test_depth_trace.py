"""A full-depth alloc/free trace built from two small depths replays like the full-depth step."""

from __future__ import annotations

from typing import Any

import pytest

from trainfit.job import JobSpec
from trainfit.memory.allocator import replay
from trainfit.memory.depth_trace import deeper_trace, malformed
from trainfit.memory.extrapolate import fit_group, with_layers
from trainfit.memory.predict import predict_memory
from trainfit.memory.simulate import SimTarget, simulate_step


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


def _trace(job: JobSpec, layers: int) -> tuple[list[tuple[int, int]], dict[int, int]]:
    # the first step a process simulates allocates a few one-time blocks more: warm up first
    simulate_step(job, with_layers(_qwen(8), 2), SimTarget(device="cuda"))
    sim = simulate_step(job, with_layers(_qwen(8), layers), SimTarget(device="cuda"),
                        record_events=True)
    return sim.events, sim.event_streams


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
}


@pytest.mark.parametrize("name", ["LoRA bf16, one micro-step",
                                  "8-rank FSDP amp-bf16 (collective streams)"])
def test_synthesized_trace_replays_as_the_deeper_step(name: str) -> None:
    job = JOBS[name]
    lo, hi, deep = (_trace(job, n) for n in (3, 4, 7))
    trace = deeper_trace(lo, hi, 3)
    assert trace is not None
    assert len(trace[0]) == len(deep[0])
    assert malformed(trace[0]) == malformed(deep[0])
    got, want = replay(*trace), replay(*deep)
    # the allocator's peaks of the synthesized 7-layer trace are the simulated 7-layer step's
    assert (got.peak_allocated_bytes, got.peak_reserved_bytes) == \
        (want.peak_allocated_bytes, want.peak_reserved_bytes)


def test_a_wrongly_chained_trace_is_told_by_its_malformed_events() -> None:
    """At toy sizes the checkpointed amp step's recomputation frees blocks the alignment pairs
    with the wrong copy: the synthesized trace then frees blocks that are not live, more than
    the depth implies (59 against 56), and its allocated peak is 0.5 % short of the 7-layer
    step's.  BilinearModel.full_depth refuses such a trace (the share model is kept)."""
    job = JOBS["amp-fp16 checkpointed, accumulating"]
    lo, hi, deep = (_trace(job, n) for n in (3, 4, 7))
    trace = deeper_trace(lo, hi, 3)
    assert trace is not None
    implied = malformed(hi[0]) + 3 * (malformed(hi[0]) - malformed(lo[0]))
    assert implied == malformed(deep[0])
    assert malformed(trace[0]) != implied
    assert replay(*trace).peak_allocated_bytes < replay(*deep).peak_allocated_bytes


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
