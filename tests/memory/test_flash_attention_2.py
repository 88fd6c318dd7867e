"""``--attention sdpa-flash`` stands for transformers' flash_attention_2: FlashAttention-2 takes
fewer key/value heads than query heads and no T×T mask. Under it Falcon-7B's multi-query layers
were simulated with torch's math kernel (one key head, no enable_gqa; its always-built mask) —
fp32 probabilities kept per layer that FlashAttention-2 never makes (an audit, 2026-12-06)."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from trainfit.job import JobSpec
from trainfit.memory.sdpa_choice import AttentionTarget
from trainfit.memory.semantics import device_semantics
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.source import ModelSource


def _call(prefer: str, *, kv_heads: int = 1, mask: torch.Tensor | None = None,
          decoder_only: bool = True) -> tuple[dict[str, int], list[bool]]:
    """One SDPA call as transformers' Falcon makes it: (kernels used, is_causal each got)."""
    causal: list[bool] = []
    real = torch.ops.aten._scaled_dot_product_flash_attention

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, q, k, v, dropout_p, is_causal, *a, **kw):
            causal.append(is_causal)
            return real(q, k, v, dropout_p, is_causal, *a, **kw)

    q = torch.randn(1, 8, 16, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.randn(1, kv_heads, 16, 64, dtype=torch.bfloat16, device="meta")
    target = AttentionTarget(device="cuda", compute_capability=(8, 0), prefer=prefer,
                             decoder_only=decoder_only)
    with device_semantics(target) as ops:
        torch.ops.aten._scaled_dot_product_flash_attention = Spy()
        try:
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
        finally:
            torch.ops.aten._scaled_dot_product_flash_attention = real
    return ops.kernels_used, causal


CAUSAL = torch.ones(1, 1, 16, 16, dtype=torch.bool, device="meta").tril()


def test_falcons_multi_query_call_runs_flash_under_flash_attention_2():
    assert _call("sdpa", mask=CAUSAL)[0] == {"math": 1}  # torch's own dispatcher: unchanged
    assert _call("sdpa-flash", mask=CAUSAL) == ({"flash": 1}, [True])


def test_a_dropped_mask_is_causal_only_in_a_decoder_only_model():
    assert _call("sdpa-flash", kv_heads=8, mask=CAUSAL, decoder_only=False) == ({"flash": 1}, [False])
    assert _call("sdpa-flash", kv_heads=8, mask=None) == ({"flash": 1}, [False])


def test_a_float_mask_is_kept():
    """ALiBi or a position bias: values FlashAttention-2 cannot take, so not dropped."""
    bias = torch.zeros(1, 8, 16, 16, dtype=torch.bfloat16, device="meta")
    assert _call("sdpa-flash", kv_heads=8, mask=bias)[0] == {"efficient": 1}


def _falcon_7b_shape() -> ModelSource:
    cfg = T.FalconConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                         multi_query=True, new_decoder_architecture=False, parallel_attn=True,
                         alibi=False, bias=False, vocab_size=1000)
    return ModelSource("falcon", cfg, "causal-lm", "local")


@pytest.mark.parametrize("method", ["full", "lora"])
def test_falcon_multi_query_under_flash_attention_2_holds_no_probabilities(method):
    seq, batch, heads, layers = 256, 2, 4, 2
    src = _falcon_7b_shape()
    sims = {}
    for attention in ("sdpa", "sdpa-flash"):
        job = JobSpec(model="falcon", method=method, seq_len=seq, micro_batch=batch,
                      precision="bf16-true", attention=attention)
        sims[attention] = simulate_step(job, src, SimTarget(device="cuda",
                                                            compute_capability=(8, 0)))
    assert sims["sdpa"].sdpa_kernels == {"math": layers}
    assert sims["sdpa-flash"].sdpa_kernels == {"flash": layers}
    # the math kernel keeps each layer's fp32 probabilities (and more) for its backward
    probs = layers * batch * heads * seq * seq * 4
    assert sims["sdpa"].peak_allocated_bytes - sims["sdpa-flash"].peak_allocated_bytes >= probs
