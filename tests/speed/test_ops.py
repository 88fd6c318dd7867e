"""The one kernel counter the host measurement and the CPU's per-op cost both use."""

from __future__ import annotations

import torch

from trainfit.speed.ops import KernelCounter


def test_counts_kernels_and_views_only_while_active():
    x = torch.randn(4, 8)
    counter = KernelCounter()
    with counter:
        y = x + 1          # new storage: a kernel
        y.mul_(2)          # in place: a kernel
        y.view(8, 4)       # shares y's storage: a view
        y.t()              # a view
        counter.active = False
        y * 3              # not counted
    assert (counter.kernels, counter.views) == (2, 2)


def test_a_first_training_step_counts_each_kernel_once():
    """forward + first backward of two Linear layers (no gradient yet, so nothing accumulates):
    2 addmm and the loss's sum; backward: ones_like (the seed), 3 mm (two weight gradients, one
    input gradient: the first layer's input needs none) and 2 bias sums = 9 kernels; the
    transposes, expand and views launch none."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8)
    counter = KernelCounter()
    with counter:
        model(x).sum().backward()
    assert counter.kernels == 9
    assert counter.views == 16
    model.zero_grad(set_to_none=True)
    off = KernelCounter(active=False)
    with off:
        model(x).sum().backward()
    assert (off.kernels, off.views) == (0, 0)
