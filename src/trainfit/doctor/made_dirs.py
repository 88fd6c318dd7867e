"""The directories a doctored command made itself: recorded inside its processes (``os.mkdir``,
which ``os.makedirs`` and ``Path.mkdir`` call), so the doctor removes only those the stop left
empty — not another process's new empty directory in the same working directory (a review: the
doctor removed every new empty directory it found there). Standard library only: it runs inside
the user's processes, loaded under the doctor package's private name (hooks.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

MADE_FILE_PREFIX = "made_dirs."
"""``made_dirs.<pid>.txt`` in the doctor's output folder: one absolute path per line."""


def record_mkdir(out_dir: str) -> None:
    """Wrap ``os.mkdir`` so each directory this process makes is appended to its file (a line at
    a time: a process killed by the stop has said every directory it made)."""
    orig = os.mkdir
    if getattr(orig, "trainfit_records", False):
        return

    def mkdir(path: Any, *a: Any, **k: Any) -> None:
        orig(path, *a, **k)
        try:
            dir_fd = k.get("dir_fd")
            if dir_fd is None and len(a) < 2:  # a path relative to a dir_fd is not named here
                made = os.path.abspath(os.fsdecode(path))
                with open(os.path.join(out_dir, f"{MADE_FILE_PREFIX}{os.getpid()}.txt"),
                          "a") as f:
                    f.write(made + "\n")
        except Exception:  # a record must never break the user's script
            pass

    mkdir.trainfit_records = True  # type: ignore[attr-defined]
    os.mkdir = mkdir
    if orig in os.supports_dir_fd:  # os.mkdir still takes a dir_fd: said so to who asks
        os.supports_dir_fd.add(mkdir)
    # Python 3.10's pathlib bound os.mkdir into its accessor when imported (it is by now):
    # Path.mkdir calls that copy, not os.mkdir (3.11 calls os.mkdir; a review)
    accessor = getattr(sys.modules.get("pathlib"), "_NormalAccessor", None)
    if accessor is not None and getattr(accessor, "mkdir", None) is orig:
        accessor.mkdir = staticmethod(mkdir)


def read_made_dirs(out_dir: Path) -> set[Path]:
    """The directories the command's processes made (every process's file)."""
    made: set[Path] = set()
    for f in out_dir.glob(f"{MADE_FILE_PREFIX}*.txt"):
        try:
            made.update(Path(line) for line in f.read_text().splitlines() if line)
        except OSError:
            continue
    return made
