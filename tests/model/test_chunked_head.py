"""The chunked head's loss as a compiled step keeps it (trainfit.model.chunked_head)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _saved_by_the_partition(x: torch.Tensor, t: torch.Tensor) -> list[tuple[tuple, torch.dtype]]:
    """What AOTAutograd's min-cut partitioner, with Inductor's decompositions, keeps from the
    forward of ``cross_entropy(x.float(), t)`` for its backward (shape, dtype of each)."""
    from functorch.compile import aot_function, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    saved: list[tuple[tuple, torch.dtype]] = []

    def forward_graph(gm, _example):
        out = next(n for n in gm.graph.nodes if n.op == "output")
        for node in out.args[0][1:]:  # the first output is the loss itself
            val = node.meta["val"]
            saved.append((tuple(val.shape), val.dtype))
        return gm

    fn = aot_function(lambda a, b: F.cross_entropy(a.float(), b, ignore_index=-100,
                                                    reduction="sum"),
                      fw_compiler=forward_graph, bw_compiler=lambda gm, _: gm,
                      partition_fn=min_cut_rematerialization_partition,
                      decompositions=select_decomp_table())
    fn(x, t).backward()
    return saved


def test_a_compiled_chunk_loss_keeps_the_chunk_and_two_values_per_row():
    n, v = 64, 1000
    x = torch.randn(n, v, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, v, (n,))
    saved = _saved_by_the_partition(x, t)
    big = [s for s in saved if s[0] == (n, v)]
    assert big == [((n, v), torch.bfloat16)]  # the chunk itself: no fp32 log-softmax
    assert sorted(s for s in saved if s[0] == (n, 1)) == [((n, 1), torch.float32)] * 2


def test_the_stand_in_keeps_what_the_partition_keeps_and_computes_the_loss():
    from trainfit.model.chunked_head import _PartitionedCrossEntropy

    torch.manual_seed(0)
    n, v = 64, 1000
    x = torch.randn(n, v, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, v, (n,))
    t[:4] = -100
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: kept.append(s) or s, lambda s: s):
        loss = _PartitionedCrossEntropy.apply(x, t, -100)
    assert max(k.numel() * k.element_size() for k in kept) == x.numel() * x.element_size()
    assert sum(k.numel() * k.element_size() for k in kept) < 1.1 * x.numel() * x.element_size()
    ref = F.cross_entropy(x.float(), t, ignore_index=-100, reduction="sum")
    assert loss.item() == pytest.approx(ref.item(), rel=2e-2)  # per-row sums in bf16
    loss.backward()
    (grad,) = torch.autograd.grad(ref, x)
    assert x.grad.dtype == torch.bfloat16
    assert torch.allclose(x.grad.float(), grad.float(), atol=2e-2)
