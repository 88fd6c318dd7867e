"""``train --nproc N``: the same command run by N ranks under torchrun, its signals relayed to
the ranks, their errors collected, and the exit code the run documents (the cli prints)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.job import JobError, JobSpec

RANK_ERRORS_ENV = "TRAINFIT_RANK_ERRORS"
"""The folder where a rank launched by ``--nproc`` leaves its error (``rank-N.json``)."""


@dataclass(kw_only=True)
class RankError:
    """A bad-input error a rank left for its launcher (every rank meets the same one)."""

    rank: int
    """The rank that said it first (the lowest)."""
    message: str
    """The error's one line."""
    hint: str | None
    """Its fix, when the rank gave one."""


@dataclass(kw_only=True)
class RankFailure:
    """A rank that died (the kernel's OOM killer, a segfault) or failed unexpectedly."""

    how: str
    """``killed by signal N`` or ``torchrun exit code N``."""
    newest_checkpoint: Path | None
    """Where ``--resume`` continues from; None: nothing was saved."""


@dataclass(kw_only=True)
class Launched:
    """What ``train --nproc`` ended with."""

    exit_code: int
    """The run's documented exit code (train --help)."""
    errors: list[RankError]
    """The ranks' bad-input errors, each different one once, rank 0's first (exit 2)."""
    failure: RankFailure | None
    """A rank that ended abnormally (exit 1), else None."""


def check_nproc(nproc: int, device: str) -> None:
    """``--nproc`` within what this machine has (JobError otherwise)."""
    if nproc < 1:
        raise JobError(f"--nproc {nproc}: must be ≥ 1", "--nproc 1 runs one process (the "
                       "default); --nproc N launches N ranks through torchrun")
    if device.startswith("cuda"):
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if nproc > n:
            raise JobError(f"--nproc {nproc}: only {n} CUDA device(s) here",
                           f"use --nproc ≤ {n}, or several nodes through torchrun's rendezvous")
    elif nproc > (os.cpu_count() or 1):
        raise JobError(f"--nproc {nproc}: only {os.cpu_count()} CPU cores here",
                       f"use --nproc ≤ {os.cpu_count()}")


def rank_argv(argv: list[str]) -> list[str]:
    """The command line each rank runs: this one without ``--nproc`` (either spelling)."""
    args = [a for a in argv if not a.startswith("--nproc")]
    if "--nproc" in argv:
        i = argv.index("--nproc")
        args = argv[:i] + argv[i + 2:]
    return args


def launch(nproc: int, device: str, job: JobSpec, job_file: str, out: Path,
           argv: list[str]) -> Launched:
    """Run ``trainfit`` with ``argv`` (less ``--nproc``) as ``nproc`` ranks under torchrun."""
    check_nproc(nproc, device)
    if job.ranks != nproc:
        raise JobError(f"--nproc {nproc} but the job says ranks {job.ranks}",
                       f"set ranks: {nproc} in {job_file} (the effective batch is "
                       "global: micro × accumulation × ranks)")
    # --standalone: one node, a free rendezvous port of its own (the default, 29500, makes a
    # second run on the same machine fail to start)
    cmd = [sys.executable, "-m", "trainfit.run.torchrun", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "trainfit.cli.main", *rank_argv(argv)]
    # each rank's bad-input error comes back through a file, said once by the cli (every rank
    # printed it, then torchrun's failure dump: an audit), with the rank's exit code
    errors_dir = Path(tempfile.mkdtemp(prefix="trainfit-ranks-"))
    try:
        started = time.time()
        code, relayed = _run_torchrun(cmd, {**os.environ, RANK_ERRORS_ENV: str(errors_dir)})
        errors = _rank_errors(errors_dir)
        failed = _failed_ranks(errors_dir)
    finally:
        shutil.rmtree(errors_dir, ignore_errors=True)
    if errors:
        return Launched(exit_code=2, errors=errors, failure=None)
    if not code:
        return Launched(exit_code=0, errors=[], failure=None)
    # torchrun exits 1 whenever a rank exits non-zero: the run's record says which it was; a
    # signal relayed before the ranks could take it (torchrun or a rank still starting) is
    # the signal's code, as it is for one process (a review: 241, 254 and 1)
    from trainfit.run.record import EXIT_DIVERGED, EXIT_SIGINT, EXIT_SIGTERM

    said_code = exit_code_of(out, code, since=started)
    if said_code in (EXIT_DIVERGED, EXIT_SIGINT, EXIT_SIGTERM):
        return Launched(exit_code=said_code, errors=[], failure=None)
    if relayed:
        return Launched(exit_code=128 + relayed, errors=[], failure=None)
    # a rank that died or failed unexpectedly: torchrun's log lines alone, exit 1, no way
    # forward said (an audit): the cli says the newest checkpoint
    from trainfit.run.checkpoint import checkpoints

    kept = checkpoints(out) if out.is_dir() else []
    how = _how(failed) or (f"killed by signal {-code}" if code < 0 else
                           f"torchrun exit code {code}")
    return Launched(exit_code=1, errors=[], failure=RankFailure(
        how=how, newest_checkpoint=out / kept[0].name if kept else None))


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


