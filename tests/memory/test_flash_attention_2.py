"""``--attention flash-attention-2`` is transformers' flash_attention_2: FlashAttention-2 takes
fewer key/value heads than query heads and no T×T mask. Under it (then spelt sdpa-flash)
Falcon-7B's multi-query layers were simulated with torch's math kernel (one key head, no
enable_gqa; its always-built mask) — fp32 probabilities kept per layer that FlashAttention-2
never makes (an audit, 2026-12-06); ``sdpa-flash`` is torch's SDPA preferring its flash kernel,
which keeps both (a review)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import transformers as T

from trainfit.job import JobSpec
from trainfit.memory.sdpa_choice import AttentionTarget
from trainfit.memory.semantics import device_semantics
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.source import ModelSource


@contextlib.contextmanager
def _flash_calls() -> Iterator[list[bool]]:
    """The ``is_causal`` of each call that reaches aten's flash kernel meanwhile."""
    causal: list[bool] = []
    real = torch.ops.aten._scaled_dot_product_flash_attention

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, q, k, v, dropout_p, is_causal, *a, **kw):
            causal.append(is_causal)
            return real(q, k, v, dropout_p, is_causal, *a, **kw)

    torch.ops.aten._scaled_dot_product_flash_attention = Spy()
    try:
        yield causal
    finally:
        torch.ops.aten._scaled_dot_product_flash_attention = real


def _call(fa2: bool, *, kv_heads: int = 1, mask: torch.Tensor | None = None,
          decoder_only: bool = True) -> tuple[dict[str, int], list[bool]]:
    """One SDPA call as transformers' Falcon makes it: (kernels used, is_causal each got)."""
    q = torch.randn(1, 8, 16, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.randn(1, kv_heads, 16, 64, dtype=torch.bfloat16, device="meta")
    target = AttentionTarget(device="cuda", compute_capability=(8, 0), prefer="sdpa-flash",
                             flash_attention_2=fa2, decoder_only=decoder_only)
    with device_semantics(target) as ops, _flash_calls() as causal:
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
    return ops.kernels_used, causal


CAUSAL = torch.ones(1, 1, 16, 16, dtype=torch.bool, device="meta").tril()


def test_falcons_multi_query_call_runs_flash_under_flash_attention_2():
    assert _call(False, mask=CAUSAL)[0] == {"math": 1}  # torch's SDPA, flash first: unchanged
    assert _call(True, mask=CAUSAL) == ({"flash": 1}, [True])


def test_a_dropped_mask_is_causal_only_in_a_decoder_only_model():
    assert _call(True, kv_heads=8, mask=CAUSAL, decoder_only=False) == ({"flash": 1}, [False])
    assert _call(False, kv_heads=8, mask=CAUSAL)[0] == {"efficient": 1}


def test_a_float_mask_is_kept():
    """ALiBi or a position bias: values FlashAttention-2 cannot take, so not dropped."""
    bias = torch.zeros(1, 8, 16, 16, dtype=torch.bfloat16, device="meta")
    assert _call(True, kv_heads=8, mask=bias)[0] == {"efficient": 1}


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
    for attention in ("sdpa-flash", "flash-attention-2"):
        job = JobSpec(model="falcon", method=method, seq_len=seq, micro_batch=batch,
                      precision="bf16-true", attention=attention)
        sims[attention] = simulate_step(job, src, SimTarget(device="cuda",
                                                            compute_capability=(8, 0)))
    assert sims["sdpa-flash"].sdpa_kernels == {"math": layers}
    assert sims["flash-attention-2"].sdpa_kernels == {"flash": layers}
    # the math kernel keeps each layer's fp32 probabilities (and more) for its backward
    probs = layers * batch * heads * seq * seq * 4
    assert sims["sdpa-flash"].peak_allocated_bytes \
        - sims["flash-attention-2"].peak_allocated_bytes >= probs


def _mistral(**extra) -> ModelSource:
    cfg = T.MistralConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                          max_position_embeddings=512, **extra)
    return ModelSource("mistral", cfg, "causal-lm", "local")


def test_a_sliding_window_model_keeps_no_mask_nor_repeated_heads_under_flash_attention_2():
    """Past its window transformers hands SDPA a mask, and with a mask repeats k and v to the
    query heads (use_gqa_in_sdpa): FlashAttention-2 makes neither (a review: the repeated heads
    stayed, (8/2 − 1) × k and v a layer)."""
    src, seq, batch, layers = _mistral(sliding_window=64), 256, 2, 2
    peaks, kernels = {}, {}
    for attention in ("sdpa-flash", "flash-attention-2"):
        job = JobSpec(model="mistral", method="full", seq_len=seq, micro_batch=batch,
                      precision="bf16-true", attention=attention)
        sim = simulate_step(job, src, SimTarget(device="cuda", compute_capability=(8, 0)))
        peaks[attention], kernels[attention] = sim.breakdown["activations"], sim.sdpa_kernels
    assert kernels == {"sdpa-flash": {"efficient": layers}, "flash-attention-2": {"flash": layers}}
    repeated = layers * 2 * (8 - 2) * batch * seq * 16 * 2  # k and v, 6 more heads of 16, bf16
    mask_copies = layers * batch * seq * seq * 2  # each layer's float copy of the mask
    assert peaks["sdpa-flash"] - peaks["flash-attention-2"] >= repeated + mask_copies


