"""The seed-002-style table (micro-batch → VRAM → host RAM → tokens/s → speed-up → time per epoch),
computed from predictions and measurements, and every table of the report as text cells.

Computing (``seed_table``) is apart from formatting (``*_text``): the HTML and Markdown renderers
print the same cells, so a number reads the same in both.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field

from trainfit.report.inputs import LadderStep, OomEvent, Probe, SegmentRow
from trainfit.report.model import GIB, Pick, SeedRow, SeedTable, TrainSummary

UNKNOWN = "unknown"


@dataclass
class RowAcc:
    """A table row while predictions (plan, tune) and measurements (tune probes) are merged in."""

    setting: str
    micro_batch: int
    grad_accum: int
    device_predicted_bytes: float | None = None
    reserved_predicted_bytes: float | None = None
    tokens_per_s_predicted: float | None = None
    fits_predicted: bool | None = None
    device_measured_bytes: float | None = None
    host_ram_measured_bytes: float | None = None
    tokens_per_s_measured: float | None = None
    status_measured: str | None = None
    pick: set[str] = field(default_factory=set)
    undecided: bool = False
    """A change to tune's pick that its search could not decide: its speed is not a gain."""
    probes: list[tuple[float, float | None, float | None]] = field(default_factory=list)
    """(tokens/s, judged peak, host RSS) of each timed probe of this row (tune's knob stage and
    its interleaved rounds probe a row several times)."""

    def settle(self) -> None:
        """The row's measured numbers from its probes: the median tokens/s, as tune states a
        pick's (the fastest probe was shown, and on a busy host a baseline row read 9.83× over
        itself), and the largest peaks (a measured peak is a fact about the step)."""
        if not self.probes:
            return
        # the lower middle of an even count, as tune takes its pick's (Searcher.median_of: a
        # probe's own number); the pick's row then takes tune's figure itself (build.py)
        self.tokens_per_s_measured = statistics.median_low(t for t, _, _ in self.probes)
        peaks = [p for _, p, _ in self.probes if p is not None]
        rss = [h for _, _, h in self.probes if h is not None]
        self.device_measured_bytes = max(peaks) if peaks else self.device_measured_bytes
        self.host_ram_measured_bytes = max(rss) if rss else self.host_ram_measured_bytes


@dataclass(frozen=True)
class Reference:
    """What speed-ups are relative to: the baseline (tune's current configuration) or the slowest row."""

    tokens_per_s_predicted: float | None
    tokens_per_s_measured: float | None
    text: str


def _ratio(v: float | None, ref: float | None) -> float | None:
    return None if v is None or ref is None or ref <= 0 else v / ref


def _gib(b: float | None) -> float | None:
    return None if b is None else b / GIB


def _slowest(accs: list[RowAcc], measured: bool) -> RowAcc | None:
    rows = [a for a in accs if (a.tokens_per_s_measured if measured else a.tokens_per_s_predicted)]
    if not rows:
        return None
    return min(rows, key=lambda a: (a.tokens_per_s_measured if measured else a.tokens_per_s_predicted)
               or 0.0)


def reference_for(accs: list[RowAcc], baseline: RowAcc | None,
                  baseline_tokens_per_s_measured: float | None) -> Reference:
    """The baseline when tune measured one, else the slowest row (per kind: predicted vs measured)."""
    if baseline_tokens_per_s_measured:
        assert baseline is not None
        return Reference(baseline.tokens_per_s_predicted, baseline_tokens_per_s_measured,
                         f"the baseline (micro-batch {baseline.micro_batch} × accumulation "
                         f"{baseline.grad_accum}, {baseline_tokens_per_s_measured:,.0f} tokens/s "
                         f"measured)")
    slow_p, slow_m = _slowest(accs, False), _slowest(accs, True)
    parts = []
    if slow_p is not None:
        parts.append(f"predicted: {slow_p.setting}, micro-batch {slow_p.micro_batch} × "
                     f"{slow_p.grad_accum}")
    if slow_m is not None:
        parts.append(f"measured: {slow_m.setting}, micro-batch {slow_m.micro_batch} × "
                     f"{slow_m.grad_accum}")
    return Reference(slow_p.tokens_per_s_predicted if slow_p else None,
                     slow_m.tokens_per_s_measured if slow_m else None,
                     "the slowest row (" + ("; ".join(parts) or "no tokens/s known") + ")")


