"""Display of a :class:`~trainfit.doctor.result.DoctorResult`: rich tables. Formatting only: every
number shown (the ± and the after ÷ before included) and every verdict comes from the result."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from trainfit.doctor.observation import Finding
from trainfit.doctor.result import Compared, DoctorResult

SPLIT_ROWS = (("data_wait_s", "waiting for data"), ("h2d_copy_s", "host→device copy"),
              ("forward_s", "forward"), ("backward_s", "backward"), ("optimizer_s", "optimizer (+ clipping)"),
              ("sync_s", "sync points (.item(), .cpu() …)"), ("logging_io_s", "logging / checkpoint I/O"),
              ("idle_s", "device idle between kernels"), ("other_s", "other (loop code, zero_grad …)"))


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s":
        if abs(v) < 1e-3 and v:
            return f"{v * 1e6:.1f} µs"
        return f"{v * 1e3:.2f} ms" if abs(v) < 1 else f"{v:.3f} s"
    if unit == "bytes":
        return f"{v / 2**30:.2f} GiB" if abs(v) >= 2**30 else f"{v / 2**20:.1f} MiB"
    if unit == "fraction":
        return f"{v:.1%}"
    if unit == "bytes/s":
        return f"{v / 2**20:.1f} MiB/s"
    if unit == "FLOP/s":  # a peak rate: an audit read "peak_flops 94,307,725,595" without one
        return f"{v / 1e12:.2f} TFLOP/s" if v >= 1e12 else f"{v / 1e9:.1f} GFLOP/s"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _unit(key: str) -> str:
    for suffix, unit in (("_bytes_per_s", "bytes/s"), ("_flop_per_s", "FLOP/s"), ("_bytes", "bytes"),
                         ("_s", "s"), ("_fraction", "fraction"), ("mfu", "fraction"),
                         ("flops", "FLOP/s")):  # peak_flops: the key before 2026-12-05
        if key.endswith(suffix):
            return unit
    return ""


def evidence_text(f: Finding) -> str:
    return ", ".join(f"{k} {_num(v, _unit(k))}" for k, v in f.evidence.items() if v is not None)


def split_table(r: DoctorResult) -> Table:
    s = r.split
    pooled = f", the {r.before.rounds} 'before' rounds pooled" if r.before.rounds > 1 else ""
    t = Table(title=f"Step time split — median per step over {r.steps_measured} steps{pooled} "
              "(measured)", title_justify="left")
    t.add_column("part")
    t.add_column("time / step", justify="right")
    t.add_column("% of step", justify="right")
    for key, name in SPLIT_ROWS:
        v = getattr(s, key)
        if v is None and key == "idle_s":
            t.add_row(name, "n/a on CPU" if r.device == "cpu" else "—", "")
            continue
        t.add_row(name, _num(v, "s"), _num(s.fraction(key), "fraction"))
    t.add_row(Text("step", style="bold"), Text(_num(s.step_time_s, "s"), style="bold"),
              # max − min of the steps, in seconds: "spread" in the % column read as a share
              f"range {_num(s.step_time_spread_s, 's')} (slowest − fastest step)")
    if s.parts_scale < 1.0:
        # each part's median is taken alone: on a noisy host they can sum past the median step
        t.caption = (f"the parts' medians summed to {1 / s.parts_scale:.0%} of the median step "
                     f"(a noisy host): each is shown scaled by {s.parts_scale:.3f} to it")
        t.caption_justify = "left"
    return t


def findings_block(findings: list[Finding], title: str) -> Group:
    """One block per finding (a table squeezes the fix text into a column too narrow to read)."""
    parts: list[Text] = [Text(title, style="italic")]
    for i, f in enumerate(findings, 1):
        g = f.gain_fraction
        bound = "at most " if f.gain_upper_bound and not f.gain_measured else ""
        gain = "gain unknown" if g is None else (
            f"{'measured' if f.gain_measured else 'predicted'} gain {bound}{g:+.0%} tokens/s"
            + (", a short probe" if f.gain_measured else ""))
        parts.append(Text.assemble(f"{i}. ", (f.bottleneck, "bold red" if i == 1 else "bold"),
                                   f"  ({gain})"))
        parts.append(Text(f"   {f.detail}"))
        parts.append(Text(f"   evidence (measured): {evidence_text(f)}", style="dim"))
        parts.append(Text(f"   fix: {f.fix}"))
    return Group(*parts)


COMPARE_ROWS = {"step_time_s": ("step time", "s"), "tokens_per_s": ("tokens/s", ""),
                "data_wait_fraction": ("data wait + host→device copy (% of the step)",
                                       "fraction"),
                "gpu_util_percent": ("GPU utilisation", "percent")}
"""Each before/after row's label and unit, by its Metrics field.  The input's share is read as the
split table reads it (split.input_fraction: the median wait + the median copy ÷ the median step),
so the 'before' column is the sum of the split table's two rows (an audit read 0.7 % there and
2.2 % here, the median of each step's share, for the same steps)."""


