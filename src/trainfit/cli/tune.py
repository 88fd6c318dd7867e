"""``trainfit tune``: parse → :func:`trainfit.tune.tuner.tune` → table / --json / trainfit.yaml / --emit."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from trainfit import json_text
from trainfit.cli.emit import emit_job, is_tuned
from trainfit.cli.gpu_arg import check_file_gpu
from trainfit.cli.jobargs import (
    TUNE_HEADER,
    AllowCode,
    TrustRemoteCode,
    check_replaceable,
    check_writable,
    fail,
    file_memory_limit,
    job_for_model,
    job_of_fields,
    parse_bytes,
    write_atomic,
)
from trainfit.cli.jobflags import merge_job_fields, refuse_model_twice, with_job_flags
from trainfit.cli.script import SeesDashes
from trainfit.job import DEFAULT_MARGIN, JobError, JobSpec, read_job_file
from trainfit.job.fields import DEFAULT_KNOBS, KNOB_NAMES, SCRIPT_KNOBS, fixed_knobs
from trainfit.job.files import PATH_FIELDS, absolute_paths


def _job(target: str | None, job_flags: dict[str, Any], trust_remote_code: bool,
         allow_code: bool = False, as_tuned: bool = False) -> tuple[JobSpec, dict[str, Any]]:
    """(the job, the file-only keys of a job file: device, memory_limit, measured ...).
    ``as_tuned``: a file tune wrote is read as written — its job was adapted to the model when
    it was tuned — without resolving the model (emitting it stays under a second)."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    refuse_model_twice(target, job_flags)
    if target is not None and target.endswith((".yaml", ".yml")):
        fields, extra = read_job_file(target, allow_code=allow_code or "model" in job_flags,
                                      trust_remote_code=trust_remote_code)
        check_file_gpu(extra, target)
    elif target is not None:
        fields["model"] = target
    fields = merge_job_fields(fields, job_flags, "trainfit tune MODEL --data FILE ...")
    if trust_remote_code:
        fields["trust_remote_code"] = True
    job = job_of_fields(fields, target, job_flags)
    if as_tuned and is_tuned(extra) and not job_flags:
        return job, extra
    return job_for_model(job, fields, lambda msg: typer.echo(msg, err=True)), extra


def _knob_list(knobs: str | None, try_compile: bool, try_8bit_optimizer: bool) -> tuple[str, ...]:
    """--knobs (default: the registry's), plus the opt-in knobs asked for by their flags."""
    if knobs is not None and not knobs.replace(",", "").strip():
        # an empty list ran the defaults in silence (an audit)
        raise JobError(f"--knobs {knobs!r}: names no knob",
                       f"e.g. --knobs grad_ckpt,precision (choose from {','.join(KNOB_NAMES)}); "
                       "leave it out to search the default ones")
    chosen = tuple(k.strip() for k in knobs.split(",")) if knobs else DEFAULT_KNOBS  # TuneOptions checks
    return chosen + tuple(k for k, on in (("compile", try_compile),
                                          ("optimizer_8bit", try_8bit_optimizer))
                          if on and k not in chosen)


def _unsteady(result: Any) -> Any:
    """The search's ``unsteady`` note (one configuration's probes far apart), or None."""
    return next((n for n in result.notes if getattr(n, "kind", None) == "unsteady"), None)


def _with_spread(measured: dict[str, Any], result: Any) -> dict[str, Any]:
    """The pick's measured numbers, with the run's timing spread when it was unsteady: emit
    repeated an unsteady file's tokens/s as a plain measurement (an audit)."""
    note = _unsteady(result)
    return measured if note is None else \
        {**measured, "timing_spread": round(float(note.data["spread"]), 2)}


def _emit(result: Any, emit: str, source: str) -> None:
    """The pick just tuned, for ``emit``: the payload alone on stdout."""
    from trainfit.cli.emit import emit_job

    extra = {"device": result.device, "memory_limit": result.memory_limit_bytes,
             "measured": _with_spread(result.pick.result.to_dict()["measured"], result)}
    emit_job(result.pick.job, emit, source, extra, device=result.device, searched=True)


def _report(result: Any, out: str | None, emit: str | None, as_json: bool, source: str) -> None:
    from trainfit.job.tuned_file import UNDECIDED_NOTE_KINDS, job_yaml
    from trainfit.render.tune_words import tune_json

    d = tune_json(result)
    if out is not None and result.pick is not None:
        # a path the job names from here works from wherever the file is read (trainfit train)
        from trainfit.render.tune_words import note_words

        picked = result.pick.job.replace(**absolute_paths(
            {k: getattr(result.pick.job, k) for k in PATH_FIELDS}))
        # a run whose own repeats disagreed says so beside the speeds it keeps (an audit: the
        # file said 34 tokens/s, measured, where the run's probes lay 10.9× apart)
        note = _unsteady(result)
        unsteady = [] if note is None else \
            [f"{note_words(note)} — the measured speeds below carry that spread"]
        # what the search could not decide, as the terminal said it: a reader of the file alone
        # did not learn that a faster-looking change went unconfirmed (an audit)
        # and what it took, on what rounds (an audit: a taken change left no trace in the file)
        decided = [note_words(n) for n in result.notes
                   if getattr(n, "kind", None) in (*UNDECIDED_NOTE_KINDS, "taken", "redone",
                                                   "budget")]
        write_atomic(out, job_yaml(
            picked, measured=_with_spread(d["pick"]["measured"], result), device=d["device"],
            memory_limit_bytes=d["memory_limit_bytes"],
            header=[TUNE_HEADER, d["reason"], *unsteady,
                    *decided]))
    if as_json:  # with --emit the payload owns stdout: the result goes to stderr
        typer.echo(json_text.dumps(d, indent=1), err=emit is not None)
    else:
        from trainfit.render.tune import render_tune

        render_tune(result, stderr=emit is not None)
    if emit is not None and result.pick is not None:
        _emit(result, emit, source)


