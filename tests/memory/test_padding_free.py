"""Padding-free batches (``JobSpec.padding_free``: TRL's padding_free, and its packing's bfd
strategy): one row of micro-batch × seq_len positions, position_ids restarting per sequence.
transformers 5 reads the packing from position_ids and hands SDPA a (1, 1, N, N) block-causal
boolean mask; torch converts it to a float copy per layer, which the kernel keeps for the
backward.  An audit found scripts with packing planned as separate rows, the mask unplanned."""

from __future__ import annotations

import pytest
import transformers as T

from trainfit.job import JobError, JobSpec
from trainfit.memory.cpu_truth import measure_cpu_step
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.batch import make_batch
from trainfit.model.source import ModelSource

LAYERS, SEQ, MICRO = 2, 64, 4


def _source() -> ModelSource:
    cfg = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=500)
    return ModelSource("tiny-llama", cfg, "causal-lm", "config", "")


def _job(**kw) -> JobSpec:
    return JobSpec(model="tiny-llama", seq_len=SEQ, micro_batch=MICRO, effective_batch=MICRO,
                   method="full", padding_free=True, **{"precision": "fp32", **kw})


def test_the_packed_batch_is_one_row_with_restarting_positions():
    b = make_batch(_source(), MICRO, SEQ, packed=True)
    assert tuple(b["input_ids"].shape) == (1, MICRO * SEQ)
    assert b["position_ids"][0, :SEQ + 2].tolist() == [*range(SEQ), 0, 1]


@pytest.mark.parametrize("ckpt", ["off", "full"])
def test_the_simulated_packed_step_holds_what_the_cpu_step_holds(ckpt):
    """The same packed step run on this CPU (transformers' own packed-sequence check and mask):
    the simulation's allocated peak within 0.2 % (4 bytes without checkpointing)."""
    src = _source()
    job = _job(grad_ckpt=ckpt)
    sim = simulate_step(job, src, SimTarget(device="cpu"))
    real = measure_cpu_step(job, src)
    assert sim.peak_allocated_bytes == pytest.approx(real.peak_allocated_bytes, rel=2e-3)
    # and the packed row holds more than separate rows (the mask, its copies, k/v expanded)
    rows = simulate_step(job.replace(padding_free=False), src, SimTarget(device="cpu"))
    assert sim.peak_allocated_bytes > rows.peak_allocated_bytes


@pytest.mark.parametrize("packing", [None, True])
def test_at_micro_batch_1_a_row_of_one_sequence_has_no_mask(packing):
    """A review: under fake tensors transformers' packed-sequence check always answers with a
    tensor (it cannot look at values), so a micro-batch of one sequence was simulated with the
    mask the real step never builds (+11.6 % at seq 256).  One sequence: the plain row's
    memory, as the CPU run; with packing (TRL's bfd bins hold several documents) the mask."""
    src = _source()
    job = _job(grad_ckpt="off").replace(micro_batch=1, effective_batch=1, packing=packing)
    sim = simulate_step(job, src, SimTarget(device="cpu")).peak_allocated_bytes
    assert sim == pytest.approx(measure_cpu_step(job, src).peak_allocated_bytes, rel=1e-5)
    rows = simulate_step(job.replace(padding_free=False), src, SimTarget(device="cpu"))
    assert (sim > rows.peak_allocated_bytes) is bool(packing)


def test_on_a_gpu_each_layer_keeps_a_16_bit_copy_of_the_n_by_n_mask():
    """amp-bf16 on an A100 target, no checkpointing: the packed step holds at least a bf16 copy
    of the mask per layer (2·N² bytes each) more than separate rows (5.4·N² at micro-batch 4,
    4.7·N² at 8: the bool mask itself is freed before the peak there) — and with the
    micro-batch doubled that excess grows 3.5-fold (N² in the micro-batch)."""
    src = _source()
    target = SimTarget(device="cuda", compute_capability=(8, 0))

    def excess(micro: int) -> int:
        job = _job(grad_ckpt="off").replace(precision="amp-bf16", micro_batch=micro,
                                             effective_batch=micro)
        packed = simulate_step(job, src, target).peak_allocated_bytes
        rows = simulate_step(job.replace(padding_free=False), src, target).peak_allocated_bytes
        return packed - rows

    n = MICRO * SEQ
    assert excess(MICRO) >= n * n * 2 * LAYERS
    assert excess(2 * MICRO) >= 2 * n * n * 2 * LAYERS * 2  # (2n)² · 2 bytes · layers
    assert excess(2 * MICRO) > 3 * excess(MICRO)


def test_flash_attention_packs_without_a_mask_and_holds_what_rows_hold():
    """flash-attention-2 (flash_attention_2's varlen kernel reads position_ids): no mask, the
    separate rows' memory — where SDPA's own choice on the same card, with the mask, holds more
    (and SDPA preferring its flash kernel, sdpa-flash, keeps the mask too)."""
    src = _source()
    target = SimTarget(device="cuda", compute_capability=(8, 0))
    job = _job(attention="flash-attention-2", precision="amp-bf16")
    assert not job.packs_rows
    flash = simulate_step(job, src, target).peak_allocated_bytes
    assert flash == simulate_step(job.replace(padding_free=False), src,
                                  target).peak_allocated_bytes
    assert simulate_step(job.replace(attention="sdpa"), src, target).peak_allocated_bytes > flash
    assert job.replace(attention="sdpa-flash").packs_rows


def test_a_model_that_is_not_a_causal_lm_is_refused():
    src = ModelSource("t5", T.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2,
                                       vocab_size=100), "seq2seq-lm", "config", "")
    with pytest.raises(JobError, match="padding-free"):
        make_batch(src, 2, 8, packed=True)


def test_plan_refuses_it_for_a_model_that_is_not_a_causal_lm_before_simulating():
    from trainfit.hardware.gpus import find_gpu
    from trainfit.plan.grid import plan

    src = ModelSource("t5", T.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2,
                                       vocab_size=100), "seq2seq-lm", "config", "")
    with pytest.raises(JobError, match="seq2seq-lm model takes no packed row"):
        plan(JobSpec(model="t5", seq_len=16, effective_batch=2, padding_free=True), src,
             find_gpu("a100-80gb-sxm"))
