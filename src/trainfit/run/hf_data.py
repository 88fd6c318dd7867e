"""The job's token rows as HF ``Trainer`` / TRL ``SFTTrainer`` take them: a dataset of dict rows,
trainfit's collator for them, and trainfit's (seed, epoch) sample order as the trainers' sampler —
so ``--backend hf|trl`` trains on the samples, in the order, the own loop would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from trainfit.data.dataset import TokenData
from trainfit.data.loader import Collate, SampleOrder


class OrderSampler(torch.utils.data.Sampler[int]):
    """trainfit's sample order for the trainers' DataLoader: epoch ``e`` yields the permutation the
    own loop draws at positions ``[e·n, (e+1)·n)``. HF calls ``set_epoch`` at each epoch."""

    def __init__(self, order: SampleOrder) -> None:
        self.order = order
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        n = self.order.n
        return iter(self.order.ids(self.epoch * n, n))

    def __len__(self) -> int:
        return self.order.n


class Rows(torch.utils.data.Dataset):
    """TokenData rows as dicts (what HF collators receive)."""

    def __init__(self, data: TokenData) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row: dict[str, Any] = {"sample_id": i, "input_ids": self.data.input_ids[i]}
        if self.data.labels is not None:
            row["labels"] = self.data.labels[i]
        return row


class RowCollate:
    """trainfit's :class:`Collate` (fixed ``seq_len`` padding, -100 labels, mask only if padded) for
    dict rows — from :class:`Rows` or from a ``datasets.Dataset`` (TRL)."""

    def __init__(self, data: TokenData, task: str, *, always_mask: bool = False) -> None:
        self.inner = Collate(data, task)
        self.always_mask = always_mask
        """TRL's SFTTrainer: a mask on every batch. Its compute_loss raises "Expected
        'attention_mask' or 'position_ids' in inputs" on a batch with neither (trl 1.16
        sft_trainer.py), which packed text and chat rows filling seq_len are: ``train --backend
        trl`` failed on the README's own tuned job (an audit). An all-ones mask changes no
        result: transformers' SDPA path drops it and runs the causal kernel as without."""

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        items = [(int(r["sample_id"]), np.asarray(r["input_ids"]),
                  np.asarray(r["labels"]) if r.get("labels") is not None else None) for r in rows]
        batch = self.inner(items)
        if self.always_mask and "attention_mask" not in batch:
            batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        return batch



def train_dataset(data: TokenData, backend: str) -> Any:
    """The rows as the trainer takes them: a torch Dataset for HF Trainer, a ``datasets.Dataset``
    for TRL's SFTTrainer."""
    if backend != "trl":
        return Rows(data)
    import datasets  # SFTTrainer takes a datasets.Dataset only

    cols: dict[str, Any] = {"sample_id": list(range(len(data))),
                            "input_ids": [x.tolist() for x in data.input_ids]}
    if data.labels is not None:
        cols["labels"] = [x.tolist() for x in data.labels]
    return datasets.Dataset.from_dict(cols)
