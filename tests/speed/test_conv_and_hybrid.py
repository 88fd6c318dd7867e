"""Convolutions in the speed model: FLOPs of the backward by groups, and timed as no attention."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from trainfit.speed.ops import _conv_backward_flops


class _Args(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.args = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.startswith("convolution_backward"):
            self.args = args
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("groups", [1, 64])
def test_conv_backward_costs_twice_the_forward_whatever_the_groups(groups):
    """torch's registry counts the weight gradient of a depthwise conv as a dense one (65× the
    forward here; Mamba's 3,328 channels: 3,328×): an audit found granite-4.0-h at 25 tokens/s."""
    x = torch.randn(2, 64, 128, requires_grad=True)
    conv = torch.nn.Conv1d(64, 64, 4, groups=groups, padding=3)
    with FlopCounterMode(display=False) as counter:
        y = conv(x)
    forward = counter.get_total_flops()
    rec = _Args()
    with rec:
        y.sum().backward()
    assert _conv_backward_flops(rec.args) == 2 * forward
    if groups == 1:  # the dense case: as the registry counts it
        with FlopCounterMode(display=False) as counter:
            conv(x).sum().backward()
        assert counter.get_total_flops() == 3 * forward


def test_mfu_counts_attention_only_in_softmax_attention_layers():
    """PaLM's 12·L·H·Q·T over the layers that compute T×T scores: a hybrid's linear-attention
    (Mamba) layers and pure Mamba add none (an audit: MFU counted granite-4.0-h's 40 layers)."""
    from types import SimpleNamespace

    from transformers import MambaConfig

    from trainfit.speed.predict import model_flops_per_token

    def attention(cfg):
        with_t = model_flops_per_token(cfg, 10**6, 10**6, 1024, full_finetune=True)
        return with_t - model_flops_per_token(cfg, 10**6, 10**6, 0, full_finetune=True)

    base = dict(hidden_size=256, vocab_size=100, num_hidden_layers=4, num_attention_heads=4)
    hybrid = SimpleNamespace(**base, layer_types=["linear_attention"] * 3 + ["full_attention"])
    dense = SimpleNamespace(**base)
    assert attention(dense) == 12 * 4 * 4 * 64 * 1024
    assert attention(hybrid) == attention(dense) / 4
    assert attention(MambaConfig(hidden_size=256, num_hidden_layers=4, vocab_size=100)) == 0
