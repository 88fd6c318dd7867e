"""``trainfit doctor JOB.yaml`` / ``trainfit doctor -- CMD ...``: where the step time goes, the
bottleneck named with its numbers, the fix applied (trainfit jobs) and measured again."""

from __future__ import annotations

import shlex
from typing import Annotated, NoReturn

import typer

from trainfit import json_text
from trainfit.cli.jobargs import AllowCode, TrustRemoteCode
from trainfit.cli.script import SeesDashes, dashes_given


def _fail(message: str, hint: str = "", tail: list[str] | None = None, *,
          as_json: bool = False) -> NoReturn:
    from trainfit.cli.jobargs import say_error

    say_error(message, hint, tail=tail, as_json=as_json)


def _checked(ctx: typer.Context, args: list[str], steps: int, warmup: int, repeats: int,
             timeout_s: float) -> bool:
    """The options checked before anything runs (JobError names the bad one); True when the
    target is a job file, False for a command."""
    from trainfit.doctor.inject import check_steps
    from trainfit.job import JobError
    from trainfit.job.fields import check_timeout

    if not args:
        raise JobError("nothing to examine",
                       "trainfit doctor JOB.yaml, or trainfit doctor -- python train.py ARGS")
    check_steps(steps)  # doctor's own minimum (MIN_MEASURED_STEPS), said as before
    if warmup < 0:
        raise JobError(f"--warmup {warmup}: must be ≥ 0",
                       "e.g. --warmup 2 (steps run before measuring: first-step costs)")
    if repeats < 1:
        raise JobError(f"--repeats {repeats}: must be ≥ 1", "e.g. --repeats 2")
    check_timeout(timeout_s, "a command that has not finished its window")
    if len(args) > 1 and args[0].endswith((".yaml", ".yml")):
        raise JobError(f"{' '.join(args[1:])}: after the job file {args[0]}, which is "
                       "examined alone", "options go before it: trainfit doctor "
                       f"--steps 8 {args[0]}")
    is_job = len(args) == 1 and args[0].endswith((".yaml", ".yml"))
    if not is_job and dashes_given() is False:
        raise JobError(f"{shlex.join(args)}: a command goes after --, so that its own options "
                       "stay its own", f"trainfit doctor [doctor's options] -- {shlex.join(args)} "
                       "[its options]")
    if not is_job:
        # a script's own code picks its device, and doctor applies no fix to it: these
        # options were silently ignored (a QA run: --device cuda on a machine without)
        given = [f"--{name.replace('_', '-')}" for name in ("device", "apply", "repeats")
                 # by name: typer's click may not be the installed click's module
                 if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"]
        if given:
            raise JobError(f"{', '.join(given)}: for a trainfit job only; a command "
                           "picks its own device and doctor measures it as it runs",
                           "drop it, or doctor a job file: trainfit doctor JOB.yaml")
    else:
        # a job's steps run in this process, counted by --steps: these bound a command's run and
        # were silently ignored for a job file (an audit: --timeout-s 20 ran past 300 s)
        given = [f"--{name.replace('_', '-')}" for name in ("timeout_s", "keep_running", "once")
                 if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"]
        if given:
            raise JobError(f"{', '.join(given)}: for a command only (-- python train.py); a job "
                           "file's run is bounded by --steps",
                           f"drop it, e.g. trainfit doctor --steps 8 {args[0]}")
    return is_job


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to the trainfit app."""

    @app.command("doctor", cls=SeesDashes)
    def doctor_cmd(
        ctx: typer.Context,
        target: Annotated[list[str] | None, typer.Argument(
            help="A trainfit job YAML, or after -- the command to run: -- python train.py ARGS.",
            show_default=False)] = None,
        steps: Annotated[int, typer.Option(help="Optimizer steps measured (after the warm-up).")] = 8,
        warmup: Annotated[int, typer.Option(help="Steps run before measuring (first-step costs).")] = 2,
        apply: Annotated[bool, typer.Option(
            "--apply/--no-apply",
            help="Apply the fixes to a copy of a trainfit job and measure again (the file is not "
                 "changed).")] = True,
        repeats: Annotated[int, typer.Option(
            help="Most before/after rounds, interleaved (B A B A …; CPU timing drifts between "
                 "repeats): a fix is called faster when all 4 rounds agree (tune's rule; with "
                 "fewer, 2 far beyond the noise); the rounds stop at one that is not faster.")] = 4,
        device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N (trainfit jobs).")] = "cpu",
        timeout_s: Annotated[float, typer.Option(
            "--timeout-s", help="Stop a command that has not finished its window by then.")] = 900.0,
        keep_running: Annotated[bool, typer.Option(
            "--keep-running",
            help="Let the command run to its end (default: stop it after the window).")] = False,
        once: Annotated[bool, typer.Option(
            "--once",
            help="Run the command once even on a busy CPU host (by default, when other processes "
                 "load the CPU a command's step runs on, it is run a second time to check that "
                 "its verdict repeats in another process; its side effects then happen twice).")
        ] = False,
        allow_code: AllowCode = False,
        trust_remote_code: TrustRemoteCode = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    ) -> None:
        """Measure where the step time goes (data wait, copy, forward, backward, optimizer, syncs,
        logging, idle), name the bottleneck with its numbers, apply the fix and measure again."""
        from trainfit.doctor.inject import DoctorError, check_command
        from trainfit.job import JobError
        from trainfit.job.fields import in_file_words

        args = list(target or [])
        say = None if as_json else (lambda msg: typer.echo(msg, err=True))
        is_job = False
        try:
            is_job = _checked(ctx, args, steps, warmup, repeats, timeout_s)
            if is_job:
                from trainfit.doctor.run import doctor_job  # torch: after the input's checks

                result = doctor_job(args[0], steps=steps, warmup=warmup, apply=apply, repeats=repeats,
                                    device=device, log=say, allow_code=allow_code,
                                    trust_remote_code=trust_remote_code)
            else:
                check_command(args)
                from trainfit.doctor.command import doctor_command  # torch: after the checks

                if say:
                    say(f"running {shlex.join(args)} under the doctor ({warmup} warm-up + {steps} measured + "
                        "1 profiled step) …")
                result = doctor_command(args, steps=steps, warmup=warmup, stop=not keep_running,
                                        timeout_s=timeout_s, recheck_busy=not once, say=say)
        except DoctorError as err:
            _fail(str(err), err.hint, err.tail, as_json=as_json)
        except JobError as err:
            if is_job:
                # the job is the file's: a job field is named by its YAML key, not a flag
                err = in_file_words(err, args[0], keep=("trust_remote_code",))
            _fail(str(err), err.hint, as_json=as_json)
        if as_json:
            typer.echo(json_text.dumps(result.to_dict(), indent=1))
            return
        from rich.console import Console

        from trainfit.render.doctor import render

        Console().print(render(result))
