"""Models whose attention hands SDPA a materialised boolean mask (sliding windows past their
length, Falcon's new decoder, chunked attention) and DeepSeek-V3's unequal q/k and v heads: the
simulated step against the same step run on this CPU (an audit found the masked layers each
B×L×S×2-4 bytes under — torch converts the mask to a float copy its kernel keeps — and
DeepSeek-V3's simulation crashing on the CPU flash kernel it cannot take); and mixture-of-experts
layers whose frozen experts' grouped matmul runs in fp32."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from trainfit.job import JobSpec
from trainfit.memory.cpu_truth import measure_cpu_step
from trainfit.memory.sdpa_choice import AttentionTarget
from trainfit.memory.semantics import device_semantics
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.source import ModelSource

HIDDEN, FFN, VOCAB = 128, 344, 4000


def _configs() -> dict[str, T.PretrainedConfig]:
    common = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512)
    return {
        "mistral-window-64": T.MistralConfig(**common, sliding_window=64),
        "falcon-new-decoder": T.FalconConfig(hidden_size=HIDDEN, num_hidden_layers=2,
                                             num_attention_heads=4, num_kv_heads=2, vocab_size=VOCAB,
                                             new_decoder_architecture=True, bias=False),
        "deepseek-v3": T.DeepseekV3Config(
            hidden_size=HIDDEN, intermediate_size=FFN, moe_intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB, n_routed_experts=4,
            n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
            first_k_dense_replace=1, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16,
            qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=512, rope_scaling=None),
        "qwen3-moe": T.Qwen3MoeConfig(**common, moe_intermediate_size=128, num_experts=8,
                                      num_experts_per_tok=2),
    }


@pytest.mark.parametrize("name, method, precision", [
    ("mistral-window-64", "full", "fp32"), ("mistral-window-64", "lora", "fp32"),
    ("falcon-new-decoder", "full", "fp32"), ("falcon-new-decoder", "lora", "fp32"),
    ("deepseek-v3", "full", "fp32"),
    # frozen experts in fp32 weights (fp32, amp-*): torch's grouped matmul keeps neither their
    # input nor a weight gradient; the fallback op's own autograd kept both (+2 … +7 %: an audit)
    ("deepseek-v3", "lora", "fp32"), ("qwen3-moe", "lora", "fp32"), ("qwen3-moe", "lora", "amp-fp16"),
    ("qwen3-moe", "full", "amp-fp16")])
def test_the_simulated_step_holds_what_the_cpu_step_holds(name, method, precision):
    src = ModelSource(name, _configs()[name], "causal-lm", "local")
    job = JobSpec(model=name, method=method, seq_len=128, micro_batch=2, precision=precision)
    sim = simulate_step(job, src, SimTarget(device="cpu"))
    real = measure_cpu_step(job, src)
    assert sim.peak_allocated_bytes == pytest.approx(real.peak_allocated_bytes, rel=1e-4)


def test_a_boolean_mask_reaches_a_gpu_kernel_as_its_float_copy():
    """On a CUDA target the memory-efficient and cuDNN kernels get the float mask torch makes
    (and keeps for the backward), in q's dtype."""
    seen = []
    real = torch.ops.aten._scaled_dot_product_efficient_attention

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, q, k, v, bias, *a, **kw):
            seen.append(None if bias is None else bias.dtype)
            return real(q, k, v, bias, *a, **kw)

    q = torch.randn(1, 2, 16, 8, dtype=torch.float16, device="meta")
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool, device="meta").tril()
    target = AttentionTarget(device="cuda", compute_capability=(7, 5), prefer="sdpa")
    with device_semantics(target) as ops:
        orig, torch.ops.aten._scaled_dot_product_efficient_attention = \
            torch.ops.aten._scaled_dot_product_efficient_attention, Spy()
        try:
            torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        finally:
            torch.ops.aten._scaled_dot_product_efficient_attention = orig
    assert ops.kernels_used == {"efficient": 1} and seen == [torch.float16]


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_a_decoder_mask_of_ones_the_model_makes_is_skipped_as_in_the_real_step(precision):
    """BART's decoder makes ``torch.ones(B, T)`` as its mask when the batch has none; with real
    values transformers sees it all ones and hands SDPA no mask (its causal kernel), but on fake
    tensors it cannot read them and built the B×1×T×T mask, and each decoder layer's kernel kept
    a float copy of it: +1.07 % on this step (fp32), +2·B·T²·4 bytes (an audit). Unpadded
    batches (plan's) answer as for no mask; a batch with a mask keeps it."""
    cfg = T.BartConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                       vocab_size=512, max_position_embeddings=256)
    src = ModelSource("bart", cfg, "seq2seq-lm", "local")
    job = JobSpec(model="bart", method="full", seq_len=64, micro_batch=2, precision=precision)
    sim = simulate_step(job, src, SimTarget(device="cpu"))
    real = measure_cpu_step(job, src)
    assert sim.peak_allocated_bytes == pytest.approx(real.peak_allocated_bytes, rel=1e-4)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_padded_batch_holds_what_the_cpu_step_holds(method):
    """A padded batch (JobSpec.padded: the collator pads to the longest sample) carries a mask
    transformers cannot skip; its real values (the last row half padding) reach the CPU step,
    fake ones the simulation: the same bytes."""
    cfg = T.LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                        max_position_embeddings=512)
    src = ModelSource("llama", cfg, "causal-lm", "local")
    job = JobSpec(model="llama", method=method, seq_len=128, micro_batch=2, precision="fp32",
                  padded="longest")
    sim = simulate_step(job, src, SimTarget(device="cpu"))
    real = measure_cpu_step(job, src)
    assert sim.peak_allocated_bytes == pytest.approx(real.peak_allocated_bytes, rel=1e-4)
    unpadded = measure_cpu_step(job.replace(padded="none"), src)
    assert real.peak_allocated_bytes > unpadded.peak_allocated_bytes  # the mask costs


