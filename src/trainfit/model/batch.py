"""The batch a simulated (or CPU-measured) step runs: random token ids of the job's shape, with
no data behind them — one micro-batch of rows, or padding-free, its rows packed into one."""

from __future__ import annotations

import torch

from trainfit.job import JobError
from trainfit.model.source import ModelSource


def make_batch(source: ModelSource, micro_batch: int, seq_len: int,
               device: torch.device | str = "cpu", generator: torch.Generator | None = None,
               packed: bool = False, padded: str = "none") -> dict[str, torch.Tensor]:
    """A training batch of token ids (no attention mask: unpadded, as packed/equal-length data
    is — a mask of ones would only stop SDPA from using its fast kernels).

    ``packed``: padding-free (``JobSpec.packs_rows``) — the micro-batch's sequences
    concatenated into one row, position_ids restarting at each, as transformers'
    DataCollatorWithFlattening and TRL's padding-free collator hand them to the model; at
    micro-batch 1 its one sample holds two documents (TRL's bfd bins hold several): a row of
    one sequence is no packed row (transformers builds no mask for it)."""
    vocab = int(source.config.vocab_size)
    if packed:
        if source.task != "causal-lm":
            raise JobError(f"--padding-free with --model {source.name}: a {source.task} model "
                           "takes no packed row (position_ids restarting per sequence)",
                           "drop --padding-free (TRL packs causal LMs only)")
        ids = torch.randint(0, vocab, (1, micro_batch * seq_len), device=device,
                            generator=generator)
        positions = torch.arange(seq_len, device=device).repeat(micro_batch)[None]
        if micro_batch == 1 and seq_len > 1:
            half = seq_len // 2
            positions = torch.cat([torch.arange(half, device=device),
                                   torch.arange(seq_len - half, device=device)])[None]
        return {"input_ids": ids, "labels": ids.clone(), "position_ids": positions}
    ids = torch.randint(0, vocab, (micro_batch, seq_len), device=device, generator=generator)
    mask = {}
    rows = row_lengths(micro_batch, seq_len, padded)
    if rows:
        mask = {"attention_mask": (torch.arange(seq_len, device=device)[None]
                                   < torch.tensor(rows, device=device)[:, None]).long()}
    if source.task == "sequence-classification":
        labels = torch.randint(0, max(int(getattr(source.config, "num_labels", 2)), 1),
                               (micro_batch,), device=device, generator=generator)
        return {"input_ids": ids, "labels": labels, **mask}
    return {"input_ids": ids, "labels": ids.clone(), **mask}


def row_lengths(micro_batch: int, seq_len: int, padded: str) -> tuple[int, ...]:
    """Each row's length without its padding in the batch :func:`make_batch` builds for a
    ``padded`` job (``JobSpec.padded``), empty where it builds no mask: the last row is padded
    (its second half), so that with real values transformers cannot skip the mask either.
    Padded to the longest, one row is its own longest — nothing padded, no mask."""
    if padded == "always" or (padded == "longest" and micro_batch > 1):
        return (seq_len,) * (micro_batch - 1) + (seq_len - seq_len // 2,)
    return ()
