"""The one kernel counter the host measurement and the CPU's per-op cost both use."""

from __future__ import annotations

import pytest
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


def test_routed_experts_matmuls_are_counted_in_every_precision():
    """transformers 5 runs a Mixtral layer's experts through ``torch._grouped_mm`` in bf16 and
    through its own opaque ``grouped_mm_fallback`` loop otherwise; neither reached the flop
    counter, so an fp16 Mixtral plan read MFU 96 % (2026-11-30). Every precision now records the
    same expert FLOPs: 2 × routed rows × K × N per projection, ×3 with the backward."""
    from transformers import MixtralConfig

    from trainfit.job import JobSpec
    from trainfit.memory.simulate import simulate_step
    from trainfit.model.source import ModelSource
    from trainfit.speed.ops import OpRecorder

    hidden, ffn, layers, experts, top_k, tokens = 64, 128, 2, 4, 2, 64
    cfg = MixtralConfig(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                        num_local_experts=experts, num_experts_per_tok=top_k,
                        max_position_embeddings=256)
    src = ModelSource("tiny-mixtral", cfg, "causal-lm", "local")
    routed = tokens * top_k
    # gate+up (hidden → 2·ffn) and down (ffn → hidden), forward + 2 backward matmuls each
    expected = 3 * layers * 2.0 * routed * hidden * (2 * ffn + ffn)
    flops = {}
    for precision in ("fp32", "amp-fp16", "bf16-true"):
        rec = OpRecorder()
        simulate_step(JobSpec(model="t", seq_len=32, micro_batch=2, precision=precision), src,
                      op_hook=rec)
        grouped = [o for o in rec.ops if "grouped_mm" in o.name]
        assert sum(o.flops for o in grouped) == expected, precision
        assert all(o.gemm is not None and o.kernel for o in grouped)
        # attention aside: fp32 with grouped-query heads takes the math kernel (bmm's, a
        # 4-matmul backward), 16-bit the flash kernel (its backward recomputes QKᵀ: 5)
        flops[precision] = sum(o.flops for o in rec.ops
                               if o.name != "bmm" and "attention" not in o.name)
    assert len(set(flops.values())) == 1  # the same step's FLOPs, whatever the kernels


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "llama", "gpt2", "t5"])
def test_every_op_outside_aten_is_recorded_or_costs_nothing(family):
    """The recorder reads aten ops; a custom op is opaque to it (transformers'
    grouped_mm_fallback cost nothing until its GEMMs were recorded: an fp16 Mixtral plan read
    MFU 96 %).  In the steps of these families, every other namespace's op is either a grouped
    matmul the recorder expands (:func:`grouped_gemms`) or the profiler's markers."""
    from transformers import AutoConfig

    from trainfit.job import JobSpec
    from trainfit.memory.simulate import simulate_step
    from trainfit.model.source import ModelSource
    from trainfit.speed.ops import grouped_gemms

    dims = {"mixtral": dict(hidden_size=64, intermediate_size=128, num_local_experts=4,
                            num_experts_per_tok=2),
            "qwen3_moe": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                              num_experts=8, num_experts_per_tok=2, head_dim=16),
            "llama": dict(hidden_size=64, intermediate_size=128),
            "gpt2": dict(n_embd=64, n_layer=2, n_head=4),
            "t5": dict(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16)}[family]
    common = {} if family in ("gpt2", "t5") else dict(num_hidden_layers=2,
                                                       num_attention_heads=4,
                                                       num_key_value_heads=2)
    cfg = AutoConfig.for_model(family, vocab_size=512, **common, **dims)
    task = "seq2seq-lm" if family == "t5" else "causal-lm"
    seen: dict[str, bool] = {}

    def hook(func, args, kwargs, out, phase, micro_step):
        if func.namespace != "aten":
            name = func._overloadpacket.__name__
            seen[f"{func.namespace}::{name}"] = func.namespace == "profiler" or \
                grouped_gemms(func.namespace, name, args, out) is not None

    for precision in ("fp32", "amp-fp16", "bf16-true"):
        simulate_step(JobSpec(model="t", seq_len=16, micro_batch=2, precision=precision),
                      ModelSource("tiny", cfg, task, "local"), op_hook=hook)
    assert all(seen.values()), seen
    if family in ("mixtral", "qwen3_moe"):
        assert "transformers::grouped_mm_fallback" in seen  # the fp32 / fp16 steps' experts


