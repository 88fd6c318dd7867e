"""Read and validate the inputs of ``trainfit report`` into typed dataclasses.

Each file is recognised by its ``kind`` (docs/json-formats.md); ``plan`` files written before ``kind``
existed are recognised by ``configs`` + ``gpu``; ``.jsonl`` / ``.csv`` files are monitor logs.  Every
error names the file and the field (``configs[3].breakdown.parameters``) so the user can fix it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainfit.job.tuned_file import UNDECIDED_NOTE_KINDS
from trainfit.report.inputs import (
    DoctorInput,
    EvalPoint,
    Finding,
    Inputs,
    LadderStep,
    Measured,
    OomEvent,
    PlanConfig,
    PlanInput,
    Predicted,
    Probe,
    SegmentRow,
    TrainInput,
    TuneBaseline,
    TuneInput,
    TunePick,
    UndecidedChange,
)
from trainfit.report.json_fields import JsonObj, ReportInputError, short_repr
from trainfit.report.monitor_log import load_monitor, read_text

KINDS_HINT = ("report reads the JSON of plan --json, tune --json, train (train.json), doctor --json, "
              "and monitor logs (.jsonl / .csv)")

MEASURED_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "host_rss_bytes",
                 "step_time_s", "step_time_spread_s", "tokens_per_s", "samples_per_s",
                 "data_wait_fraction")
PREDICTED_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "step_time_s",
                  "tokens_per_s")
SPLIT_KEYS = ("data_wait_s", "h2d_copy_s", "forward_s", "backward_s", "optimizer_s", "sync_s",
              "logging_io_s", "idle_s", "other_s", "step_time_s")
BEFORE_KEYS = ("step_time_s", "tokens_per_s", "data_wait_fraction", "gpu_util_percent")


# --- JSON documents -------------------------------------------------------------------------------

def _job_fields(o: JsonObj, exclude: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in o.data.items() if k not in exclude}


def _plan_config(o: JsonObj, index: int) -> PlanConfig:
    breakdown_obj = o.obj("breakdown", nullable=True)
    breakdown: dict[str, int] = {}
    if breakdown_obj is not None:
        for k in breakdown_obj.data:
            breakdown[k] = breakdown_obj.int_(k, nullable=False)
    result_keys = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "breakdown",
                   "peak_phase", "fits", "headroom_bytes", "how", "largest_fitting", "recommended",
                   "rank", "step_time_s", "tokens_per_s", "samples_per_s", "mfu", "hfu",
                   "device_busy_fraction", "bound", "model_notes", "speed_unknown_reason")
    for key in ("micro_batch", "grad_accum"):  # a 0 failed in the log-scaled figure (an audit)
        if isinstance(o.data.get(key), int) and o.data[key] < 1:
            raise o.fail(key, f"expected an integer ≥ 1, got {o.data[key]}")
    return PlanConfig(
        index=index, job=_job_fields(o, result_keys),
        micro_batch=o.int_("micro_batch", nullable=False),
        grad_accum=o.int_("grad_accum", nullable=False),
        peak_allocated_bytes=o.int_("peak_allocated_bytes"),
        peak_reserved_bytes=o.int_("peak_reserved_bytes"),
        peak_device_bytes=o.int_("peak_device_bytes"),
        breakdown=breakdown, fits=o.bool_("fits"),
        step_time_s=o.num("step_time_s", required=False),
        tokens_per_s=o.num("tokens_per_s", required=False),
        mfu=o.num("mfu", required=False), rank=o.int_("rank", required=False),
        recommended=bool(o.bool_("recommended", required=False)),
        how=o.str_("how", required=False),
        speed_unknown_reason=o.str_("speed_unknown_reason", required=False) or None)


def _plan(o: JsonObj, path: str) -> PlanInput:
    configs = [_plan_config(c, i) for i, c in enumerate(o.objs("configs"))]
    if not configs:
        raise o.fail("configs", "empty: the plan has no configuration")
    rec = o.int_("recommended_index", required=False)
    if rec is not None and not 0 <= rec < len(configs):
        raise o.fail("recommended_index", f"{rec} is not an index of configs (0..{len(configs) - 1})")
    margin = o.num("margin", required=False)
    ladder = [LadderStep(change=s.str_("change", nullable=False),
                         peak_device_bytes=s.int_("peak_device_bytes"),
                         tokens_per_s=s.num("tokens_per_s"), fits=s.bool_("fits"),
                         alters_learning=s.bool_("alters_learning"))
              for s in o.objs("ladder", required=False)]
    notes_raw = o.list_("notes", required=False)
    return PlanInput(path=path, model=o.str_("model", required=False) or "unknown",
                     gpu=o.str_("gpu"), gpu_memory_bytes=o.int_("gpu_memory_bytes", required=False),
                     margin=margin, recommended_index=rec,
                     reason=o.str_("reason", required=False),
                     notes=[str(n) for n in notes_raw], configs=configs, ladder=ladder)


def _measured(o: JsonObj | None) -> Measured | None:
    if o is None:
        return None
    return Measured(**{k: o.num(k, required=False) for k in MEASURED_KEYS})


def _predicted(o: JsonObj | None) -> Predicted | None:
    if o is None:
        return None
    return Predicted(**{k: o.num(k, required=False) for k in PREDICTED_KEYS})


_PROBE_RESULT_KEYS = ("index", "stage", "num_workers", "pin_memory", "compile", "status", "measured",
                      "predicted", "probe_time_s")


def _tune(o: JsonObj, path: str) -> TuneInput:
    p = o.obj("pick", nullable=True)
    pick = None
    if p is not None:
        pick = TunePick(job=_job_fields(p, _PROBE_RESULT_KEYS),
                        micro_batch=p.int_("micro_batch", nullable=False),
                        grad_accum=p.int_("grad_accum", nullable=False),
                        num_workers=p.int_("num_workers", required=False),
                        pin_memory=p.bool_("pin_memory", required=False),
                        compile=p.bool_("compile", required=False),
                        measured=_measured(p.obj("measured", nullable=True)),
                        predicted=_predicted(p.obj("predicted", required=False, nullable=True)))
    probes = []
    for i, q in enumerate(o.objs("probes")):
        status = q.str_("status", nullable=False)
        if status not in ("ok", "oom", "over-host-ram", "skipped"):
            raise q.fail("status", f"expected ok | oom | over-host-ram | skipped, got {status!r}")
        idx = q.int_("index", required=False)
        probes.append(Probe(
            index=i if idx is None else idx,
            stage=q.str_("stage", required=False), job=_job_fields(q, _PROBE_RESULT_KEYS),
            micro_batch=q.int_("micro_batch", nullable=False),
            grad_accum=q.int_("grad_accum", nullable=False),
            num_workers=q.int_("num_workers", required=False),
            compile=q.bool_("compile", required=False), status=status,
            pin_memory=q.bool_("pin_memory", required=False),
            measured=_measured(q.obj("measured", required=False, nullable=True)),
            predicted=_predicted(q.obj("predicted", required=False, nullable=True)),
            probe_time_s=q.num("probe_time_s", required=False)))
    b = o.obj("baseline", required=False, nullable=True)
    baseline = None
    if b is not None:
        baseline = TuneBaseline(micro_batch=b.int_("micro_batch", nullable=False),
                                grad_accum=b.int_("grad_accum", nullable=False),
                                measured=_measured(b.obj("measured", nullable=True)))
    return TuneInput(
        path=path, device=o.str_("device", required=False) or "unknown",
        device_name=o.str_("device_name", required=False),
        memory_limit_bytes=o.int_("memory_limit_bytes", required=False),
        margin=o.num("margin", required=False), search_time_s=o.num("search_time_s", required=False),
        dataset_samples=o.int_("dataset_samples", required=False),
        dataset_tokens=o.int_("dataset_tokens", required=False),
        pick=pick, probes=probes, baseline=baseline, notes=o.strs("notes", required=False),
        step_source="script" if o.data.get("step_source") == "script" else "job",
        undecided=[_undecided(n) for n in o.objs("search_notes", required=False)
                   if n.data.get("kind") in UNDECIDED_NOTE_KINDS] + _unconfirmed(o))


def _unconfirmed(o: JsonObj) -> list[UndecidedChange]:
    """The search's best that the rounds against the current configuration did not confirm
    (``unconfirmed``: tune kept the current one): its row is marked as the notes' are — an audit
    read its probes' median as a measured 1.80× speed-up, where its rounds said 0.58×."""
    u = o.obj("unconfirmed", required=False, nullable=True)
    return [] if u is None else [UndecidedChange(probe=u.int_("index"), changes={})]


