"""The script form of ``plan`` and ``tune`` (``trainfit plan --gpu t4 -- python train.py ARGS``),
and the GPU ``plan`` targets when none is named (this machine's, through NVML)."""

from __future__ import annotations

import contextvars
import shlex
from collections.abc import Callable
from typing import Any

import typer

from trainfit import json_text
from trainfit.job import JobError

_DASHES: contextvars.ContextVar[bool | None] = contextvars.ContextVar("trainfit_dashes",
                                                                     default=None)
"""The last parsed command line's ``--`` (None: none parsed): a context variable, not the click
context's meta, because plan's function takes no context (quickstart also calls it directly)."""


class SeesDashes(typer.core.TyperCommand):
    """Records whether the words held a ``--``: click keeps no trace of it, and without it a
    script's own options (``python train.py --steps 4``) were parsed as trainfit's, silently."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        _DASHES.set("--" in args)
        return super().parse_args(ctx, args)


def dashes_given() -> bool | None:
    """Whether the command line :class:`SeesDashes` parsed held a ``--`` (None: none parsed)."""
    return _DASHES.get()


def refuse_without_dashes(cmd: list[str], job_flags: dict[str, Any], verb: str) -> None:
    """A command given without ``--`` beside job flags: those may have been the script's own
    (an audit: ``plan --gpu t4 python train.py --model M --data D`` took --model and --data,
    ran the script without them and blamed the script)."""
    if dashes_given() is not False or not job_flags:
        return
    flags = ", ".join(f"--{k.replace('_', '-')}" for k in job_flags)
    raise JobError(f"{shlex.join(cmd)}: a command goes after --; without it trainfit took "
                   f"{flags} as its own",
                   f"trainfit {verb} [trainfit's options] -- {shlex.join(cmd)} [its options]")


def is_command(args: list[str]) -> bool:
    """``-- python train.py ARGS`` (more than one word, or a lone ``train.py``) rather than a model
    or a job file."""
    return len(args) > 1 or (len(args) == 1 and args[0].endswith(".py") and ":" not in args[0])


_SWITCH_VALUES = ("true", "false", "yes", "no", "on", "off", "1", "0")
"""Words a switch's value would be: after a model, the sign of ``--switch VALUE``."""


def refuse_two_models(args: list[str]) -> None:
    """``plan gpt2 gpt2-medium``: two words whose first is a catalog model and no program are two
    models, not a command (run as one, the first word was 'command not found')."""
    import shutil

    from trainfit.model.catalog.models import find_model

    if len(args) > 1 and find_model(args[0]) is not None and shutil.which(args[0]) is None:
        value = next((a for a in args[1:] if a.lower() in _SWITCH_VALUES), None)
        if value is not None:
            # a switch given a value (--trl-logprob-head true) leaves the value as a second
            # target: "llama-3.1-8b true: plan takes one model" named neither (an audit)
            raise JobError(f"{value}: a switch takes no value (the word after a --flag is read "
                           "as a second model)",
                           "give the switch alone (e.g. --trl-logprob-head), or its --no- form "
                           "(--no-trl-logprob-head)")
        raise JobError(f"{' '.join(args)}: plan takes one model or job file",
                       "plan them one at a time; a training script goes after --, e.g. "
                       "trainfit plan --gpu t4 -- python train.py")


def local_gpu_spec(say: Any) -> Any:
    """The GPU this machine has (NVML: its name mapped to the catalog, capacity = free now), said on
    stderr; None without NVML or a GPU (plan then has no GPU, as before). An unknown card is planned
    as a generic card of its free memory (its speed unknown)."""
    import dataclasses

    from trainfit.hardware.gpus import generic_gpu
    from trainfit.monitor.local_gpu import local_gpu

    g = local_gpu()
    if g is None:
        return None
    gib = 2**30
    used = f"{g.used_bytes / gib:.2f} GiB in use by other processes and the driver"
    if g.spec is None:
        spec = dataclasses.replace(
            generic_gpu(max(g.total_bytes / gib, 0.01)), memory_bytes=max(g.free_bytes, 1),
            display_name=g.device_name,
            memory_source=f"NVML on this machine: {g.device_name!r} (not in the catalog: speed "
                          f"unknown), {g.free_bytes} B free (measured)")
        say(f"GPU: this machine's {g.device_name} (NVML; not in the catalog: memory only, speed "
            f"unknown) — capacity {g.free_bytes / gib:.2f} GiB free of {g.total_bytes / gib:.2f} "
            f"GiB ({used}, measured); --gpu NAME plans another")
        return spec
    say(f"GPU: this machine's {g.device_name} (NVML) → catalog {g.spec.name} — capacity "
        f"{g.free_bytes / gib:.2f} GiB free of {g.total_bytes / gib:.2f} GiB ({used}, "
        "measured now); --gpu NAME plans another")
    return g.spec


