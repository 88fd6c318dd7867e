"""OOM recovery inside HF ``Trainer`` / TRL ``SFTTrainer`` (``trainfit train --backend hf|trl``): a
mixin that redoes the optimizer step's micro-batches so far in halves after an OOM. The loss is
normalised by the step's label tokens (``num_items_in_batch``), so the split is exact; the own
loop's recovery is run/loop.py's, both on run/oom.py's pieces."""

from __future__ import annotations

import math
from typing import Any

import torch

from trainfit.job import JobError
from trainfit.run.oom import InjectedOOM, OomEvent, cannot_split, free_after_oom, oom_chain, row_chunks


class SplitOnOOM:
    """Mixin for ``transformers.Trainer`` subclasses: OOM → redo the optimizer step's micro-batches
    so far in smaller pieces (micro-batch halved, accumulation doubled, effective batch and samples
    unchanged). Keeps the step's inputs (token ids: small) to replay them."""

    trainfit_split = 1
    trainfit_inject: set[int]
    trainfit_events: list[OomEvent]
    trainfit_ids: list[int]
    trainfit_step_loss = 0.0
    trainfit_world = 1
    trainfit_ended = False
    """A finished run trained on (its schedule had decayed to 0): the first step takes the new
    schedule's rate (:meth:`_Watch.on_train_begin`)."""
    trainfit_hint: dict[str, Any] = {}  # noqa: RUF012 - replaced per trainer by _trainfit_init
    """What :func:`~trainfit.run.oom.cannot_split` may offer: the job, its device, its model."""

    def _trainfit_init(self, inject: tuple[int, ...], world: int,
                       hint: dict[str, Any] | None = None) -> None:
        self.trainfit_hint = dict(hint or {})
        self.trainfit_inject = set(inject)
        self.trainfit_events = []
        self.trainfit_ids = []
        self.trainfit_world = world
        self._window: list[dict[str, Any]] = []
        self._window_step = -1

    def training_step(self, model: Any, inputs: dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:
        state = self.state  # type: ignore[attr-defined]
        if state.global_step != self._window_step:
            self._window, self._window_step = [], state.global_step
            self._losses: list[float] = []
            self.trainfit_ids = []
        ids = inputs.pop("sample_ids", None)
        if ids is not None:
            self.trainfit_ids.extend(ids.tolist())
        self._window.append(inputs)
        last = len(self._window) == self.current_gradient_accumulation_steps  # type: ignore[attr-defined]
        replay = False
        while True:
            try:
                if state.global_step in self.trainfit_inject and last:
                    self.trainfit_inject.discard(state.global_step)
                    raise InjectedOOM("injected OOM (fault injection)")
                if replay:  # the earlier micro-batches' gradients were dropped: redo them
                    for k, past in enumerate(self._window[:-1]):
                        self._losses[k] = float(self._split_step(model, past, num_items_in_batch))
                loss = self._split_step(model, inputs, num_items_in_batch)
                break
            except torch.OutOfMemoryError:
                self._on_oom(inputs, num_items_in_batch)
                replay = True
        self._losses.append(float(loss))
        # each micro-loss is its share of the step's token mean: their sum is the step's loss
        self.trainfit_step_loss = sum(self._losses)
        return loss

    def _split_step(self, model: Any, inputs: dict[str, Any], num_items: Any) -> torch.Tensor:
        size = int(inputs["input_ids"].shape[0])
        parts = min(self.trainfit_split, size)
        if parts == 1:
            return super().training_step(model, dict(inputs), num_items)  # type: ignore[misc]
        total = None
        for part, _rows in row_chunks(inputs, parts):
            loss = super().training_step(model, part, num_items)  # type: ignore[misc]
            total = loss if total is None else total + loss
        assert total is not None
        return total

    def _on_oom(self, inputs: dict[str, Any], num_items: Any) -> None:
        step = self.state.global_step  # type: ignore[attr-defined]
        size = int(inputs["input_ids"].shape[0])
        before = math.ceil(size / self.trainfit_split)
        if self.trainfit_world > 1:
            raise JobError(f"out of memory in step {step + 1} under {self.trainfit_world} ranks "
                           "with the hf/trl backend", "use --backend trainfit (all ranks split "
                           "together), or a smaller micro_batch")
        if num_items is None:
            raise JobError(f"out of memory in step {step + 1}: this model's loss takes no "
                           "num_items_in_batch, so a split would change the loss weighting",
                           "use --backend trainfit, or a smaller micro_batch")
        if before == 1:
            raise cannot_split(step, splits=oom_chain(self.trainfit_events), **self.trainfit_hint)
        free_after_oom(lambda: self.model.zero_grad(set_to_none=True))  # type: ignore[attr-defined]
        self.trainfit_split *= 2
        after = math.ceil(size / self.trainfit_split)
        accum = self.args.gradient_accumulation_steps * self.trainfit_split  # type: ignore[attr-defined]
        self.trainfit_events.append(OomEvent(step=step, phase="step", batch_before=before,
                                             batch_after=after, grad_accum_after=accum))
