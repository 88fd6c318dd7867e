"""``trainfit train``: the tuned job in a loop around the one ``train_step`` — watched, checkpointed,
surviving OOM (halve the micro-batch, double the accumulation, redo the same samples) and
interruption (SIGINT/SIGTERM → checkpoint, exit; resume restores everything), on one or many ranks.

Exactness: the sample order is a function of (seed, epoch); the position is the number of samples
consumed; the loss of every micro-batch is weighted by its share of the effective batch's label
tokens. So an OOM split, a resume, or a resume at another micro-batch computes the same gradients
as the uninterrupted run (to float summation order) — where the model draws no dropout masks:
those are drawn per micro-batch, for its shape, so after a split or a resume at another
micro-batch they differ (the same in expectation), which the run's notes say (run/oom.py
``dropout_note``); the random state is put back before an OOM's redo.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trainfit.data.dataset import TokenData
from trainfit.data.loader import LoaderKnobs
from trainfit.engine.dist import Dist, mixed_precision_policy
from trainfit.engine.step import OptimizerOOM, train_step
from trainfit.job import JobError, JobSpec
from trainfit.memory.limit import LimitTracker
from trainfit.model.runtime import build_real, check_no_offload, parse_device, use_job_allocator
from trainfit.model.source import resolve_model
from trainfit.monitor.progress import ProgressLog, StepProgress
from trainfit.monitor.sampler import rates_paused
from trainfit.run import checkpoint as ckpt
from trainfit.run import evaluate as ev
from trainfit.run import resume_fields as rf
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
from trainfit.run.feed import Feed
from trainfit.run.oom import (
    OomEvent,
    cannot_split,
    dropout_note,
    free_after_oom,
    oom_chain,
    optimizer_oom,
    rng_state,
    set_rng_state,
    smaller_micro_batch,
)
from trainfit.run.options import Interrupt, RunOptions, say_kept
from trainfit.run.record import (
    TrainResult,
    closed_record,
    continue_from,
    new_result,
    read_record,
    write_train_json,
)
from trainfit.run.rundir import RunDir, check_not_in_use
from trainfit.run.saving import save_checkpoint, still_there
from trainfit.speed.host_timing import busy_host_note, threads_for_load

__all__ = ["RunOptions", "TrainResult", "Trainer", "check_data_size", "check_runnable",
           "limit_tracker", "linear_decay", "total_steps", "train"]


class Trainer:
    def __init__(self, job: JobSpec, opts: RunOptions, data: TokenData | None = None) -> None:
        from trainfit.data.load import load_data, with_data_packing

        self.job = job
        self.o = opts
        self.dist = Dist.from_env()
        self.device = parse_device(opts.device)
        if self.dist.world > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        use_job_allocator(job, self.device)
        # torch's pool fitted to the cores other processes leave, as tune's probes ran: a train
        # beside a busy neighbour ran 4x slower than quiet at 2 threads, not at 1 (a QA run)
        fitted = threads_for_load(0.25) if self.device.type == "cpu" and self.dist.world == 1 \
            else None
        self.source = resolve_model(job.model, job.trust_remote_code)
        self.data = data if data is not None else load_data(job, self.source)
        # a resume compares what the samples are, not how the job spelt them
        job = self.job = with_data_packing(job, self.data)
        # the evaluation set; a held-out share replaces self.data by the samples left to train on
        self.data, self.eval_set, self.train_ids = ev.eval_split(
            self.data, job, self.source, opts.eval_data, opts.eval_fraction)
        self.eval_batch = opts.eval_batch or job.micro_batch or 1
        check_runnable(job, self.dist.world)
        check_data_size(len(self.data), job.effective_batch or 1, f"--data {job.data}")
        def wrap(model: torch.nn.Module) -> torch.nn.Module:
            return self.dist.wrap(model, self.device, sharding=job.sharding,
                                  policy=mixed_precision_policy(job.precision,
                                                                job.fsdp_reduce_dtype),
                                  no_sync=job.fsdp_no_sync)

        # FSDP shards the model on meta, before any weight reaches the device (build_real)
        sharded = self.dist.shards(job.sharding)
        self.wl = build_real(job, self.source, self.device, seed=job.seed, lr=job.lr,
                             shard=wrap if sharded else None)
        check_no_offload(self.wl.model, opts.allow_offload)
        self.model = self.wl.model if sharded else wrap(self.wl.model)
        if job.compile:
            self.model = torch.compile(self.model)
        ck, note, saved_steps = None, None, None
        if opts.resume is not None:
            # a run still writing the directory is what to say first: before, its missing
            # checkpoint ("no complete checkpoint in it") or its step were reported instead
            # (rank 0 alone: another rank may get here after rank 0 has claimed the directory)
            resume = Path(opts.resume)
            if self.dist.rank == 0:
                check_not_in_use(resume)
                if resume.name.startswith("checkpoint-"):
                    check_not_in_use(resume.parent)
            ck, note = ckpt.find(opts.resume)
            saved_steps = ckpt.schedule_steps(ck)
        # the run's length, once: a resume without --max-steps / --epochs keeps its schedule
        self.run_steps = total_steps(opts, len(self.data), job.effective_batch or 1, saved_steps)
        self.scheduler = linear_decay(self.wl.optimizer, self.run_steps)
        self.feed = Feed(self.data, self.source.task, job, self.dist, self.device)
        self.state = ckpt.RunState(step=0, position=0, micro_batch=job.micro_batch,
                                   grad_accum=job.grad_accum or 1)
        self.resumed_from: str | None = None
        self.last_saved_step: int | None = None  # the step of the last checkpoint, on every rank
        self.notes: list[str] = [] if fitted is None else [busy_host_note(*fitted)]
        self.notes += [self.wl.load_note] if self.wl.load_note else []  # a partial checkpoint
        self.history: dict[str, Any] = {}
        self.resuming_here = False
        if ck is not None:
            self._restore(ck, note, saved_steps)

    def _restore(self, ck: Path, note: str | None, saved_steps: int | None) -> None:
        """Take a checkpoint's weights, optimizer, schedule, position and record."""
        job, opts = self.job, self.o
        if note:
            self.notes.append(note)
        saved = ckpt.load(ck, self.wl.model, self.wl.optimizer, self.scheduler, self.wl.scaler,
                          self.device, job=job.to_dict())
        check_steps_left(self.run_steps, saved.step, ck, opts, saved_steps)
        ended = ended_run(saved_steps, saved.step)
        if ended:  # its first step takes the new schedule's rate, not the 0 it carries
            take_schedule_rate(self.wl.optimizer, self.scheduler)
        changed = schedule_note(self.run_steps, saved_steps, saved.step, ended=ended)
        if changed:
            self.notes.append(changed)
        # the effective batch is the job's; the micro-batch may differ (another GPU, an OOM)
        self.state = ckpt.RunState(step=saved.step, position=saved.position,
                                   micro_batch=job.micro_batch, grad_accum=job.grad_accum or 1)
        self.resumed_from = str(ck)
        self.last_saved_step = saved.step
        self.history = closed_record(read_record(ck.parent), saved.step, ck) or \
            ckpt.history(ck)
        rf.same_data(ck, self.history, self.data)
        rf.same_model_config(ck, self.history, self.source.config)
        self.notes += rf.changed_settings(ckpt.saved_job(ck), job.to_dict())
        if saved.micro_batch != job.micro_batch:
            said = dropout_note(self.wl.model, self.source.config, job.micro_batch,
                                f"this resume at micro-batch {job.micro_batch} (the checkpoint "
                                f"ran {saved.micro_batch})")
            self.notes += [said] if said else []
        # the run continues in its own directory (a checkpoint of another run starts a new one)
        self.resuming_here = ck.parent.resolve() == Path(opts.out_dir).resolve()
        later = [c.name for c in ckpt.checkpoints(ck.parent)
                 if (ckpt.step_of(c) or 0) > saved.step] if self.resuming_here else []
        if later:  # a QA run: left as they were, a later --resume could pick the wrong one
            self.notes.append(
                f"{', '.join(sorted(later))} in {ck.parent} hold the run as it went on from "
                f"{ck.name} before: each is replaced when this run saves that step; resume "
                f"from this run's own checkpoints")

    # --- the loop ---------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Claim the run directory (checked, locked; every rank leaves together when it cannot
        be), run the steps, write the record. Bad input found here writes nothing."""
        o = self.o
        main = self.dist.rank == 0
        # before anything is written; a resume's optimizer states are loaded by now
        tracker = limit_tracker(o.memory_limit_bytes, self.wl.model, self.wl.optimizer)
        res = new_result(self.job.to_dict(), main=main)
        res.run_options = self.o.kept_options()
        res.data_samples, res.data_sha256 = len(self.data), self.data.digest()
        res.model_config = rf.config_values(self.source.config)
        if self.resumed_from is not None:
            continue_from(res, self.history, self.state.step, self.state.position,
                          self.data.seq_len)
            res.checkpoints = still_there(res.checkpoints, o.out_dir)
        claim = RunDir(o.out_dir, resuming=self.resuming_here, main=main)
        err: JobError | None = None
        try:
            claim.__enter__()
        except JobError as e:
            err = e
        if self.dist.any(err is not None):
            raise err or JobError("rank 0 could not use the run directory",
                                  "see rank 0's error line")
        res.resumed_from = self.resumed_from
        say_kept(self.o, main)
        # then what the data became (packed; rows truncated: their tail is not learned), said
        # as tune and doctor say it
        res.begin_segment(self.state.step, self.resumed_from,
                          [*self.notes, *self.o.kept_notes, *claim.notes,
                           *self.data.stats.notes],
                          device=str(self.device), memory_limit_bytes=self.o.memory_limit_bytes,
                          settings=rf.settings_of(self.job.to_dict()))
        try:
            self._loop(res, claim, tracker)
        except BaseException as exc:
            if claim.steps_done:  # steps ran: their record is kept (else nothing is written)
                # what the monitor saw (a lost GPU is what fails a run) is kept with it
                res.monitor_notes(getattr(self, "sampler", None))
                res.note(f"failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
                self._keep_record(res, "failed")
            claim.__exit__(type(exc), exc, exc.__traceback__)
            raise
        claim.__exit__(None, None, None)
        return res

    def _loop(self, res: TrainResult, claim: RunDir, tracker: LimitTracker | None) -> None:
        o = self.o
        total = self.run_steps
        injected = set(o.inject_oom_at_steps)
        injected_eval = set(o.inject_eval_oom_at_steps)
        self.t_start = time.perf_counter()
        sampler = self._open_monitor()
        it = self.feed.loader(self.state)
        stopped = "finished"
        with Interrupt() as intr, (sampler or contextlib.nullcontext()):
            if sampler is not None:
                sampler.start()
            # an evaluation an interrupt skipped at its step (the resume is at that step): run
            # now, or the curve lost that point, unsaid (an audit)
            if self.resumed_from is not None and self._evaluates(self.state.step) and \
                    not any(e.get("step") == self.state.step for e in res.evals):
                self._evaluate(res, sampler, tracker, injected_eval)
            while self.state.step < total:
                step = self.state.step
                waits: list[float] = []
                ids_done: list[int] = []
                t0 = time.perf_counter()
                scale = self.wl.scaler.get_scale() if self.wl.scaler is not None else None
                rng = rng_state(self.device)  # the redo after an OOM draws from the same state
                out = self._attempt(it, step, ids_done, waits, injected, tracker)
                # every rank splits (or stops) together: 1 = split, 2 = stop
                oom = self.dist.max(2.0 if out is _OPTIMIZER_OOM else float(out is None))
                if oom >= 2:
                    raise optimizer_oom(step, self.job, cuda=self.device.type == "cuda",
                                        limit_bytes=self.o.memory_limit_bytes,
                                        saved_step=self.last_saved_step)
                if oom:
                    self._recover_oom(res, step, tracker)
                    set_rng_state(rng, self.device)
                    it = self.feed.loader(self.state)
                    continue
                assert out is not None and out is not _OPTIMIZER_OOM
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                loss = self.dist.sum(float(out.loss)) / self.dist.world
                skipped = scale is not None and self.wl.scaler.get_scale() < scale
                if not math.isfinite(loss) and not skipped:
                    # the update used non-finite gradients: nothing after the last save is kept
                    res.diverged_at_step = step + 1
                    stopped = "diverged"
                    break
                self._record_step(res, loss, skipped, time.perf_counter() - t0, ids_done, waits,
                                  sampler, tracker)
                claim.steps_done += 1
                if o.inject_interrupt_at_step == step:
                    intr.requested = True
                if self._after_step(res, intr, sampler, tracker, injected_eval):
                    res.interrupted = True
                    res.signal = intr.signal
                    stopped = "interrupted"
                    break
            # always one at the end (inside the sampler's block: it reaches monitor.jsonl)
            if self.eval_set is not None and stopped == "finished" and (
                    not res.evals or res.evals[-1]["step"] != self.state.step):
                self._evaluate(res, sampler, tracker, injected_eval)
            # the last save, still under the signal guard: a SIGTERM now does not cut it
            # on a value every rank holds (rank 0's checkpoint list left it alone in the save)
            if stopped == "finished" and self.last_saved_step != self.state.step:
                self._save(res, sampler)
        # the record under a guard of its own: a Ctrl-C just after the last checkpoint left a
        # finished run recorded "running", exit 130 (an audit); the run is done, so it is kept
        with Interrupt():
            res.monitor_notes(sampler)
            self._keep_record(res, stopped)

    def _open_monitor(self) -> Any:
        """The sampler (rank 0; None elsewhere) and the progress line or live view."""
        from trainfit.monitor import Sampler

        o = self.o
        main = self.dist.rank == 0
        # monitor.jsonl is appended to: a resumed run keeps the lines of the runs before it
        # a CPU run reads no GPU: other processes' cards are not this run's (an audit: their
        # readings were drawn beside the run's CPU tensor count as if it had used them)
        sampler = Sampler(interval_s=o.monitor_interval_s, live=o.live,
                          gpu_indices=[] if self.device.type == "cpu" else None,
                          log_path=o.out_dir / "monitor.jsonl", append=True,
                          tensorboard_dir=o.out_dir / "tensorboard") if main else None
        self.progress = StepProgress(self.run_steps, start_step=self.state.step)
        self.progress_log = None if not main or (sampler is not None and sampler.live) \
            else ProgressLog(self.progress)  # piped: lines on stderr; live: in the view
        self.sampler = sampler
        if sampler is not None:
            sampler.progress = self.progress
        return sampler

    def _after_step(self, res: TrainResult, intr: Interrupt, sampler: Any,
                    tracker: LimitTracker | None, injected_eval: set[int]) -> bool:
        """Evaluate, then save (HF Trainer's order), at a step that asks for either; True when
        an interrupt (on any rank) stops the run here — checkpointed, not evaluated."""
        o = self.o
        stop = self.dist.any(intr.requested)
        if not stop and self._evaluates(self.state.step):
            self._evaluate(res, sampler, tracker, injected_eval)
            # an interrupt during the evaluation stops here, not a step later (an audit)
            stop = self.dist.any(intr.requested)
        if stop or (o.save_every_steps and self.state.step % o.save_every_steps == 0):
            self._save(res, sampler)
            stop = stop or self.dist.any(intr.requested)  # one during the save, too
        return stop

    def _evaluates(self, step: int) -> bool:
        o = self.o
        return bool(self.eval_set is not None and o.eval_every_steps and step
                    and step % o.eval_every_steps == 0)

    def _keep_record(self, res: TrainResult, stopped: str) -> None:
        """Close the segment and write train.json (rank 0): also after a failure, as far as it
        can be written (a full disk may refuse it: the checkpoints' records stay)."""
        if not res.segments or res.segments[-1]["stopped"] is not None:
            return
        res.close_segment(time.perf_counter() - getattr(self, "t_start", time.perf_counter()),
                          stopped)
        if self.dist.rank != 0:
            return
        try:
            write_train_json(self.o.out_dir, res)
        except OSError:
            if stopped != "failed":
                raise
    def _attempt(self, it: Iterator[dict[str, torch.Tensor]], step: int, ids_done: list[int],
                 waits: list[float], injected: set[int], tracker: LimitTracker | None) -> Any:
        """One optimizer step over this rank's micro-batches; None when it ran out of memory."""
        n_micro = math.ceil(self.job.effective_batch // self.dist.world / self.state.micro_batch)
        try:
            with (tracker or contextlib.nullcontext()):
                return train_step(self.model, self.wl.optimizer,
                                  self.feed.batches(it, n_micro, step, ids_done, waits,
                                                    injected, tracker),
                                  grad_accum=self.state.grad_accum, autocast=self.wl.autocast,
                                  max_grad_norm=self.job.max_grad_norm, scaler=self.wl.scaler,
                                  grads_to_none=self.job.grads_to_none,
                                  loss_weights=self.feed.weights(self.state))
        except OptimizerOOM:
            return _OPTIMIZER_OOM  # the ranks stop together (the caller asks them all)
        except torch.OutOfMemoryError:
            # stepped in the backward: weights may be updated already, and the split's
            # accumulation is what the job cannot have (a review: split, then the save refused
            # "--optimizer-in-backward with grad-accum 2", a flag the user never gave)
            return _OPTIMIZER_OOM if self.job.optimizer_in_backward else None

    def _record_step(self, res: TrainResult, loss: float, skipped: bool, dt: float,
                     ids_done: list[int], waits: list[float], sampler: Any,
                     tracker: LimitTracker | None) -> None:
        """A step done: the schedule, the position, the loss (mean over ranks), the samples and
        tokens, the monitor's row. ``skipped``: the GradScaler skipped its update (counted)."""
        self.scheduler.step()
        self.state.step += 1
        self.state.position += self.job.effective_batch
        tokens = self.job.effective_batch * self.data.seq_len
        res.scaler_skipped_steps += skipped
        res.add_step(loss if math.isfinite(loss) else None, self.job.effective_batch, tokens,
                     self.state.micro_batch, self.state.grad_accum)
        if self.o.record_samples:  # ids in the data as loaded (before any hold-out)
            if self.train_ids is not None:
                ids_done = [self.train_ids[i] for i in ids_done]
            res.samples.append(self.dist.gather_ids(ids_done))
        if sampler is not None:
            sampler.record_step(step=self.state.step, loss=loss if math.isfinite(loss) else None,
                                tokens=tokens,
                                samples=self.job.effective_batch, step_time_s=dt,
                                data_wait_s=sum(waits), peak_allocated_bytes=self._peak(tracker))
        self.progress.record(self.state.step, tokens=tokens, step_time_s=dt, loss=loss)
        if self.progress_log is not None:
            self.progress_log.step()

    # --- evaluation -------------------------------------------------------------------------------
    def _evaluate(self, res: TrainResult, sampler: Any, tracker: LimitTracker | None,
                  injected: set[int]) -> None:
        """One evaluation on every rank; its OOM lowers the evaluation batch only."""
        assert self.eval_set is not None
        step = self.state.step
        j = self.job
        knobs = LoaderKnobs.from_job(j, persistent_workers=False)
        with rates_paused(sampler, "evaluation"):  # no tokens are trained meanwhile
            r = ev.evaluate(ev.eval_module(self.model), self.eval_set, task=self.source.task,
                            batch=self.eval_batch, step=step, device=self.device,
                            autocast=self.wl.autocast, dist=self.dist, tracker=tracker,
                            inject_oom=step in injected, knobs=knobs,
                            pin=self.device.type == "cuda")
        injected.discard(step)
        self.eval_batch = r.eval_batch  # a lowered batch stays lowered for the next evaluations
        res.oom_events.extend(r.oom_events)
        res.evals.append(r.to_dict())
        if sampler is not None:
            sampler.record_eval(**r.to_dict())

    def _peak(self, tracker: LimitTracker | None) -> int | None:
        """The log's ``peak_allocated_bytes``: on a GPU the allocator's, also under a
        --memory-limit (its tracker caps live tensor bytes; they were logged as torch's
        allocated peak — a review); on the CPU the tracked live bytes, the only measure there."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        if tracker is not None:
            return tracker.peak.peak_bytes
        return None

    def _recover_oom(self, res: TrainResult, step: int, tracker: LimitTracker | None = None
                     ) -> None:
        """Drop the partial gradients, free, halve the micro-batch, double the accumulation; the
        same samples are redone (the position did not move).  The peak starts again: the
        failed attempt's (up to the card's or the limit's) is not what the run now holds."""
        free_after_oom(lambda: self.wl.optimizer.zero_grad(set_to_none=True))
        if tracker is not None:
            tracker.reset_peak()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        before = self.state.micro_batch
        if before == 1:
            raise cannot_split(step, self.job, cuda=self.device.type == "cuda",
                               splits=oom_chain(res.oom_events),
                               can_checkpoint=getattr(self.source.config, "supports_grad_ckpt",
                                                      True),
                               limit_bytes=self.o.memory_limit_bytes,
                               # a fresh run that did no step leaves nothing: it runs again
                               steps_done=None if self.resumed_from else step)
        per_rank = self.job.effective_batch // self.dist.world
        after = smaller_micro_batch(per_rank, before)
        self.state.micro_batch = after
        self.state.grad_accum = per_rank // after
        res.oom_events.append(OomEvent(step=step, phase="step", batch_before=before,
                                       batch_after=after, grad_accum_after=self.state.grad_accum))
        said = dropout_note(self.wl.model, self.source.config, after,
                            f"the split at step {step + 1}")
        if said and not any(n.startswith("dropout (p = ") for n in res.notes):  # once a run
            res.note(said)

    def _save(self, res: TrainResult, sampler: Any = None) -> None:
        """The checkpoint (with the record so far inside it), then train.json beside it. A save
        that fails on one rank fails on all (the error is rank 0's). The sampler's rates pause
        while it writes (no tokens are trained)."""
        with rates_paused(sampler, "checkpoint"):
            save_checkpoint(self, res)


_OPTIMIZER_OOM = object()
""":meth:`Trainer._attempt`'s answer for an OOM after the backward (not split: run/oom.py)."""


def train(job: JobSpec, opts: RunOptions, data: TokenData | None = None) -> TrainResult:
    # the thread count a busy host made the Trainer lower is the process's: given back after
    # the run (an in-process caller — a test, a notebook — would keep one thread; a review)
    threads = torch.get_num_threads()
    try:
        return Trainer(job, opts, data).run()
    finally:
        torch.set_num_threads(threads)
