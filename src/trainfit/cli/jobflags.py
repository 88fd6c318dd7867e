"""Every job-taking command's job flags, generated from the JobSpec fields (trainfit.job.fields):
the same names, types, allowed values and help text everywhere, and a flag given on the command
line overrides the job file's field.

typer builds a command's options from the function's signature; :func:`with_job_flags` appends one
keyword parameter per job field to it (``__signature__``) and hands the command the ones given as a
dict, ``job_flags`` — so no command writes the job's flags by hand.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from trainfit.job import JobError
from trainfit.job.combinations import ZERO_BUCKETS
from trainfit.job.fields import COMMAND_LINE_ONLY, FieldInfo, job_fields, refuse_dead_reentrant

_TYPES: dict[type, type] = {int: int, float: float, str: str, list: str}


def _option(f: FieldInfo) -> inspect.Parameter:
    """The typer option of one field; default None = not given (the file's value stands)."""
    if f.kind is bool:
        flag = f.name.replace("_", "-")
        opt = typer.Option(f"--{flag}/--no-{flag}", help=f.help, show_default=False)
        return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                 annotation=Annotated[bool | None, opt])
    help_text = f.help
    if f.choices:
        help_text += f" [{' | '.join(f.choices)}]"
    if f.clearable:
        help_text += " ('none' clears a value the job file set)"
    opt = typer.Option(help=help_text, show_default=False)
    # a clearable number is read as text: 'none', else converted in _value
    kind = str if f.clearable else _TYPES.get(f.kind, str)
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind | None, opt])  # type: ignore[valid-type]


def _value(f: FieldInfo, v: Any) -> Any:
    if f.cleared(v):
        return None
    if f.kind in (int, float) and isinstance(v, str):
        try:
            return f.kind(v)
        except ValueError:
            return v  # JobSpec's type check says what is wrong, with an example
    if f.kind is list and isinstance(v, str):
        return [t.strip() for t in v.split(",") if t.strip()]
    return v


def with_job_flags(exclude: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command taking ``job_flags: dict[str, Any]`` (the job fields given on the
    command line, values converted) with one option per JobSpec field not in ``exclude``."""
    fields = [f for f in job_fields() if f.name not in COMMAND_LINE_ONLY + exclude]

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)  # the command's own annotations, resolved
        own = [p for p in sig.parameters.values() if p.name != "job_flags"]
        clash = {p.name for p in own} & {f.name for f in fields}
        if clash:
            raise TypeError(f"{fn.__name__}: parameters {clash} shadow job fields")

        full = sig.replace(parameters=own + [_option(f) for f in fields])

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = full.bind(*args, **kwargs)  # a direct call (quickstart) gets the defaults too
            bound.apply_defaults()
            values = dict(bound.arguments)
            raw = {f.name: values.pop(f.name) for f in fields}
            given = {f.name: _value(f, raw[f.name]) for f in fields if raw[f.name] is not None}
            return fn(job_flags=given, **values)

        wrapper.__signature__ = full  # type: ignore[attr-defined]
        # typer reads the signature and the type hints: both must be the generated ones
        del wrapper.__wrapped__  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in full.parameters.values()}
        return wrapper
    return deco


def refuse_model_twice(target: str | None, job_flags: dict[str, Any]) -> None:
    """A positional model and another ``--model``: two models (an audit: ``plan llama-2-7b
    --model gpt2`` planned gpt2, the positional one dropped unsaid). Over a job file,
    ``--model`` replaces the file's model, as every flag replaces its field."""
    flag = job_flags.get("model")
    if target is None or target.endswith((".yaml", ".yml")) or flag is None or flag == target:
        return
    raise JobError(f"{target} and --model {flag}: two models",
                   "give one model (the positional MODEL, or --model over a job file's model)")


def merge_job_fields(fields: dict[str, Any], job_flags: dict[str, Any], usage: str) -> dict[str, Any]:
    """The job file's fields with the command line's on top. A micro-batch given without an
    accumulation or effective batch re-derives the accumulation (the file's effective batch is
    kept; without one, accumulation 1). ``usage``: the hint when no model is given."""
    out = {**fields, **job_flags}
    if "micro_batch" in job_flags and "grad_accum" not in job_flags and \
            "effective_batch" not in job_flags:
        out.pop("grad_accum", None)
    refuse_dead_reentrant(job_flags, out.get("grad_ckpt"))
    if job_flags.get("zero_pin_memory") is not None and not (
            out.get("sharding") in ("zero2", "zero3") and out.get("offload", "none") != "none"):
        # what it describes exists only there, either way it is given (an audit: the --no- form
        # was accepted in silence under FSDP); a file's value is its default, which tune writes
        # into every job
        flag = "--zero-pin-memory" if job_flags["zero_pin_memory"] else "--no-zero-pin-memory"
        raise JobError(f"{flag}: DeepSpeed's offload pin_memory, for ZeRO-2/3 with an "
                       "offload", "use --sharding zero2 (or zero3) --offload optimizer, or "
                       "drop it")
    if "quant" in job_flags and job_flags["quant"] is None and out.get("method") == "qlora":
        # 'none' clears a file's quant; under qlora the default (nf4-dq) would come back unsaid
        # (a newcomer audit: --method qlora --quant none planned nf4-dq)
        raise JobError("--quant none with --method qlora: QLoRA's frozen base is always 4-bit",
                       "use --method lora for an unquantized base, or --quant nf4-dq, nf4 or fp4")
    if job_flags.get("optimizer") not in (None, "sgd") and "sgd_momentum" not in job_flags:
        # a file's SGD momentum (a tuned file writes every field) describes an optimizer the
        # command line replaced (a review: refused as "given with --optimizer adamw")
        out.pop("sgd_momentum", None)
    for bucket, _, stages in ZERO_BUCKETS.values():
        if "sharding" in job_flags and bucket not in job_flags and \
                out.get("sharding") not in stages:
            # a file's DeepSpeed bucket describes an engine the command line replaced (a review:
            # refused as a flag never given)
            out.pop(bucket, None)
    if "model" not in out:
        raise JobError("no model given", usage)
    return out
