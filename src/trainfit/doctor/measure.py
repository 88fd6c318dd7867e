"""Measure a trainfit job: the real ``train_step`` with the doctor's clock as its observer, the
data wait and host→device copy timed around the loader, one step profiled after the window.

The same model is reused across rounds (before, after, before, after …) of one doctor run: only
its structure (precision, checkpointing …) rebuilds it. Weights drift with the steps; speed does
not depend on their values.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainfit.data import (
    Collate,
    SampleOrder,
    TokenData,
    load_tokenizer,
    micro_batch_ids,
    read_rows,
    tokenize_rows,
)
from trainfit.data.loader import _Samples
from trainfit.doctor.fixes import (
    DynamicPadCollate,
    MemmapTokens,
    TokenFile,
    length_grouped_batches,
    pretokenize,
)
from trainfit.doctor.lazy_data import LazyRows
from trainfit.doctor.opstats import start_profile, stop_profile
from trainfit.doctor.split import (
    OTHER,
    PhaseClock,
    Split,
    StepRecord,
    device_idle_s,
    input_fraction,
    median_counter,
    median_hook_calls,
    median_split,
)
from trainfit.doctor.watch import HostSummary, HostWatch
from trainfit.engine.step import train_step
from trainfit.job import JobSpec
from trainfit.memory.limit import LimitTracker
from trainfit.model.runtime import RealWorkload, build_real
from trainfit.model.source import ModelSource, max_positions


@dataclass
class DataSetup:
    mode: str
    """lazy (tokenize in __getitem__) | eager (trainfit's in-memory tokens) | memmap (token file)"""
    dataset: torch.utils.data.Dataset
    collate: Callable[[list[Any]], dict[str, torch.Tensor]]
    lengths: np.ndarray | None
    token_file: TokenFile | None = None
    length_grouped: bool = False


@dataclass(kw_only=True)
class Round:
    """One measured run of a configuration (``steps`` steps after ``warmup``)."""

    label: str
    job: JobSpec
    data_mode: str
    records: list[StepRecord]
    split: Split
    tokens_per_step: float
    """Non-padding input tokens per optimizer step (measured from the batches)."""
    positions_per_step: float
    """Positions computed per step, padding included (what the FLOPs are spent on)."""
    tokens_per_s: float
    data_wait_fraction: float
    """Median over the steps of (data wait + host→device copy) / step time."""
    host: HostSummary
    profile: dict[str, Any] | None
    hook_calls_per_step: float
    device_peak_reserved_bytes: int | None = None
    """On a GPU: ``torch.cuda.max_memory_reserved`` over the round (what the card held for the
    tensors, measured); None on the CPU, where the process's peak RSS is the memory peak."""
    extra: dict[str, Any] = field(default_factory=dict)


class _Observer:
    """train_step's observer → the clock's base phase."""

    def __init__(self, clock: PhaseClock) -> None:
        self.clock = clock

    def set_phase(self, phase: str, micro_step: int = 0) -> None:
        if self.clock.active:
            self.clock.set_base(OTHER if phase == "idle" else phase)


class JobRunner:
    def __init__(self, job: JobSpec, source: ModelSource, device: torch.device, *, data_path: str,
                 seed: int = 0) -> None:
        self.job = job
        self.source = source
        self.device = device
        self.data_path = data_path
        self.seed = seed
        self.tok = load_tokenizer(job.tokenizer, source.name, source.origin, int(source.config.vocab_size),
                                  job.trust_remote_code)
        self._wl_key: tuple | None = None
        self._wl: RealWorkload | None = None
        self._data: dict[str, DataSetup] = {}

    # --- the model ----------------------------------------------------------------------------
    def workload(self, job: JobSpec) -> RealWorkload:
        key = (job.model, job.method, job.lora_r, tuple(job.lora_targets), job.precision, job.grad_ckpt,
               job.attention, job.lm_head_chunk, job.optimizer, job.optimizer_impl, job.compile)
        if key != self._wl_key:
            self._wl = None
            gc.collect()
            self._wl = build_real(job, self.source, self.device, seed=self.seed, lr=job.lr)
            if job.compile:
                self._wl.step_model = torch.compile(self._wl.model)
            self._wl_key = key
        assert self._wl is not None
        return self._wl

    # --- the data -----------------------------------------------------------------------------
    def data(self, mode: str, job: JobSpec) -> DataSetup:
        if mode in self._data:
            return self._data[mode]
        task = self.source.task
        if mode == "lazy":
            ds = LazyRows(self.data_path, self.tok, job.seq_len, job.text_field)
            setup = DataSetup("lazy", ds, Collate(ds, task, job.padding_free),  # type: ignore[arg-type]
                              None)
        elif mode == "memmap":
            tf = pretokenize(self.tok, self.data_path, seq_len=job.seq_len, task=task,
                             text_field=job.text_field, packing=job.packing,
                             max_positions=max_positions(self.source))
            mm = MemmapTokens(tf)
            collate: Callable[..., Any] = Collate(mm, task,  # type: ignore[arg-type]
                                                  job.padding_free)
            setup = DataSetup("memmap", mm, collate, mm.lengths, token_file=tf)
        elif mode == "memmap-grouped":
            base = self.data("memmap", job)
            assert isinstance(base.dataset, MemmapTokens)
            setup = DataSetup("memmap-grouped", base.dataset,
                              DynamicPadCollate(base.dataset.pad_id, job.seq_len), base.lengths,
                              token_file=base.token_file, length_grouped=True)
        else:
            td: TokenData = tokenize_rows(read_rows(self.data_path), self.tok, seq_len=job.seq_len,
                                          task=task, text_field=job.text_field, packing=job.packing,
                                          path=self.data_path, max_positions=max_positions(self.source))
            setup = DataSetup("eager", _Samples(td), Collate(td, task, job.padding_free),
                              td.lengths())
        self._data[mode] = setup
        return setup

    # --- the live tensor bytes a CPU memory limit caps ------------------------------------------
    def live_peak_bytes(self, job: JobSpec, data: DataSetup) -> int:
        """The peak of live tensor bytes over one optimizer step of ``job`` (measured by plan's
        tracker): what a job file's ``memory_limit`` caps on the CPU — tune wrote it in these
        bytes and train enforces it so. The process's RSS (interpreter, libraries, allocator
        caches) read against it hid a needless-checkpointing finding worth 1.15× (an audit).
        Counted: weights, buffers, optimizer states that exist, the step's batches and every
        tensor the step makes. Untimed: the tracker's dispatch would be in the round's times."""
        wl = self.workload(job)
        micro = job.micro_batch or 1
        per_step = micro * (job.grad_accum or 1)
        order = SampleOrder(len(data.dataset), seed=self.seed)  # type: ignore[arg-type]

        def batches(step: int) -> list[dict[str, torch.Tensor]]:
            out = []
            for ids in micro_batch_ids(order, step * per_step, per_step, micro):
                b = data.collate([data.dataset[i] for i in ids])
                b.pop("sample_ids", None)
                out.append(b)
            return out

        def step(bs: list[dict[str, torch.Tensor]], observer: Any) -> None:
            train_step(wl.step_model, wl.optimizer, iter(bs), grad_accum=job.grad_accum or 1,
                       autocast=wl.autocast, max_grad_norm=job.max_grad_norm, scaler=wl.scaler,
                       observer=observer, grads_to_none=job.grads_to_none)

        if not wl.optimizer.state:
            # a workload not stepped yet (one built for the configuration a fix would run):
            # its states appear in its first step's optimizer phase, after the forward and
            # backward, which then peak without them — the steady step is the second (a
            # review: the fresh step read 3 % low, and a limit the run then broke was taken)
            step(batches(0), None)
        tracker = LimitTracker(None)
        tracker.track_model(wl.model, wl.optimizer)
        steady = batches(1)
        for b in steady:
            for v in b.values():
                tracker.track(v, "buffers")
        with tracker:
            step(steady, tracker)
        return int(tracker.peak.peak_bytes)

    # --- one round ----------------------------------------------------------------------------
    def measure(self, job: JobSpec, data: DataSetup, *, steps: int, warmup: int = 2, observe: bool = True,
                profile: bool = True, label: str = "") -> Round:
        wl = self.workload(job)
        cuda = self.device.type == "cuda"
        micro = job.micro_batch or 1
        accum = job.grad_accum or 1
        per_step = micro * accum
        n_steps = warmup + steps + (1 if profile else 0)
        order = SampleOrder(len(data.dataset), seed=self.seed)  # type: ignore[arg-type]
        step_ids = [micro_batch_ids(order, s * per_step, per_step, micro) for s in range(n_steps)]
        if data.length_grouped and data.lengths is not None:
            step_ids = [length_grouped_batches(data.lengths, [i for m in ids for i in m], micro)
                        for ids in step_ids]
        kw: dict[str, Any] = {}
        if job.num_workers > 0:
            kw = {"prefetch_factor": job.prefetch_factor, "persistent_workers": job.persistent_workers}
        loader = torch.utils.data.DataLoader(
            data.dataset, batch_sampler=[m for s in step_ids for m in s], collate_fn=data.collate,
            num_workers=job.num_workers, pin_memory=cuda and job.pin_memory, **kw)
        clock = PhaseClock()
        obs = _Observer(clock) if observe else None

        def batches(it: Iterator[dict[str, torch.Tensor]], n: int) -> Iterator[dict[str, torch.Tensor]]:
            for _ in range(n):
                if clock.active:
                    clock.push("data_wait")
                b = next(it)
                if clock.active:
                    clock.pop()
                    mask = b.get("attention_mask")
                    clock.count("tokens", int(mask.sum()) if mask is not None else b["input_ids"].numel())
                    clock.count("positions", b["input_ids"].numel())
                    clock.push("h2d_copy")
                b.pop("sample_ids")
                b = {k: v.to(self.device, non_blocking=cuda) for k, v in b.items()}
                if clock.active:
                    clock.pop()
                yield b

        records: list[StepRecord] = []
        prof_stats = None
        if cuda:  # the round's own peak, not the model loading's or an earlier round's
            torch.cuda.reset_peak_memory_stats(self.device)
        it = iter(loader)
        with HostWatch(interval_s=1.0) as watch:
            for s in range(n_steps):
                measured = warmup <= s < warmup + steps
                if s == warmup:
                    clock.start()
                    clock.active = observe
                prof = start_profile(cuda) if profile and s == warmup + steps else None
                t0 = time.perf_counter()
                train_step(wl.step_model, wl.optimizer, batches(it, len(step_ids[s])), grad_accum=accum,
                           autocast=wl.autocast, max_grad_norm=job.max_grad_norm, scaler=wl.scaler,
                           observer=obs, grads_to_none=job.grads_to_none)
                if cuda:
                    torch.cuda.synchronize(self.device)
                if prof is not None:
                    prof_stats = stop_profile(prof, cuda)
                elif measured:
                    if observe:
                        records.append(clock.end_step())
                    else:
                        records.append(StepRecord({}, time.perf_counter() - t0))
                if s == warmup + steps - 1:
                    clock.active = False
        del it, loader
        host = watch.summary()
        device_peak = int(torch.cuda.max_memory_reserved(self.device)) if cuda else None
        split = median_split(records, idle_s=device_idle_s(prof_stats, records))
        tokens = median_counter(records, "tokens") if observe else float(per_step * job.seq_len)
        positions = median_counter(records, "positions") if observe else float(per_step * job.seq_len)
        return Round(label=label, job=job, data_mode=data.mode, records=records, split=split,
                     tokens_per_step=tokens, positions_per_step=positions,
                     tokens_per_s=tokens / split.step_time_s if split.step_time_s > 0 else 0.0,
                     data_wait_fraction=input_fraction(split), host=host,
                     profile=prof_stats,
                     hook_calls_per_step=median_hook_calls(records),
                     device_peak_reserved_bytes=device_peak)


def resolve_relative(value: str | None, base: Path) -> str | None:
    """A path in a job file: as given when it exists from here, else relative to the file."""
    if value is None or Path(value).exists() or Path(value).is_absolute():
        return value
    alt = base / value
    return str(alt) if alt.exists() else value


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


def sampler_fraction(h: HostSummary) -> float:
    """The host sampler's own CPU time over the wall time it watched (part of doctor's overhead)."""
    return h.sampler_cpu_s / h.wall_s if h.wall_s > 0 else 0.0
