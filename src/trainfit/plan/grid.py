"""``trainfit plan``: predicted peak memory of every candidate configuration on a named GPU.

Candidates: the precisions the GPU supports × checkpointing off/on × micro-batches (powers of two
dividing the per-rank effective batch, plus the largest that fits), each with the accumulation that
keeps the effective batch exact.  Knobs the user fixed are not varied.  Each (precision,
checkpointing) group costs 4-8 small simulations (:mod:`trainfit.memory.extrapolate`); the
recommended configuration is then re-simulated at full size, so the number it is chosen on is
exact, not extrapolated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainfit.hardware.gpus import GpuSpec
from trainfit.job import (
    DEFAULT_MARGIN,
    JobSpec,
    step_micro_batches,
    step_precisions,
)
from trainfit.memory.extrapolate import fit_group
from trainfit.memory.host_offload import host_activations_of_row, pinned_extra_bytes
from trainfit.memory.predict import (
    MemoryPrediction,
    finish,
    predict_memory,
    target_for,
)
from trainfit.model.batch import make_batch
from trainfit.model.source import ModelSource
from trainfit.model.towers import inactive_params_of
from trainfit.plan.context import offload_check, plan_assumptions
from trainfit.plan.inputs import check_inputs, fsdp_keeps_fp32_weights, grid_precisions
from trainfit.plan.ladder import build_ladder
from trainfit.plan.pick import keep_fp32_weights, recommend, sort_key, versus
from trainfit.plan.result import PlanResult, PlanRow, smallest_row
from trainfit.plan.row_speed import framework_host_s, synced
from trainfit.plan.rows import (
    add_current_row,
    fields_but_split,
    mark_largest_fitting,
    mark_shown,
    rank_rows,
    show_current,
    take_exact_row,
)
from trainfit.plan.workers import SimulationWorkers
from trainfit.speed.bands import speed_band_for
from trainfit.speed.comm import untimed_link
from trainfit.speed.host import host_step
from trainfit.speed.ops import OpRecorder
from trainfit.speed.predict import (
    model_flops_per_token,
    predict_speed_exact,
)
from trainfit.speed.roofline import DeviceSpeed

MAX_MICRO_BATCH_WITHOUT_EFFECTIVE = 256
MAX_VERIFICATIONS = 3


def _fit_one(args: tuple[JobSpec, ModelSource, Any, list[tuple[int, bool]]]) -> Any:
    job, source, target, rows = args
    return fit_group(job, source, target, high_batch=max(m for m, _ in rows), rows=rows)


def _host_steps(jobs: list[tuple[JobSpec, ModelSource]]) -> list[tuple[Any, float]]:
    """The groups' host steps, measured one after the other in one worker while the others
    idle: beside a simulation a step's CPU time came out 2-4× its own (gpt2-xl LoRA 42-59 ms
    alone, 126 ms in a plan) on torch's 2-thread pool; now timed on one (``host.one_thread``)."""
    steps = [host_step(job, source, again=True) for job, source in jobs]
    # read again at the machine's reference as it stands after the last of them (a quiet one
    # may have lowered it): every group alike; with DeepSpeed ZeRO's hooks at the same reference
    return [(None if hs is None else hs.at_machine_speed(), framework_host_s(job, source))
            for hs, (job, source) in zip(steps, jobs, strict=True)]


def _exact_row(args: tuple[JobSpec, ModelSource, GpuSpec | None, float]) -> PlanRow:
    """Full-size simulation of one configuration: memory and (on a named GPU) speed."""
    cj, source, gpu, margin = args
    rec = OpRecorder()
    mem = predict_memory(cj, source, gpu, margin, op_hook=rec)
    speed = None if gpu is None else predict_speed_exact(
        DeviceSpeed.from_gpu(gpu), rec.ops, cj.micro_batch or 1, cj.grad_accum or 1, cj.seq_len,
        cj.ranks, _flops_per_token(source, mem, cj), compiled=cj.compile,
        host=host_step(cj, source, again=True),  # alone: the other workers wait
        framework_host_s=framework_host_s(cj, source))
    return PlanRow(cj, mem, "simulated", synced(speed, cj, mem, gpu))


