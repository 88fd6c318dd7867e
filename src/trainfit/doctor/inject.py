"""Run someone else's training command under the doctor: hooks injected through ``sitecustomize``
(``PYTHONPATH``), output captured, the host sampled, the per-step records read back.

Bad input is a :class:`DoctorError` (one ``error:`` line, a hint, exit code 2): a command that is
not found, one that crashes or exits at once (its exit code and last lines), one that never trains
with torch, and a run too short to measure (how many steps it needs).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfit.doctor.hooks import ENV_OUT, ENV_PROFILE, ENV_STEPS, ENV_STOP, ENV_WARMUP
from trainfit.doctor.made_dirs import read_made_dirs
from trainfit.doctor.split import StepRecord
from trainfit.doctor.watch import HostSummary, HostWatch
from trainfit.job import JobError

SITE_DIR = Path(__file__).resolve().parent / "_site"
DOCTOR_DIR = Path(__file__).resolve().parent
"""This package: the child loads its hooks from here under a private name (see sitecustomize)."""
MIN_MEASURED_STEPS = 3
"""Fewer measured steps than this give no median worth naming a bottleneck by."""
TAIL_LINES = 15


class DoctorError(JobError):
    """Bad input for the doctor (exit 2); ``tail``: the command's last output lines, if any."""

    def __init__(self, message: str, hint: str = "", tail: list[str] | None = None) -> None:
        super().__init__(message, hint)
        self.tail = tail or []


def check_steps(steps: int) -> None:
    """Both targets: fewer measured steps give no median worth naming a bottleneck by."""
    if steps < MIN_MEASURED_STEPS:
        raise DoctorError(f"--steps {steps}: too few to measure",
                          f"doctor needs at least {MIN_MEASURED_STEPS} measured steps")


@dataclass
class ForeignRun:
    command: list[str]
    exit_code: int | None
    stopped_by_doctor: bool
    records: list[StepRecord]
    summary: dict[str, Any]
    host: HostSummary
    tail: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        return shlex.join(self.command)


def _script_of(cmd: list[str]) -> str:
    """The script ``python [options] script.py …`` runs ("" for ``-m``/``-c`` or none): the
    interpreter's own options skipped, ``-X``/``-W`` with their value (a review: ``python -u
    missing.py`` got past the check)."""
    args = iter(cmd[1:])
    for a in args:
        if a.startswith(("-m", "-c")):  # -m pkg, -mpkg, -c code: no script file
            return ""
        if a in ("-X", "-W", "--check-hash-based-pycs"):
            next(args, None)
        elif not a.startswith("-") or a == "-":
            return a
    return ""


def check_command(cmd: list[str], verb: str = "doctor") -> str:
    """The executable ``cmd[0]`` resolves to; DoctorError when there is none (``verb``: the
    trainfit command the hint names)."""
    if not cmd:
        raise DoctorError("no command after --", f"e.g. trainfit {verb} -- python train.py --epochs 1")
    exe = shutil.which(cmd[0])
    if exe is None:
        p = Path(cmd[0])
        if p.is_file() and not os.access(p, os.X_OK):
            raise DoctorError(f"{cmd[0]}: not executable", f"run it as: trainfit {verb} -- python {cmd[0]}")
        raise DoctorError(f"{cmd[0]}: command not found", "check the spelling and PATH; "
                          f"e.g. trainfit {verb} -- python train.py")
    script = _script_of(cmd) if Path(cmd[0]).name.startswith("python") else ""
    if script.endswith(".py") and not Path(script).is_file():
        # said before anything runs (the interpreter's own "can't open file" came after the
        # hooks' setup, as the command's failure)
        raise DoctorError(f"{script}: no such file",
                          f"give the path of your training script, e.g. trainfit {verb} -- "
                          f"python train.py")
    return exe


@dataclass
class Launched:
    """A command run with the hooks: how it ended and its last output lines."""

    exit_code: int | None
    timed_out: bool
    tail: list[str]
    host: HostSummary | None


