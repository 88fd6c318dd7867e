"""``trainfit tune``: measure the real job on the real device and choose the fastest configuration
that fits — the job and data of the user, probes of the same step ``plan`` simulates."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil
import torch

from trainfit.data import DataError, TokenData
from trainfit.data.load import load_data, with_data_packing
from trainfit.hardware.gpus import find_gpu_by_device_name
from trainfit.job import DEFAULT_MARGIN, JobError, JobSpec
from trainfit.job.fields import DEFAULT_KNOBS
from trainfit.job.step_options import refuse_other_model_code
from trainfit.memory.predict import predict_memory
from trainfit.memory.ranks import data_parallel_bytes
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.runtime import check_method_on, parse_device
from trainfit.model.source import ModelSource, resolve_model
from trainfit.model.towers import inactive_params_of
from trainfit.speed.cpu import cpu_speed
from trainfit.speed.host import host_step
from trainfit.speed.host_timing import threads_for_load
from trainfit.speed.ops import OpRecorder
from trainfit.speed.predict import model_flops_per_token, predict_speed_exact
from trainfit.tune.link import LinkMeasurement, measure_link
from trainfit.tune.probe import Probe
from trainfit.tune.result import ProbeResult, SearchNote
from trainfit.tune.search import (
    KNOBS,
    UNSTEADY_SPREAD,
    Comparison,
    Outcome,
    Predicted,
    Searcher,
    SearchOptions,
    Trial,
    micro_options,
)


@dataclass(kw_only=True)
class TuneOptions:
    device: str = "cpu"
    """cpu, cuda or cuda:N"""
    memory_limit_bytes: int | None = None
    """Capacity to fit in (CPU: live tensor bytes, the stand-in for a GPU; CUDA: a cap below the
    card's memory via set_per_process_memory_fraction). None on CUDA: the whole card."""
    margin: float = DEFAULT_MARGIN
    budget_s: float | None = None
    max_host_ram_bytes: int | None = None
    knobs: tuple[str, ...] = DEFAULT_KNOBS
    fixed: frozenset[str] = frozenset()
    run_steps: int | None = None
    isolate: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.margin < 1:
            raise JobError(f"--margin {self.margin}: must be in [0, 1)", "e.g. --margin 0.1")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise JobError(f"--memory-limit {self.memory_limit_bytes}: must be > 0",
                           "e.g. --memory-limit 2GiB")
        if self.budget_s is not None and not 0 < self.budget_s < float("inf"):  # NaN: no budget
            raise JobError(f"--budget-s {self.budget_s}: must be a finite number of seconds > 0",
                           "e.g. --budget-s 600")
        if self.run_steps is not None and self.run_steps < 1:  # 0 read as the default 1,000
            raise JobError(f"--run-steps {self.run_steps}: must be ≥ 1", "e.g. --run-steps 1000")
        unknown = [k for k in self.knobs if k not in KNOBS]
        if unknown:
            raise JobError(f"--knobs {','.join(unknown)}: unknown", f"choose from {','.join(KNOBS)}")


@dataclass
class TuneResult:
    device: str
    device_name: str
    memory_limit_bytes: int | None
    margin: float
    search_time_s: float
    dataset_samples: int
    dataset_tokens: int
    pick: Trial | None
    baseline: Trial | None
    trials: list[Trial]
    vs_baseline: Comparison | None = None
    """The pick against the user's current configuration, re-measured in interleaved rounds
    (None: no current configuration given, or it is the pick)."""
    notes: list[SearchNote] = field(default_factory=list)
    """What the search (and tune around it) decided not to do, or did by rule, and why."""
    data_notes: list[str] = field(default_factory=list)
    """What reading the data did to it (truncation, packing), as the data layer states it."""
    link: LinkMeasurement | None = None
    """Under torchrun: the all-gather bandwidth between the ranks, measured (plan's
    ``--interconnect GBPS`` takes it)."""
    step_source: str = "job"
    """``job``: trainfit's own step of the job (token-weighted loss, positions counted); ``script``:
    the user's trainer (its compute_loss, its batches' non-padding tokens counted)."""
    unconfirmed: Trial | None = None
    """The search's best when the interleaved rounds did not confirm it faster than the user's
    current configuration (``vs_baseline``): the pick is then the current one, kept — a change
    is written only for a gain the repeats support."""

    def to_dict(self) -> dict[str, Any]:
        def trial(t: Trial) -> dict[str, Any]:
            d = t.job.to_dict()
            r = t.result.to_dict()
            d.update({"index": t.index, "stage": t.stage, "status": r["status"], "fits": t.fits,
                      "measured": r["measured"], "predicted": asdict(t.predicted)
                      if t.predicted else None, "probe_time_s": r["probe_time_s"],
                      "note": "; ".join(x for x in (t.note, r["detail"]) if x) or None})
            return d
        return {"kind": "tune", "device": self.device, "device_name": self.device_name,
                "memory_limit_bytes": self.memory_limit_bytes, "margin": self.margin,
                "search_time_s": self.search_time_s, "dataset_samples": self.dataset_samples,
                "dataset_tokens": self.dataset_tokens,
                "pick": trial(self.pick) if self.pick else None,
                "baseline": trial(self.baseline) if self.baseline else None,
                "unconfirmed": trial(self.unconfirmed) if self.unconfirmed else None,
                # no round ran (the budget ended first): its noise is unknown, not 0 (an audit)
                "vs_baseline": None if self.vs_baseline is None else {
                    **asdict(self.vs_baseline), "median_ratio": self.vs_baseline.median,
                    **({} if self.vs_baseline.ratios else {"noise": None})},
                "probes": [trial(t) for t in self.trials],
                "step_source": self.step_source,
                "search_notes": [{"kind": n.kind, **n.data} for n in self.notes],
                "data_notes": list(self.data_notes),
                "link": None if self.link is None else asdict(self.link)}


class CpuPredictor:
    """The data-less simulation of the same step with CPU semantics and the real batch's shapes,
    plus the speed model with this CPU's measured rates (cached per configuration)."""

    def __init__(self, source: ModelSource, data: TokenData) -> None:
        self.source = source
        self.data = data
        self._cache: dict[tuple, Predicted] = {}

    def batch_fn(self, micro: int) -> Callable[[], dict[str, torch.Tensor]]:
        t = self.data.seq_len

        def make() -> dict[str, torch.Tensor]:
            b = {"input_ids": torch.zeros((micro, t), dtype=torch.int64),
                 "labels": torch.zeros((micro, t), dtype=torch.int64)}
            if self.data.padded:
                b["attention_mask"] = torch.ones((micro, t), dtype=torch.int64)
            return b
        return make

    def __call__(self, job: JobSpec) -> Predicted | None:
        key = (job.micro_batch, job.precision, job.grad_ckpt, job.attention, job.optimizer,
               job.optimizer_impl, job.grad_accum)
        if key in self._cache:
            return self._cache[key]
        rec = OpRecorder(replay=True)
        sim = simulate_step(job, self.source, SimTarget(device="cpu"), op_hook=rec,
                            batch_fn=self.batch_fn(job.micro_batch or 1))
        fpt = model_flops_per_token(self.source.config, sim.total_params, sim.trainable_params,
                                    job.seq_len, job.method == "full",
                                    inactive_params=inactive_params_of(self.source),
                                    matmul_params=sim.info.get("matmul_params", 0))
        speed = cpu_speed()
        sp = predict_speed_exact(speed, rec.ops, job.micro_batch or 1, job.grad_accum or 1,
                                 job.seq_len, job.ranks, fpt,
                                 host=host_step(job, self.source, pool=True))
        # many ranks: what data parallelism adds to the one-process step (DDP's gradient
        # buckets), as plan adds it — the probe counts the same buckets
        extra, _ = data_parallel_bytes(job, self.source, sim.breakdown, sim.trainable_params)
        p = Predicted(peak_allocated_bytes=sim.peak_allocated_bytes + extra,
                      step_time_s=sp.step_time_s, tokens_per_s=sp.tokens_per_s,
                      from_busy_timings=bool(getattr(speed.kernel_timer, "used_busy", False)))
        self._cache[key] = p
        self.steady_bytes = sim.steady_bytes
        # what the optimizer step holds whatever the micro-batch and checkpointing: weights,
        # their gradients and the states (the optimizer phase's peak, less its temporaries,
        # which the optimizer_impl knob changes); the states alone when 8-bit ones may replace them
        at_step = sim.phase_breakdowns.get("optimizer", {})
        self.floor_bytes = max(sim.steady_bytes, sum(
            at_step.get(c, 0) for c in ("parameters", "gradients", "optimizer", "buffers")))
        self.floor_states_bytes = at_step.get("optimizer", 0)
        return p


def _precisions(device: torch.device) -> tuple[str, ...]:
    if device.type == "cuda":
        return ("amp-bf16", "bf16-true", "fp32") if torch.cuda.is_bf16_supported() \
            else ("amp-fp16", "fp32")
    return ("fp32", "amp-bf16")


def _check_job(job: JobSpec) -> None:
    # the probes run the installed transformers model: the predictions that guide them must
    # describe the same model
    refuse_other_model_code(job, "tune")
    if job.sharding != "none" and job.ranks > 1:
        # the probes wrap the model in DDP: an FSDP job's memory would be measured unsharded
        raise JobError(f"sharding: {job.sharding} over {job.ranks} ranks: tune probes DDP (full "
                       "replicas) only", "set sharding: none in the job to tune it (DDP's memory "
                       "bounds FSDP's from above), or use `trainfit plan` and train's OOM recovery")


def device_side(source: ModelSource, data: TokenData, device: torch.device, opts: TuneOptions
                 ) -> tuple[int | None, str, Callable[[JobSpec], Predicted | None]]:
    """(capacity, device name, predictor): on CUDA the card (capped by --memory-limit through the
    allocator's fraction), on CPU the live-bytes limit and the CPU-semantics simulation."""
    capacity = opts.memory_limit_bytes
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if capacity is not None:
            torch.cuda.set_per_process_memory_fraction(min(capacity / total, 1.0), device)
        else:
            capacity = total
        name = torch.cuda.get_device_name(device)
        return capacity, name, _gpu_predictor(source, name, total)
    return capacity, f"CPU ({os.cpu_count()} cores), live tensor bytes", CpuPredictor(source, data)


def _check_first_guess(first: Predicted | None, predict: Any, capacity: int | None,
                       states_may_shrink: bool = False) -> None:
    """Refuse before probing what the prediction already shows cannot work: the weights, their
    gradients and the optimizer states, which every candidate holds at its optimizer step (an
    audit: counting weights and states only, tune probed limits the gradients overflowed)."""
    if first is not None and capacity is not None and isinstance(predict, CpuPredictor):
        floor = predict.floor_bytes
        if states_may_shrink:  # the 8-bit knob: its states are a quarter of 32-bit AdamW's
            floor -= predict.floor_states_bytes * 3 // 4
        if floor > capacity:
            raise JobError(f"--memory-limit {capacity / 2**30:.2f} GiB is smaller than the model's "
                           f"weights, gradients and optimizer states ({floor / 2**30:.2f} GiB "
                           "predicted at the optimizer step)", "raise the limit, or use --method lora")
    # no refusal from a predicted step time: on the CPU stand-in it is the CPU model's, which
    # over-states a tiny step ~3× (a QA run: one probe predicted 34 s, 8 probes ran in 100 s),
    # and the GPU predictor gives memory only; the search stops at the budget, measured (its
    # first probe and the timed probe of the largest micro-batch found always run: search.py)


def _prober(job: JobSpec, source: ModelSource, data: TokenData, device: torch.device,
            opts: TuneOptions) -> tuple[Probe, Callable[[JobSpec, int], ProbeResult]]:
    prober = Probe(source, data, device, memory_limit_bytes=opts.memory_limit_bytes,
                   max_host_ram_bytes=opts.max_host_ram_bytes, seed=job.seed)
    if prober.dist.world != job.ranks:
        raise JobError(f"--ranks {job.ranks} but {prober.dist.world} process(es) run",
                       f"start tune under torchrun --nproc-per-node {job.ranks}, or --ranks "
                       f"{prober.dist.world}")
    if opts.isolate and prober.dist.world > 1:
        raise JobError("--isolate with many ranks is not supported",
                       "run one rank per process without --isolate")
    probe_fn = _isolated_probe(source, data, opts) if opts.isolate else \
        (lambda j, timed: prober.run(j, timed_steps=timed))
    return prober, probe_fn


def _rule_notes(pick: Trial | None, device: torch.device) -> list[SearchNote]:
    """What tune states around the search: a busy host, the CPU's peak, persistent workers (set
    on the pick by rule)."""
    notes = []
    load_1min = psutil.getloadavg()[0]
    if device.type == "cpu" and load_1min > (os.cpu_count() or 1):
        notes.append(SearchNote("host_busy", {"load_1min": load_1min, "cores": os.cpu_count()}))
    if device.type == "cpu":
        notes.append(SearchNote("cpu_peaks"))
    if pick is not None and pick.job.num_workers > 0 and not pick.job.persistent_workers:
        pick.job = pick.job.replace(persistent_workers=True)
        notes.append(SearchNote("persistent_workers"))
    return notes


def tune(job: JobSpec, opts: TuneOptions, progress: Callable[[str], None] | None = None
         ) -> TuneResult:
    t0 = time.perf_counter()
    device = parse_device(opts.device)
    check_method_on(job, device)  # before the model loads
    source = resolve_model(job.model, job.trust_remote_code)
    _check_job(job)
    data = load_data(job, source)
    job = with_data_packing(job, data)  # what is measured is what is written
    if job.effective_batch is None:
        raise JobError("--effective-batch is required: tune keeps it exact",
                       "e.g. --effective-batch 16 (samples per optimizer step, all ranks)")
    if data.stats.samples < job.ranks:
        raise DataError(f"--data {job.data}: {data.stats.samples} samples for {job.ranks} ranks",
                        "every rank needs samples: add data or use fewer --ranks")
    torch.manual_seed(job.seed)
    busy = fit_threads(device, job.ranks)
    capacity, name, predict = device_side(source, data, device, opts)
    prober, probe_fn = _prober(job, source, data, device, opts)
    link = measure_link(device)  # all ranks together, before the probes
    result = run_search(job, opts, Bench(source=source, device=device, capacity=capacity,
                                         device_name=name, predict=predict, probe=probe_fn,
                                         agree=prober.dist.any, samples=len(data),
                                         tokens=data.stats.tokens,
                                         data_notes=list(data.stats.notes)), t0, progress)
    result.link = link
    if busy is not None:
        result.notes.append(busy)
    return result


def fit_threads(device: torch.device, ranks: int) -> SearchNote | None:
    """A one-rank CPU tune's torch pool fitted to the cores other processes leave
    (:func:`~trainfit.speed.host_timing.threads_for_load`), before its probes; the note saying
    so, or None where nothing was changed."""
    fitted = threads_for_load() if device.type == "cpu" and ranks == 1 else None
    if fitted is None:
        return None
    return SearchNote("threads_for_load", {"threads": fitted[0], "was": fitted[1],
                                           "others": fitted[2], "cpus": fitted[3]})


@dataclass
class Bench:
    """What a search runs on: the device, its capacity, the probe of a configuration and the
    prediction of one (trainfit's own job here; a user's trainer in trainfit.script.tune)."""

    source: ModelSource
    device: torch.device
    capacity: int | None
    device_name: str
    predict: Callable[[JobSpec], Predicted | None]
    probe: Callable[[JobSpec, int], ProbeResult]
    agree: Callable[[bool], bool]
    samples: int
    tokens: int
    data_notes: list[str] = field(default_factory=list)


def _unsupported_knobs(source: Any) -> frozenset[str]:
    """Knobs the model has one value of: checkpointing where its class has none; the attention
    where transformers gives it no SDPA implementation (Gemma-2, Mamba: an audit's tune probed
    its eager attention, then ended in "--attention sdpa: no SDPA implementation", exit 2)."""
    from trainfit.model.attention_impl import has_sdpa

    out = set()
    if not getattr(source.config, "supports_grad_ckpt", True):
        out.add("grad_ckpt")
    if has_sdpa(source) is False:
        out.add("attention")
    return frozenset(out)


def run_search(job: JobSpec, opts: TuneOptions, bench: Bench, t0: float,
               progress: Callable[[str], None] | None = None, current: JobSpec | None = None,
               step_source: str = "job") -> TuneResult:
    """The search from the prediction (the largest micro-batch that fits, then the knobs), the
    user's current configuration measured as the baseline: ``current``, else the job when it
    fixes a micro-batch (with its precision and checkpointing, or fp32 and off)."""
    base = job.replace(micro_batch=None, grad_accum=None, effective_batch=job.effective_batch) \
        if job.micro_batch else job
    base = base.replace(precision=job.precision or "fp32", grad_ckpt=job.grad_ckpt or "off")
    if current is None and job.micro_batch:
        current = job.replace(precision=base.precision, grad_ckpt=base.grad_ckpt)
    predict, device = bench.predict, bench.device
    # 1, or the only micro-batch optimizer_in_backward allows (the per-rank batch)
    smallest = (micro_options(base, bench.samples)[0] or [1])[0]
    # 8-bit states only where the search can try them (Searcher._eight_bit's conditions): a
    # knob listed but never tried lowered the floor below weights + states (a review)
    eight_bit = "optimizer_8bit" in opts.knobs and "optimizer_8bit" not in opts.fixed \
        and base.optimizer == "adamw" and importlib.util.find_spec("bitsandbytes") is not None \
        and not (base.sharding in ("zero2", "zero3") and base.offload != "none")
    _check_first_guess(predict(base.replace(micro_batch=smallest)), predict, bench.capacity,
                       states_may_shrink=eight_bit)
    sopts = SearchOptions(margin=opts.margin, budget_s=opts.budget_s, knobs=opts.knobs,
                          bitsandbytes=importlib.util.find_spec("bitsandbytes") is not None,
                          precisions=_precisions(device),
                          fixed=opts.fixed,
                          unsupported=_unsupported_knobs(bench.source),
                          run_steps=opts.run_steps,
                          worker_counts=(0, max(1, (os.cpu_count() or 1) // 2)),
                          cuda=device.type == "cuda")
    # the budget is the search's (its predictions and probes): counted from tune's start, a slow
    # model load left no probe at all (a review's check)
    searcher = Searcher(base, bench.probe, predict, bench.capacity, sopts, bench.samples, progress,
                        agree=bench.agree)
    baseline = None
    if current is not None:
        baseline = searcher.run(current, "baseline", 3, note="your current configuration")
    out: Outcome = searcher.search()
    vs = None
    if baseline is not None and out.best is not None and out.best.job != baseline.job \
            and baseline.fits and searcher.tps(baseline) > 0:
        # the speed-up reported against what the user runs now is measured like any gain:
        # interleaved rounds, so no single lucky probe makes it
        vs = searcher.compare(baseline, out.best,
                              first=(searcher.tps(searcher.median_of(baseline)),
                                     searcher.tps(searcher.median_of(out.best))))
    pick, unconfirmed = out.best, None
    cut = vs is not None and searcher.stopped and len(vs.ratios) < sopts.rounds \
        and vs.verdict == "undecided"
    if vs is not None and vs.verdict != "faster" and not cut:
        # not confirmed faster than what the user runs (slower in a round, or inside the noise
        # over every round): the current configuration is kept and written, the candidate
        # reported beside it. Rounds the budget cut short decide nothing either way: the
        # search's best stays the pick, said unconfirmed (tune_reason)
        pick, unconfirmed = baseline, out.best
    if pick is not None:
        pick = searcher.median_of(pick)  # reported with its repeats' median, not one probe
    unsteady = searcher.repeat_spread_note()
    if unsteady is not None:
        out.notes.append(unsteady)
    elif searcher.one_probe:
        # a steady run says them too: a gain needs every round, a drop one slower probe (an
        # audit: amp-bf16 0.48×, eager 0.47× dropped unsaid on a quiet run)
        out.notes.append(SearchNote("one_probe", {"one_probe": searcher.one_probe,
                                                   "unsteady_spread": UNSTEADY_SPREAD
                                                   if searcher.repeats_timed else None}))
    # persistent workers set on the pick written — on a copy: the probe it is (median_of may
    # return one) keeps the job it ran (a review: its record read persistent_workers true)
    pick = dataclasses.replace(pick) if pick is not None else None
    rule_notes = _rule_notes(pick, device)
    return TuneResult(device=str(device), device_name=bench.device_name,
                      memory_limit_bytes=bench.capacity, margin=opts.margin,
                      search_time_s=time.perf_counter() - t0, dataset_samples=bench.samples,
                      dataset_tokens=bench.tokens, pick=pick, baseline=baseline,
                      unconfirmed=unconfirmed, trials=out.trials, vs_baseline=vs,
                      notes=[*out.notes, *rule_notes],
                      data_notes=list(bench.data_notes), step_source=step_source)


def _gpu_predictor(source: ModelSource, device_name: str, total: int
                   ) -> Callable[[JobSpec], Predicted | None]:
    gpu = find_gpu_by_device_name(device_name, total)
    cache: dict[tuple, Predicted] = {}

    def predict(job: JobSpec) -> Predicted | None:
        key = (job.micro_batch, job.precision, job.grad_ckpt, job.attention, job.optimizer,
               job.optimizer_impl, job.grad_accum)
        if key not in cache:
            m = predict_memory(job, source, gpu)
            cache[key] = Predicted(peak_allocated_bytes=m.peak_allocated_bytes,
                                   peak_reserved_bytes=m.peak_reserved_bytes,
                                   # reserve + the card's CUDA context: unknown without a
                                   # catalog card (not the reserve alone: a review)
                                   peak_device_bytes=m.peak_device_bytes if gpu else None)
        return cache[key]
    return predict


def _isolated_probe(source: ModelSource, data: TokenData, opts: TuneOptions
                    ) -> Callable[[JobSpec, int], ProbeResult]:
    """Each probe in a fresh process (spawned): an OOM that poisons a CUDA context, or a crash,
    costs that probe only."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")

    def run(job: JobSpec, timed: int) -> ProbeResult:
        with ctx.Pool(1) as pool:
            try:
                return pool.apply(_probe_in_child, (job, source.name, data, opts, timed))
            except Exception as err:  # the child died: report it as a failed probe
                return ProbeResult(status="oom" if "memory" in str(err).lower() else "crashed",
                                   measured=None, detail=f"{type(err).__name__}: {err}"[:200])
    return run


def _probe_in_child(job: JobSpec, model: str, data: TokenData, opts: TuneOptions, timed: int
                    ) -> ProbeResult:
    source = resolve_model(model, job.trust_remote_code)
    prober = Probe(source, data, parse_device(opts.device),
                   memory_limit_bytes=opts.memory_limit_bytes,
                   max_host_ram_bytes=opts.max_host_ram_bytes, seed=job.seed)
    return prober.run(job, timed_steps=timed)
