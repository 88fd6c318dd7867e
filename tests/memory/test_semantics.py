"""GPU semantics imposed on CPU fake tensors: CUDA autocast lists, SDPA kernels, dropout masks."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from trainfit.memory.sdpa_choice import AttentionTarget, choose_sdpa_kernel
from trainfit.memory.semantics import device_semantics


def _run(fn, device="cuda"):
    with FakeTensorMode(), device_semantics(AttentionTarget(device=device)), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        return fn()


def test_cuda_autocast_runs_layer_norm_and_softmax_in_fp32():
    def fn():
        x = torch.empty(4, 8, dtype=torch.bfloat16)
        return (torch.nn.functional.layer_norm(x, (8,)).dtype,
                torch.softmax(x, -1).dtype, torch.pow(x, 3.0).dtype)

    assert _run(fn, "cuda") == (torch.float32, torch.float32, torch.float32)
    assert _run(fn, "cpu") == (torch.bfloat16, torch.bfloat16, torch.bfloat16)


def test_cuda_autocast_casts_matmul_and_caches_weight_casts():
    def fn():
        w = torch.nn.Parameter(torch.empty(8, 8))
        x = torch.empty(2, 8)
        a = torch.nn.functional.linear(x, w)
        b = torch.nn.functional.linear(x, w)
        return a.dtype, b.dtype

    assert _run(fn) == (torch.bfloat16, torch.bfloat16)


def test_policy_is_removed_after_simulation():
    with device_semantics(AttentionTarget(device="cuda")):
        pass
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.softmax(torch.randn(2, 2, dtype=torch.bfloat16), -1)
    assert y.dtype == torch.bfloat16  # the CPU policy is back


def test_sdpa_kernel_choice_follows_the_gpu():
    q = torch.empty(1, 8, 16, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 2, 16, 64, dtype=torch.bfloat16, device="meta")
    a100 = AttentionTarget(device="cuda", compute_capability=(8, 0))
    t4 = AttentionTarget(device="cuda", compute_capability=(7, 5))
    assert choose_sdpa_kernel(a100, q, q, None, 0.0, False) == "flash"
    assert choose_sdpa_kernel(t4, q.half(), q.half(), None, 0.0, False) == "efficient"
    # memory-efficient attention has no grouped-query support: torch falls back to math
    assert choose_sdpa_kernel(t4, q.half(), k.half(), None, 0.0, True) == "math"
    mask = torch.empty(1, 1, 16, 16, device="meta")
    assert choose_sdpa_kernel(a100, q, q, mask, 0.0, False) == "efficient"


def test_cuda_dropout_keeps_a_bool_mask():
    seen = []

    def fn():
        x = torch.empty(4, 4, requires_grad=True)
        y = torch.nn.functional.dropout(x, 0.1, True)
        seen.append(type(y.grad_fn).__name__)
        return y

    _run(fn, "cuda")
    assert seen == ["NativeDropoutBackward0"]


def test_composites_without_a_cuda_autocast_kernel_keep_autocast_inside():
    """CUDA autocast has no kernel for ``cross_entropy_loss``: its decomposition runs, and its
    ``nll_loss`` is autocast to fp32 — the fp32 copy of bf16 log-probabilities (and its fp32
    gradient) that a T5 step allocated on an H100 (benchmarks/results/gpu_validate.md)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: dict[str, list[torch.dtype]] = {}

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func._overloadpacket.__name__ in ("nll_loss_forward", "nll_loss_backward"):
                seen.setdefault(func._overloadpacket.__name__, []).append(args[0].dtype)
            return out

    def fn():
        logits = torch.empty(8, 32, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.zeros(8, dtype=torch.long)
        with Log():
            loss = torch.nn.functional.cross_entropy(logits, labels)
            loss.backward()
        return loss.dtype

    assert _run(fn, "cuda") == torch.float32
    assert seen == {"nll_loss_forward": [torch.float32], "nll_loss_backward": [torch.float32]}


def test_value_heads_narrower_than_the_query_rule_out_flash():
    """Multi-head latent attention (DeepSeek-V3: q/k 192 wide, v 128): flash needs equal head
    sizes (sdp_utils.cpp check_head_dim_size_flash), the memory-efficient kernel takes them, and
    so does cuDNN (check_cudnn_tensor_shapes: each a multiple of 8 within its limit) on an H100;
    the simulated attention output then has v's width."""
    import torch

    a100 = AttentionTarget(device="cuda", compute_capability=(8, 0))
    h100 = AttentionTarget(device="cuda", compute_capability=(9, 0))
    q = torch.empty(1, 4, 16, 24, dtype=torch.bfloat16)
    v = torch.empty(1, 4, 16, 16, dtype=torch.bfloat16)
    assert choose_sdpa_kernel(a100, q, q, None, 0.0, False) == "flash"
    assert choose_sdpa_kernel(a100, q, q, None, 0.0, False, v) == "efficient"
    assert choose_sdpa_kernel(h100, q, q, None, 0.0, False, v) == "cudnn"
    from torch._subclasses.fake_tensor import FakeTensorMode

    for target in (a100, h100):
        with FakeTensorMode() as fake, device_semantics(target):
            qf, vf = fake.from_tensor(q), fake.from_tensor(v)
            out = torch.nn.functional.scaled_dot_product_attention(qf, qf, vf, is_causal=True)
        assert out.shape[-1] == 16


class _Outputs(TorchDispatchMode):
    """Records (op, output shape, output dtype) of every op that returns one tensor."""

    def __init__(self, seen: list[tuple[str, tuple[int, ...], torch.dtype]]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.seen.append((func._overloadpacket.__name__, tuple(out.shape), out.dtype))
        return out


def test_the_gpu_math_kernel_keeps_its_scores_on_fake_tensors():
    """Where the GPU takes SDPA's math kernel (fp16 grouped-query heads on a T4, fp32 ones
    anywhere), the simulation called the public composite, which on fake CPU tensors takes the
    CPU flash kernel: no S×S scores kept, memory under-predicted, and the attention timed at the
    CPU kernel's rate (an fp32 Llama-3.1-8B on an A100 read MFU 99 %, 2026-11-30).  The math
    kernel runs as its bmm's, and the backward keeps its fp32 scores (16-bit inputs upcast,
    autocast not applied inside)."""
    seen: list[tuple[str, tuple[int, ...], torch.dtype]] = []
    b, h, kv, s, d = 2, 8, 2, 64, 32
    t4 = AttentionTarget(device="cuda", compute_capability=(7, 5))
    with FakeTensorMode(), device_semantics(t4) as ops, \
            torch.autocast("cpu", dtype=torch.float16), _Outputs(seen):
        q = torch.empty(b, h, s, d, requires_grad=True)
        k = torch.empty(b, kv, s, d, requires_grad=True)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True,
                                                               enable_gqa=True)
    assert ops.kernels_used == {"math": 1} and out.shape == (b, h, s, d)
    names = [n for n, _, _ in seen]
    assert not any("flash" in n or "attention" in n for n in names)
    scores = [(n, shape) for n, shape, dt in seen if shape == (b, h, s, s) and dt == torch.float32]
    assert ("_safe_softmax", (b, h, s, s)) in scores  # what the backward keeps, fp32
    # QKᵀ and PV, in fp32 as CUDA's autocast wrapper runs the kernel (its inputs cast to fp16
    # first, then upcast by the kernel)
    assert [dt for n, _, dt in seen if n == "bmm"] == [torch.float32] * 2
    assert out.dtype == torch.float16


def test_the_gpu_math_kernel_gets_a_boolean_mask_as_the_composite_gives_it():
    """The composite turns a boolean mask into a float one in q's dtype before the math kernel
    (convert_boolean_attn_mask); the kernel called directly would add the booleans, and the
    float copy the GPU holds during the attention would be missing."""
    seen: list[tuple[str, tuple[int, ...], torch.dtype]] = []
    b, h, s, d = 2, 4, 32, 30  # head_dim 30: no flash, no memory-efficient (needs % 8 in fp16)
    t4 = AttentionTarget(device="cuda", compute_capability=(7, 5))
    with FakeTensorMode(), device_semantics(t4) as ops, _Outputs(seen):
        q = torch.empty(b, h, s, d, dtype=torch.float16)
        mask = torch.ones(b, 1, s, s, dtype=torch.bool)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert ops.kernels_used == {"math": 1}
    assert ("masked_fill", (b, 1, s, s), torch.float16) in seen


def test_expand_kv_hands_the_kernel_copies_at_the_query_heads():
    """``expand_kv`` (torchtune ≤ 0.5's MultiHeadAttention): k and v copied to the query heads
    before the kernel, which saves the copies — n_heads / n_kv times the GQA heads' bytes."""
    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._scaled_dot_product_flash_attention.default:
                seen.append((args[1].shape[1], args[2].shape[1], args[1].is_contiguous()))
            return func(*args, **(kwargs or {}))

    for expand in (False, True):
        target = AttentionTarget(device="cuda", compute_capability=(8, 0), expand_kv=expand)
        with FakeTensorMode(), device_semantics(target), Spy():
            q = torch.empty(1, 8, 16, 64, dtype=torch.bfloat16)
            k = torch.empty(1, 2, 16, 64, dtype=torch.bfloat16)
            torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True,
                                                             enable_gqa=True)
    assert seen == [(2, 2, True), (8, 8, True)]


