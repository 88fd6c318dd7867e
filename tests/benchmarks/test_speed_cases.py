"""speed_published's mapping of a case's attention: on Hopper SDPA left to itself runs cuDNN's
kernel under torch ≥ 2.9, so a run that names a flash kernel, or ran an older torch, is mapped
to ``sdpa-flash`` (the kernel it ran), and plain SDPA under a recent or unstated torch to ``sdpa``."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from speed_cases import _attention


@pytest.mark.parametrize(("text", "framework", "job"), [
    ("flash-family fused kernel (MPT attn_impl 'triton' or 'flash')", "", "sdpa-flash"),
    ("sdpa (F.scaled_dot_product_attention, causal -> FlashAttention-2 kernel)", "", "sdpa-flash"),
    ("HF default for transformers 4.49 (attn_implementation null -> sdpa)",
     "universal-llm-trainer, torch 2.5.1, transformers 4.49.0", "sdpa-flash"),
    ("sdpa (F.scaled_dot_product_attention; packed: block-causal mask)", "torch 2.9.0", "sdpa"),
    ("sdpa (torchtune CausalSelfAttention -> F.scaled_dot_product_attention)", "", "sdpa"),
    ("eager", "torch 2.1", "eager"),
])
def test_attention_maps_to_the_kernel_the_run_used(text, framework, job):
    assert _attention(text, framework) == job
