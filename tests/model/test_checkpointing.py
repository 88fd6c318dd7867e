"""Selective activation checkpointing's op policy (model/checkpointing.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from trainfit.model.checkpointing import _policy


class _Op:
    """An op known by name only, as flash-attn's are where it is not installed."""

    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


class _Ctx:
    is_recompute = False


@pytest.mark.parametrize("name", ["flash_attn::_flash_attn_forward",
                                  "flash_attn::_flash_attn_varlen_forward",
                                  "trainfit::flash_varlen_attention"])
def test_attention_outside_aten_is_saved(name):
    """flash-attn's forward ops (transformers' flash_attention_2) and the simulation's stand-in
    for its varlen kernel are saved as SDPA's attention is; their backward ops and plain
    elementwise ops are recomputed."""
    from collections import defaultdict

    policy = _policy(defaultdict(int))
    assert policy(_Ctx(), _Op(name)) == CheckpointPolicy.MUST_SAVE
    assert policy(_Ctx(), _Op("flash_attn::_flash_attn_varlen_backward")) \
        == CheckpointPolicy.PREFER_RECOMPUTE
    assert policy(_Ctx(), torch.ops.aten.mul.Tensor) == CheckpointPolicy.PREFER_RECOMPUTE
    assert policy(_Ctx(), torch.ops.aten._scaled_dot_product_flash_attention.default) \
        == CheckpointPolicy.MUST_SAVE


def test_selective_checkpointing_keeps_the_varlen_kernels_output():
    """A padded batch under flash_attention_2 with selective checkpointing: the varlen
    stand-in's outputs are saved, not recomputed — its forward runs once per layer, and the
    step holds no less than with full checkpointing."""
    import transformers as T

    from trainfit.job import JobSpec
    from trainfit.memory.simulate import SimTarget, simulate_step
    from trainfit.model.source import ModelSource
    from trainfit.speed.ops import OpRecorder

    cfg = T.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                        max_position_embeddings=512)
    forwards = {}
    for ckpt in ("full", "selective"):
        recorder = OpRecorder()
        spec = JobSpec(model="m", method="full", seq_len=64, micro_batch=3, precision="amp-bf16",
                       attention="flash-attention-2", padded="longest", grad_ckpt=ckpt)
        simulate_step(spec, ModelSource("m", cfg, "causal-lm", "local"),
                      SimTarget(device="cuda", compute_capability=(8, 0)), op_hook=recorder)
        forwards[ckpt] = sum(op.name == "flash_varlen_attention" for op in recorder.ops)
    # full checkpointing recomputes each layer's attention in the backward; selective keeps it
    assert forwards == {"full": 4, "selective": 2}
