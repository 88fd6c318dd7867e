"""A padded batch under transformers' flash_attention_2 (memory/flash_varlen.py) and the
transient buffers of FlashAttention-2's backward (memory/kernel_workspace.py)."""

from __future__ import annotations

import types

import pytest
import torch
import transformers as T
from transformers import modeling_flash_attention_utils as fa_utils
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from trainfit.job import JobSpec
from trainfit.memory.flash_varlen import attend_rows, unpadded_attention
from trainfit.memory.kernel_workspace import flash_backward_workspace
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.memory.tracker import LiveBytesTracker
from trainfit.model.batch import make_batch, row_lengths
from trainfit.model.source import ModelSource

BATCH, HEADS, KV_HEADS, SEQ, DIM = 3, 8, 2, 64, 16
MODULE = types.SimpleNamespace(is_causal=True, training=True, num_key_value_groups=HEADS // KV_HEADS)


def _inputs() -> tuple[torch.Tensor, ...]:
    """q, k, v as a layer hands them to attention: B × H × S × D transposes of its projections'
    B × S × H × D outputs (leaves, so that their gradients are made)."""
    torch.manual_seed(0)
    q = torch.randn(BATCH, SEQ, HEADS, DIM, requires_grad=True)
    k = torch.randn(BATCH, SEQ, KV_HEADS, DIM, requires_grad=True)
    v = torch.randn(BATCH, SEQ, KV_HEADS, DIM, requires_grad=True)
    return q, k, v


def _transformers_call(q, k, v, mask2d, monkeypatch):
    """transformers' own padded flash_attention_2 path (``_flash_attention_forward``: its
    unpad, its pad) with :func:`attend_rows` as the variable-length kernel."""
    def varlen(qu, ku, vu, cu_seqlens_q, cu_seqlens_k, causal, **_):
        rows = tuple((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist())
        return attend_rows(sdpa_attention_forward, MODULE, qu, ku, vu, rows)

    def process(**kw):
        return {"causal": kw["is_causal"]}

    monkeypatch.setattr(fa_utils, "lazy_import_flash_attention", lambda *a, **kw: (
        (None, varlen, None, fa_utils._pad_input, fa_utils._unpad_input), (process, None)))
    return fa_utils._flash_attention_forward(q, k, v, mask2d, SEQ, is_causal=True)


def _measure(fn, mask2d: torch.Tensor) -> tuple[int, int, int, torch.Tensor]:
    """(peak bytes in the forward, bytes alive after it with the output, peak in the backward)
    of ``fn`` run on this CPU's real tensors, and its output; the batch's mask is on the device
    already."""
    q, k, v = _inputs()
    with LiveBytesTracker() as tracker:
        tracker.track(mask2d, "buffers")
        tracker.set_phase("forward")
        out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        forward_peak, alive = tracker.peak.peak_bytes, tracker.current_bytes
        tracker.set_phase("backward")
        out.backward(torch.ones_like(out))
        return forward_peak, alive, tracker.peak.peak_bytes, out.detach()


def test_the_unpadded_call_holds_what_transformers_padded_flash_attention_2_holds(monkeypatch):
    """The simulation's unpad → varlen kernel → pad against transformers' own, the kernel the
    same on both sides: the same output, the same bytes held for the backward and at each
    peak — while a row is padded (the last row's second half, as make_batch pads)."""
    rows = row_lengths(BATCH, SEQ, "longest")
    mask2d = make_batch(ModelSource("m", T.LlamaConfig(vocab_size=100), "causal-lm", "local"),
                        BATCH, SEQ, padded="longest")["attention_mask"]
    assert tuple(mask2d.sum(-1).tolist()) == rows == (SEQ, SEQ, SEQ // 2)

    def ours(q, k, v):
        return unpadded_attention(sdpa_attention_forward, MODULE, q, k, v, rows)[0]

    def theirs(q, k, v):
        return _transformers_call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  mask2d, monkeypatch)

    mine, real = _measure(ours, mask2d), _measure(theirs, mask2d)
    assert torch.allclose(mine[3], real[3], atol=1e-6)
    # the runs of equal rows are joined by a cat: a transient copy of the output the real
    # varlen kernel (one output) does not make — in the forward only, and only that
    n_out = sum(rows) * HEADS * DIM * 4

    assert real[0] <= mine[0] <= real[0] + n_out
    assert mine[1] == real[1]  # held for the backward: the same
    assert mine[2] == real[2]


def test_flash_backward_workspace_is_flash_attention_2s():
    """mha_bwd's buffers: softmax_d and dq_accum in fp32 (sequence rounded to 128, head
    dimension to 32), and k, v gradients at the query heads where there are fewer key heads."""
    q = torch.empty(2, 32, 2048, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 8, 2048, 128, dtype=torch.bfloat16, device="meta")
    softmax_d, dq_accum, dk, dv = flash_backward_workspace(q, k)
    assert softmax_d == 2 * 32 * 2048 * 4
    assert dq_accum == 2 * q.numel() * 2  # fp32: twice the bf16 q
    assert dk == dv == q.numel() * 2
    assert len(flash_backward_workspace(q, q)) == 2  # as many key heads: no expanded grads
    odd = torch.empty(1, 4, 100, 72, dtype=torch.bfloat16, device="meta")
    assert flash_backward_workspace(odd, odd)[1] == 1 * 128 * 4 * 96 * 4


def test_a_padded_batch_under_flash_attention_2_holds_its_output_twice():
    """On the GPU target, a padded batch under flash_attention_2 (no checkpointing) holds more
    than the unpadded one by at least each layer's padded attention output (o_proj's input
    beside the kernel's n-token output) less what its q, k, v and output lose to the padding;
    its kernels run once per run of equal rows."""
    layers = 2
    cfg = T.LlamaConfig(hidden_size=HEADS * DIM, intermediate_size=256, num_hidden_layers=layers,
                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=1000,
                        max_position_embeddings=512)
    src = ModelSource("llama", cfg, "causal-lm", "local")
    target = SimTarget(device="cuda", compute_capability=(8, 0))

    def sim(padded):
        job = JobSpec(model="llama", method="full", seq_len=SEQ, micro_batch=BATCH,
                      precision="amp-bf16", grad_ckpt="off", attention="flash-attention-2",
                      padded=padded)
        return simulate_step(job, src, target)

    plain, padded = sim("none"), sim("longest")
    assert plain.sdpa_kernels == {"flash": layers}
    assert padded.sdpa_kernels == {"flash": 2 * layers}  # rows of 64, then the row of 32
    out = BATCH * SEQ * HEADS * DIM * 2  # bf16
    lost = (SEQ // 2) * (2 * HEADS + 2 * KV_HEADS) * DIM * 2  # q, out, k, v: the padding's
    assert padded.peak_allocated_bytes - plain.peak_allocated_bytes >= layers * (out - lost)


@pytest.mark.parametrize("kv_heads", [KV_HEADS, HEADS])
def test_the_flash_backward_workspace_is_booked(kv_heads):
    """The tracker books FlashAttention-2's backward buffers for the op's duration: a step
    whose peak is that backward is higher by them."""
    from trainfit.memory import kernel_workspace

    q = torch.empty(1, HEADS, 4096, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, kv_heads, 4096, 64, dtype=torch.bfloat16, device="meta")
    op = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
    assert kernel_workspace.WORKSPACES[op]((q, q, k)) == flash_backward_workspace(q, k)
    tracker = LiveBytesTracker()
    tracker.set_phase("backward")
    tracker._transient(flash_backward_workspace(q, k))
    assert tracker.peak.peak_bytes == sum(flash_backward_workspace(q, k))
    assert tracker.current_bytes == 0
