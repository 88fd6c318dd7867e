"""``trainfit train --backend hf|trl``: the same job run by HF ``Trainer`` (causal-LM text) or TRL
``SFTTrainer`` (chat data) instead of trainfit's own loop.

What is shared with the own loop, so the run is the step ``plan`` predicted and ``tune`` measured:
the model and optimizer come from :func:`trainfit.model.runtime.build_real` (same init, attention,
checkpointing, precision, fused/foreach/8-bit optimizer) and are handed to the trainer
(``optimizers=``); the scheduler is the own loop's linear decay; the samples are drawn in
trainfit's (seed, epoch) order (:class:`OrderSampler`) and padded by trainfit's collator. With one
rank the per-step losses equal the own loop's (tests/run/test_hf_backend.py).

One difference in the samples: the trainers' epoch is whole micro-batches (``drop_last``) and the
next epoch starts a new permutation, where the own loop draws one stream across epochs; when the
data size is a multiple of the effective batch both draw the same samples in every step.

What the trainers add: their callbacks, logging and checkpoint format (``checkpoint-N`` with
``trainer_state.json``; resume through ``resume_from_checkpoint``, which skips the batches already
consumed). What trainfit adds to them (:class:`~trainfit.run.hf_oom.SplitOnOOM`): an OOM in a
micro-step frees the partial gradients and redoes the optimizer step's micro-batches so far in
halves — the loss is normalised by the step's label tokens (``num_items_in_batch``), so the split
is exact; SIGINT / SIGTERM save a checkpoint and stop.

Not here (use ``--backend trainfit``): OOM recovery under many ranks (one rank splitting while
another waits in the all-reduce would hang), and ``module:factory`` models (no ``PreTrainedModel``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from trainfit import json_text
from trainfit.data.dataset import TokenData
from trainfit.data.load import load_data, with_data_packing
from trainfit.data.loader import SampleOrder
from trainfit.data.tokenizer import load_tokenizer
from trainfit.job import JobError, JobSpec
from trainfit.model.runtime import build_real, check_no_offload, parse_device
from trainfit.model.source import resolve_model
from trainfit.monitor import Sampler
from trainfit.monitor.progress import ProgressLog, StepProgress
from trainfit.monitor.sampler import rates_paused
from trainfit.run import resume_fields as rf
from trainfit.run.backend import resolve_backend
from trainfit.run.checks import (
    check_data_size,
    check_runnable,
    check_steps_left,
    ended_run,
    limit_tracker,
    linear_decay,
    schedule_note,
    take_schedule_rate,
    total_steps,
)
from trainfit.run.evaluate import eval_split
from trainfit.run.hf_checkpoint import HISTORY, hf_max_steps, last_checkpoint, read_history
from trainfit.run.hf_data import OrderSampler, RowCollate, train_dataset
from trainfit.run.hf_oom import SplitOnOOM
from trainfit.run.oom import OomEvent
from trainfit.run.options import Interrupt, RunOptions, say_kept
from trainfit.run.record import (
    TrainResult,
    closed_record,
    continue_from,
    new_result,
    read_record,
    write_train_json,
)
from trainfit.run.rundir import RunDir
from trainfit.speed.host_timing import busy_host_note, threads_for_load


def _agree(loss: float, stop: bool, ids: list[int], world: int) -> tuple[float, bool, list[int]]:
    """All ranks: the step's loss (HF scales each rank's token-normalised loss by the world size
    when averaging tokens across devices, so the mean over ranks is the global token mean), the
    stop flag (any rank interrupted), and the sample ids of all ranks."""
    import torch.distributed as dist

    t = torch.tensor([loss, 1.0 if stop else 0.0], dtype=torch.float64)
    dist.all_reduce(t)
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, ids)
    return float(t[0]) / world, bool(t[1] > 0), [i for p in parts for i in (p or [])]


class _Eval:
    """trainfit's evaluation (:mod:`trainfit.run.evaluate`: token-mean loss, an OOM lowers the
    evaluation batch only) at the own loop's moments: every ``eval_every_steps`` and at the end."""

    def __init__(self, model: Any, data: TokenData, task: str, opts: RunOptions, job: JobSpec,
                 autocast: Any, device: torch.device, tracker: Any) -> None:
        self.model, self.data, self.task, self.opts = model, data, task, opts
        self.batch = opts.eval_batch or job.micro_batch or 1
        self.autocast, self.device, self.tracker = autocast, device, tracker
        self.injected = set(opts.inject_eval_oom_at_steps)

    def due(self, step: int, last: bool) -> bool:
        every = self.opts.eval_every_steps
        return last or bool(every and step % every == 0)

    def __call__(self, step: int, res: TrainResult, sampler: Any) -> None:
        from trainfit.engine.dist import Dist
        from trainfit.run import evaluate as ev

        with rates_paused(sampler, "evaluation"):  # no tokens are trained meanwhile
            r = ev.evaluate(ev.eval_module(self.model), self.data, task=self.task,
                            batch=self.batch, step=step, device=self.device,
                            autocast=self.autocast, dist=Dist.from_env(), tracker=self.tracker,
                            inject_oom=step in self.injected)
        self.injected.discard(step)
        self.batch = r.eval_batch  # a lowered batch stays lowered
        res.oom_events.extend(r.oom_events)
        res.evals.append(r.to_dict())
        if sampler is not None:
            sampler.record_eval(**r.to_dict())