def _pm(v: float | None, pm: float | None, unit: str) -> str:
    if v is None:
        return "unknown"
    text = f"{v:.0f} %" if unit == "percent" else _num(v, unit)
    return f"{text} ± {_num(pm, unit)}" if pm is not None else text


def _rounds(n: int) -> str:
    return f"{n} round{'s' if n > 1 else ''}"


def compare_table(r: DoctorResult) -> Table:
    t = Table(title="Before / after (measured; median of the rounds, ± half their spread)",
              title_justify="left")
    t.add_column("")
    t.add_column(f"before ({_rounds(r.before.rounds)})", justify="right")
    if r.after is not None:
        t.add_column(f"after ({_rounds(r.after.rounds)})", justify="right")
        t.add_column("change", justify="right")
    for row in r.compared():
        t.add_row(*_compare_cells(row, r.after is not None))
    b, s = r.before.step_time_s, r.split.step_time_s
    if b and s and abs(b / s - 1) >= 0.01:
        # two medians of the same run over different sets (an audit: the two step times on one
        # screen were unexplained)
        t.caption = (f"'before' step time: the median of the rounds' own medians; the split's "
                     f"step ({_num(s, 's')}): the median over every measured step, pooled — "
                     f"{abs(b / s - 1):.0%} apart on this host")
        t.caption_justify = "left"
    return t


def _compare_cells(row: Compared, with_after: bool) -> list[str]:
    name, unit = COMPARE_ROWS[row.key]
    cells = [name, _pm(row.before, row.before_pm, unit)]
    if with_after:
        cells += [_pm(row.after, row.after_pm, unit), "—" if row.change is None else f"{row.change:.2f}×"]
    return cells


def gain_sentence(r: DoctorResult) -> str:
    """The verdict of the interleaved before/after rounds, with the ratios it rests on."""
    g = r.gain
    assert g is not None
    rounds = ", ".join(f"{x:.2f}×" for x in g.ratios)
    what = (f"tokens/s after ÷ before in each interleaved round (measured): {rounds}; noise "
            f"this run measured {g.noise:.0%}")
    words = r.gain_words
    if words == "faster":
        return f"the fix is faster in every round, beyond the noise — {what}"
    if words == "slower":
        return f"the fix made the step slower — {what}; keep your configuration"
    if words == "not_faster":
        return f"the fix did not make the step faster — {what}; keep your configuration"
    why = ("one round cannot separate a fix from the host's noise" if len(g.ratios) < 2 else
           "the rounds disagree, or the gain is inside the noise")
    return (f"could not decide: {why} — {what}; rerun on a quieter machine or with more "
            "--repeats")


def render(r: DoctorResult) -> Group:
    head = Text.assemble(("trainfit doctor ", "bold"), r.target, f"  ({r.device}, {r.kind})")
    parts: list[Any] = [head, split_table(r)]
    if r.findings:
        parts.append(findings_block(r.findings, "Findings (the first is the bottleneck)"))
    parts.append(compare_table(r))
    if r.applied:
        # the job file is never written (a QA run read "applied" as done): say where it went
        heading = ("applied to the re-measured run (measured faster; your job file is unchanged: "
                   "set these in it to keep them):") if r.gain_words == "faster" else \
            "tried (not confirmed: keep your configuration unless a rerun confirms it):"
        parts.append(Text(heading + "\n" + "\n".join(f"  • {a}" for a in r.applied)))
        if r.gain is not None:
            parts.append(Text(gain_sentence(r), style="bold" if r.gain_words == "faster" else ""))
    elif r.kind == "command":
        parts.append(Text("fixes printed, not applied: the script is yours to change (a trainfit job "
                          "gets them applied and re-measured)", style="dim"))
    nxt = r.after_bottleneck
    if nxt is not None:
        parts.append(Text(f"after the fixes the step is {nxt.bottleneck}: {nxt.detail}"))
    if r.overhead_fraction is not None:
        parts.append(Text(f"doctor's own overhead on the measured steps: {r.overhead_fraction:.2%} "
                          "(measured: hook calls × timed cost of one, + the sampler's CPU time)",
                          style="dim"))
    for n in r.notes:
        parts.append(Text(f"note: {n}", style="dim"))
    return Group(*parts)
