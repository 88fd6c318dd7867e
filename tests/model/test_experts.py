"""Mixture-of-experts models: simulated like the real step, and MFU over the active parameters."""

import pytest
import torch

from trainfit.job import JobError, JobSpec
from trainfit.memory.cpu_truth import measure_cpu_step
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.experts import inactive_expert_params, inactive_expert_params_of
from trainfit.model.source import ModelSource
from trainfit.model.workload import build_model_on_meta
from trainfit.speed.predict import model_flops_per_token

HIDDEN, FFN, LAYERS, EXPERTS, TOP_K = 64, 128, 2, 4, 2


@pytest.fixture(scope="module")
def tiny_mixtral():
    from transformers import MixtralConfig

    cfg = MixtralConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                        num_local_experts=EXPERTS, num_experts_per_tok=TOP_K,
                        max_position_embeddings=256)
    return ModelSource("tiny-mixtral", cfg, "causal-lm", "local")


def test_inactive_experts_are_the_unrouted_share_of_the_stacked_experts(tiny_mixtral):
    # gate, up and down projections of every expert: 3 × hidden × ffn each, k of E used
    per_layer = EXPERTS * 3 * HIDDEN * FFN
    expected = LAYERS * per_layer * (EXPERTS - TOP_K) // EXPERTS
    assert inactive_expert_params_of(tiny_mixtral) == expected
    model, _ = build_model_on_meta(JobSpec(model="t", seq_len=32, precision="fp32"), tiny_mixtral)
    assert inactive_expert_params(model, tiny_mixtral.config) == expected


def test_dense_models_have_no_inactive_parameters(tiny_llama):
    assert inactive_expert_params_of(tiny_llama) == 0


def test_model_flops_count_the_active_parameters_only(tiny_mixtral):
    cfg = tiny_mixtral.config
    dense = model_flops_per_token(cfg, 1_000_000, 1_000_000, 64, True)
    moe = model_flops_per_token(cfg, 1_000_000, 1_000_000, 64, True, inactive_params=400_000)
    assert dense - moe == pytest.approx(6.0 * 400_000)


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_grouped_experts_simulate_as_the_real_cpu_step(tiny_mixtral, precision):
    """transformers runs the experts through torch's grouped GEMM; torch's fake kernel of it
    takes bf16 only, so fp32 (and autocast's fp32 expert weights) used to fail the simulation.
    The simulated peak is the real step's on this CPU."""
    job = JobSpec(model="t", seq_len=32, micro_batch=2, precision=precision)
    sim = simulate_step(job, tiny_mixtral, SimTarget(device="cpu"))
    real = measure_cpu_step(job, tiny_mixtral)
    assert real.peak_allocated_bytes > real.base_bytes
    assert sim.peak_allocated_bytes == pytest.approx(real.peak_allocated_bytes, rel=0.01)


def test_grouped_experts_simulate_for_a_cuda_target_in_every_precision(tiny_mixtral):
    peaks = {p: simulate_step(JobSpec(model="t", seq_len=32, micro_batch=2, precision=p,
                                      method="lora"), tiny_mixtral).peak_allocated_bytes
             for p in ("fp32", "amp-fp16", "amp-bf16")}
    # fp32 expert weights and activations: the largest step of the three
    assert peaks["fp32"] > peaks["amp-bf16"] > 0
    assert peaks["amp-fp16"] > 0


def test_a_configuration_transformers_cannot_build_is_one_clear_error(tiny_llama):
    import copy

    cfg = copy.deepcopy(tiny_llama.config)
    cfg.pad_token_id = cfg.vocab_size + 5  # nn.Embedding asserts on it
    bad = ModelSource("bad-pad", cfg, "causal-lm", "local")
    with pytest.raises(JobError, match="cannot build this model from its configuration") as e:
        build_model_on_meta(JobSpec(model="t", seq_len=32), bad)
    assert "pad_token_id" in e.value.hint
    assert torch.get_default_device().type == "cpu"  # the meta device context was left


def test_qlora_keeps_stacked_experts_16_bit_as_transformers_5_and_says_so(tiny_mixtral):
    """transformers 5's 4-bit conversion replaces nn.Linear layers only; Mixtral's experts are
    stacked 3-D tensors and stay bf16 — a Mixtral-8x7B QLoRA plan read 86 GiB on an A100-80GB
    with nothing saying why (2026-11-30)."""
    from trainfit.hardware.gpus import find_gpu
    from trainfit.model.experts import stacked_expert_params_of
    from trainfit.plan.grid import plan
    from trainfit.render.words import plan_notes

    stacked = LAYERS * EXPERTS * 3 * HIDDEN * FFN
    assert stacked_expert_params_of(tiny_mixtral) == stacked
    job = JobSpec(model="t", seq_len=32, micro_batch=1, grad_accum=1, precision="bf16-true",
                  method="qlora", grad_ckpt="off")
    res = plan(job, tiny_mixtral, find_gpu("a10g"), verify=False, ladder=False)
    assert res.assumptions.experts_16bit_params == stacked
    note = plan_notes(res)[0]
    assert note.startswith("QLoRA of a mixture-of-experts model") and "stay 16-bit" in note
    # the simulated weights hold them at 2 bytes each, beside the 4-bit attention projections
    sim = simulate_step(job, tiny_mixtral)
    assert sim.breakdown["parameters"] >= 2 * stacked
    lora = plan(job.replace(method="lora", quant=None), tiny_mixtral, find_gpu("a10g"),
                verify=False, ladder=False)
    assert lora.assumptions.experts_16bit_params == 0