def run_with_hooks(cmd: list[str], hook_env: dict[str, str], *, timeout_s: float | None,
                   watch_host: bool = False, extra_env: dict[str, str] | None = None,
                   echo: bool = False) -> Launched:
    """Run ``cmd`` with ``sitecustomize`` first on PYTHONPATH (it arms the hooks that ``hook_env``
    names in every Python process of the command), output captured (the last lines kept), the
    whole process group killed at the end (DataLoader workers left behind by an ``os._exit``, or a
    timed-out run). Shared by ``doctor -- CMD`` and ``plan|tune -- CMD`` (trainfit.script).
    ``echo``: its output also shown as it comes, on stderr (``--keep-running``: the command runs
    to its own end, and its log was hidden until then: an audit)."""
    env = dict(os.environ)
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH", "")) if p)
    env.update(hook_env)
    env["TRAINFIT_DOCTOR_DIR"] = str(DOCTOR_DIR)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, text=True, errors="replace")
    except OSError as err:
        raise DoctorError(f"{cmd[0]}: cannot run it ({err.strerror or err})",
                          "check the command after --, e.g. -- python train.py") from None

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if echo:
                sys.stderr.write(line)
                sys.stderr.flush()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timed_out = False
    with HostWatch(proc.pid) if watch_host else contextlib.nullcontext() as watch, \
            _terminate_as_interrupt():
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # also on Ctrl-C or a SIGTERM to trainfit: the command runs in its own session, so
            # the terminal's SIGINT never reaches it, and left alone it trained on, orphaned
            # (a QA run: doctor exited 130, the script still ran 6 s later)
            _kill_group(proc)
            proc.wait()
    reader.join(timeout=5)
    return Launched(exit_code=proc.returncode, timed_out=timed_out, tail=list(tail),
                    host=watch.summary() if watch is not None else None)


def run_foreign(cmd: list[str], *, steps: int = 10, warmup: int = 2, stop: bool = True,
                profile: bool = True, timeout_s: float | None = 900.0,
                extra_env: dict[str, str] | None = None) -> ForeignRun:
    """Run ``cmd`` with the hooks; measure steps ``[warmup, warmup + steps)``."""
    check_command(cmd)
    warmup = max(warmup, 1)  # the first step finds the top-level modules: never measured
    out_dir = Path(tempfile.mkdtemp(prefix="trainfit-doctor-"))
    here = Path.cwd()
    before = {p.name for p in here.iterdir()} if stop else set()
    try:
        ran = run_with_hooks(cmd, {ENV_OUT: str(out_dir), ENV_WARMUP: str(warmup),
                                   ENV_STEPS: str(steps), ENV_STOP: "1" if stop else "0",
                                   ENV_PROFILE: "1" if profile else "0"},
                             timeout_s=timeout_s, watch_host=True, extra_env=extra_env,
                             echo=not stop)
        files = _read_files(out_dir)
    finally:
        made = read_made_dirs(out_dir)
        shutil.rmtree(out_dir, ignore_errors=True)
        removed = _remove_new_empty_dirs(here, before, made) if stop else []
    assert ran.host is not None
    run = _interpret(cmd, ran.exit_code, ran.timed_out, timeout_s, files, ran.tail, ran.host,
                     steps, warmup, stop=stop)
    if removed:
        run.notes.append(f"removed what the command created and the stop left empty: "
                         f"{', '.join(removed)} (its output directory before any save)")
    return run


