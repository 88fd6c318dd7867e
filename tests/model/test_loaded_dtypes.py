"""What from_pretrained(dtype=...) keeps in fp32 is what the meta build keeps (model/loaded_dtypes),
and full fine-tuning in bf16-true under FSDP, which FSDP2 cannot run with fp32 trainable weights,
is refused when asked and left out of plan's grid otherwise."""

from __future__ import annotations

import pytest
import torch

from trainfit.job import JobError, JobSpec
from trainfit.model.source import ModelSource


@pytest.fixture(scope="module")
def tiny_ernie_moe() -> ModelSource:
    """A MoE whose router weight is on transformers' strict keep-in-fp32 list (bf16 too)."""
    from transformers import Ernie4_5_MoeConfig

    cfg = Ernie4_5_MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             vocab_size=512, moe_num_experts=4, moe_k=2,
                             max_position_embeddings=256)
    return ModelSource("tiny-ernie", cfg, "causal-lm", "local")


def test_the_meta_build_keeps_what_the_loader_keeps(tmp_path, tiny_ernie_moe):
    """Against a real save_pretrained → from_pretrained(dtype=bfloat16) round trip."""
    from transformers import AutoModelForCausalLM

    from trainfit.model.workload import build_model_on_meta

    AutoModelForCausalLM.from_config(tiny_ernie_moe.config).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    want = {n for n, p in loaded.named_parameters() if p.dtype == torch.float32}
    assert want  # the router
    job = JobSpec(model="t", seq_len=64, micro_batch=1, method="full", precision="bf16-true")
    model, _ = build_model_on_meta(job, tiny_ernie_moe)
    got = {n for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert got == want


def test_bf16_true_fsdp_with_fp32_trainable_weights_is_refused_and_not_planned(tiny_ernie_moe,
                                                                               tiny_llama):
    """FSDP2's fully_shard asserts one dtype for a layer's trainable weights: a review saw the
    whole plan end in its AssertionError. Asked, one line with the fix; in the grid, left out."""
    from trainfit.model.workload import build_model_on_meta
    from trainfit.plan.inputs import fsdp_keeps_fp32_weights

    job = JobSpec(model="t", seq_len=64, micro_batch=1, ranks=2, sharding="fsdp", method="full")
    with pytest.raises(JobError, match=r"keeps 1 trainable weights in fp32 .* FSDP2's "
                       r"fully_shard needs one dtype") as e:
        build_model_on_meta(job.replace(precision="bf16-true"), tiny_ernie_moe)
    assert e.value.hint.startswith("use --precision amp-bf16")
    build_model_on_meta(job.replace(precision="amp-bf16"), tiny_ernie_moe)  # fp32 masters: runs
    assert fsdp_keeps_fp32_weights(job, tiny_ernie_moe)
    assert not fsdp_keeps_fp32_weights(job.replace(method="lora"), tiny_ernie_moe)  # frozen
    assert not fsdp_keeps_fp32_weights(job.replace(sharding="none", ranks=1), tiny_ernie_moe)
    assert not fsdp_keeps_fp32_weights(job, tiny_llama)


@pytest.mark.parametrize("kept, fp32", [(["lm_head"], False), (["lm_head", "embed_tokens"], True)])
def test_a_tied_head_stays_tied(kept, fp32):
    """A tied head is the embedding: cast only where each of its names is kept, and as one
    tensor (the loader re-ties the head to the embedding; a review: a new Parameter for one name
    untied them)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from trainfit.model.loaded_dtypes import keep_fp32_as_loaded

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                      tie_word_embeddings=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model._keep_in_fp32_modules_strict = kept  # read by transformers' _get_dtype_plan
    keep_fp32_as_loaded(model, torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert (model.lm_head.weight.dtype == torch.float32) == fp32
