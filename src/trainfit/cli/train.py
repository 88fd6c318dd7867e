"""``trainfit train JOB.yaml``: parse → :func:`trainfit.run.loop.train` (or torchrun with --nproc)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from trainfit import json_text
from trainfit.cli.gpu_arg import check_file_gpu
from trainfit.cli.jobargs import (
    GENERIC_HINT,
    AllowCode,
    TrustRemoteCode,
    echo_error,
    fail,
    file_memory_limit,
    job_for_model,
    parse_bytes,
)
from trainfit.job import JobError, JobSpec, read_job_file
from trainfit.job.fields import in_file_words
from trainfit.job.files import size_text
from trainfit.run.launch import check_nproc, launch, launched_rank, leave_error


def _memory_limit(flag: str | None, extra: dict[str, Any], device: str, job_file: str,
                  quiet: bool) -> int | None:
    """``--memory-limit``, else on the CPU the capacity a CPU-tuned file's pick had to fit in
    (tune --memory-limit): the run's stand-in too, as the file's device is (said unless
    ``quiet``). On a GPU the card is the limit; the file's value is checked either way."""
    file_limit = file_memory_limit(extra)
    if flag is not None:
        return parse_bytes(flag, "--memory-limit")
    tuned_on_cpu = str(extra.get("device") or "cpu") == "cpu"  # not a card's capacity
    if file_limit is None or device != "cpu" or not tuned_on_cpu:
        return None
    if not quiet:
        typer.echo(f"memory limit {size_text(file_limit)} from {job_file}'s memory_limit "
                   "(what its pick was tuned to fit; --memory-limit overrides)", err=True)
    return file_limit


def _launch(nproc: int, device: str, job: JobSpec, job_file: str, out: str,
            as_json: bool) -> int:
    """``--nproc N``: the same command under torchrun (run/launch.py), its ranks' errors or
    a dead rank said here (under ``--json`` also as one error object on stdout: the ranks
    print none); the run's exit code."""
    launched = launch(nproc, device, job, job_file, Path(out), sys.argv[1:])
    said: list[tuple[str, str]] = []
    for e in launched.errors:
        said.append((("" if e.rank == 0 else f"rank {e.rank}: ") + e.message,
                     e.hint or GENERIC_HINT))
        echo_error(*said[-1])
    if (f := launched.failure) is not None:
        ckpt = f.newest_checkpoint
        said.append((f"a process of the run ended abnormally ({f.how}; its own lines are "
                     "above)" + (f"; its newest checkpoint is {ckpt}" if ckpt else
                                 "; no checkpoint was saved"),
                     (f"continue with --resume {out}" if ckpt else "run it again")
                     + " (a rank killed by the system: host or GPU memory ran out — see dmesg, "
                     "or lower the micro-batch)"))
        echo_error(*said[-1])
    if as_json and said:
        # one object, as every --json error (docs/json-formats.md); the others under "errors"
        doc: dict[str, Any] = {"error": said[0][0], "hint": said[0][1],
                               "exit_code": launched.exit_code}
        if len(said) > 1:
            doc["errors"] = [{"error": m, "hint": h} for m, h in said]
        typer.echo(json.dumps(doc))
    return launched.exit_code


def _job_of(job_file: str, micro_batch: int | None, allow_code: bool, trust_remote_code: bool
            ) -> tuple[JobSpec, dict[str, Any]]:
    """The job file (code in it only with --allow-code; remote code only with
    --trust-remote-code) with --micro-batch on top (the effective batch is kept)."""
    fields, extra = read_job_file(job_file, allow_code=allow_code,
                                  trust_remote_code=trust_remote_code)
    check_file_gpu(extra, job_file)
    if trust_remote_code:
        fields["trust_remote_code"] = True
    if micro_batch is not None:
        if fields.get("effective_batch") is None:
            # a file of micro-batch × accumulation alone: its effective batch is kept as that
            # (a review: --micro-batch 2 on 4 × 2 trained at 2 × 1, another effective batch)
            fields["effective_batch"] = JobSpec.from_dict(
                fields, source=job_file).effective_batch
        fields["micro_batch"] = micro_batch
        fields.pop("grad_accum", None)
    job = JobSpec.from_dict(fields, source=job_file)
    say = (lambda msg: None) if launched_rank() else (lambda msg: typer.echo(msg, err=True))
    return job_for_model(job, fields, say), extra


def _steps(text: str | None, flag: str) -> tuple[int, ...]:
    """A fault drill's steps, comma-separated."""
    if not text:
        return ()
    try:
        steps = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise JobError(f"{flag} {text}: not a list of step numbers",
                       f"e.g. {flag} 3 or {flag} 1,5 (optimizer steps, from 0)") from None
    if any(s < 0 for s in steps):
        raise JobError(f"{flag} {text}: steps count from 0", f"e.g. {flag} 0,3")
    return steps


