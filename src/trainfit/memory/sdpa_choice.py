"""Which SDPA kernel the target GPU runs for a call: torch's dispatcher (``select_sdp_backend``),
mirrored for the simulation (:mod:`trainfit.memory.semantics` calls the chosen kernel itself)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, kw_only=True)
class AttentionTarget:
    """What the target device's SDPA dispatcher can pick."""

    device: str
    """``cuda`` or ``cpu``."""
    compute_capability: tuple[int, int] | None = None
    """CUDA compute capability; flash attention needs 8.0-12.1 (sdp_utils.cpp)."""
    prefer: str = "sdpa"
    """``sdpa`` (what torch picks), ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-math``."""
    compiled: bool = False
    """The model runs under ``torch.compile`` (Dynamo traces it whole, as trainfit's tune and
    train, doctor and HF Trainer's ``torch_compile`` compile it): transformers' packed-sequence
    check cannot run while tracing and returns the sequence ids, so every layer is handed a
    materialised mask (masking_utils ``find_packed_sequence_indices``)."""
    packed: bool = False
    """The batch is one row of several sequences with position_ids restarting at each
    (``JobSpec.packs_rows``): transformers' packed-sequence check runs (on fake tensors it
    always answers with the sequence ids — it skips its one-sequence exit, which reads values —
    so a row of one sequence is not simulated packed: ``JobSpec.packs_rows``) and SDPA is
    handed the (1, 1, N, N) block-causal mask transformers builds from them."""
    expand_kv: bool = False
    """The model code hands attention k and v copied to the query heads
    (``JobSpec.expand_kv``): the kernel keeps the copies, not the GQA heads."""
    batch_mask: bool = False
    """The batch carries an attention mask (padded data: ``tune``'s batches of a padded data
    set, ``JobSpec.padded``): its values decide whether transformers may skip the mask, and fake
    tensors have none, so the mask is materialised, as padding needs — the bidirectional one (an
    encoder's, a seq2seq cross-attention's) always, the causal one where the batch's mask is the
    decoder's (:attr:`batch_mask_causal`). Without one the data are unpadded, and a padding mask
    transformers itself makes of ones (BART's, Marian's, Pegasus' … decoder: ``torch.ones(batch_size,
    mask_seq_length)`` when no decoder mask is given) is all ones."""
    batch_mask_causal: bool = False
    """The batch's mask reaches a causal mask: a decoder-only model's ``attention_mask`` (a
    sequence classifier's too), or a seq2seq batch's ``decoder_attention_mask``. A seq2seq
    batch's ``attention_mask`` is the encoder's: its decoder builds a mask of ones, skipped (a
    review: a padded BART held the decoder's B×1×T×T mask, +1.05 %)."""
    padded_rows: tuple[int, ...] = ()
    """Each row's length without its padding, where the batch is padded (``JobSpec.padded``:
    :func:`trainfit.model.batch.row_lengths`); empty when it is not, or not known (a data set's
    batches). transformers' ``flash_attention_2`` unpads q, k and v to these rows
    (:mod:`trainfit.memory.flash_varlen`); without them its padding mask is only dropped."""
    padded_length: int = 0
    """The sequence length the rows of :attr:`padded_rows` are padded to (the job's
    ``seq_len``): a call over q and k of that length is the batch's, unpadded — every row shorter
    where a single row is padded to a fixed length (``padded="always"`` at micro-batch 1)."""
    flash_attention_2: bool = False
    """The job's attention is transformers' flash_attention_2 (``--attention flash-attention-2``;
    kernels as ``prefer="sdpa-flash"``): the model, built with sdpa, runs as flash-attn runs it —
    fewer key/value heads taken as they are, no T×T mask (:mod:`trainfit.memory.semantics`)."""
    decoder_only: bool = False
    """The model is a causal LM (its task): a boolean mask dropped under ``flash_attention_2`` in
    a call that comes straight to SDPA (not through transformers' attention interface, which
    knows each module's ``is_causal``) leaves ``is_causal`` set where q and k are as long (the
    speed model halves causal attention's work)."""


