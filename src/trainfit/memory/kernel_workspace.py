"""Device buffers a kernel allocates and frees inside one op: on the GPU they take memory for
the op's duration (and a block in the caching allocator) beside its outputs, while the fake
kernels the simulation runs allocate the outputs only.

FlashAttention-2's backward (``mha_bwd``: torch's copy in
aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp, which SDPA's flash kernel runs,
and flash-attn's csrc/flash_attn/flash_api.cpp, which transformers' ``flash_attention_2`` runs —
the same code) allocates, after dq, dk and dv:

* ``softmax_d``: batch × heads × seqlen_q rounded up to 128, fp32;
* ``dq_accum``: batch × seqlen_q rounded to 128 × heads × head_dim rounded (to 32 up to 128,
  else to 64), fp32 — where dq is accumulated across the key blocks (``loop`` is always true;
  the deterministic mode's split copies are not modelled: it is off by default);
* with fewer key/value heads than query heads (MQA, GQA): ``dk_expanded`` and ``dv_expanded``,
  batch × seqlen_k × query heads × head_dim each, in q's dtype, summed into dk and dv afterwards.

All are freed when the op returns.

cuDNN's attention backward (``_scaled_dot_product_cudnn_attention_backward``, Hopper's default
SDPA kernel: torch's aten/src/ATen/native/cudnn/MHA.cpp ``run_cudnn_SDP_bprop``) takes one
workspace of ``mha_graph->get_workspace_size()`` bytes from torch's caching allocator, after dq,
dk and dv, for the call: cudnn-frontend's ``CompositeSDPABackwardNode``
(include/cudnn_frontend/node/scaled_dot_product_flash_attention.h, ``get_fe_workspace_size_node``)
puts there ``dQ_accum``, batch × heads × seqlen_q × head_dim fp32 (cuDNN ≥ 9.0 without dBias and
out of deterministic mode: 2 × q's bytes in 16 bits), and ``softmax_sum``, batch × heads ×
seqlen_q fp32; grouped heads' full-head dK and dV stay virtual (inside the kernel) for a dense
batch. The backend engine's own workspace is not pinned here and not booked.

The memory-efficient kernel's backward (``_scaled_dot_product_efficient_attention_backward``:
torch's aten/src/ATen/native/transformers/cuda/attention_backward.cu, xformers' cutlass kernel
in mem_eff_attention/kernel_backward.h), after dq, dk and dv: ``delta``, batch × heads × seqlen_q
fp32 (the 16-bit kernels compute it themselves, ``kKernelComputesDelta``), and ``workspace`` of
``p.workspace_size()`` bytes where dq is accumulated in fp32: ``kNeedsAccumGradQ`` holds for
every kernel from sm70 on (split keys enabled), each query tile × head-dim tile holding its fp32
accumulator (``GradQTempStorage``, ``workspace_elements_gq``: ceil(Sq / BI) × ceil(D / BJ) tiles
of BI × BJ, the tiles 64 or 128 wide) — at least batch × heads × Sq and D each rounded up to 64,
fp32 (head_dim 96: 4/3 × the unrounded). Booked as that lower bound: the rounding to 128 of the
larger tiles, and the fp32 dk and dv accumulators a kernel whose output does not stay in
registers adds (``kNeedsAccumGradK/V``, × the key splits: at most about 12.5 MiB on sm86/sm89 at
head_dim 128, where the 64 × 64 kernel runs), depend on the template torch dispatches for the
GPU's shared memory, not pinned here.

Before FlashAttention-2's buffers were booked (2026-12-07), a grouped-query 16-bit layer's
attention backward was 4 × its q's bytes under (2 × with as many key heads): Llama-3.1-8B at
4 × 2,048 tokens, 256 MiB a layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import trainfit.memory.flash_varlen  # noqa: F401  (registers trainfit::flash_varlen_attention*)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def flash_backward_workspace(query: torch.Tensor, key: torch.Tensor) -> list[int]:
    """The transient buffers (bytes each) of FlashAttention-2's backward for SDPA's layout:
    ``query`` B × H × Sq × D, ``key`` B × Hk × Sk × D (module doc)."""
    batch, heads, seq_q, head_dim = query.shape
    kv_heads, seq_k = key.shape[-3], key.shape[-2]
    return _backward_buffers(batch * _round_up(seq_q, 128), batch * seq_k, heads, kv_heads,
                             head_dim, query.element_size())


def _backward_buffers(q_slots: int, k_tokens: int, heads: int, kv_heads: int, head_dim: int,
                      element_size: int) -> list[int]:
    """``softmax_d`` and ``dq_accum`` (fp32) over ``q_slots`` query positions (each sequence
    rounded as the kernel lays them out), and with grouped heads dk and dv expanded to the query
    heads over ``k_tokens``: bytes each, the order the kernel allocates them."""
    head_size = _round_up(head_dim, 8)
    head_rounded = _round_up(head_size, 32 if head_size <= 128 else 64)
    fp32 = 4
    out = [heads * q_slots * fp32, q_slots * heads * head_rounded * fp32]
    if kv_heads != heads:
        expanded = k_tokens * heads * head_size * element_size
        out += [expanded, expanded]  # dk_expanded, dv_expanded
    return out


def _flash_backward_args(args: tuple[Any, ...]) -> list[int]:
    query, key = args[1], args[2]
    if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)) \
            or query.dim() != 4 or key.dim() != 4:
        return []
    return flash_backward_workspace(query, key)


def cudnn_backward_workspace(query: torch.Tensor) -> list[int]:
    """cuDNN's attention backward workspace (module doc), one block: ``dQ_accum`` and
    ``softmax_sum`` in fp32 for ``query`` B × H × Sq × D."""
    batch, heads, seq_q, head_dim = query.shape
    fp32 = 4
    return [batch * heads * seq_q * (head_dim + 1) * fp32]


def efficient_backward_workspace(query: torch.Tensor) -> list[int]:
    """The memory-efficient kernel's backward buffers (module doc) for ``query`` B × H × Sq × D:
    ``delta`` and the fp32 dq accumulation (its lower bound: tiles at least 64 wide), bytes each,
    in the order torch allocates them."""
    batch, heads, seq_q, head_dim = query.shape
    fp32 = 4
    tiles = batch * heads * _round_up(seq_q, 64) * _round_up(head_dim, 64)
    return [batch * heads * seq_q * fp32, tiles * fp32]


def _of_query(workspace: Callable[[torch.Tensor], list[int]]
              ) -> Callable[[tuple[Any, ...]], list[int]]:
    """``workspace`` of an SDPA backward op's query (its second argument, B × H × Sq × D)."""
    def read(args: tuple[Any, ...]) -> list[int]:
        query = args[1]
        if not isinstance(query, torch.Tensor) or query.dim() != 4:
            return []
        return workspace(query)
    return read


