"""``trainfit monitor``: the GPUs and the host in one live view (``watch nvidia-smi`` + ``free -h``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from trainfit import json_text
from trainfit.job import JobError
from trainfit.run.rundir import check_not_in_use

# How often the command checks --duration and whether the --pid process still runs; the sampling
# itself follows --interval in the sampler thread.
_POLL_S = 0.1


def _fail(message: str, hint: str | None, *, as_json: bool = False) -> NoReturn:
    from trainfit.cli.jobargs import say_error

    say_error(message, hint, as_json=as_json)


def register(app: typer.Typer) -> None:
    """Add the ``monitor`` command to the trainfit app."""

    @app.command("monitor")
    def monitor_cmd(
        pid: Annotated[int | None, typer.Option(
            help="Follow this process and its children (RSS, GPU memory); stop when it exits.")] = None,
        interval: Annotated[float, typer.Option(help="Seconds between samples.")] = 1.0,
        log: Annotated[str | None, typer.Option(
            help="Write every sample to FILE.csv or FILE.jsonl (columns: docs/json-formats.md); an "
                 "existing file is appended to, time_s going on from its last sample.")] = None,
        once: Annotated[bool, typer.Option("--once", help="One sample, then exit.")] = False,
        as_json: Annotated[bool, typer.Option(
            "--json", help="Rows as JSON (with --once a list; otherwise one object per line).")] = False,
        duration: Annotated[float | None, typer.Option(
            help="Stop after S seconds (default: Ctrl-C, or when the --pid process exits).")] = None,
    ) -> None:
        """The GPUs (NVML) and the host (psutil) in one view, measured every --interval seconds."""
        run_monitor(pid=pid, interval_s=interval, log=log, once=once, as_json=as_json, duration_s=duration)


def run_monitor(*, pid: int | None, interval_s: float, log: str | None, once: bool, as_json: bool,
                duration_s: float | None) -> None:
    from trainfit.monitor.host import process_alive
    from trainfit.monitor.sampler import MonitorError, Sampler

    if duration_s is not None and not 0 < duration_s < float("inf"):
        _fail(f"--duration {duration_s:g}: must be > 0 seconds (finite)", "omit it to run until Ctrl-C",
              as_json=as_json)

    def emit_json_lines(rows: list[dict]) -> None:
        typer.echo("".join(json_text.dumps(r) + "\n" for r in rows), nl=False)

    try:
        # a log a live train run writes (its directory's lock held): two writers' rows would
        # interleave, and report then drew neither (an audit)
        if log is not None:
            try:
                check_not_in_use(Path(log).parent, flag="--log")
            except JobError as e:
                _fail(f"--log {log}: {str(e).split(': ', 1)[-1]}, which writes its own "
                      "monitor log there", "give a --log path outside the run's directory; "
                      f"`trainfit report {Path(log).parent}` shows the run's own monitor",
                      as_json=as_json)
        # Validates --pid/--interval/--log before anything starts or is written.
        # an existing log is appended to, never overwritten (a QA run lost a log to a rerun)
        existing = log is not None and Path(log).is_file() and Path(log).stat().st_size > 0
        sampler = Sampler(interval_s=interval_s, log_path=log, pid=pid, follow_process=pid is not None,
                          live=False if (once or as_json) else None, print_lines=not (once or as_json),
                          on_sample=emit_json_lines if as_json and not once else None, append=True)
        sampler.open()
        if existing:
            typer.echo(f"--log {log}: exists, appending to it", err=True)
    except MonitorError as e:
        _fail(str(e), e.hint, as_json=as_json)
    except OSError as e:
        _fail(f"--log {log}: cannot write ({e.strerror or e})", "choose a writable path",
              as_json=as_json)
    if sampler.gpu_note and not sampler.live:  # the live view shows it itself
        typer.echo(sampler.gpu_note, err=True)  # stderr: keeps --json output parseable

    if once:
        rows = sampler.sample_once()
        sampler.close()
        if as_json:
            typer.echo(json_text.dumps(rows, indent=1))
        else:
            from rich.console import Console

            from trainfit.monitor.view import render

            Console().print(render(rows, gpu_names=sampler.gpu_names, interval_s=None))
        return

    deadline = None if duration_s is None else time.monotonic() + duration_s
    sampler.start()
    try:
        while deadline is None or time.monotonic() < deadline:
            if pid is not None and not process_alive(pid):
                typer.echo(f"process {pid} exited; monitor stopped", err=True)
                break
            time.sleep(_POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass  # Ctrl-C is the normal way to end a live view: stop cleanly, exit 0
    finally:
        sampler.stop()
    for note in sampler.notes:
        typer.echo(note, err=True)