def seed_table(accs: list[RowAcc], ref: Reference, dataset_tokens: int | None,
               dataset_tokens_source: str, no_gpu: bool = False) -> SeedTable:
    rows = []
    for a in accs:
        tp, tm = a.tokens_per_s_predicted, a.tokens_per_s_measured
        rows.append(SeedRow(
            setting=a.setting, micro_batch=a.micro_batch, grad_accum=a.grad_accum,
            device_predicted_gib=_gib(a.device_predicted_bytes),
            device_measured_gib=_gib(a.device_measured_bytes),
            host_ram_measured_gib=_gib(a.host_ram_measured_bytes),
            tokens_per_s_predicted=tp, tokens_per_s_measured=tm,
            speed_up_predicted=_ratio(tp, ref.tokens_per_s_predicted),
            speed_up_measured=_ratio(tm, ref.tokens_per_s_measured),
            epoch_predicted_s=None if dataset_tokens is None or not tp else dataset_tokens / tp,
            epoch_measured_s=None if dataset_tokens is None or not tm else dataset_tokens / tm,
            fits_predicted=a.fits_predicted, status_measured=a.status_measured,
            reserved_predicted_gib=_gib(a.reserved_predicted_bytes),
            pick=" + ".join(p for p in ("plan", "tune") if p in a.pick),
            undecided=a.undecided))
    return SeedTable(rows=rows, reference=ref.text, dataset_tokens=dataset_tokens,
                     dataset_tokens_source=dataset_tokens_source, no_gpu=no_gpu)


# --- text cells -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TextTable:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    highlight: list[bool] = field(default_factory=list)
    """Rows to emphasise (the pick)."""
    groups: list[tuple[str, int]] = field(default_factory=list)
    """Optional upper header row: (title, number of columns under it); "" = no group."""

    def group_of(self) -> list[str]:
        out: list[str] = []
        for title, span in self.groups:
            out += [title] * span
        return out + [""] * (len(self.columns) - len(out))

    def flat_columns(self) -> list[str]:
        """One header row: "peak device (GiB), predicted"."""
        return [f"{g}, {c}" if g else c for g, c in zip(self.group_of(), self.columns, strict=True)]

    def numeric(self, i: int) -> bool:
        """Column i holds numbers (right-aligned)."""
        return bool(self.rows) and all(NUMERIC_CELL.match(r[i]) for r in self.rows)


NUMERIC_CELL = re.compile(r"^(unknown|[-+]?[\d,]*\.?\d+×?|(\d+ d )?\d+:\d\d:\d\d|\d+ × \d+|—|)$")


def fmt_gib(v: float | None) -> str:
    """GiB to 2 decimals; under 0.1 GiB to 3 significant digits (a tiny model's peaks of a few
    MiB read "0.00 GiB" in a QA run)."""
    if v is None:
        return UNKNOWN
    if 0 < abs(v) < 0.1:  # fixed point, never 9.54e-05: the digits 3 significant ones need
        return f"{v:.{2 - math.floor(math.log10(abs(v)))}f}"
    return f"{v:.2f}"


def fmt_bytes_gib(b: float | None) -> str:
    return UNKNOWN if b is None else fmt_gib(b / GIB)


def fmt_num(v: float | None, digits: int = 0) -> str:
    return UNKNOWN if v is None else f"{v:,.{digits}f}"


def fmt_x(v: float | None) -> str:
    return UNKNOWN if v is None else f"{v:.2f}×"


def fmt_pct(fraction: float | None) -> str:
    """Percent to 1 decimal; a non-zero share under 0.1 % to 2 significant digits (doctor's
    overhead of 0.05 % read "0.0 %" in a report, an audit)."""
    if fraction is None:
        return UNKNOWN
    pct = 100 * fraction
    if 0 < abs(pct) < 0.1:
        return f"{pct:.{1 - math.floor(math.log10(abs(pct)))}f}"
    return f"{pct:.1f}"


def fmt_sig(v: float | None, sig: int = 3) -> str:
    """``sig`` significant digits in fixed point (seconds from µs to hours): a measured 40 µs
    data wait read "0.0000" beside its 4 % share (an audit)."""
    if v is None:
        return UNKNOWN
    if v == 0:
        return "0"
    return f"{v:,.{max(0, sig - 1 - math.floor(math.log10(abs(v))))}f}"


def fmt_duration(s: float | None) -> str:
    """h:mm:ss (days written out past 24 h)."""
    if s is None:
        return UNKNOWN
    total = round(s)
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    text = f"{h}:{m:02d}:{sec:02d}"
    return f"{days} d {text}" if days else text


