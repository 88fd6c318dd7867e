"""The run directory ``trainfit train --out`` writes: claimed by one run at a time (a lock), checked
before any work, written so that a crash, a full disk or a kill never leaves a file half-written.

- **Atomic, durable writes** (:func:`write_atomic`): a temporary file in the same directory, written,
  ``fsync``-ed, renamed over the target (``os.replace``: atomic on POSIX filesystems), then the
  directory ``fsync``-ed so the rename itself survives a power cut. A failed write removes its
  temporary file and leaves the previous version in place.
- **One run per directory** (:class:`RunLock`): ``<out>/.trainfit.lock`` held with ``flock``. The
  kernel drops an ``flock`` when its process dies — also on ``kill -9`` — so a lock file a killed run
  left behind is free for the next run, never stale. The file says who holds it (pid, host, start
  time): a second run refuses with that line. On a filesystem without ``flock`` (some network
  mounts) the recorded pid decides: a live process on this host holds it, a dead one does not.
- **Checked before the work** (:func:`prepare`): an existing file as ``--out``, a path too long, a
  read-only or full disk are one ``error:`` line before anything runs; a directory that already
  holds a run is not overwritten unless it is resumed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from trainfit.job import JobError

LOCK_NAME = ".trainfit.lock"
RUN_FILES = ("train.json", "latest")
"""What marks a directory as holding a run (besides ``checkpoint-N`` directories)."""
WATCH_FILES = ("monitor.jsonl", "tensorboard")
"""What a run killed before its first checkpoint leaves alone: a new run there sets them aside
(:func:`set_aside_watch_files`) — it appended to the dead run's, which report then drew as one
timeline whose steps went 46 → 5 (an audit)."""


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory: the data itself was synced
        pass
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str) -> None:
    """``path`` holds ``data`` entirely or keeps what it held before (temp file, fsync, rename,
    fsync of the directory). Raises OSError; its temporary file is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(raw)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def os_reason(err: BaseException) -> str:
    """What went wrong in words: the OS's text for its error number (No space left on device,
    Read-only file system, ...), else the error's first line."""
    e: BaseException | None = err
    while e is not None:
        if isinstance(e, OSError) and e.errno is not None:
            return os.strerror(e.errno)
        e = e.__cause__ or e.__context__
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "unexpected pos" in text or "failed writing file" in text:
        # torch.save's zip writer cut short (inline_container.cc), which carries no errno: on a
        # full disk it said only "[enforce fail at inline_container.cc:672] . unexpected pos"
        return "the write was cut short, most likely a full disk (torch.save's writer)"
    return text[:160]


def space_hint(path: Path) -> str:
    """Free space where ``path`` is, in words (for error hints); empty when it cannot be read."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return ""
    return f" ({free / 2**20:.1f} MiB free there now)"


def holds_run(out: Path) -> list[str]:
    """The run files in ``out`` (checkpoints, train.json, latest): a run lives there."""
    try:
        names = sorted(p.name for p in out.iterdir())
    except OSError:
        return []
    return [n for n in names if n in RUN_FILES or (n.startswith("checkpoint-")
                                                    and n[len("checkpoint-"):].isdigit())]


def check_no_run(out: Path) -> None:
    """A new run's ``--out`` holds no run (JobError naming what it holds and how to go on)."""
    found = holds_run(out)
    if not found:
        return
    saved = any(n.startswith("checkpoint-") for n in found)
    # a run that stopped before its first save has nothing to continue from: the hint must not
    # send the user to --resume, which refuses it (a QA run)
    raise JobError(f"--out {out}: already holds a run ({', '.join(found[:4])}"
                   f"{' …' if len(found) > 4 else ''}); it is not overwritten",
                   f"continue it with --resume {out}, or choose a new --out" if saved else
                   "it has no checkpoint to continue from (the run stopped before its first "
                   f"save): choose a new --out, or remove {out} first")


