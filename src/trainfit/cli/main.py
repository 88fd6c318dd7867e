"""``trainfit`` command line: parse → call the pure function → render (rich table or --json)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from trainfit import json_text
from trainfit.cli import doctor as doctor_cli
from trainfit.cli import emit as emit_cli
from trainfit.cli import monitor as monitor_cli
from trainfit.cli import report as report_cli
from trainfit.cli import train as train_cli
from trainfit.cli import tune as tune_cli
from trainfit.cli.gpu_arg import gpu_spec
from trainfit.cli.jobargs import AllowCode, TrustRemoteCode, fail, job_for_model, job_of_fields
from trainfit.cli.jobflags import merge_job_fields, refuse_model_twice, with_job_flags
from trainfit.cli.script import SeesDashes
from trainfit.cli.startup import one_line_usage_errors, quiet_third_party, quiet_transformers
from trainfit.job import DEFAULT_MARGIN, JobError, JobSpec, job_with_current, read_job_file
from trainfit.job.fields import in_file_words
from trainfit.plan.inputs import check_inputs  # no torch: the checks that need no model

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Predict, measure and choose LLM training configurations that use a GPU "
                       "well.")
report_cli.register(app)
doctor_cli.register(app)
tune_cli.register(app)
emit_cli.register(app)
train_cli.register(app)
monitor_cli.register(app)

DEFAULT_EXAMPLE = "seed000_t4_gemma_lora.yaml"


_fail = fail  # one error exit for every command: `error:` line, `hint:` line, exit 2


def examples_dir() -> Path:
    """Where the seed job files are: ``trainfit/examples/`` inside an installed wheel (setup.py maps
    the repository's examples/ to the package data ``trainfit.examples``), else, in a source
    checkout (an editable install), the repository's examples/ itself."""
    from importlib.resources import files

    packaged = files("trainfit").joinpath("examples")
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "examples"


def _load_target(target: str | None, *, allow_code: bool = False,
                 trust_remote_code: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """A positional ``TARGET`` is a job YAML or a model; returns (job fields, file-only keys).
    A model named here is named on the command line: ``module:factory`` runs."""
    if target is None:
        return {}, {}
    if target.endswith((".yaml", ".yml")):
        p = Path(target)
        if not _is_file(p) and _is_file(examples_dir() / target):
            p = examples_dir() / target
        fields, extra = read_job_file(p if _is_file(p) else target, allow_code=allow_code,
                                      trust_remote_code=trust_remote_code)
        try:  # validates the file's own fields early, named by their YAML keys
            JobSpec.from_dict(dict(fields), source=target)
        except JobError as err:
            raise in_file_words(err, target, hint_too=False) from None
        return fields, extra
    return {"model": target}, {}


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except OSError:  # a path too long: read_job_file says so
        return False


CURRENT_KNOBS = ("micro_batch", "grad_accum", "grad_ckpt", "precision", "attention",
                 "optimizer_impl")
"""What ``--current`` takes from the flags as the configuration the user runs now."""



def _current_and_grid(job: JobSpec, fields: dict[str, Any], extra: dict[str, Any], current: bool,
                      source: str, target_batch: int | None = None
                      ) -> tuple[JobSpec, JobSpec | None]:
    """(the job to plan the grid of, the user's current configuration or None).
    ``target_batch``: the effective batch the grid keeps, where it is not the current one's."""
    if current:
        # the knobs given are what the user runs now; the grid varies them around it. One not
        # given would be a baseline nobody runs (a None micro-batch planned as the grid's own)
        missing = [flag for flag, value in (("--micro-batch", job.micro_batch),
                                            ("--precision", job.precision)) if value is None]
        if missing:
            raise JobError(f"--current: the configuration you run now needs "
                           f"{' and '.join(missing)}",
                           "give the knobs of your current run (--micro-batch, --grad-accum, "
                           "--precision, --grad-ckpt), or drop --current")
        current_job = job if job.grad_ckpt else job.replace(grad_ckpt="off")
        # the batch split is what the grid varies: never carried over (a derived accumulation
        # with the effective batch fixed the micro-batch, a one-row grid: a review)
        grid = {k: v for k, v in job.to_dict().items()
                if k not in ("micro_batch", "grad_accum")
                and (k not in CURRENT_KNOBS or k not in fields)}
        grid["effective_batch"] = target_batch or job.effective_batch or (
            (job.micro_batch or 1) * (job.grad_accum or 1) * job.ranks)
        # every other field as the job has it, None included: ``--max-grad-norm none`` is a
        # value (default 1.0); dropped, the grid clipped where the run does not (a review: the
        # current run then matched no row)
        return JobSpec.from_dict(grid, source="flags"), current_job
    if "current" in extra:
        return job, job_with_current(fields, extra["current"], source)
    return job, None


def _file_checks(extra: dict[str, Any], source: str) -> dict[str, Any]:
    """What a job file adds to a plan: the fields it assumed, a device number observed at the
    current configuration, the host RAM free (trainfit.plan.checks.with_checks' arguments)."""
    from trainfit.cli.jobargs import parse_bytes

    out: dict[str, Any] = {}
    assumed = extra.get("assumed")
    if assumed is not None:
        if not isinstance(assumed, list) or not all(isinstance(a, str) for a in assumed):
            raise JobError(f"{source}: `assumed` must be a list of job fields",
                           "e.g. assumed: [seq_len, method]")
        out["assumed"] = assumed
    observed = extra.get("observed")
    if observed is not None:
        if not isinstance(observed, dict) or "device" not in observed:
            raise JobError(f"{source}: `observed` needs a device size",
                           "e.g. observed: {device: 2667MiB, source: nvidia-smi}")
        out["observed_device_bytes"] = parse_bytes(str(observed["device"]), "observed.device")
        out["observed_source"] = str(observed.get("source", "observed"))
    if extra.get("host_ram_free") is not None:
        out["host_ram_free_bytes"] = parse_bytes(str(extra["host_ram_free"]), "host_ram_free")
    return out


@app.command("plan", cls=SeesDashes)
@with_job_flags()
def plan_cmd(
    target: Annotated[list[str] | None, typer.Argument(
        help="Model (catalog name, HF id, dir, config.json), a job YAML, or after -- your "
             "training script: -- python train.py ARGS (its Trainer/SFTTrainer is read, no "
             "weights, no training).", show_default=False,
        metavar="MODEL | JOB.yaml | -- COMMAND ARGS")] = None,
    job_flags: dict[str, Any] | None = None,
    gpu: Annotated[str | None, typer.Option(help="GPU name (trainfit gpus), e.g. t4, a100-80gb, "
                                                  "generic-8gb.")] = None,
    trust_remote_code: TrustRemoteCode = False,
    allow_code: AllowCode = False,
    margin: Annotated[float, typer.Option(help="Safety margin of GPU memory kept free.")] = DEFAULT_MARGIN,
    dataset_tokens: Annotated[int | None, typer.Option(
        help="Tokens in one epoch: adds the predicted time for the dataset.")] = None,
    epochs: Annotated[float | None, typer.Option(help="Epochs (needs --dataset-tokens).")] = None,
    verify: Annotated[bool, typer.Option(
        help="Re-simulate the recommended configuration at full size.")] = True,
    interconnect: Annotated[str | None, typer.Option(
        help="GPU-to-GPU link for ranks > 1: pcie3|pcie4|pcie5|nvlink2|nvlink3|nvlink4|nvlink5 "
             "(one host's; on a PCIe card an NVLink is its bridge), or a measured all-gather bus "
             "bandwidth in GB/s (trainfit tune under torchrun prints it; the only way past one "
             "host); default: the GPU catalog's")] = None,
    current: Annotated[bool, typer.Option(
        "--current", help="The knobs given (--micro-batch, --grad-accum, --grad-ckpt, --precision, "
                          "--attention, --optimizer-impl) are what you run now: plan the grid "
                          "around them and state the pick against them; --effective-batch, if "
                          "given too, is the batch the grid keeps.")] = False,
    timeout_s: Annotated[float, typer.Option(
        "--timeout-s", help="Script form: stop a script whose trainer has not started by then.")] = 900.0,
    all_rows: Annotated[bool, typer.Option(
        "--all-rows", help="Show every configuration, not only those near the fitting frontier.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Predict the peak GPU memory of each candidate configuration (no GPU needed)."""
    from trainfit.cli.script import (
        is_command,
        plan_script_cmd,
        refuse_two_models,
        refuse_without_dashes,
    )
    from trainfit.model.source import check_seq_len, resolve_model
    from trainfit.plan.checks import with_checks
    from trainfit.render.progress import stage_progress

    args = [target] if isinstance(target, str) else list(target or [])  # quickstart passes a str
    say = (lambda msg: None) if as_json else (lambda msg: typer.echo(msg, err=True))
    try:
        refuse_two_models(args)
        if is_command(args):
            refuse_without_dashes(args, job_flags or {}, "plan")
            if current:
                raise JobError("--current with a script: the script's configuration is the "
                               "current one", "drop --current")
            spec = gpu_spec(gpu, {}, interconnect, say, ranks=(job_flags or {}).get("ranks"))
            plan_script_cmd(args, job_flags=job_flags or {}, gpu=spec, margin=margin, verify=verify,
                            trust_remote_code=trust_remote_code, timeout_s=timeout_s,
                            as_json=as_json, dataset_tokens=dataset_tokens, epochs=epochs)
            return
        target = args[0] if args else None
        refuse_model_twice(target, job_flags or {})
        fields, extra = _load_target(target, allow_code=allow_code or "model" in (job_flags or {}),
                                     trust_remote_code=trust_remote_code)
        fields = merge_job_fields(fields, job_flags or {},
                                  "trainfit plan MODEL --gpu GPU, a job YAML, or your script: "
                                  "trainfit plan --gpu GPU -- python train.py ARGS")
        if trust_remote_code:
            fields["trust_remote_code"] = True
        # --current with --effective-batch beside the current micro-batch × accumulation: the
        # grid's target, as a job file's current: block has it (a QA run saw it refused here)
        target_batch = fields.pop("effective_batch", None) if current and {
            "micro_batch", "grad_accum", "effective_batch"} <= set(fields) else None
        job = job_of_fields(fields, target, job_flags or {})
        job, current_job = _current_and_grid(job, fields, extra, current, target or "flags",
                                             target_batch)
        checks = _file_checks(extra, target or "flags")  # bad input fails before the work
        spec = gpu_spec(gpu, extra, interconnect, say, ranks=job.ranks, where=target)
        # refused before the model is resolved (an audit: said after 10-47 s of building it)
        check_inputs(job, spec, margin, dataset_tokens, epochs)  # plan() checks its own again
        source = resolve_model(job.model, job.trust_remote_code)
        check_seq_len(job.seq_len, source)  # tune and train refuse it too
        job = job_for_model(job, fields, say, source)
        if current_job is not None:
            current_job = job_for_model(current_job, fields, source=source)
        from trainfit.plan.grid import plan  # torch: imported after the input's checks

        with stage_progress("plan") as progress:
            result = plan(job, source, spec, margin=margin, verify=verify,
                          dataset_tokens=dataset_tokens, epochs=epochs, current=current_job,
                          progress=progress)
        result = with_checks(result, **checks)
    except JobError as err:
        _fail(err, as_json=as_json)
        return
    _print_plan(result, spec, as_json, all_rows)


def _print_plan(result: Any, spec: Any, as_json: bool, all_rows: bool) -> None:
    """The plan as JSON (with where the GPU's memory figure came from) or as rich tables."""
    if as_json:
        from trainfit.render.plan_words import plan_words
        from trainfit.render.words import plan_json

        d = {**plan_json(result), **plan_words(result)}
        if spec is not None:  # the catalog's (published), or NVML's reading here (measured)
            d["gpu_memory_source"] = spec.memory_source
        typer.echo(json_text.dumps(d, indent=1))
    else:
        from trainfit.render.plan import render_plan

        render_plan(result, all_rows=all_rows)


@app.command("models")
def models_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the built-in model catalog."""
    from trainfit.model.catalog.models import MODELS

    rows = [{"name": m.name, "hf_id": m.hf_id, "task": m.task, "params": m.param_count,
             "note": m.note} for m in MODELS.values()]
    if as_json:
        typer.echo(json_text.dumps(rows, indent=1))
        return
    from trainfit.render.plan import render_simple

    render_simple("model catalog", ["name", "hf_id", "task", "params (count)"],
                  [[r["name"], r["hf_id"], r["task"], f"{(r['params'] or 0) / 1e6:,.0f} M"]
                   for r in rows])


@app.command("gpus")
def gpus_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the GPU catalog."""
    from dataclasses import asdict

    from trainfit.hardware.gpus import GPUS

    if as_json:
        typer.echo(json_text.dumps([asdict(g) for g in GPUS.values()], indent=1))
        return
    from trainfit.render.plan import render_simple
    from trainfit.speed.comm import peer_to_peer

    def link(g: Any) -> str:
        if g.interconnect_gbs is None:
            return "unknown"
        # GeForce cards: the driver disables PCIe peer-to-peer, NCCL goes through host memory
        p2p = "" if peer_to_peer(g) else ", no peer-to-peer"
        return f"{g.interconnect} {g.interconnect_gbs:g}{p2p}"

    render_simple("GPU catalog", ["name", "memory (GiB, as CUDA reports)", "bf16 (TFLOP/s)",
                                  "bandwidth (GB/s)", "GPU-to-GPU link (GB/s per direction)"],
                  [[g.name, f"{g.memory_bytes / 2**30:.2f}",
                    "no bf16" if g.peak_tflops.get("bf16") is None
                    else f"{g.peak_tflops['bf16']:g}",
                    "unknown" if g.memory_bandwidth_gbs is None else f"{g.memory_bandwidth_gbs:g}",
                    link(g)]
                   for g in GPUS.values()])
    # the seeds and plan's help use generic-8gb: not a catalog row, so said (an audit)
    typer.echo("also: generic-<N>gb (e.g. generic-8gb) — any card of N GB, memory only: its "
               "speed is unknown")


@app.command("quickstart")
def quickstart_cmd() -> None:
    """Plan the embedded default: seed 000 (Gemma-2B QLoRA, assumed from its notes, on a Tesla T4)."""
    plan_cmd(str(examples_dir() / DEFAULT_EXAMPLE))


def one_line_summaries(typer_app: typer.Typer) -> None:
    """The command list shows each command's first docstring paragraph as its summary, and typer
    keeps that paragraph's source line breaks ("..., the pick, the" / "seed-002-style table"):
    give every command without its own ``short_help`` the paragraph on one line, which rich then
    wraps to the terminal's width."""
    for info in typer_app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if info.short_help is None and doc:
            info.short_help = " ".join(doc.strip().split("\n\n")[0].split())


one_line_summaries(app)
# the list in the order of the work: predict, measure, run, explain, show; then the helpers
_WORK_ORDER = ("quickstart", "plan", "tune", "train", "doctor", "report", "monitor", "emit",
               "models", "gpus")
app.registered_commands.sort(
    key=lambda c: _WORK_ORDER.index(c.name) if c.name in _WORK_ORDER else len(_WORK_ORDER))


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    try:
        # inside the guard: these import rich's and typer's modules, where a Ctrl-C in the
        # first half second landed (an audit: a traceback)
        quiet_third_party()
        quiet_transformers()
        one_line_usage_errors()
        app()
    except KeyboardInterrupt:
        # before train's own handler is in place (the model loading) or in any other command:
        # said, not a silent exit 130 (an audit)
        _said_interrupted()
        _leave_as_a_rank(130)
        sys.exit(130)
    except SystemExit as done:  # typer ends every command with it
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if code == 130 and _from_ctrl_c(done):
            _said_interrupted()  # typer turned the Ctrl-C into Exit(130) and a blank line
        if code == 0:
            # the command's work is done: a Ctrl-C during the interpreter's exit changes
            # nothing (an audit: a KeyboardInterrupt traceback from atexit, exit 0)
            with contextlib.suppress(ValueError):  # not the main thread: left alone
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        _leave_as_a_rank(code)
        raise


def _said_interrupted() -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        typer.echo("interrupted (Ctrl-C) before the command finished", err=True)


def _from_ctrl_c(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in the exception's chain (typer's ``Exit(130) from e``);
    train's own SIGINT handler exits 130 without one, having said what it saved."""
    seen: BaseException | None = exc
    for _ in range(8):
        seen = seen.__cause__ or seen.__context__ if seen is not None else None
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
    return False


def _leave_as_a_rank(code: int) -> None:
    """Under torchrun, a rank that finished leaves with its exit code intact: gloo's threads
    aborted the interpreter's teardown now and then (SIGABRT after a successful run, which a
    scheduler reads as a failure). Only when the process group exists (a rank that ran a step)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    from trainfit.engine.dist import leave_together

    leave_together(code, wait=code == 0)


if __name__ == "__main__":
    main()
