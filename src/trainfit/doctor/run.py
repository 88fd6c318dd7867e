"""``doctor``: the pure functions behind ``trainfit doctor`` — measure, name, fix, measure again.

* :func:`doctor_job` — a trainfit job: measured in-process with the real ``train_step``; with
  ``apply`` the fixes are applied and the job measured again, before and after interleaved
  (B A B A …: CPU timing drifts by up to ~35 % between repeats, docs/notes/cpu-timing-noise.md).
  Its phases, in order: the job to examine (:func:`_job_to_examine`), the bench it is measured on
  (:class:`_Bench`), the first diagnosis with its micro-batch probe (:func:`_diagnose`), the fixes
  (:func:`_apply_fixes`), the interleaved rounds (:func:`_interleaved_rounds`) and the verdict on
  the pooled 'before' rounds.
* :func:`doctor_command` — someone else's command: run under the hooks and the sampler for a
  bounded window of steps; fixes are printed, not applied.

Both return a :class:`~trainfit.doctor.result.DoctorResult` whose ``to_dict()`` is the
``kind: "doctor"`` JSON of docs/json-formats.md. Rendering lives in :mod:`trainfit.render.doctor`.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from trainfit.doctor.findings import find
from trainfit.doctor.fixes import WorkerTrial, choose_workers
from trainfit.doctor.inject import DoctorError, check_steps
from trainfit.doctor.job_file import read_doctor_file
from trainfit.doctor.measure import JobRunner, Round, op_overhead_s, sampler_fraction
from trainfit.doctor.observation import Finding, Observation
from trainfit.doctor.peaks import bounded_mfu, cpu_bf16_fast, cpu_peak_flops, gpu_peak_flops
from trainfit.doctor.result import DoctorResult, Metrics
from trainfit.doctor.split import (
    calibrate_hook_cost_s,
    input_fraction,
    median_counter,
    median_split,
)
from trainfit.doctor.verdict import contradicted, gain_of, held_across_rounds
from trainfit.doctor.watch import busy_note
from trainfit.job import JobSpec, dividing_micro_batches
from trainfit.job.files import file_memory_limit
from trainfit.model.experts import inactive_expert_params
from trainfit.model.runtime import parse_device
from trainfit.model.source import resolve_model
from trainfit.model.towers import tower_params
from trainfit.model.workload import matmul_params
from trainfit.speed.compare import ROUNDS
from trainfit.speed.host_timing import busy_host_note, threads_for_load
from trainfit.speed.predict import model_flops_per_token

MIN_ROUNDS = 2
"""Interleaved before/after rounds run before the rounds may stop early (:func:`_interleaved_rounds`):
the first 'before' ran ahead of the diagnosis, not back to back with its 'after'."""


_JOB_LIMIT = "memory_limit: in the job file"
"""How doctor takes a CPU memory limit (an audit: its hint named tune's --memory-limit flag,
which doctor does not have)."""


def _names(findings: list[Finding]) -> list[str]:
    return [f.bottleneck for f in findings]


# --- trainfit jobs ---------------------------------------------------------------------------

def _largest_micro(job: JobSpec, limit: int) -> int:
    """The largest micro-batch ≤ ``limit`` × the current one that divides the per-rank batch."""
    per_rank = (job.effective_batch or job.micro_batch or 1) // job.ranks
    mb = job.micro_batch or 1
    return max((m for m in dividing_micro_batches(per_rank, mb * limit) if m >= mb), default=mb)


def _memory_peak(r: Round) -> int | None:
    """The measured peak that the capacity (the GPU's memory, or the host's RAM on the CPU) is
    compared with: on a GPU its reserved peak over the round — the host process's RSS there says
    nothing of the card, and read against the card's capacity it called a nearly full GPU's
    checkpointing needless."""
    return r.device_peak_reserved_bytes if r.device_peak_reserved_bytes is not None \
        else r.host.peak_rss_bytes


def _observation(r: Round, runner: JobRunner | None, op_s: float, *, lazy: bool,
                 probe: tuple[int, float] | None, recompute_s: float = 0.0,
                 capacity: int | None = None, live_peak: int | None = None) -> Observation:
    """``live_peak``: the job's live tensor bytes (measured), the peak a CPU memory limit is read
    against in place of the process's RSS."""
    job = r.job
    prof = r.profile or {}
    mfu = peak = None
    if runner is not None and r.split.step_time_s > 0:
        wl = runner.workload(job)
        per_token = model_flops_per_token(runner.source.config, sum(p.numel() for p in wl.model.parameters()),
                                          sum(p.numel() for p in wl.model.parameters() if p.requires_grad),
                                          job.seq_len, job.method == "full",
                                          inactive_params=inactive_expert_params(
                                              wl.model, runner.source.config)
                                          + tower_params(wl.model),
                                          matmul_params=matmul_params(wl.model))
        dt = torch.bfloat16 if (job.precision or "fp32") in ("amp-bf16", "bf16-true") else torch.float32
        peak = (cpu_peak_flops(dt) if runner.device.type == "cpu"
                else gpu_peak_flops("bf16" if dt == torch.bfloat16 else "fp16"
                                    if job.precision == "amp-fp16" else "fp32"))
        mfu = bounded_mfu(per_token * r.positions_per_step / r.split.step_time_s, peak)
    pad = 1 - r.tokens_per_step / r.positions_per_step if r.positions_per_step else None
    return Observation(
        split=r.split, device="cuda" if runner is not None and runner.device.type == "cuda" else "cpu",
        trainfit_job=True, tokens_per_step=r.tokens_per_step,
        micro_steps_per_step=float(job.grad_accum or 1), ops_per_step=prof.get("ops_per_step"),
        op_overhead_s=op_s, matmul_time_fraction=prof.get("matmul_time_fraction"), mfu=mfu,
        peak_flops=peak, recompute_s=recompute_s, peak_memory_bytes=live_peak if live_peak is not None
        else _memory_peak(r),
        memory_capacity_bytes=capacity, num_workers=job.num_workers, cpu_count=os.cpu_count() or 1,
        lazy_tokenization=lazy, micro_batch=job.micro_batch,
        max_micro_batch=probe[0] if probe else _largest_micro(job, 16),
        measured_micro_batch_gain=probe, padding_fraction=pad, optimizer_fused=job.optimizer_impl == "fused"
        if job.optimizer in ("adamw", "sgd") else None,
        computes_in={"amp-bf16": "bfloat16", "bf16-true": "bfloat16", "amp-fp16": "float16"}
        .get(job.precision or "fp32", "float32"),
        bf16_fast=cpu_bf16_fast() if runner is None or runner.device.type == "cpu" else None,
        host=r.host)


