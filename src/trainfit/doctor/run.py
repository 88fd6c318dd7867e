"""``doctor``: the pure functions behind ``trainfit doctor`` — measure, name, fix, measure again.

* :func:`doctor_job` — a trainfit job: measured in-process with the real ``train_step``; with
  ``apply`` the fixes are applied and the job measured again, before and after interleaved
  (B A B A …: CPU timing drifts by up to ~35 % between repeats, shared/notes/cpu-timing-noise.md).
* :func:`doctor_command` — someone else's command: run under the hooks and the sampler for a
  bounded window of steps; fixes are printed, not applied.

Both return a :class:`DoctorResult` whose ``to_dict()`` is the ``kind: "doctor"`` JSON of
docs/json-formats.md. Rendering lives in :mod:`trainfit.render.doctor`.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from trainfit.doctor.findings import Finding, Observation, find
from trainfit.doctor.inject import DoctorError, ForeignRun, run_foreign
from trainfit.doctor.measure import JobRunner, Round, resolve_relative
from trainfit.doctor.split import Split, calibrate_hook_cost_s, median_counter, median_split
from trainfit.job import JobSpec, dividing_micro_batches, read_job_file

DOCTOR_KEYS = {"tokenize": ("lazy", "eager")}
"""The ``doctor:`` mapping a job file may carry: ``tokenize: lazy`` measures seed 003's loader."""


@dataclass(kw_only=True)
class Metrics:
    """The before/after row (docs/json-formats.md): medians over the rounds, all measured."""

    step_time_s: float
    tokens_per_s: float | None
    data_wait_fraction: float | None
    gpu_util_percent: float | None
    step_time_spread_s: float = 0.0
    """max − min of the rounds' median step times (0 with one round)."""
    tokens_per_s_spread: float = 0.0
    rounds: int = 1

    def to_dict(self) -> dict[str, float | None]:
        return {"step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
                "data_wait_fraction": self.data_wait_fraction, "gpu_util_percent": self.gpu_util_percent}


@dataclass(kw_only=True)
class DoctorResult:
    target: str
    kind: str
    """job | command"""
    device: str
    steps_measured: int
    split: Split
    findings: list[Finding]
    before: Metrics
    after: Metrics | None = None
    after_findings: list[Finding] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    overhead_fraction: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "doctor", "target": self.target, "steps_measured": self.steps_measured,
                "split": self.split.to_dict(), "findings": [f.to_dict() for f in self.findings],
                "before": self.before.to_dict(),
                "after": self.after.to_dict() if self.after is not None else None,
                "applied": list(self.applied), "overhead_fraction": self.overhead_fraction}


# --- shared measurements ---------------------------------------------------------------------

def op_overhead_s(n: int = 2000) -> float:
    """Measured fixed cost of one eager op on this host (an add on an 8-element tensor, no autograd),
    median of 5: the cheapest thing a dispatch can be, so ops × this is a floor of the overhead."""
    z0 = torch.ones(8)
    vals = []
    for _ in range(5):
        z = z0
        t0 = time.perf_counter()
        for _ in range(n):
            z = z + 1.0
        vals.append((time.perf_counter() - t0) / n)
    return statistics.median(vals)


def cpu_peak_flops(dtype: torch.dtype = torch.float32) -> float:
    """Best of 3 timings of a 1024³ GEMM on this host now (the measured ceiling MFU is relative to);
    trainfit.speed.cpu's cached curve when it exists."""
    try:
        from trainfit.speed import cpu

        if cpu.cache_file().is_file():
            import json

            d = json.loads(cpu.cache_file().read_text())
            if d.get("threads") == torch.get_num_threads() and d.get("torch") == torch.__version__:
                name = "bf16" if dtype == torch.bfloat16 else "fp32"
                return max(r for _, r in d["gemm_rate_curve"][name])
    except (OSError, ValueError, KeyError):
        pass
    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * 1024**3 / best


