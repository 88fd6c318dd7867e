"""Probe: a few real training steps of the real model on the real data, measured.

First the optimizer states are created by one optimizer step on zero gradients (as the simulation
does: the first real step only matters for creating them), then one steady-state step runs under
the memory meter — on CUDA the allocator's own peak
statistics, on CPU the live-bytes tracker of ``plan`` with a limit that raises the same
``torch.OutOfMemoryError`` a GPU would. The following ``timed_steps`` run unmetered and are timed
(median, with the spread). Model weights are restored afterwards; the optimizer is rebuilt.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from trainfit.data.dataset import TokenData
from trainfit.data.loader import (
    LoaderKnobs,
    SampleOrder,
    make_loader,
    micro_batch_ids,
    step_weights,
)
from trainfit.engine.dist import Dist
from trainfit.engine.step import train_step
from trainfit.job import JobSpec
from trainfit.memory.limit import LimitTracker
from trainfit.memory.ranks import DDP_BUCKET_FACTOR
from trainfit.model.runtime import RealWorkload, build_real, scaler_for, use_job_allocator
from trainfit.model.source import ModelSource
from trainfit.model.workload import make_optimizer
from trainfit.monitor.host import process_tree_rss_bytes
from trainfit.tune.result import Measured, ProbeResult


def _own_tree_rss_bytes() -> int:
    """RSS of this process and its data-loader workers (measured)."""
    return process_tree_rss_bytes(os.getpid()) or 0


_AGREED = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "host_rss_bytes",
           "step_time_s", "step_time_spread_s", "data_wait_fraction", "compile_time_s",
           "alloc_retries")
"""Measured fields all ranks agree on (the maximum over ranks)."""


def _alloc_retries(device: torch.device) -> int:
    """The caching allocator's count of cudaMalloc failures it survived by releasing its cache,
    since the meter started (which resets the allocator's accumulated statistics)."""
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


def _another_rank_oom() -> torch.OutOfMemoryError:
    err = torch.OutOfMemoryError("another rank ran out of memory in the metered step")
    err.phase = None  # type: ignore[attr-defined]
    return err


class Probe:
    """Holds one built workload per model structure and measures configurations on it."""

    def __init__(self, source: ModelSource, data: TokenData, device: torch.device, *,
                 memory_limit_bytes: int | None = None, max_host_ram_bytes: int | None = None,
                 seed: int = 0, rank: int = 0) -> None:
        self.source = source
        self.data = data
        self.device = device
        self.memory_limit_bytes = memory_limit_bytes
        self.max_host_ram_bytes = max_host_ram_bytes
        self.seed = seed

        self.dist = Dist.from_env()
        self.rank = self.dist.rank if self.dist.world > 1 else rank
        self._key: tuple | None = None
        self._wl: RealWorkload | None = None
        self._snapshot: dict[str, torch.Tensor] = {}

    def _workload(self, job: JobSpec) -> RealWorkload:
        key = (job.model, job.method, job.lora_r, tuple(job.lora_targets), job.precision,
               job.grad_ckpt, job.attention, job.lm_head_chunk, job.compile)
        if key != self._key:
            self._wl = None
            self._snapshot = {}
            gc.collect()
            use_job_allocator(job, self.device)
            self._wl = build_real(job, self.source, self.device, seed=self.seed)
            if self.dist.world > 1:
                self._wl.step_model = self.dist.wrap(self._wl.model, self.device)
            if job.compile:  # the DDP wrapper compiled, as train does
                self._wl.step_model = torch.compile(self._wl.step_model)
            self._key = key
            # the copy the weights are restored from lives on the host: on the device it would be
            # in every probe's measured peak (a full fine-tune's trainable weights a second time)
            self._snapshot = {n: p.detach().to("cpu", copy=True)
                              for n, p in self._wl.model.named_parameters() if p.requires_grad}
        assert self._wl is not None
        return self._wl

    def _restore(self, job: JobSpec) -> None:
        wl = self._wl
        if wl is None:
            return
        wl.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for n, p in wl.model.named_parameters():
                if n in self._snapshot:
                    p.copy_(self._snapshot[n])
        # an optimizer stepped from the backward pass must stop stepping these parameters now,
        # not when the garbage collector gets to it
        getattr(wl.optimizer, "remove_hooks", lambda: None)()
        wl.optimizer = self._optimizer(job)
        wl.scaler = scaler_for(job, self.device)  # a fresh loss scale: no probe inherits one

    def _optimizer(self, job: JobSpec) -> torch.optim.Optimizer:
        """A fresh optimizer of ``job``'s kind over the workload's trainable parameters."""
        assert self._wl is not None
        return make_optimizer(job, [p for p in self._wl.model.parameters() if p.requires_grad],
                              simulate=False)

    def agree(self, res: ProbeResult) -> ProbeResult:
        """Under torchrun every rank probes; all take the same decision: an OOM anywhere is an
        OOM everywhere, and every measured field the search reads is the worst rank's."""
        if self.dist.world == 1:
            return res
        # the worst status of all ranks (ok < over-host-ram < oom) is everyone's
        worst = ("ok", "over-host-ram", "oom")
        status_code = torch.tensor([float(worst.index(res.status))])
        torch.distributed.all_reduce(status_code, op=torch.distributed.ReduceOp.MAX)
        status = worst[int(status_code.item())]
        if status != "ok":
            if res.status != status:
                return ProbeResult(status=status, measured=None, probe_time_s=res.probe_time_s,
                                   detail=f"another rank: {status}")
            return res
        m = res.measured
        assert m is not None
        # every field a decision reads is the worst rank's, so all ranks take the same next step
        # of the search (fits, faster, noisy, waits for data); None (not measured: the same on
        # every rank) travels as -1
        vals = [getattr(m, f) for f in _AGREED]
        t = torch.tensor([-1.0 if v is None else float(v) for v in vals], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        own_step = m.step_time_s
        for f, v, v_max in zip(_AGREED, vals, t.tolist(), strict=True):
            if v is not None:
                setattr(m, f, int(v_max) if isinstance(v, int) else v_max)
        if own_step and m.step_time_s:
            scale = own_step / m.step_time_s
            m.tokens_per_s = (m.tokens_per_s or 0.0) * scale
            m.samples_per_s = (m.samples_per_s or 0.0) * scale
        return res

    def run(self, job: JobSpec, timed_steps: int = 3) -> ProbeResult:
        """``timed_steps`` 0: a memory-only probe (one metered step)."""
        t0 = time.perf_counter()
        loader_knobs = LoaderKnobs.from_job(job)
        wl = self._workload(job)
        self._restore(job)
        try:
            res = self._measure(job, wl, loader_knobs, timed_steps)
        except torch.OutOfMemoryError as err:
            res = ProbeResult(status="oom", measured=None, oom_phase=getattr(err, "phase", None),
                              detail=str(err).splitlines()[0][:200])
        finally:
            self._restore(job)
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        res.probe_time_s = time.perf_counter() - t0
        return self.agree(res)

    def _over_host_ram(self, rss: int) -> ProbeResult | None:
        if self.max_host_ram_bytes is None or rss <= self.max_host_ram_bytes:
            return None
        return ProbeResult(status="over-host-ram", measured=None,
                           detail=f"host RSS {rss / 2**30:.2f} GiB measured > "
                                  f"--max-host-ram {self.max_host_ram_bytes / 2**30:.2f} GiB")

    def _batches(self, loader: torch.utils.data.DataLoader, waits: list[float],
                 tracker: LimitTracker | None) -> Iterator[dict[str, torch.Tensor]]:
        it = iter(loader)
        non_blocking = self.device.type == "cuda"
        while True:
            t = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                return
            b.pop("sample_ids")
            b = {k: v.to(self.device, non_blocking=non_blocking) for k, v in b.items()}
            waits.append(time.perf_counter() - t)
            if tracker is not None:
                for v in b.values():
                    tracker.track(v, "buffers")
            yield b

    def _start_meter(self, job: JobSpec, wl: RealWorkload, tracker: LimitTracker | None,
                     hooks: list[Any], keep: list[torch.Tensor]) -> None:
        """What exists before the step is counted (weights, buffers and, under DDP, its gradient
        buckets), gradients are booked as such, and the optimizer states are created as the first
        real step creates them (values restored after the probe). Can run out of memory."""
        if tracker is None:
            torch.cuda.synchronize(self.device)
            # the step's own reserve, as plan predicts it: not the cached blocks that building
            # the model (or an earlier probe) left in the allocator
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            torch.cuda.reset_accumulated_memory_stats(self.device)  # num_alloc_retries from 0
        else:
            tracker.track_model(wl.model)  # the states: made below, as the first step makes them
            if self.dist.world > 1:  # _workload wrapped the model in DDP
                # DDP (gradient_as_bucket_view=False) holds a flat copy of every gradient in its
                # buckets, allocated when it wraps the model — before the tracker, which cannot see
                # them: a meta tensor of their size stands in (what plan adds: DDP_BUCKET_FACTOR)
                grad_bytes = sum(p.numel() * p.element_size()
                                 for p in wl.model.parameters() if p.requires_grad)
                bucket_bytes = int(grad_bytes * DDP_BUCKET_FACTOR)
                keep.append(torch.empty(bucket_bytes, dtype=torch.uint8, device="meta"))
                tracker.track(keep[-1], "data_parallel")
            hooks += [p.register_post_accumulate_grad_hook(
                lambda p: tracker.reclassify(p.grad, "gradients"))
                for p in wl.model.parameters() if p.requires_grad]
            tracker.set_phase("optimizer")
        with tracker if tracker is not None else contextlib.nullcontext():
            for p in wl.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
            wl.optimizer.step()
            wl.optimizer.zero_grad(set_to_none=job.grads_to_none)

    def _measure(self, job: JobSpec, wl: RealWorkload, knobs: LoaderKnobs, timed_steps: int
                 ) -> ProbeResult:
        warm = 1 if (job.compile and timed_steps) else 0  # the compiling step, timed apart
        tracker = None if self.device.type == "cuda" else LimitTracker(self.memory_limit_bytes)
        steps = self._steps(job, wl, knobs, 1 + warm + timed_steps, tracker)
        hooks: list[Any] = []
        keep: list[torch.Tensor] = []
        times: list[float] = []
        step_waits: list[float] = []
        compile_step_s = None
        try:
            rss = max(_own_tree_rss_bytes(), self._metered_step(job, wl, steps, tracker, hooks, keep))
            many = self.dist.world > 1
            for s in range(1, steps.count):
                # one rank alone leaving the loop would leave the others in the next step's
                # all-reduce: under torchrun the host RAM is judged after the steps (agree())
                over = None if many else self._over_host_ram(rss)
                if over is not None:
                    return over
                n_wait = len(steps.waits)
                dt = steps.step(s, wl.step_model, None)
                rss = max(rss, _own_tree_rss_bytes())
                if s == 1 and warm:
                    compile_step_s = dt
                else:
                    times.append(dt)
                    step_waits.append(sum(steps.waits[n_wait:]))
        finally:
            for h in hooks:
                h.remove()
            steps.close()  # its loader iterator goes now (workers too, unless persistent)
        over = self._over_host_ram(rss)
        if over is not None:
            return over
        alloc, reserved, device_used = self._peaks(tracker)
        retries = None if tracker is not None else _alloc_retries(self.device)
        if not times:
            return ProbeResult(status="ok", measured=Measured(
                peak_allocated_bytes=alloc, peak_reserved_bytes=reserved,
                peak_device_bytes=device_used, host_rss_bytes=rss, step_time_s=None,
                step_time_spread_s=None, tokens_per_s=None, samples_per_s=None,
                data_wait_fraction=None, alloc_retries=retries))
        med = statistics.median(times)
        tokens = steps.tokens_per_step()
        wait_frac = statistics.median([w / t for w, t in zip(step_waits, times, strict=True)])
        return ProbeResult(status="ok", measured=Measured(
            peak_allocated_bytes=alloc, peak_reserved_bytes=reserved, peak_device_bytes=device_used,
            host_rss_bytes=rss, step_time_s=med, step_time_spread_s=max(times) - min(times),
            tokens_per_s=tokens / med, samples_per_s=steps.per_step / med,
            data_wait_fraction=wait_frac, step_times_s=times, alloc_retries=retries,
            compile_time_s=None if compile_step_s is None else max(compile_step_s - med, 0.0)))

    def _metered_step(self, job: JobSpec, wl: RealWorkload, steps: _Steps,
                      tracker: LimitTracker | None, hooks: list[Any], keep: list[torch.Tensor]
                      ) -> int:
        """Step 0 under the memory meter; every rank agrees on an OOM. Returns the host RSS after.

        Under torchrun the meter's start and the metered step — where an OOM is expected — run
        on the unwrapped module: DDP's collectives (buffer broadcast in forward, gradient
        all-reduce in backward) would leave the other ranks waiting in them forever when one
        rank ran out of memory halfway (nothing would ever join). Without them every rank
        reaches the agreement that follows. The peak is DDP's: its all-reduce adds no tensor
        (its buckets are counted above). The timed steps then run through DDP. (A compiled model
        keeps its DDP wrapper — compiling a second, local copy would double the compile time —
        so a one-rank OOM there is not covered; stated in the README.)"""
        many = self.dist.world > 1
        metered_model = wl.model if many and not job.compile else wl.step_model
        oom: torch.OutOfMemoryError | None = None
        try:
            self._start_meter(job, wl, tracker, hooks, keep)
            with tracker if tracker is not None else contextlib.nullcontext():
                steps.step(0, metered_model, tracker)
        except torch.OutOfMemoryError as err:
            err.phase = tracker.phase if tracker is not None else None  # type: ignore[attr-defined]
            if not many:
                raise
            oom = err
        if many and self.dist.any(oom is not None):
            raise oom or _another_rank_oom()
        return _own_tree_rss_bytes()

    def _steps(self, job: JobSpec, wl: RealWorkload, knobs: LoaderKnobs, count: int,
               tracker: LimitTracker | None) -> _Steps:
        """The probe's ``count`` optimizer steps (a subclass probes another step source: the
        user's own trainer, trainfit.script.probe)."""
        return _Steps(self, job, wl, knobs, count, tracker)

    def _peaks(self, tracker: LimitTracker | None) -> tuple[int, int | None, int | None]:
        """(allocated, reserved, device) peaks: CUDA's allocator statistics and cudaMemGetInfo;
        on CPU the tracked live bytes (no reserved or device level there)."""
        if tracker is None:
            alloc = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
            return alloc, reserved, self._device_peak(reserved)
        return tracker.peak.peak_bytes, None, None

    def _device_peak(self, peak_reserved: int) -> int:
        """This process's peak on the card, as nvidia-smi's per-process column would show it at
        the reserved peak: the peak reserve plus what the process holds outside PyTorch's
        allocator (CUDA context, other libraries), read from NVML now. The card's used memory
        (total − free) is the fallback where NVML cannot tell our processes apart: it counts
        other processes' memory too (a review: on a shared card the plan then looked 2× under),
        and is no peak."""
        from trainfit.monitor.local_gpu import own_gpu_bytes

        uuid = str(getattr(torch.cuda.get_device_properties(self.device), "uuid", ""))
        ours = own_gpu_bytes(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else None
        if ours is not None:
            return peak_reserved + max(ours - torch.cuda.memory_reserved(self.device), 0)
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free


class _Steps:
    """A probe's optimizer steps over its own sample order: the batches in order, each step's
    loss weights, the time of each step and the data waits inside it."""

    def __init__(self, probe: Probe, job: JobSpec, wl: RealWorkload, knobs: LoaderKnobs,
                 count: int, tracker: LimitTracker | None) -> None:
        self.probe, self.job, self.wl, self.count = probe, job, wl, count
        self.micro = job.micro_batch or 1
        self.accum = job.grad_accum or 1
        self.per_step = self.micro * self.accum * job.ranks
        self.order = SampleOrder(len(probe.data), seed=probe.seed)
        self.cuda = probe.device.type == "cuda"
        self.ids = [micro_batch_ids(self.order, s * self.per_step, self.per_step, self.micro,
                                    probe.rank, job.ranks) for s in range(count)]
        loader = make_loader(probe.data, probe.source.task, [m for s in self.ids for m in s],
                             knobs, pin=self.cuda, packed=job.padding_free)
        self.waits: list[float] = []
        # the batches are tensors of the step: the CPU meter counts them (as buffers)
        self.batches = probe._batches(loader, self.waits, tracker)

    def step(self, s: int, model: Any, observer: LimitTracker | None) -> float:
        """Run step ``s`` of the order on ``model``; its wall time (CUDA: synchronised)."""
        p, job = self.probe, self.job
        w = step_weights(p.data, self.order, s * self.per_step, self.per_step, self.micro,
                         p.source.task, p.rank, job.ranks)
        gen = (next(self.batches) for _ in self.ids[s])
        t = time.perf_counter()
        train_step(model, self.wl.optimizer, gen, grad_accum=self.accum, autocast=self.wl.autocast,
                   max_grad_norm=job.max_grad_norm, scaler=self.wl.scaler, observer=observer,
                   grads_to_none=job.grads_to_none, loss_weights=w)
        if self.cuda:
            torch.cuda.synchronize(p.device)
        return time.perf_counter() - t

    def tokens_per_step(self) -> float:
        """Positions computed per optimizer step (the tokens of tokens/s)."""
        return self.per_step * self.probe.data.seq_len

    def close(self) -> None:
        self.batches.close()
