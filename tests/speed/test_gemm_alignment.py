"""16-bit GEMMs whose rows are not 16-byte aligned (GPT-2's 50,257-column logits) run cuBLAS's
unaligned kernels: recorded from the simulated step, timed at the family's measured fraction."""

import pytest
import torch

from trainfit.hardware.gpus import find_gpu
from trainfit.job import JobSpec
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.speed.kernels import GEMM_UNALIGNED_ADA, GEMM_UNALIGNED_HALF
from trainfit.speed.ops import OpRecord, OpRecorder, gemm_aligned
from trainfit.speed.predict import PAD_KERNEL, fuse_elementwise
from trainfit.speed.roofline import DeviceSpeed, gemm_time, op_device_time


def test_alignment_is_read_from_each_matrix_layout():
    bf16 = torch.bfloat16
    x = torch.empty(16, 64, dtype=bf16)
    w_odd, w_even = torch.empty(1001, 64, dtype=bf16), torch.empty(1008, 64, dtype=bf16)
    # the forward head: x @ W^T; W^T is a column-major view whose leading dimension is 64
    assert not gemm_aligned("mm", (x, w_odd.t()), torch.empty(16, 1001, dtype=bf16))
    assert gemm_aligned("mm", (x, w_even.t()), torch.empty(16, 1008, dtype=bf16))
    # the weight gradient reads the logits' gradient transposed: leading dimension 1001
    g = torch.empty(16, 1001, dtype=bf16)
    assert not gemm_aligned("mm", (g.t(), x), torch.empty(1001, 64, dtype=bf16))
    # a view starting 3 elements into its storage is not on a 16-byte boundary either
    base = torch.empty(16, 67, dtype=bf16)
    assert not gemm_aligned("mm", (base[:, 3:], w_even.t()), torch.empty(16, 1008, dtype=bf16))
    # batched: the batch stride counts (a 16 x 4 x 4 fp16 bmm: 16 elements per matrix is fine)
    a = torch.empty(4, 16, 8, dtype=torch.float16)
    assert gemm_aligned("bmm", (a, a.transpose(1, 2)), torch.empty(4, 16, 16,
                                                                   dtype=torch.float16))
    # fp32 GEMMs (CUDA-core kernels) are not concerned
    assert gemm_aligned("mm", (x.float(), w_odd.t().float()), torch.empty(16, 1001))


def _head_ops(vocab: int) -> list[OpRecord]:
    from transformers import GPT2Config

    from trainfit.model.source import ModelSource

    cfg = GPT2Config(n_embd=64, n_layer=1, n_head=2, vocab_size=vocab, n_positions=64)
    rec = OpRecorder()
    simulate_step(JobSpec(model="g", seq_len=32, micro_batch=2, precision="bf16-true"),
                  ModelSource("g", cfg, "causal-lm", "local"), SimTarget(device="cuda"),
                  op_hook=rec)
    return [o for o in rec.ops if o.gemm is not None]


def test_the_simulated_step_flags_exactly_the_odd_vocabulary_head():
    odd, even = _head_ops(1001), _head_ops(1024)
    unaligned = [o for o in odd if not o.aligned]
    # forward, input gradient and weight gradient of the output head, nothing else
    assert len(unaligned) == 3
    assert all(1001 in o.gemm for o in unaligned)
    assert all(o.aligned for o in even) and len(even) == len(odd)


def test_unaligned_gemm_runs_at_the_family_fraction():
    shape = (1, 8192, 50257, 768)
    for gpu, frac in (("a100-40gb", GEMM_UNALIGNED_HALF), ("rtx-4090", GEMM_UNALIGNED_ADA)):
        dev = DeviceSpeed.from_gpu(find_gpu(gpu))
        assert gemm_time(dev, shape, "bf16", aligned=False) == pytest.approx(
            gemm_time(dev, shape, "bf16") / frac)
        assert gemm_time(dev, shape, "fp32", aligned=False) == gemm_time(dev, shape, "fp32")
    # a memory-bound GEMM stays bound by its bytes
    dev = DeviceSpeed.from_gpu(find_gpu("a100-40gb"))
    tiny = OpRecord("mm", "forward", 2.0 * 8 * 8 * 8, 1e9, "bf16", (1, 8, 8, 8), True,
                    aligned=False)
    assert op_device_time(dev, tiny) == pytest.approx(
        1e9 / (dev.bandwidth_bytes_s * dev.bandwidth_efficiency))


def test_compiled_step_pads_the_unaligned_gemm():
    gemm = OpRecord("mm", "forward", 1e12, 9e8, "bf16", (1, 8192, 50257, 768), True,
                    aligned=False)
    fused = fuse_elementwise([gemm])
    assert [o.name for o in fused] == [PAD_KERNEL, "mm"]
    assert fused[0].bytes == gemm.bytes and fused[0].gemm is None
    assert fused[1].aligned and fused[1].gemm == gemm.gemm


def test_plan_states_the_unaligned_share_and_the_dimension_to_pad():
    from transformers import GPT2Config

    from trainfit.model.source import ModelSource
    from trainfit.plan.grid import plan
    from trainfit.render.plan_words import unaligned_words

    def pick(vocab: int):
        cfg = GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=vocab, n_positions=256)
        res = plan(JobSpec(model="g", seq_len=256, micro_batch=8, precision="bf16-true"),
                   ModelSource("g", cfg, "causal-lm", "local"), find_gpu("a100-40gb"),
                   verify=False)
        return res, res.rows[res.recommended_index].speed

    odd, sp_odd = pick(50257)
    even, sp_even = pick(50304)
    assert sp_odd.unaligned_dims == (50257,)
    assert 0 < sp_odd.unaligned_gemm_s < sp_odd.step_time_s
    assert sp_even.unaligned_gemm_s == 0 and unaligned_words(even) is None
    # the head of the padded vocabulary, 47 columns wider, is the faster step
    assert sp_even.step_time_s < sp_odd.step_time_s
    words = unaligned_words(odd)
    assert "50,257 → 50,304" in words  # the example is the dimension found, padded to 64
    # the planned card's family: an A100 has no measurement of its own (not Ada's 71 %)
    assert "no measurement on Ampere (data centre)" in words and "Ada" not in words
    from trainfit.render.plan_words import _unaligned_rate_words

    assert _unaligned_rate_words("rtx-4090") == "71% of its aligned rate on Ada (measured)"
    assert _unaligned_rate_words("h100-sxm").startswith("20% of its aligned rate on Hopper")
    assert "no measurement on this GPU" in _unaligned_rate_words("generic-24gb")
