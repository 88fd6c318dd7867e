"""A padded batch under transformers' ``flash_attention_2``, as it runs: unpadded, attended by
the variable-length kernel, padded back.

transformers 5.23 (modeling_flash_attention_utils ``_flash_attention_forward``), for a batch whose
2-D attention mask has a zero:

* ``_upad_input``: per layer, the valid positions (``torch.nonzero``: n int64), and q, k and v
  gathered to them — ``_index_first_axis`` = ``tensor.reshape(-1, H, D)[indices]``, on the
  B × S × H × D transposes ``flash_attention_forward`` hands it (the reshape copies where the
  layout is not B × S × H × D already);
* ``flash_attn_varlen_func`` over the n tokens, which keeps the gathered q, k and v, its n-token
  output and the log-sum-exp for the backward;
* ``pad_input``: ``torch.zeros(B·S, H, D)`` with the output put at the valid positions — the
  tensor o_proj then keeps as its input, beside the n-token output the kernel keeps.

So a padded layer holds its attention output twice (n and B·S tokens) where an unpadded one
holds it once (o_proj's input is a view of the kernel's output), and its q, k and v for the valid
tokens only. The simulated kernel runs one call per run of equally long rows (the varlen kernel's
work is each row's causal square: one call over all n tokens would count (Σ rows)² for Σ rows²);
several runs are joined by a ``cat`` before the put, a transient n-token copy in the forward the
real step does not make (errs high, by one layer's attention output at most)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch


def _runs(rows: tuple[int, ...]) -> list[tuple[int, int]]:
    """(count, length) of each run of equally long consecutive rows."""
    return [(len(list(group)), length) for length, group in itertools.groupby(rows)]


def attend_rows(attend: Callable[..., Any], module: Any, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, rows: tuple[int, ...], *args: Any, **kwargs: Any
                ) -> torch.Tensor:
    """The variable-length kernel over unpadded ``q``, ``k``, ``v`` (n × heads × D, the rows'
    tokens one after another): ``attend`` (transformers' sdpa attention function, no mask:
    causality from the module, grouped heads as they are) once per run of equally long rows;
    the n × heads × D output."""
    runs = _runs(rows)
    sizes = [count * length for count, length in runs]
    outs = []
    for (count, length), qr, kr, vr in zip(runs, q.split(sizes), k.split(sizes), v.split(sizes),
                                           strict=True):
        shaped = (t.view(count, length, *t.shape[1:]).transpose(1, 2) for t in (qr, kr, vr))
        out, _ = attend(module, *shaped, None, *args, **kwargs)
        outs.append(out.reshape(count * length, *out.shape[2:]))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def unpadded_attention(attend: Callable[..., Any], module: Any, query: torch.Tensor,
                       key: torch.Tensor, value: torch.Tensor, rows: tuple[int, ...],
                       *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' padded flash_attention_2 call (module doc), :func:`attend_rows` standing
    for the variable-length kernel. ``query``, ``key``, ``value``: B × H × S × D as transformers'
    attention interface is handed them; ``rows``: each row's valid length (the padding at each
    row's end, as :func:`trainfit.model.batch.make_batch` pads)."""
    batch, _, seq, _ = query.shape
    # flash_attention_forward hands the kernel functions B × S × H × D (transpose(1, 2))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    # the valid positions of the flattened batch, as torch.nonzero finds them: a row's padding
    # at its end
    indices = torch.cat([torch.arange(length, device=query.device) + i * seq
                         for i, length in enumerate(rows)]) if len(set(rows)) > 1 or \
        rows[0] != seq else torch.arange(batch * seq, device=query.device)
    # and the rows' cumulative lengths (int32, B + 1) the kernel is handed
    cu_seqlens = torch.tensor((0, *itertools.accumulate(rows)), dtype=torch.int32,
                              device=query.device)
    q, k, v = (t.reshape(-1, *t.shape[2:])[indices] for t in (q, k, v))
    out = attend_rows(attend, module, q, k, v, rows, *args, **kwargs)
    padded = torch.zeros(batch * seq, *out.shape[1:], dtype=out.dtype, device=out.device)
    padded[indices] = out
    del cu_seqlens
    return padded.view(batch, seq, *out.shape[1:]), None