def judged_peak(x: object, on_cpu: bool) -> int | None:
    """The peak a probe is judged by: the device peak on a GPU (None where unknown: a card the
    catalog does not know has no predicted CUDA context); on CPU (no device peak) the live
    tensor bytes, which is what --memory-limit caps."""
    dev = getattr(x, "peak_device_bytes", None)
    return dev if dev is not None or not on_cpu else getattr(x, "peak_allocated_bytes", None)


def _fits(v: bool | None) -> str:
    return UNKNOWN if v is None else ("fits" if v else "over")


def peak_words(on_cpu: bool) -> str:
    """The memory column's name: a CPU has no device peak, its live tensor bytes stand there
    (an audit: "peak device" headed a CPU tune's live bytes, a footnote alone said so)."""
    return "peak live tensors (GiB; CPU)" if on_cpu else "peak device (GiB)"


def seed_text(t: SeedTable, on_cpu: bool = False) -> TextTable:
    reserved = _reserved_shown(t.rows)
    groups = [("", 3), (peak_words(on_cpu), 2), *([("peak reserved (GiB)", 1)] if reserved else []),
              ("host RAM (GiB)", 1), ("tokens/s", 2), ("speed-up", 2),
              ("time per epoch (h:mm:ss)", 2), ("fit", 1), ("probe", 1), ("", 1)]
    cols = ["setting", "micro-batch", "accumulation", "predicted", "measured",
            *(["predicted"] if reserved else []), "measured",
            "predicted", "measured", "predicted", "measured", "predicted", "measured", "predicted",
            "measured", "pick"]
    rows = [[r.setting, str(r.micro_batch), str(r.grad_accum), fmt_gib(r.device_predicted_gib),
             fmt_gib(r.device_measured_gib),
             *([fmt_gib(r.reserved_predicted_gib)] if reserved else []),
             fmt_gib(r.host_ram_measured_gib),
             fmt_num(r.tokens_per_s_predicted), fmt_num(r.tokens_per_s_measured),
             fmt_x(r.speed_up_predicted), fmt_x(r.speed_up_measured),
             fmt_duration(r.epoch_predicted_s), fmt_duration(r.epoch_measured_s),
             _fits(r.fits_predicted), r.status_measured or "not probed",
             r.pick or ("undecided (tune)" if r.undecided else "")]
            for r in t.rows]
    tokens = ("unknown, so time per epoch is unknown" if t.dataset_tokens is None
              else f"{t.dataset_tokens:,} tokens ({t.dataset_tokens_source})")
    notes = [f"speed-up is relative to {t.reference}", f"dataset: {tokens}",
             "GiB = 2^30 bytes; peak device = what nvidia-smi shows (reserved + CUDA context); "
             + ("the plan named no GPU: its predicted device peak is unknown (reserved + the "
                "card's CUDA context; a plan file written before 2026-12-05 gave the reserve "
                "alone there), its predicted reserved peak (max_memory_reserved) is shown "
                "beside; " if t.no_gpu else "")
             + "on CPU, which has none, the live tensor bytes (what --memory-limit caps)",
             "host RAM is only measured (the plan does not predict it)"]
    if any(r.undecided for r in t.rows):
        notes.append("undecided (tune): a change to tune's pick whose interleaved repeats did "
                     "not confirm a gain (tune kept the pick and said it could not decide, "
                     "dropped the change, or did not confirm it against the current "
                     "configuration): its measured tokens/s, the median of probes taken at "
                     "different moments, is not a speed-up over the pick")
    return TextTable("Micro-batch table (seed-002 style)", cols, rows, notes,
                     [bool(r.pick) for r in t.rows], groups)


def _sentences(parts: list[str]) -> str:
    """Notes as one cell: each its own sentence (the notes carry no end stop of their own)."""
    return " ".join(p if p.rstrip().endswith((".", ":", ";")) else p.rstrip() + "."
                    for p in parts if p.strip())


def _reserved_shown(rows: list[SeedRow] | list[Pick]) -> bool:
    """A reserved column where a row has a predicted reserve but no predicted device peak (a
    plan without a GPU): the page's only predicted memory figure then (an audit)."""
    return any(r.device_predicted_gib is None and r.reserved_predicted_gib is not None
               for r in rows)


