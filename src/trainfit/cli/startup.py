"""What ``trainfit``'s entry point sets up before typer parses anything: a usage error click
cannot parse said on one line with its fix, and third-party log noise kept out of the output."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import typer


def _took_a_command(ctx: Any) -> bool:
    """Whether the arguments click could not place are a command (``-- python train.py``,
    ``accelerate launch train.py``): its first word is in the job file's place."""
    words = [v for v in (getattr(ctx, "params", None) or {}).values() if isinstance(v, str)]
    return "--" in sys.argv or any(
        os.path.basename(w).startswith("python") or w.endswith(".py")
        or w in ("accelerate", "torchrun", "deepspeed") for w in words)


def other_rank() -> bool:
    """This process is a rank other than 0 of a torchrun (``WORLD_SIZE`` set: a ``RANK`` alone,
    e.g. a cluster's pod index, does not make one): rank 0 alone prints a --json error object."""
    if "WORLD_SIZE" not in os.environ:
        return False
    rank = os.environ.get("RANK", "0").strip()
    return rank not in ("", "0")


def _wants_json() -> bool:
    """``--json`` among the arguments before a ``--`` (after it: the user's own command's)."""
    argv = sys.argv[1:]
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


_FLAG_SYNONYMS: dict[str, tuple[str, str]] = {
    "--batch-size": ("trainfit's batch flags are --micro-batch (samples per forward pass) and "
                     "--effective-batch (samples per optimizer step)",
                     "micro_batch: (samples per forward pass) and effective_batch: (samples per "
                     "optimizer step) in the job file"),
    "--per-device-train-batch-size": ("HF's per_device_train_batch_size is --micro-batch",
                                      "HF's per_device_train_batch_size is micro_batch: in "
                                      "the job file"),
    "--gradient-accumulation-steps": ("HF's gradient_accumulation_steps is --grad-accum",
                                      "HF's gradient_accumulation_steps is grad_accum: in "
                                      "the job file"),
    "--max-seq-length": ("--seq-len (tokens per sample)", "seq_len: in the job file"),
    "--max-length": ("--seq-len (tokens per sample)", "seq_len: in the job file"),
    "--gradient-checkpointing": ("--grad-ckpt full", "grad_ckpt: full in the job file"),
    "--version": ("pip show trainfit prints the installed version",
                  "pip show trainfit prints the installed version"),
}
"""Other tools' spellings (HF TrainingArguments', scripts') of what trainfit names otherwise:
said beside click's "no such option" (an audit: --batch-size got no suggestion) — as plan's and
tune's flags, or as the job file's keys for the commands that take one (train, emit: a review
found --seq-len offered to train, which has no such flag)."""


def one_line_usage_errors() -> None:
    """A flag click cannot parse (``--seq-len abc``, an unknown option) is bad input like any
    other: one ``error:`` line and a ``hint:``, exit code 2 — not typer's boxed usage screen.
    Typer has no setting for how it shows a click usage error (typer/core.py ``_main`` calls
    ``rich_utils.rich_format_error``), so that function is wrapped; anything else (the help a
    bare command prints) is typer's own."""
    from typer import rich_utils

    orig = rich_utils.rich_format_error
    if getattr(orig, "one_line", False):
        return

    def format_error(err: Any) -> None:
        # typer ≥ 0.24 raises its vendored click's exceptions (typer._click, private), so a
        # usage error is told by what it is — click's UsageError has exit code 2 — not its class
        if getattr(err, "exit_code", None) != 2 or \
                type(err).__name__ == "NoArgsIsHelpError":  # a bare command: typer prints help
            orig(err)
            return
        msg = " ".join(err.format_message().split())
        ctx = getattr(err, "ctx", None)
        where = ctx.command_path if ctx is not None else "trainfit"
        msg = msg[:1].lower() + msg[1:]
        typer.echo(f"error: {msg}", err=True)
        hint = f"{where} --help lists the options and what each takes"
        if msg.startswith("got unexpected extra argument") and \
                where.split()[-1] in ("train", "emit") and _took_a_command(ctx):
            # `train|emit -- python train.py`: the form plan, tune and doctor take (a review:
            # "python" was read as the job file and the rest as extra arguments, said as such)
            hint = (f"trainfit {where.split()[-1]} takes a job file (trainfit.yaml), not a "
                    "command: for your own script, trainfit tune -- python train.py prints the "
                    "keywords to change in it; then run it as you do")
        synonym = _FLAG_SYNONYMS.get((msg.removeprefix("no such option: ").split() or [""])[0])
        if msg.startswith("no such option:") and synonym:
            hint = f"{synonym[where.split()[-1] in ('train', 'emit')]}; {hint}"
        typer.echo(f"hint: {hint}", err=True)
        if _wants_json() and not other_rank():
            # a program asked for JSON: the error as every other --json error is (one object on
            # stdout, docs/json-formats.md; a review: `--seq-len abc --json` printed none)
            typer.echo(json.dumps({"error": msg, "hint": hint, "exit_code": 2}))

    format_error.one_line = True  # type: ignore[attr-defined]
    rich_utils.rich_format_error = format_error


class _DropMessage(logging.Filter):
    """Drops log records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_third_party() -> None:
    """Keep third-party noise out of the user's output. bitsandbytes 0.50 logs "Failed to load
    CPU gemm_4bit_forward from kernels-community" (a logging.warning at import,
    bitsandbytes/backends/cpu/ops.py) on CPUs with AVX-512 BF16 when the optional `kernels`
    package is absent — once per process, so twice per plan (its two simulation workers). What it
    means: 4-bit matmuls on this CPU use bitsandbytes' slower built-in path; plan never runs them
    (its 4-bit layers are data-less stand-ins), and tune/train on a CPU only measure that path.
    Set on the logger before bitsandbytes is imported; forked workers inherit it."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
        _DropMessage("Failed to load CPU gemm_4bit_forward"))


def quiet_transformers() -> None:
    """transformers' warnings at the error level, set when transformers' logging module is
    executed — not by importing it here: transformers takes ~1.3 s to import, which every usage
    error and ``--help`` paid before saying anything (an audit timed flag errors at 11-20 s).
    Not ``TRANSFORMERS_VERBOSITY`` in the environment: the user's own script, run by doctor or
    tune, would inherit it and lose its warnings."""
    name = "transformers.utils.logging"
    module = sys.modules.get(name)
    if module is not None:
        module.set_verbosity_error()
        return
    from trainfit.doctor.post_import import PostImport

    sys.meta_path.insert(0, PostImport({name: lambda m: m.set_verbosity_error()},
                                       on_error=lambda _name, _err: None))
