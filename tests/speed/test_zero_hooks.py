"""DeepSpeed ZeRO's hooks as host time: what is counted on a model, and a plan row's step."""

from __future__ import annotations

import pytest

from trainfit.job import JobSpec
from trainfit.speed import zero_hooks
from trainfit.speed.zero_hooks import HookCounts, hook_counts, hook_ops


def _llama(layers: int, method: str = "full", r: int = 8, ckpt: bool = False):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256))
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=r, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
    return model


def test_counts_follow_the_persistence_threshold_and_the_recomputed_layers():
    """Per decoder layer a Llama has 13 modules (the layer, attention, 4 projections, MLP, 3
    projections, the activation, 2 norms) and 7 matrices above 10 × hidden elements (the norms'
    64 persist); the root, model, embedding, final norm, rotary embedding and head run outside
    the layers, the embedding and head partitioned; the layer list never runs (a container)."""
    c = hook_counts(_llama(3), 64, checkpointed=False)
    assert c == HookCounts(modules=3 * 13 + 6, recomputed_modules=0, partitioned=3 * 7 + 2,
                           recomputed_partitioned=0, trainable=3 * 9 + 3)
    ck = hook_counts(_llama(3), 64, checkpointed=True)
    assert (ck.recomputed_modules, ck.recomputed_partitioned) == (3 * 13, 3 * 7)
    assert ck.module_calls == 2 * c.modules + 3 * 13 and ck.fetches == 2 * 23 + 21
    # LoRA r8 on q, v: A is 8 × 64 = 512 elements ≤ 640, persistent; at r16 q's A and B and
    # v's A hold 1,024, partitioned, v's B 32 × 16 = 512 (two key-value heads of 16) persists
    r8, r16 = (hook_counts(_llama(2, "lora", r), 64, checkpointed=False) for r in (8, 16))
    assert r8.partitioned == 2 * 7 + 2 and r16.partitioned == 2 * 7 + 2 + 2 * 3
    assert r8.trainable == r16.trainable == 2 * 2 * 2
    # PEFT's lora_A / lora_B / lora_dropout dicts never run; what they hold does, and the
    # wrapped base_layer: 4 more running modules per adapted projection (2 a layer), and the
    # PeftModel around the model (its LoraModel is stepped over)
    assert r8.modules == 2 * 13 + 6 + 2 * 2 * 4 + 1


def test_hook_ops_are_linear_in_the_counts():
    c = HookCounts(modules=10, recomputed_modules=4, partitioned=6, recomputed_partitioned=2,
                   trainable=5)
    assert hook_ops(c, 3) == pytest.approx(
        zero_hooks.ZERO3_OPS_PER_MICRO_STEP + zero_hooks.ZERO3_OPS_PER_MODULE_CALL * 24
        + zero_hooks.ZERO3_OPS_PER_FETCH * 14 + zero_hooks.ZERO3_OPS_PER_TRAINABLE * 5)
    assert hook_ops(c, 2) == pytest.approx(
        zero_hooks.ZERO2_OPS_PER_MICRO_STEP + zero_hooks.ZERO2_OPS_PER_TRAINABLE * 5)
    assert hook_ops(c, 1) == 0.0


def test_a_zero3_row_pays_its_hooks_as_host_time(tiny_llama, monkeypatch):
    """The same step under ZeRO-3 and FSDP: ZeRO-3's host time holds DeepSpeed's hooks
    (``framework_host_s``, the counts at the H100 host's reference op with the host
    measurement off), so it is no longer read faster than FSDP on a launch-bound step (an audit:
    a 4-layer Mixtral read 36 % faster under ZeRO-3)."""
    from trainfit.hardware.gpus import find_gpu
    from trainfit.plan.grid import plan
    from trainfit.plan.row_speed import framework_host_s, zero_hook_counts
    from trainfit.speed.host_timing import H100_HOST_REFERENCE_OP_S

    monkeypatch.setenv("TRAINFIT_HOST_MEASURE", "0")
    base = dict(model="tiny-llama", seq_len=64, micro_batch=2, grad_accum=1, ranks=2,
                precision="amp-bf16", grad_ckpt="off")
    rows, results = {}, {}
    for sharding in ("zero3", "fsdp", "zero2"):
        job = JobSpec(**base, sharding=sharding)
        results[sharding] = plan(job, tiny_llama, find_gpu("a100-80gb-sxm"), verify=False,
                                 ladder=False)
        rows[sharding] = results[sharding].rows[0]
    z3 = rows["zero3"].speed
    counts = zero_hook_counts(JobSpec(**base, sharding="zero3"), tiny_llama)
    assert counts is not None and counts.trainable == 3 * 9 + 3
    expected = hook_ops(counts, 3) * H100_HOST_REFERENCE_OP_S
    assert z3.framework_host_s == pytest.approx(expected)
    assert framework_host_s(JobSpec(**base, sharding="zero3"), tiny_llama) == pytest.approx(expected)
    assert z3.host_fb_s >= expected and z3.bound == "launch-bound"
    assert rows["fsdp"].speed.framework_host_s is None
    assert z3.tokens_per_s < rows["fsdp"].speed.tokens_per_s
    assert rows["zero2"].speed.framework_host_s == pytest.approx(
        hook_ops(counts, 2) * H100_HOST_REFERENCE_OP_S)
    assert results["zero3"].to_dict()["configs"][0]["framework_host_s"] == pytest.approx(expected)
    assert results["fsdp"].to_dict()["configs"][0]["framework_host_s"] is None
    # and said, with its figure, where the plan's notes say what the speed is
    from trainfit.render.words import plan_notes

    said = [n for n in plan_notes(results["zero3"]) if "DeepSpeed ZeRO-3's hooks" in n]
    assert len(said) == 1 and f"{expected * 1e3:,.0f} ms of host time" in said[0]
    assert not any("DeepSpeed" in n for n in plan_notes(results["fsdp"]))
