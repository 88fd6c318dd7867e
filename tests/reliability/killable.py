"""The target of the SIGKILL test's processes: ``trainfit ARGS`` as a process forked from a
forkserver that imported trainfit, torch and transformers once (a fresh interpreter takes ~6 s to
import them on this 2-core machine; a fork takes milliseconds, so ≥ 10 kills fit in seconds).
The process is the real command: its own signal handlers, lock, files and exit code."""

from __future__ import annotations

import os
import sys

PRELOAD = ["torch", "transformers", "safetensors.torch", "trainfit.cli.main", "trainfit.run.loop",
           "trainfit.run.backend", "trainfit.model.runtime", "trainfit.data.load",
           "transformers.models.llama.modeling_llama", "trainfit.monitor"]


def run_cli(args: list[str], log: str) -> None:
    """``trainfit ARGS`` with stdout and stderr in ``log``; exits with the command's code."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import torch

    torch.set_num_threads(1)  # the same float summation order in every process (and 2 cores)
    sys.argv = ["trainfit", *args]
    from trainfit.cli.main import main

    main()
