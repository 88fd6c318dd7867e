"""plan says where the pick's step time goes, and whose parameters each rank's optimizer steps:
every trainable one under DDP, the rank's shard under FSDP (why a sharded step can be faster)."""

from __future__ import annotations

import pytest

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec


@pytest.fixture(scope="module")
def picks():
    from transformers import LlamaConfig

    from trainfit.model.source import ModelSource
    from trainfit.plan.grid import plan

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                      max_position_embeddings=512)
    src = ModelSource("mid-llama", cfg, "causal-lm", "local")
    out = {}
    for sharding in ("none", "fsdp"):
        res = plan(JobSpec(model="mid-llama", seq_len=256, micro_batch=4, grad_accum=2,
                           precision="amp-bf16", grad_ckpt="off", method="full", ranks=2,
                           sharding=sharding), src, find_gpu("a100-80gb"), verify=False)
        out[sharding] = res
    return out


def test_the_optimizer_step_is_part_of_the_step_and_the_shard_halves_it(picks):
    sp = {k: r.rows[r.recommended_index].speed for k, r in picks.items()}
    for s in sp.values():
        assert 0 < s.optimizer_s < s.step_time_s
    # the fused AdamW of 2-rank FSDP reads and writes half the bytes of DDP's (device-bound at
    # this size: ~95 M parameters, 28 B each)
    assert sp["fsdp"].optimizer_s == pytest.approx(sp["none"].optimizer_s / 2, rel=0.05)


def test_the_words_name_the_parts_and_whose_parameters(picks):
    from trainfit.render.plan_words import plan_words, step_time_words

    ddp, fsdp = step_time_words(picks["none"]), step_time_words(picks["fsdp"])
    assert "2 micro-step(s) of forward + backward" in ddp
    assert "every trainable parameter" in ddp and "autocast casts every fp32 weight" in ddp
    assert "its 1/2 shard of the trainable parameters (fsdp)" in fsdp and "autocast" not in fsdp
    sp = picks["fsdp"].rows[picks["fsdp"].recommended_index].speed
    assert f"({sp.optimizer_s:.3g} s, " in fsdp
    assert plan_words(picks["fsdp"])["step_time_words"] == fsdp
