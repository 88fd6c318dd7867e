"""``trainfit tune -- python train.py ARGS``: tune's search over probes of the user's own trainer.

The script runs unchanged, with its weights, until its trainer would train; there
(:func:`tune_trainer`, inside the user's process) the trainer is read as plan reads it, the job is
mapped, and tune's search (:func:`trainfit.tune.tuner.run_search`: the largest micro-batch that
fits from the prediction, then the knobs, speed-ups only through interleaved rounds) runs over
:class:`~trainfit.script.probe.ScriptProbe`; the process then ends without training.
:func:`tune_script` (in trainfit's process) starts it and reads the result back.

Knobs probed on a script: the micro-batch (the accumulation keeping the effective batch),
checkpointing, attention, the optimizer implementation, the loader's workers and prefetch;
precision only where it is an autocast flag (full fine-tuning of float32 weights) — elsewhere it is
the dtype the script loads its weights in, which a probe cannot change on a loaded model.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from trainfit.job import JobError, JobSpec
from trainfit.job.fields import SCRIPT_KNOBS
from trainfit.model.runtime import parse_device
from trainfit.model.source import source_of
from trainfit.script.diff import KeywordChange, keyword_diff
from trainfit.script.launch import run_script
from trainfit.script.mapping import ReadJob, map_record, script_as_read, with_flags
from trainfit.tune.result import SearchNote
from trainfit.tune.tuner import (
    Bench,
    TuneOptions,
    TuneResult,
    device_side,
    fit_threads,
    run_search,
)


@dataclass
class _Shapes:
    """What tune's CPU predictor reads of the data: the planned length, and whether batches carry
    an attention mask."""

    seq_len: int
    padded: bool


@dataclass
class ScriptTune:
    command: list[str]
    record: dict[str, Any]
    read: ReadJob
    current: JobSpec
    result: TuneResult
    changes: list[KeywordChange]
    check: Any = None
    notes: list[Any] = dataclasses.field(default_factory=list)
    given: frozenset[str] = frozenset()
    """The fields the command line set (credited to it in the read table)."""


def _options(job: JobSpec, rec: dict[str, Any], o: dict[str, Any]) -> TuneOptions:
    full_fp32 = job.method == "full" and rec["model"]["trainable_dtype"] == "float32"
    allowed = SCRIPT_KNOBS + (("precision",) if full_fp32 else ())
    own = rec.get("optimizer")
    if (own is not None and not own.get("kernels", True)) or (
            own is None and rec["args"].get("optim") == "sgd"):
        # the script's own optimizer takes no other kernel (no fused=/foreach= keywords, or a
        # tensor lr foreach refuses): nothing to try, nor a change to say (a review: the probe
        # had measured a substitute, and the change raised in the script); nor does HF's
        # optim="sgd", which passes SGD no kernel (torch's default, foreach on a GPU, runs): a
        # fused candidate was built as optim="sgd" and measured the foreach step
        allowed = tuple(k for k in allowed if k != "optimizer_impl")
    knobs = tuple(k for k in o.get("knobs", SCRIPT_KNOBS) if k in allowed)
    return TuneOptions(device=o.get("device", "cpu"), memory_limit_bytes=o.get("memory_limit_bytes"),
                       margin=o.get("margin", 0.1), budget_s=o.get("budget_s"),
                       max_host_ram_bytes=o.get("max_host_ram_bytes"), knobs=knobs,
                       fixed=frozenset(o.get("fixed", ())), run_steps=o.get("run_steps"))


def tune_trainer(trainer: Any, rec: dict[str, Any], o: dict[str, Any]) -> dict[str, Any]:
    """Inside the user's process: the search over probes of ``trainer``; JSON for the parent."""
    from trainfit.script.probe import ScriptProbe  # torch-heavy: only where the probes run
    from trainfit.script.transport import tune_result_json

    t0 = time.perf_counter()
    flags = o.get("flags", {})
    read = map_record(rec, frozenset(flags), sharding_flag=flags.get("sharding"))
    job = JobSpec.from_dict(with_flags(read.fields, flags), source="the script")
    as_read = script_as_read(rec, read.fields, flags, read=read) or job
    engine = rec["args"].get("sharding")
    if engine is not None and (job.sharding != "none" or job.offload != "none"):
        # the probes step the trainer's model in this one process, never through the engine:
        # a sharded or offloaded step's memory would be measured as an unsharded one
        what = "DeepSpeed ZeRO" if engine["engine"] == "deepspeed" else "FSDP"
        raise JobError(f"the script runs {what} ({engine['where']}): tune -- CMD probes the "
                       "model in one process, unsharded",
                       "plan it (trainfit plan -- CMD: each rank's sharded step), or tune the "
                       "script without fsdp / deepspeed on one GPU")
    device = parse_device(o.get("device", "cpu"))
    on = rec["model"]["device"]
    if on != device.type:
        raise JobError(f"the script's model is on {on}, tune was asked for --device {device}",
                       f"run tune with --device {on}, or let the script place the model there")
    if job.method == "qlora" and device.type != "cuda":
        raise JobError("the script's model is 4-bit (QLoRA): bitsandbytes' 4-bit layers are "
                       "probed on CUDA only", "run tune --device cuda:0 on the GPU, or plan it")
    if job.effective_batch is None:
        raise JobError("the script's effective batch is unknown",
                       "set per_device_train_batch_size and gradient_accumulation_steps in its "
                       "TrainingArguments, or pass --effective-batch")
    opts = _options(job, rec, o)
    base = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    source = source_of(job.model, copy.deepcopy(base.config), rec["model"]["task"], "script")
    shapes = _Shapes(seq_len=read.lengths.longest, padded=read.lengths.padded)
    capacity, name, predict = device_side(source, shapes, device, opts)  # type: ignore[arg-type]
    lengths = rec["lengths"]["sample_lengths"]
    prober = ScriptProbe(trainer, source, lengths, device, memory_limit_bytes=opts.memory_limit_bytes,
                         max_host_ram_bytes=opts.max_host_ram_bytes, seed=job.seed)
    bench = Bench(source=source, device=device, capacity=capacity, device_name=name,
                  predict=predict, probe=lambda j, timed: prober.run(j, timed_steps=timed),
                  agree=prober.dist.any, samples=rec["lengths"]["dataset_samples"] or len(lengths),
                  tokens=sum(lengths))
    # the search starts free of the script's checkpointing (unless the command line fixed it);
    # the script's configuration is measured as the baseline
    start = job if "grad_ckpt" in flags else job.replace(grad_ckpt="off")
    # torch's pool fitted to the cores other processes leave, as a job file's tune does (an
    # audit: beside a busy neighbour the script's probes lay 45× apart, "noise 1690 %")
    busy = fit_threads(device, job.ranks)
    try:
        result = run_search(start, opts, bench, t0, current=job, step_source="script")
    finally:
        prober.restore_trainer()
    predicted_as_measured([*result.trials, *(t for t in (result.pick, result.baseline,
                                                         result.unconfirmed) if t is not None)])
    if busy is not None:
        result.notes.append(busy)
    if "precision" in o.get("knobs", ()) and "precision" not in opts.knobs:
        # asked for, and not probed: said (an audit: dropped without a word)
        result.notes.append(SearchNote("script_precision", {
            "method": job.method, "dtype": weights_dtype(rec["model"], job.method)}))
    # said from what the script runs (a flag that set a knob is a change to make in it too)
    changes = keyword_diff(rec, as_read, result.pick.job) if result.pick is not None else []
    return {"result": tune_result_json(result), "job": job.to_dict(),
            "changes": [dataclasses.asdict(c) for c in changes], "knobs": list(opts.knobs)}


