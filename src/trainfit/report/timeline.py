"""A monitor log as drawn timelines: per-GPU and host series, broken where sampling stopped (a
gap longer than GAP_FACTOR × the median interval is drawn as a break, not a straight line across
time nobody measured). Pure computation, as report/build.py."""

from __future__ import annotations

import itertools
import math
import statistics

from trainfit.report.inputs import MonitorLog
from trainfit.report.model import GIB, Timeline, TimelinePanel, TimelineSeries

GAP_FACTOR = 2.5
"""A sampling interval longer than this × the median interval is a gap in the monitor log."""


def find_gaps(times_s: list[float], factor: float = GAP_FACTOR
              ) -> tuple[float | None, list[tuple[float, float]]]:
    """Median sampling interval and the (start, end) of each interval longer than factor × median."""
    uniq = sorted(set(times_s))
    steps = [b - a for a, b in itertools.pairwise(uniq)]
    if len(steps) < 2:
        return (steps[0] if steps else None), []
    med = statistics.median(steps)
    return med, [(a, b) for a, b in itertools.pairwise(uniq) if b - a > factor * med]


def gapped_series(label: str, times_s: list[float], values: list[float | None],
                  gaps: list[tuple[float, float]], scale: float = 1.0) -> TimelineSeries | None:
    """NaN for missing readings and one NaN inside each gap, so the drawn line breaks there."""
    if all(v is None for v in values):
        return None
    starts = {a for a, _ in gaps}
    t_out: list[float] = []
    v_out: list[float] = []
    for i, (t, v) in enumerate(zip(times_s, values, strict=True)):
        t_out.append(t)
        v_out.append(math.nan if v is None else v * scale)
        if t in starts and i + 1 < len(times_s) and times_s[i + 1] > t:
            t_out.append((t + times_s[i + 1]) / 2)
            v_out.append(math.nan)
    return TimelineSeries(label, t_out, v_out)


def build_timeline(log: MonitorLog, slug: str) -> Timeline:
    cols = log.columns
    times = [float(t) for t in cols["time_s"] if t is not None]
    med, gaps = find_gaps(times)
    gpu_ids = sorted({int(g) for g in cols["gpu_index"] if g is not None})
    first_at: dict[float, int] = {}
    for i, t in enumerate(times):
        first_at.setdefault(t, i)
    host_rows = sorted(first_at.values())  # one row per sample time for the host-wide columns

    def host(label: str, key: str, scale: float = 1.0) -> TimelineSeries | None:
        return gapped_series(label, [times[i] for i in host_rows], [cols[key][i] for i in host_rows],
                             gaps, scale)

    gpu_rows: dict[int, list[int]] = {g: [] for g in gpu_ids}  # each card's rows, one pass
    for i, x in enumerate(cols["gpu_index"]):
        if x is not None:
            gpu_rows[int(x)].append(i)

    # one capacity line when every card has the same; else each card's memory says its own (an
    # audit: an H100's 80 GiB was drawn over an A10G's 24 GiB series)
    totals = {g: max((v for i in gpu_rows[g] if (v := cols["gpu_memory_total_bytes"][i])
                      is not None), default=None) for g in gpu_ids}
    mixed_cards = len({t for t in totals.values() if t is not None}) > 1

    def per_gpu(label: str, key: str, scale: float = 1.0) -> list[TimelineSeries | None]:
        if not gpu_ids:
            return [host(label, key, scale)]
        out = []
        for g in gpu_ids:
            rows = gpu_rows[g]
            suffix = f", GPU {g}" if len(gpu_ids) > 1 else ""
            if mixed_cards and key == "gpu_memory_used_bytes" and totals[g] is not None:
                suffix += f" (of {totals[g] / GIB:.1f} GiB)"
            out.append(gapped_series(label + suffix, [times[i] for i in rows],
                                     [cols[key][i] for i in rows], gaps, scale))
        return out

    def limit(key: str) -> float | None:
        vals = [v for v in cols[key] if v is not None]
        return max(vals) / GIB if vals else None

    def panel(title: str, unit: str, series: list[TimelineSeries | None], lim: float | None = None,
              lim_label: str = "") -> TimelinePanel:
        return TimelinePanel(title, unit, [s for s in series if s is not None], lim, lim_label)

    # a run without a GPU: no NVML reading and no reserve (torch's caching allocator is CUDA's);
    # its peak_allocated_bytes is trainfit's count of the step's live tensors under
    # --memory-limit, not torch's nor a GPU's (an audit read "GPU memory … (torch)" on a CPU run)
    # where the run says it ran decides (a CPU run on a host with GPUs: an audit); a bare
    # monitor log, or an older record, by its rows
    on_gpu = any(d.startswith("cuda") for d in log.run_devices) if log.run_devices else \
        any(v is not None for key in ("gpu_util_percent", "gpu_memory_used_bytes",
                                      "process_gpu_memory_bytes", "gpu_memory_total_bytes",
                                      "peak_reserved_bytes") for v in cols[key])
    device_panels = [
        panel("GPU utilisation (measured)", "%", per_gpu("GPU busy", "gpu_util_percent")),
        panel("GPU memory (measured)", "GiB",
              [*per_gpu("used (nvidia-smi)", "gpu_memory_used_bytes", 1 / GIB),
               # a train run's log follows the run; a bare monitor log the --pid it was given
               *per_gpu("this run's process" if log.run_devices else "followed process (--pid)",
                        "process_gpu_memory_bytes", 1 / GIB),
               host("peak allocated (torch)", "peak_allocated_bytes", 1 / GIB),
               host("peak reserved (torch)", "peak_reserved_bytes", 1 / GIB)],
              None if mixed_cards else limit("gpu_memory_total_bytes"), "GPU memory"),
    ] if on_gpu else [
        panel("Live tensor memory (measured; a CPU run, no GPU: trainfit's count of the step's "
              "tensors under --memory-limit)", "GiB",
              [host("peak live tensors", "peak_allocated_bytes", 1 / GIB)],
              None if log.memory_limit_bytes is None else log.memory_limit_bytes / GIB,
              "--memory-limit"),
    ] if any(v is not None for v in cols["peak_allocated_bytes"]) else []  # no limit: no count
    panels = [
        *device_panels,
        panel("Host memory (measured)", "GiB",
              [host("RAM used", "host_ram_used_bytes", 1 / GIB),
               host("process tree RSS", "process_rss_bytes", 1 / GIB),
               host("swap used", "host_swap_used_bytes", 1 / GIB)],
              limit("host_ram_total_bytes"), "host RAM"),
        # each sample's rate is the steps' since the previous sample (a long step: the last
        # steps' held); during evaluations and saves the log has none (monitor/sampler.py)
        panel("Throughput (measured over the latest steps; blank during evaluations and saves)",
              "tokens/s", [host("tokens/s", "tokens_per_s")]),
        panel("Data wait (measured)", "% of step", [host("waiting for data", "data_wait_fraction", 100)]),
    ]
    return Timeline(slug=slug, path=log.path, samples=log.samples,
                    duration_s=(times[-1] - times[0]) if times else 0.0, median_interval_s=med,
                    gaps_s=gaps, panels=panels)