def _undecided(n: JsonObj) -> UndecidedChange:
    """A search note of a change tune could not decide: its ``changes`` (``[field, value]``
    pairs) checked, so an edited file is refused by name, not with a traceback (a review)."""
    changes: dict[str, Any] = {}
    for i, c in enumerate(n.list_("changes")):
        if not (isinstance(c, list) and len(c) == 2 and isinstance(c[0], str)):
            raise n.fail(f"changes[{i}]", f"expected a [field, value] pair, got {short_repr(c)}")
        changes[c[0]] = c[1]
    return UndecidedChange(probe=n.int_("probe", required=False), changes=changes)


def _oom_event(e: JsonObj) -> OomEvent:
    """An OOM event of train.json: its batch keys are named for its phase (run/oom.py's
    ``to_dict``: ``micro_batch_*`` in a training step, ``eval_batch_*`` in an evaluation — a
    review: every train.json with an evaluation OOM was refused for a missing micro_batch_before)."""
    phase = e.str_("phase", required=False)
    name = "eval_batch" if phase == "eval" else "micro_batch"
    return OomEvent(step=e.int_("step"), phase=phase,
                    micro_batch_before=e.int_(f"{name}_before"),
                    micro_batch_after=e.int_(f"{name}_after"),
                    grad_accum_after=e.int_("grad_accum_after", required=False))


