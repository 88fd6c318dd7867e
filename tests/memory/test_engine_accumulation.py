"""The autograd engine's sum of two gradients of one tensor: in place on a real step (CPU or GPU:
``InputBuffer::accumulate`` adds into the buffer it holds the last reference to), out of place
under any dispatch mode — so the tracker books it as the real step holds it (memory/tracker.py
``_accumulation``). Mamba's recurrent scan sums a [B, d_inner, L, d_state] gradient L times: the
simulation held one such block more than the real step, +6.8 … +9.5 % (an audit)."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from trainfit.job import JobSpec
from trainfit.memory.cpu_truth import measure_cpu_step
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.memory.tracker import LiveBytesTracker
from trainfit.model.source import ModelSource


@pytest.mark.parametrize("extra", [dict(precision="fp32"), dict(precision="fp32", grad_ckpt="full"),
                                   dict(precision="amp-bf16")])
def test_mamba_step_holds_what_the_cpu_step_holds(extra):
    cfg = T.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=512, state_size=8,
                        expand=2, conv_kernel=4, time_step_rank=4)
    src = ModelSource("mamba", cfg, "causal-lm", "local")
    job = JobSpec(model="mamba", method="full", seq_len=64, micro_batch=2, attention="eager",
                  **extra)
    sim = simulate_step(job, src, SimTarget(device="cpu"))
    real = measure_cpu_step(job, src)
    # checkpointed: 3 RNG-state tensors (5 KB each) the real run saves outside the tracker's view
    assert real.peak_allocated_bytes * 0.998 <= sim.peak_allocated_bytes \
        <= real.peak_allocated_bytes * 1.001


def test_a_summed_gradient_takes_the_block_of_the_one_it_replaces():
    """x used twice: its two gradients (2 and 3 per element) meet in the engine's buffer; the
    real engine adds the second into the first, so the backward holds x and two x-sized
    gradients, not three (four x-sized blocks before this was booked)."""
    n = 1 << 16
    x = torch.randn(n, requires_grad=True)
    with LiveBytesTracker(block_bytes=1) as tracker:
        tracker.track(x, "parameters")
        tracker.set_phase("forward")
        loss = (x * 2.0).sum() + (x * 3.0).sum()
        tracker.set_phase("backward")
        loss.backward()
    assert torch.equal(x.grad, torch.full((n,), 5.0))
    scalars = 2 * 4  # the losses' 0-d tensors
    assert tracker.phase_peaks["forward@first"] == 2 * 4 * n + scalars
    assert tracker.phase_peaks["backward@first"] == 3 * 4 * n + scalars
    assert tracker.live_breakdown()["gradients"] + tracker.live_breakdown()["temporaries"] \
        >= 4 * n  # x.grad, the sum's block, is still booked
