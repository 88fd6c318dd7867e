"""A padded batch under transformers' flash_attention_2 (memory/flash_varlen.py) and the
transient buffers of FlashAttention-2's backward (memory/kernel_workspace.py)."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from transformers import modeling_flash_attention_utils as fa_utils

from trainfit.job import JobSpec
from trainfit.memory import flash_varlen
from trainfit.memory.flash_varlen import unpadded_attention
from trainfit.memory.kernel_workspace import flash_backward_workspace
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.memory.tracker import LiveBytesTracker
from trainfit.model.batch import make_batch, row_lengths
from trainfit.model.source import ModelSource

BATCH, HEADS, KV_HEADS, SEQ, DIM = 3, 8, 2, 64, 16


def _inputs() -> tuple[torch.Tensor, ...]:
    """q, k, v as a layer hands them to attention: B × H × S × D transposes of its projections'
    B × S × H × D outputs (leaves, so that their gradients are made)."""
    torch.manual_seed(0)
    q = torch.randn(BATCH, SEQ, HEADS, DIM, requires_grad=True)
    k = torch.randn(BATCH, SEQ, KV_HEADS, DIM, requires_grad=True)
    v = torch.randn(BATCH, SEQ, KV_HEADS, DIM, requires_grad=True)
    return q, k, v


def _cpu_varlen(q, k, v, rows, dropout_p=0.0, causal=True, scale=None):
    """A variable-length kernel on this CPU (n × heads × D in and out): SDPA row by row."""
    outs, start = [], 0
    for length in rows:
        part = [t[start:start + length].transpose(0, 1)[None] for t in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*part, is_causal=causal,
                                                               enable_gqa=True)
        outs.append(out[0].transpose(0, 1))
        start += length
    return torch.cat(outs)


def _transformers_call(q, k, v, mask2d, monkeypatch):
    """transformers' own padded flash_attention_2 path (``_flash_attention_forward``: its
    unpad, its pad) with :func:`_cpu_varlen` as the variable-length kernel."""
    def varlen(qu, ku, vu, cu_seqlens_q, cu_seqlens_k, causal, **_):
        rows = tuple((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist())
        return _cpu_varlen(qu, ku, vu, rows, causal=causal)

    def process(**kw):
        return {"causal": kw["is_causal"]}

    monkeypatch.setattr(fa_utils, "lazy_import_flash_attention", lambda *a, **kw: (
        (None, varlen, None, fa_utils._pad_input, fa_utils._unpad_input), (process, None)))
    return fa_utils._flash_attention_forward(q, k, v, mask2d, SEQ, is_causal=True)


def _llama(layers: int = 2) -> T.LlamaConfig:
    """A tiny grouped-query Llama: HEADS query heads, KV_HEADS key/value heads of DIM."""
    return T.LlamaConfig(hidden_size=HEADS * DIM, intermediate_size=256,
                         num_hidden_layers=layers, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, vocab_size=1000,
                         max_position_embeddings=512)


def _sim(cfg, *, padded: str = "longest", task: str = "causal-lm", micro_batch: int = BATCH,
         op_hook=None, **job):
    """The simulated step of a full fine-tune of ``cfg`` under flash_attention_2 on an
    Ampere GPU target, amp-bf16, at SEQ tokens (``op_hook``: the simulation's op recorder)."""
    spec = JobSpec(model="m", method="full", seq_len=SEQ, micro_batch=micro_batch,
                   precision="amp-bf16", attention="flash-attention-2", padded=padded, **job)
    return simulate_step(spec, ModelSource("m", cfg, task, "local"),
                         SimTarget(device="cuda", compute_capability=(8, 0)), op_hook=op_hook)


def _backward_peak(forward, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """How far the tracker's peak rises in the backward of ``forward(q, k, v)`` (an attention
    op's output) above what was alive before it, beyond the gradients of q, k and v."""
    with LiveBytesTracker() as tracker:
        for t in (q, k, v):
            tracker.track(t, "activations")
        tracker.set_phase("forward")
        out = forward(q, k, v)
        grad = torch.ones_like(out)
        tracker.set_phase("backward")
        start = tracker.current_bytes
        out.backward(grad)
        return tracker.peak.peak_bytes - start - (q.nbytes + k.nbytes + v.nbytes)


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

    monkeypatch.setattr(flash_varlen, "_varlen_kernel", _cpu_varlen)

    def ours(q, k, v):
        return unpadded_attention(q, k, v, rows)

    def theirs(q, k, v):
        return _transformers_call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  mask2d, monkeypatch)

    mine, real = _measure(ours, mask2d), _measure(theirs, mask2d)
    assert torch.allclose(mine[3], real[3], atol=1e-6)
    assert mine[:3] == real[:3]  # forward peak, held for the backward, backward peak


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
    beside the kernel's n-token output) less what its q, k, v and output lose to the padding."""
    layers = 2
    cfg = _llama(layers)
    plain, padded = _sim(cfg, padded="none", grad_ckpt="off"), _sim(cfg, grad_ckpt="off")
    assert plain.sdpa_kernels == padded.sdpa_kernels == {"flash": layers}
    out = BATCH * SEQ * HEADS * DIM * 2  # bf16
    lost = (SEQ // 2) * (2 * HEADS + 2 * KV_HEADS) * DIM * 2  # q, out, k, v: the padding's
    assert padded.peak_allocated_bytes - plain.peak_allocated_bytes >= layers * (out - lost)


@pytest.mark.parametrize("kv_heads", [KV_HEADS, HEADS])
def test_the_flash_backward_workspace_is_booked(kv_heads):
    """SDPA's flash kernel on the GPU target: its backward, dispatched through the tracker,
    peaks at dq, dk, dv and FlashAttention-2's buffers over what was alive before it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.randn(1, HEADS, 1000, DIM, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(1, kv_heads, 1000, DIM, dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        rise = _backward_peak(lambda *qkv: torch.ops.aten._scaled_dot_product_flash_attention(
            *qkv, 0.0, True)[0], q, k, v)
        assert rise == sum(flash_backward_workspace(q, k))
    assert len(flash_backward_workspace(q, k)) == (4 if kv_heads != HEADS else 2)


def test_the_varlen_kernel_keeps_and_makes_what_flash_attention_2s_does():
    """The stand-in for flash_attn_varlen_func on the GPU target: its forward keeps one n-token
    output and the heads × n fp32 log-sum-exp; its backward makes dq, dk, dv and, for the call,
    mha_varlen_bwd's buffers (over n + 128 × rows tokens) — once, not per row."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainfit.memory.kernel_workspace import flash_varlen_backward_workspace

    rows = (SEQ, SEQ, SEQ // 2)
    n = sum(rows)
    with FakeTensorMode():
        q = torch.randn(n, HEADS, DIM, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(n, KV_HEADS, DIM, dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        with LiveBytesTracker() as tracker:
            for t in (q, k, v):
                tracker.track(t, "activations")
            tracker.set_phase("forward")
            before = tracker.current_bytes
            out = flash_varlen._varlen_kernel(q, k, v, rows, 0.0, True, None)
            kept = tracker.current_bytes - before
            assert out.shape == (n, HEADS, DIM)
            assert 0 <= kept - (q.nbytes + HEADS * n * 4) <= 64  # + the rng state
            tracker.set_phase("backward")
            grad = torch.ones_like(out)
            start = tracker.current_bytes
            out.backward(grad)
            work = flash_varlen_backward_workspace(n, n, len(rows), HEADS, KV_HEADS, DIM, 2)
            made = q.nbytes + k.nbytes + v.nbytes
            assert tracker.peak.peak_bytes - start == made + sum(work)
            assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_the_varlen_kernel_is_timed_as_its_rows():
    """One call over the rows' tokens as one row: the recorder counts the rows' own FLOPs
    (torch's SDPA count row by row, Σ rows², not (Σ rows)²) and their work-weighted sequence
    length, forward and backward — from the op's arguments, as a compiled graph replays it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    from trainfit.speed.ops import OpRecorder

    rows = (SEQ, SEQ, SEQ // 2)
    n = sum(rows)
    recorder = OpRecorder()
    with FakeTensorMode():
        q = torch.randn(n, HEADS, DIM, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(n, KV_HEADS, DIM, dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        with LiveBytesTracker() as tracker:
            tracker.op_hook = recorder
            tracker.set_phase("forward")
            out = flash_varlen._varlen_kernel(q, k, v, rows, 0.0, True, None)
            tracker.set_phase("backward")
            out.backward(torch.ones_like(out))
    ops = [op for op in recorder.ops if "attention" in op.name]
    assert [op.phase for op in ops] == ["forward", "backward"]
    forward = sum(sdpa_flop_count((1, HEADS, r, DIM), (1, KV_HEADS, r, DIM),
                                  (1, KV_HEADS, r, DIM)) for r in rows)
    backward = sum(sdpa_backward_flop_count((1, HEADS, r, DIM), (1, HEADS, r, DIM),
                                            (1, KV_HEADS, r, DIM), (1, KV_HEADS, r, DIM))
                   for r in rows)
    assert (ops[0].flops, ops[1].flops) == (forward, backward)
    assert forward == 4 * HEADS * DIM * (2 * SEQ ** 2 + (SEQ // 2) ** 2)
    seq = round((2 * SEQ ** 3 + (SEQ // 2) ** 3) / (2 * SEQ ** 2 + (SEQ // 2) ** 2))
    assert [(op.seq, op.causal, op.head_dim) for op in ops] == [(seq, True, DIM)] * 2


def test_a_seq2seq_decoders_own_mask_is_not_unpadded_when_compiled():
    """A padded BART: its encoder's mask is the batch's padding (the encoder and the
    cross-attention unpadded), its decoder's causal mask its own — under compile the simulation
    materialises it, which transformers hands flash attention as None (a review: its decoder
    self-attention was unpadded by the encoder's rows)."""
    cfg = T.BartConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                       vocab_size=512, max_position_embeddings=256)
    eager = _sim(cfg, task="seq2seq-lm", micro_batch=2)
    compiled = _sim(cfg, task="seq2seq-lm", micro_batch=2, compile=True)
    assert eager.sdpa_kernels == compiled.sdpa_kernels == {"flash": 6}


def test_a_models_own_flash_class_is_unpadded_too():
    """Falcon calls SDPA itself (its flash class calls transformers' _flash_attention_forward
    with the padding mask): padded, a full fine-tune holds each layer's output twice as
    well."""
    cfg = T.FalconConfig(hidden_size=HEADS * DIM, num_hidden_layers=2, num_attention_heads=HEADS,
                         num_kv_heads=1, vocab_size=1000, new_decoder_architecture=False,
                         multi_query=True, bias=False)
    plain, padded = _sim(cfg, padded="none", grad_ckpt="off"), _sim(cfg, grad_ckpt="off")
    out = BATCH * SEQ * HEADS * DIM * 2
    assert plain.sdpa_kernels == padded.sdpa_kernels == {"flash": 2}
    assert padded.peak_allocated_bytes - plain.peak_allocated_bytes >= out


def test_a_compiled_padded_step_times_the_varlen_kernel_as_its_rows():
    """Under torch.compile the blocks run as AOTAutograd's graphs, replayed op by op outside
    any Python context of their trace: the varlen kernel's rows travel in its arguments, so
    the compiled step records the same attention work as the eager one (a review: it was
    timed as one row of all the tokens, 26 % slow at llama-3.2-1b LoRA 4 × 2,048)."""
    from trainfit.speed.ops import OpRecorder

    recorded = []
    for compiled in (False, True):
        recorder = OpRecorder()
        _sim(_llama(), grad_ckpt="off", compile=compiled, op_hook=recorder)
        recorded.append([(op.name, op.phase, op.flops, op.seq) for op in recorder.ops
                         if "attention" in op.name])
    eager, compiled_ops = recorded
    rows = row_lengths(BATCH, SEQ, "longest")
    forward = 4 * HEADS * DIM * sum(r * r for r in rows)
    assert sorted(eager) == sorted(compiled_ops)
    assert [op[2] for op in eager if op[1] == "forward"] == [forward] * 2
    assert {op[0] for op in eager} == {"flash_varlen_attention",
                                       "flash_varlen_attention_backward"}


def test_the_cudnn_backward_workspace_is_booked():
    """cuDNN's attention backward (Hopper's default SDPA kernel), dispatched through the
    tracker: one workspace of dQ_accum and softmax_sum in fp32 (cudnn-frontend's
    get_fe_workspace_size_node) beside dq, dk and dv."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainfit.memory.kernel_workspace import cudnn_backward_workspace

    with FakeTensorMode():
        q, k, v = (torch.randn(2, HEADS, 1000, DIM, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        rise = _backward_peak(lambda *qkv: torch.ops.aten._scaled_dot_product_cudnn_attention(
            *qkv, None, True, 0.0, True, False)[0], q, k, v)
        work = cudnn_backward_workspace(q)
        assert work == [2 * q.nbytes + 2 * HEADS * 1000 * 4]
        assert rise == work[0]


def test_a_single_row_padded_to_a_fixed_length_is_unpadded():
    """``padded="always"`` at micro-batch 1: the one row is shorter than the batch's length,
    and transformers unpads it as any padded batch (a review: the call ran flash over the
    padding, every row then being shorter than q); its attention is the row's own."""
    from trainfit.speed.ops import OpRecorder

    recorder = OpRecorder()
    _sim(_llama(), padded="always", micro_batch=1, grad_ckpt="off", op_hook=recorder)
    rows = row_lengths(1, SEQ, "always")
    assert rows == (SEQ // 2,)
    forward = [op for op in recorder.ops if op.name == "flash_varlen_attention"]
    assert [(op.flops, op.seq) for op in forward] == [(4 * HEADS * DIM * rows[0] ** 2,
                                                       rows[0])] * 2


def test_the_memory_efficient_backward_workspace_is_booked():
    """The memory-efficient kernel's backward (a padded batch's mask under SDPA), dispatched
    through the tracker: delta and the fp32 dq accumulation beside dq, dk and dv (torch's
    attention_backward.cu: at least batch × heads × seqlen_q × head_dim fp32)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainfit.memory.kernel_workspace import efficient_backward_workspace

    with FakeTensorMode():
        q, k, v = (torch.randn(2, HEADS, 1000, DIM, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        mask = torch.zeros(2, 1, 1000, 1000, dtype=torch.bfloat16)
        rise = _backward_peak(
            lambda *qkv: torch.ops.aten._scaled_dot_product_efficient_attention(
                *qkv, mask, True, 0.0, False)[0], q, k, v)
        work = efficient_backward_workspace(q)
        # dq's fp32 accumulators: 1,000 queries and head_dim 16 in tiles at least 64 wide
        assert work == [2 * HEADS * 1000 * 4, 2 * HEADS * 1024 * 64 * 4]
        assert rise == sum(work)