def gpu_peak_flops(dtype: str) -> float | None:
    try:
        from trainfit.hardware.gpus import find_gpu_by_device_name

        gpu = find_gpu_by_device_name(torch.cuda.get_device_name(),
                                      torch.cuda.get_device_properties(0).total_memory)
        return gpu.peak_flops(dtype) if gpu is not None else None
    except Exception:  # an unknown card: MFU is then unknown, never guessed
        return None


def _sampler_fraction(r: Round | ForeignRun) -> float:
    h = r.host
    return h.sampler_cpu_s / h.wall_s if h.wall_s > 0 else 0.0


# --- trainfit jobs ---------------------------------------------------------------------------

def read_doctor_file(path: str | Path) -> tuple[JobSpec, dict[str, Any], dict[str, Any]]:
    """A job YAML → (job, doctor options, file-only keys). Paths in it resolve from the file's
    directory when they do not exist from here."""
    p = Path(path)
    if not p.is_file():
        raise DoctorError(f"{path}: no such file", "give a trainfit job YAML, or -- CMD for a script")
    fields, extra = read_job_file(p)  # the same parse (and errors) as every other command
    opts = extra.pop("doctor", None) or {}
    if not isinstance(opts, dict):
        raise DoctorError(f"{path}: doctor: must be a mapping, e.g. doctor: {{tokenize: lazy}}")
    for k, v in opts.items():
        if k not in DOCTOR_KEYS:
            raise DoctorError(f"{path}: doctor: unknown key {k!r}", f"known: {', '.join(DOCTOR_KEYS)}")
        if v not in DOCTOR_KEYS[k]:
            raise DoctorError(f"{path}: doctor.{k}: {v!r} must be one of {', '.join(DOCTOR_KEYS[k])}")
    for key in ("data", "tokenizer", "model"):
        if isinstance(fields.get(key), str):
            fields[key] = resolve_relative(fields[key], p.parent)
    return JobSpec.from_dict(fields, source=str(path)), opts, extra


def _largest_micro(job: JobSpec, limit: int) -> int:
    """The largest micro-batch ≤ ``limit`` × the current one that divides the per-rank batch."""
    per_rank = (job.effective_batch or job.micro_batch or 1) // job.ranks
    mb = job.micro_batch or 1
    return max((m for m in dividing_micro_batches(per_rank, mb * limit) if m >= mb), default=mb)


def _observation(r: Round, runner: JobRunner | None, op_s: float, *, lazy: bool,
                 probe: tuple[int, float] | None, recompute_s: float = 0.0,
                 capacity: int | None = None) -> Observation:
    job = r.job
    prof = r.profile or {}
    mfu = None
    if runner is not None and r.split.step_time_s > 0:
        from trainfit.speed.predict import model_flops_per_token

        wl = runner.workload(job)
        per_token = model_flops_per_token(runner.source.config, sum(p.numel() for p in wl.model.parameters()),
                                          sum(p.numel() for p in wl.model.parameters() if p.requires_grad),
                                          job.seq_len, job.method == "full")
        dt = torch.bfloat16 if (job.precision or "fp32") in ("amp-bf16", "bf16-true") else torch.float32
        peak = (cpu_peak_flops(dt) if runner.device.type == "cpu"
                else gpu_peak_flops("bf16" if dt == torch.bfloat16 else "fp16"
                                    if job.precision == "amp-fp16" else "fp32"))
        if peak:
            mfu = per_token * r.positions_per_step / r.split.step_time_s / peak
    pad = 1 - r.tokens_per_step / r.positions_per_step if r.positions_per_step else None
    return Observation(
        split=r.split, device="cuda" if runner is not None and runner.device.type == "cuda" else "cpu",
        trainfit_job=True, tokens_per_step=r.tokens_per_step,
        micro_steps_per_step=float(job.grad_accum or 1), ops_per_step=prof.get("ops_per_step"),
        op_overhead_s=op_s, matmul_time_fraction=prof.get("matmul_time_fraction"), mfu=mfu,
        recompute_s=recompute_s, peak_memory_bytes=r.host.peak_rss_bytes,
        memory_capacity_bytes=capacity, num_workers=job.num_workers, cpu_count=os.cpu_count() or 1,
        lazy_tokenization=lazy, micro_batch=job.micro_batch,
        max_micro_batch=probe[0] if probe else _largest_micro(job, 16),
        measured_micro_batch_gain=probe, padding_fraction=pad, optimizer_fused=job.optimizer_impl == "fused",
        host=r.host)


