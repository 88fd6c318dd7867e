"""Whether doctor's fixes made the step faster, and whether its verdict held across the rounds:
the interleaved before/after rounds judged by the rule tune's pick obeys (speed/compare.py)."""

from __future__ import annotations

from dataclasses import replace

from trainfit.doctor.measure import Round
from trainfit.doctor.observation import Finding
from trainfit.speed.compare import NOISE_FLOOR, ROUNDS, Comparison


def contradicted(gain: Comparison) -> bool:
    """A round was not faster: ``faster`` can no longer be reached, and tune's compare stops there
    too. The rounds run to tune's :data:`ROUNDS` otherwise — a gain decisive in two rounds is not
    called faster before the others (tune's compare runs them all unless its budget ends; an
    audit found doctor deciding on 2). A stop here leaves the verdict ``undecided`` or ``not
    faster`` by the rounds run; either way the configuration is kept."""
    return min(gain.ratios, default=0.0) <= 1 + NOISE_FLOOR


def gain_of(befores: list[Round], afters: list[Round]) -> Comparison:
    """Whether the fixes made the step faster, by the rule tune's pick obeys (speed/compare.py):
    the interleaved rounds (before k, after k) must all agree beyond the noise this run measured
    — the rounds' own step spreads and each side's spread over its repeats.  One round cannot
    tell a fix from the host's noise: at least two are asked for (``--repeats``).  A QA run on
    a busy host had before 1,038 / 353 / 525 ms against after 998 / 996 / 1,000 ms, and the
    fix was printed as applied with its median ratio."""
    spreads = [r.split.step_time_spread_s / r.split.step_time_s for r in (*befores, *afters)
               if r.split.step_time_s > 0]
    return Comparison.of([r.tokens_per_s for r in befores], [r.tokens_per_s for r in afters],
                         spreads, NOISE_FLOOR, ROUNDS)


def held_across_rounds(findings: list[Finding], rounds: list[str], notes: list[str],
                       what: str = "'before' rounds", whole: str = "the pooled rounds"
                       ) -> list[Finding]:
    """The pooled rounds' findings, the headline's gain withdrawn when the 'before' rounds (or a
    command's halves of its measured window: ``what``, the whole of them: ``whole``) named
    different bottlenecks, or agreed on one the pooled steps do not name (said in ``notes``): a
    gain the repeats contradict is not stated (an audit: it headed the table all the same)."""
    if len(rounds) < 2:
        return findings
    pooled = findings[0].bottleneck if findings else "none"
    if len(set(rounds)) < 2 and pooled == rounds[0]:
        return findings
    named = ", ".join(rounds)
    notes.append(f"the verdict did not hold across the {len(rounds)} {what} of this run "
                 f"({named}): {whole} name {pooled}, with that uncertainty")
    if not findings:
        return findings
    head = findings[0]
    return [replace(head, gain_fraction=None,
                    detail=f"undecided: the {what} named {named}; {head.detail}"),
            *findings[1:]]