def _tune_script(args: list[str], job_flags: dict[str, Any], *, out: str | None,
                 emit: str | None, device: str | None, memory_limit: str | None,
                 max_host_ram: str | None, margin: float, budget_s: float | None,
                 knobs: tuple[str, ...], fixed: Any, run_steps: int | None,
                 trust_remote_code: bool, timeout_s: float, as_json: bool,
                 explicit: bool = False) -> None:
    """``trainfit tune -- python train.py ARGS``: probe the script's own trainer (``explicit``:
    the knobs were named by --knobs / --try-*, not the default list)."""
    from trainfit.cli.script import tune_script_cmd

    if out is not None or emit is not None:
        raise JobError("--out/--emit apply to a job: for a script, tune prints the "
                       "keywords to change in it", "drop --out/--emit, or tune a job file")
    from trainfit.cli.script import check_script_options

    check_script_options(args, job_flags, timeout_s, "tune")  # before torch loads
    if explicit:
        other = [k for k in knobs if k not in (*SCRIPT_KNOBS, "precision")]
        if other:
            # asked for by name, and not probed on a script: refused, not dropped (an audit)
            raise JobError(f"{', '.join(other)}: not probed on a script — its trainer's model and "
                           "optimizer are the script's own, loaded once",
                           f"drop it (a script's knobs: {', '.join(SCRIPT_KNOBS)}, and precision "
                           "on full fine-tuning of float32 weights), or tune a job file")
    from trainfit.tune.tuner import TuneOptions  # torch: only when probing
    opts = TuneOptions(device=device or "cpu", memory_limit_bytes=parse_bytes(
        memory_limit, "--memory-limit"), margin=margin, budget_s=budget_s,
        max_host_ram_bytes=parse_bytes(max_host_ram, "--max-host-ram"), knobs=knobs,
        fixed=fixed, run_steps=run_steps)
    tune_script_cmd(args, job_flags=job_flags, opts=opts, trust_remote_code=trust_remote_code,
                    timeout_s=timeout_s, as_json=as_json)


def _search(job: Any, opts: Any, quiet: bool, as_json: bool = False) -> Any:
    """Run the search, with a status line on stderr unless ``quiet`` (the JSON result goes to
    stderr: --json with --emit). With --json alone, one line per probe on stderr, as plan's
    progress (an audit: tune --json said nothing for 3.5 minutes)."""
    from trainfit.tune.tuner import tune

    if quiet:
        return tune(job, opts)
    import sys
    import time

    if os.environ.get("RANK", "0") != "0":
        return tune(job, opts)  # under torchrun rank 0 says the progress
    if as_json or not sys.stderr.isatty():
        # piped (a log, CI): rich's status line draws nothing there; one line per probe
        t0 = time.monotonic()

        def line(s: str) -> None:
            print(f"tune: probing {s} ({time.monotonic() - t0:.0f} s)", file=sys.stderr,
                  flush=True)
        return tune(job, opts, progress=line)
    from rich.console import Console

    with Console(stderr=True).status("probing…") as status:
        return tune(job, opts, progress=lambda s: status.update(f"probing {s}"))


def _options(extra: dict[str, Any], *, device: str | None, memory_limit: str | None,
             margin: float, budget_s: float | None, max_host_ram: str | None,
             knobs: tuple[str, ...], fixed: frozenset[str], run_steps: int | None,
             isolate: bool) -> Any:
    """The search's options: the flags, else the job file's keys (device, memory_limit)."""
    from trainfit.tune.tuner import TuneOptions  # torch: only when probing

    limit = parse_bytes(memory_limit, "--memory-limit") if memory_limit is not None \
        else file_memory_limit(extra)
    return TuneOptions(device=device or str(extra.get("device") or "cpu"),
                       memory_limit_bytes=limit, margin=margin, budget_s=budget_s,
                       max_host_ram_bytes=parse_bytes(max_host_ram, "--max-host-ram"),
                       knobs=knobs, fixed=fixed, run_steps=run_steps, isolate=isolate)


