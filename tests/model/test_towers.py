"""A multimodal model planned as AutoModelForCausalLM builds it: Gemma-3's vision tower held in
memory, not run on text batches, not in model FLOPs; its language model cut and extrapolated in
depth like any other."""

import dataclasses

import pytest

from trainfit.job import JobSpec
from trainfit.memory.simulate import SimTarget, simulate_step


def _gemma3(layers=4, **text):
    from transformers import Gemma3Config

    from trainfit.model.source import source_of

    cfg = Gemma3Config(
        text_config={"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": layers,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
                     "vocab_size": 1000, "sliding_window": 32, **text},
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                       "vision_use_head": False},
        mm_tokens_per_image=4, image_token_index=999, boi_token_index=997, eoi_token_index=998)
    return source_of("g3", cfg, "causal-lm", "local")


def _text_only(src):
    """The same language model without the tower (Gemma3ForCausalLM of its text_config)."""
    return dataclasses.replace(src, composite=None, note="")


def _built(src):
    import torch

    from trainfit.model.attention_impl import auto_model_class
    from trainfit.model.source import build_config

    with torch.device("meta"):
        return auto_model_class("causal-lm").from_config(build_config(src))


def test_the_tower_is_what_the_language_model_and_its_head_do_not_hold():
    from torch.nn import Embedding

    from trainfit.model.towers import tower_parameters, tower_params, tower_params_of

    src = _gemma3()
    whole, text = _built(src), _built(_text_only(src))
    assert type(whole).__name__ == "Gemma3ForConditionalGeneration"
    assert type(text).__name__ == "Gemma3ForCausalLM"
    n = sum(p.numel() for p in whole.parameters()) - sum(p.numel() for p in text.parameters())
    assert n > 0
    # of them, the matmul weights (MFU's N): no lookup table (SigLIP's position embedding), no
    # norm or bias
    tower = {id(p) for p in tower_parameters(whole)}
    lookups = {id(m.weight) for m in whole.modules() if isinstance(m, Embedding)}
    matmul = sum(p.numel() for p in whole.parameters()
                 if id(p) in tower and p.dim() >= 2 and id(p) not in lookups)
    assert 0 < matmul < n
    assert tower_params(whole) == tower_params_of(src) == matmul
    assert tower_params(text) == tower_params_of(_text_only(src)) == 0


@pytest.mark.parametrize("kw", [
    {"method": "full", "precision": "fp32"},
    {"method": "lora", "precision": "bf16-true", "grad_ckpt": "full"},
], ids=["full-fp32", "lora-bf16-ckpt"])
def test_the_simulated_step_matches_the_same_step_run_on_this_cpu(kw):
    """The composite model's text step really run on this CPU: the simulation's allocated peak
    is the measured one (the tower's weights held, and nothing else of it)."""
    from trainfit.memory.cpu_truth import measure_cpu_step

    src = _gemma3()
    job = JobSpec(model="g3", seq_len=64, micro_batch=2, **kw)
    sim = simulate_step(job, src, SimTarget(device="cpu"))
    real = measure_cpu_step(job, src)
    assert sim.peak_allocated_bytes == pytest.approx(real.peak_allocated_bytes, rel=0.01)


