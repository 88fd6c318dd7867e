"""``trainfit doctor -- CMD``: someone else's training command run under the doctor's hooks for a
window of steps, its step split and findings (the fixes printed: the script is the user's)."""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable

import psutil

from trainfit.doctor.findings import find
from trainfit.doctor.inject import DoctorError, ForeignRun, check_steps, run_foreign
from trainfit.doctor.measure import op_overhead_s, sampler_fraction
from trainfit.doctor.observation import Observation
from trainfit.doctor.peaks import bounded_mfu, cpu_bf16_fast, cpu_peak_flops
from trainfit.doctor.result import DoctorResult, Metrics
from trainfit.doctor.split import (
    Split,
    device_idle_s,
    input_fraction,
    median_counter,
    median_split,
)
from trainfit.doctor.verdict import held_across_rounds
from trainfit.doctor.watch import busy_note

MIN_HALF_STEPS = 2
"""Steps in each half of a measured window judged apart (:func:`_halves`); a window of fewer
than twice as many is one round."""

FUSABLE = ("Adam", "AdamW", "SGD", "Adagrad")
"""torch.optim classes with a ``fused=True`` implementation: another optimizer's "unfused" has no
fused one to suggest (a bitsandbytes 8-bit AdamW is its own kernel)."""


def foreign_observation(run: ForeignRun, op_s: float) -> tuple[Observation, Split]:
    s = run.summary
    prof = s.get("profile") or {}
    split = median_split(run.records, idle_s=device_idle_s(prof, run.records))
    recs = run.records
    tokens = median_counter(recs, "tokens") or None
    micro = median_counter(recs, "micro_steps") or None
    mfu = peak = None
    if tokens and s.get("params") and not s.get("cuda_used"):
        # 2·N forward and 2·N for the activations' gradients through every layer, 2·N more for
        # the weights' gradients of the trainable ones alone (6·N counted a LoRA's frozen base
        # as trained: an audit); the peak timed at the script's own thread count
        n, n_train = s["params"], s.get("trainable_params")
        flops = (4.0 * n + 2.0 * (n if n_train is None else n_train)) * tokens
        peak = cpu_peak_flops(threads=s.get("torch_threads"))
        mfu = bounded_mfu(flops / split.step_time_s, peak)
    params_cpu = (s["params_on_cpu"] / s["params"] if s.get("cuda_used") and s.get("params") else None)
    workers = median_counter(recs, "num_workers") if any("num_workers" in r.counters for r in recs) else None
    opt = s.get("optimizer") or {}
    obs = Observation(
        split=split, device="cuda" if s.get("cuda_used") else "cpu", trainfit_job=False,
        tokens_per_step=tokens, micro_steps_per_step=micro,
        sync_calls_per_step=median_counter(recs, "sync_calls"),
        model_sync_calls_per_step=median_counter(recs, "model_sync_calls"),
        log_calls_per_step=median_counter(recs, "log_calls"), ops_per_step=prof.get("ops_per_step"),
        op_overhead_s=op_s, matmul_time_fraction=prof.get("matmul_time_fraction"), mfu=mfu,
        peak_flops=peak,
        recompute_s=median_counter(recs, "recompute_s"),
        peak_memory_bytes=s.get("peak_allocated_bytes") or s.get("max_rss_bytes"),
        memory_capacity_bytes=s.get("device_total_bytes") or psutil.virtual_memory().total,
        params_on_cpu_fraction=params_cpu, num_workers=None if workers is None else int(workers),
        cpu_count=os.cpu_count() or 1,
        optimizer_fused=opt.get("fused") if opt.get("name") in FUSABLE else None,
        optimizer_name=opt.get("name"),
        computes_in=s.get("autocast_dtype") or s.get("weights_dtype"),
        bf16_fast=None if s.get("cuda_used") else cpu_bf16_fast(), host=run.host)
    return obs, split


def _command_overhead(run: ForeignRun) -> float | None:
    """The doctor's share of a foreign step: each hook call at the cost the child timed for its
    kind, + the sampler's CPU time."""
    calib = run.summary.get("calibration") or {}
    per_step_s = []
    for r in run.records:
        c = r.counters
        fw = c.get("forwards", 0.0)
        syncs = c.get("sync_calls", 0.0) + c.get("model_sync_calls", 0.0)
        # push/pop hooks (their calls include the timed syncs), module hooks, and every sync's
        # wrapper at its measured mean cost (sampling included)
        plain = max(r.hook_calls - fw - c.get("sync_timed", 0.0), 0.0)
        per_step_s.append((plain * calib.get("wrapper_call_s", 0.0) + fw * calib.get("module_call_s", 0.0)
                           + syncs * calib.get("sync_call_s", 0.0)) / r.step_time_s)
    return statistics.median(per_step_s) + sampler_fraction(run.host) if per_step_s else None