def register(app: typer.Typer) -> None:
    @app.command("tune", cls=SeesDashes)
    @with_job_flags()
    def tune_cmd(
        target: Annotated[list[str] | None, typer.Argument(
            help="Model, a job YAML, or after -- your training script: -- python train.py ARGS "
                 "(its own Trainer/SFTTrainer is probed).", show_default=False,
            metavar="MODEL | JOB.yaml | -- COMMAND ARGS")] = None,
        job_flags: dict[str, Any] | None = None,
        device: Annotated[str | None, typer.Option(
            help="cpu, cuda or cuda:N (default: a job file's device: key, else cpu)")] = None,
        memory_limit: Annotated[str | None, typer.Option(
            help="Capacity to fit in, e.g. 2GiB (CPU: live tensor bytes stand in for a GPU; "
                 "default: a job file's memory_limit: key).")] = None,
        max_host_ram: Annotated[str | None, typer.Option(
            help="Host RAM the job may use (process + loader workers), e.g. 7GiB.")] = None,
        margin: Annotated[float, typer.Option(
            help="Fraction of the capacity left free by the pick.")] = DEFAULT_MARGIN,
        budget_s: Annotated[float | None, typer.Option(help="Cap on the search time (s).")] = None,
        knobs: Annotated[str | None, typer.Option(
            help="Knobs to search, comma-separated: " + ",".join(KNOB_NAMES))] = None,
        try_compile: Annotated[bool, typer.Option(help="Also try torch.compile.")] = False,
        try_8bit_optimizer: Annotated[bool, typer.Option(
            help="Also try AdamW with 8-bit states (bitsandbytes; changes the optimizer's "
                 "numerics slightly).")] = False,
        run_steps: Annotated[int | None, typer.Option(
            help="Planned optimizer steps of the run (amortises compile time).")] = None,
        isolate: Annotated[bool, typer.Option(help="Each probe in its own process.")] = False,
        out: Annotated[str | None, typer.Option(
            help="Write the tuned job here (YAML). Job form only: a script's change is printed "
                 "as its keywords.")] = None,
        emit: Annotated[str | None, typer.Option(
            help="hf | trl | accelerate: print the pick as that tool's settings (stdout alone); "
                 "from a tuned file (what --out wrote) without searching again. Job form "
                 "only.")] = None,
        trust_remote_code: TrustRemoteCode = False,
        allow_code: AllowCode = False,
        timeout_s: Annotated[float, typer.Option(
            "--timeout-s", help="Script form: stop the script if tune has not ended by then.")] = 1800.0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    ) -> None:
        """Measure the real job on the real device and choose the fastest configuration that fits."""
        args = list(target or [])
        fixed = fixed_knobs(job_flags or {})
        try:
            knob_list = _knob_list(knobs, try_compile, try_8bit_optimizer)
            from trainfit.cli.script import is_command, refuse_without_dashes

            if is_command(args):
                refuse_without_dashes(args, job_flags or {}, "tune")
                _tune_script(args, job_flags or {}, out=out, emit=emit, device=device,
                             memory_limit=memory_limit, max_host_ram=max_host_ram,
                             margin=margin, budget_s=budget_s, knobs=knob_list, fixed=fixed,
                             run_steps=run_steps, trust_remote_code=trust_remote_code,
                             timeout_s=timeout_s, as_json=as_json,
                             explicit=knobs is not None or try_compile or try_8bit_optimizer)
                return
            if len(args) > 1:
                raise JobError(f"{' '.join(args)}: one model or job file", "a training command "
                               "goes after --: trainfit tune -- python train.py ARGS")
            target = args[0] if args else None
            if emit is not None and emit not in ("hf", "trl", "accelerate"):
                raise JobError(f"--emit {emit}: unknown", "use hf, trl or accelerate")
            job, extra = _job(target, job_flags or {}, trust_remote_code, allow_code,
                              as_tuned=emit is not None and memory_limit is None)
            if emit is not None and is_tuned(extra) and not job_flags and memory_limit is None:
                # a tuned file: its knobs are the decision; emitting them needs no probe
                emit_job(job, emit, str(target), extra, device=device)
                return
            opts = _options(extra, device=device, memory_limit=memory_limit, margin=margin,
                            budget_s=budget_s, max_host_ram=max_host_ram, knobs=knob_list,
                            fixed=fixed, run_steps=run_steps, isolate=isolate)
            if out is not None:
                check_writable(out)  # before the search: its end must not be a write error
                check_replaceable(out, [job.data, job.tokenizer, job.model])
            result = _search(job, opts, quiet=as_json and emit is not None, as_json=as_json)
        except JobError as err:
            fail(err, as_json=as_json)
            return
        if os.environ.get("RANK", "0") != "0":
            return  # under torchrun: every rank probed and agreed; rank 0 reports
        try:
            _report(result, out, emit, as_json, target or "flags")
        except JobError as err:
            fail(err, as_json=as_json)
        if result.pick is None:
            # exit 1: a measured outcome, not bad input (2); said on its own line with what to
            # change (an audit: the notes were joined into the pick line, and no error: line)
            typer.echo("error: tune found no configuration that fits in memory (its notes above "
                       "say what was measured)", err=True)
            typer.echo("hint: a shorter --seq-len, --method lora (or qlora on a GPU), or more "
                       "memory (--memory-limit on the CPU)", err=True)
            raise typer.Exit(1)