def flash_varlen_backward_workspace(total_q: int, total_k: int, rows: int, heads: int,
                                    kv_heads: int, head_dim: int, element_size: int
                                    ) -> list[int]:
    """The transient buffers (bytes each) of FlashAttention-2's variable-length backward
    (``mha_varlen_bwd``, flash-attn's csrc/flash_attn/flash_api.cpp), over ``rows`` rows of
    ``total_q`` query and ``total_k`` key tokens: ``dq_accum`` (total_q + 128 × rows) × heads ×
    head_dim rounded, fp32 (each row's dq at least 128 tokens from the next); ``softmax_d``
    heads × (total_q + 128 × rows) fp32 (flash-attn ≥ 2.6; rows × heads × the longest row
    rounded to 128 before, which is no larger for the rows :func:`trainfit.model.batch
    .row_lengths` makes); with grouped heads dk and dv at the query heads, total_k tokens."""
    return _backward_buffers(total_q + 128 * rows, total_k, heads, kv_heads, head_dim,
                             element_size)


def _flash_varlen_backward_args(args: tuple[Any, ...]) -> list[int]:
    """:func:`flash_varlen_backward_workspace` of a call of
    ``trainfit::flash_varlen_attention_backward`` (grad_out, query, key, …, rows, …: the rows'
    tokens as one 1 × heads × n × D row)."""
    query, key, rows = args[1], args[2], args[8]
    return flash_varlen_backward_workspace(query.shape[-2], key.shape[-2], len(rows),
                                           query.shape[1], key.shape[1], query.shape[-1],
                                           query.element_size())


WORKSPACES: dict[Any, Callable[[tuple[Any, ...]], list[int]]] = {
    torch.ops.aten._scaled_dot_product_flash_attention_backward.default: _flash_backward_args,
    torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default:
        _of_query(cudnn_backward_workspace),
    torch.ops.aten._scaled_dot_product_efficient_attention_backward.default:
        _of_query(efficient_backward_workspace),
    torch.ops.trainfit.flash_varlen_attention_backward.default: _flash_varlen_backward_args,
}
"""op → the transient buffers (bytes each) its GPU kernel allocates beside its outputs when
called with these arguments (the module doc); the tracker books them for the op's duration,
after its outputs."""
