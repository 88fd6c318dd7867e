"""The mirror of SDPA's kernel choice (``choose_sdpa_kernel``) against what torch picked by itself
on a real H100 for the inputs transformers gives it (benchmarks/gpu_sdpa_choice.py, recorded in
benchmarks/results/gpu_sdpa_choice.json), and the rules for the families nobody measured."""

import json
from pathlib import Path

import pytest
import torch

from trainfit.memory.sdpa_choice import AttentionTarget, choose_sdpa_kernel

RECORD = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu_sdpa_choice.json"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _choice(row: dict, cc: tuple[int, int], prefer: str = "sdpa") -> str:
    dt = DTYPES[row["dtype"]]
    q = torch.empty(2, row["q_heads"], 16, row["head_dim"], dtype=dt, device="meta")
    k = torch.empty(2, row["kv_heads"], 16, row["head_dim"], dtype=dt, device="meta")
    mask = None
    if row["mask"] == "bool":
        mask = torch.empty(2, 1, 16, 16, dtype=torch.bool, device="meta")
    elif row["mask"].startswith("float"):
        mask = torch.empty(2, row["q_heads"], 16, 16, dtype=dt, device="meta",
                           requires_grad=row["mask"] == "float_grad")
    return choose_sdpa_kernel(AttentionTarget(device="cuda", compute_capability=cc, prefer=prefer),
                              q, k, mask, row["dropout"], row["q_heads"] != row["kv_heads"])


RECORDED = json.loads(RECORD.read_text())


@pytest.mark.parametrize("row", RECORDED["rows"], ids=lambda r: "-".join(map(str, list(r.values())[:5])))
def test_mirror_picks_what_torch_picked_on_the_h100(row):
    cc = tuple(RECORDED["compute_capability"])
    assert _choice(row, cc) == row["kernel"]


def test_other_families_and_forced_kernels_keep_flash_first():
    row = RECORDED["rows"][0]  # bf16, head_dim 128, no mask, causal
    assert _choice(row, (8, 0)) == "flash"  # A100: not measured, flash as before
    assert _choice(row, (9, 0), prefer="sdpa-flash") == "flash"  # a flash kernel asked for
    assert _choice(row, (9, 0), prefer="sdpa-efficient") == "efficient"


def test_cudnn_first_on_sm_9_0_and_10_0_only():
    """``check_prefer_cudnn_attention`` (sdp_utils.cpp at torch 2.13): ``(major == 9 || major ==
    10) && !minor``. A review found the B200 (10.0) left on flash, and so predicted slower than
    an H100 on a 16k-token LoRA step."""
    row = RECORDED["rows"][0]
    assert {cc: _choice(row, cc) for cc in ((9, 0), (10, 0), (10, 3), (12, 0), (8, 9))} == {
        (9, 0): "cudnn", (10, 0): "cudnn", (10, 3): "flash", (12, 0): "flash", (8, 9): "flash"}


@pytest.mark.parametrize("device, cc", [("cpu", None), ("cuda", (8, 0)), ("cuda", (9, 0))])
def test_fewer_key_heads_without_enable_gqa_take_the_math_kernel(device, cc):
    """torch's check_batch_size_and_num_heads_dense: Falcon's multi-query attention (one key
    head, no enable_gqa) runs the math kernel, which stores the scores (an audit: flash was
    simulated, the CPU step ran math, 8 % under); with enable_gqa the fused kernels take it."""
    target = AttentionTarget(device=device, compute_capability=cc)
    q = torch.empty(2, 8, 16, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 1, 16, 64, dtype=torch.bfloat16, device="meta")
    assert choose_sdpa_kernel(target, q, k, None, 0.0, False, k) == "math"
    fused = {"cpu": "flash_cpu", (8, 0): "flash", (9, 0): "cudnn"}[cc or "cpu"]
    assert choose_sdpa_kernel(target, q, k, None, 0.0, True, k) == fused
    # and torch itself on this CPU agrees (0 = math, 1 = flash)
    qc, kc = torch.randn(2, 8, 16, 64), torch.randn(2, 1, 16, 64)
    assert int(torch._fused_sdp_choice(qc, kc, kc, None, 0.0, True, enable_gqa=False)) == 0
    assert int(torch._fused_sdp_choice(qc, kc, kc, None, 0.0, True, enable_gqa=True)) == 1