def picks_text(picks: list[Pick], on_cpu: bool = False) -> TextTable:
    reserved = _reserved_shown(picks)
    groups = [("", 3), (peak_words(on_cpu), 2), *([("peak reserved (GiB)", 1)] if reserved else []),
              ("tokens/s", 2), ("", 1)]
    cols = ["from", "setting", "micro-batch × accumulation", "predicted", "measured",
            *(["predicted"] if reserved else []), "predicted", "measured", "why"]
    rows = [[f"{p.source} ({'measured' if p.source == 'tune' else 'predicted'})", p.setting,
             f"{p.micro_batch} × {p.grad_accum}", fmt_gib(p.device_predicted_gib),
             fmt_gib(p.device_measured_gib),
             *([fmt_gib(p.reserved_predicted_gib)] if reserved else []),
             fmt_num(p.tokens_per_s_predicted),
             fmt_num(p.tokens_per_s_measured), _sentences(p.why) or UNKNOWN] for p in picks]
    return TextTable("The pick and why", cols, rows, groups=groups)


def ladder_text(steps: list[LadderStep]) -> TextTable:
    cols = ["change", "peak device, predicted (GiB)", "tokens/s, predicted", "fits (predicted)",
            "alters learning"]
    rows = [[s.change, fmt_bytes_gib(s.peak_device_bytes), fmt_num(s.tokens_per_s), _fits(s.fits),
             UNKNOWN if s.alters_learning is None else ("yes" if s.alters_learning else "no")]
            for s in steps]
    return TextTable("Memory-saving ladder (nothing fits as asked)", cols, rows,
                     ["each step adds to the ones above it; all numbers predicted"])


def probes_text(probes: list[Probe], on_cpu: bool) -> TextTable:
    # on CPU there is no device peak: the live tensor bytes --memory-limit caps (judged_peak)
    groups = [("", 7), ("status", 1), ("peak device (GiB; CPU: live tensors)", 2),
              ("host RSS (GiB)", 1), ("tokens/s", 2),
              ("data wait (%)", 1), ("probe time (s)", 1)]
    cols = ["probe", "stage", "micro-batch × accumulation", "precision", "checkpointing", "workers",
            "compile", "measured", "predicted", "measured", "measured", "predicted", "measured",
            "measured", "measured"]
    rows = []
    for p in probes:
        m, q = p.measured, p.predicted
        rows.append([
            str(p.index), p.stage or UNKNOWN, f"{p.micro_batch} × {p.grad_accum}",
            str(p.job.get("precision", UNKNOWN)), str(p.job.get("grad_ckpt", UNKNOWN)),
            UNKNOWN if p.num_workers is None else str(p.num_workers),
            UNKNOWN if p.compile is None else ("on" if p.compile else "off"), p.status,
            fmt_bytes_gib(judged_peak(q, on_cpu) if q else None),
            fmt_bytes_gib(judged_peak(m, on_cpu) if m else None),
            fmt_bytes_gib(m.host_rss_bytes if m else None),
            fmt_num(q.tokens_per_s if q else None), fmt_num(m.tokens_per_s if m else None),
            fmt_pct(m.data_wait_fraction if m else None),
            fmt_num(p.probe_time_s, 1)])
    notes = ["predicted peak device unknown: the card is not in trainfit's catalog, so its CUDA "
             "context is unknown (the predicted reserved peak is in the tune JSON)"] \
        if not on_cpu and any(p.predicted is not None and p.predicted.peak_device_bytes is None
                              for p in probes) else []
    return TextTable("Probes (tune)", cols, rows, notes, groups=groups)


def _oom_words(e: OomEvent) -> str:
    """One OOM event as train prints it: a training step numbered from 1 (train.json counts the
    steps done before it), an evaluation by the step it followed."""
    if e.phase == "eval":  # its batch is the evaluation's (eval_batch_* in train.json)
        return (f"evaluation after step {e.step}: evaluation batch {e.micro_batch_before} → "
                f"{e.micro_batch_after}")
    where = "unknown step" if e.step is None else f"step {e.step + 1}"
    return (f"{where} ({e.phase or 'unknown phase'}): micro-batch {e.micro_batch_before} → "
            f"{e.micro_batch_after}")