def _metrics(rounds: list[Round]) -> Metrics:
    steps = [r.split.step_time_s for r in rounds]
    tps = [r.tokens_per_s for r in rounds]
    gpu = [r.host.gpu_util_percent for r in rounds if r.host.gpu_util_percent is not None]
    # tokens/s from the same median step time the row beside it states: the median of the rounds'
    # rates is not the rate of the median time (two rounds: the mean of 1/t), and a QA run read
    # step time 0.52× beside tokens/s 5.89× for the same 1,024-token steps
    step_s = statistics.median(steps)
    per_step = statistics.median(r.tokens_per_step for r in rounds)
    return Metrics(step_time_s=step_s, tokens_per_s=per_step / step_s if step_s > 0 else 0.0,
                   data_wait_fraction=input_fraction(median_split(
                       [rec for r in rounds for rec in r.records])),
                   gpu_util_percent=statistics.median(gpu) if gpu else None,
                   step_time_spread_s=max(steps) - min(steps), tokens_per_s_spread=max(tps) - min(tps),
                   rounds=len(rounds))


def _job_to_examine(path: str | Path | None, job: JobSpec | None, tokenize: str,
                    memory_limit_bytes: int | None, steps: int, allow_code: bool = False,
                    trust_remote_code: bool = False) -> tuple[str, JobSpec, str, int | None]:
    """(target, job, tokenize, memory limit): the job from its file where one is given (its
    ``doctor:`` options and ``memory_limit`` apply), checked to be measurable."""
    target = str(path) if path is not None else "job"
    if path is not None:
        job, opts, extra = read_doctor_file(path, allow_code=allow_code,
                                            trust_remote_code=trust_remote_code)
        tokenize = opts.get("tokenize", tokenize)
        if memory_limit_bytes is None:
            # a size as train and tune read it (2GiB, or bytes): a string was ignored (an audit)
            memory_limit_bytes = file_memory_limit(extra)
    assert job is not None
    check_steps(steps)
    if not job.data:
        raise DoctorError("the job has no data: doctor measures the real loader",
                          "add data: path/to/rows.jsonl to the job file")
    if job.micro_batch is None:
        job = job.replace(micro_batch=1)
    return target, job, tokenize, memory_limit_bytes