def _optimizer_ops(source, **knobs):
    from trainfit.job import JobSpec
    from trainfit.memory.simulate import SimTarget, simulate_step
    from trainfit.speed.ops import OpRecorder

    job = JobSpec(model="t", seq_len=32, micro_batch=2, grad_accum=1, method="full",
                  grad_ckpt="off", **knobs)
    rec = OpRecorder()
    res = simulate_step(job, source, SimTarget(device="cuda"), op_hook=rec)
    return [op for op in rec.ops if op.phase == "optimizer"], res.trainable_params


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_sharded_optimizer_step_is_timed_on_its_shard(tiny_llama, ranks):
    """FSDP2's parameters are DTensors, dispatched with their global shape: the rank's fused
    AdamW reads its local shard (1/ranks of the bytes, padding aside); DeepSpeed's ZeRO steps its
    fp32 partition (simulated by a bf16 twin of every parameter) and converts twice."""
    whole, params = _optimizer_ops(tiny_llama, precision="amp-bf16")
    adam = next(op for op in whole if op.name == "_fused_adamw_")
    # read: param, grad, exp_avg, exp_avg_sq in fp32 (+ a 4-byte step count per tensor);
    # written back: param, exp_avg, exp_avg_sq (the gradient only when unscaling it)
    assert adam.dtype == "fp32" and adam.bytes == pytest.approx(28 * params, rel=1e-4)
    fsdp, _ = _optimizer_ops(tiny_llama, precision="amp-bf16", ranks=ranks, sharding="fsdp")
    shard = next(op for op in fsdp if op.name == "_fused_adamw_")
    assert adam.bytes / ranks <= shard.bytes <= adam.bytes / ranks * 1.01
    for stage in ("zero2", "zero3"):
        zero, _ = _optimizer_ops(tiny_llama, precision="amp-bf16", ranks=ranks, sharding=stage)
        part = next(op for op in zero if op.name == "_fused_adamw_")
        assert part.dtype == "fp32" and part.bytes == pytest.approx(adam.bytes / ranks, rel=1e-4)
        copies = [op for op in zero if op.name == "_to_copy"][-2:]
        assert [op.bytes for op in copies] == [pytest.approx(6 * params / ranks)] * 2
    fp32, _ = _optimizer_ops(tiny_llama, precision="fp32", ranks=ranks, sharding="zero3")
    assert next(op for op in fp32 if op.name == "_fused_adamw_").bytes == pytest.approx(
        adam.bytes / ranks, rel=1e-4)  # the fp32 module is the master: no widening, no conversions
    assert not [op for op in fp32 if op.name == "_to_copy"]


def test_amp_fp16_steps_run_the_grad_scaler(tiny_llama):
    """amp-fp16 is simulated with torch's GradScaler, as tune and train run it (a review found it
    planned exactly as amp-bf16): its inf check and unscale reads and writes every fp32
    gradient (8 B a parameter), before the clipping — and without clipping too, as
    ``train_step`` unscales before any optimizer (a fused AdamW then takes no scale). amp-bf16
    and DeepSpeed's ZeRO (its own scaler) run none."""
    def unscale(ops):
        return [op for op in ops if op.name == "_amp_foreach_non_finite_check_and_unscale_"]

    ops, params = _optimizer_ops(tiny_llama, precision="amp-fp16", optimizer_impl="foreach")
    (check,) = unscale(ops)
    assert check.kernel and check.bytes == pytest.approx(8 * params, rel=1e-3)
    assert any(op.name == "_amp_update_scale_" for op in ops)
    fused, _ = _optimizer_ops(tiny_llama, precision="amp-fp16", optimizer_impl="fused",
                              max_grad_norm=None)
    assert len(unscale(fused)) == 1
    adam = next(op for op in fused if op.name == "_fused_adamw_")
    assert adam.bytes == pytest.approx(28 * params, rel=1e-3)  # unscaled already: no write-back
    bf16, _ = _optimizer_ops(tiny_llama, precision="amp-bf16", optimizer_impl="foreach")
    zero, _ = _optimizer_ops(tiny_llama, precision="amp-fp16", ranks=2, sharding="zero2")
    assert not unscale(bf16) and not unscale(zero)