def _callback(trainer: Any, res: TrainResult, opts: RunOptions, intr: Any, seq_len: int,
              sampler: Any, evaluate: _Eval | None, train_ids: list[int] | None,
              progress: tuple[StepProgress, ProgressLog | None]) -> Any:
    from transformers import TrainerCallback

    t0_run = time.perf_counter()

    class _Watch(TrainerCallback):
        """Per step: the loss, sample ids and monitor line; an interrupt → save and stop; a
        non-finite loss → stop without saving; each save: the record and the digests."""

        def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                           lr_scheduler: Any = None, **kw: Any) -> None:
            # after the trainer loaded the checkpoint's optimizer and scheduler (transformers 5:
            # _prepare_for_training, then on_train_begin), as trainfit's own loop does
            if trainer.trainfit_ended:
                take_schedule_rate(optimizer, lr_scheduler)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if sampler is not None:
                sampler.pause_rates(None)  # the save that on_step_end announced is written
            if not args.should_save:  # the trainer's main process writes
                return
            from trainfit.run.checkpoint import write_digests

            ck = opts.out_dir / f"checkpoint-{state.global_step}"
            elapsed_s = time.perf_counter() - t0_run
            history = res.snapshot(elapsed_s)
            history["checkpoints"] = [*history["checkpoints"], str(ck)]
            history["oom_events"] += [e.to_dict() for e in trainer.trainfit_events]
            (ck / HISTORY).write_text(json_text.dumps(history, indent=1))
            write_digests(ck)
            res.checkpoints.append(str(ck))
            # --keep-last: HF's save_total_limit removed the older ones before this callback
            res.checkpoints = [c for c in res.checkpoints if Path(c).is_dir()]
            # the record as of this save, the open segment's time and this run's OOM splits in
            # it (the checkpoint's history holds both: a review found the train.json beside it
            # without them — a killed run's report read from it)
            running = dataclasses.replace(res, oom_events=_all_events(res, trainer))
            write_train_json(opts.out_dir, running, open_wall_time_s=elapsed_s)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if sampler is not None:
                sampler.pause_rates(None)  # a step runs (a save that did not happen: unpaused)
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            dt = time.perf_counter() - self.t0
            eff = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            loss, ids = trainer.trainfit_step_loss, list(trainer.trainfit_ids)
            if train_ids is not None:  # held-out evaluation: ids in the file's numbering
                ids = [train_ids[i] for i in ids]
            stop = intr.requested or opts.inject_interrupt_at_step == state.global_step - 1
            if args.world_size > 1:  # every rank reports the global loss and takes the same decision
                loss, stop, ids = _agree(loss, stop, ids, args.world_size)
            skipped = bool(getattr(trainer.accelerator, "optimizer_step_was_skipped", False))
            if not math.isfinite(loss) and not skipped:
                res.diverged_at_step = state.global_step
                control.should_save = False  # the weights took a non-finite update
                control.should_training_stop = True
                return
            res.scaler_skipped_steps += skipped
            split = trainer.trainfit_split  # an OOM split runs each batch in this many parts
            res.add_step(loss if math.isfinite(loss) else None, eff, eff * seq_len,
                         math.ceil(args.per_device_train_batch_size / split),
                         args.gradient_accumulation_steps * split)
            if opts.record_samples:
                res.samples.append(ids)
            if sampler is not None:
                sampler.record_step(step=state.global_step, loss=loss, tokens=eff * seq_len,
                                    samples=eff, step_time_s=dt,
                                    peak_allocated_bytes=torch.cuda.max_memory_allocated()
                                    if torch.cuda.is_available() else None)
            progress[0].record(state.global_step, tokens=eff * seq_len, step_time_s=dt, loss=loss)
            if progress[1] is not None:
                progress[1].step()
            # evaluate, then save (HF Trainer's order); not on the way out of an interrupt
            if evaluate is not None and not stop and evaluate.due(state.global_step,
                                                                  state.global_step >= state.max_steps):
                evaluate(state.global_step, res, sampler)
            if stop:
                res.interrupted = True
                res.signal = intr.signal
                control.should_save = True
                control.should_training_stop = True
            if control.should_save and sampler is not None:
                # the Trainer saves after the callbacks (HF's _maybe_log_save_evaluate): no
                # tokens are trained until on_save
                sampler.pause_rates("checkpoint")

    return _Watch()