@dataclass(kw_only=True)
class _Bench:
    """What stays fixed through one doctor run of a job: the job as given (every 'before' round
    measures it), the runner, the host's measured costs and how a round is taken."""

    job: JobSpec
    runner: JobRunner
    device: torch.device
    lazy: bool
    steps: int
    warmup: int
    op_s: float
    hook_cost_s: float
    capacity: int
    say: Callable[[str], None]
    cpu_limit: bool = False
    """A memory limit on the CPU: live tensor bytes (tune's and train's), not the process's RSS."""
    live: list[tuple[JobSpec, int]] = field(default_factory=list)

    def live_peak(self, job: JobSpec) -> int | None:
        """``job``'s live tensor bytes over one step (measured once per job) under a CPU memory
        limit; None otherwise (the round's own peak is read)."""
        if not self.cpu_limit:
            return None
        for j, b in self.live:
            if j == job:
                return b
        self.say(f"measuring the live tensor bytes of micro-batch {job.micro_batch} × "
                 f"{job.grad_accum}, ckpt {job.grad_ckpt} (what memory_limit caps) …")
        b = self.runner.live_peak_bytes(job, self.runner.data("eager", job))
        self.live.append((job, b))
        return b

    @classmethod
    def open(cls, job: JobSpec, device: str, *, lazy: bool, steps: int, warmup: int,
             memory_limit_bytes: int | None, say: Callable[[str], None]) -> _Bench:
        """The model and tokenizer loaded, the host's op and hook costs measured, the capacity."""
        dev = parse_device(device, _JOB_LIMIT)
        source = resolve_model(job.model, job.trust_remote_code)
        runner = JobRunner(job, source, dev, data_path=job.data, seed=job.seed)
        op_s = op_overhead_s()
        hook_cost_s = calibrate_hook_cost_s()
        capacity = memory_limit_bytes or (torch.cuda.get_device_properties(dev).total_memory
                                          if dev.type == "cuda" else psutil.virtual_memory().total)
        return cls(job=job, runner=runner, device=dev, lazy=lazy, steps=steps, warmup=warmup, op_s=op_s,
                   hook_cost_s=hook_cost_s, capacity=capacity, say=say,
                   cpu_limit=dev.type == "cpu" and memory_limit_bytes is not None)

    @property
    def before_mode(self) -> str:
        return "lazy" if self.lazy else "eager"

    def measure(self, j: JobSpec, mode: str, label: str, n: int | None = None, profile: bool = True) -> Round:
        n = self.steps if n is None else n
        self.say(f"measuring {label} ({mode} data, micro-batch {j.micro_batch} × {j.grad_accum}, "
                 f"{j.num_workers} workers) …")
        return self.runner.measure(j, self.runner.data(mode, j), steps=n, warmup=self.warmup,
                                   profile=profile, label=label)

    def observe_before(self, r: Round, probe: tuple[int, float] | None) -> Observation:
        """A 'before' round as the rules read it: the job's own loader and recomputation."""
        return _observation(r, self.runner, self.op_s, lazy=self.lazy, probe=probe,
                            recompute_s=r.split.forward_s if r.job.grad_ckpt == "full" else 0.0,
                            capacity=self.capacity,
                            live_peak=self.live_peak(r.job))

    def observe_after(self, r: Round) -> Observation:
        return _observation(r, self.runner, self.op_s, lazy=False, probe=None, capacity=self.capacity,
                            live_peak=self.live_peak(r.job))