def _run_dir_of(resume: Path) -> Path:
    """The run directory a ``--resume`` path names: a checkpoint's parent (as run/checkpoint.find
    tells one, whatever its name), or the path."""
    from trainfit.run.checkpoint import is_checkpoint_dir

    return resume.parent if is_checkpoint_dir(resume) else resume


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        job_file: Annotated[str, typer.Argument(help="The job YAML (what trainfit tune wrote).")],
        out: Annotated[str | None, typer.Option(
            help="Run directory: checkpoints, train.json, monitor.jsonl (default trainfit-run; "
                 "with --resume, the resumed run's own directory).")] = None,
        max_steps: Annotated[int | None, typer.Option(help="Optimizer steps to run.")] = None,
        epochs: Annotated[float | None, typer.Option(
            help="Epochs when --max-steps is not given (default 1; on a resume, the length of "
                 "the run that wrote the checkpoint).")] = None,
        save_every: Annotated[int | None, typer.Option(help="Checkpoint every N steps.")] = None,
        keep_last: Annotated[int | None, typer.Option(
            help="Keep the newest N checkpoints, removing older ones after each save (default: "
                 "every one; a full fine-tune's takes 12 B a parameter).")] = None,
        resume: Annotated[str | None, typer.Option(
            help="Run directory or checkpoint to resume from (another micro-batch is allowed).")] = None,
        device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N")] = None,
        memory_limit: Annotated[str | None, typer.Option(
            help="CPU stand-in for a GPU's capacity (OOM path, as tune).")] = None,
        micro_batch: Annotated[int | None, typer.Option(
            help="Override the micro-batch (the effective batch is kept).")] = None,
        nproc: Annotated[int, typer.Option(help="Processes (ranks) through torchrun.")] = 1,
        live: Annotated[bool | None, typer.Option(
            "--live/--no-live", help="Live view (default: on a terminal).")] = None,
        inject_oom_at: Annotated[str | None, typer.Option(
            help="Fault drill: steps (comma-separated, counted from 0 as train.json's "
                 "oom_events: 0 is the progress line's step 1) whose forward raises an OOM "
                 "once.")] = None,
        eval_data: Annotated[str | None, typer.Option(
            help="Evaluation set: a file read and tokenized as the training data.")] = None,
        eval_fraction: Annotated[float | None, typer.Option(
            help="Hold out this fraction of the training samples (by seed) to evaluate on; they "
                 "are not trained on.")] = None,
        eval_every: Annotated[int | None, typer.Option(
            help="Evaluate every N optimizer steps (and always at the end).")] = None,
        eval_batch: Annotated[int | None, typer.Option(
            help="Evaluation batch per rank (default: the micro-batch; halved on OOM).")] = None,
        inject_eval_oom_at: Annotated[str | None, typer.Option(
            help="Fault drill: steps (comma-separated) whose evaluation raises an OOM once.")] = None,
        allow_offload: Annotated[bool, typer.Option(
            help="Accept modules offloaded to cpu/disk by a device map.")] = False,
        allow_code: AllowCode = False,
        trust_remote_code: TrustRemoteCode = False,
        backend: Annotated[str | None, typer.Option(
            help="trainfit (own loop: every guarantee, any model), hf (transformers Trainer), trl "
                 "(SFTTrainer), auto (trl for chat rows, hf for text, the own loop for a "
                 "module:factory model); default: the file's "
                 "backend: key, else trainfit.")] = None,
        as_json: Annotated[bool, typer.Option(
            "--json", help="The run's result (train.json's content) as JSON on stdout.")] = False,
    ) -> None:
        """Run the job: watched live, checkpointed, surviving OOM and interruption.

        Exit codes: 0 the steps ran; 2 bad input or an unusable run directory / checkpoint (one
        error: line); 3 the loss diverged (NaN/inf: stopped, nothing saved after the last good
        checkpoint); 130 / 143 interrupted by SIGINT / SIGTERM (a checkpoint saved: --resume);
        1 under --nproc, a rank that died or failed unexpectedly (--resume from its last
        checkpoint)."""
        import dataclasses

        from trainfit.run.options import RunOptions, check_backend
        from trainfit.run.rundir import check_no_run, check_not_in_use, check_out

        # a resume continues in its run's directory unless told otherwise (an audit: the
        # interrupt's "resume with --resume B" went on into ./trainfit-run)
        if out is None:
            out = str(_run_dir_of(Path(resume))) if resume is not None else "trainfit-run"
        try:
            if nproc < 1:
                check_nproc(nproc, "cpu")
            # the flags' own checks before the job's model is resolved (10 s and more: an audit)
            if resume is not None and not Path(resume).exists():
                raise JobError(f"--resume {resume}: does not exist",
                               "give the run directory of an earlier trainfit train")
            if backend is not None:
                check_backend(backend)
            check_out(Path(out))
            if resume is None and "WORLD_SIZE" not in os.environ:
                # RunDir checks both again, under its lock; a live run is named first
                check_not_in_use(Path(out), "--out")
                check_no_run(Path(out))
            opts = RunOptions(out_dir=Path(out), max_steps=max_steps, epochs=epochs,
                              save_every_steps=save_every, keep_last=keep_last,
                              resume=Path(resume) if resume else None, device="cpu",
                              live=live, allow_offload=allow_offload,
                              inject_oom_at_steps=_steps(inject_oom_at, "--inject-oom-at"),
                              eval_data=Path(eval_data) if eval_data else None,
                              eval_fraction=eval_fraction, eval_every_steps=eval_every,
                              eval_batch=eval_batch,
                              inject_eval_oom_at_steps=_steps(inject_eval_oom_at,
                                                              "--inject-eval-oom-at"))
            opts = _kept_on_resume(opts)
            job, extra = _job_of(job_file, micro_batch, allow_code, trust_remote_code)
            dev = device or str(extra.get("device") or "cpu")
            limit = _memory_limit(memory_limit, extra, dev, job_file, quiet=as_json or launched_rank())
            opts = dataclasses.replace(opts, device=dev, memory_limit_bytes=limit)
            if nproc > 1 and "WORLD_SIZE" not in os.environ:
                raise typer.Exit(_launch(nproc, dev, job, job_file, out, as_json))
            from trainfit.run.backend import run_backend  # torch: after the input's checks

            result = run_backend(job, opts, backend or str(extra.get("backend") or "trainfit"))
        except JobError as err:
            # train takes the job from its file: a job field is named by its YAML key (the
            # micro-batch by its flag when --micro-batch gave it)
            flags = ("micro_batch",) if micro_batch is not None else ()
            err = in_file_words(err, job_file, keep=(*flags, "trust_remote_code"))
            if launched_rank():
                leave_error(err)
                raise typer.Exit(2) from None
            fail(err, as_json=as_json)
            return
        _finish(result, out, as_json, said=opts.kept_notes)