def _all_events(res: TrainResult, trainer: Any) -> list[OomEvent]:
    """The record's OOM events with this run's trainer's splits, in step order."""
    return sorted([*res.oom_events, *trainer.trainfit_events], key=lambda e: e.step)


def _training_args(job: JobSpec, opts: RunOptions, backend: str, total: int, device: torch.device
                   ) -> Any:
    from trainfit.job.emit import hf_training_args, trl_sft_config
    from trainfit.job.script_settings import checkpointing_name

    kw = trl_sft_config(job) if backend == "trl" else hf_training_args(job)
    kw.pop("optim")  # the optimizer is trainfit's own, handed in (same kernel as plan/tune)
    # build_real already enabled checkpointing on the model (the job's mode): enabling it again
    # through the trainer would re-wrap the layers. The name is the one hf_training_args wrote
    # (emit's checkpointing_name, for the transformers trainfit pins)
    name = checkpointing_name(None)
    kw.pop(name, None)
    kw.pop(f"{name}_kwargs", None)
    if job.precision == "bf16-true":
        kw["bf16"] = False  # the weights are bf16 already; no autocast on top
    save = opts.save_every_steps
    kw.update(output_dir=str(opts.out_dir), max_steps=total, logging_steps=1, report_to=[],
              save_strategy="steps" if save else "no", save_steps=save or total,
              save_total_limit=opts.keep_last,
              use_cpu=device.type == "cpu", dataloader_drop_last=True, remove_unused_columns=False,
              disable_tqdm=True, logging_nan_inf_filter=False)
    if backend == "trl":
        from trl import SFTConfig

        # the rows are tokenized, packed and padded by trainfit (the same samples as tune measured)
        kw.update(dataset_kwargs={"skip_prepare_dataset": True}, packing=False)
        return SFTConfig(**kw)
    from transformers import TrainingArguments

    return TrainingArguments(**kw)


def _trainer_class(backend: str, order: SampleOrder) -> type:
    if backend == "trl":
        from trl import SFTTrainer as base
    else:
        from transformers import Trainer as base

    def _get_train_sampler(self: Any, train_dataset: Any = None) -> OrderSampler:
        return OrderSampler(order)

    return type(f"Trainfit{base.__name__}", (SplitOnOOM, base),
                {"_get_train_sampler": _get_train_sampler})