def _metrics(rounds: list[Round]) -> Metrics:
    steps = [r.split.step_time_s for r in rounds]
    tps = [r.tokens_per_s for r in rounds]
    gpu = [r.host.gpu_util_percent for r in rounds if r.host.gpu_util_percent is not None]
    return Metrics(step_time_s=statistics.median(steps), tokens_per_s=statistics.median(tps),
                   data_wait_fraction=statistics.median(r.data_wait_fraction for r in rounds),
                   gpu_util_percent=statistics.median(gpu) if gpu else None,
                   step_time_spread_s=max(steps) - min(steps), tokens_per_s_spread=max(tps) - min(tps),
                   rounds=len(rounds))


def doctor_job(path: str | Path | None = None, *, job: JobSpec | None = None, tokenize: str = "eager",
               steps: int = 6, warmup: int = 2, apply: bool = True, repeats: int = 2, device: str = "cpu",
               memory_limit_bytes: int | None = None, log: Any = None) -> DoctorResult:
    """Measure a trainfit job, name its bottlenecks, apply the fixes and measure again."""
    from trainfit.doctor.fixes import WorkerTrial, choose_workers
    from trainfit.model.runtime import parse_device
    from trainfit.model.source import resolve_model

    say = log or (lambda msg: None)
    target = str(path) if path is not None else "job"
    if path is not None:
        job, opts, extra = read_doctor_file(path)
        tokenize = opts.get("tokenize", tokenize)
        if memory_limit_bytes is None and isinstance(extra.get("memory_limit"), int):
            memory_limit_bytes = extra["memory_limit"]
    assert job is not None
    if steps < 3:
        raise DoctorError(f"--steps {steps}: too few to measure", "doctor needs at least 3 measured steps")
    if not job.data:
        raise DoctorError("the job has no data: doctor measures the real loader",
                          "add data: path/to/rows.jsonl to the job file")
    if job.micro_batch is None:
        job = job.replace(micro_batch=1)
    dev = parse_device(device)
    source = resolve_model(job.model, job.trust_remote_code)
    runner = JobRunner(job, source, dev, data_path=job.data, seed=job.seed)
    lazy = tokenize == "lazy"
    before_mode = "lazy" if lazy else "eager"
    op_s = op_overhead_s()
    hook_cost_s = calibrate_hook_cost_s()
    capacity = memory_limit_bytes or (torch.cuda.get_device_properties(dev).total_memory
                                      if dev.type == "cuda" else psutil.virtual_memory().total)

    def measure(j: JobSpec, mode: str, label: str, n: int = steps, profile: bool = True) -> Round:
        say(f"measuring {label} ({mode} data, micro-batch {j.micro_batch} × {j.grad_accum}, "
            f"{j.num_workers} workers) …")
        return runner.measure(j, runner.data(mode, j), steps=n, warmup=warmup, profile=profile, label=label)

    first = measure(job, before_mode, "before")
    recompute = first.split.forward_s if job.grad_ckpt == "full" else 0.0
    probe = None
    obs = _observation(first, runner, op_s, lazy=lazy, probe=None, recompute_s=recompute, capacity=capacity)
    findings = find(obs)
    names = [f.bottleneck for f in findings]
    after_job, after_mode, applied, notes = job, before_mode, [], []
    if "launch-bound" in names or (obs.ops_per_step or 0) * op_s > 0.15 * first.split.step_time_s:
        # the largest micro-batch the effective batch allows (≤ 16×), then ≤ 4× if that runs out
        # of memory: fewer, larger ops per token is the whole fix, so measure it rather than guess
        for big in sorted({_largest_micro(job, 16), _largest_micro(job, 4)}, reverse=True):
            if big <= (job.micro_batch or 1):
                continue
            try:
                probe_round = measure(job.replace(micro_batch=big), before_mode,
                                      f"probe micro-batch {big}", n=3, profile=False)
            except torch.OutOfMemoryError:
                notes.append(f"micro-batch {big} ran out of memory")
                continue
            probe = (big, probe_round.tokens_per_s / first.tokens_per_s - 1)
            break
        if probe is not None:
            obs = _observation(first, runner, op_s, lazy=lazy, probe=probe, recompute_s=recompute,
                               capacity=capacity)
            findings = find(obs)
            names = [f.bottleneck for f in findings]
    if apply:
        if "input-bound" in names:
            if lazy:
                after_mode = "memmap"
                setup = runner.data("memmap", job)
                tf = setup.token_file
                assert tf is not None
                how = "reused from the cache" if tf.reused else f"built in {tf.build_time_s:.2f} s measured"
                applied.append(f"pre-tokenized once into {tf.path.name} ({tf.samples} samples × "
                               f"{tf.seq_len} tokens, memory-mapped; {how})")
                if tf.packed:
                    applied.append("packing: documents joined with EOS into full sequences (attention "
                                   "crosses document boundaries inside a sequence: the trade-off)")
            budget = int(psutil.virtual_memory().available * 0.5)

            def trial(n: int) -> WorkerTrial:
                j = after_job.replace(num_workers=n, persistent_workers=n > 0, pin_memory=dev.type == "cuda")
                r = measure(j, after_mode, f"{n} workers", n=3, profile=False)
                return WorkerTrial(num_workers=n, step_time_s=r.split.step_time_s,
                                   step_time_spread_s=r.split.step_time_spread_s,
                                   data_wait_fraction=r.data_wait_fraction,
                                   rss_bytes=r.host.peak_rss_bytes or 0)

            choice = choose_workers(trial, cuda=dev.type == "cuda", cpu_count=os.cpu_count() or 1,
                                    ram_budget_bytes=budget)
            after_job = after_job.replace(num_workers=choice.num_workers,
                                          persistent_workers=choice.persistent_workers,
                                          pin_memory=choice.pin_memory,
                                          prefetch_factor=choice.prefetch_factor)
            if choice.num_workers != job.num_workers:
                applied.append(f"num_workers {job.num_workers} → {choice.num_workers} (persistent, prefetch "
                               f"{choice.prefetch_factor}{', pinned' if choice.pin_memory else ''}): "
                               f"{choice.reason}")
            else:
                notes.append(f"workers chosen by measurement: {choice.reason}")
        if probe is not None and probe[1] > 0.10:
            after_job = after_job.replace(micro_batch=probe[0])
            applied.append(f"micro_batch {job.micro_batch} → {after_job.micro_batch}, grad_accum "
                           f"{job.grad_accum} → {after_job.grad_accum} (effective batch "
                           f"{job.effective_batch} kept): measured {probe[1]:+.0%} tokens/s on a "
                           "3-step probe")
        if "needless-recompute" in names:
            after_job = after_job.replace(grad_ckpt="off")
            applied.append("grad_ckpt full → off (the measured peak leaves room for the activations)")
    befores, afters = [first], []
    if applied:
        for k in range(max(repeats, 1)):
            afters.append(measure(after_job, after_mode, f"after #{k + 1}"))
            if k + 1 < repeats:
                befores.append(measure(job, before_mode, f"before #{k + 2}"))
    records = [rec for r in befores for rec in r.records]
    split = median_split(records, idle_s=first.split.idle_s)
    pooled = Round(label="before", job=job, data_mode=before_mode, records=records, split=split,
                   tokens_per_step=median_counter(records, "tokens"),
                   positions_per_step=median_counter(records, "positions"),
                   tokens_per_s=statistics.median(r.tokens_per_s for r in befores),
                   data_wait_fraction=statistics.median(r.data_wait_fraction for r in befores),
                   host=first.host, profile=first.profile,
                   hook_calls_per_step=statistics.median(r.hook_calls_per_step for r in befores))
    findings = find(_observation(pooled, runner, op_s, lazy=lazy, probe=probe, recompute_s=recompute,
                                 capacity=capacity))
    after_findings = []
    if afters:
        a = afters[0]
        after_findings = find(_observation(a, runner, op_s, lazy=False, probe=None, capacity=capacity))
    overhead = statistics.median(r.hook_calls_per_step * hook_cost_s / r.split.step_time_s
                                 + _sampler_fraction(r) for r in befores)
    if lazy and not apply:
        notes.append("--no-apply: fixes printed, not measured")
    return DoctorResult(target=target, kind="job", device=str(dev), steps_measured=len(records), split=split,
                        findings=findings, before=_metrics(befores),
                        after=_metrics(afters) if afters else None, after_findings=after_findings,
                        applied=applied, overhead_fraction=overhead, notes=notes)


