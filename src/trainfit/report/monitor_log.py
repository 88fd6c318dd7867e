"""Monitor logs as report reads them (``monitor.jsonl`` of train, or its CSV): rows with their
``time_s``, a line a killed writer cut skipped and said; and the text of any input file, read
with the error that names it."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from trainfit.report.inputs import MonitorLog
from trainfit.report.json_fields import FORMATS_HINT, ReportInputError, short_repr

MONITOR_COLUMNS = (
    "time_s", "step", "loss", "tokens_per_s", "samples_per_s", "mfu", "data_wait_fraction",
    "peak_allocated_bytes", "peak_reserved_bytes", "gpu_index", "gpu_util_percent",
    "gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_power_w", "gpu_sm_clock_mhz",
    "process_gpu_memory_bytes", "host_ram_used_bytes", "host_ram_total_bytes", "host_swap_used_bytes",
    "process_rss_bytes", "host_cpu_percent")


def read_text(path: Path, shown: str) -> str:
    if not path.exists():
        raise ReportInputError(f"{shown}: file not found", "check the path")
    if path.is_dir():
        raise ReportInputError(f"{shown}: is a directory, not a file",
                               "pass the JSON files themselves (a run directory of trainfit "
                               "train: its train.json is read when it has one)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        # readable, but not text (an audit: told to check its permissions)
        raise ReportInputError(f"{shown}: not a text file (byte {e.start}: {e.reason})",
                               "report reads the JSON / JSONL / CSV files trainfit writes; "
                               + FORMATS_HINT) from None
    except OSError as e:
        raise ReportInputError(f"{shown}: cannot read ({e})", "check the file's permissions") from None


def _cell(file: str, where: str, key: str, v: Any) -> float | None:
    if v is None or v == "" or v == "null":
        return None
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ReportInputError(f"{file}: {where}: {key}: expected a number or empty, got {v!r}",
                                   FORMATS_HINT) from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ReportInputError(f"{file}: {where}: {key}: expected a number or null, got {v!r}",
                               FORMATS_HINT)
    return float(v)


def _cut_off(line: str, err: json.JSONDecodeError) -> bool:
    """A JSON object cut at the end of its line: what a writer killed mid-line leaves (the
    sampler starts its next row on a line of its own, monitor/sampler.py); anything else that
    does not parse is an error."""
    return line.lstrip().startswith("{") and (err.pos >= len(line.rstrip())
                                              or err.msg.startswith("Unterminated string"))


def load_monitor(path: Path, shown: str, warnings: list[str] | None = None) -> MonitorLog:
    """A monitor log (.jsonl or .csv); rows missing ``time_s`` or going back in time are errors.
    A row cut off by a killed writer is skipped, said in ``warnings`` (a QA run: one cut last
    line made a whole training's log unreadable)."""
    rows: list[tuple[str, dict[str, Any]]] = []
    text = read_text(path, shown)
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames or "time_s" not in reader.fieldnames:
            raise ReportInputError(f"{shown}: header: no time_s column",
                                   "the first line of a monitor CSV names the columns; "
                                   + FORMATS_HINT)
        records = list(reader)
        for i, r in enumerate(records):
            # a row short of the header's fields, or the last one when the file does not end its
            # line, is what a writer killed mid-row leaves (the sampler starts its next row on a
            # line of its own): skipped and said, as a cut JSON line is (an audit: a cut row
            # drew a host RAM of 155 bytes, read as measured)
            cut = None in r.values() or (i == len(records) - 1 and not text.endswith("\n"))
            if cut:
                if warnings is not None:
                    warnings.append(f"{shown}: line {i + 2} is cut off (its writer was killed "
                                    "mid-line): skipped")
                continue
            rows.append((f"line {i + 2}", dict(r)))
    else:
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                if _cut_off(line, e):
                    if warnings is not None:
                        warnings.append(f"{shown}: line {i + 1} is cut off (its writer was killed "
                                        "mid-line): skipped")
                    continue
                raise ReportInputError(f"{shown}: line {i + 1}: not JSON ({e.msg})",
                                       "each line of a monitor log is one JSON object") from None
            if not isinstance(obj, dict):
                raise ReportInputError(f"{shown}: line {i + 1}: expected an object, got {short_repr(obj)}",
                                       "each line of a monitor log is one JSON object")
            rows.append((f"line {i + 1}", obj))
    if not rows:
        # its only lines cut off is not an empty log (an audit): said as such
        cut = [w for w in (warnings or []) if w.startswith(f"{shown}: line ")]
        raise ReportInputError(f"{shown}: no samples" + (
            f": {len(cut)} line{'s' if len(cut) > 1 else ''}, cut off (its writer was killed "
            "mid-line)" if cut else ""),
            "the run was killed before the monitor wrote a whole line: run it longer" if cut
            else "the monitor log is empty")
    columns: dict[str, list[float | None]] = {k: [] for k in MONITOR_COLUMNS}
    last_t = -math.inf
    for where, row in rows:
        t = _cell(shown, where, "time_s", row.get("time_s"))
        if t is None:
            raise ReportInputError(f"{shown}: {where}: time_s: missing", FORMATS_HINT)
        if t < last_t:
            raise ReportInputError(f"{shown}: {where}: time_s: {t:g} s is before the previous sample "
                                   f"({last_t:g} s)", "samples are written in time order")
        last_t = t
        for k in MONITOR_COLUMNS:
            columns[k].append(_cell(shown, where, k, row.get(k)))
    return MonitorLog(path=shown, columns=columns)