def test_causality_under_flash_attention_2_comes_from_the_module():
    """A bidirectional encoder planned as a masked LM (BertForMaskedLM, task causal-lm) with a
    padded batch: its mask dropped, its self-attention stays non-causal (a review: is_causal was
    set from the task)."""
    cfg = T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, vocab_size=512, max_position_embeddings=128)
    src = ModelSource("bert", cfg, "causal-lm", "local")
    job = JobSpec(model="bert", method="full", seq_len=64, micro_batch=2, precision="bf16-true",
                  attention="flash-attention-2")

    def batch(*_a, **_k):
        ids = torch.zeros(2, 64, dtype=torch.long)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    with _flash_calls() as seen:
        simulate_step(job, src, SimTarget(device="cuda", compute_capability=(8, 0)),
                      batch_fn=batch)
    assert seen and not any(seen)


def test_train_tune_and_doctor_refuse_flash_attention_2():
    from trainfit.job import JobError
    from trainfit.job.step_options import refuse_other_model_code

    job = JobSpec(model="t", attention="flash-attention-2")
    for command in ("train", "tune", "doctor"):
        with pytest.raises(JobError, match=r"transformers' SDPA"):
            refuse_other_model_code(job, command)


def test_a_model_transformers_runs_without_flash_attention_2_is_refused():
    from trainfit.job import JobError

    cfg = T.T5Config(d_model=64, d_ff=128, num_layers=1, num_heads=4, vocab_size=256)
    src = ModelSource("t5", cfg, "seq2seq-lm", "local")
    job = JobSpec(model="t5", method="full", seq_len=32, micro_batch=1,
                  attention="flash-attention-2")
    with pytest.raises(JobError, match="no flash_attention_2 for T5ForConditionalGeneration"):
        simulate_step(job, src, SimTarget(device="cuda", compute_capability=(8, 0)))


def test_a_model_without_sdpa_runs_flash_attention_2_through_the_interface():
    """Gemma-2 has no SDPA implementation (softcapping) but transformers runs its
    flash_attention_2: built eager, its config then says sdpa, so each layer reaches the patched
    function as FlashAttention-2 (a review: it was refused as "has no SDPA implementation")."""
    cfg = T.Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         vocab_size=512, max_position_embeddings=256, sliding_window=64)
    src = ModelSource("gemma2", cfg, "causal-lm", "local")
    job = JobSpec(model="gemma2", method="full", seq_len=128, micro_batch=2,
                  precision="bf16-true", attention="flash-attention-2")
    sim = simulate_step(job, src, SimTarget(device="cuda", compute_capability=(8, 0)))
    assert sim.sdpa_kernels == {"flash": 2}
    eager = simulate_step(job.replace(attention="eager"), src,
                          SimTarget(device="cuda", compute_capability=(8, 0)))
    assert not eager.sdpa_kernels
    probs = 2 * 2 * 4 * 128 * 128 * 2  # layers × batch × heads × T × T, bf16: eager keeps them
    assert eager.peak_allocated_bytes - sim.peak_allocated_bytes >= probs


def test_a_model_whose_flash_attention_2_is_its_own_module_is_refused():
    from trainfit.job import JobError

    cfg = T.GPTJConfig(n_embd=64, n_layer=1, n_head=4, rotary_dim=8, vocab_size=256,
                       n_positions=128)
    src = ModelSource("gptj", cfg, "causal-lm", "local")
    job = JobSpec(model="gptj", method="full", seq_len=32, micro_batch=1,
                  attention="flash-attention-2")
    with pytest.raises(JobError, match="GPTJForCausalLM's flash_attention_2 through an "
                       "attention module of its own") as err:
        simulate_step(job, src, SimTarget(device="cuda", compute_capability=(8, 0)))
    assert "--attention eager" in err.value.hint


def _gemma3_composite() -> ModelSource:
    cfg = T.Gemma3Config(
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "vocab_size": 512, "max_position_embeddings": 256, "sliding_window": 64},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=4)
    return ModelSource("gemma3", cfg.text_config, "causal-lm", "local", composite=cfg)


def test_a_composite_model_is_refused_where_a_part_has_no_flash_attention_2(monkeypatch):
    """transformers hands a string attn_implementation to every sub-config, and each sub-model's
    __init__ refuses flash_attention_2 where its class has none: the outer class alone was
    checked (a review). Gemma-3's vision tower stands in for such a part."""
    from trainfit.job import JobError

    src = _gemma3_composite()
    job = JobSpec(model="gemma3", method="full", seq_len=64, micro_batch=1,
                  precision="bf16-true", attention="flash-attention-2")
    target = SimTarget(device="cuda", compute_capability=(8, 0))
    assert simulate_step(job, src, target).sdpa_kernels == {"flash": 2}  # the text layers
    monkeypatch.setattr(T.SiglipVisionModel, "_supports_flash_attn", False)
    with pytest.raises(JobError, match=r"no flash_attention_2 for SiglipVisionModel \(inside "
                       r"Gemma3ForConditionalGeneration\)") as err:
        simulate_step(job, src, target)
    assert "--attention sdpa" in err.value.hint


