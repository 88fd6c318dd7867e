"""The sampler: a thread that reads the GPUs (NVML) and the host (psutil) every interval, merges the step
metrics the training loop recorded since the previous sample, and writes one row per GPU to the log.

Compute apart from display: this module measures and logs; :mod:`trainfit.monitor.view` renders.
The row columns are the ``monitor.jsonl`` contract of ``docs/json-formats.md`` (:data:`COLUMNS`).

Step-metric columns describe the latest window of steps recorded before the sample, named by ``step``:
``tokens_per_s`` = Σ tokens / Σ step_time_s over the window's steps, ``samples_per_s`` likewise,
``data_wait_fraction`` = Σ data_wait_s / Σ step_time_s, ``loss`` and ``mfu`` the latest recorded, the peaks
the largest recorded. A sample with no step finished since the previous one repeats the previous window's
values (same ``step``): a step longer than the interval is not an idle GPU. While the run says no step
runs (:meth:`Sampler.pause_rates`: an evaluation, a checkpoint save) the rates are null instead: no
tokens are trained then. Steps recorded without ``step_time_s`` fall back to the wall time between
samples for the rates.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from trainfit import json_text
from trainfit.monitor import view
from trainfit.monitor.host import HostProbe, process_alive, process_tree
from trainfit.monitor.logfile import idle_s, is_a_log, last_byte, last_time_s
from trainfit.monitor.nvml import GpuReading, Nvml
from trainfit.monitor.view import render

if TYPE_CHECKING:
    from trainfit.monitor.tensorboard import TensorboardScalars

STEP_COLUMNS = ("step", "loss", "tokens_per_s", "samples_per_s", "mfu", "data_wait_fraction",
                "peak_allocated_bytes", "peak_reserved_bytes")
GPU_COLUMNS = ("gpu_index", "gpu_util_percent", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
               "gpu_power_w", "gpu_sm_clock_mhz", "process_gpu_memory_bytes")
HOST_COLUMNS = ("host_ram_used_bytes", "host_ram_total_bytes", "host_swap_used_bytes", "process_rss_bytes",
                "host_cpu_percent")
COLUMNS: tuple[str, ...] = ("time_s", *STEP_COLUMNS, *GPU_COLUMNS, *HOST_COLUMNS)
RATE_COLUMNS = ("tokens_per_s", "samples_per_s", "mfu", "data_wait_fraction")
"""The step columns that are rates of training: null while the run says no step runs."""
LOG_SUFFIXES = (".jsonl", ".csv")
MAX_INTERVAL_S = 86400.0
"""A day: a longer wait overflows the sampler's timer (``--interval inf`` raised OverflowError
in its thread and the command exited 0 with no sample)."""


class MonitorError(ValueError):
    """Bad monitor input: the message names it, ``hint`` says what to do instead."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def check_options(*, interval_s: float, log_path: str | Path | None = None,
                  pid: int | None = None) -> Path | None:
    """Validate before anything is started or written; returns the log path as a Path."""
    if not 0 < interval_s <= MAX_INTERVAL_S:  # also rejects NaN and inf
        raise MonitorError(f"--interval {interval_s:g}: must be > 0 and ≤ {MAX_INTERVAL_S:g} seconds",
                           "e.g. --interval 1.0 (one sample per second)")
    if pid is not None and pid <= 0:
        raise MonitorError(f"--pid {pid}: must be a process id (≥ 1)",
                           "find it with `ps -ef` or `pgrep -f train`")
    if pid is not None and not process_alive(pid):
        raise MonitorError(f"--pid {pid}: no such process", "find it with `ps -ef` or `pgrep -f train`")
    if log_path is None:
        return None
    path = Path(log_path)
    if path.suffix.lower() not in LOG_SUFFIXES:
        raise MonitorError(f"--log {log_path}: unknown log format {path.suffix or '(no extension)'!r}",
                           "name the file *.jsonl (JSON lines) or *.csv")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise MonitorError(f"--log {log_path}: directory {parent} does not exist",
                           f"create it first (mkdir -p {shlex.quote(str(parent))}) or log elsewhere")
    if path.is_dir():
        raise MonitorError(f"--log {log_path}: is a directory", "give a file name ending in .jsonl or .csv")
    return path