def doctor_command(cmd: list[str], *, steps: int = 10, warmup: int = 2, stop: bool = True,
                   timeout_s: float | None = 900.0, extra_env: dict[str, str] | None = None,
                   recheck_busy: bool = True, say: Callable[[str], None] | None = None
                   ) -> DoctorResult:
    """Run someone else's training command under the doctor for a window of steps;
    ``recheck_busy``: on a busy CPU host, run it a second time (its verdict must repeat);
    ``say``: progress lines (the CLI's stderr)."""
    check_steps(steps)
    run = run_foreign(cmd, steps=steps, warmup=warmup, stop=stop, timeout_s=timeout_s, extra_env=extra_env)
    op_s = op_overhead_s()
    obs, split = foreign_observation(run, op_s)
    notes = list(run.notes)
    halves = _halves(run, op_s)
    runs, what = 1, "halves of the measured window"
    if recheck_busy and stop and obs.device == "cpu" and run.host.busy:
        # a busy host's timings differ from one process to the next, which the halves of one
        # window cannot see (an audit: one loop named slow-optimizer, +124 %, in 5 of 7 runs,
        # compute-bound and bandwidth-bound in the others, each "held"): the command runs again
        # and each of its halves must name the same bottleneck
        busy = (f"the host being busy (other processes used {run.host.others_cores:.1f} of "
                f"{run.host.cpus} CPU cores, measured)")
        if say is not None:
            say(f"running it a second time, {busy}: its verdict must repeat in another process "
                "(--once: run it once) …")
        try:
            again = run_foreign(cmd, steps=steps, warmup=warmup, stop=stop, timeout_s=timeout_s,
                                extra_env=extra_env)
        except DoctorError as e:
            # the first run stands, unconfirmed: a script may refuse to run twice (a directory
            # it makes without exist_ok, left by the first run)
            notes.append(f"the command was run a second time, {busy}, to check that its verdict "
                         f"repeats in another process, and that run failed ({e.args[0]}): the "
                         "verdict is the first run's alone, not confirmed")
        else:
            halves = [*halves, *_halves(again, op_s)]
            runs, what = 2, "halves of the two runs' measured windows"
            notes.append(f"the command was run a second time, {busy}, to check that its "
                         "verdict repeats in another process (--once: run it once); the figures "
                         "are the first run's")
            notes += [f"the second run: {n}" for n in again.notes]
    findings = held_across_rounds(find(obs), halves, notes, what,
                                  "the first run's whole window" if runs > 1 else
                                  "the whole window's steps")
    overhead = _command_overhead(run)
    tokens = obs.tokens_per_step
    before = Metrics(step_time_s=split.step_time_s,
                     tokens_per_s=tokens / split.step_time_s if tokens else None,
                     data_wait_fraction=input_fraction(split),
                     gpu_util_percent=run.host.gpu_util_percent,
                     step_time_spread_s=split.step_time_spread_s)
    if obs.device == "cpu":
        busy = busy_note([run.host], run.summary.get("torch_threads"), "run")
        if busy:
            notes.append(busy)
    if run.stopped_by_doctor:
        notes.append(f"the command was stopped after the measured window ({warmup} warm-up + "
                     f"{len(run.records)} measured + 1 profiled steps)")
    if not obs.micro_steps_per_step:
        # the backward phase is timed at torch.autograd.backward: a step without it (autograd.grad,
        # a library's own backward) put its backward time under "other", unsaid (an audit)
        notes.append("no loss.backward() call was seen in the measured steps: the backward's "
                     "time, if any, is counted under 'other', and recomputation is not timed")
    if obs.model_sync_calls_per_step:
        notes.append(f"{obs.model_sync_calls_per_step:.0f} sync points per step inside the model's or the "
                     "optimizer's own code (measured count)")
    return DoctorResult(target=run.target, kind="command", device=obs.device, steps_measured=len(run.records),
                        split=split, findings=findings, before=before, after=None, applied=[],
                        overhead_fraction=overhead, notes=notes,
                        # the window's halves, as the job form lists each round's (an audit
                        # found [] beside a named bottleneck)
                        round_bottlenecks=halves, command_runs=runs)


def _halves(run: ForeignRun, op_s: float) -> list[str]:
    """What each half of the measured window names: a command runs one window, and its halves
    are the repeat the verdict must hold across (an audit: beside two busy loops a script's
    input-bound loop was named slow-optimizer, +68 %, from the one window); one entry, the
    whole window's, for a window too short to halve."""
    n = len(run.records)
    parts = [run.records[: n // 2], run.records[n // 2:]] if n >= 2 * MIN_HALF_STEPS \
        else [run.records]
    out = []
    for recs in parts:
        found = find(foreign_observation(dataclasses.replace(run, records=recs), op_s)[0])
        out.append(found[0].bottleneck if found else "none")
    return out