# --- someone else's command ----------------------------------------------------------------------

def foreign_observation(run: ForeignRun, op_s: float) -> tuple[Observation, Split]:
    s = run.summary
    prof = s.get("profile") or {}
    busy = prof.get("device_busy_s")
    step = statistics.median(r.step_time_s for r in run.records)
    idle = max(step - busy, 0.0) if busy is not None else None
    split = median_split(run.records, idle_s=idle)
    recs = run.records
    tokens = median_counter(recs, "tokens") or None
    micro = median_counter(recs, "micro_steps") or None
    mfu = None
    if tokens and s.get("params") and not s.get("cuda_used"):
        mfu = 6.0 * s["params"] * tokens / split.step_time_s / cpu_peak_flops()
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
        recompute_s=median_counter(recs, "recompute_s"),
        peak_memory_bytes=s.get("peak_allocated_bytes") or s.get("max_rss_bytes"),
        memory_capacity_bytes=s.get("device_total_bytes") or psutil.virtual_memory().total,
        params_on_cpu_fraction=params_cpu, num_workers=None if workers is None else int(workers),
        cpu_count=os.cpu_count() or 1, optimizer_fused=opt.get("fused") if opt else None, host=run.host)
    return obs, split


def doctor_command(cmd: list[str], *, steps: int = 10, warmup: int = 2, stop: bool = True,
                   timeout_s: float | None = 900.0, extra_env: dict[str, str] | None = None) -> DoctorResult:
    """Run someone else's training command under the doctor for a window of steps."""
    if steps < 3:
        raise DoctorError(f"--steps {steps}: too few to measure", "doctor needs at least 3 measured steps")
    run = run_foreign(cmd, steps=steps, warmup=warmup, stop=stop, timeout_s=timeout_s, extra_env=extra_env)
    obs, split = foreign_observation(run, op_overhead_s())
    findings = find(obs)
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
    overhead = statistics.median(per_step_s) + _sampler_fraction(run) if per_step_s else None
    tokens = obs.tokens_per_step
    waits = [(r.phases_s.get("data_wait", 0.0) + r.phases_s.get("h2d_copy", 0.0)) / r.step_time_s
             for r in run.records if r.step_time_s > 0]
    before = Metrics(step_time_s=split.step_time_s,
                     tokens_per_s=tokens / split.step_time_s if tokens else None,
                     data_wait_fraction=statistics.median(waits) if waits else None,
                     gpu_util_percent=run.host.gpu_util_percent,
                     step_time_spread_s=split.step_time_spread_s)
    notes = list(run.notes)
    if run.stopped_by_doctor:
        notes.append(f"the command was stopped after the measured window ({warmup} warm-up + "
                     f"{len(run.records)} measured + 1 profiled steps)")
    if obs.model_sync_calls_per_step:
        notes.append(f"{obs.model_sync_calls_per_step:.0f} sync points per step inside the model's or the "
                     "optimizer's own code (measured count)")
    return DoctorResult(target=run.target, kind="command", device=obs.device, steps_measured=len(run.records),
                        split=split, findings=findings, before=before, after=None, applied=[],
                        overhead_fraction=overhead, notes=notes)
