"""Evaluation for ``trainfit train``: the token-weighted mean loss of a held-out set, sharded over
ranks, surviving OOM by halving the evaluation batch only.

Exactness: each batch's model loss is the mean over its label tokens, so Σ (mean × label tokens)
over the batches is the sum of the per-token losses, and that sum over the total label tokens is the
same number for any batch size, any split over ranks, and any redo after an OOM (to float summation
order). HF Trainer averages the per-batch means instead, which depends on the batch size when
samples carry different numbers of label tokens.

Everything here is a function of its arguments (model, data, batch size, autocast, ranks); the loop
only calls :func:`evaluate` and records what it returns.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainfit.data.dataset import DataError, TokenData
from trainfit.data.loader import LoaderKnobs, label_count, label_tokens, make_loader
from trainfit.engine.dist import Dist
from trainfit.job import JobError, JobSpec
from trainfit.model.source import ModelSource
from trainfit.run.oom import InjectedOOM, OomEvent, free_after_oom

HOLD_OUT_STREAM = 0x65766131
"""Second seed word of the held-out split's generator: a stream of its own, so the split is a
function of the seed alone and never correlated with the per-epoch sample orders ([seed, epoch])."""


class InjectedEvalOOM(InjectedOOM):
    """Fault injection: an OOM raised in an evaluation batch (tests, drills)."""


@dataclass(kw_only=True)
class EvalResult:
    """One evaluation, the same on every rank (sums all-reduced)."""

    step: int
    """Optimizer steps completed when it ran."""
    eval_loss: float | None
    """Σ per-token loss / label tokens, over the whole eval set; None when the set has no label
    token or the sum is not finite (JSON has no NaN)."""
    eval_perplexity: float | None
    """exp(eval_loss); None without a loss or when exp overflows (JSON has no Infinity)."""
    eval_batch: int
    """Per-rank evaluation batch it finished with (lower than asked after an OOM)."""
    samples: int
    """Eval samples, all ranks."""
    tokens: int
    """Label tokens the loss averages over, all ranks (padding and a causal LM's first position
    carry no label)."""
    eval_time_s: float
    """Wall time of the evaluation, any redo after an OOM included."""
    oom_events: list[OomEvent] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "eval_loss": self.eval_loss,
                "eval_perplexity": self.eval_perplexity, "eval_batch": self.eval_batch,
                "samples": self.samples, "tokens": self.tokens, "eval_time_s": self.eval_time_s}


# --- the eval set ---------------------------------------------------------------------------------

def load_eval_data(job: JobSpec, source: ModelSource, path: Path) -> TokenData:
    """A separate file read and tokenized exactly as the training data (same tokenizer, seq_len,
    task, packing, text field): ``load_data`` itself, on the other path."""
    from trainfit.data.load import load_data

    try:
        data = load_data(job.replace(data=str(path)), source)
    except DataError as err:
        # the reader names the option it was given as; here that is --eval-data
        raise DataError(str(err).replace("--data ", "--eval-data ", 1), err.hint) from None
    _check_has_labels(data, source.task, f"--eval-data {path}")
    return data


def eval_split(data: TokenData, job: JobSpec, source: ModelSource, eval_data: Path | None,
               eval_fraction: float | None
               ) -> tuple[TokenData, TokenData | None, list[int] | None]:
    """(data to train on, evaluation set or None, the training samples' ids in ``data`` when some
    were held out): ``eval_data`` read as the training data, or ``eval_fraction`` held out."""
    if eval_data is not None:
        return data, load_eval_data(job, source, eval_data), None
    if eval_fraction is not None:
        train, eval_set, train_ids, _ = hold_out(data, eval_fraction, job.seed, source.task)
        return train, eval_set, train_ids
    return data, None, None


def subset(data: TokenData, ids: list[int]) -> TokenData:
    """The samples ``ids`` of ``data`` (renumbered 0..len-1), tokenized as they were."""
    input_ids = [data.input_ids[i] for i in ids]
    labels = [data.labels[i] for i in ids] if data.labels is not None else None
    stats = replace(data.stats, samples=len(ids), tokens=int(sum(len(x) for x in input_ids)),
                    notes=list(data.stats.notes))
    # a subset without short samples needs no attention mask (as tokenize_rows would decide)
    padded = data.padded and (any(len(x) < data.seq_len for x in input_ids) or (
        labels is not None and any(len(x) < data.seq_len for x in labels)))
    return TokenData(input_ids, labels, data.seq_len, data.pad_id, stats, padded=padded)


def hold_out(data: TokenData, fraction: float, seed: int, task: str
             ) -> tuple[TokenData, TokenData, list[int], list[int]]:
    """Split the samples into (train, eval, train ids, eval ids): ``ceil(fraction × n)`` samples
    (as HF datasets' ``train_test_split``), drawn by the seed alone. The ids are the samples'
    indices in ``data``. The unit is a training sample: a row for chat / pre-tokenized data, a packed
    sequence for packed text (a document cut across two sequences can then sit on both sides)."""
    n = len(data)
    n_eval = math.ceil(fraction * n)
    if n_eval >= n:
        raise JobError(f"--eval-fraction {fraction:g}: holds out {n_eval} of {n} samples and leaves "
                       "none to train on", (f"use a fraction below {(n - 1) / n:.3g}, or "
                                            "--eval-data" if n > 1 else "one sample cannot be "
                                            "split: give --eval-data FILE, or more data"))
    perm = np.random.default_rng([seed, HOLD_OUT_STREAM]).permutation(n)
    eval_ids = sorted(int(i) for i in perm[:n_eval])
    train_ids = sorted(int(i) for i in perm[n_eval:])
    ev = subset(data, eval_ids)
    _check_has_labels(ev, task, f"--eval-fraction {fraction:g}")
    return subset(data, train_ids), ev, train_ids, eval_ids


def _check_has_labels(data: TokenData, task: str, what: str) -> None:
    if not any(label_count(data, i, task) for i in range(len(data))):
        raise DataError(f"{what}: the eval set has no label tokens (every sample is one token long)",
                        "give longer samples, or a larger eval set")


# --- batches --------------------------------------------------------------------------------------

def shard(n: int, rank: int, world: int) -> range:
    """Rank ``rank``'s contiguous share of ``n`` eval samples (sizes differ by at most one)."""
    return range(n * rank // world, n * (rank + 1) // world)


def plan_batches(n: int, batch: int, start: int, rank: int, world: int
                 ) -> tuple[list[list[int]], list[bool]]:
    """This rank's batches of its shard from its ``start``-th sample on, and which of them count.

    Every rank gets the same number of batches (the largest over ranks): a rank whose shard is
    shorter repeats a real batch whose result is dropped. A wrapped model whose forward holds
    collectives (FSDP's all-gathers) then stays in step across ranks, and every rank takes part in
    the per-batch OOM agreement the same number of times."""
    own = shard(n, rank, world)
    mine = list(own)[start:]
    batches = [mine[k:k + batch] for k in range(0, len(mine), batch)]
    count = max(math.ceil(max(len(shard(n, r, world)) - start, 0) / batch) for r in range(world))
    counted = [True] * len(batches)
    filler = list(range(min(batch, n)))
    while len(batches) < count:
        batches.append(filler)
        counted.append(False)
    return batches, counted


# --- evaluation -----------------------------------------------------------------------------------

def eval_module(model: torch.nn.Module) -> torch.nn.Module:
    """What evaluation calls: DDP's forward broadcasts buffers (a collective) and arms the gradient
    reducer, neither of which an evaluation needs; its plain module computes the same numbers and
    keeps the ranks independent between the agreement points."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return inner.module if isinstance(inner, DDP) else model


def evaluate(model: torch.nn.Module, data: TokenData, *, task: str, batch: int, step: int,
             device: torch.device,
             autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
             dist: Dist | None = None, tracker: Any | None = None, inject_oom: bool = False,
             knobs: LoaderKnobs | None = None, pin: bool = False) -> EvalResult:
    """Evaluate ``model`` on ``data`` (this rank's shard; sums all-reduced over ranks).

    ``model.eval()``, ``torch.no_grad()`` and the job's ``autocast``; the model's mode is restored.
    An OOM (on any rank: all agree after every batch) frees memory, halves the evaluation batch and
    redoes the evaluation from the batch that failed (the batches before it are kept: the sum does
    not depend on the batch size). Batch 1 still out of memory raises :class:`JobError`.
    ``tracker``: the CPU memory limit's live-bytes tracker; batches are tracked as the training
    ones are, so crossing the limit is a real ``torch.OutOfMemoryError``.
    ``inject_oom``: raise one OOM in the last batch of the first pass (fault injection).
    """
    dist = dist or Dist()
    t0 = time.perf_counter()
    # the kept batches' mean losses stay on the device until the end (no sync per batch)
    losses: list[torch.Tensor] = []
    weights: list[int] = []  # their label tokens
    n_samples = 0
    start = 0  # samples of this rank's shard done (the same count on every rank while it lasts)
    events: list[OomEvent] = []
    was_training = model.training
    prev_phase = tracker.phase if tracker is not None else None
    model.eval()
    try:
        if tracker is not None:
            tracker.set_phase("eval")
        while True:
            batches, counted = plan_batches(len(data), batch, start, dist.rank, dist.world)
            loader = _batches(data, task, batches, device, knobs, pin, tracker)
            failed_at: int | None = None
            for k, use in enumerate(counted):
                failed = False
                result: tuple[torch.Tensor, int, int] | None = None
                try:
                    if inject_oom and k == len(counted) - 1:
                        inject_oom = False
                        raise InjectedEvalOOM("injected OOM in evaluation (fault injection)")
                    result = _forward(model, loader, autocast, tracker)
                except torch.OutOfMemoryError:
                    failed = True
                # every rank keeps or drops batch k together: one rank's OOM redoes it on all
                if dist.any(failed):
                    failed_at = k
                    break
                assert result is not None
                loss, labels, size = result
                if use and labels:  # a batch without labels has a NaN mean and weight 0
                    losses.append(loss)
                    weights.append(labels)
                    n_samples += size
                del loss, result
            if failed_at is None:
                break
            del loader
            free_after_oom()  # the failed batch's tensors can sit in reference cycles
            if batch == 1:
                raise JobError(f"out of memory in the evaluation at step {step} with eval batch 1",
                               "the evaluation holds the training state plus one batch's logits: "
                               "use LoRA/QLoRA, a shorter --seq-len, or a smaller model")
            start += failed_at * batch
            events.append(OomEvent(step=step, phase="eval", batch_before=batch,
                                   batch_after=batch // 2, redone_from_sample=start))
            batch //= 2
    finally:
        model.train(was_training)
        if tracker is not None:
            tracker.set_phase(prev_phase)
    return _result(losses, weights, n_samples, dist, step=step, batch=batch, t0=t0, events=events)


def _result(losses: list[torch.Tensor], weights: list[int], n_samples: int, dist: Dist, *,
            step: int, batch: int, t0: float, events: list[OomEvent]) -> EvalResult:
    """The kept batches' means → the token-mean loss over all ranks. Σ mean × label tokens in
    float64 on the host: the exact-order part of the result."""
    means = torch.stack(losses).cpu().double().tolist() if losses else []
    loss_sum = dist.sum(math.fsum(m * w for m, w in zip(means, weights, strict=True)))
    n_tokens = round(dist.sum(float(sum(weights))))
    n_samples = round(dist.sum(float(n_samples)))
    mean = loss_sum / n_tokens if n_tokens and math.isfinite(loss_sum) else None
    try:
        ppl = math.exp(mean) if mean is not None else None
    except OverflowError:
        ppl = None
    return EvalResult(step=step, eval_loss=mean, eval_perplexity=ppl, eval_batch=batch,
                      samples=n_samples, tokens=n_tokens, eval_time_s=time.perf_counter() - t0,
                      oom_events=events)


def _batches(data: TokenData, task: str, batches: list[list[int]], device: torch.device,
             knobs: LoaderKnobs | None, pin: bool, tracker: Any | None
             ) -> Iterator[tuple[dict[str, torch.Tensor], int]]:
    """The batches on the device with their label tokens (counted on the host: no device sync)."""
    for b in make_loader(data, task, batches, knobs, pin=pin and device.type == "cuda"):
        b.pop("sample_ids")
        labels = label_tokens(b, task)
        b = {key: v.to(device, non_blocking=True) for key, v in b.items()}
        if tracker is not None:
            for v in b.values():
                tracker.track(v, "buffers")
        yield b, labels


def _forward(model: torch.nn.Module, loader: Iterator[tuple[dict[str, torch.Tensor], int]],
             autocast: Callable[[], contextlib.AbstractContextManager[Any]], tracker: Any | None
             ) -> tuple[torch.Tensor, int, int]:
    """One batch: its mean loss (a detached device scalar), label tokens and samples."""
    with torch.no_grad(), (tracker if tracker is not None else contextlib.nullcontext()):
        b, labels = next(loader)
        with autocast():
            out = model(**b)
        loss = out.loss if hasattr(out, "loss") else out
        return loss.detach().float(), labels, int(b["input_ids"].shape[0])