def run_hf(job: JobSpec, opts: RunOptions, backend: str, data: TokenData | None = None
           ) -> TrainResult:
    """The job through HF Trainer / TRL SFTTrainer; the same result object as the own loop."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = parse_device(opts.device)
    source = resolve_model(job.model, job.trust_remote_code)
    data = data if data is not None else load_data(job, source)
    job = with_data_packing(job, data)  # recorded, and compared on resume, as the own loop
    backend = resolve_backend(backend, source.task, data.stats.kind)
    check_runnable(job, world)
    if job.padding_free:
        # the own loop packs its rows (data/loader.py Collate); the trainers' collators here
        # add a mask TRL needs, which would hide the packing from the model
        raise JobError(f"--padding-free with --backend {backend}: trainfit packs rows in its "
                       "own loop only", "use --backend trainfit, or drop --padding-free (TRL's "
                       "SFTConfig(padding_free=True) packs in your own script)")
    if job.activation_offload and backend == "hf":
        raise JobError("--activation-offload with --backend hf: TrainingArguments has no "
                       "activation offloading", "use --backend trl (SFTConfig's "
                       "activation_offloading, TRL's own) or --backend trainfit")
    if device.type == "cuda" and (device.index or 0) != 0 and world == 1:
        raise JobError(f"--device {opts.device}: the hf/trl backends use the first visible GPU",
                       f"run with CUDA_VISIBLE_DEVICES={device.index} and --device cuda")
    resume, note = last_checkpoint(opts.resume) if opts.resume is not None else (None, None)
    # torch's pool fitted to the cores other processes leave, as the own loop's (run/loop.py;
    # an audit: the hf backend ran 2× slower than it beside a busy neighbour, unsaid)
    fitted = threads_for_load(0.25) if device.type == "cpu" and world == 1 else None
    data, eval_set, train_ids = eval_split(data, job, source, opts.eval_data, opts.eval_fraction)
    check_data_size(len(data), job.effective_batch or 1, f"--data {job.data}")
    tok = load_tokenizer(job.tokenizer, source.name, source.origin, int(source.config.vocab_size),
                         job.trust_remote_code)
    wl = build_real(job, source, device, seed=job.seed, lr=job.lr)
    check_no_offload(wl.model, opts.allow_offload)
    saved_steps = hf_max_steps(resume) if resume is not None else None
    total = total_steps(opts, len(data), job.effective_batch or 1, saved_steps)
    sched = linear_decay(wl.optimizer, total)  # the own loop's schedule, so both backends agree
    cls = _trainer_class(backend, SampleOrder(len(data), seed=job.seed))
    trainer = cls(model=wl.model, args=_training_args(job, opts, backend, total, device),
                  train_dataset=train_dataset(data, backend),
                  data_collator=RowCollate(data, source.task, always_mask=backend == "trl"),
                  processing_class=tok, optimizers=(wl.optimizer, sched))
    trainer._trainfit_init(opts.inject_oom_at_steps, world, hint={
        "job": job, "cuda": device.type == "cuda",
        "can_checkpoint": getattr(source.config, "supports_grad_ckpt", True)})
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    # disable_tqdm covers the Trainer's own bars, not save_pretrained's "Writing model shards"
    # (transformers' logging.tqdm): it went into piped output at every checkpoint (a QA run)
    hf_logging.disable_progress_bar()

    trainer.remove_callback(PrinterCallback)  # trainfit's monitor prints (and logs) the steps
    main = rank == 0
    res = new_result({**job.to_dict(), "backend": backend}, main=main)
    res.run_options = opts.kept_options()
    res.data_samples, res.data_sha256 = len(data), data.digest()
    res.model_config = rf.config_values(source.config)
    ended = False
    settings: list[str] = []
    if resume is not None:
        step = int(Path(resume).name.rsplit("-", 1)[1])
        check_steps_left(total, step, resume, opts, saved_steps)
        ended = trainer.trainfit_ended = ended_run(saved_steps, step)
        # the run's own record when it ended at this checkpoint (a finished segment stays
        # finished), else the checkpoint's snapshot; a job that makes other samples refused
        run_record = read_record(Path(resume).parent)  # an HF checkpoint carries no job
        history = closed_record(run_record, step, resume) or read_history(Path(resume))
        rf.same_samples(resume, (run_record or {}).get("job"), job.to_dict())
        rf.same_data(resume, history, data)
        rf.same_model_config(resume, history, source.config)
        settings = rf.changed_settings((run_record or {}).get("job"), job.to_dict())
        continue_from(res, history, step, int(history.get("samples_seen", step * (
            job.effective_batch or 1))), data.seq_len)
    tracker = limit_tracker(opts.memory_limit_bytes, wl.model)  # bad input: before any write
    here = resume is not None and Path(resume).parent.resolve() == opts.out_dir.resolve()
    with RunDir(opts.out_dir, resuming=here, main=main) as claim:
        res.resumed_from = resume
        say_kept(opts, main)
        changed = schedule_note(total, saved_steps, res.steps, ended=ended) \
            if resume is not None else None
        busy = None if fitted is None else busy_host_note(*fitted)
        res.begin_segment(res.steps, resume,
                          [n for n in (busy, note, changed, wl.load_note, *settings, *opts.kept_notes,
                                       *claim.notes, *data.stats.notes)
                           if n],
                          device=str(device), memory_limit_bytes=opts.memory_limit_bytes,
                          settings=rf.settings_of(job.to_dict()))
        _train(trainer, res, opts, job, data, source, eval_set, train_ids, wl, device, tracker,
               resume, main, claim, total)
    return res



def _train(trainer: Any, res: TrainResult, opts: RunOptions, job: JobSpec, data: TokenData,
           source: Any,
           eval_set: Any, train_ids: Any, wl: Any, device: torch.device, tracker: Any,
           resume: str | None, main: bool, claim: RunDir, total: int) -> None:
    """The trainer's run inside the claimed directory, watched; the record written at the end."""
    # a CPU run reads no GPU (as the loop's, run/loop.py)
    sampler = Sampler(interval_s=opts.monitor_interval_s, live=opts.live,
                      gpu_indices=[] if device.type == "cpu" else None,
                      log_path=opts.out_dir / "monitor.jsonl", append=True,
                      tensorboard_dir=opts.out_dir / "tensorboard") if main else None
    progress = StepProgress(total)
    if sampler is not None:
        sampler.progress = progress
    log = ProgressLog(progress) if main and not (sampler is not None and sampler.live) else None
    t0 = time.perf_counter()
    start_step = res.steps
    with Interrupt() as intr, (sampler or contextlib.nullcontext()):
        if sampler is not None:
            sampler.start()
        evaluate = None if eval_set is None else _Eval(wl.model, eval_set, source.task, opts, job,
                                                       wl.autocast, device, tracker)
        trainer.add_callback(_callback(trainer, res, opts, intr, data.seq_len, sampler, evaluate,
                                       train_ids, (progress, log)))
        try:
            with (tracker or contextlib.nullcontext()):
                trainer.train(resume_from_checkpoint=resume)
        except ValueError as err:  # HF refuses a checkpoint it cannot load (another model, …)
            if resume is None:  # not a resume's (an audit: a TRL refusal read "--resume None")
                raise JobError(f"the {res.job.get('backend') or 'hf'} trainer refused the run: {err}",
                               "train without --backend (trainfit's own loop) runs the same "
                               "step") from None
            raise JobError(f"--resume {opts.resume}: {err}", "resume with the job that wrote it") \
                from None
        except RuntimeError as err:  # the weights of another model: a size-mismatch traceback
            if resume is None or "state_dict" not in str(err):  # (an audit)
                raise
            raise JobError(f"--resume {opts.resume}: the checkpoint belongs to another model "
                           f"({str(err).splitlines()[0][:120]})",
                           "resume with the job that wrote it") from None
        finally:
            claim.steps_done = res.steps - start_step
    steps = trainer.state.global_step
    diverged = res.diverged_at_step is not None
    if not res.interrupted and not diverged and steps and \
            not (opts.out_dir / f"checkpoint-{steps}").exists():
        trainer._save_checkpoint(trainer.model, trial=None)  # the own loop also saves at the end
        trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
    res.monitor_notes(sampler)
    # the step's events (the trainer's split) and the evaluations' (lowered evaluation batch)
    res.oom_events = _all_events(res, trainer)
    res.checkpoints = sorted(set(res.checkpoints), key=lambda s: int(s.rsplit("-", 1)[1]))
    res.close_segment(time.perf_counter() - t0, "diverged" if diverged else
                      "interrupted" if res.interrupted else "finished")
    if main:
        write_train_json(opts.out_dir, res)
