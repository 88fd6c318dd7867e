"""A padded batch under transformers' ``flash_attention_2``, as it runs: unpadded, attended by
the variable-length kernel, padded back.

transformers 5.23 (modeling_flash_attention_utils ``_flash_attention_forward``), for a batch whose
2-D attention mask has a zero:

* ``_upad_input``: per layer, the valid positions (``torch.nonzero``: n int64) and the rows'
  cumulative lengths, and q, k and v gathered to the valid positions — ``_index_first_axis`` =
  ``tensor.reshape(-1, H, D)[indices]``, on the B × S × H × D transposes
  ``flash_attention_forward`` hands it (the reshape copies where the layout is not B × S × H × D
  already);
* ``flash_attn_varlen_func`` over the n tokens: one n-token output, the log-sum-exp (heads × n,
  fp32), kept with the gathered q, k and v for the backward; its backward (``mha_varlen_bwd``)
  makes dq, dk and dv and, for the call's duration, fp32 buffers over n + 128 × rows tokens and
  the grouped heads' expanded dk and dv (:func:`trainfit.memory.kernel_workspace
  .flash_varlen_backward_workspace`);
* ``pad_input`` (flash-attn's ``IndexPutFirstAxis``, or transformers' own ``_pad_input``: the same
  ops): ``torch.zeros(B·S, H, D)`` with the output put at the valid positions — the tensor o_proj
  then keeps as its input, beside the n-token output the kernel keeps.

So where o_proj saves its input (a trained weight, or LoRA without dropout on it) a padded layer
holds its attention output twice (n and B·S tokens) where an unpadded one holds it once (o_proj's
input is a view of the kernel's output); q, k and v it holds for the valid tokens only. Where
o_proj keeps no input of its own (a frozen base weight, LoRA's dropout keeping its own copy) the
padded layer holds less than the unpadded one: the padding's share of q, k, v and the output
(Llama-3.1-8B LoRA on q and v, peft's default, at 4 × 2,048: 20 MiB a layer).

The varlen kernel is stood in for by SDPA's flash kernel over the n tokens as one row — the same
tensors, kept and made — under :func:`trainfit.speed.ops.attention_rows`, which
counts its work as the rows' own (Σ rows², not (Σ rows)²)."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from trainfit.memory.kernel_workspace import flash_varlen_backward_workspace, workspace_given
from trainfit.speed.ops import attention_rows


class _VarlenFlash(torch.autograd.Function):
    """flash-attn's variable-length kernel over n unpadded tokens (n × heads × D each): SDPA's
    flash kernel over them as one 1 × heads × n × D row, forward and backward, the backward's
    buffers those of ``mha_varlen_bwd``."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                rows: tuple[int, ...], dropout_p: float, causal: bool,
                scale: float | None) -> torch.Tensor:
        q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        with attention_rows(rows):
            out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = \
                torch.ops.aten._scaled_dot_product_flash_attention(
                    q4, k4, v4, dropout_p, causal, False, scale=scale)
        ctx.save_for_backward(q4, k4, v4, out, lse, cum_q, cum_k, seed, offset)
        ctx.args = (rows, max_q, max_k, dropout_p, causal, scale)
        return out.squeeze(0).transpose(0, 1)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q4, k4, v4, out, lse, cum_q, cum_k, seed, offset = ctx.saved_tensors
        rows, max_q, max_k, dropout_p, causal, scale = ctx.args
        sizes = flash_varlen_backward_workspace(q4.shape[-2], k4.shape[-2], len(rows),
                                                q4.shape[1], k4.shape[1], q4.shape[-1],
                                                q4.element_size())
        work = [torch.empty(size, dtype=torch.uint8, device=dout.device) for size in sizes]
        with attention_rows(rows), workspace_given():
            grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                dout.transpose(0, 1).unsqueeze(0), q4, k4, v4, out, lse, cum_q, cum_k, max_q,
                max_k, dropout_p, causal, seed, offset, scale=scale)
        del work
        return (*(g.squeeze(0).transpose(0, 1) for g in grads), None, None, None, None)


def unpadded_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       rows: tuple[int, ...], dropout_p: float = 0.0, causal: bool = True,
                       scale: float | None = None) -> torch.Tensor:
    """transformers' padded flash_attention_2 call (module doc). ``query``, ``key``, ``value``:
    B × H × S × D as transformers' attention interface (and SDPA) is handed them, in 16 bits;
    ``rows``: each row's valid length (the padding at each row's end, as
    :func:`trainfit.model.batch.make_batch` pads). The output: B × S × H × D, as transformers'
    attention functions return it."""
    batch, _, seq, _ = query.shape
    # flash_attention_forward hands the kernel functions B × S × H × D (transpose(1, 2))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    # _get_unpad_data: the valid positions of the flattened batch (torch.nonzero: the first n,
    # every row full but the last, padded at its end — row_lengths' batches) and the rows'
    # cumulative lengths (int32, B + 1) the kernel is handed
    if any(length != seq for length in rows[:-1]):
        raise ValueError(f"rows {rows}: only the last row of {seq} positions may be padded")
    indices = torch.arange(sum(rows), device=query.device)
    cu_seqlens = torch.tensor((0, *itertools.accumulate(rows)), dtype=torch.int32,
                              device=query.device)
    q, k, v = (t.reshape(-1, *t.shape[2:])[indices] for t in (q, k, v))
    out = _VarlenFlash.apply(q, k, v, rows, dropout_p, causal, scale)
    padded = torch.zeros(batch * seq, *out.shape[1:], dtype=out.dtype, device=out.device)
    padded[indices] = out
    del cu_seqlens
    return padded.view(batch, seq, *out.shape[1:])
