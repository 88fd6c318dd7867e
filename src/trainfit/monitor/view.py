"""Rendering of sampler rows: a rich view (GPU table + host line + step line) and a plain one-line form.

Display only: every number comes from a row of :mod:`trainfit.monitor.sampler`, every number is measured,
and every number says its unit (GiB = 2^30 bytes).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

GIB = 2**30


def _num(value: float | int | None, fmt: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{format(value, fmt)}{unit}"


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f}"


def _gib_unit(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB"


def _size(n: int) -> str:
    """GiB, or MiB below 0.01 GiB (an audit: a 1.8 MiB process read "0.00 GiB", a measured size
    shown as none)."""
    return f"{n / GIB:.2f} GiB" if n >= 0.01 * GIB else f"{n / 2**20:.1f} MiB"


def host_line(row: dict[str, Any]) -> str:
    rss = row.get("process_rss_bytes")
    return (f"host RAM {_gib(row['host_ram_used_bytes'])} / {_gib(row['host_ram_total_bytes'])} GiB used · "
            f"swap {_gib(row['host_swap_used_bytes'])} GiB used · "
            f"CPU {_num(row['host_cpu_percent'], '.0f')} % (all cores)"
            + ("" if rss is None else f" · process tree RSS {_size(rss)}"))


def step_line(row: dict[str, Any]) -> str | None:
    if row.get("step") is None:
        return None
    # the steps since the previous sample (the progress line's figure is since the first step:
    # two unlabeled rates over different windows read as a contradiction — an audit)
    parts = [f"step {row['step']}", f"loss {_num(row['loss'], '.4g')}",
             f"{_num(row['tokens_per_s'], ',.0f')} tokens/s, "
             f"{_num(row['samples_per_s'], ',.2f')} samples/s over the steps since the last "
             "reading (measured)"]
    if row.get("mfu") is not None:
        parts.append(f"MFU {row['mfu'] * 100:.1f} %")
    if row.get("data_wait_fraction") is not None:
        parts.append(f"data wait {row['data_wait_fraction'] * 100:.1f} % of step time")
    if row.get("peak_allocated_bytes") is not None or row.get("peak_reserved_bytes") is not None:
        parts.append(f"peak allocated {_gib_unit(row['peak_allocated_bytes'])} / "
                     f"reserved {_gib_unit(row['peak_reserved_bytes'])}")
    return " · ".join(parts)


def render(rows: list[dict[str, Any]], *, gpu_names: dict[int, str | None] | None = None,
           note: str | None = None, interval_s: float | None = None,
           progress_line: str | None = None) -> Group:
    """The live view of one sample (all rows share the host and step columns); ``progress_line``:
    the run's step / total, tokens/s and time left (trainfit.monitor.progress)."""
    names = gpu_names or {}
    every = "" if interval_s is None else f" every {interval_s:g} s"
    title = f"measured{every} (GiB = 2^30 bytes)"
    parts: list[Any] = []
    if note:
        parts.append(Text(note, style="yellow"))
    gpu_rows = [r for r in rows if r.get("gpu_index") is not None]
    if gpu_rows:
        table = Table(title=f"GPUs, {title}")
        for col in ("GPU", "name", "util %", "memory used / total GiB", "power W", "SM clock MHz",
                    "followed process GiB"):
            table.add_column(col, justify="left" if col == "name" else "right")
        for r in gpu_rows:
            table.add_row(str(r["gpu_index"]), names.get(r["gpu_index"]) or "n/a",
                          _num(r["gpu_util_percent"], ".0f"),
                          f"{_gib(r['gpu_memory_used_bytes'])} / {_gib(r['gpu_memory_total_bytes'])}",
                          _num(r["gpu_power_w"], ".0f"), _num(r["gpu_sm_clock_mhz"], "d"),
                          _gib(r["process_gpu_memory_bytes"]))
        parts.append(table)
    elif rows:
        parts.append(Text(f"host, {title}"))
    if rows:
        parts.append(Text(host_line(rows[0])))
        if progress_line:
            parts.append(Text(progress_line, style="bold"))
        steps = step_line(rows[0])
        if steps:
            parts.append(Text(steps))
    else:
        parts.append(Text("waiting for the first sample ..."))
    return Group(*parts)


def plain_line(rows: list[dict[str, Any]]) -> str:
    """One line per sample for logs and pipes (not a terminal): time, each GPU, host, step."""
    if not rows:
        return ""
    first = rows[0]
    parts = [f"t={first['time_s']:.1f} s"]
    for r in rows:
        if r.get("gpu_index") is None:
            continue
        proc = r.get("process_gpu_memory_bytes")
        parts.append(f"gpu{r['gpu_index']} util {_num(r['gpu_util_percent'], '.0f')} % mem "
                     f"{_gib(r['gpu_memory_used_bytes'])}/{_gib(r['gpu_memory_total_bytes'])} GiB "
                     f"{_num(r['gpu_power_w'], '.0f')} W {_num(r['gpu_sm_clock_mhz'], 'd')} MHz"
                     + ("" if proc is None else f" proc {_gib(proc)} GiB"))
    parts.append(host_line(first))
    steps = step_line(first)
    if steps:
        parts.append(steps)
    return " | ".join(parts) + " (measured)"
