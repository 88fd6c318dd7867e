"""``trainfit emit FILE --to hf|trl|accelerate``: a tuned job file's knobs as another tool's
settings — read from the file (no probe, no torch import), the payload alone on stdout, every
message on stderr, so ``> args.json`` is a file the target accepts as it is."""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any

import typer

from trainfit.cli.jobargs import fail
from trainfit.job import JobError, JobSpec, read_job_file
from trainfit.job.emit import TARGETS


def emit_job(job: JobSpec, target: str, source: str, extra: dict[str, Any], *,
             device: str | None = None, searched: bool = False,
             stated: Collection[str] | None = None) -> None:
    """Print ``job`` for ``target``: the payload on stdout, the messages on stderr.  ``stated``:
    the fields the job file sets (None: all, a job tune just chose)."""
    from trainfit.job.emit import emit
    from trainfit.job.tuned_file import edited_since
    from trainfit.render.emit import emit_messages

    e = emit(job, target, device=device or extra.get("device"), stated=stated)
    edited = edited_since(job, extra.get("measured") or {})
    for line in emit_messages(e, source, extra, searched=searched, edited=edited):
        typer.echo(line, err=True)
    typer.echo(e.text(), nl=False)


def emit_file(path: str, target: str, device: str | None = None) -> None:
    """A job file's knobs for ``target`` (JobError when the file leaves them open)."""
    # emit never imports or builds the model (its knobs are the payload): a module:factory
    # model, or remote code, runs nothing here, so the file is read without those refusals
    # (tune's own output for a module:factory job could not be emitted, and the hint named an
    # --allow-code that emit does not have)
    from trainfit.job.fields import in_file_words

    fields, extra = read_job_file(path, allow_code=True, trust_remote_code=True)
    try:
        job = JobSpec.from_dict(fields, source=path)
    except JobError as err:
        # emit takes the job from the file alone: its keys, not flags it has not (an audit:
        # "--micro-batch 0" of a file's micro_batch: 0)
        raise in_file_words(err, path) from None
    emit_job(job, target, path, extra, device=device,
             stated={k.replace("-", "_") for k in fields})  # pin-memory: as from_dict reads


def is_tuned(extra: dict[str, Any]) -> bool:
    """The file holds what tune measured (tune wrote it): its knobs are a decision, not a start."""
    return isinstance(extra.get("measured"), dict)


def register(app: typer.Typer) -> None:
    @app.command("emit")
    def emit_cmd(
        job_file: Annotated[str, typer.Argument(help="A tuned job file (what trainfit tune --out "
                                                     "wrote), or any job file with its knobs set.")],
        to: Annotated[str, typer.Option("--to", help="hf (TrainingArguments JSON) | trl (SFTConfig "
                                                     "JSON) | accelerate (config YAML)")] = "hf",
        device: Annotated[str | None, typer.Option(
            help="cpu or cuda (default: the file's device: key, else cuda).")] = None,
    ) -> None:
        """Print the file's knobs as TrainingArguments / SFTConfig / accelerate settings (no probe)."""
        try:
            if to not in TARGETS:
                raise JobError(f"--to {to}: unknown", "use hf, trl or accelerate")
            emit_file(job_file, to, device)
        except JobError as err:
            fail(err)