def _probe_micro_batch(bench: _Bench, first: Round, notes: list[str]) -> tuple[int, float] | None:
    """(micro-batch, measured tokens/s gain): the largest micro-batch the effective batch allows
    (≤ 16×), then ≤ 4× if that runs out of memory. Fewer, larger ops per token is the whole fix
    for a launch-bound step, so it is measured rather than guessed."""
    job = bench.job
    for big in sorted({_largest_micro(job, 16), _largest_micro(job, 4)}, reverse=True):
        if big <= (job.micro_batch or 1):
            continue
        bigger = job.replace(micro_batch=big)
        need = bench.live_peak(bigger)
        if need is not None and need > bench.capacity:
            # measured before it is probed: the rounds run without the limit's tracker, so on
            # the CPU nothing raised, and micro-batch 16 was applied and called faster where
            # train under the same limit split it back to 2 (an audit)
            notes.append(f"micro-batch {big} not probed: one step holds {need / 2**30:.3f} GiB "
                         f"of live tensors (measured), over the memory_limit of "
                         f"{bench.capacity / 2**30:.3f} GiB")
            continue
        try:
            probe_round = bench.measure(bigger, bench.before_mode,
                                        f"probe micro-batch {big}", n=3, profile=False)
        except torch.OutOfMemoryError:
            notes.append(f"micro-batch {big} ran out of memory")
            continue
        return big, probe_round.tokens_per_s / first.tokens_per_s - 1
    return None


def _diagnose(bench: _Bench, first: Round, notes: list[str]) -> tuple[list[str], tuple[int, float] | None]:
    """The bottlenecks the first round shows, and the micro-batch probe when dispatch overhead may
    be one (named launch-bound, or ops × the cost of one > 15 % of the step)."""
    obs = bench.observe_before(first, None)
    names = _names(find(obs))
    own = bench.live_peak(bench.job)
    if own is not None and own > bench.capacity:
        # the rounds run without the limit's tracker: the job itself over it ran, unsaid (an
        # audit: memory_limit 1KiB); train under the same limit splits its micro-batch
        notes.append(f"the job itself holds {own / 2**30:.3f} GiB of live tensors in a step "
                     f"(measured), over its memory_limit of {bench.capacity / 2**30:.3f} GiB: "
                     "doctor measured it all the same; train would split its micro-batch "
                     "(halve it, double the accumulation) where it can, and stop at micro-batch "
                     "1")
    probe = None
    if "launch-bound" in names or (obs.ops_per_step or 0) * bench.op_s > 0.15 * first.split.step_time_s:
        probe = _probe_micro_batch(bench, first, notes)
        if probe is not None:
            names = _names(find(bench.observe_before(first, probe)))
    return names, probe


def _pretokenized(bench: _Bench) -> list[str]:
    """The lazy loader's fix: one pass into a memory-mapped token file (or the cached one)."""
    setup = bench.runner.data("memmap", bench.job)
    tf = setup.token_file
    assert tf is not None
    how = "reused from the cache" if tf.reused else f"built in {tf.build_time_s:.2f} s measured"
    applied = [f"pre-tokenized once into {tf.path.name} ({tf.samples} samples × "
               f"{tf.seq_len} tokens, memory-mapped; {how})"]
    if tf.packed:
        applied.append("packing: documents joined with EOS into full sequences (attention "
                       "crosses document boundaries inside a sequence: the trade-off)")
    return applied


def _fix_workers(bench: _Bench, after_job: JobSpec, after_mode: str, applied: list[str],
                 notes: list[str]) -> JobSpec:
    """The DataLoader worker count chosen by measuring a few steps at each, within half the
    available host RAM."""
    budget = int(psutil.virtual_memory().available * 0.5)
    cuda = bench.device.type == "cuda"

    def trial(n: int) -> WorkerTrial:
        j = after_job.replace(num_workers=n, persistent_workers=n > 0, pin_memory=cuda)
        r = bench.measure(j, after_mode, f"{n} workers", n=3, profile=False)
        return WorkerTrial(num_workers=n, step_time_s=r.split.step_time_s,
                           step_time_spread_s=r.split.step_time_spread_s,
                           data_wait_fraction=r.data_wait_fraction,
                           rss_bytes=r.host.peak_rss_bytes or 0)

    choice = choose_workers(trial, cuda=cuda, cpu_count=os.cpu_count() or 1, ram_budget_bytes=budget)
    fixed = after_job.replace(num_workers=choice.num_workers, persistent_workers=choice.persistent_workers,
                              pin_memory=choice.pin_memory, prefetch_factor=choice.prefetch_factor)
    was = bench.job.num_workers
    if choice.num_workers != was:
        applied.append(f"num_workers {was} → {choice.num_workers} (persistent, prefetch "
                       f"{choice.prefetch_factor}{', pinned' if choice.pin_memory else ''}): "
                       f"{choice.reason}")
    else:
        notes.append(f"workers chosen by measurement: {choice.reason}")
    return fixed


