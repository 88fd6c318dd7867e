"""torch ≤ 1.10's softmax and log_softmax saved their input for the backward as well as their
output (SoftmaxBackward0's ``self_``; gone in 1.11, pytorch#65242): ``softmax_saves_input``
models it. Transformers' 2022 BERT-large page on a V100 was 8-13 % under on the four
micro-batch-4 runs without it (an audit of benchmarks/results/calibration.md)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
import transformers as T

from trainfit.job import JobSpec
from trainfit.memory.legacy_saves import SoftmaxInputSaves
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.memory.tracker import LiveBytesTracker
from trainfit.model.source import ModelSource

N = 1 << 14


def _forward_live(legacy: bool, grad: bool = True) -> tuple[int, int, int]:
    """(bytes live after the forward, after the backward, inputs held after the backward)."""
    x = torch.randn(4, N // 4, requires_grad=True)
    mode = SoftmaxInputSaves() if legacy else None
    with LiveBytesTracker(block_bytes=1) as tracker:
        tracker.track(x, "parameters")
        with mode if mode is not None else torch.enable_grad(), torch.set_grad_enabled(grad):
            scores = x * 2.0  # not saved by the mul; only softmax's old node keeps it
            probs = torch.softmax(scores, dim=-1)
            del scores
            loss = (probs * probs).sum()
            after_forward = tracker.current_bytes
            if grad:
                loss.backward()
            del probs, loss
        after_backward = tracker.current_bytes
    return after_forward, after_backward, 0 if mode is None else mode.held


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
        with LiveBytesTracker(block_bytes=1) as tracker, mode:
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
