"""The one training-step implementation: ``plan`` runs it on data-less tensors, ``tune`` and
``train`` on real ones.  A prediction can then differ from a measurement only by what the device
does (allocator, kernels), never by a second implementation drifting away from the first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class StepObserver(Protocol):
    def set_phase(self, phase: str, micro_step: int = 0) -> None: ...


class _NoObserver:
    def set_phase(self, phase: str, micro_step: int = 0) -> None:
        pass


@dataclass
class StepResult:
    loss: torch.Tensor | None
    """Sum of the micro-step losses (each already divided by the accumulation)."""
    micro_steps: int


class OptimizerOOM(torch.OutOfMemoryError):
    """An OOM after the backward pass: in the unscale, the clipping or the optimizer's update
    (:func:`trainfit.engine.step.train_step`).  Not split and redone: what it needs does not
    shrink with the micro-batch (the gradients, the states and the optimizer's temporaries), a
    foreach or for-loop update may have written part of the states and weights already, and a
    GradScaler refuses a second unscale before its update (an audit: a redone foreach step
    drifted the losses by 0.048; an amp-fp16 one died in ``unscale_``)."""


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Iterable[dict[str, torch.Tensor]],
    *,
    grad_accum: int,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    max_grad_norm: float | None = None,
    scaler: Any | None = None,
    observer: StepObserver | None = None,
    grads_to_none: bool = True,
    carry: dict[str, Any] | None = None,
    keep_output: bool = False,
    loss_weights: Sequence[float] | None = None,
) -> StepResult:
    """Forward → backward for each micro-batch, then clip, optimizer step, zero grads (to None).

    The loss of each micro-batch is divided by ``grad_accum`` so the accumulated gradient is the
    mean over the effective batch (HF Trainer's convention for equal-length batches).
    ``loss_weights``: when given, micro-batch ``i``'s mean loss is multiplied by ``loss_weights[i]``
    instead of divided by ``grad_accum``: with weight = (its label tokens) / (the effective batch's
    label tokens), the gradient is the token mean over the whole effective batch whatever the split
    into micro-batches (what makes an OOM split or a resume at another micro-batch exact).
    The model's output (its logits) is released before the backward pass, once the loss is
    taken from it: what HF Trainer (``compute_loss`` returns the loss alone), TRL, torchtune and
    torchtitan (``del logits``) do; the backward then holds only what autograd saved.
    ``keep_output``: keep it referenced through the backward pass, as a hand-written loop does
    (``out = model(**batch); out.loss.backward()``).
    ``carry``: when given, the last model output is kept in it until the next forward returns
    (loops that hold their outputs, e.g. litgpt's, keep the graph alive that long).
    """
    obs = observer or _NoObserver()
    total: torch.Tensor | None = None
    n = 0
    # DDP: the gradients are all-reduced once per step, in the last micro-step's backward; the
    # earlier micro-steps accumulate locally under ``no_sync`` (what HF Trainer / accelerate do, and
    # what plan's communication model assumes: trainfit.speed.comm)
    no_sync = getattr(model, "no_sync", None)
    n_micro = len(loss_weights) if loss_weights is not None else grad_accum
    for batch in micro_batches:
        defer = no_sync is not None and n < n_micro - 1
        with no_sync() if defer else contextlib.nullcontext():  # type: ignore[misc]
            obs.set_phase("forward", n)
            with autocast():
                out = model(**batch)
            if carry is not None:
                carry["output"] = out  # drops the previous output only now
            loss = out.loss if hasattr(out, "loss") else out
            loss = loss * loss_weights[n] if loss_weights is not None else loss / grad_accum
            if carry is None and not keep_output:
                out = None  # released before backward (HF Trainer's compute_loss returns the loss)
            obs.set_phase("backward", n)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
        del out, loss
        n += 1
    if no_sync is not None and n < n_micro:
        # the last micro-step ran without the all-reduce: the ranks' gradients would differ
        raise RuntimeError(f"train_step: {n} micro-batches arrived, {n_micro} announced "
                           "(grad_accum / loss_weights): the gradients were not synchronised")
    obs.set_phase("optimizer")
    try:
        if scaler is not None:
            scaler.unscale_(optimizer)
        if max_grad_norm is not None:
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    except torch.OutOfMemoryError as e:
        # not the micro-batch's: the caller must not split and redo it (run/oom.py)
        raise OptimizerOOM(str(e)) from e
    optimizer.zero_grad(set_to_none=grads_to_none)
    obs.set_phase("idle")
    return StepResult(total, n)


def repeat_batches(batch: dict[str, torch.Tensor], n: int) -> Iterator[dict[str, torch.Tensor]]:
    for _ in range(n):
        yield batch