def _apply_fixes(bench: _Bench, names: list[str], probe: tuple[int, float] | None,
                 notes: list[str]) -> tuple[JobSpec, str, list[str]]:
    """(job after, its data mode, what was applied): the fix of each finding that has one a job
    can take — the input, a larger micro-batch the probe measured faster, a fused optimizer, no
    recomputation."""
    job = bench.job
    after_job, after_mode, applied = job, bench.before_mode, []
    if "input-bound" in names:
        task = bench.runner.source.task
        if bench.lazy and task == "causal-lm":
            after_mode = "memmap"
            applied += _pretokenized(bench)
        elif bench.lazy:
            # its token files are causal-LM rows: the loader's workers are the fix left (an
            # audit: measured 13 s, then refused the job it could have refused at the start)
            notes.append(f"pre-tokenizing is not applied: doctor writes causal-LM token files, "
                         f"and this is a {task} model; the data loader's workers are applied")
        after_job = _fix_workers(bench, after_job, after_mode, applied, notes)
    if probe is not None and probe[1] > 0.10:
        after_job = after_job.replace(micro_batch=probe[0])
        applied.append(f"micro_batch {job.micro_batch} → {after_job.micro_batch}, grad_accum "
                       f"{job.grad_accum} → {after_job.grad_accum} (effective batch "
                       f"{job.effective_batch} kept): measured {probe[1]:+.0%} tokens/s on a "
                       "3-step probe")
    if "slow-optimizer" in names:
        after_job = after_job.replace(optimizer_impl="fused")
        applied.append(f"optimizer_impl {job.optimizer_impl} → fused (one kernel per step)")
    if "needless-recompute" in names:
        off = after_job.replace(grad_ckpt="off")
        need = bench.live_peak(off)
        if need is not None and need > bench.capacity:
            # measured before it is applied: the rounds run without the limit's tracker
            notes.append(f"checkpointing kept: off, one step holds {need / 2**30:.3f} GiB of live "
                         f"tensors (measured), over the memory_limit of "
                         f"{bench.capacity / 2**30:.3f} GiB")
        else:
            after_job = off
            applied.append("grad_ckpt full → off (the measured peak leaves room for the activations"
                           + (f": {need / 2**30:.3f} GiB of live tensors without it, measured, "
                              f"within the memory_limit of {bench.capacity / 2**30:.3f} GiB)"
                              if need is not None else ")"))
    return after_job, after_mode, applied


def _interleaved_rounds(bench: _Bench, first: Round, after_job: JobSpec, after_mode: str,
                        repeats: int) -> tuple[list[Round], list[Round]]:
    """(befores, afters): after, before, after … so that the host's drift hits both alike; at
    most ``repeats`` rounds, fewer once a round contradicts the gain
    (:func:`~trainfit.doctor.verdict.contradicted`)."""
    befores, afters = [first], []
    for k in range(max(repeats, 1)):
        afters.append(bench.measure(after_job, after_mode, f"after #{k + 1}"))
        if k + 1 >= repeats or (k + 1 >= MIN_ROUNDS and contradicted(gain_of(befores, afters))):
            break
        befores.append(bench.measure(bench.job, bench.before_mode, f"before #{k + 2}"))
    return befores, afters


def _busy_note(bench: _Bench, rounds: list[Round]) -> str | None:
    """:func:`~trainfit.doctor.watch.busy_note` over the rounds of a CPU step."""
    if bench.device.type != "cpu":
        return None
    return busy_note([r.host for r in rounds], torch.get_num_threads(), "rounds")