def _train(o: JsonObj, path: str) -> TrainInput:
    job = o.obj("job")
    assert job is not None
    events = [_oom_event(e) for e in o.objs("oom_events", required=False)]
    ends = [(s.int_("end_step"), s.int_("micro_batch"), s.int_("grad_accum", required=False))
            for s in o.objs("segments", required=False)
            if "micro_batch" in s.data and s.data.get("end_step") is not None]
    losses = o.list_("losses", required=False)
    for i, v in enumerate(losses):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise o.fail(f"losses[{i}]", f"expected a number or null, got {short_repr(v)}")
    # train writes a non-finite evaluation as it is (NaN without label tokens, an overflowing
    # perplexity as Infinity): not finite, read as None (a review: the report refused the file)
    evals = [EvalPoint(step=e.int_("step", nullable=False), eval_loss=_finite(e, "eval_loss"),
                       eval_perplexity=_finite(e, "eval_perplexity"))
             for e in o.objs("evals", required=False)]
    # a record written before a field existed has none: the segment by its place, from step 0
    rows = [SegmentRow(segment=s.int_("segment", required=False) or i + 1,
                       start_step=s.int_("start_step", required=False) or 0,
                       end_step=s.int_("end_step", required=False),
                       stopped=s.str_("stopped", required=False),
                       resumed_from=s.str_("resumed_from", required=False))
            for i, s in enumerate(o.objs("segments", required=False))]
    # a segment resumed from a checkpoint without history (an older trainfit) stands for steps
    # whose wall time and losses were not recorded (wall_time_s null): the record's wall time
    # covers only the later segments while its tokens count every step — tokens ÷ wall time
    # read 1.6× the real rate (a review); the total is unknown, the losses not recorded
    blind = [s for s in o.objs("segments", required=False)
             if "wall_time_s" in s.data and s.data["wall_time_s"] is None]
    unrecorded = sum((s.int_("end_step", required=False) or 0)
                     - (s.int_("start_step", required=False) or 0) for s in blind)
    steps = o.int_("steps")
    # train writes one loss per step (null where none was recorded: run/record.continue_from)
    # and the last as final_loss: a record that disagrees was cut or edited (an audit: "final
    # loss 7.58" and "→ 8.37 at step 5" of 20 on one page)
    if "losses" in o.data and len(losses) != steps:
        raise o.fail("losses", f"{len(losses)} values for {steps} steps")
    finite = [v for v in losses if v is not None and math.isfinite(v)]
    final = o.num("final_loss", required=False)
    if finite and final is not None and not math.isclose(final, finite[-1], rel_tol=1e-6):
        raise o.fail("final_loss", f"{final:g} is not the last step's loss ({finite[-1]:g})")
    # the error that ended a failed run, in its notes (an audit: an OOM at micro-batch 1 read
    # "OOM events: none" beside "ended: failed")
    failure = next((n.removeprefix("failed: ") for n in reversed(o.strs("notes", required=False))
                    if n.startswith("failed: ")), None)
    return TrainInput(
        failure=failure,
        losses=[None if v is None or not math.isfinite(v) else float(v) for v in losses],
        evals=evals, segment_rows=rows, unrecorded_steps=unrecorded,
        path=path, job=dict(job.data), steps=steps,
        samples_seen=o.int_("samples_seen", required=False),
        tokens_seen=o.int_("tokens_seen", required=False),
        wall_time_s=None if blind else o.num("wall_time_s"), final_loss=final,
        oom_events=events, checkpoints=o.strs("checkpoints", required=False),
        resumed_from=o.str_("resumed_from", required=False),
        monitor_log=o.str_("monitor_log", required=False), segment_ends=ends,
        stopped=o.str_("stopped", required=False), signal=o.str_("signal", required=False),
        segments=len(o.objs("segments", required=False)) or 1)