def test_flash_attention_2_runs_16_bit_on_ampere_or_newer():
    """FlashAttention-2 takes fp16 and bf16 tensors, on compute capability 8.0 and up: its fp32
    rows and a T4 were planned (the T4's with torch's math kernel), runs that raise (a new-user
    pass, 2026-12-06)."""
    from trainfit.hardware.gpus import find_gpu, generic_gpu
    from trainfit.job import JobError
    from trainfit.plan.inputs import check_flash_attention_gpu, grid_precisions

    with pytest.raises(JobError, match="fp16 and bf16 tensors only") as err:
        JobSpec(model="t", precision="fp32", attention="flash-attention-2")
    assert "--precision amp-bf16" in err.value.hint
    job = JobSpec(model="t", attention="flash-attention-2")
    assert grid_precisions(find_gpu("a100-80gb"), job) == (["amp-bf16", "bf16-true"],
                                                            ["amp-fp16", "fp32"])
    assert grid_precisions(find_gpu("a100-80gb"), job.replace(attention="sdpa"))[1] == \
        ["amp-fp16"]
    for name in ("t4", "v100"):
        with pytest.raises(JobError, match=r"Ampere or newer \(8\.0\+\)"):
            check_flash_attention_gpu(job, find_gpu(name))
        check_flash_attention_gpu(job.replace(attention="sdpa"), find_gpu(name))
    for name in ("a10g", "rtx-4090", "h100", "rtx-5090"):
        check_flash_attention_gpu(job, find_gpu(name))
    check_flash_attention_gpu(job, generic_gpu(16))  # its compute capability unknown: planned


def test_fp32_hidden_states_reach_flash_attention_2_as_16_bit():
    """QLoRA after prepare_model_for_kbit_training (fp32 norms) without autocast hands attention
    fp32 q, k and v; transformers casts them to the model's 16-bit dtype for FlashAttention-2
    (get_target_dtype, fa_peft_integration_check), and a model's own flash class does the same.
    They were simulated as fp32 through SDPA: torch's math kernel, T×T probabilities kept (a
    review, 2026-12-06). torch's own SDPA choice keeps that math kernel (fp32 with GQA: flash
    takes no fp32, the memory-efficient kernel no GQA)."""
    target = SimTarget(device="cuda", compute_capability=(8, 0))
    falcon = T.FalconConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=8,
                            vocab_size=1000, multi_query=True, parallel_attn=True)
    for src in (_mistral(), ModelSource("falcon", falcon, "causal-lm", "local")):
        sims = {}
        for attention in ("sdpa", "flash-attention-2"):
            job = JobSpec(model=src.name, method="qlora", seq_len=256, micro_batch=2,
                          precision="bf16-true", attention=attention, kbit_prepared=True,
                          grad_ckpt="off")
            sims[attention] = simulate_step(job, src, target)
        assert sims["sdpa"].sdpa_kernels == {"math": 2}
        assert sims["flash-attention-2"].sdpa_kernels == {"flash": 2}
        probs = 2 * 2 * 8 * 256 * 256 * 4  # layers × batch × heads × T², fp32: math keeps them
        assert sims["sdpa"].peak_allocated_bytes - \
            sims["flash-attention-2"].peak_allocated_bytes >= probs


def test_flash_attention_2_rows_of_a_generic_card_are_simulated_ampere_or_newer():
    """A generic card's compute capability is unknown: its non-bf16 rows were simulated at 7.5,
    where flash-attention-2 fell to torch's math kernel (a review); FlashAttention-2 runs on 8.0
    and newer only."""
    from trainfit.hardware.gpus import generic_gpu
    from trainfit.memory.predict import UNKNOWN_CC_OF_A_CARD, target_for

    card = generic_gpu(16)
    assert target_for(card, "amp-fp16").compute_capability == UNKNOWN_CC_OF_A_CARD
    assert target_for(card, "amp-fp16", "flash-attention-2").compute_capability >= (8, 0)


def test_a_fp32_target_for_flash_attention_2_is_refused():
    """transformers hands FlashAttention-2 the model's dtype where there is no autocast; a
    float32 one flash-attn refuses, and so does the plan."""
    from types import SimpleNamespace

    from trainfit.job import JobError
    from trainfit.memory.flash_attention_2 import flash_attention_2_inputs

    module = torch.nn.Module()
    module.config = SimpleNamespace(_is_quantized=True, dtype=torch.float32)
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(JobError, match="fp16 and bf16 only"):
        flash_attention_2_inputs(module, q, q, q)
    module.config.dtype = torch.bfloat16
    assert {t.dtype for t in flash_attention_2_inputs(module, q, q, q)} == {torch.bfloat16}
