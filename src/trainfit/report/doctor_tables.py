"""Doctor's section of the report as text cells: where a step's time goes, before / after the
fixes with doctor's verdict, and the findings with what each gain is (apart from the seed table
and the run tables in :mod:`trainfit.report.tables`, whose cell formats it shares)."""

from __future__ import annotations

from trainfit.report.inputs import Finding
from trainfit.report.model import DoctorSection
from trainfit.report.tables import UNKNOWN, TextTable, fmt_num, fmt_pct, fmt_sig

VERDICT_WORDS = {"faster": "faster in every round, beyond the noise",
                 "slower": "slower: keep the configuration as it was",
                 "not_faster": "not faster: keep the configuration as it was",
                 "undecided": "could not decide (the rounds disagree, or the gain is inside the "
                              "noise): the change above is not established"}


def _evidence_value(v: float | None) -> str:
    """A whole number as one (949 ops, not 949.000), anything else to 4 significant digits (an
    op's 5.5 µs read 0.000 at 3 decimals)."""
    if v is None:
        return UNKNOWN
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:.4g}"


def _gain_cell(f: Finding) -> str:
    if f.gain_fraction is None:
        return UNKNOWN
    if f.gain_measured:
        return f"{fmt_pct(f.gain_fraction)} (measured, a short probe)"
    if f.gain_upper_bound:
        return f"≤ {fmt_pct(f.gain_fraction)} (predicted upper bound)"
    return f"{fmt_pct(f.gain_fraction)} (predicted)"


def verdict_words(d: DoctorSection) -> str:
    """Doctor's verdict on what it applied, as doctor said it: a change of the medians above is
    not a gain unless the interleaved rounds agree beyond the noise (a QA run's report showed
    +12 % where doctor had said it could not decide)."""
    if d.verdict is None:
        return "doctor's verdict: unknown (not in this file)"
    rounds = ", ".join(f"{r:.2f}×" for r in d.verdict_ratios) or "none"
    noise = "unknown" if d.verdict_noise is None else f"{d.verdict_noise:.0%}"
    return (f"doctor's verdict: {VERDICT_WORDS.get(d.verdict, d.verdict)} — tokens/s after ÷ "
            f"before per interleaved round (measured): {rounds}; noise measured {noise}")


def doctor_texts(d: DoctorSection) -> list[TextTable]:
    step = d.step_time_s
    # what a CPU has no reading of (no kernel timeline, no GPU), as doctor says it
    na = "n/a on CPU" if d.device == "cpu" else UNKNOWN
    split = TextTable(
        "Where a step's time goes (measured, median per step)", ["part", "seconds (measured)",
                                                                 "share of step (%)"],
        [[name, na if v is None and name == "idle" else fmt_sig(v),
          na if v is None and name == "idle" else fmt_pct(None if v is None or not step else v / step)]
         for name, v in d.split_s] + [["step", fmt_sig(step), "100.0" if step else UNKNOWN]],
        [] if d.parts_scale is None or d.parts_scale >= 1 else
        [f"the parts' medians, each taken alone, summed past the median step (a noisy host): "
         f"each is shown scaled by {d.parts_scale:.3f} to it, as doctor did"])
    before_after = TextTable(
        "Before / after the fixes (measured)", ["metric", "before (measured)", "after (measured)",
                                                "change (%)"],
        [[f"{r.metric} ({r.unit})", fmt_sig(r.before) if r.unit == "s" else fmt_num(r.before, 1),
          "not re-measured" if r.after is None else fmt_sig(r.after) if r.unit == "s"
          else fmt_num(r.after, 1),
          fmt_pct(r.change_fraction)] if not (r.metric == "GPU utilisation" and d.device == "cpu")
         else [f"{r.metric} ({r.unit})", na, na, na] for r in d.rows],
        [f"applied: {', '.join(d.applied) or 'nothing'}",
         *([verdict_words(d)] if d.applied else []),
         f"doctor's own overhead: {fmt_pct(d.overhead_fraction)} % of a step (measured)"])
    each = (("half of each of the command's 2 measured windows (run twice: the host was busy)"
             if (d.command_runs or 1) > 1 else "half of the command's measured window")
            if d.form == "command" else "'before' round")
    findings = TextTable(
        "Findings", ["bottleneck", "why (doctor's reading)", "evidence (measured)", "fix",
                     "gain (%)"],
        [[f.bottleneck, f.detail or UNKNOWN,
          ", ".join(f"{k} = {_evidence_value(v)}" for k, v in f.evidence.items()) or "—",
          f.fix or "—", _gain_cell(f)] for f in d.findings],
        [*(["bottleneck named by each "
            + each + f": {', '.join(d.round_bottlenecks)} — "
            + ("held" if len(set(d.round_bottlenecks)) == 1 else "did not hold")]
           if len(d.round_bottlenecks) >= 2 else []), *d.notes])
    return [split, before_after, findings]