def check_out(out: Path) -> None:
    """``--out`` can be a run directory: not an existing file, not under a file, a path the
    filesystem accepts. Raises JobError; creates nothing."""
    flag = f"--out {out}"
    try:
        if out.exists() and not out.is_dir():
            raise JobError(f"{flag}: is a file, not a directory",
                           "give a directory for the run (it is created), e.g. --out run")
        for parent in out.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise JobError(f"{flag}: {parent} is a file, not a directory",
                                   "give a path whose parents are directories")
                break
        # inside a checkpoint: its files were mixed with a new run's, and pruning the parent
        # run's checkpoints would delete the new run with them (an audit)
        # resolved: "../run2" from inside a checkpoint is outside it, "x" there is inside (a review)
        full = out.resolve()
        inside = next((p for p in (full, *full.parents)
                       if (p / "trainer_state.json").is_file() or (p / "digests.json").is_file()),
                      None)
        if inside is not None:
            raise JobError(f"{flag}: inside the checkpoint {inside}, which is not a run directory",
                           f"give a new directory, e.g. --out {inside.parent.parent / 'run2'}; "
                           f"to continue that run: --resume {inside.parent}")
    except OSError as err:  # ENAMETOOLONG and friends, raised by stat()
        raise JobError(f"{flag}: not a usable path ({os_reason(err)})",
                       "choose a shorter path (each name ≤ 255 bytes)") from None


def create_out(out: Path) -> bool:
    """Create ``out`` (True when this call created it); every OS refusal is one JobError."""
    existed = out.is_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".trainfit-write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise JobError(f"--out {out}: cannot write there ({os_reason(err)})",
                       _write_hint(err, out)) from None
    return not existed


def _write_hint(err: BaseException, out: Path) -> str:
    reason = err.errno if isinstance(err, OSError) else None
    if reason == errno.ENOSPC:
        return "free space on that disk" + space_hint(out.parent if not out.exists() else out) + \
            ", or choose an --out on another disk"
    if reason in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "choose an --out on a writable disk (or fix the directory's permissions)"
    if reason == errno.ENAMETOOLONG:
        return "choose a shorter path (each name ≤ 255 bytes)"
    return "choose another --out"


class RunLock:
    """``<out>/.trainfit.lock``: held (``flock``) while a run writes into ``out``."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / LOCK_NAME
        self.fd: int | None = None
        self.made_file = False
        """Whether :meth:`acquire` created the lock file (a run that stops before anything
        ran removes it again)."""

    def acquire(self) -> None:
        try:
            self.made_file = not self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise JobError(f"--out {self.path.parent}: cannot create its lock file "
                           f"({os_reason(err)})", _write_hint(err, self.path.parent)) from None
        holder = _held_by(fd, fcntl.LOCK_EX)
        if holder is not None:
            os.close(fd)
            raise JobError(f"--out {self.path.parent}: another trainfit run is using this "
                           f"directory ({_who(holder)})",
                           f"wait for it to finish or stop it{_kill_hint(holder)}; or choose "
                           "another --out")
        self.fd = fd
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:8]}
        with contextlib.suppress(OSError):  # the lock holds without its description
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
            os.fsync(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)  # nobody holds it: no description left to mislead
        os.close(self.fd)  # closing drops the flock
        self.fd = None


def check_not_in_use(out: Path, flag: str = "--resume") -> None:
    """JobError when a live run holds ``out``'s lock (a probe: a shared ``flock`` taken and
    dropped, nothing created).  For ``--resume`` of a running run's directory: before, its
    missing checkpoint was reported ("no complete checkpoint in it") instead of the run; for a
    new run's ``--out`` (``flag``), before its files are named as a run it would overwrite."""
    path = Path(out) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: no run has claimed it
    try:
        holder = _held_by(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)  # closing drops the shared lock the probe took
    if holder is not None:
        raise JobError(f"{flag} {out}: another trainfit run is using this directory "
                       f"({_who(holder)})",
                       f"wait for it to finish or stop it{_kill_hint(holder)}, then resume"
                       if flag == "--resume" else f"wait for it to finish or stop it"
                       f"{_kill_hint(holder)}; or choose another --out")