def _finite(o: JsonObj, key: str) -> float | None:
    """A number field that may be null, NaN or ±Infinity in the file: None unless finite."""
    v = o.data.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        if v is not None:
            raise o.fail(key, f"expected a number or null, got {short_repr(v)}")
        return None
    return float(v) if math.isfinite(v) else None


def _doctor(o: JsonObj, path: str) -> DoctorInput:
    findings = []
    for f in o.objs("findings", required=False):
        ev = f.obj("evidence", required=False, nullable=True)
        evidence = {} if ev is None else {k: ev.num(k) for k in ev.data}
        findings.append(Finding(bottleneck=f.str_("bottleneck", nullable=False), evidence=evidence,
                                fix=f.str_("fix", required=False) or "",
                                # "predicted_gain_fraction": its name in files written
                                # before 2026-12-05 (it held a measured gain too)
                                gain_fraction=f.num("gain_fraction", required=False)
                                if "gain_fraction" in f.data else
                                f.num("predicted_gain_fraction", required=False),
                                gain_measured=f.data.get("gain_measured") is True,
                                gain_upper_bound=f.data.get("gain_upper_bound") is True,
                                detail=f.str_("detail", required=False) or ""))
    after_obj = o.obj("after", required=False, nullable=True)
    gain = o.obj("gain", required=False, nullable=True)
    verdict = None if gain is None else gain.str_("verdict", required=False)
    ratios = [] if gain is None else [r for r in (gain.data.get("ratios") or [])
                                      if isinstance(r, int | float) and not isinstance(r, bool)]
    return DoctorInput(
        path=path, target=o.str_("target", required=False) or "unknown",
        steps_measured=o.int_("steps_measured", required=False),
        split=o.numbers("split", SPLIT_KEYS), findings=findings,
        before=o.numbers("before", BEFORE_KEYS),
        after=None if after_obj is None else {k: after_obj.num(k) for k in BEFORE_KEYS},
        applied=o.strs("applied", required=False),
        overhead_fraction=o.num("overhead_fraction", required=False),
        verdict=verdict, verdict_ratios=[float(r) for r in ratios],
        device=o.str_("device", required=False),
        verdict_noise=None if gain is None else gain.num("noise", required=False),
        parts_scale=o.obj("split").num("parts_scale", required=False),
        notes=o.strs("notes", required=False), round_bottlenecks=o.strs("round_bottlenecks",
                                                                        required=False),
        form="command" if o.data.get("form") == "command" else "job",
        command_runs=o.int_("command_runs", required=False))


# --- files ----------------------------------------------------------------------------------------

