"""The monitor log on disk, for a sampler that appends to it: is an existing file a monitor log,
where does its time go on from, does its last line end."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


def is_a_log(path: Path, columns: tuple[str, ...]) -> bool:
    """Whether an existing file may be appended to as a monitor log (an empty or missing one
    may): a CSV with the log's header (``columns``), or a JSONL one of whose first lines is a
    row with ``time_s`` (a line cut by a full disk or a kill is passed over). ``--log
    train.jsonl`` appended a row to the training data, which the next train then refused (an
    audit)."""
    if not path.is_file() or path.stat().st_size == 0:
        return True
    with path.open("rb") as f:
        head = [f.readline(65536).decode(errors="replace").strip() for _ in range(8)]
    if path.suffix.lower() == ".csv":
        ok = head[0].split(",") == list(columns)
    else:
        ok = False
        for line in filter(None, head):
            try:
                row = json.loads(line)
            except ValueError:
                if line.startswith('{"time_s":'):  # a torn row of ours: time_s comes first
                    ok = True
                    break
                continue  # a torn line of another file's
            ok = isinstance(row, dict) and "time_s" in row
            break
    return ok


def idle_s(path: Path) -> float:
    """Seconds since the log's last write (its mtime: every row is flushed as written): the time
    between a killed or stopped run and its resume, kept as a gap in ``time_s`` — the report
    draws a gap as one, never across it (a review: the resumed run's first row came 0.1 ms after
    the killed run's last, and the lines ran straight over the restart)."""
    return max(0.0, time.time() - path.stat().st_mtime)


def last_time_s(path: Path) -> float:
    """The ``time_s`` of the log's last readable line (0 when none): an appended segment's samples
    go on from it, so time never goes back in one log. A CSV row's first field is ``time_s``
    (the log's header, :data:`trainfit.monitor.sampler.COLUMNS`); an audit: a CSV log appended to
    restarted at 0, and report refused the monitor's own file."""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 65536))
        data = f.read()
    tail = data.decode(errors="replace").splitlines()
    if data and not data.endswith(b"\n"):
        # a row a killed writer cut: a CSV's first field cut short still parses, as an earlier
        # time (a review: the appended rows then went back in time, and report refused them)
        tail = tail[:-1]
    csv_log = path.suffix.lower() == ".csv"
    for line in reversed(tail):
        try:
            t = float(line.split(",", 1)[0]) if csv_log else json.loads(line).get("time_s")
        except (ValueError, AttributeError):
            continue
        if isinstance(t, int | float) and math.isfinite(t):
            return float(t)
    return 0.0


def last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)