def _remove_new_empty_dirs(here: Path, before: set[str], made: set[Path]) -> list[str]:
    """The directories the stopped command made in ``here`` and wrote no file in (a Trainer's
    ``output_dir``, made in its ``__init__``): removed, as plan's and tune's script forms do (an
    audit: doctor left them). One with any file in it stays; so does one its processes did not
    make themselves (``made``, recorded in them: another process's, or a non-Python step's)."""
    removed = []
    mine = {os.path.normcase(os.path.realpath(m)) for m in made}
    for p in sorted(here.iterdir()):
        if p.name in before or not p.is_dir() or p.is_symlink() or \
                os.path.normcase(os.path.realpath(p)) not in mine:
            continue
        if any(files for _, _, files in os.walk(p)):
            continue
        # bottom-up rmdir, which refuses a directory that is not empty: a file written since
        # the check stays (rmtree would have taken it)
        for d, _, _ in os.walk(p, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        if not p.exists():
            removed.append(p.name + "/")
    return removed


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While the command runs, a SIGTERM to trainfit raises KeyboardInterrupt as Ctrl-C does,
    so that the command's group is killed on the way out (Python's default SIGTERM ends the
    process without unwinding).  Only in the main thread, where signal handlers can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # our own session: only what this command started
    except (ProcessLookupError, PermissionError):
        pass


def _read_files(out_dir: Path) -> dict[int, list[dict[str, Any]]]:
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for f in sorted(out_dir.glob("doctor.*.jsonl")):
        try:
            pid = int(f.name.split(".")[1])
        except ValueError:
            continue
        rows = []
        for line in f.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        by_pid[pid] = rows
    for f in sorted(out_dir.glob("doctor.*.progress")):  # the step count (hooks._State.progress)
        try:
            pid = int(f.name.split(".")[1])
            done = int(f.read_text().split()[0])
        except (ValueError, IndexError):  # not a pid, or empty before the first step
            continue
        by_pid.setdefault(pid, []).append({"type": "progress", "steps_seen": done})
    return by_pid


def _steps_seen(rows: list[dict[str, Any]]) -> int:
    """Optimizer steps the process made: its summary's count, else its last progress line (a
    process killed, or ended by ``os._exit``, writes no summary)."""
    summary = next((r for r in rows if r.get("type") == "summary"), None)
    if summary is not None:
        return int(summary.get("steps_seen") or 0)
    return max((int(r.get("steps_seen") or 0) for r in rows if r.get("type") == "progress"),
               default=0)


