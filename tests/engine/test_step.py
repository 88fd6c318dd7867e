"""train_step under DDP: one gradient all-reduce per optimizer step, whatever the accumulation."""

import pytest
import torch

from trainfit.engine.step import train_step


class _Quadratic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) ** 2).mean()


def _batches(n: int):
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(3, 4, generator=g)} for _ in range(n)]


def test_ddp_all_reduces_once_per_step_and_matches_plain(one_rank_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    plain = _Quadratic()
    ddp_inner = _Quadratic()
    ddp_inner.load_state_dict(plain.state_dict())
    ddp = DDP(ddp_inner)
    calls: list[int] = []

    def count(_state, bucket):
        calls.append(1)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, count)
    w = [0.25] * 4
    for model in (plain, ddp):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = train_step(model, opt, iter(_batches(4)), grad_accum=4, loss_weights=w)
        assert out.micro_steps == 4
    assert len(calls) == 1  # one bucket, all-reduced in the last micro-step only (no_sync before)
    for a, b in zip(plain.parameters(), ddp_inner.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-7)


def test_ddp_refuses_fewer_micro_batches_than_announced(one_rank_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_Quadratic())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="2 micro-batches arrived, 3 announced"):
        train_step(ddp, opt, iter(_batches(2)), grad_accum=3)


@pytest.mark.parametrize("precision, elem", [("bf16-true", 2), ("amp-bf16", 2), ("fp32", 4)])
def test_the_output_is_released_before_backward_unless_the_loop_keeps_it(tiny_llama, precision,
                                                                         elem):
    """HF Trainer's compute_loss returns the loss alone: the logits (B·S·V in the head's dtype)
    are gone when the backward starts, and the backward peak does not hold them. A hand-written
    loop that keeps ``out`` holds exactly them on top, and ``out.loss`` (the scalar before the
    division by the accumulation: one 512-byte block)."""
    from trainfit.job import JobSpec
    from trainfit.memory.simulate import simulate_step

    b, s = 4, 128
    kw = dict(model="x", method="lora", seq_len=s, micro_batch=b, grad_accum=1,
              precision=precision, grad_ckpt="off")
    released = simulate_step(JobSpec(**kw), tiny_llama)
    kept = simulate_step(JobSpec(**kw, output_in_backward=True), tiny_llama)
    logits = b * s * tiny_llama.config.vocab_size * elem
    assert kept.peak_phase == released.peak_phase == "backward"
    assert kept.peak_allocated_bytes - released.peak_allocated_bytes == logits + 512
