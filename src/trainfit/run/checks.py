"""What every backend of ``trainfit train`` checks and sets up before its first step: a runnable
job (a chosen batch, as many processes as ranks), data for at least one effective batch, the number
of steps, the learning-rate schedule, and the CPU stand-in for a GPU's capacity."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from trainfit.job import JobError, JobSpec
from trainfit.job.step_options import refuse_other_model_code
from trainfit.memory.limit import LimitTracker, state_tensors

if TYPE_CHECKING:
    from trainfit.run.options import RunOptions


def check_runnable(job: JobSpec, world: int) -> None:
    """What every backend needs: a chosen batch, and as many processes as the job's ranks."""
    if job.effective_batch is None or job.micro_batch is None:
        raise JobError("the job needs micro_batch and effective_batch (or grad_accum)",
                       "run trainfit tune first, or set them in the YAML")
    if job.ranks != world:
        raise JobError(f"the job says ranks {job.ranks} but {world} process(es) run",
                       f"use --nproc {job.ranks}, or set ranks: {world}")
    if job.sharding.startswith("zero") or job.offload != "none":
        # trainfit runs DDP and FSDP itself; DeepSpeed and CPU offload are the engines' own
        raise JobError(f"train runs sharding none or fsdp without offload (the job says "
                       f"sharding {job.sharding}, offload {job.offload})",
                       "plan predicts it; run it with accelerate launch and a DeepSpeed/FSDP "
                       "config (trainfit emit FILE --to accelerate)")
    if job.fsdp_init != "sharded":
        # train builds FSDP on meta (build_real): FSDP1's wrap of a host model is other stacks'
        raise JobError(f"--fsdp-init {job.fsdp_init} describes FSDP1's wrap in other stacks; "
                       "train shards the model on meta (fsdp_init sharded)",
                       "drop --fsdp-init for train (plan predicts the wrap's reserve)")
    if job.quant_lib != "bnb":
        # train quantizes with bitsandbytes (transformers' BitsAndBytesConfig): torchao's NF4
        # loading is torchtune's, modelled by plan only
        raise JobError(f"--quant-lib {job.quant_lib} describes torchtune's NF4 loading; "
                       "train quantizes with bitsandbytes (quant_lib bnb)",
                       "drop --quant-lib for train (plan predicts torchao's loading reserve)")
    # train runs the installed transformers model: no per-layer RoPE tables, three projections
    refuse_other_model_code(job, "train")
    if job.clone_layers:
        # train builds each layer from the configuration (build_real): the copies are torchtune's
        raise JobError("--clone-layers describes torchtune's deep-copied layers; train builds "
                       "each layer itself", "drop --clone-layers for train (plan predicts the "
                       "copies' reserve)")


def total_steps(opts: RunOptions, n_samples: int, effective_batch: int,
                saved_steps: int | None = None) -> int:
    """Optimizer steps of the run: ``max_steps``, else ``epochs`` over the data; neither given
    on a resume, the length of the run that wrote the checkpoint (``saved_steps``: the linear
    decay it was on ends there), else one epoch."""
    if opts.max_steps is not None:
        return opts.max_steps
    if opts.epochs is None and saved_steps:
        return saved_steps
    return max(1, math.floor(n_samples * (opts.epochs or 1.0) / effective_batch))


def check_steps_left(total: int, at_step: int, ck: object, opts: RunOptions,
                     saved_steps: int | None) -> None:
    """A resume with no step left to train is refused, whatever set the run's length: it
    printed "steps 9–8 (0 steps …)" and exited 0 (a QA run), and a finished run resumed with no
    length keeps its own, which ended at its checkpoint."""
    if total > at_step:
        return
    if opts.max_steps is not None:
        said = f"--max-steps {opts.max_steps}"
    elif opts.epochs is not None:
        said = f"--epochs {opts.epochs:g} ({total} steps over this data)"
    else:
        said = f"the run that wrote {ck} (its length, {saved_steps or total} steps)"
    raise JobError(f"{said}: the checkpoint {ck} is already at step {at_step}: no step is left",
                   f"give --max-steps above {at_step} to train on from it")