def train_text(t: TrainSummary) -> TextTable:
    cols = ["quantity", "value (measured)"]
    ran = f"; ran at {' → '.join(t.ran_at)}" if t.ran_at else ""
    # train.json's job is the last run's (a resume at another micro-batch rewrites it)
    each = f" per rank × {t.ranks} ranks" if t.ranks > 1 else ""
    everyone = f", all {t.ranks} ranks" if t.ranks > 1 else ""
    rows = [["configuration", f"{t.setting}, micro-batch {t.micro_batch} × {t.grad_accum}{each} "
             f"(the job as last run){ran}"],
            ["steps", fmt_num(t.steps)], ["samples seen", fmt_num(t.samples_seen)],
            ["tokens seen", fmt_num(t.tokens_seen)],
            ["wall time (h:mm:ss)", fmt_duration(t.wall_time_s)],
            # tokens ÷ the segments' wall time: checkpoint saves and evaluation in it (an audit
            # read it beside the progress line's per-step rate); the clock starts at the loop,
            # after the model is built and the data tokenized (an audit: "loading included" was
            # said of 42.6 s in a 57.8 s process)
            [f"tokens/s, tokens ÷ wall time (the training loop's: saves and evaluation "
             f"included, model loading and tokenizing not{everyone})",
             fmt_num(t.tokens_per_s_measured)],
            ["final loss", fmt_num(t.final_loss, 4)],
            ["training loss over the steps", loss_words(t.losses, t.unrecorded_steps)],
            ["evaluation", eval_words(t)],
            ["OOM events (survived)", ("none" if not t.oom_events else "; ".join(
                _oom_words(e) for e in t.oom_events))
             + ("; the run ended on one (see ended)" if t.ended.startswith("failed: out of "
                                                                         "memory") else "")],
            ["checkpoints", str(len(t.checkpoints))],
            ["ended", t.ended],
            # the record's segments: a resume into a new --out carries the earlier ones (an
            # audit read "runs into this directory" where one segment ran there)
            ["segments (each run that trained this record)", segment_words(t)],
            ["resumed from", t.resumed_from or "—"]]
    return TextTable(f"Training run ({t.path})", cols, rows)


def loss_words(losses: list[float | None], unrecorded_steps: int = 0) -> str:
    """The per-step losses in a line: first, lowest and last (measured), the non-finite counted
    apart from the first ``unrecorded_steps`` (run before a resume from a checkpoint that
    carried no history: not recorded, not non-finite)."""
    skipped = min(unrecorded_steps, len(losses))
    known = [(i + 1, v) for i, v in enumerate(losses) if v is not None]
    gap = f"; steps 1–{skipped} not recorded (resumed from a checkpoint without history)" \
        if skipped else ""
    if not known:
        if not losses or skipped == len(losses):
            return "not recorded"
        return f"none finite ({len(losses) - skipped} steps){gap}"
    low = min(known, key=lambda x: x[1])
    bad = len(losses) - skipped - len(known)
    return (f"{known[0][1]:.4f} at step {known[0][0]} → {known[-1][1]:.4f} at step "
            f"{known[-1][0]}; lowest {low[1]:.4f} at step {low[0]}"
            + (f"; {bad} step(s) not finite" if bad else "") + gap
            + " (the loss figure draws each)")


def eval_words(t: TrainSummary) -> str:
    """The evaluations: the last and the best (measured), or why there are none."""
    done = [e for e in t.evals if e.eval_loss is not None]
    if not done:
        # none recorded: no evaluation set, or a run stopped before its first --eval-every
        return ("none recorded (train evaluates with --eval-data or --eval-fraction)"
                if not t.evals else f"{len(t.evals)} evaluation(s), none finite")
    last, best = done[-1], min(done, key=lambda e: e.eval_loss or 0.0)
    ppl = "" if last.eval_perplexity is None else f", perplexity {last.eval_perplexity:,.4g}"
    return (f"{len(done)} evaluation(s); last: loss {last.eval_loss:.4f} at step {last.step}{ppl}"
            + ("" if best is last else f"; lowest: {best.eval_loss:.4f} at step {best.step}"))


def segment_words(t: TrainSummary) -> str:
    """Each segment's steps, how it stopped and what it resumed from."""
    if not t.segment_rows:
        return str(t.segments)
    def span(r: SegmentRow) -> str:
        if r.end_step == r.start_step:
            return "no step"
        if r.end_step == r.start_step + 1:
            return f"step {r.end_step}"
        return f"steps {r.start_step + 1}–{'?' if r.end_step is None else r.end_step}"

    return "; ".join(f"{r.segment}: {span(r)}, {r.stopped or 'end not recorded'}"
                     + (f", from {r.resumed_from}" if r.resumed_from else "")
                     for r in t.segment_rows)
