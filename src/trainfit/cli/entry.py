"""The console script's entry (``trainfit``, ``python -m trainfit``): imports the command line
inside a guard, so a Ctrl-C while torch / transformers / typer are still importing (the first
~0.3 s) is one line and exit 130, as one later is (:func:`trainfit.cli.main.main`), not a
traceback through the imports (an audit)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    try:
        from trainfit.cli.main import main as run
    except KeyboardInterrupt:
        if int(os.environ.get("RANK", "0")) == 0:
            sys.stderr.write("interrupted (Ctrl-C) before the command finished\n")
        sys.exit(130)
    run()