class _StepWindow:
    """Accumulators of the steps recorded since the previous sample (O(1) per step)."""

    __slots__ = ("loss", "mfu", "n", "peak_allocated", "peak_reserved", "samples_timed", "samples_untimed",
                 "step", "time_samples_s", "time_tokens_s", "time_wait_s", "tokens_timed", "tokens_untimed",
                 "wait_s")

    def __init__(self) -> None:
        self.n = 0
        self.step: int | None = None
        self.loss: float | None = None
        self.mfu: float | None = None
        self.tokens_timed = self.samples_timed = self.tokens_untimed = self.samples_untimed = 0
        self.time_tokens_s = self.time_samples_s = self.wait_s = self.time_wait_s = 0.0
        self.peak_allocated: int | None = None
        self.peak_reserved: int | None = None


@contextlib.contextmanager
def rates_paused(sampler: Sampler | None, reason: str) -> Iterator[None]:
    """``sampler``'s rates paused for the block (:meth:`Sampler.pause_rates`: an evaluation, a
    checkpoint save); nothing without a sampler (a rank that does not watch)."""
    if sampler is None:
        yield
        return
    sampler.pause_rates(reason)
    try:
        yield
    finally:
        sampler.pause_rates(None)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


class Sampler:
    """Samples the GPUs and the host every ``interval_s`` in a thread; the training loop feeds step metrics.

    ``pid``: the process tree whose RSS and GPU memory are reported (default: this process; with
    ``follow_process=False`` none, as ``trainfit monitor`` without ``--pid``). ``live``: a rich live view
    (default: when stdout is a terminal). ``print_lines``: one plain line per sample when not live.
    ``tensorboard_dir``: scalars through ``torch.utils.tensorboard`` when ``tensorboard`` is installed.
    ``on_sample``: called in the sampler thread with each sample's rows (keep it short: it delays the next).
    """

    def __init__(self, *, interval_s: float = 1.0, log_path: str | Path | None = None, pid: int | None = None,
                 gpu_indices: list[int] | None = None, live: bool | None = None,
                 tensorboard_dir: str | Path | None = None, print_lines: bool = False,
                 follow_process: bool = True,
                 on_sample: Callable[[list[dict[str, Any]]], None] | None = None,
                 append: bool = False) -> None:
        self.log_path = check_options(interval_s=interval_s, log_path=log_path, pid=pid)
        self.interval_s = float(interval_s)
        self.pid: int | None = (os.getpid() if pid is None else pid) if follow_process else None
        self.gpu_indices = None if gpu_indices is None else list(gpu_indices)
        self.live = sys.stdout.isatty() if live is None else live
        self.print_lines = print_lines
        self.progress: Any = None
        """A trainfit.monitor.progress.StepProgress the live view shows (set by the run)."""
        self.on_sample = on_sample
        self.append = append
        """Add to an existing log instead of replacing it (a resumed run keeps the earlier lines)."""
        self.tensorboard_dir = None if tensorboard_dir is None else Path(tensorboard_dir)
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.samples = 0
        self.sample_cpu_s = 0.0  # CPU time spent in sample_once (thread CPU clock), for the overhead
        self._window = _StepWindow()
        self._window_lock = threading.Lock()
        self._pending_eval: dict[str, Any] | None = None
        self._sample_lock = threading.Lock()
        self._last_step: dict[str, Any] = dict.fromkeys(STEP_COLUMNS)
        self._paused: str | None = None  # what runs instead of steps (pause_rates)
        self._mig: list[int] = []  # shown GPUs in MIG mode (read at open)
        self._nvml = Nvml()
        self._host: HostProbe | None = None
        self._tree_cache: dict[int, Any] = {}  # psutil.Process by pid, reused between samples
        self._opened = self._closed = False
        self._t0 = self._prev_sample_t = 0.0
        self._t_offset_s = 0.0  # appending: time_s goes on from the log's last sample
        self._log: TextIO | None = None
        self._csv: csv.DictWriter[str] | None = None
        self._tb: TensorboardScalars | None = None
        self._live_view: Any = None
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------------

    def open(self) -> Sampler:
        """Start NVML, the host probe, the log and TensorBoard; ``start`` and ``sample_once`` call it."""
        if self._opened:
            return self
        if self.log_path is not None and self.append:
            # before NVML is opened: nothing to close on refusal
            if not is_a_log(self.log_path, COLUMNS):
                raise MonitorError(f"{self.log_path}: exists and is not a trainfit monitor log, so "
                                   "it is not appended to", "log to a new file (monitor --log "
                                   "NEW.jsonl), or move that one away")
        self._nvml.open()
        if self._nvml.available and self.gpu_indices is not None:
            missing = [i for i in self.gpu_indices if i not in self._nvml.indices]
            if missing:
                self._nvml.close()
                raise MonitorError(f"GPU index {missing[0]} not visible",
                                   f"visible: {', '.join(map(str, self._nvml.indices))}")
        shown = self._nvml.indices if self.gpu_indices is None else self.gpu_indices
        self._mig = [i for i in shown if self._nvml.available and self._nvml.mig_enabled(i)]
        self._host = HostProbe(self.pid)
        if self.log_path is not None:
            # Every write is flushed (see _write) so a crash keeps every sample taken.
            is_csv = self.log_path.suffix.lower() == ".csv"
            size = self.log_path.stat().st_size if self.append and self.log_path.exists() else 0
            self._log = self.log_path.open("a" if self.append else "w", newline="" if is_csv else None)
            if size and last_byte(self.log_path) != b"\n":
                self._log.write("\n")  # a line cut by a killed writer stays one line of its own
            if size:
                self._t_offset_s = last_time_s(self.log_path) + idle_s(self.log_path)
            if is_csv:
                self._csv = csv.DictWriter(self._log, fieldnames=list(COLUMNS), extrasaction="ignore")
                if not size:
                    self._csv.writeheader()
                self._log.flush()
        if self.tensorboard_dir is not None:
            # imported here: it reads this module's columns
            from trainfit.monitor.tensorboard import TensorboardScalars

            self._tb = TensorboardScalars.open(self.tensorboard_dir, self.notes)
        self._t0 = self._prev_sample_t = time.monotonic()
        self._opened = True
        return self

    def start(self) -> Sampler:
        """Open, then sample every ``interval_s`` in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return self
        self.open()
        if self.live:
            from rich.console import Console
            from rich.live import Live


            # auto_refresh off: the sampler thread redraws once per sample, no extra refresh thread.
            self._live_view = Live(render([], note=self.gpu_note, interval_s=self.interval_s),
                                   console=Console(), auto_refresh=False, transient=False)
            self._live_view.start()
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._run, name="trainfit-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, take a last sample (the steps since the previous one), close everything."""
        if self._thread is not None:
            self._stop_event.set()
            self._thread.join()
            self._thread = None
            self._tick()
        self.close()

    def close(self) -> None:
        if self._closed or not self._opened:
            return
        self._closed = True
        if self._live_view is not None:
            self._live_view.stop()
            self._live_view = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self._nvml.close()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- state for callers -----------------------------------------------------------------------------

    @property
    def gpu_available(self) -> bool:
        return self._nvml.available

    @property
    def gpu_reason(self) -> str | None:
        return self._nvml.reason

    @property
    def gpu_names(self) -> dict[int, str | None]:
        return dict(self._nvml.names)

    @property
    def gpu_note(self) -> str | None:
        """What the GPU table cannot show by itself (after :meth:`open`): no GPU; a card in MIG
        mode (an audit: shown as a whole card with util n/a and no word why); None when nothing."""
        if not self._opened:
            return None
        if self.gpu_indices == []:
            # a CPU run reads no GPU by design (train on the CPU): not a missing driver (an audit)
            return "a CPU run: no GPU read; showing the host only"
        if not self._nvml.available:
            return f"no NVIDIA GPU visible (NVML: {self._nvml.reason}); showing the host only"
        if not self._mig:
            return None
        return (f"GPU {', '.join(map(str, self._mig))} in MIG mode: the memory shown is the whole "
                "card's, and NVML reads no utilisation per slice (n/a); a process on a slice "
                "has only the slice's memory")

    @property
    def followed_alive(self) -> bool:
        return self.pid is None or process_alive(self.pid)

    # -- the hot path: called by the training loop every step -------------------------------------------

    def record_step(self, *, step: int, loss: float | None = None, tokens: int | None = None,
                    samples: int | None = None, step_time_s: float | None = None,
                    data_wait_s: float | None = None, mfu: float | None = None,
                    peak_allocated_bytes: int | None = None, peak_reserved_bytes: int | None = None) -> None:
        """Store one step's metrics: a few additions under an uncontended lock, no I/O, no allocation
        beyond the call. The sampler thread swaps the window out once per interval."""
        with self._window_lock:
            w = self._window
            w.n += 1
            w.step = step
            if loss is not None:
                w.loss = loss
            if mfu is not None:
                w.mfu = mfu
            if step_time_s is not None:
                if tokens is not None:
                    w.tokens_timed += tokens
                    w.time_tokens_s += step_time_s
                if samples is not None:
                    w.samples_timed += samples
                    w.time_samples_s += step_time_s
                if data_wait_s is not None:
                    w.wait_s += data_wait_s
                    w.time_wait_s += step_time_s
            else:
                w.tokens_untimed += tokens or 0
                w.samples_untimed += samples or 0
            if peak_allocated_bytes is not None:
                w.peak_allocated = _max(w.peak_allocated, peak_allocated_bytes)
            if peak_reserved_bytes is not None:
                w.peak_reserved = _max(w.peak_reserved, peak_reserved_bytes)

    def pause_rates(self, reason: str | None) -> None:
        """``reason`` (``"evaluation"``, ``"checkpoint"``): no step runs until ``None`` is given,
        so the samples taken meanwhile carry no rate (:data:`RATE_COLUMNS`) rather than the last
        steps' held (an audit: a 9-s evaluation and a save were drawn at 100 tokens/s)."""
        with self._window_lock:
            self._paused = reason

    def record_eval(self, *, step: int, **metrics: float | int | None) -> None:
        """Log one evaluation at once: a sample row taken now with extra keys ``eval_step`` and the
        metrics, each named ``eval_*`` (``eval_loss``, ``eval_perplexity``, ...), so every evaluation
        is in the log (HF keeps them as separate ``log_history`` entries too). Rows without an
        evaluation keep exactly :data:`COLUMNS`; a CSV log keeps only those columns."""
        extra = {"eval_step": step, **{k if k.startswith("eval_") else f"eval_{k}": v
                                       for k, v in metrics.items()}}
        with self._window_lock:
            self._pending_eval = extra
        self._tick()  # whichever sample runs first (this one or the thread's) carries it, once

    # -- sampling --------------------------------------------------------------------------------------

    def sample_once(self) -> list[dict[str, Any]]:
        """Take one sample now: one row per GPU (one row with ``gpu_*`` None without GPU), logged."""
        self.open()
        with self._sample_lock:
            cpu0_s = time.thread_time()
            now = time.monotonic()
            with self._window_lock:
                window, self._window = self._window, _StepWindow()
                paused = self._paused
            wall_s, self._prev_sample_t = now - self._prev_sample_t, now
            if window.n:
                self._last_step = _step_metrics(window, wall_s)
            # paused with no step since the previous sample: nothing trained in it (steps that
            # ended before the pause began keep their rates: their only sample is this one)
            step_values = self._last_step if paused is None or window.n else \
                {**self._last_step, **dict.fromkeys(RATE_COLUMNS)}
            tree = process_tree(self.pid, self._tree_cache) if self.pid is not None else None
            assert self._host is not None
            host = self._host.read(tree)
            # No RSS means the followed root is gone: its GPU memory is then unknown, not 0.
            pids = {p.pid for p in tree} if tree and host.process_rss_bytes is not None else None
            lost_before = set(self._nvml.lost)
            gpus = self._nvml.read(self.gpu_indices, pids)
            for i in sorted(self._nvml.lost - lost_before):
                self.notes.append(f"GPU {i}: NVML lost the GPU at time_s "
                                  f"{now - self._t0 + self._t_offset_s:.1f} (GPU is lost: fallen "
                                  "off the bus); its readings from then on are n/a")
            base: dict[str, Any] = {
                "time_s": round(now - self._t0 + self._t_offset_s, 6), **step_values,
                "host_ram_used_bytes": host.ram_used_bytes, "host_ram_total_bytes": host.ram_total_bytes,
                "host_swap_used_bytes": host.swap_used_bytes, "process_rss_bytes": host.process_rss_bytes,
                "host_cpu_percent": host.cpu_percent,
            }
            rows = [_row(base, g) for g in gpus] or [_row(base, None)]
            with self._window_lock:
                extra, self._pending_eval = self._pending_eval, None
            if extra:
                rows = [{**r, **extra} for r in rows]
            self._write(rows)
            self.rows.extend(rows)
            self.samples += 1
            self.sample_cpu_s += time.thread_time() - cpu0_s
            return rows

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop_event.is_set():
            self._tick()
            next_t += self.interval_s
            delay_s = next_t - time.monotonic()
            if delay_s < 0:  # fell behind (suspended, overloaded): skip ahead, the gap shows in time_s
                next_t, delay_s = time.monotonic(), 0.0
            self._stop_event.wait(delay_s)

    def _tick(self) -> None:
        try:
            rows = self.sample_once()
            self._show(rows)
            if self.on_sample is not None:
                self.on_sample(rows)
        except Exception as e:  # the monitor must never stop the training it watches
            msg = f"monitor sample failed: {type(e).__name__}: {e}"
            if msg not in self.notes:
                self.notes.append(msg)

    def _show(self, rows: list[dict[str, Any]]) -> None:
        if self._live_view is not None:
            line = self.progress.line() if self.progress is not None else None
            self._live_view.update(view.render(rows, gpu_names=self.gpu_names, note=self.gpu_note,
                                               interval_s=self.interval_s, progress_line=line),
                                   refresh=True)
        elif self.print_lines:
            print(view.plain_line(rows), flush=True)

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if self._log is not None:
            if self._csv is not None:
                self._csv.writerows(rows)
            else:
                self._log.write("".join(json_text.dumps(r) + "\n" for r in rows))
            # flush, not fsync: survives a crash of this process (the common case); fsync every second
            # would survive a host crash too but costs a disk round trip per sample.
            self._log.flush()
        if self._tb is not None:
            self._tb.write(rows, start_step=getattr(self.progress, "start_step", None),
                           samples=self.samples)


