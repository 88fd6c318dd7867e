"""Shared pieces of the job-taking commands: sizes with units, atomic writes, error exit."""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from trainfit.cli.startup import other_rank
from trainfit.job import JobError, JobSpec, is_code_spec
from trainfit.job.files import file_memory_limit, parse_bytes  # noqa: F401 (the commands' import)

AllowCode = Annotated[bool, typer.Option(
    "--allow-code", help="Run a module:factory model named in the job file (a job file alone "
                         "never runs code).")]
"""The option of every command that reads a job file: code named in it runs only with this."""
TrustRemoteCode = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Run the model's own code from the hub (never taken from a job "
                                "file).")]
"""The option of every command that loads a model: remote code only with this flag."""


GENERIC_HINT = "trainfit COMMAND --help lists every option and its accepted values"
"""The hint of an error raised without one (every error of trainfit's own has one: a test reads
the source; this covers a library's message passed through)."""


def fail(err: JobError, *, as_json: bool = False, tail: list[str] | None = None) -> NoReturn:
    """The one error exit of every command: ``error:`` line, ``hint:`` line, exit code 2."""
    say_error(" ".join(str(err).split()), err.hint, as_json=as_json, tail=tail)


def echo_error(message: str, hint: str | None) -> None:
    """The ``error:`` and ``hint:`` lines on stderr (no exit: a launcher says several)."""
    typer.echo(f"error: {message}", err=True)
    typer.echo(f"hint: {hint or GENERIC_HINT}", err=True)


def say_error(message: str, hint: str | None, *, as_json: bool = False,
              tail: list[str] | None = None) -> NoReturn:
    """``error:`` and ``hint:`` on stderr (a script's last lines of output under them), exit 2;
    under ``--json`` also ``{"error", "hint", "exit_code"[, "output_tail"]}`` on stdout (a
    program reading the JSON got an empty stdout: an audit)."""
    hint = hint or GENERIC_HINT
    echo_error(message, hint)
    if tail:
        typer.echo("last lines of its output:", err=True)
        for line in tail:
            typer.echo(f"  | {line}", err=True)
    if as_json and not other_rank():
        # under torchrun every rank meets the same error: rank 0 alone prints the object (two
        # ranks printed two documents, invalid together: a review)
        doc: dict[str, Any] = {"error": message, "hint": hint, "exit_code": 2}
        typer.echo(json.dumps({**doc, "output_tail": tail} if tail else doc))
    raise typer.Exit(2)


def check_writable(path: str | Path, flag: str = "--out") -> None:
    """``path`` can be written as a file — checked before the work that produces it (a search of
    minutes must not end in a traceback): its directory exists and takes a file, it is not a
    directory. A probe file is created and removed."""
    p = Path(path)
    try:
        if p.is_dir():
            raise JobError(f"{flag} {path}: is a directory", "give a file name, e.g. trainfit.yaml")
        if p.exists() and not p.is_file():
            # the write renames a temporary over it: a device node would be replaced (an audit)
            raise JobError(f"{flag} {path}: exists and is not a regular file (a device, pipe or "
                           "socket)", "give a file name, e.g. trainfit.yaml")
        if p.parent.exists() and not p.parent.is_dir():
            raise JobError(f"{flag} {path}: {p.parent} is a file, not a directory",
                           "choose another location for it")
        if not p.parent.is_dir():
            raise JobError(f"{flag} {path}: directory {p.parent} does not exist",
                           f"create it first (mkdir -p {shlex.quote(str(p.parent))})")
        fd, probe = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise JobError(f"{flag} {path}: cannot write there ({err.strerror or type(err).__name__})",
                       "choose a writable location (or fix the directory's permissions)") from None


TUNE_HEADER = "written by trainfit tune; read by trainfit train"
"""The first line of the job file tune writes (after its ``# ``): what --out may replace."""