def _pick(files: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The process that trained: most measured steps, rank 0 first (torchrun starts one per GPU)."""
    def key(rows: list[dict[str, Any]]) -> tuple[int, int, int]:
        armed = next((r for r in rows if r.get("type") == "armed"), {})
        return (sum(r.get("type") == "step" for r in rows), _steps_seen(rows),
                int(armed.get("rank") in (None, "0")))
    return max(files.values(), key=key) if files else []


def _killed(code: int) -> str:
    """A negative exit code in words; SIGKILL is what the Linux OOM killer sends when the host's
    RAM runs out."""
    return f"killed by signal {-code}" + (
        " (SIGKILL: the Linux OOM killer sends it when host RAM runs out; `dmesg` says)"
        if code == -9 else "")


def _interpret(cmd: list[str], code: int | None, timed_out: bool, timeout_s: float | None,
               files: dict[int, list[dict[str, Any]]], tail: list[str], host: HostSummary,
               steps: int, warmup: int, stop: bool = True) -> ForeignRun:
    rows = _pick(files)
    kinds = {r.get("type") for r in rows}
    summary = next((r for r in rows if r.get("type") == "summary"), None)
    records = [StepRecord.from_dict(r) for r in rows if r.get("type") == "step"]
    # the hooks end the window with why="window" whether or not they stop the command: under
    # --keep-running it ran on to its own end, and its exit code is its own (an audit: "stopped"
    # was said of a script that ran to sys.exit(3), and the 3 was lost)
    stopped = stop and summary is not None and summary.get("why") == "window"
    name = shlex.join(cmd)
    needed = warmup + MIN_MEASURED_STEPS
    seen = _steps_seen(rows)
    errors = [r for r in rows if r.get("type") == "error"]
    if timed_out and len(records) < MIN_MEASURED_STEPS:
        raise DoctorError(f"{name}: still running after --timeout-s {timeout_s:g} with {seen} optimizer "
                          f"steps done (doctor needs {needed})", "raise --timeout-s, or make the steps "
                          "shorter for the measurement", tail)
    if summary is None and seen and not timed_out:
        # steps were seen, and the process left before Python's exit could write them
        # the training process may be a launcher's child (torchrun): the command's own code is
        # the launcher's, so what ended the process is named by its possible causes
        how = f"was {_killed(code)}" if code is not None and code < 0 else \
            (f"exited with code {code}; its training process ended without Python's exit (a "
             "kill — SIGKILL is the Linux OOM killer's, `dmesg` says —, os._exit, or a crash of "
             "the interpreter)")
        raise DoctorError(f"{name} {how} after {seen} optimizer steps: doctor writes the steps "
                          "it measured at the window's end or at the process's exit, and "
                          "neither came",
                          "if the OOM killer ended it, free host memory; if the script calls "
                          "os._exit, let it return or sys.exit() instead; or measure fewer steps "
                          f"(--steps, --warmup) than the {seen} it ran", tail)
    if code not in (0, None) and not stopped and len(records) < MIN_MEASURED_STEPS:
        how = _killed(code) if code < 0 else f"exited with code {code}"
        raise DoctorError(f"{name} {how} after {seen} optimizer steps (doctor needs at least "
                          f"{needed}: {warmup} warm-up + {MIN_MEASURED_STEPS} measured, the "
                          "fewest it measures" + (f"; {warmup + steps} for the {steps} measured "
                                                  "steps asked" if steps > MIN_MEASURED_STEPS
                                                  else "") + ")",
                          "its last lines are below; fix the script, then run the doctor again", tail)
    if errors and "torch" not in kinds:
        raise DoctorError(f"{name}: the doctor's hooks failed to load ({errors[0].get('error')})",
                          "report this with the command", tail)
    if "armed" not in kinds:
        raise DoctorError(f"{name}: no Python process of this command could be instrumented",
                          "doctor measures PyTorch training run by python (PYTHONPATH must not be reset)",
                          tail)
    if "torch" not in kinds:
        raise DoctorError(f"{name}: the command never imported torch",
                          "doctor measures PyTorch training loops", tail)
    if seen == 0:
        raise DoctorError(f"{name}: no optimizer.step() call seen (exit code {code})",
                          "doctor finds step boundaries at torch.optim optimizer steps", tail)
    if len(records) < MIN_MEASURED_STEPS:
        # the fewest it measures, apart from the --steps it asks for (a review: "needs 5: 2
        # warm-up + 3 measured" under a header of "2 warm-up + 8 measured" did not add up)
        raise DoctorError(f"{name}: the run is too short to measure: {seen} optimizer steps; doctor "
                          f"needs at least {needed} ({warmup} warm-up + {MIN_MEASURED_STEPS} "
                          "measured, the fewest it measures" + (
                              f"; all {warmup + steps} for the {steps} measured steps --steps "
                              "asks" if steps > MIN_MEASURED_STEPS else "") + ")",
                          "run it for more steps (more data or epochs), or lower --steps / --warmup",
                          tail)
    if code not in (0, None) and not stopped and len(records) < steps:
        # it crashed inside the window: a diagnosis of the steps before the crash, exit 0 and
        # "exited … after the measured window" said what was not so (an audit)
        how = f"was {_killed(code)}" if code < 0 else f"exited with code {code}"
        raise DoctorError(f"{name} {how} inside the measured window, after {seen} optimizer "
                          f"steps ({len(records)} of the {steps} asked measured)",
                          "its last lines are below; fix the script, or measure the steps it "
                          f"runs with --steps {len(records)}", tail)
    notes = []
    if len(records) < steps:
        notes.append(f"the run ended after {seen} optimizer steps: {len(records)} measured of the "
                     f"{steps} asked")
    if not stopped and code not in (0, None):
        notes.append(f"the command exited with code {code} after the measured window")
    assert summary is not None
    return ForeignRun(command=cmd, exit_code=code, stopped_by_doctor=stopped, records=records,
                      summary=summary, host=host, tail=tail, notes=notes)
