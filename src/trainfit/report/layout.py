"""The report's reading order as a list of blocks, which the HTML and Markdown renderers print."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainfit.report.doctor_tables import doctor_texts
from trainfit.report.figures import FigureImage
from trainfit.report.model import Report, Section
from trainfit.report.tables import (
    TextTable,
    fmt_duration,
    fmt_gib,
    fmt_num,
    ladder_text,
    picks_text,
    probes_text,
    seed_text,
    train_text,
)

CONVENTIONS = ("Every number says whether it is predicted (trainfit's data-less simulation of the "
               "training step, no GPU) or measured (a real run). Charts: predicted = lines and hollow "
               "markers, measured = filled markers. GiB = 2^30 bytes. \"unknown\" means nobody "
               "measured or could predict it.")


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass(frozen=True)
class Para:
    text: str
    warn: bool = False


@dataclass(frozen=True)
class Bullets:
    items: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Image:
    figure: FigureImage


@dataclass(frozen=True)
class Table:
    table: TextTable


Block = Heading | Para | Bullets | Image | Table


def _section_blocks(s: Section, figs: dict[str, FigureImage]) -> list[Block]:
    cap = (("none (tune ran without --memory-limit)" if s.on_cpu else "unknown (no GPU named)")
           if s.capacity_gib is None
           else f"{fmt_gib(s.capacity_gib)} GiB ({s.capacity_source})")
    usable = ("usable: unknown" if s.capacity_gib is None or s.margin is None
              else f"{fmt_gib(s.capacity_gib * (1 - s.margin))} GiB usable with a {s.margin:.0%} margin")
    out: list[Block] = [Heading(2, s.title, s.slug),
                        Para(f"From {', '.join(s.sources)}. {s.capacity_label[:1].upper()}"
                             f"{s.capacity_label[1:]}: "
                             f"{cap}; {usable}.")]
    if s.picks:
        out.append(Table(picks_text(s.picks, s.on_cpu)))
    else:
        why = ("nothing fits" if s.capacity_gib is not None
               else "the GPU's memory is unknown, so nothing can be said to fit")
        out.append(Para(f"No pick in these inputs: {why}"
                        + (" (see the memory-saving ladder below)." if s.ladder else "."), True))
    for name in (f"{s.slug}-memory", f"{s.slug}-throughput"):
        if name in figs:
            out.append(Image(figs[name]))
    if s.throughput_unknown_reason:
        out.append(Para(s.throughput_unknown_reason + "."))
    out.append(Table(seed_text(s.table, s.on_cpu)))
    if s.ladder:
        out.append(Table(ladder_text(s.ladder)))
    if s.probes:
        out.append(Table(probes_text(s.probes, s.probes_on_cpu)))
    if s.notes:
        out += [Heading(3, "Notes from the plan"), Bullets(list(s.notes))]
    return out


def layout(report: Report, figures: list[FigureImage]) -> list[Block]:
    figs = {f.name: f for f in figures}
    out: list[Block] = [Heading(1, report.title), Para(CONVENTIONS)]
    out.append(Bullets([f"{path} ({kind})" for path, kind in report.sources]))
    out += [Para(f"warning: {w}", True) for w in report.warnings]
    for s in report.sections:
        out += _section_blocks(s, figs)
    for t in report.trains:
        out += [Heading(2, f"Training run: {t.path}"), Table(train_text(t))]
        if t.slug in figs:
            out.append(Image(figs[t.slug]))
    for tl in report.timelines:
        med = "unknown" if tl.median_interval_s is None else f"{tl.median_interval_s:.2f} s"
        gaps = ", ".join(f"{a:.1f}–{b:.1f} s" for a, b in tl.gaps_s) or "none"
        out += [Heading(2, f"Timelines: {tl.path}", tl.slug),
                Para(f"{tl.samples} samples over {fmt_duration(tl.duration_s)} (measured); median "
                     f"sampling interval {med}; gaps in sampling: {gaps}.")]
        if tl.slug in figs:
            out.append(Image(figs[tl.slug]))
    for d in report.doctors:
        out += [Heading(2, f"Doctor: {d.target}", d.slug),
                Para(f"From {d.path}; {fmt_num(d.steps_measured)} steps measured.")]
        texts = doctor_texts(d)
        out.append(Table(texts[1]))
        if d.slug in figs:
            out.append(Image(figs[d.slug]))
        out += [Table(texts[0]), Table(texts[2])]
    return out