def check_script_options(cmd: list[str], job_flags: dict[str, Any], timeout_s: float,
                         verb: str) -> None:
    """What the command line says wrong, before the script runs (minutes on a real model) and
    before torch loads: the command itself, each job flag alone (its type, a size ≥ 1, an allowed
    value) and --timeout-s. An audit: ``--micro-batch 0`` ran the script, then ended in a
    ZeroDivisionError; ``--effective-batch 0`` was taken as not given; ``--timeout-s -1`` was
    said after the script, ``nan`` ran with no timeout."""
    from trainfit.doctor.inject import check_command
    from trainfit.job.fields import check_given, check_timeout

    check_command(cmd, verb)
    check_given(job_flags)
    check_timeout(timeout_s, "a script whose trainer has not started")


def plan_script_cmd(cmd: list[str], *, job_flags: dict[str, Any], gpu: Any, margin: float,
                    verify: bool, trust_remote_code: bool, timeout_s: float, as_json: bool,
                    dataset_tokens: int | None = None, epochs: float | None = None) -> None:
    _or_fail(lambda: check_script_options(cmd, job_flags, timeout_s, "plan"), as_json)
    from trainfit.script.plan import plan_script

    if not as_json:
        typer.echo(f"reading the trainer of {shlex.join(cmd)} (no weights, no training) …",
                   err=True)
    sp = _or_fail(lambda: plan_script(cmd, gpu=gpu, flags=job_flags, margin=margin, verify=verify,
                                      trust_remote_code=trust_remote_code, timeout_s=timeout_s,
                                      dataset_tokens=dataset_tokens, epochs=epochs), as_json)
    if as_json:
        from trainfit.render.script import script_plan_json

        typer.echo(json_text.dumps(script_plan_json(sp), indent=1, default=str))
    else:
        from trainfit.render.script import render_script_plan

        render_script_plan(sp)


def _or_fail(call: Callable[[], Any], as_json: bool = False) -> Any:
    """``call()``, its errors as the command's error exit: a script's with the last lines of its
    output, a job's as every command's."""
    from trainfit.cli.jobargs import fail, say_error
    from trainfit.script.launch import ScriptError

    try:
        return call()
    except ScriptError as err:
        say_error(str(err), err.hint, tail=err.tail, as_json=as_json)
    except JobError as err:
        fail(err, as_json=as_json)


def tune_script_cmd(cmd: list[str], *, job_flags: dict[str, Any], opts: Any,
                    trust_remote_code: bool, timeout_s: float, as_json: bool) -> None:
    """``tune -- CMD``: the script's own trainer probed; the change said in its keywords."""
    import dataclasses

    from trainfit.model.runtime import parse_device

    _or_fail(lambda: parse_device(str(opts.device)), as_json)  # before the script runs (minutes), not after
    from trainfit.script.tune import tune_script

    options = {k: v for k, v in dataclasses.asdict(opts).items() if k != "isolate"}
    options["fixed"] = sorted(options["fixed"])
    options["knobs"] = list(options["knobs"])
    if not as_json:
        typer.echo(f"running {shlex.join(cmd)} until its trainer would train, then probing it "
                   f"on {opts.device} …", err=True)
    st = _or_fail(lambda: tune_script(cmd, options=options, flags=job_flags,
                                      trust_remote_code=trust_remote_code, timeout_s=timeout_s), as_json)
    if as_json:
        from trainfit.render.script import script_tune_json

        typer.echo(json_text.dumps(script_tune_json(st), indent=1, default=str))
    else:
        from trainfit.render.script import render_script_tune

        render_script_tune(st)
    if st.result.pick is None:
        raise typer.Exit(1)