def schedule_note(total: int, saved_steps: int | None, at_step: int,
                  ended: bool = False) -> str | None:
    """A resume whose length differs from the checkpoint's run: its linear decay is rebuilt over
    the new length, so every step from here on has another learning rate (a QA run: a resume
    without --max-steps went on to the epoch's end, 1,040 steps instead of 150, and its losses
    left the uninterrupted run's from step 103 with nothing said).  ``ended``: the checkpoint's
    run had finished, its rate was 0: the first step takes the new schedule's."""
    if not saved_steps or total == saved_steps:
        return None
    if ended:
        return (f"the checkpoint's run ended at step {saved_steps} (its learning rate decayed to "
                f"0 there): training on, the rate decays again, from "
                f"{1 - at_step / total:.0%} of lr at step {at_step + 1} to 0 at step {total}")
    return (f"the learning rate now decays to 0 at step {total}, not at the checkpoint's "
            f"{saved_steps}: from step {at_step + 2} on, the updates differ from that run's (step "
            f"{at_step + 1} keeps the learning rate the checkpoint's optimizer state carries; "
            f"leave out --max-steps and --epochs to keep its schedule)")


def ended_run(saved_steps: int | None, at_step: int) -> bool:
    """The checkpoint's run had finished (its schedule decayed to 0 at ``saved_steps``)."""
    return bool(saved_steps) and at_step >= (saved_steps or 0)


def take_schedule_rate(optimizer: Any, scheduler: Any) -> None:
    """Each parameter group's rate set to what ``scheduler`` (a LambdaLR: trainfit's linear
    decay, HF's schedules) gives at its step: a finished run's optimizer carries its schedule's
    last rate, 0, and the first step of a longer run on from it would change no weight (an
    audit: reported trained).  Nothing for a scheduler without lambdas."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if optimizer is None or not lambdas:
        return
    for group, base, rate in zip(optimizer.param_groups, scheduler.base_lrs, lambdas,
                                 strict=False):
        group["lr"] = base * rate(scheduler.last_epoch)


def linear_decay(optimizer: torch.optim.Optimizer, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """HF Trainer's default schedule: linear decay to 0 over the run (no warm-up)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / total))


def limit_tracker(limit_bytes: int | None, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer | None = None) -> LimitTracker | None:
    """The CPU stand-in for a GPU's capacity (live tensor bytes, as tune), the model counted and
    any optimizer state that exists already (a resume loads it before the first step: uncounted,
    a resumed run measured half its peak and fitted a limit it did not fit fresh — an audit). A
    limit the model itself does not fit in is bad input (JobError), not an OOM to recover from."""
    if limit_bytes is None:
        return None
    tracker = LimitTracker(limit_bytes)
    try:
        tracker.track_model(model, optimizer)
    except torch.OutOfMemoryError:
        states = state_tensors(optimizer)
        need = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in [*model.parameters(), *model.buffers(), *states]}.values())
        what = ("the model's weights and the checkpoint's optimizer states" if states
                else "the model's weights alone")
        # the step adds the gradients (of the trainable weights) to what a resume loaded; a
        # fresh run, the gradients and AdamW's two states: ~4 × the weights of a full fine-tune
        grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        before_acts = need + grads if states else need * 4
        raise JobError(f"--memory-limit {limit_bytes:,} bytes: {what} take "
                       f"{need:,} bytes ({need / 2**20:.1f} MiB), more than the limit",
                       # not "e.g. 4 × the weights": that fits no micro-batch (a QA run)
                       "give --memory-limit more: with the gradients"
                       + ("" if states else " and AdamW's two states of a full fine-tune")
                       + f" it is ~{max(1, math.ceil(before_acts / 2**20))} MiB before any "
                       "activation (trainfit plan predicts a micro-batch's whole step)") from None
    return tracker


def check_data_size(n_samples: int, effective_batch: int, where: str) -> None:
    """One optimizer step takes ``effective_batch`` distinct samples: fewer would repeat samples
    inside a step (and ``--epochs 1`` would train on some twice) — refused."""
    if n_samples < effective_batch:
        raise JobError(f"{where}: {n_samples} training samples, fewer than one effective batch "
                       f"({effective_batch}): a step would use some samples twice",
                       f"lower --effective-batch to at most {n_samples} (with a micro-batch that "
                       "divides it), or add data")