CUDNN_SDPA_CC = ((9, 0), (10, 0))
"""Compute capabilities on which SDPA's own choice is cuDNN's attention where it applies: SM 9.0
(Hopper) and SM 10.0 (B200, GB200), minor version 0 only (``check_prefer_cudnn_attention`` in
sdp_utils.cpp: ``(major == 9 || major == 10) && !minor``; SM 10.3, the B300, keeps flash first).
Hopper measured (torch 2.11 on an H100: ``_cudnn_attention`` in profiles of plain SDPA calls,
benchmarks/results/gpu_sdpa_choice.json, and of T5's step, whose self-attention — a bias that
needs a gradient — took the memory-efficient kernel and its cross-attention cuDNN's). The
simulated stack's torch (2.13) has it so since 2.9 (pytorch/pytorch#162073, "enable cuDNN SDPA by
default for SM 9.0, SM 10.0"; 2.5.1-2.8 put flash first, pytorch/pytorch#138649): a job under an
older torch is ``--attention sdpa-flash``. SM 10.0 is read from the source, not measured here: it
had been left on flash, and a review found a B200 predicted slower than an H100 at 16k tokens
(FlashAttention-2 at 0.15 of the B200's peak against cuDNN at 0.54 of the H100's)."""


def _cpu_kernel(target: AttentionTarget, q: torch.Tensor, mask: Any, dropout_p: float,
                shapes_ok: bool) -> str:
    """What the CPU dispatcher picks (sdp_utils_cpp.cpp); ``shapes_ok``: the heads and the
    head sizes are ones its flash kernel takes."""
    # the CPU flash kernel takes masks, no dropout, and one head size for q, k and v
    # (check_head_dim_size_cpp: DeepSeek-V3's 48-wide q/k against 32-wide v ran math where flash
    # was simulated, its output shaped as q's: a crash, an audit).
    # A float mask that needs a gradient (T5's relative-position bias, trainable in its first
    # layer and shared on) is one the CPU flash kernel cannot differentiate (its attn_mask has
    # no derivative): torch runs the math composite, fp32 scores and upcast q/k/v kept for the
    # backward (measured: a bf16 T5 step's self-attention ran _safe_softmax; the simulation
    # crashed in _scaled_dot_product_flash_attention_for_cpu)
    mask_grad = torch.is_grad_enabled() and getattr(mask, "requires_grad", False)
    ok = q.dtype in (torch.float32, torch.bfloat16, torch.float16) and dropout_p == 0.0 \
        and shapes_ok and not mask_grad
    return "flash_cpu" if ok and target.prefer != "sdpa-math" else "math"


