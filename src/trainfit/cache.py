"""Where trainfit keeps what it measured once: this CPU's kernel rates and speed (plan and tune on
CPU), pre-tokenized data (doctor's fix). A leaf module: it imports nothing of trainfit.

``$TRAINFIT_CACHE``, else ``$XDG_CACHE_HOME/trainfit``, else ``~/.cache/trainfit`` — read at every
call, so a variable set after import counts. A cache is an optimisation: a directory that cannot be
written (read-only home, full disk) makes trainfit measure again next time, never fail.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """The cache directory now (not created)."""
    own = os.environ.get("TRAINFIT_CACHE")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trainfit"


def cache_path(name: str) -> Path:
    return cache_root() / name


def read_json(path: Path) -> Any | None:
    """The cached JSON, or None when it is missing, unreadable or corrupt."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: Any) -> bool:
    """Write atomically (temporary file + rename: a reader never sees half a file); False when the
    directory cannot be written — the caller goes on without a cache."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False