def _kept_on_resume(opts: Any) -> Any:
    """A resume keeps the run's checkpointing and evaluation options that the command line does
    not give again (``run_options`` in its train.json); the run says each on stderr once the
    resume passed its checks (run/options.say_kept)."""
    if opts.resume is None:
        return opts
    from trainfit.run.options import options_kept
    from trainfit.run.record import read_record

    where = Path(opts.resume)
    record = read_record(where) or read_record(where.parent) or {}
    saved = record.get("run_options")
    if not isinstance(saved, dict):
        return opts
    return options_kept(opts, saved)[0]


def _finish(result: Any, out: str, as_json: bool, said: tuple[str, ...] = ()) -> None:
    """Print the run (JSON or the summary); a diverged run adds its error line; exit with the
    run's code.  ``said``: notes already said on stderr as the run began (the options a resume
    kept), left out of the summary's (an audit: each printed twice)."""
    d: dict[str, Any] = result.to_dict()
    # under torchrun every rank returns the run: rank 0 alone prints it (--nproc 2 --json
    # printed two JSON documents, invalid together; the summary twice)
    if int(os.environ.get("RANK", "0")) != 0:
        if result.exit_code:
            raise typer.Exit(result.exit_code)
        return
    if as_json:
        typer.echo(json_text.dumps(d, indent=1))
    else:
        from trainfit.render.train import render_train

        render_train(d, out, said)
    if result.stopped == "diverged":
        # the checkpoints before the step hold the weights that led to it (the last one is the
        # update that made the loss non-finite), and a resume refuses another lr
        # (resume_fields.OPTIMIZER_FIELDS): the fix is a new run (a QA run)
        saved = (f"; the checkpoints ({', '.join(Path(c).name for c in result.checkpoints)}) "
                 "hold the weights that led there" if result.checkpoints else "")
        typer.echo(f"error: the loss became non-finite at step {result.diverged_at_step}: "
                   f"training stopped, nothing saved after it{saved}", err=True)
        # only the precisions that are wider than the job's (an audit: fp32 offered to fp32)
        wider = {"amp-fp16": "amp-bf16 / fp32", "bf16-true": "amp-bf16 / fp32",
                 "amp-bf16": "fp32"}.get(d.get("job", {}).get("precision") or "fp32")
        typer.echo(f"hint: set a lower lr{f' (or precision: {wider})' if wider else ''} in the "
                   "job file, or look at the data near that step; then run again into a new "
                   "--out (a resume refuses another lr)", err=True)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
