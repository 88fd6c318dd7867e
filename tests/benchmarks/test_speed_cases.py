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


def test_a_published_figure_above_the_gpus_peak_is_not_scored():
    """A published tokens/s that would need more than the card's dense peak (MFU > 100 % under
    the configuration's FLOP count) is an inconsistent source or pinning: listed, not scored."""
    from speed_cases import Mapped
    from speed_published import _row, summarize

    def case(cid: str, measured: float) -> Mapped:
        return Mapped(id=cid, group="g", file="published", gpu_text="RTX A6000", gpu="rtx-a6000",
                      family="consumer/workstation Ampere", gpus=1, measured_tokens_per_s=measured,
                      measured_mfu=None)

    # predicted 2,600 tokens/s at 56 % MFU: the published 4,699 implies 101 %
    over = _row(case("over", 4699.0), [], predicted_tokens_per_s=2600.0, predicted_mfu=0.56)
    ok = _row(case("ok", 2579.0), [], predicted_tokens_per_s=2000.0, predicted_mfu=0.62)
    assert over["error"] is None and over["bucket"] == "unsupported"
    assert over["measured_mfu_trainfit"] == pytest.approx(0.56 * 4699 / 2600)
    assert "implies MFU 101%" in over["unsupported"][0]
    assert ok["error"] == pytest.approx(2000 / 2579 - 1) and ok["bucket"] == "plain"
    s = summarize([over, ok], 0.0, 0.0, {"commit": "x", "src_modified": []})
    assert s["scored"] == 1 and s["not_scored"] == {"published figure above the GPU's peak": 1}