def _pooled(bench: _Bench, befores: list[Round]) -> Round:
    """The 'before' rounds as one: their steps pooled, the first round's profile and host."""
    first = befores[0]
    records = [rec for r in befores for rec in r.records]
    split = median_split(records, idle_s=first.split.idle_s)
    return Round(label="before", job=bench.job, data_mode=bench.before_mode, records=records, split=split,
                 tokens_per_step=median_counter(records, "tokens"),
                 positions_per_step=median_counter(records, "positions"),
                 tokens_per_s=statistics.median(r.tokens_per_s for r in befores),
                 data_wait_fraction=input_fraction(split),
                 host=first.host, profile=first.profile,
                 hook_calls_per_step=statistics.median(r.hook_calls_per_step for r in befores),
                 device_peak_reserved_bytes=max(
                     (r.device_peak_reserved_bytes for r in befores
                      if r.device_peak_reserved_bytes is not None), default=None))


def doctor_job(path: str | Path | None = None, *, job: JobSpec | None = None, tokenize: str = "eager",
               steps: int = 6, warmup: int = 2, apply: bool = True, repeats: int = ROUNDS,
               device: str = "cpu", memory_limit_bytes: int | None = None, log: Any = None,
               allow_code: bool = False, trust_remote_code: bool = False) -> DoctorResult:
    """Measure a trainfit job, name its bottlenecks, apply the fixes and measure again."""
    target, job, tokenize, memory_limit_bytes = _job_to_examine(
        path, job, tokenize, memory_limit_bytes, steps, allow_code, trust_remote_code)
    # torch's pool fitted to the cores other processes leave, as train and tune fit theirs: at
    # 2 threads beside busy neighbours doctor timed 27.6 s a step and named slow matmuls, where
    # train ran the same job at ~3 s at one thread and doctor at one named it compute-bound (an
    # audit); the process's own count given back after
    threads = torch.get_num_threads()
    fitted = threads_for_load(0.25) if parse_device(device, _JOB_LIMIT).type == "cpu" else None
    try:
        return _doctor_job(target, job, tokenize, steps, warmup, apply, repeats, device,
                           memory_limit_bytes, log, fitted)
    finally:
        torch.set_num_threads(threads)


def _doctor_job(target: str, job: JobSpec, tokenize: str, steps: int, warmup: int, apply: bool,
                repeats: int, device: str, memory_limit_bytes: int | None, log: Any,
                fitted: tuple[int, int, float, int] | None) -> DoctorResult:
    bench = _Bench.open(job, device, lazy=tokenize == "lazy", steps=steps, warmup=warmup,
                        memory_limit_bytes=memory_limit_bytes, say=log or (lambda msg: None))
    first = bench.measure(job, bench.before_mode, "before")
    notes: list[str] = []
    if fitted is not None:
        notes.append(busy_host_note(*fitted, command="doctor"))
    names, probe = _diagnose(bench, first, notes)
    after_job, after_mode, applied = (_apply_fixes(bench, names, probe, notes) if apply
                                      else (job, bench.before_mode, []))
    befores, afters = ([first], [])
    gain = None
    if applied:
        befores, afters = _interleaved_rounds(bench, first, after_job, after_mode, repeats)
        gain = gain_of(befores, afters)
    pooled = _pooled(bench, befores)
    findings = find(bench.observe_before(pooled, probe))
    per_round = [(find(bench.observe_before(r, probe)) or [None])[0] for r in befores]
    rounds = [f.bottleneck if f is not None else "none" for f in per_round]
    findings = held_across_rounds(findings, rounds, notes)
    busy = _busy_note(bench, [*befores, *afters])
    if busy:
        notes.append(busy)
    after_findings = find(bench.observe_after(afters[0])) if afters else []
    overhead = statistics.median(r.hook_calls_per_step * bench.hook_cost_s / r.split.step_time_s
                                 + sampler_fraction(r.host) for r in befores)
    if bench.lazy and not apply:
        notes.append("--no-apply: fixes printed, not measured")
    return DoctorResult(target=target, kind="job", device=str(bench.device),
                        steps_measured=len(pooled.records), split=pooled.split, findings=findings,
                        before=_metrics(befores), after=_metrics(afters) if afters else None,
                        after_findings=after_findings,
                        applied=applied, overhead_fraction=overhead, notes=notes,
                        round_bottlenecks=rounds, gain=gain)