def _qkv(head_dim: int, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.empty(2, 8, 16, head_dim, dtype=torch.bfloat16, device="meta", requires_grad=grad)
    return q, q.detach().requires_grad_(grad)


@pytest.mark.parametrize("cc, head_dim, dropout, grad, kernel", [
    ((8, 9), 208, 0.0, True, "efficient"),  # RTX 4090 training: FA2 has no backward for it
    ((8, 9), 208, 0.0, False, "flash"),     # the same shape without a backward
    ((8, 6), 256, 0.1, True, "efficient"),  # above 224 with dropout
    ((8, 6), 256, 0.0, True, "flash"),      # above 224 without dropout: flash again
    ((12, 0), 200, 0.0, True, "efficient"),  # RTX 50xx, the same rule
    ((8, 0), 208, 0.0, True, "flash"),      # A100: its shared memory holds the backward
    ((9, 0), 160, 0.0, True, "flash"),      # H100 training: cuDNN's backward takes ≤ 128 or 256
    ((9, 0), 160, 0.0, False, "cudnn"),
    ((9, 0), 256, 0.0, True, "cudnn"),      # measured (gpu_sdpa_choice.json's head_dim 256 row)
    ((9, 0), 96, 0.0, True, "cudnn"),
])
def test_training_head_dims_the_fused_backwards_refuse(cc, head_dim, dropout, grad, kernel):
    """sdp_utils.cpp: check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
    refuses flash for a backward of head_dim in (192, 224], or above 224 with dropout, on sm86-89
    and sm120-121; check_cudnn_d256_bprop_head_dim leaves cuDNN's backward head_dim ≤ 128 or 256."""
    q, k = _qkv(head_dim, grad)
    target = AttentionTarget(device="cuda", compute_capability=cc)
    assert choose_sdpa_kernel(target, q, k, None, dropout, False, k) == kernel


@pytest.mark.parametrize("qk_dim, v_dim, grad, kernel", [
    (192, 128, True, "cudnn"),      # DeepSeek-V3's multi-head latent attention, training
    (192, 128, False, "cudnn"),
    (160, 128, True, "efficient"),  # cuDNN's backward refuses it, flash needs equal sizes
    (160, 128, False, "cudnn"),
    (128, 64, True, "cudnn"),       # both ≤ 128
    (256, 128, True, "efficient"),  # (256, 256) only
    (196, 128, False, "math"),  # q/k not a multiple of 8: no fused kernel takes it
])
def test_cudnn_takes_unequal_value_heads_on_the_h100(qk_dim, v_dim, grad, kernel):
    """sdp_utils.cpp (torch main at 001f694a): check_cudnn_tensor_shapes asks q/k and v each a
    multiple of 8 and ≤ 256 on sm90, not equal; check_cudnn_d256_bprop_head_dim trains (≤ 128,
    ≤ 128), (192, 128) or (256, 256). Flash needs equal sizes; the memory-efficient kernel a
    multiple of 8 for q/k."""
    q = torch.empty(2, 8, 16, qk_dim, dtype=torch.bfloat16, device="meta", requires_grad=grad)
    v = torch.empty(2, 8, 16, v_dim, dtype=torch.bfloat16, device="meta", requires_grad=grad)
    target = AttentionTarget(device="cuda", compute_capability=(9, 0))
    assert choose_sdpa_kernel(target, q, q.detach().requires_grad_(grad), None, 0.0, False,
                              v) == kernel


def test_cpu_runs_math_for_a_mask_that_needs_a_gradient():
    """T5's relative-position bias reaches SDPA as a float mask that needs a gradient: the CPU
    flash kernel cannot differentiate its mask, so torch runs the math composite (fp32 scores
    kept; plan's CPU simulation of a bf16 T5 step crashed in the flash kernel, and its GPU
    prediction read 4.9 % under a CPU DeepSpeed ZeRO-3 rank)."""
    q, k, v = (torch.randn(2, 4, 64, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    target = AttentionTarget(device="cpu")

    class Seen(torch.utils._python_dispatch.TorchDispatchMode):
        """The aten ops torch really dispatches."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    for needs_grad, kernel in ((False, "flash_cpu"), (True, "math")):
        mask = torch.randn(1, 4, 64, 64, dtype=torch.bfloat16, requires_grad=needs_grad)
        assert choose_sdpa_kernel(target, q, k, mask, 0.0, False, v) == kernel
        with Seen() as seen:
            torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert any("flash_attention_for_cpu" in o for o in seen.ops) == (kernel == "flash_cpu")
