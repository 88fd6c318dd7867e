"""torch ≤ 1.10's softmax and log_softmax saved their input for the backward as well as their
output (SoftmaxBackward0's ``self_``; gone in 1.11, pytorch#65242): ``softmax_saves_input``
models it. Transformers' 2022 BERT-large page on a V100 was 8-13 % under on the four
micro-batch-4 runs without it (an audit of benchmarks/results/calibration.md)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
import transformers as T

from trainfit.job import JobError, JobSpec
from trainfit.job.step_options import refuse_other_model_code
from trainfit.memory.legacy_saves import SoftmaxInputSaves
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.memory.tracker import LiveBytesTracker
from trainfit.model.source import ModelSource

N = 1 << 14


def _forward_live(legacy: bool, grad: bool = True) -> tuple[int, int, int]:
    """(bytes live after the forward, after the backward, inputs held after the backward)."""
    x = torch.randn(4, N // 4, requires_grad=True)
    mode = SoftmaxInputSaves() if legacy else contextlib.nullcontext()
    # the mode outside the tracker, as simulate enters them
    with mode, LiveBytesTracker(block_bytes=1) as tracker, torch.set_grad_enabled(grad):
        tracker.track(x, "parameters")
        scores = x * 2.0  # not saved by the mul; only softmax's old node keeps it
        probs = torch.softmax(scores, dim=-1)
        del scores
        loss = (probs * probs).sum()
        after_forward = tracker.current_bytes
        if grad:
            loss.backward()
        del probs, loss
    return after_forward, tracker.current_bytes, mode.held if legacy else 0


def test_the_old_node_holds_the_scores_until_its_backward():
    new_fwd, new_bwd, _ = _forward_live(legacy=False)
    old_fwd, old_bwd, held = _forward_live(legacy=True)
    assert old_fwd - new_fwd == 4 * N  # the fp32 scores, one x-sized block
    assert old_bwd == new_bwd  # released by softmax's backward
    assert held == 0


def test_nothing_is_held_without_grad():
    new_fwd, _, _ = _forward_live(legacy=False, grad=False)
    old_fwd, _, held = _forward_live(legacy=True, grad=False)
    assert old_fwd == new_fwd and held == 0


def test_cross_entropy_keeps_its_logits():
    """log_softmax inside F.cross_entropy (an op of torch's C++, not Python's softmax)."""
    logits_leaf = torch.randn(8, 1000, requires_grad=True)
    labels = torch.randint(0, 1000, (8,))
    live = {}
    for legacy in (False, True):
        mode = SoftmaxInputSaves() if legacy else contextlib.nullcontext()
        with mode, LiveBytesTracker(block_bytes=1) as tracker:
            logits = logits_leaf * 1.0
            loss = F.cross_entropy(logits, labels)
            del logits
            live[legacy] = tracker.current_bytes
            assert not legacy or mode.held == 1
            loss.backward()
            assert not legacy or mode.held == 0
    assert live[True] - live[False] == 8 * 1000 * 4  # the logits log_softmax read


def test_non_reentrant_checkpointing_saves_through_its_hooks():
    x = torch.randn(4, 256, requires_grad=True)
    with SoftmaxInputSaves() as mode:
        out = torch.utils.checkpoint.checkpoint(
            lambda t: torch.softmax(t * 2.0, dim=-1), x, use_reentrant=False)
        assert mode.held == 0
        out.sum().backward()


def test_bert_eager_holds_each_layers_fp32_scores():
    """Tiny BERT, eager attention with dropout, planned for a V100 (sm 7.0) under amp-fp16: the
    old torch holds each layer's fp32 scores (autocast's softmax casts them up first) until the
    layer's backward — layers × B × H × T × T × 4 bytes more at the forward's end."""
    layers, heads, seq, batch = 3, 4, 128, 2
    cfg = T.BertConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=heads,
                       intermediate_size=128, vocab_size=512, max_position_embeddings=seq)
    src = ModelSource("bert", cfg, "sequence-classification", "local")
    peaks = {}
    for legacy in (False, True):
        job = JobSpec(model="bert", method="full", seq_len=seq, micro_batch=batch,
                      precision="amp-fp16", attention="eager", softmax_saves_input=legacy)
        sim = simulate_step(job, src, SimTarget(device="cuda", compute_capability=(7, 0)))
        peaks[legacy] = sim.phase_peaks["forward@first"]
    assert peaks[True] - peaks[False] == layers * batch * heads * seq * seq * 4


def test_the_gradient_is_booked_before_the_input_goes():
    """The old node released its saved input after its backward returned: the gradient it made
    is allocated while the input is still live (freeing the input first would lower the peak
    at that moment by the input's size)."""
    x = torch.randn(4, N // 4, requires_grad=True)
    with SoftmaxInputSaves(), LiveBytesTracker(block_bytes=1) as tracker:
        tracker.record_events = True
        probs = torch.softmax(x * 2.0, dim=-1)
        start = len(tracker.events)
        probs.backward(torch.ones_like(probs))
    scores_uid = tracker.events[0][0]  # x * 2.0: the first block
    backward = tracker.events[start:]
    allocs = [i for i, (_, n) in enumerate(backward) if n == 4 * N]
    freed = next(i for i, (u, n) in enumerate(backward) if u == scores_uid and n < 0)
    # allocs[0]: the ones, allocs[1]: softmax's gradient
    assert allocs[1] < freed < allocs[2]


def _bert(layers: int = 2) -> ModelSource:
    cfg = T.BertConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                       intermediate_size=128, vocab_size=512, max_position_embeddings=128)
    return ModelSource("bert", cfg, "sequence-classification", "local")


def test_the_engines_gradient_sums_stay_in_place_under_the_mode():
    """The tracker recognises the autograd engine's in-place gradient sums by the frames above
    it; a mode between them hid the engine and booked every sum anew (a review: 12 allocations
    more on a tiny BERT). Only what softmax holds may differ: the allocations are the same."""
    allocations = {}
    for legacy in (False, True):
        job = JobSpec(model="bert", method="full", seq_len=64, micro_batch=2, precision="fp32",
                      attention="eager", softmax_saves_input=legacy)
        sim = simulate_step(job, _bert(), SimTarget(device="cuda", compute_capability=(7, 0)),
                            record_events=True)
        allocations[legacy] = [n for _, n in sim.events if n > 0]
    assert allocations[True] == allocations[False]


def test_a_reentrant_recomputation_holds_its_layers_scores_until_their_backward():
    layers, heads, seq, batch = 2, 4, 64, 2
    peaks = {}
    for legacy in (False, True):
        job = JobSpec(model="bert", method="full", seq_len=seq, micro_batch=batch,
                      precision="fp32", attention="eager", grad_ckpt="full", ckpt_reentrant=True,
                      softmax_saves_input=legacy)
        assert job.ckpt_reentrant
        sim = simulate_step(job, _bert(layers), SimTarget(device="cuda", compute_capability=(7, 0)))
        peaks[legacy] = sim.phase_peaks["backward@first"]
    assert peaks[True] - peaks[False] == batch * heads * seq * seq * 4  # one layer's, at a time


@pytest.mark.parametrize("extra, said", [
    (dict(attention="sdpa"), "no scaled_dot_product_attention"),
    (dict(attention="eager", compile=True), "no torch.compile"),
    (dict(attention="eager", grad_ckpt="selective"), "reentrantly only"),
    (dict(attention="eager", activation_offload=True), "offloading hooks")])
def test_what_torch_1_10_did_not_have_is_refused(extra, said):
    with pytest.raises(JobError, match=said):
        JobSpec(model="bert", softmax_saves_input=True, **extra)


def test_train_tune_and_doctor_refuse_it():
    job = JobSpec(model="bert", attention="eager", softmax_saves_input=True)
    for command in ("train", "tune", "doctor"):
        with pytest.raises(JobError, match=r"torch ≤ 1\.10's autograd"):
            refuse_other_model_code(job, command)


def test_it_checkpoints_reentrantly_as_torch_1_10_did():
    assert JobSpec(model="bert", attention="eager", grad_ckpt="full",
                   softmax_saves_input=True).ckpt_reentrant