def test_expand_kv_reaches_the_simulated_step():
    """``JobSpec.expand_kv`` is wired to the step: a GQA model holds the copies at the query
    heads, (n_heads / n_kv − 1) × k and v bytes a layer more at the forward's end."""
    import transformers as T

    from trainfit.job import JobSpec
    from trainfit.memory.simulate import SimTarget, simulate_step
    from trainfit.model.source import ModelSource

    layers, heads, kv, seq, batch, head_dim = 2, 8, 2, 64, 2, 16
    cfg = T.LlamaConfig(hidden_size=heads * head_dim, intermediate_size=256,
                        num_hidden_layers=layers, num_attention_heads=heads,
                        num_key_value_heads=kv, vocab_size=512)
    src = ModelSource("llama", cfg, "causal-lm", "local")
    peaks = {}
    for expand in (False, True):
        job = JobSpec(model="llama", method="full", seq_len=seq, micro_batch=batch,
                      precision="bf16-true", expand_kv=expand)
        peaks[expand] = simulate_step(job, src, SimTarget(device="cuda", compute_capability=(8, 0))
                                      ).phase_peaks["forward@first"]
    assert peaks[True] - peaks[False] == layers * 2 * (heads - kv) * batch * seq * head_dim * 2


def test_train_tune_and_doctor_refuse_expand_kv():
    import pytest

    from trainfit.job import JobError, JobSpec
    from trainfit.job.step_options import refuse_other_model_code

    for command in ("train", "tune", "doctor"):
        with pytest.raises(JobError, match="--expand-kv describes model code"):
            refuse_other_model_code(JobSpec(model="t", expand_kv=True), command)
