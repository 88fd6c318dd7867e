"""``trainfit train JOB.yaml``: parse → :func:`trainfit.run.loop.train` (or torchrun with --nproc)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from trainfit.cli.jobargs import (
    GENERIC_HINT,
    AllowCode,
    TrustRemoteCode,
    fail,
    file_memory_limit,
    job_for_model,
    parse_bytes,
)
from trainfit.job import JobError, JobSpec, read_job_file
from trainfit.job.fields import in_file_words
from trainfit.job.files import size_text


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


def _check_nproc(nproc: int, device: str) -> None:
    import torch

    if nproc < 1:
        raise JobError(f"--nproc {nproc}: must be ≥ 1", "--nproc 1 runs one process (the "
                       "default); --nproc N launches N ranks through torchrun")
    if device.startswith("cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if nproc > n:
            raise JobError(f"--nproc {nproc}: only {n} CUDA device(s) here",
                           f"use --nproc ≤ {n}, or several nodes through torchrun's rendezvous")
    elif nproc > (os.cpu_count() or 1):
        raise JobError(f"--nproc {nproc}: only {os.cpu_count()} CPU cores here",
                       f"use --nproc ≤ {os.cpu_count()}")


def _launch(nproc: int, device: str, job: JobSpec, job_file: str, out: str) -> int:
    """``--nproc N``: the same command under torchrun, N ranks (the exit code of torchrun)."""
    _check_nproc(nproc, device)
    if job.ranks != nproc:
        raise JobError(f"--nproc {nproc} but the job says ranks {job.ranks}",
                       f"set ranks: {nproc} in {job_file} (the effective batch is "
                       "global: micro × accumulation × ranks)")
    args = [a for a in sys.argv[1:] if not a.startswith("--nproc")]
    if "--nproc" in sys.argv:
        i = sys.argv.index("--nproc")
        args = sys.argv[1:i] + sys.argv[i + 2:]
    # --standalone: one node, a free rendezvous port of its own (the default, 29500, makes a
    # second run on the same machine fail to start)
    cmd = [sys.executable, "-m", "trainfit.run.torchrun", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "trainfit.cli.main", *args]
    # each rank's bad-input error comes back through a file, said here once (every rank
    # printed it, then torchrun's failure dump: an audit), with the rank's exit code
    errors = Path(tempfile.mkdtemp(prefix="trainfit-ranks-"))
    try:
        started = time.time()
        code, relayed = _run_torchrun(cmd, {**os.environ, RANK_ERRORS_ENV: str(errors)})
        said = _said_errors(errors)
    finally:
        shutil.rmtree(errors, ignore_errors=True)
    if said:
        return said
    if not code:
        return 0
    # torchrun exits 1 whenever a rank exits non-zero: the run's record says which it was; a
    # signal relayed before the ranks could take it (torchrun or a rank still starting) is
    # the signal's code, as it is for one process (a review: 241, 254 and 1)
    from trainfit.run.record import EXIT_DIVERGED, EXIT_SIGINT, EXIT_SIGTERM

    said_code = _exit_code_of(Path(out), code, since=started)
    if said_code in (EXIT_DIVERGED, EXIT_SIGINT, EXIT_SIGTERM):
        return said_code
    if relayed:
        return 128 + relayed
    # a rank that died (the kernel's OOM killer, a segfault) or failed unexpectedly: torchrun's
    # log lines alone, exit 1, no way forward said (an audit)
    _say_rank_failure(Path(out), code)
    return 1


def _run_torchrun(cmd: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """torchrun's exit code, and the last signal relayed to it or its ranks (None: none)."""
    # torchrun in a session of its own, the signals relayed by this process to the ranks
    # themselves: each finishes its step, saves the checkpoint with the others and exits
    # 130/143. Sent to torchrun (a terminal's Ctrl-C reached it), it relays them with a 30 s
    # limit before SIGKILL (torch.distributed.elastic's _shutdown), short for a large
    # checkpoint; a SIGTERM to this process left the ranks running, orphaned, and a SIGINT to it
    # alone did nothing (an audit). Linux: torchrun also ends if this process is killed.
    relayed: list[int] = []
    started: list[subprocess.Popen[Any]] = []

    def relay(signum: int, _frame: Any) -> None:
        relayed.append(signum)
        if started:
            _signal_ranks(started[0], signum)

    # the handlers first: a signal while torchrun starts is relayed once it has started
    previous = {s: signal.signal(s, relay) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        started.append(subprocess.Popen(cmd, env=env, start_new_session=True,
                                        preexec_fn=_end_with_parent()))
        if relayed:
            _signal_ranks(started[0], relayed[-1])
        code = started[0].wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return code, relayed[-1] if relayed else None


RANK_ERRORS_ENV = "TRAINFIT_RANK_ERRORS"
"""The folder where a rank launched by ``--nproc`` leaves its error (``rank-N.json``)."""


def launched_rank() -> bool:
    """This process is a rank that ``train --nproc`` started: its launcher says the notes and
    the errors."""
    return "WORLD_SIZE" in os.environ and bool(os.environ.get(RANK_ERRORS_ENV))


def _leave_error(err: JobError) -> None:
    """A launched rank's error, for its launcher (written whole, then renamed: never half)."""
    d = Path(os.environ[RANK_ERRORS_ENV])
    rank = int(os.environ.get("RANK", "0"))
    tmp = d / f".rank-{rank}.json"
    tmp.write_text(json.dumps({"rank": rank, "message": " ".join(str(err).split()),
                               "hint": err.hint}))
    tmp.replace(d / f"rank-{rank}.json")


def _said_errors(d: Path) -> int:
    """The ranks' errors, each different one said once (rank 0's first); 2 if any, else 0."""
    errors = []
    for f in d.glob("rank-*.json"):
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    seen: set[str] = set()
    for e in sorted(errors, key=lambda e: e.get("rank", 0)):
        if e.get("message") in seen:
            continue
        seen.add(e.get("message"))
        who = "" if e.get("rank") == 0 else f"rank {e.get('rank')}: "
        typer.echo(f"error: {who}{e.get('message')}", err=True)
        typer.echo(f"hint: {e.get('hint') or GENERIC_HINT}", err=True)
    return 2 if errors else 0


def _say_rank_failure(out: Path, code: int) -> None:
    from trainfit.run.checkpoint import checkpoints

    kept = [c.name for c in checkpoints(out)] if out.is_dir() else []
    how = f"killed by signal {-code}" if code < 0 else f"torchrun exit code {code}"
    typer.echo(f"error: a process of the run ended abnormally ({how}; its own lines are above)"
               + (f"; its newest checkpoint is {out / kept[0]}" if kept else
                  "; no checkpoint was saved"), err=True)
    typer.echo("hint: " + (f"continue with --resume {out}" if kept else "run it again")
               + " (a rank killed by the system: host or GPU memory ran out — see dmesg, or "
               "lower the micro-batch)", err=True)


def _signal_ranks(proc: subprocess.Popen[Any], signum: int) -> None:
    """``signum`` to torchrun's workers (the ranks), or to torchrun while it has none."""
    import psutil

    try:
        ranks = psutil.Process(proc.pid).children()
    except psutil.Error:
        ranks = []
    for r in ranks:
        try:
            r.send_signal(signum)
        except psutil.Error:  # already gone
            pass
    if not ranks and proc.poll() is None:
        proc.send_signal(signum)


def _end_with_parent() -> Any:
    """A ``preexec_fn`` that has the kernel send the child SIGTERM when this process dies
    (``prctl(PR_SET_PDEATHSIG)``, Linux); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    def set_death_signal() -> None:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1

    return set_death_signal


def _exit_code_of(out: Path, code: int, since: float | None = None) -> int:
    """The documented exit code of the run in ``out`` (interrupted: 130/143, diverged: 3);
    ``since``: only a train.json written from then on (an earlier segment's "interrupted" made
    a rank killed on the resume exit 143, unsaid: a review)."""
    from trainfit.run.record import EXIT_DIVERGED, EXIT_SIGINT, EXIT_SIGTERM

    try:
        if since is not None and (out / "train.json").stat().st_mtime < since:
            return code
        d = json.loads((out / "train.json").read_text())
    except (OSError, ValueError):
        return code
    return {"diverged": EXIT_DIVERGED, "interrupted": EXIT_SIGTERM if d.get("signal") == "SIGTERM"
            else EXIT_SIGINT}.get(d.get("stopped"), code)


def _job_of(job_file: str, micro_batch: int | None, allow_code: bool, trust_remote_code: bool
            ) -> tuple[JobSpec, dict[str, Any]]:
    """The job file (code in it only with --allow-code; remote code only with
    --trust-remote-code) with --micro-batch on top (the effective batch is kept)."""
    fields, extra = read_job_file(job_file, allow_code=allow_code,
                                  trust_remote_code=trust_remote_code)
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


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        job_file: Annotated[str, typer.Argument(help="The job YAML (what trainfit tune wrote).")],
        out: Annotated[str, typer.Option(help="Run directory: checkpoints, train.json, "
                                              "monitor.jsonl.")] = "trainfit-run",
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
                 "(SFTTrainer), auto (trl for chat rows, hf for text); default: the file's "
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

        try:
            if nproc < 1:
                _check_nproc(nproc, "cpu")
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
                raise typer.Exit(_launch(nproc, dev, job, job_file, out))
            from trainfit.run.backend import run_backend  # torch: after the input's checks

            result = run_backend(job, opts, backend or str(extra.get("backend") or "trainfit"))
        except JobError as err:
            # train takes the job from its file: a job field is named by its YAML key (the
            # micro-batch by its flag when --micro-batch gave it)
            flags = ("micro_batch",) if micro_batch is not None else ()
            err = in_file_words(err, job_file, keep=(*flags, "trust_remote_code"))
            if launched_rank():
                _leave_error(err)
                raise typer.Exit(2) from None
            fail(err)
            return
        _finish(result, out, as_json)


def _kept_on_resume(opts: Any) -> Any:
    """A resume keeps the run's checkpointing and evaluation options that the command line does
    not give again (``run_options`` in its train.json), each said on stderr."""
    if opts.resume is None:
        return opts
    from trainfit.run.options import options_kept
    from trainfit.run.record import read_record

    where = Path(opts.resume)
    record = read_record(where) or read_record(where.parent) or {}
    saved = record.get("run_options")
    if not isinstance(saved, dict):
        return opts
    opts, notes = options_kept(opts, saved)
    for n in notes if not launched_rank() else ():  # the launcher said them
        typer.echo(n, err=True)
    return opts


def _finish(result: Any, out: str, as_json: bool) -> None:
    """Print the run (JSON or the summary); a diverged run adds its error line; exit with the
    run's code."""
    d: dict[str, Any] = result.to_dict()
    # under torchrun every rank returns the run: rank 0 alone prints it (--nproc 2 --json
    # printed two JSON documents, invalid together; the summary twice)
    if int(os.environ.get("RANK", "0")) != 0:
        if result.exit_code:
            raise typer.Exit(result.exit_code)
        return
    if as_json:
        typer.echo(json.dumps(d, indent=1))
    else:
        from trainfit.render.train import render_train

        render_train(d, out)
    if result.stopped == "diverged":
        # the checkpoints before the step hold the weights that led to it (the last one is the
        # update that made the loss non-finite), and a resume refuses another lr
        # (resume_fields.OPTIMIZER_FIELDS): the fix is a new run (a QA run)
        saved = (f"; the checkpoints ({', '.join(Path(c).name for c in result.checkpoints)}) "
                 "hold the weights that led there" if result.checkpoints else "")
        typer.echo(f"error: the loss became non-finite at step {result.diverged_at_step}: "
                   f"training stopped, nothing saved after it{saved}", err=True)
        typer.echo("hint: set a lower lr (or precision: amp-bf16 / fp32) in the job file, or "
                   "look at the data near that step; then run again into a new --out (a resume "
                   "refuses another lr)", err=True)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