def detect_kind(data: dict[str, Any], shown: str) -> str:
    kind = data.get("kind")
    if kind is None:
        if "configs" in data and "gpu" in data:
            return "plan"  # plans written before `kind` existed
        raise ReportInputError(f"{shown}: kind: missing (and no configs + gpu, so not an older plan)",
                               KINDS_HINT)
    if kind not in ("plan", "tune", "train", "doctor", "plan-script", "tune-script"):
        raise ReportInputError(f"{shown}: kind: unknown kind {kind!r}", KINDS_HINT)
    return str(kind)


@dataclass
class _Collect:
    inputs: Inputs = field(default_factory=Inputs)
    seen_logs: set[Path] = field(default_factory=set)


def _add_monitor(c: _Collect, path: Path, shown: str, run: JsonObj | None = None) -> None:
    """A monitor log; ``run``: the train.json whose log it is, whose segments say where the run
    ran (device, --memory-limit), which the timeline's panels are labelled by."""
    key = path.resolve()
    if key not in c.seen_logs:
        c.seen_logs.add(key)
        log = load_monitor(path, shown, c.inputs.warnings)
        if run is not None:
            segs = run.objs("segments", required=False)
            limits = {s.int_("memory_limit_bytes", required=False) for s in segs}
            log = replace(log, run_devices=[d for s in segs
                                            if (d := s.str_("device", required=False))],
                          memory_limit_bytes=limits.pop() if len(limits) == 1 else None)
        c.inputs.monitors.append(log)


def load_inputs(paths: list[str]) -> Inputs:
    """Read every file; a train.json's ``monitor_log`` is read too when it exists next to it."""
    c = _Collect()
    seen: set[Path] = set()
    for p in paths:
        path = Path(p)
        if path.is_dir() and (path / "train.json").is_file():
            # train's run directory, as train names it ("run directory: run (train.json, …)"):
            # an audit had it refused as "a directory, not a file"
            path = path / "train.json"
            p = str(path)
        elif path.is_dir() and (path / "monitor.jsonl").is_file():
            # a run killed before its first checkpoint leaves its monitor log alone (an audit)
            c.inputs.warnings.append(f"{p}: no train.json (the run is still before its first "
                                     "checkpoint, or ended before it could record one): its "
                                     "monitor log alone is shown")
            path = path / "monitor.jsonl"
            p = str(path)
        # the same file or run named twice (run and run/train.json, a shell glob and its
        # directory) is one input: it was drawn twice, as run1 and run1-2 (an audit)
        where = path.resolve()
        if where in seen:
            c.inputs.warnings.append(f"{p}: given more than once: read once")
            continue
        seen.add(where)
        if path.suffix.lower() in (".jsonl", ".csv"):
            _add_monitor(c, path, p)
            continue
        text = read_text(path, p)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ReportInputError(f"{p}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})",
                                   "pass the file that the command wrote, unedited") from None
        except RecursionError:  # nested past Python's limit: no trainfit file is (an audit)
            raise ReportInputError(f"{p}: nested too deeply to be a trainfit result",
                                   "pass the file that the command wrote, unedited") from None
        if not isinstance(data, dict):
            raise ReportInputError(f"{p}: top level: expected a JSON object, got {short_repr(data)}",
                                   KINDS_HINT)
        kind = detect_kind(data, p)
        if kind in ("plan-script", "tune-script"):
            # `plan|tune -- CMD`: the plan or tune of the script's configuration inside
            kind, data = kind.removesuffix("-script"), data.get(kind.removesuffix("-script"))
            if not isinstance(data, dict):
                raise ReportInputError(f"{p}: {kind}: expected a JSON object", KINDS_HINT)
            data = {"kind": kind, **data}
        o = JsonObj(p, "", data)
        if kind == "plan":
            c.inputs.plans.append(_plan(o, p))
        elif kind == "tune":
            c.inputs.tunes.append(_tune(o, p))
        elif kind == "doctor":
            c.inputs.doctors.append(_doctor(o, p))
        else:
            train = _train(o, p)
            c.inputs.trains.append(train)
            if train.monitor_log:
                log = Path(train.monitor_log)
                log = log if log.is_absolute() else path.parent / log
                if log.is_file():
                    _add_monitor(c, log, str(log), o)
                else:
                    c.inputs.warnings.append(
                        f"{p}: monitor_log: {log} not found; no timelines from it "
                        "(pass the log as an input)")
    return c.inputs
