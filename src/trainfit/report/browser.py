"""Headless Chromium (Debian's ``chromium``) to look at a report as a person would: a screenshot and
the DOM after load.  Used by the browser test and docs/make_example_report.py; optional at run time."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

TIMEOUT_S = 120
"""A cold start of Chromium on a 2-core machine takes a few seconds; a hung one must not hang CI."""

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--force-device-scale-factor=1", "--no-first-run", "--disable-extensions")
"""--no-sandbox: CI runs as root, where Chromium's sandbox refuses to start."""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
    return subprocess.run([exe, *FLAGS, *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)


def look(html: Path, png: Path, width: int = 1280, height: int = 4000) -> str:
    """One Chromium run: a ``width`` × ``height`` screenshot of the loaded page to ``png``, and the DOM
    after load (returned).  Raises ``RuntimeError`` with Chromium's stderr when no screenshot came."""
    res = _run([f"--screenshot={png}", f"--window-size={width},{height}", "--dump-dom",
                html.resolve().as_uri()])
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {res.returncode}): {res.stderr[-2000:]}")
    return res.stdout
