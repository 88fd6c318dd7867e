"""Matplotlib figures of a :class:`Report` → PNG bytes (Agg; no window, no pyplot global state).

Conventions, the same on every chart: predicted = lines / hollow markers, measured = filled markers;
the legend says which.  Memory in GiB (2^30 bytes).  Timelines break at gaps (NaN), never interpolate.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # before any backend is touched: the report runs headless

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from trainfit.job.files import size_text
from trainfit.report.model import DoctorSection, Family, Report, Section, Timeline, TrainSummary

COMPONENT_COLOURS = {
    "parameters": "#4c72b0", "gradients": "#55a868", "optimizer": "#c44e52", "activations": "#8172b2",
    "temporaries": "#ccb974", "other (buffers, workspaces, DDP)": "#64b5cd",
    "allocator cache (reserved − allocated)": "#bbbbbb", "CUDA context": "#555555",
    "managed (paged optimizer)": "#da8bc3"}
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
MEASURED_COLOUR = "#d62728"
CAPACITY_COLOUR = "#b00000"
USABLE_COLOUR = "#e08000"
CLIP_FACTOR = 1.6
"""Bars above this × capacity are cut at the top of the chart and labelled with their value."""


@dataclass(frozen=True)
class FigureImage:
    name: str
    """File stem: ``<section slug>-memory`` ..."""
    title: str
    caption: str
    png: bytes


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # no Software/date metadata: the same report gives the same bytes
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True,
            fontsize=10, color="#444444")
    ax.set_xticks([])
    ax.set_yticks([])


# --- memory vs micro-batch ------------------------------------------------------------------------

def _memory_panel(ax: Axes, fam: Family, s: Section, used: list[str], top: float | None) -> None:
    mbs = sorted({b.micro_batch for b in fam.bars} | {p.micro_batch for p in fam.memory_predicted_gib}
                 | {p.micro_batch for p in fam.memory_measured_gib})
    pos = {mb: i for i, mb in enumerate(mbs)}
    for b in fam.bars:
        bottom = 0.0
        for name in used:
            h = b.components_gib.get(name, 0.0)
            ax.bar(pos[b.micro_batch], h, bottom=bottom, width=0.7, color=COMPONENT_COLOURS[name])
            bottom += h
        if b.pick:  # one outline round the whole stack
            ax.bar(pos[b.micro_batch], bottom if top is None else min(bottom, top), width=0.7,
                   fill=False, edgecolor="black", linewidth=2, zorder=3)
        if b.predicted_device_gib is not None:
            y = b.predicted_device_gib if top is None else min(b.predicted_device_gib, top)
            ax.plot(pos[b.micro_batch], y, "o", mfc="white", mec="black", ms=7, zorder=4)
            if top is not None and b.predicted_device_gib > top:
                ax.annotate(f"↑ {b.predicted_device_gib:.1f}", (pos[b.micro_batch], top),
                            ha="center", va="bottom", fontsize=8, xytext=(0, 4),
                            textcoords="offset points")
        if b.pick:
            ax.annotate("pick", (pos[b.micro_batch], 0), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points", color="white", weight="bold")
    for p in fam.memory_predicted_gib:
        ax.plot(pos[p.micro_batch], p.value, "D", mfc="white", mec="#1f77b4", ms=7, zorder=4)
    for p in fam.memory_measured_gib:
        if p.status == "oom":
            ax.plot(pos[p.micro_batch], p.value, "X", color=MEASURED_COLOUR, ms=10, zorder=5)
        else:
            ax.plot(pos[p.micro_batch], p.value, "s", color=MEASURED_COLOUR, ms=7, zorder=5)
    if s.capacity_gib is not None:
        ax.axhline(s.capacity_gib, color=CAPACITY_COLOUR, lw=1.5)
        if s.margin is not None:
            ax.axhline(s.capacity_gib * (1 - s.margin), color=USABLE_COLOUR, lw=1.2, ls="--")
    ax.set_xticks(range(len(mbs)), [str(m) for m in mbs])
    if top is not None:
        ax.set_ylim(0, top * 1.08)
    else:
        ax.set_ylim(bottom=0)  # memory from zero: a cut axis makes small differences look large
    ax.set_title(fam.label, fontsize=10)
    ax.set_xlabel("micro-batch (samples per rank)")
    ax.set_ylabel("peak live tensor bytes, CPU (GiB = 2^30 B)" if s.on_cpu else
                  "peak GPU memory (GiB = 2^30 B)")
    ax.grid(axis="y", alpha=0.3)


def memory_title(s: Section) -> str:
    return ("Peak live tensor bytes (CPU) vs micro-batch" if s.on_cpu else
            "Peak GPU memory vs micro-batch")


def memory_figure(s: Section) -> bytes:
    fams = s.families
    used = [n for n in COMPONENT_COLOURS
            if any(b.components_gib.get(n, 0) > 0 for f in fams for b in f.bars)]
    cols = min(len(fams), 2) or 1
    rows = max(1, math.ceil(len(fams) / cols))
    fig = Figure()
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    highest = max([b.predicted_device_gib or 0 for f in fams for b in f.bars]
                  + [p.value for f in fams for p in f.memory_predicted_gib + f.memory_measured_gib]
                  + [0.0])
    top = None
    if s.capacity_gib is not None and highest > CLIP_FACTOR * s.capacity_gib:
        top = CLIP_FACTOR * s.capacity_gib
    for ax, fam in zip(axes, fams, strict=False):
        _memory_panel(ax, fam, s, used, top)
    for ax in axes[len(fams):]:
        ax.set_visible(False)
    if not fams:
        axes[0].set_visible(True)
        _empty(axes[0], "no configurations")
    handles: list[Patch | Line2D] = [Patch(color=COMPONENT_COLOURS[n], label=f"{n} (predicted)")
                                     for n in used]
    # a CPU section's peaks are live tensor bytes, not a device's (a QA run read "GPU")
    peak = "peak live tensor bytes" if s.on_cpu else "device peak"
    if any(b.predicted_device_gib is not None for f in fams for b in f.bars):
        # only where plan's points are drawn (an audit: listed for a tune alone)
        handles.append(Line2D([], [], ls="", marker="o", mfc="white", mec="black",
                              label=f"{peak}, predicted (plan)"))
    if any(f.memory_predicted_gib for f in fams):
        handles.append(Line2D([], [], ls="", marker="D", mfc="white", mec="#1f77b4",
                              label=f"{peak}, predicted (tune)"))
    if any(p.status != "oom" for f in fams for p in f.memory_measured_gib):
        handles.append(Line2D([], [], ls="", marker="s", color=MEASURED_COLOUR,
                              label=f"{peak}, measured (tune probe)"))
    if any(p.status == "oom" for f in fams for p in f.memory_measured_gib):
        handles.append(Line2D([], [], ls="", marker="X", color=MEASURED_COLOUR, ms=9,
                              label="out of memory, measured"))
    if s.capacity_gib is not None:
        handles.append(Line2D([], [], color=CAPACITY_COLOUR,
                              label=f"capacity {s.capacity_gib:.2f} GiB ({s.capacity_source})"))
        if s.margin is not None:
            handles.append(Line2D([], [], color=USABLE_COLOUR, ls="--",
                                  label=f"capacity × (1 − {s.margin:.0%} margin) = "
                                        f"{s.capacity_gib * (1 - s.margin):.2f} GiB"))
    legend_in = 0.2 * math.ceil(len(handles) / 3) + 0.2
    fig.set_size_inches(6.2 * cols, 4.3 * rows + 0.5 + legend_in)
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"{memory_title(s)} — {s.title}", fontsize=12)
    fig.tight_layout(rect=(0, legend_in / (4.3 * rows + 0.5 + legend_in), 1, 0.97))
    return _png(fig)


# --- throughput vs micro-batch --------------------------------------------------------------------

def throughput_figure(s: Section) -> bytes:
    fig = Figure(figsize=(8, 4.8))
    ax = fig.subplots()
    if s.throughput_unknown_reason:
        _empty(ax, s.throughput_unknown_reason)
    mbs: set[int] = set()
    picked = {p.setting for p in s.picks}
    for i, fam in enumerate(s.families):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        # a pick's series above the others (an audit: another setting's squares at the same
        # micro-batch hid the pick's own measurements)
        z = 4 if fam.label in picked else 2
        pred = sorted(fam.tokens_per_s_predicted, key=lambda p: p.micro_batch)
        if pred:
            ax.plot([p.micro_batch for p in pred], [p.value for p in pred], "o-", color=colour,
                    mfc="white", label=f"{fam.label} (predicted)", zorder=z)
        meas = fam.tokens_per_s_measured
        if meas:
            ax.plot([p.micro_batch for p in meas], [p.value for p in meas], "s", color=colour,
                    ms=8, mec="black", label=f"{fam.label} (measured)", zorder=z + 0.5)
        mbs |= {p.micro_batch for p in pred + meas}
    for p in s.picks:
        fam = next((f for f in s.families if f.label == p.setting), None)
        v = p.tokens_per_s_measured if p.source == "tune" else p.tokens_per_s_predicted
        if fam is not None and v is not None:
            ax.plot(p.micro_batch, v, "*", ms=15, color="gold", mec="black", zorder=6,
                    label=f"pick ({p.source}: {'measured' if p.source == 'tune' else 'predicted'})")
            ax.annotate(f"pick ({p.source})", (p.micro_batch, v),
                        xytext=(0, 14) if p.source == "plan" else (-34, -22), textcoords="offset points",
                        ha="center", fontsize=8,
                        arrowprops={"arrowstyle": "-", "color": "#666666"})
    legend_in = 0.0
    if mbs:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(mbs), [str(m) for m in sorted(mbs)])
        ax.set_xlabel("micro-batch (samples per rank)")
        ax.set_ylabel("tokens/s (all ranks)")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)  # room for the pick labels
        ax.grid(alpha=0.3)
        # below the axes, never over the points (an audit: lower right covered measurements)
        handles, labels = ax.get_legend_handles_labels()
        legend_in = 0.2 * math.ceil(len(handles) / 2) + 0.2
        fig.set_size_inches(8, 4.8 + legend_in)
        fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    ax.set_title(f"Throughput vs micro-batch — {s.title}", fontsize=12)
    fig.tight_layout(rect=(0, legend_in / (4.8 + legend_in), 1, 1))
    return _png(fig)


# --- monitor timelines ----------------------------------------------------------------------------

def timeline_figure(t: Timeline) -> bytes:
    n = len(t.panels)
    fig = Figure(figsize=(12, 2.1 * n + 0.8))
    axes = fig.subplots(n, 1, sharex=True, squeeze=False).ravel()
    for ax, panel in zip(axes, t.panels, strict=True):
        for i, ser in enumerate(panel.series):
            ax.plot(ser.time_s, ser.values, "-", color=SERIES_COLOURS[i % len(SERIES_COLOURS)],
                    lw=1.3, label=ser.label)
        for j, (a, b) in enumerate(t.gaps_s):
            ax.axvspan(a, b, color="#999999", alpha=0.25, lw=0,
                       label="gap: no samples" if j == 0 else None)
        if panel.limit is not None:
            ax.axhline(panel.limit, color=CAPACITY_COLOUR, ls="--", lw=1,
                       label=f"{panel.limit_label} {_limit_text(panel.limit, panel.unit)}")
        if not panel.series:
            ax.text(0.5, 0.5, "no readings (null in the log)", ha="center", va="center",
                    transform=ax.transAxes, color="#666666")
        ax.set_ylabel(panel.unit)
        # every timeline quantity is ≥ 0; a zoomed axis would exaggerate noise; headroom for the top line
        ax.set_ylim(0, max(ax.get_ylim()[1], 1e-9) * 1.1)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.4g}"))
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        if panel.series or t.gaps_s or panel.limit is not None:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    axes[-1].set_xlabel("time since start (s)")
    fig.suptitle(f"Monitor log {t.path}: {t.samples} sample{'' if t.samples == 1 else 's'} (measured), "
                 f"{len(t.gaps_s)} gap{'' if len(t.gaps_s) == 1 else 's'} in sampling",
                 fontsize=12)
    fig.tight_layout()
    return _png(fig)


def loss_figure(t: TrainSummary) -> bytes:
    """Each step's training loss (measured), the evaluations' losses as points, a dashed line
    where a segment began (a resume); a non-finite step is a break in the line."""
    fig = Figure(figsize=(10, 3.6))
    ax = fig.subplots()
    steps = list(range(1, len(t.losses) + 1))
    # a marker where the steps are few: a line through one point draws nothing (a review)
    ax.plot(steps, [math.nan if v is None else v for v in t.losses], "-", lw=1.3,
            marker="o" if len(steps) <= 20 else None, ms=3,
            color=SERIES_COLOURS[0], label="training loss (each step)")
    done = [e for e in t.evals if e.eval_loss is not None]
    if done:
        ax.plot([e.step for e in done], [e.eval_loss for e in done], "o", color=MEASURED_COLOUR,
                label="evaluation loss")
    for i, r in enumerate(r for r in t.segment_rows if r.start_step > 0):
        ax.axvline(r.start_step + 0.5, color="#666666", ls="--", lw=1,
                   label="a segment begins (resume)" if i == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole (ticks read 2.5)
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f"Loss — {t.path} (measured)", fontsize=11)
    fig.tight_layout()
    return _png(fig)


def doctor_figure(d: DoctorSection) -> bytes:
    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    parts = [(name, v) for name, v in d.split_s if v is not None]
    if not parts:
        _empty(ax, "no split measured")
    else:
        names = [p[0] for p in parts]
        ax.barh(range(len(parts)), [p[1] for p in parts], color=MEASURED_COLOUR)
        ax.set_yticks(range(len(parts)), names)
        ax.invert_yaxis()
        ax.set_xlabel("seconds per step (measured, median)")
        ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"Where a step's time goes — {d.target} (measured)", fontsize=11)
    fig.tight_layout()
    return _png(fig)


def render_figures(report: Report) -> list[FigureImage]:
    out = []
    for s in report.sections:
        out.append(FigureImage(
            f"{s.slug}-memory", f"{memory_title(s)} — {s.title}",
            ("Hollow markers: predicted peak live tensor bytes; filled markers: measured. Lines: "
             "the CPU memory limit tune stood in for a GPU with, and that limit minus the safety "
             "margin. GiB = 2^30 bytes." if s.on_cpu else
             "Stacked bars: the predicted reserved peak split into its parts (the plan named no "
             "GPU: the device peak, reserved + the card's CUDA context, is unknown); filled "
             "markers: measured. GiB = 2^30 bytes." if s.table.no_gpu else
             "Stacked bars: the predicted device peak split into its parts; hollow markers: "
             "predicted device peak; filled markers: measured. Lines: GPU capacity and capacity "
             "minus the safety margin. GiB = 2^30 bytes."), memory_figure(s)))
        out.append(FigureImage(
            f"{s.slug}-throughput", f"Throughput vs micro-batch — {s.title}",
            "Lines with hollow markers: predicted tokens/s (all ranks); filled squares: measured.",
            throughput_figure(s)))
    for t in report.timelines:
        out.append(FigureImage(
            t.slug, f"Timelines — {t.path}",
            f"Measured samples; grey bands are gaps in sampling (an interval over 2.5× the median "
            f"{'unknown' if t.median_interval_s is None else f'{t.median_interval_s:.2f} s'}), "
            "drawn as gaps, not interpolated.", timeline_figure(t)))
    for tr in report.trains:
        if any(v is not None for v in tr.losses):
            out.append(FigureImage(
                tr.slug, f"Loss — {tr.path}",
                "Each optimizer step's training loss (measured; breaks where it was not finite), "
                "evaluation losses as points, a dashed line where a resumed segment began.",
                loss_figure(tr)))
    for d in report.doctors:
        out.append(FigureImage(d.slug, f"Step time split — {d.target}",
                               "Median seconds per step of each part (measured).", doctor_figure(d)))
    return out


def _limit_text(limit: float, unit: str) -> str:
    """A limit line's figure: a size as ``--memory-limit`` reads it back (an audit: a 22 MiB
    limit's legend read "--memory-limit 0.0 GiB")."""
    if unit == "GiB":
        return size_text(round(limit * 2**30))
    return f"{limit:.1f} {unit}"