def _flops_per_token(source: ModelSource, mem: MemoryPrediction, job: JobSpec) -> float:
    return model_flops_per_token(source.config, mem.total_params, mem.trainable_params,
                                 job.seq_len, job.method == "full",
                                 inactive_params=inactive_params_of(source),
                                 matmul_params=mem.matmul_params)


def _micro_candidates(job: JobSpec) -> list[int]:
    if job.micro_batch is not None:
        return [job.micro_batch]
    if job.effective_batch is None:
        out, b = [], 1
        while b <= MAX_MICRO_BATCH_WITHOUT_EFFECTIVE:
            out.append(b)
            b *= 2
        return out
    return step_micro_batches(job, job.effective_batch // job.ranks)


def _config_job(job: JobSpec, precision: str, ckpt: str, micro: int) -> JobSpec:
    changes: dict[str, Any] = {"precision": precision, "grad_ckpt": ckpt, "micro_batch": micro}
    if job.effective_batch is not None and job.micro_batch is None:
        changes["effective_batch"] = job.effective_batch
    elif job.micro_batch is None:
        changes["effective_batch"] = None
    return job.replace(**changes)


@dataclass
class _Grid:
    """What one plan varies and the machinery that predicts a configuration."""

    job: JobSpec
    source: ModelSource
    gpu: GpuSpec | None
    margin: float
    workers: SimulationWorkers
    precisions: list[str]
    ckpts: list[str]
    micro_all: list[int]
    progress: Callable[[str, int, int], None] | None = None
    """Called with (what is being simulated, done, total) as the work goes."""
    _groups: dict[tuple[str, str], tuple[Any, dict[int, MemoryPrediction]]] = field(
        default_factory=dict)
    """Each (precision, checkpointing) group's fitted model and the micro-batches predicted
    from it (:meth:`_predict`)."""

    def say(self, what: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(what, done, total)

    def exact(self, cj: JobSpec, what: str = "") -> PlanRow:
        """Full-size simulation of one configuration (in a warm worker)."""
        self.say(what or "simulating at full size", 0, 1)
        row = self.workers.map(_exact_row, [(cj, self.source, self.gpu, self.margin)])[0]
        self.say(what or "simulating at full size", 1, 1)
        return row

    @property
    def varies(self) -> bool:
        """More than one configuration: a grid, whose groups' rows carry ▲."""
        return len(self.precisions) > 1 or len(self.ckpts) > 1 or len(self.micro_all) > 1

    def rows(self) -> list[PlanRow]:
        """One simulated row when nothing varies, else the extrapolated grid of every group."""
        if not self.varies:
            return [self.exact(_config_job(self.job, self.precisions[0], self.ckpts[0],
                                           self.micro_all[0]))]
        groups = [(p, c) for p in self.precisions for c in self.ckpts]
        what = f"small simulations, {len(groups)} precision × ckpt groups"
        self.say(what, 0, len(groups))
        # the kind of step each micro-batch's row takes (one micro-step or accumulating): the
        # groups simulate only those
        kinds = [(m, (_config_job(self.job, self.precisions[0], self.ckpts[0], m).grad_accum
                      or 1) > 1) for m in self.micro_all]
        jobs = [_config_job(self.job, p, c, 1) for p, c in groups]
        models = self.workers.map(
            _fit_one, [(j, self.source, target_for(self.gpu, j.precision, j.attention), kinds)
                       for j in jobs], on_done=lambda n: self.say(what, n, len(groups)))
        if self.gpu is not None:  # in a worker (the parent builds no model), alone
            hosts = self.workers.map(_host_steps, [[(j, self.source) for j in jobs]])[0]
            for model, (hs, framework_s) in zip(models, hosts, strict=True):
                model.host, model.framework_host_s = hs, framework_s
        rows: list[PlanRow] = []
        for (precision, ckpt), model in zip(groups, models, strict=True):
            rows += self._group_rows(precision, ckpt, model)
        return rows

    def _group_rows(self, precision: str, ckpt: str, model: Any) -> list[PlanRow]:
        """The rows of one (precision, checkpointing) group from its fitted memory model: the
        powers of two, and the largest micro-batch that fits."""
        done: dict[int, MemoryPrediction] = {}
        self._groups[(precision, ckpt)] = (model, done)
        largest = None
        if self.gpu is not None:
            for micro in self.micro_all:  # ascending; device memory grows with the batch
                if self._predict(precision, ckpt, micro)[1].fits:
                    largest = micro
                else:
                    break
        if largest is not None:
            # the ▲ row, which the user reads as the group's answer, states the reserve with
            # expandable segments as a full-size row does (an audit: ▲ rows showed a reserve
            # far above allocated with no word on the setting that lowers it); one full-depth
            # trace per group, not one per row
            self._predict(precision, ckpt, largest, expandable_figure=True)
        shown = [m for m in self.micro_all if m & (m - 1) == 0]
        if largest is not None and largest not in shown:
            shown.append(largest)
        return [self.extrapolated_row(precision, ckpt, micro, largest_fitting=micro == largest)
                for micro in sorted(shown)]

    def _predict(self, precision: str, ckpt: str, micro: int, expandable_figure: bool = False
                 ) -> tuple[JobSpec, MemoryPrediction]:
        """One micro-batch's memory from its group's fitted model (kept for the group's larger
        micro-batches' reserve floor)."""
        job, source, gpu = self.job, self.source, self.gpu
        model, done = self._groups[(precision, ckpt)]
        cj = _config_job(job, precision, ckpt, micro)
        accumulating = (cj.grad_accum or 1) > 1
        p = model.predict(micro, accumulating=accumulating)
        # the model floors the one-process reserved total by the smaller micro-batches';
        # a rank's share of it (FSDP/ZeRO from a one-process trace) is floored here
        floor = max((m.peak_reserved_bytes for b, m in done.items() if b < micro), default=0)
        mem = finish(cj, source, gpu, tensor_peak_bytes=p["peak_allocated_bytes"],
                     reserved_replay_bytes=p["reserved_bytes"],
                     breakdown=p["breakdown"], managed_bytes=p["managed_bytes"],
                     peak_phase=p["peak_phase"], total_params=p["total_params"],
                     matmul_params=p["matmul_params"],
                     packed_4bit_params=p["packed_4bit_params"],
                     trainable_params=p["trainable_params"],
                     sdpa_kernels=model.points[-1].sim.sdpa_kernels,
                     sim_time_s=0.0, how="extrapolated from small simulations",
                     margin=self.margin, phase_breakdowns=p["phase_breakdowns"],
                     per_rank=model.points[0].sim.per_rank,
                     quant_state_bytes=p["quant_state_bytes"], reserved_floor_bytes=floor,
                     # past the card the allocator releases its cache and retries: the row's
                     # full-depth trace replayed at the card's limit, as a simulated row's
                     trace=lambda: model.full_trace(micro, accumulating),
                     host_activations=host_activations_of_row(model, micro)
                     if cj.activation_offload else None,
                     # affine in depth, the same at any micro-batch: fitted as the rest
                     pinned_extra_bytes=model.eval([pinned_extra_bytes(
                         p.sim.info.get("pinned_shards")) for p in model.points], micro),
                     # the embedding or head, or a layer's: the same at every depth
                     largest_trainable_numel=max(p.sim.info.get("largest_trainable_numel", 0)
                                                 for p in model.points),
                     largest_param_bytes=max((p.sim.info["largest_param_bytes"]
                                              for p in model.points
                                              if "largest_param_bytes" in p.sim.info),
                                             default=None),
                     expandable_figure=expandable_figure)
        done[micro] = mem
        return cj, mem

    def extrapolated_row(self, precision: str, ckpt: str, micro: int,
                         largest_fitting: bool = False) -> PlanRow:
        """The row of ``micro`` in its group: memory (predicted once) and speed from the group's
        fitted model."""
        model, done = self._groups[(precision, ckpt)]
        cj, mem = (_config_job(self.job, precision, ckpt, micro), done[micro]) \
            if micro in done else self._predict(precision, ckpt, micro)
        speed = None if self.gpu is None else synced(model.speed(
            DeviceSpeed.from_gpu(self.gpu), cj, _flops_per_token(self.source, mem, cj)), cj,
            mem, self.gpu)
        return PlanRow(cj, mem, "extrapolated", speed, largest_fitting=largest_fitting)

    def verify_pick(self, rows: list[PlanRow], verify: bool, keep_band: float | None = None,
                    current_precision: str | None = None) -> int | None:
        """Re-simulate the pick at full size (the number it is chosen on is then exact, not
        extrapolated), and choose again if the exact number changes the answer.  ``keep_band``
        (a current configuration given): a row of another precision than
        ``current_precision``'s, or a bf16-true row where the current one keeps fp32 weights,
        must beat the fastest row that keeps them by more than this fraction
        (:func:`~trainfit.plan.pick.recommend`, :func:`~trainfit.plan.pick.keep_fp32_weights`)."""
        rec = recommend(rows, keep_band, current_precision)
        for _ in range(MAX_VERIFICATIONS):
            if rec is None or not verify or rows[rec].how == "simulated":
                break
            # In a worker, which has built a model before (warm); verifying the runner-up on
            # the other worker at the same time slowed this one by 33 % (measured: 14.1 s against
            # 10.6 s on 2 cores), so only the pick is re-simulated.
            verified = self.exact(rows[rec].job, "the pick, full size")
            marked = rows[rec].largest_fitting
            verified.largest_fitting = marked and verified.memory.fits is True
            rows[rec] = verified
            if marked and not verified.largest_fitting:
                self.mark_below(rows, verified)
            # the exact number may not fit: choose again
            rec = recommend(rows, keep_band, current_precision)
        return rec

    def mark_below(self, rows: list[PlanRow], dropped: PlanRow) -> None:
        """▲ for the largest candidate micro-batch below ``dropped``'s in its group that fits,
        ``dropped``'s simulation having found it does not: a candidate the grid did not show
        is made a row from the group's model (12 below 18 of 36, not the power of two 4; a
        review: ▲ had been taken off and given to no row); a shown one that does not fit (the
        current run's simulation) is passed over."""
        j = dropped.job
        if (j.precision, j.grad_ckpt) not in self._groups:
            return
        same = fields_but_split(j)
        group = [r for r in rows if fields_but_split(r.job) == same]
        for micro in reversed([m for m in self.micro_all if m < (j.micro_batch or 0)]):
            row = next((r for r in group if r.job.micro_batch == micro), None)
            if row is None:
                row = self.extrapolated_row(j.precision, j.grad_ckpt, micro)
                at = next(i for i, r in enumerate(rows) if r is dropped)
                rows.insert(at, row)
            if row.memory.fits is True:
                row.largest_fitting = True
                return
            dropped = row

    def may_join(self, current: PlanRow) -> bool:
        """The current configuration can be a row of the grid: the grid varies the micro-batch
        and predicted this one (a divisor of the effective batch it does not show, 3 of 12);
        with the micro-batch fixed (``--micro-batch``, a job file's ``micro_batch:``) the
        current split is compared against, not planned."""
        return len(self.micro_all) > 1 and current.job.micro_batch in self.micro_all

    def ladder(self, rows: list[PlanRow]) -> list[Any]:
        """Nothing fits: the memory-saving ladder from the smallest configuration."""
        def evaluate(cj: JobSpec) -> tuple[int, float | None, bool | None]:
            r = self.exact(cj, "a ladder rung, full size")
            return (r.memory.peak_device_bytes, r.speed.tokens_per_s if r.speed else None,
                    r.memory.fits)
        return build_ladder(smallest_row(rows).job, evaluate)


def plan(job: JobSpec, source: ModelSource, gpu: GpuSpec | None, margin: float = DEFAULT_MARGIN,
         verify: bool = True, dataset_tokens: int | None = None, epochs: float | None = None,
         ladder: bool = True, current: JobSpec | None = None,
         progress: Callable[[str, int, int], None] | None = None) -> PlanResult:
    """``current``: the configuration the user runs now; it is simulated at full size and the
    pick is stated against it (the fields to change, the predicted speed-up). ``progress``:
    called with (what is being simulated, done, total) as the work goes."""
    t0 = time.perf_counter()
    check_inputs(job, gpu, margin, dataset_tokens, epochs)
    if job.padding_free and source.task != "causal-lm":
        make_batch(source, 1, 1, packed=True)  # its one-line refusal, before any simulation
    planned, not_planned = grid_precisions(gpu, job)
    if "bf16-true" in planned and not job.precision and fsdp_keeps_fp32_weights(job, source):
        planned.remove("bf16-true")
        not_planned.append("bf16-true")
    if "bf16-true" in not_planned and current is not None and current.precision == "bf16-true":
        # ZeRO's one bf16 mode: the current configuration is its amp-bf16 row, not a change to
        # it (a review: its row was hidden and "bf16-true → amp-bf16" offered as a change)
        current = current.replace(precision="amp-bf16")
    precisions = [job.precision] if job.precision else step_precisions(job, planned)
    not_planned = [] if job.precision else not_planned
    # a custom module without gradient_checkpointing_enable() has only "off" to offer
    can_ckpt = getattr(source.config, "supports_grad_ckpt", True)
    ckpts = [job.grad_ckpt] if job.grad_ckpt else (["off", "full"] if can_ckpt else ["off"])
    workers = SimulationWorkers(len(precisions) * len(ckpts))
    try:
        grid = _Grid(job, source, gpu, margin, workers, precisions, ckpts, _micro_candidates(job),
                     progress)
        rows = grid.rows()
        cur_row = grid.exact(current, "your current configuration, full size") \
            if current is not None else None
        if cur_row is not None:
            for dropped in take_exact_row(rows, cur_row):
                grid.mark_below(rows, dropped)
            if grid.may_join(cur_row):
                add_current_row(rows, cur_row)
        band = None if gpu is None else speed_band_for(job.ranks, bool(job.compile))
        keep_band = band.median_abs_error if band is not None and cur_row is not None else None
        current_precision = cur_row.job.precision if cur_row is not None else None
        rec = grid.verify_pick(rows, verify, keep_band, current_precision)
        kept = keep_fp32_weights(rows, rec, keep_band) if keep_band is not None else None
        if grid.varies:
            mark_largest_fitting(rows)
        if rec is not None:
            rows[rec].recommended = True
        rank_rows(rows, sort_key)
        mark_shown(rows)
        if cur_row is not None:
            show_current(rows, cur_row)
        rungs = grid.ladder(rows) if rec is None and ladder and gpu is not None and rows else []
        first = rows[0].memory if rows else None
        return PlanResult(
            model=source.name, model_origin=source.origin, model_note=source.note,
            gpu=gpu.name if gpu else None, gpu_display_name=gpu.display_name if gpu else None,
            gpu_memory_source=gpu.memory_source if gpu else None,
            gpu_memory_bytes=gpu.memory_bytes if gpu else None,
            margin=margin, total_params=first.total_params if first else 0,
            trainable_params=first.trainable_params if first else 0, rows=rows,
            recommended_index=rec,
            smallest_device_bytes=min((r.memory.peak_device_bytes for r in rows), default=None),
            plan_time_s=time.perf_counter() - t0, ladder=rungs, dataset_tokens=dataset_tokens,
            epochs=epochs, current=cur_row, precisions_not_planned=not_planned,
            assumptions=plan_assumptions(job, _kernel_row(rows, rec).memory.sdpa_kernels
                                         if rows else {},
                                         kernels_by_precision=_kernels_by_precision(rows),
                                         source=source),
            offload=offload_check(rows[rec] if rec is not None else None, gpu),
            speed_band=band, numerics_kept=kept,
            **_link(gpu, job.ranks),
            **versus(cur_row, rows[rec] if rec is not None else None))
    finally:
        workers.close()


def _kernel_row(rows: list[PlanRow], rec: int | None) -> PlanRow:
    """The row whose SDPA kernels the header names: the pick, or the smallest configuration."""
    return rows[rec] if rec is not None else smallest_row(rows)


def _kernels_by_precision(rows: list[PlanRow]) -> dict[str, list[str]]:
    """Every row's SDPA kernels, by precision, in the order the rows first call them."""
    out: dict[str, list[str]] = {}
    for r in rows:
        seen = out.setdefault(r.job.precision, [])
        seen.extend(k for k in r.memory.sdpa_kernels if k not in seen)
    return out


def _link(gpu: GpuSpec | None, ranks: int) -> dict[str, Any]:
    """The link the rows' synchronisation was timed over; none where it was not timed (one rank,
    no GPU, GeForce cards without peer-to-peer, more ranks than the catalog's link joins: the
    rows say why their speed is unknown)."""
    if gpu is None or ranks <= 1 or untimed_link(gpu, ranks) is not None:
        return {}
    return {"link": gpu.interconnect, "link_gbs": gpu.interconnect_gbs}