@pytest.mark.parametrize("optimizer", ["paged-adamw", "adamw-8bit", "paged-adamw-8bit"])
def test_a_bitsandbytes_optimizer_step_is_one_kernel_a_parameter_with_its_bytes(tiny_llama,
                                                                                 optimizer):
    """A review: the stand-in for bitsandbytes' optimizers recorded no op, so AdamW8bit and
    PagedAdamW32bit were timed at 0 s (faster than torch's fused AdamW moving the same fp32
    states). Each parameter's update is one kernel reading the weight, its gradient and two
    states (8-bit: uint8, with an fp32 absmax a block of 256; fp32 below 4,096 elements) and
    writing the weight and the states back: 28 B an element of fp32 weights in 32 bits; in 8 bits
    16 B, and 16 B a block of 256 (its two absmax read and written). FSDP2's ranks update their
    shards."""
    ops, params = _optimizer_ops(tiny_llama, precision="amp-bf16", optimizer=optimizer)
    bnb = [op for op in ops if op.name == "bnb_optimizer_update_"]
    assert bnb and all(op.kernel for op in bnb)
    assert sum(op.elements for op in bnb) == params  # one kernel a parameter

    def expected(n):
        if optimizer.endswith("8bit") and n >= 4096:
            return 16 * n + 16 * -(-n // 256)
        return 28 * n

    assert [op.bytes for op in bnb] == [expected(int(op.elements)) for op in bnb]
    whole = sum(op.bytes for op in bnb)
    fsdp, _ = _optimizer_ops(tiny_llama, precision="amp-bf16", optimizer=optimizer, ranks=2,
                             sharding="fsdp")
    shard = sum(op.bytes for op in fsdp if op.name == "bnb_optimizer_update_")
    assert whole / 2 <= shard <= whole / 2 * 1.01


@pytest.mark.parametrize("grad_scale", [False, True])
def test_an_in_place_op_that_returns_nothing_is_counted_with_its_writes(grad_scale):
    """``_foreach_*_`` and the fused optimizers return nothing: the tensors their schema marks
    written are counted as written (``add_`` returns ``self``: counted once as its output); the
    fused AdamW writes the gradient back only when it unscales it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainfit.speed.ops import OpRecorder

    class Record(TorchDispatchMode):
        def __init__(self, rec):
            super().__init__()
            self.rec = rec

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            self.rec(func, args, kwargs, out, "optimizer", 0)
            return out

    n = 1000
    a, b = torch.zeros(n), torch.ones(n)
    ps, gs, ms, vs = ([torch.rand(n) for _ in range(2)] for _ in range(4))
    steps = [torch.tensor(1.0) for _ in range(2)]
    scale = torch.tensor(1.0) if grad_scale else None
    rec = OpRecorder()
    with Record(rec):
        a.add_(b)
        torch._foreach_add_([a, b], [b, a])
        torch._fused_adamw_(ps, gs, ms, vs, [], steps, lr=1e-3, beta1=0.9, beta2=0.999,
                            weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
                            grad_scale=scale)
    add, foreach, adam = (op.bytes for op in rec.ops)
    assert add == 3 * 4 * n  # read a, b; write a
    assert foreach == 6 * 4 * n  # read 2 + 2 lists; write the first
    written = 4 if grad_scale else 3
    assert adam == pytest.approx(2 * (4 + written) * 4 * n, abs=64)  # + the step counts, scale


def test_a_lifted_constant_is_no_op():
    """An audit: FakeTensorMode lifts a constant made inside it (``aten.lift_fresh``) — no op in
    eager mode — and a process's first simulation lifts constants that later ones find cached
    (TRL's fused head), so two micro-batches' op lists differed and ``plan --method full
    --trl-logprob-head`` ended in a traceback.  Not recorded; a real op beside it is."""
    import torch

    from trainfit.speed.ops import OpRecorder

    rec = OpRecorder()
    t = torch.ones(4)
    rec(torch.ops.aten.lift_fresh.default, (t,), {}, t, "forward", 0)
    assert rec.ops == []
    rec(torch.ops.aten.mul.Tensor, (t, t), {}, t * t, "forward", 0)
    assert [op.name for op in rec.ops] == ["mul"]
