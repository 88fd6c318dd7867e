"""plan says why bf16-true can need more memory than amp-bf16 (an audit: a Mamba-2 hybrid's
bf16-true rows outgrew its amp-bf16 ones with no word why): the simulated step of transformers'
PyTorch fallback keeps 4-byte operands under bf16-true where autocast keeps 2-byte ones."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from trainfit.job import JobSpec
from trainfit.plan.rows import precision_inversion

GIB = 2**30


def _row(precision: str, micro: int, allocated_gib: float, ckpt: str = "off") -> SimpleNamespace:
    job = JobSpec(model="m", seq_len=512, micro_batch=micro, grad_accum=1, precision=precision,
                  grad_ckpt=ckpt, method="full")
    return SimpleNamespace(job=job, memory=SimpleNamespace(
        peak_allocated_bytes=int(allocated_gib * GIB)))


def test_the_smallest_inverted_configuration_is_found_and_only_at_equal_knobs():
    rows = [_row("amp-bf16", 4, 47.38), _row("bf16-true", 4, 44.86),
            _row("amp-bf16", 16, 131.96), _row("bf16-true", 16, 154.85),
            _row("amp-bf16", 32, 250.0), _row("bf16-true", 32, 300.0),
            # checkpointed bf16-true above a non-checkpointed amp-bf16 row: other knobs
            _row("bf16-true", 8, 60.0, ckpt="full"), _row("amp-bf16", 8, 50.0)]
    inv = precision_inversion(rows)
    assert (inv.micro_batch, inv.grad_ckpt) == (16, "off")
    assert inv.bf16_true_bytes == int(154.85 * GIB) and inv.amp_bf16_bytes == int(131.96 * GIB)
    assert inv.every_larger  # 32 inverts too: "from micro-batch 16"
    rows[5] = _row("bf16-true", 32, 240.0)
    assert not precision_inversion(rows).every_larger  # "at micro-batch 16" only
    assert precision_inversion(rows[:2]) is None
    assert precision_inversion([r for r in rows if r.job.precision == "bf16-true"]) is None


@pytest.fixture(scope="module")
def granite():
    from transformers import AutoConfig

    from trainfit.model.catalog.model_configs import GRANITE_4_0_H_1B
    from trainfit.model.source import ModelSource
    from trainfit.plan.grid import plan

    cfg = AutoConfig.for_model(**{**GRANITE_4_0_H_1B, "num_hidden_layers": 2,
                                  "layer_types": ["mamba", "attention"], "vocab_size": 1024})
    src = ModelSource("tiny-granite-h", cfg, "causal-lm", "local",
                      note="granitemoehybrid: ... transformers' PyTorch fallbacks ...")
    return {p: plan(JobSpec(model="tiny-granite-h", seq_len=512, micro_batch=16, grad_accum=1,
                            precision=p, grad_ckpt="off", method="full"), src, None,
                    verify=False)
            for p in ("amp-bf16", "bf16-true")}


def test_a_mamba_hybrids_bf16_true_step_outgrows_amp_bf16s_and_says_why(granite):
    from trainfit.render.words import inversion_note, plan_notes

    rows = [r for res in granite.values() for r in res.rows]
    inv = precision_inversion(rows)
    assert inv is not None and inv.micro_batch == 16
    # the simulated steps, not a constant: bf16-true's 4-byte scan operands exceed what it
    # saves on 2-byte weights at this size
    assert inv.bf16_true_bytes > inv.amp_bf16_bytes
    res = dataclasses.replace(granite["bf16-true"], rows=rows)
    words = inversion_note(res)
    assert f"{inv.bf16_true_bytes / GIB:.2f} against {inv.amp_bf16_bytes / GIB:.2f} GiB " \
        "allocated, predicted" in words and "PyTorch fallbacks" in words
    assert words in plan_notes(res)
    assert "at micro-batch 16" in words and "measured on Granite-4.0-H" in words
    assert inversion_note(granite["amp-bf16"]) is None