def _step_metrics(w: _StepWindow, wall_s: float) -> dict[str, Any]:
    def rate(timed: int, time_s: float, untimed: int) -> float | None:
        if time_s > 0:
            return timed / time_s
        if untimed and wall_s > 0:
            return untimed / wall_s
        return None

    return {
        "step": w.step, "loss": w.loss,
        "tokens_per_s": rate(w.tokens_timed, w.time_tokens_s, w.tokens_untimed),
        "samples_per_s": rate(w.samples_timed, w.time_samples_s, w.samples_untimed),
        "mfu": w.mfu,
        "data_wait_fraction": w.wait_s / w.time_wait_s if w.time_wait_s > 0 else None,
        "peak_allocated_bytes": w.peak_allocated, "peak_reserved_bytes": w.peak_reserved,
    }


def _row(base: dict[str, Any], g: GpuReading | None) -> dict[str, Any]:
    gpu = {
        "gpu_index": None if g is None else g.index,
        "gpu_util_percent": None if g is None else g.util_percent,
        "gpu_memory_used_bytes": None if g is None else g.memory_used_bytes,
        "gpu_memory_total_bytes": None if g is None else g.memory_total_bytes,
        "gpu_power_w": None if g is None else g.power_w,
        "gpu_sm_clock_mhz": None if g is None else g.sm_clock_mhz,
        "process_gpu_memory_bytes": None if g is None else g.process_memory_bytes,
    }
    merged = {**base, **gpu}
    return {c: merged[c] for c in COLUMNS}