def choose_sdpa_kernel(
    target: AttentionTarget, q: torch.Tensor, k: torch.Tensor, mask: Any, dropout_p: float,
    enable_gqa: bool, v: torch.Tensor | None = None,
) -> str:
    """Mirror of ``select_sdp_backend`` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp).
    ``v``: the value heads, whose size may differ from the query's (multi-head latent attention:
    DeepSeek-V3's 192-wide q/k against 128-wide v): flash (``check_head_dim_size_flash``) needs
    all three equal, the memory-efficient kernel only q and k, cuDNN each a multiple of 8 within
    its limits (``check_cudnn_tensor_shapes``, ``check_cudnn_d256_bprop_head_dim``)."""
    head_dim = q.shape[-1]
    v_dim = head_dim if v is None else v.shape[-1]
    same_v = v_dim == head_dim
    # check_batch_size_and_num_heads_dense (sdp_utils_cpp.h): the fused kernels need as many key
    # and value heads as query heads, or enable_gqa with a divisor (flash, cuDNN, the CPU flash
    # kernel; the memory-efficient kernel takes no GQA). Falcon's multi-query attention passes
    # one key head against 71 query heads without enable_gqa: the math kernel, which stores the
    # T×T scores (an audit: the CPU step ran math where flash was simulated, 8 % under)
    q_heads, k_heads = q.shape[-3] if q.dim() > 3 else 1, k.shape[-3] if k.dim() > 3 else 1
    v_heads = v.shape[-3] if v is not None and v.dim() > 3 else k_heads
    same_heads = q_heads == k_heads == v_heads
    heads_ok = same_heads or (enable_gqa and k_heads == v_heads and q_heads % k_heads == 0)
    if target.device == "cpu":
        return _cpu_kernel(target, q, mask, dropout_p, heads_ok and same_v)
    cc = target.compute_capability or (8, 0)
    low = q.dtype in (torch.float16, torch.bfloat16)
    # sdp_utils.cpp's input_requires_grad: grad mode on and q, k or v needing a gradient (a
    # training step's attention: its backward will run)
    grad = torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False) for t in (q, k, v) if t is not None)
    # measured on an H100 (benchmarks/results/gpu_sdpa_choice.json): 16-bit inputs of head_dim
    # 64-256, with grouped-query heads, boolean or float masks and dropout; not a float mask
    # that needs a gradient (memory-efficient) nor fp32 inputs. check_cudnn_tensor_shapes: q/k
    # and v each ≤ 256 and a multiple of 8, not necessarily equal. With a backward to run,
    # check_cudnn_d256_bprop_head_dim leaves cuDNN (q/k, v) both ≤ 128, (192, 128) —
    # DeepSeek-V3's multi-head latent attention — or (256, 256): a head_dim of 160 or 192 with
    # v as wide falls to flash. Which torch: those rules are torch main's (sdp_utils.cpp as
    # stored at 001f694a, read 2026-12-05), with a cuDNN that takes head_dim 256; the record is
    # torch 2.11's, whose older rule let cuDNN train at 129-255 too, and whose cuDNN took a
    # dropout of 0.1 (main asks a multiple of 1/16, check_cudnn_dropout: not mirrored, the
    # record wins). Where the two disagree the kernel is cuDNN or flash, which trainfit times
    # and holds alike (speed/roofline.py ATTENTION_EFFICIENCY; both keep O(T) statistics)
    cudnn_bwd_ok = not grad or (head_dim <= 128 and v_dim <= 128) or (
        head_dim, v_dim) in ((192, 128), (256, 256))
    cudnn_ok = (
        target.prefer == "sdpa" and cc in CUDNN_SDPA_CC and low
        and head_dim % 8 == 0 and v_dim % 8 == 0 and max(head_dim, v_dim) <= 256 and heads_ok
        and (mask is None or not getattr(mask, "requires_grad", False)) and cudnn_bwd_ok
    )
    if cudnn_ok:
        return "cudnn"
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120 (sdp_utils.cpp):
    # FlashAttention-2's backward has no kernel for head_dim in (192, 224], nor above 224 with
    # dropout, on the consumer/workstation chips' smaller shared memory (sm86-89, sm120-121):
    # torch refuses flash for training there and the memory-efficient kernel runs
    small_smem = (8, 6) <= cc <= (8, 9) or (12, 0) <= cc <= (12, 1)
    flash_bwd_ok = not (grad and small_smem) or head_dim <= 192 or (
        head_dim > 224 and dropout_p == 0.0)
    flash_ok = (
        low and mask is None and head_dim % 8 == 0 and same_v and heads_ok
        and head_dim <= 256 and (8, 0) <= cc <= (12, 1) and flash_bwd_ok
    )
    eff_ok = head_dim % (8 if q.dtype != torch.float32 else 4) == 0 and same_heads
    order = {
        "sdpa": ("flash", "efficient"), "sdpa-flash": ("flash", "efficient"),
        "sdpa-efficient": ("efficient",), "sdpa-math": (),
    }[target.prefer]
    for kernel in order:
        if kernel == "flash" and flash_ok:
            return "flash"
        if kernel == "efficient" and eff_ok:
            return "efficient"
    return "math"
