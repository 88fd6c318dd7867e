"""Batches: a deterministic sample order, fixed-shape collation, and torch's DataLoader knobs.

The order is a function of (seed, epoch) only, and a run's position is one integer — the number of
samples consumed — so a run resumed at any position, or split into other micro-batches after an
OOM, draws exactly the samples the uninterrupted run would have drawn.

Every batch is padded to ``seq_len`` (fixed shapes): its memory is the memory ``plan`` predicts
and the allocator sees one size per tensor; ``tokens`` counts the positions computed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainfit.data.dataset import NEXT_TOKEN_TASKS, TokenData
from trainfit.job import JobError, JobSpec


@dataclass(kw_only=True)
class LoaderKnobs:
    num_workers: int = 0
    """DataLoader worker processes; 0 loads in the training process (the GPU then waits for it)."""
    prefetch_factor: int = 2
    """Batches each worker prepares ahead (only with workers)."""
    pin_memory: bool = False
    """Page-locked host buffers: faster, asynchronous host→GPU copies (CUDA only)."""
    persistent_workers: bool = False
    """Keep workers alive between epochs (saves their start-up each epoch)."""

    @classmethod
    def from_job(cls, job: JobSpec, *, persistent_workers: bool | None = None) -> LoaderKnobs:
        """The job's loader fields (``persistent_workers`` overridden: an evaluation pass is one
        epoch, its workers need not persist)."""
        return cls(num_workers=job.num_workers, prefetch_factor=job.prefetch_factor,
                   pin_memory=job.pin_memory,
                   persistent_workers=job.persistent_workers if persistent_workers is None
                   else persistent_workers)

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"num_workers {self.num_workers}: must be ≥ 0")
        if self.prefetch_factor < 1:
            raise ValueError(f"prefetch_factor {self.prefetch_factor}: must be ≥ 1")


class SampleOrder:
    """Position → sample id: a fresh permutation per epoch, from (seed, epoch) alone."""

    def __init__(self, n_samples: int, seed: int = 0, shuffle: bool = True) -> None:
        self.n = n_samples
        self.seed = seed
        self.shuffle = shuffle
        self._cache: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[epoch] = (np.random.default_rng([self.seed, epoch]).permutation(self.n)
                                  if self.shuffle else np.arange(self.n))
        return self._cache[epoch]

    def ids(self, start: int, count: int) -> list[int]:
        out = []
        for pos in range(start, start + count):
            out.append(int(self._perm(pos // self.n)[pos % self.n]))
        return out


class _Samples(torch.utils.data.Dataset):
    def __init__(self, data: TokenData) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray | None]:
        labels = self.data.labels[i] if self.data.labels is not None else None
        return i, self.data.input_ids[i], labels


class Collate:
    """Pads to ``seq_len``: labels ``-100`` on padding; an attention mask only when some sample is
    padded (a mask of ones would only keep SDPA off its fastest kernels).

    ``packed`` (``JobSpec.padding_free``, causal LMs): the micro-batch's samples unpadded and
    concatenated into one row with position_ids restarting at each and each sample's first label
    ``-100`` — transformers' ``DataCollatorWithFlattening`` (``separator_id=-100``), what TRL's
    padding-free collator builds.  The model reads the packing from position_ids (an attention
    mask would hide it), so each sample attends to itself alone: the same loss as padded rows,
    and the same label count (a causal LM's first label is never predicted either way)."""

    def __init__(self, data: TokenData, task: str, packed: bool = False) -> None:
        self.seq_len = data.seq_len
        self.pad_id = data.pad_id
        self.mask = data.padded
        self.task = task
        if packed and task != "causal-lm":
            # a module:factory model or a seq2seq one reads no position_ids: one row would let
            # its samples attend to each other (plan refuses the same job: model/batch.py)
            raise JobError(f"--padding-free with a {task} model: it takes no packed row "
                           "(position_ids restarting per sequence)",
                           "drop --padding-free (TRL packs causal LMs only)")
        self.packed = packed

    def _pad(self, arrays: list[np.ndarray], value: int) -> torch.Tensor:
        out = np.full((len(arrays), self.seq_len), value, dtype=np.int64)
        for k, a in enumerate(arrays):
            out[k, :len(a)] = a
        return torch.from_numpy(out)

    def _packed(self, items: list[tuple[int, np.ndarray, np.ndarray | None]]
                ) -> dict[str, torch.Tensor]:
        ids = [np.asarray(x[1], dtype=np.int64) for x in items]
        labels = [np.array(x[2] if x[2] is not None else x[1], dtype=np.int64) for x in items]
        for lab in labels:
            lab[:1] = -100  # the sequence before it is another sample's: never its label
        return {"input_ids": torch.from_numpy(np.concatenate(ids))[None],
                "labels": torch.from_numpy(np.concatenate(labels))[None],
                "position_ids": torch.from_numpy(np.concatenate(
                    [np.arange(len(a), dtype=np.int64) for a in ids]))[None],
                "sample_ids": torch.tensor([x[0] for x in items], dtype=torch.int64)}

    def __call__(self, items: list[tuple[int, np.ndarray, np.ndarray | None]]
                 ) -> dict[str, torch.Tensor]:
        if self.packed:
            return self._packed(items)
        ids = [x[1] for x in items]
        batch: dict[str, torch.Tensor] = {"input_ids": self._pad(ids, self.pad_id)}
        if self.mask:
            m = np.zeros((len(ids), self.seq_len), dtype=np.int64)
            for k, a in enumerate(ids):
                m[k, :len(a)] = 1
            batch["attention_mask"] = torch.from_numpy(m)
        if self.task == "seq2seq-lm" or items[0][2] is not None:
            batch["labels"] = self._pad([x[2] for x in items], -100)  # type: ignore[misc]
        else:
            batch["labels"] = self._pad(ids, -100)
        batch["sample_ids"] = torch.tensor([x[0] for x in items], dtype=torch.int64)
        return batch


def label_tokens(batch: dict[str, torch.Tensor], task: str) -> int:
    """Tokens that carry a loss: causal LMs predict position t+1 from t (HF shifts the labels)."""
    labels = batch["labels"]
    if task in NEXT_TOKEN_TASKS:
        return int((labels[:, 1:] != -100).sum())
    return int((labels != -100).sum())


def label_count(data: TokenData, i: int, task: str) -> int:
    """Label tokens of sample ``i`` before padding (a causal LM's first token has no label)."""
    n = len(data.labels[i]) if data.labels is not None else len(data.input_ids[i])
    return max(n - 1, 0) if task in NEXT_TOKEN_TASKS and data.labels is None else n


def step_weights(data: TokenData, order: SampleOrder, start: int, effective: int, micro: int,
                 task: str, rank: int = 0, ranks: int = 1) -> list[float]:
    """Loss weight of each of this rank's micro-batches in the step at ``start``: its label tokens
    over the whole effective batch's, × ranks (DDP averages gradients over ranks). With these
    weights the gradient is the token mean of the effective batch for any split."""
    total = sum(label_count(data, i, task) for i in order.ids(start, effective)) or 1
    return [sum(label_count(data, i, task) for i in mb) * ranks / total
            for mb in micro_batch_ids(order, start, effective, micro, rank, ranks)]


def make_loader(data: TokenData, task: str, micro_batches: list[list[int]],
                knobs: LoaderKnobs | None = None, pin: bool = False,
                packed: bool = False) -> torch.utils.data.DataLoader:
    """A DataLoader that yields exactly ``micro_batches`` (lists of sample ids), in order;
    ``packed``: each as one padding-free row (:class:`Collate`)."""
    knobs = knobs or LoaderKnobs()
    kw: dict[str, Any] = {}
    if knobs.num_workers > 0:
        kw = {"prefetch_factor": knobs.prefetch_factor,
              "persistent_workers": knobs.persistent_workers}
    return torch.utils.data.DataLoader(
        _Samples(data), batch_sampler=micro_batches, collate_fn=Collate(data, task, packed),
        num_workers=knobs.num_workers, pin_memory=pin and knobs.pin_memory, **kw)


def micro_batch_ids(order: SampleOrder, start: int, effective: int, micro: int,
                    rank: int = 0, ranks: int = 1) -> list[list[int]]:
    """The micro-batches of one optimizer step for one rank: the step's ``effective`` samples from
    ``start``, this rank's contiguous share, cut into ``micro``-sized pieces (the last may be
    smaller when ``micro`` does not divide the share; the loss is token-weighted, so that is exact).
    """
    ids = order.ids(start, effective)
    share = effective // ranks
    mine = ids[rank * share:(rank + 1) * share]
    return [mine[k:k + micro] for k in range(0, len(mine), micro)]


def timed(it: Iterator[dict[str, torch.Tensor]]) -> Iterator[tuple[dict[str, torch.Tensor], float]]:
    """Each batch with the seconds spent waiting for it (the data-wait the GPU sees)."""
    import time

    while True:
        t0 = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            return
        yield b, time.perf_counter() - t0