def test_a_padded_batch_hands_sdpa_a_mask_on_the_gpu():
    """On the GPU target a padded batch's SDPA gets the mask: a float copy per layer, a kernel
    that takes a mask, and k and v repeated to the query heads (no enable_gqa with a mask) —
    Llama-3.1-8B LoRA at 4 × 2,048 without checkpointing: +4.0 GiB (66.82 → 70.82 allocated).
    One row is its own longest: nothing padded, no mask."""
    cfg = T.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                        max_position_embeddings=512)
    src = ModelSource("llama", cfg, "causal-lm", "local")
    target = SimTarget(device="cuda", compute_capability=(8, 0))
    layers, batch, seq, head_dim = 2, 2, 256, 16

    def peak(**kw):
        job = JobSpec(model="llama", method="full", seq_len=seq, micro_batch=batch,
                      precision="amp-bf16", grad_ckpt="off", **kw)
        sim = simulate_step(job, src, target)
        return sim.peak_allocated_bytes, sim.sdpa_kernels

    (plain, k0), (padded, k1) = peak(), peak(padded="longest")
    assert k0 == {"flash": layers} and k1 == {"efficient": layers}
    mask_copy = batch * seq * seq * 2  # bf16, each layer's
    repeated = 2 * batch * (8 - 2) * seq * head_dim * 2  # k and v, 6 more heads, bf16
    assert padded - plain >= layers * (mask_copy + repeated)
    one = JobSpec(model="llama", method="full", seq_len=seq, micro_batch=1, precision="amp-bf16",
                  grad_ckpt="off")
    assert simulate_step(one.replace(padded="longest"), src, target).peak_allocated_bytes == \
        simulate_step(one, src, target).peak_allocated_bytes
    # padded to a fixed length (padding="max_length"): one row carries padding too
    assert simulate_step(one.replace(padded="always"), src, target).peak_allocated_bytes > \
        simulate_step(one, src, target).peak_allocated_bytes
    # flash-attention-2 unpads instead: no float mask, no repeated heads (what it holds
    # instead: tests/memory/test_flash_varlen.py)
    fa2, k2 = peak(padded="longest", attention="flash-attention-2")
    assert k2 == {"flash": layers} and fa2 < padded


def test_padded_and_packed_rows_exclude_each_other():
    from trainfit.job import JobError

    with pytest.raises(JobError, match="--padded longest with --padding-free"):
        JobSpec(model="m", padded="longest", padding_free=True)
    with pytest.raises(JobError, match="--padded always with --packing"):
        JobSpec(model="m", padded="always", packing=True)
    with pytest.raises(JobError, match="padded"):
        JobSpec(model="m", padded="yes")


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_a_padded_seq2seq_batch_masks_the_encoder_not_the_decoder(precision):
    """A padded seq2seq batch carries the encoder's mask (DataCollatorForSeq2Seq gives no
    decoder mask): its encoder and cross-attention masks are built, while BART's decoder still
    makes a mask of ones, which transformers skips — the simulation had built it (a review:
    +1.05 % on this step)."""
    cfg = T.BartConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                       vocab_size=512, max_position_embeddings=256)
    src = ModelSource("bart", cfg, "seq2seq-lm", "local")
    job = JobSpec(model="bart", method="full", seq_len=64, micro_batch=2, precision=precision,
                  padded="longest")
    sim = simulate_step(job, src, SimTarget(device="cpu"))
    real = measure_cpu_step(job, src)
    assert sim.peak_allocated_bytes == pytest.approx(real.peak_allocated_bytes, rel=1e-4)
