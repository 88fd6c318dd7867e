"""The frozen base's dtype under AMP (``base_dtype``): transformers 5 loads the checkpoint's dtype."""

import copy

import pytest
import torch

from trainfit.job import JobSpec
from trainfit.model.source import ModelSource
from trainfit.model.workload import build_model_on_meta


def _frozen_dtypes(job: JobSpec, source: ModelSource) -> set[torch.dtype]:
    model, _ = build_model_on_meta(job, source)
    return {p.dtype for p in model.parameters() if not p.requires_grad}


def test_auto_follows_the_config_dtype(tiny_llama):
    job = JobSpec(model="t", method="lora", precision="amp-bf16")
    # a config naming no dtype: the autocast dtype (the dtype=bfloat16 + bf16=True recipe)
    assert _frozen_dtypes(job, tiny_llama) == {torch.bfloat16}
    fp32_ckpt = copy.deepcopy(tiny_llama.config)
    fp32_ckpt.dtype = torch.float32  # e.g. GPT-2's checkpoint: from_pretrained keeps it fp32
    src = ModelSource("t32", fp32_ckpt, "causal-lm", "local")
    assert _frozen_dtypes(job, src) == {torch.float32}


def test_explicit_base_dtype_wins(tiny_llama):
    job = JobSpec(model="t", method="lora", precision="amp-bf16", base_dtype="fp32")
    assert _frozen_dtypes(job, tiny_llama) == {torch.float32}
    # adapters stay fp32 (PEFT's autocast_adapter_dtype) whatever the base
    model, _ = build_model_on_meta(job, tiny_llama)
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}


def test_fp32_outputs_upcast_the_heads_logits(tiny_llama):
    """``fp32_outputs`` (transformers < 4.46, torchtune 0.1): the head's logits become fp32
    before the loss; without it transformers 5 returns them in the weights' dtype."""
    from trainfit.job import JobError
    from trainfit.model.init import init_weights

    ids = torch.randint(0, tiny_llama.config.vocab_size, (1, 8))
    for fp32, want in ((False, torch.bfloat16), (True, torch.float32)):
        job = JobSpec(model="t", method="lora", precision="bf16-true", fp32_outputs=fp32)
        model, _ = build_model_on_meta(job, tiny_llama)
        init_weights(model, "cpu", 0)
        out = model(input_ids=ids, labels=ids)
        assert out.logits.dtype == want and out.loss.dtype == torch.float32
    # a module with no output head and no adapter around it (e.g. a classifier): one clear error
    from trainfit.model.workload import _upcast_logits

    with pytest.raises(JobError, match="--fp32-outputs"):
        _upcast_logits(torch.nn.Linear(2, 2), tiny_llama)