def _held_by(fd: int, mode: int) -> dict[str, Any] | None:
    """The description of the live run holding the lock file open as ``fd``, or None after
    taking it in ``mode`` (``LOCK_EX`` to claim, ``LOCK_SH`` to probe).  On a filesystem without
    ``flock`` the recorded pid decides: a live process on this host holds it, a dead one not."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd)
    except OSError:
        holder = _read_holder(fd)
        return holder if _alive_here(holder) else None
    return None


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}


def _who(h: dict[str, Any]) -> str:
    if not h.get("pid"):
        return "its process is not recorded"
    return f"pid {h['pid']} on {h.get('host', '?')}, started {h.get('started', '?')}"


def _kill_hint(h: dict[str, Any]) -> str:
    return f" (kill {h['pid']}: it saves a checkpoint and exits)" if h.get("pid") else ""


def _alive_here(h: dict[str, Any]) -> bool:
    pid = h.get("pid")
    if not isinstance(pid, int) or h.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_partial_saves(out: Path) -> list[str]:
    """``.checkpoint-N.tmp`` directories a killed save left (the lock is held: no save is running),
    and the temporary files of an atomic write it cut (``.latest.PID.tmp``, ``.train.json.PID.tmp``,
    ``.checkpoint-N.old``), a cut prune's ``.checkpoint-N.removing``: returns the checkpoint
    directories removed (said in a note)."""
    gone = []
    for p in out.glob(".checkpoint-*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
        gone.append(p.name)
    for p in out.glob(".checkpoint-*.removing"):  # --keep-last's prune, cut: it was going
        shutil.rmtree(p, ignore_errors=True)
    for p in [*out.glob(".latest.*.tmp"), *out.glob(".train.json.*.tmp")]:
        with contextlib.suppress(OSError):
            p.unlink()
    for p in out.glob(".checkpoint-*.old"):  # a checkpoint moved aside for its step's new save
        final = out / p.name[1:-len(".old")]
        if final.is_dir():  # the new one is in place
            shutil.rmtree(p, ignore_errors=True)
        else:  # killed between the two renames: the old one is the checkpoint
            p.rename(final)
    return gone


def set_aside_watch_files(out: Path) -> list[tuple[Path, Path]]:
    """A new run's ``out`` (it holds no run: checked) with the monitor log or TensorBoard events
    of a run that stopped before its first checkpoint: each renamed ``<name>.previous[-N]``, kept
    for the user, the new run's own starting empty. Returns (from, to) of each."""
    moved = []
    for name in WATCH_FILES:
        src = out / name
        if not src.exists():
            continue
        stem, dot, ext = name.partition(".")
        n, dst = 1, out / f"{stem}.previous{dot}{ext}"
        while dst.exists():
            n += 1
            dst = out / f"{stem}.previous-{n}{dot}{ext}"
        src.rename(dst)
        moved.append((src, dst))
    return moved


class RunDir:
    """The claim of one run on ``out`` for the length of a ``with`` block: checked, created, locked;
    a run that fails before its first step removes what it created (bad input writes nothing)."""

    def __init__(self, out: Path, *, resuming: bool, main: bool = True) -> None:
        self.out = Path(out)
        self.resuming = resuming
        self.main = main
        self.lock = RunLock(self.out)
        self.created: list[Path] = []
        self.notes: list[str] = []
        self.steps_done = 0
        """Set by the run: once a step completed, what it wrote is kept whatever happens."""
        self.moved: list[tuple[Path, Path]] = []
        """The dead run's monitor files set aside (from, to): put back when nothing ran."""

    def __enter__(self) -> RunDir:
        if not self.main:
            return self
        check_out(self.out)
        made = create_out(self.out)
        if made:
            self.created.append(self.out)
        try:
            self.lock.acquire()
            if not self.resuming:
                check_no_run(self.out)
                self.moved = set_aside_watch_files(self.out)
                if self.moved:
                    self.notes.append(
                        f"{' and '.join(a.name for a, _ in self.moved)} of a run that stopped "
                        "before its first checkpoint set aside as "
                        f"{' and '.join(b.name for _, b in self.moved)}: this run's start anew")
            gone = remove_partial_saves(self.out)
            if gone:
                self.notes.append(f"removed {', '.join(gone)}: a save that was interrupted "
                                  "(the checkpoints before it are intact)")
            for name in WATCH_FILES:
                if not (self.out / name).exists():
                    self.created.append(self.out / name)
        except BaseException:
            self._undo()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.main:
            return
        if exc_type is not None and self.steps_done == 0:
            self._undo()
        else:
            self.lock.release()

    def _undo(self) -> None:
        """Nothing ran: remove what this run created (the directory itself when it made it; the
        lock file it made in a directory that was there: an audit found it left behind)."""
        for p in reversed(self.created):
            if p == self.out:
                with contextlib.suppress(OSError):
                    (p / LOCK_NAME).unlink()
                    p.rmdir()  # only when empty: never a file this run did not make
            elif p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
        for src, dst in reversed(self.moved):
            with contextlib.suppress(OSError):
                dst.rename(src)
        # the lock last: a run that takes it meanwhile would have its new monitor log removed
        # and the dead run's put back under it (a review)
        if self.lock.made_file and self.lock.fd is not None and self.out not in self.created:
            with contextlib.suppress(OSError):
                self.lock.path.unlink()  # while held: no other run has taken it yet
        self.lock.release()
