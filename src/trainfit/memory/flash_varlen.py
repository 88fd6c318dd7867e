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

The varlen kernel is stood in for by two custom ops (``trainfit::flash_varlen_attention`` and
its backward), whose fake kernels are SDPA's flash kernel over the n tokens as one row — the same
tensors, kept and made — and which carry the rows in their arguments: every consumer reads them
from the op itself, in eager mode and in a compiled block's graph alike (AOTAutograd replays the
graph op by op, outside any Python context of the trace: a context manager around the kernel
timed a compiled padded step as one row of all its tokens). The flop counter counts their work
as the rows' own (Σ rows², not (Σ rows)²: :func:`_varlen_flops`), the speed model their
sequence length as the rows' (:func:`trainfit.speed.ops._attention_shape`), the live-bytes
tracker the backward's buffers from them (:data:`trainfit.memory.kernel_workspace.WORKSPACES`),
allocated after dq, dk and dv, as ``mha_varlen_bwd`` allocates them; selective checkpointing
saves the forward's outputs, as it saves flash-attn's own varlen op
(:data:`trainfit.model.checkpointing.SAVE_OP_NAMES`)."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.utils.flop_counter import (
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)


@torch.library.custom_op("trainfit::flash_varlen_attention", mutates_args=())
def flash_varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           rows: list[int], dropout_p: float, is_causal: bool,
                           scale: float | None) -> tuple[torch.Tensor, torch.Tensor,
                                                         torch.Tensor, torch.Tensor]:
    """flash-attn's ``_flash_attn_varlen_forward`` over ``rows`` packed into one row
    (``query`` 1 × heads × n × D, n = Σ rows, SDPA's layout; ``key`` and ``value`` with their
    own heads): (output, log-sum-exp, philox seed, philox offset). A stand-in of the GPU's
    kernel for the simulation's fake tensors (:func:`_fake_forward`): no kernel of its own."""
    raise NotImplementedError(
        "trainfit::flash_varlen_attention stands in for flash-attn's variable-length kernel "
        "on the simulation's fake tensors only")


@flash_varlen_attention.register_fake
def _fake_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  rows: list[int], dropout_p: float, is_causal: bool, scale: float | None
                  ) -> tuple[torch.Tensor, ...]:
    out, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, dropout_p, is_causal, False, scale=scale)
    return out, lse, seed, offset


@torch.library.custom_op("trainfit::flash_varlen_attention_backward", mutates_args=())
def flash_varlen_attention_backward(
        grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        out: torch.Tensor, logsumexp: torch.Tensor, philox_seed: torch.Tensor,
        philox_offset: torch.Tensor, rows: list[int], dropout_p: float, is_causal: bool,
        scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flash-attn's ``_flash_attn_varlen_backward`` (``mha_varlen_bwd``) of
    :func:`flash_varlen_attention`: dq, dk, dv; its buffers are booked by the tracker from the
    arguments (:func:`trainfit.memory.kernel_workspace.flash_varlen_backward_workspace`)."""
    raise NotImplementedError(
        "trainfit::flash_varlen_attention_backward stands in for flash-attn's variable-length "
        "kernel on the simulation's fake tensors only")


@flash_varlen_attention_backward.register_fake
def _fake_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                   philox_seed: torch.Tensor, philox_offset: torch.Tensor, rows: list[int],
                   dropout_p: float, is_causal: bool, scale: float | None
                   ) -> tuple[torch.Tensor, ...]:
    n_q, n_k = query.shape[-2], key.shape[-2]
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad_out, query, key, value, out, logsumexp, None, None, n_q, n_k, dropout_p,
        is_causal, philox_seed, philox_offset, scale=scale)
    return dq, dk, dv


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    query, key, value, rows, dropout_p, is_causal, scale = inputs
    out, lse, seed, offset = output
    # flash-attn's log-sum-exp and rng state take no gradient: none made for them
    ctx.mark_non_differentiable(lse, seed, offset)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(query, key, value, out, lse, seed, offset)
    ctx.args = (rows, dropout_p, is_causal, scale)


def _backward(ctx: Any, grad_out: torch.Tensor, *_: Any) -> tuple[Any, ...]:
    grads = flash_varlen_attention_backward(grad_out, *ctx.saved_tensors, *ctx.args)
    return (*grads, None, None, None, None)


flash_varlen_attention.register_autograd(_backward, setup_context=_setup_context)


def _row_shapes(rows: list[int], *shapes: tuple[int, ...]) -> list[list[tuple[int, ...]]]:
    """Each row's shapes of the 1 × heads × n × D tensors ``shapes``: 1 × heads × row × D."""
    return [[(1, s[1], length, s[3]) for s in shapes] for length in rows]


@register_flop_formula(torch.ops.trainfit.flash_varlen_attention)
def _varlen_flops(query_shape: tuple[int, ...], key_shape: tuple[int, ...],
                  value_shape: tuple[int, ...], rows: list[int], *args: Any,
                  out_shape: Any = None, **kwargs: Any) -> int:
    """The forward's FLOPs: torch's SDPA count, row by row (Σ rows², not (Σ rows)²)."""
    return sum(sdpa_flop_count(*row)
               for row in _row_shapes(rows, query_shape, key_shape, value_shape))


@register_flop_formula(torch.ops.trainfit.flash_varlen_attention_backward)
def _varlen_backward_flops(grad_out_shape: tuple[int, ...], query_shape: tuple[int, ...],
                           key_shape: tuple[int, ...], value_shape: tuple[int, ...],
                           *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """The backward's FLOPs: torch's SDPA backward count, row by row."""
    rows = args[4]
    return sum(sdpa_backward_flop_count(*row) for row in _row_shapes(
        rows, grad_out_shape, query_shape, key_shape, value_shape))


def _varlen_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: tuple[int, ...],
                   dropout_p: float, causal: bool, scale: float | None) -> torch.Tensor:
    """``flash_attn_varlen_func`` over n unpadded tokens (n × heads × D in and out): the
    stand-in op over them as one 1 × heads × n × D row (views both ways)."""
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = flash_varlen_attention(q4, k4, v4, list(rows), dropout_p, causal, scale)[0]
    return out.squeeze(0).transpose(0, 1)


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
    out = _varlen_kernel(q, k, v, rows, dropout_p, causal, scale)
    padded = torch.zeros(batch * seq, *out.shape[1:], dtype=out.dtype, device=out.device)
    padded[indices] = out
    del cu_seqlens
    return padded.view(batch, seq, *out.shape[1:])