def test_the_tower_adds_its_weights_and_nothing_else():
    """Full fine-tuning in fp32: the tower's parameters train in name only (no gradient reaches
    them, so AdamW makes no state): the peak is the language model's plus the tower's fp32
    weights (each tensor rounded up to the allocator's 512-byte blocks)."""

    from trainfit.model.towers import tower_params

    src = _gemma3()
    job = JobSpec(model="g3", seq_len=64, micro_batch=2, method="full", precision="fp32")
    whole = simulate_step(job, src, SimTarget(device="cuda"))
    text = simulate_step(job, _text_only(src), SimTarget(device="cuda"))
    model = _built(src)
    run = {id(p) for p in model.get_decoder().parameters()} | {
        id(p) for p in model.get_output_embeddings().parameters()}
    tower = [p for p in model.parameters() if id(p) not in run]
    weights = sum(-(-p.numel() * 4 // 512) * 512 for p in tower)
    held = {id(b) for b in model.get_decoder().buffers()}
    buffers = sum(-(-b.numel() * b.element_size() // 512) * 512 for b in model.buffers()
                  if id(b) not in held)
    assert sum(p.numel() for p in tower if p.dim() >= 2) >= tower_params(model) > 0
    assert whole.breakdown["parameters"] - text.breakdown["parameters"] == weights
    # the tower's buffers (SigLIP's position ids, int64) are the only other difference
    assert whole.breakdown["buffers"] - text.breakdown["buffers"] == buffers > 0
    assert whole.peak_allocated_bytes - text.peak_allocated_bytes == weights + buffers
    assert whole.breakdown["optimizer"] == text.breakdown["optimizer"]
    assert whole.breakdown["gradients"] == text.breakdown["gradients"]
    assert whole.total_params - text.total_params == sum(p.numel() for p in tower)


def test_model_flops_leave_the_tower_out(monkeypatch):
    """The tower runs for no token: the plan's model FLOPs per token (and so its MFU) are the
    language model's own, with or without the tower held."""
    from trainfit.hardware.gpus import find_gpu
    from trainfit.plan.grid import plan

    monkeypatch.setenv("TRAINFIT_WORKERS", "1")
    src, gpu = _gemma3(), find_gpu("a100-80gb")
    job = JobSpec(model="g3", method="full", seq_len=64, micro_batch=2, precision="bf16-true",
                  grad_ckpt="off")
    whole = plan(job, src, gpu, verify=False).rows[0]
    text = plan(job, _text_only(src), gpu, verify=False).rows[0]
    assert whole.speed.model_flops_per_token == pytest.approx(text.speed.model_flops_per_token,
                                                              rel=1e-9)
    assert whole.memory.total_params > text.memory.total_params


def test_the_language_model_is_cut_inside_the_multimodal_config_and_extrapolates():
    """Gemma-3 with alternating sliding and global layers (a period of 2): the small stacks are
    cut inside text_config, the tower kept, and the depth extrapolation of the composite model
    is the 14-layer simulation's allocated peak to the byte."""
    from trainfit.memory.allocator import replay
    from trainfit.memory.extrapolate import fit_group
    from trainfit.model.depth import layer_pattern, with_layers

    src = _gemma3(layers=14, layer_types=["sliding_attention", "full_attention"] * 7)
    pat = layer_pattern(src, (2, 3))
    assert (pat.prefix, pat.period) == (0, 2)
    small = with_layers(src, 4)
    assert small.config.num_hidden_layers == 4 and small.composite.text_config is small.config
    assert small.config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert src.config.num_hidden_layers == 14  # the source itself untouched
    assert small.composite.vision_config.num_hidden_layers == 2
    job = JobSpec(model="g3", seq_len=64, micro_batch=2, grad_accum=1, precision="amp-bf16",
                  method="lora", attention="eager")
    target = SimTarget(device="cuda")
    model = fit_group(job, src, target, high_batch=4, rows=[(4, False)])
    assert [p.layers for p in model.points] == [4, 6, 4, 6]
    full = simulate_step(job.replace(micro_batch=4, effective_batch=None), src, target,
                         record_events=True)
    rep = replay(full.events, full.event_streams)
    pred = model.predict(4, accumulating=False)
    assert pred["total_params"] == full.total_params
    assert pred["peak_allocated_bytes"] == rep.peak_allocated_bytes


def test_a_language_models_own_parameters_are_no_tower(tiny_t5):
    """T5's encoder is outside get_decoder(), a classifier's head outside
    get_output_embeddings(): both run, neither is a tower."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoModelForSequenceClassification, BertConfig

    from trainfit.model.towers import tower_parameters

    with torch.device("meta"):
        t5 = AutoModelForSeq2SeqLM.from_config(tiny_t5.config)
        bert = AutoModelForSequenceClassification.from_config(BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
            vocab_size=500))
    assert tower_parameters(t5) == [] and tower_parameters(bert) == []
    assert tower_parameters(_built(_gemma3()))  # the check above can fail


def test_zero_makes_states_for_the_tower_too():
    """DeepSpeed's ZeRO steps one flat fp32 partition of every trainable parameter, zero-filled
    where no gradient came: the tower's states are made (per rank, 1/n of fp32 master + two
    fp32 Adam states), where torch's AdamW makes none."""
    from trainfit.memory.predict import predict_memory

    src = _gemma3()
    job = JobSpec(model="g3", seq_len=64, micro_batch=2, method="full", precision="amp-bf16",
                  ranks=2, sharding="zero2")
    whole = predict_memory(job, src, None)
    text = predict_memory(job, _text_only(src), None)
    # two fp32 Adam states on the flat partition (memory/zero_step.py), ÷ 2 ranks; the fp32
    # master partition, ÷ 2 ranks
    from trainfit.model.towers import tower_parameters

    sizes = [p.numel() for p in tower_parameters(_built(src))]
    states = 8 * sum(sizes) // 2
    master = 4 * sum(sizes) // 2
    got = whole.breakdown["optimizer"] - text.breakdown["optimizer"]
    assert got == pytest.approx(states + master, rel=0.001)
    assert got / sum(sizes) > 5.9  # not the master alone (2 bytes a parameter)
    # a single process: no state for it
    one = JobSpec(model="g3", seq_len=64, micro_batch=2, method="full", precision="amp-bf16")
    assert predict_memory(one, src, None).breakdown["optimizer"] == \
        predict_memory(one, _text_only(src), None).breakdown["optimizer"]


def test_ddp_over_a_tower_that_gets_no_gradient_says_how_to_run_it():
    from trainfit.memory.predict import predict_memory

    src = _gemma3()
    job = JobSpec(model="g3", seq_len=64, micro_batch=2, method="full", precision="bf16-true",
                  ranks=2)
    notes = " ".join(predict_memory(job, src, None).model_notes)
    assert "find_unused_parameters=True" in notes
    notes = " ".join(predict_memory(job, _text_only(src), None).model_notes)
    assert "find_unused_parameters" not in notes


def test_lora_default_targets_are_the_language_models():
    """peft's table has no entry for the multimodal config (gemma3): its language model's
    (gemma3_text: q_proj, v_proj) are the defaults, which peft matches in the tower too."""
    from trainfit.model.workload import build_model_on_meta

    model, info = build_model_on_meta(JobSpec(model="g3", method="lora"), _gemma3())
    assert info.lora_target_modules == ["q_proj", "v_proj"]
    adapted = [n for n, m in model.named_modules() if hasattr(m, "lora_A")]
    assert any("vision_tower" in n for n in adapted)
    assert any("language_model" in n for n in adapted)


def test_a_language_model_alone_holds_no_tower():
    """Llama-4: AutoModelForCausalLM builds the language model alone from the multimodal
    config: the same parameters as from its text_config, no tower."""
    import torch
    from transformers import AutoModelForCausalLM, Llama4Config

    from trainfit.model.source import source_of
    from trainfit.model.towers import holds_towers, tower_params_of

    cfg = Llama4Config(
        text_config={"hidden_size": 128, "intermediate_size": 256, "intermediate_size_mlp": 256,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 32, "vocab_size": 1000, "num_local_experts": 4},
        vision_config={"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128})
    src = source_of("l4", cfg, "causal-lm", "local")
    assert src.composite is cfg and not holds_towers(src) and tower_params_of(src) == 0
    with torch.device("meta"):
        whole = AutoModelForCausalLM.from_config(cfg)
        text = AutoModelForCausalLM.from_config(cfg.text_config)
    assert type(whole) is type(text)
    assert sum(p.numel() for p in whole.parameters()) == sum(p.numel() for p in text.parameters())


def test_llama_3_2_visions_cross_attention_layers_take_no_part_in_a_text_step():
    """An audit: Mllama's language model skips its cross-attention decoder layers whole when a
    step has no image (``MllamaTextModel.forward``), yet their 26 % of the parameters were given
    optimizer states (+10.4 % allocated on a tiny full fine-tune against this CPU's step; +13 %
    of Llama-3.2-11B-Vision's states).  Now they are left out like a tower: the CPU step's peak
    to 4 bytes, and out of model FLOPs."""
    from transformers import MllamaConfig

    from trainfit.memory.cpu_truth import measure_cpu_step
    from trainfit.model.source import source_of
    from trainfit.model.towers import inactive_params_of

    cfg = MllamaConfig(
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                     "cross_attention_layers": [1], "pad_token_id": 1},
        vision_config={"hidden_size": 32, "image_size": 32, "patch_size": 8,
                       "intermediate_size": 64, "num_hidden_layers": 1, "num_global_layers": 1,
                       "attention_heads": 2, "vision_output_dim": 64,
                       "intermediate_layers_indices": [0]})
    src = source_of("mllama", cfg, "causal-lm", "local")
    job = JobSpec(model="m", seq_len=64, micro_batch=2, precision="fp32", method="full")
    sim = simulate_step(job, src, SimTarget(device="cpu")).peak_allocated_bytes
    assert sim == pytest.approx(measure_cpu_step(job, src).peak_allocated_bytes, rel=1e-5)
    # the cross-attention layer's matmul weights: q, k, v, o and the MLP's three
    h, kv, ffn = 64, 2 * 16, 128
    assert inactive_params_of(src) == h * h * 2 + h * kv * 2 + 3 * h * ffn