def launched_rank() -> bool:
    """This process is a rank that ``train --nproc`` started: its launcher says the notes and
    the errors."""
    return "WORLD_SIZE" in os.environ and bool(os.environ.get(RANK_ERRORS_ENV))


def leave_error(err: JobError) -> None:
    """A launched rank's error, for its launcher (written whole, then renamed: never half)."""
    d = Path(os.environ[RANK_ERRORS_ENV])
    rank = int(os.environ.get("RANK", "0"))
    tmp = d / f".rank-{rank}.json"
    tmp.write_text(json.dumps({"rank": rank, "message": " ".join(str(err).split()),
                               "hint": err.hint}))
    tmp.replace(d / f"rank-{rank}.json")


def _rank_errors(d: Path) -> list[RankError]:
    """The ranks' errors in ``d``, each different one once (the lowest rank's)."""
    found = []
    for f in d.glob("rank-*.json"):
        try:
            e = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        found.append(RankError(rank=int(e.get("rank", 0)), message=str(e.get("message")),
                               hint=e.get("hint")))
    seen: set[str] = set()
    errors = []
    for e in sorted(found, key=lambda e: e.rank):
        if e.message not in seen:
            seen.add(e.message)
            errors.append(e)
    return errors


def _failed_ranks(d: Path) -> list[dict[str, int]]:
    """The ranks torchrun saw fail (run/torchrun.py), each {rank, exit_code, timestamp}."""
    try:
        failed = json.loads((d / "failed.json").read_text())
        return [{k: int(f[k]) for k in ("rank", "exit_code", "timestamp")} for f in failed]
    except (OSError, ValueError, TypeError, KeyError):
        return []


def _how(failed: list[dict[str, int]]) -> str | None:
    """The failure in words: the rank a signal killed (the cause: torchrun then sends the others
    SIGTERM, which it lists as failures too) or else the first to fail, with its exit code."""
    if not failed:
        return None
    # torchrun's own SIGTERM to the others (-15), or their answer to it (trainfit's ranks stop
    # and exit 130 / 143), come after the cause, often in the same second (a review)
    stopped = (-signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGTERM)
    killed = [f for f in failed if f["exit_code"] < 0 and f["exit_code"] not in stopped]
    others = [f for f in failed if f["exit_code"] not in stopped]
    f = min(killed or others or failed, key=lambda f: (f["timestamp"], f["rank"]))
    if f["exit_code"] < 0:
        try:
            name = f" ({signal.Signals(-f['exit_code']).name})"
        except ValueError:
            name = ""
        return f"rank {f['rank']} killed by signal {-f['exit_code']}{name}"
    return f"rank {f['rank']} exited with code {f['exit_code']}"


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


def exit_code_of(out: Path, code: int, since: float | None = None) -> int:
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