def check_replaceable(path: str | Path, reads: list[str | None], flag: str = "--out") -> None:
    """An existing ``path`` is replaced only when it is a job file tune wrote, and never when the
    job reads it (``reads``: its data, tokenizer, model paths). An audit: ``tune --out
    mydata.jsonl`` replaced the job's data with the tuned YAML, which then pointed at itself."""
    p = Path(path)
    if p.is_symlink():
        # the write renames a file over the link, leaving its target as it was (a review)
        raise JobError(f"{flag} {path}: is a symbolic link", "give the file it points to, or "
                       "another name")
    if not p.is_file():
        return
    here = p.resolve()
    for r in reads:
        if r and Path(r).exists() and Path(r).resolve() == here:
            raise JobError(f"{flag} {path}: is a file this job reads", "give another file name "
                           "for the tuned job, e.g. --out tuned.yaml")
    try:
        with open(p, encoding="utf-8", errors="replace") as f:
            first = f.readline(256)
    except OSError:
        return  # check_writable says what is wrong with it
    if first.strip() != f"# {TUNE_HEADER}":
        raise JobError(f"{flag} {path}: exists and is not a job file tune wrote",
                       "give another file name (e.g. --out tuned.yaml), or remove it first: tune "
                       "replaces only its own files")


def write_atomic(path: str | Path, text: str) -> None:
    """Write via a temporary file in the same directory, fsync, rename: never half-written.
    Every OS refusal is one JobError; the temporary file is removed."""
    p = Path(path)
    if not p.parent.exists():
        raise JobError(f"{path}: directory {p.parent} does not exist", "create it first")
    tmp = None
    try:
        # mkstemp makes 0600 files: a job file written anew is 0644, as report's files, and one
        # replaced keeps its own mode (an audit: every tuned YAML came out 0600)
        mode = p.stat().st_mode & 0o777 if p.is_file() else 0o644
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except OSError as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise JobError(f"{path}: cannot write it ({err.strerror or type(err).__name__})",
                       "choose a writable location with free space") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def job_for_model(job: JobSpec, fields: dict[str, Any], say: Any = None,
                  source: Any = None) -> JobSpec:
    """The job as the model's loading makes it: a checkpoint stored 4-bit turns LoRA into QLoRA
    in its format (:func:`trainfit.model.stored_quant.job_for_checkpoint`), then the attention
    transformers runs it with (:func:`default_attention`). ``source``: the resolved model, when
    the caller has it."""
    from trainfit.model.source import resolve_model
    from trainfit.model.stored_quant import job_for_checkpoint

    if not job.model or is_code_spec(job.model):
        return job
    if source is None:
        source = resolve_model(job.model, job.trust_remote_code)
    return default_attention(job_for_checkpoint(job, source, fields, say), fields, say, source)


def default_attention(job: JobSpec, fields: dict[str, Any], say: Any = None,
                      source: Any = None) -> JobSpec:
    """The job with its attention as transformers runs the model by default: SDPA where the
    model's class implements it, else its eager attention (Gemma-2, gpt-oss, Mamba, BLOOM ...),
    said through ``say``. An ``attention`` the user gave is kept (SDPA on such a model then fails
    with a hint), as is the user's own module (its code is not imported here). ``source``: the
    job's model when the caller has resolved it already (else it is resolved here)."""
    from trainfit.model.attention_impl import has_sdpa
    from trainfit.model.source import resolve_model

    if "attention" in fields or job.attention != "sdpa" or not job.model or \
            is_code_spec(job.model):
        return job
    if source is None:
        source = resolve_model(job.model, job.trust_remote_code)
    if has_sdpa(source) is not False:
        return job
    if say is not None:
        say(f"attention: {source.name} has no SDPA implementation in transformers: its eager "
            "attention is used (--attention eager)")
    return job.replace(attention="eager")


def job_of_fields(fields: dict[str, Any], target: str | None, job_flags: dict[str, Any]
                  ) -> JobSpec:
    """The job of a job file's fields merged with the command line's flags; an error about a
    field the file gave (not a flag) names it by its YAML key and the file
    (:func:`trainfit.job.fields.in_file_words`)."""
    from trainfit.job.fields import in_file_words

    try:
        return JobSpec.from_dict(fields, source=target or "flags")
    except JobError as err:
        if target is None or not target.endswith((".yaml", ".yml")):
            raise
        raise in_file_words(err, target, keep=(*job_flags, "trust_remote_code"),
                            hint_too=False) from None
