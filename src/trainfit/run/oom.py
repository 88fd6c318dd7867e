"""Surviving an out-of-memory error: one set of pieces for the own loop (all ranks split together),
the HF/TRL trainers (one rank), the evaluation (its batch only) and users' own loops (hooks).

The rule everywhere: drop what the failed attempt built (gradients, the allocator's free blocks),
redo the *same samples* in smaller pieces, and keep the effective batch — so the step's loss is the
one an uninterrupted run computes (the loss weights are token shares of the whole step).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from trainfit.job import JobError, dividing_micro_batches
from trainfit.job.files import size_text


class InjectedOOM(torch.OutOfMemoryError):
    """Fault injection: an OOM raised on purpose (tests, ``--inject-oom-at``, drills). A subclass of
    the real error, so every handler takes the path a GPU's OOM takes."""


def optimizer_oom(step: int, job: Any, *, cuda: bool, limit_bytes: int | None = None,
                  saved_step: int | None = None) -> JobError:
    """The error for an OOM after the backward (:class:`trainfit.engine.step.OptimizerOOM`) at
    ``step`` (the steps done before it), with what lowers the optimizer's memory in the job
    file's words — only what the job does not have already — and how to go on: ``saved_step``,
    the last checkpoint's step (None: none was saved, the run starts again).  A method or
    optimizer change is a new run (a resume refuses other trainable tensors or states)."""
    same_run, new_run = [], []
    in_backward = job.optimizer_in_backward
    if in_backward:
        # the optimizer steps each weight inside the backward: any OOM of the step may leave a
        # partly applied update, and its batch cannot be split (no accumulation with it)
        if job.grad_ckpt != "full":
            same_run.append("grad_ckpt: full")
        same_run.append("optimizer_in_backward: false (an OOM can then split the batch)")
    if job.optimizer in ("adamw", "sgd") and job.optimizer_impl != "fused":
        same_run.append("optimizer_impl: fused (no temporaries the size of the weights)")
    if job.optimizer == "adamw" and cuda:
        new_run.append("optimizer: adamw-8bit")
    if job.method == "full":
        new_run.append("method: lora")
    more = (f"raise --memory-limit (now {size_text(limit_bytes)})" if limit_bytes and not cuda
            else "give the step more memory")
    if saved_step is None:
        go_on = "; ".join([*same_run, *new_run, more]) + "; then run again (no checkpoint was " \
            "saved before this step)"
    else:
        go_on = "; ".join([*same_run, more]) + (
            f", then --resume (checkpoint-{saved_step} holds the state before the update)")
        if new_run:
            go_on += f"; or {', '.join(new_run)} in a new run (a new --out)"
    if in_backward:
        return JobError(f"out of memory in step {step + 1}, whose backward steps the optimizer "
                        "(optimizer_in_backward): the update may be partly applied, and the batch "
                        "cannot be split without accumulation, so the step is not redone", go_on)
    return JobError(f"out of memory in the optimizer step of step {step + 1}: a smaller "
                    "micro-batch does not lower it, and the update may be partly applied, so the "
                    "step is not redone", go_on)


@dataclass(frozen=True, kw_only=True)
class OomEvent:
    """One OOM survived: where, and the batch before and after the split."""

    step: int
    """Optimizer steps completed when it happened (the step that was redone)."""
    phase: str
    """``step`` (training: micro-batch halved, accumulation raised) or ``eval`` (the evaluation
    batch halved, training untouched)."""
    batch_before: int
    batch_after: int
    grad_accum_after: int | None = None
    """Training: the accumulation that keeps the effective batch exact after the split."""
    redone_from_sample: int | None = None
    """Evaluation: the eval sample the redo starts from (the batches before it are kept)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON of train.json / monitor.jsonl (docs/json-formats.md): the batch keys are named
        for the phase (``micro_batch_*`` in training, ``eval_batch_*`` in evaluation)."""
        name = "micro_batch" if self.phase == "step" else "eval_batch"
        d: dict[str, Any] = {"step": self.step, "phase": self.phase,
                             f"{name}_before": self.batch_before, f"{name}_after": self.batch_after}
        if self.grad_accum_after is not None:
            d["grad_accum_after"] = self.grad_accum_after
        if self.redone_from_sample is not None:
            d["redone_from_sample"] = self.redone_from_sample
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OomEvent:
        """The event back from train.json / a checkpoint's history (:meth:`to_dict`'s inverse)."""
        name = "micro_batch" if d["phase"] == "step" else "eval_batch"
        return cls(step=d["step"], phase=d["phase"], batch_before=d[f"{name}_before"],
                   batch_after=d[f"{name}_after"], grad_accum_after=d.get("grad_accum_after"),
                   redone_from_sample=d.get("redone_from_sample"))


def rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The random states a step draws its dropout masks from (CPU, and the device's on CUDA):
    kept before an attempt so the redo after an OOM starts where the failed one did."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def dropout_p(model: torch.nn.Module, config: Any = None) -> float:
    """The largest dropout probability the training step draws masks for: ``nn.Dropout``
    modules (LoRA's ``lora_dropout`` included) and the functional attention dropout
    transformers takes from the config (``attention_dropout``, ``attn_pdrop``)."""
    p = max((m.p for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)),
            default=0.0)
    for name in ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"):
        value = getattr(config, name, None)
        if isinstance(value, int | float):
            p = max(p, float(value))
    return float(p)


def dropout_note(model: torch.nn.Module, config: Any, micro_batch: int, what: str) -> str:
    """Why the losses after ``what`` (an OOM split, a resume at another micro-batch) are not an
    unsplit run's step for step when the model draws dropout masks ("" without dropout): the
    masks are drawn per micro-batch, for its shape — the gradients are the same in expectation,
    not to the digit (an audit: LoRA's default dropout 0.05 moved the losses by 2e-3)."""
    p = dropout_p(model, config)
    if p <= 0:
        return ""
    return (f"dropout (p = {p:g}): after {what} the masks are drawn for micro-batches of "
            f"{micro_batch}, so the losses from there differ from a run without it — the same "
            "in expectation, not step for step (without dropout they are equal, to float "
            "summation order)")


def free_after_oom(zero_grad: Callable[[], Any] | None = None) -> None:
    """Drop the failed attempt's gradients (``zero_grad``: the optimizer's or the model's, set to
    None), collect the garbage that still holds activations, and hand the caching allocator's free
    blocks back so the smaller retry is not fragmented by the failed one."""
    if zero_grad is not None:
        zero_grad()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cannot_split(step: int, job: Any = None, *, can_checkpoint: bool = True,
                 cuda: bool = True, splits: list[int] | None = None,
                 limit_bytes: int | None = None, steps_done: int | None = None) -> JobError:
    """The OOM happened at micro-batch 1: nothing left to split (``step``: the steps done before
    it; said from 1, as the progress line numbers the step being run).  The hint offers what
    this job can still change — checkpointing where it is off and the model has it, LoRA for a
    full fine-tune (QLoRA only on CUDA: bitsandbytes) — in the job file's words (train takes the
    job from a file; it offered checkpointing to a module without it and QLoRA on a CPU, which
    train then refused: a QA run); ``splits``: the micro-batches it went through;
    ``limit_bytes``: the CPU stand-in's capacity (``--memory-limit``), named with its value;
    ``steps_done``: the steps this run has done (0: nothing kept, it runs again as it is, not
    "into a new --out")."""
    fixes = []
    if job is None or (job.grad_ckpt != "full" and can_checkpoint):
        fixes.append("grad_ckpt: full")
    if job is None or job.method == "full":
        fixes.append("method: lora" + (" (or qlora)" if cuda else ""))
    fixes.append("a shorter seq_len" + (f" (now {job.seq_len})" if job is not None else ""))
    went = (f" (after splitting micro-batch {' → '.join(map(str, splits))})"
            if splits and len(splits) > 1 else "")
    ways = ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1]
    # a resume keeps the samples and the parameters (resume_fields.same_samples): a changed
    # seq_len or method is a new run
    where = " and run it again" if steps_done == 0 else " and run it into a new --out"
    more = (f"raise --memory-limit (now {size_text(limit_bytes)})" if limit_bytes and not cuda
            else "give the step more memory")
    return JobError(f"out of memory in step {step + 1} with micro-batch 1{went}",
                    f"in the job file: {ways},{where}; or {more}")


def oom_chain(events: list[OomEvent]) -> list[int]:
    """The micro-batches the training steps split through to reach 1 (8 → 4 → 2 → 1): the step
    splits' chain that ends at 1, back from the last — not an evaluation's batches, nor an
    earlier segment's splits that a resume reset (a review)."""
    chain = [1]
    for e in reversed([e for e in events if e.phase == "step"]):
        if e.batch_after == chain[0] and e.batch_before > chain[0]:
            chain.insert(0, e.batch_before)
    return chain


def smaller_micro_batch(per_rank_batch: int, before: int) -> int:
    """The micro-batch after an OOM: the largest at most half of ``before`` that divides the
    per-rank batch (accumulation then stays exact; 1 always does)."""
    return max(dividing_micro_batches(per_rank_batch, max(before // 2, 1)))


def row_chunks(batch: dict[str, Any], parts: int) -> Iterator[tuple[dict[str, Any], int]]:
    """``batch`` (tensors with the samples on dim 0) in ``parts`` consecutive pieces, each with its
    number of rows; non-tensor and 0-dim entries go to every piece unchanged."""
    size = next(int(v.shape[0]) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim())
    chunk = -(-size // max(1, min(parts, size)))
    for k in range(0, size, chunk):
        piece = {n: v[k:k + chunk] if isinstance(v, torch.Tensor) and v.dim() else v
                 for n, v in batch.items()}
        yield piece, min(chunk, size - k)