def weights_dtype(model: dict[str, Any], method: str) -> str:
    """The dtype the script's weights load in: a LoRA's frozen base, not its adapters (an audit:
    "load in float32" of a bfloat16 base whose adapters peft keeps in float32)."""
    frozen = model.get("frozen_dtype")
    return str(frozen if method != "full" and frozen else model["trainable_dtype"])


def tune_script(cmd: list[str], *, options: dict[str, Any], flags: dict[str, Any] | None = None,
                trust_remote_code: bool = False, timeout_s: float | None = 1800.0) -> ScriptTune:
    """In trainfit's process: run the script with the hooks in tune mode, read the result."""
    from trainfit.script.transport import tune_result_from_json

    flags = dict(flags or {})
    rec = run_script(cmd, mode="tune", trust_remote_code=trust_remote_code, timeout_s=timeout_s,
                     options={"tune": {**options, "flags": flags}})
    t = rec.pop("tune")
    read = map_record(rec, frozenset(flags), sharding_flag=flags.get("sharding"))
    return ScriptTune(command=cmd, record=rec, read=read, current=JobSpec.from_dict(t["job"]),
                      result=tune_result_from_json(t["result"]),
                      changes=[KeywordChange(**c) for c in t["changes"]], given=frozenset(flags))


def predicted_as_measured(trials: list[Any]) -> None:
    """A script's probes count its batches' non-padding tokens (the same samples in every
    probe's timed steps), the predictor positions at the longest sample: each predicted tokens/s
    becomes the measured tokens per step over the predicted step time, so the two columns count
    the same tokens (an audit: 1,933 measured beside 2,048 predicted per step, unsaid). The
    factor is the same for every probe: the search's predicted ratios are unchanged."""
    import statistics

    per_step = [t.result.measured.tokens_per_s * t.result.measured.step_time_s for t in trials
                if t.result.measured is not None and t.result.measured.tokens_per_s
                and t.result.measured.step_time_s]
    if not per_step:
        return
    tokens = statistics.median(per_step)
    for t in trials:
        p = t.predicted
        if p is not None and p.step_time_s:
            # a new object: the predictor caches one Predicted per configuration
            t.predicted = dataclasses.replace(p, tokens_per_s=tokens / p.step_time_s)
