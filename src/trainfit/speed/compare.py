"""The verdict of two configurations measured in interleaved rounds (:class:`Comparison`): the
rule that decides whether a measured gain is real, apart from the search that proposes and
measures the candidates (search.py). Pure: no torch, no timing."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

NOISE_FLOOR = 0.03
"""Smallest relative speed gain ever called real: tune's default (SearchOptions.noise_floor)
and doctor's before/after."""
ROUNDS = 4
"""Interleaved rounds a gain must survive (tune's SearchOptions.rounds, doctor's most): every
round faster and no overlap happens to two equally fast configurations 1 in C(8, 4) = 70 times."""
DECISIVE_NOISE = 5.0
"""A gain this many times the measured noise, in each of at least two interleaved rounds and
between every repeat, is decided with fewer than
:attr:`SearchOptions.rounds` rounds.  Not monotonic in the rounds: where the budget cuts decides
whether a third, weaker round is measured (2.2×, 2.4× decide; 2.2×, 2.4×, 1.3× do not until all
rounds agree), so two runs cut at different points can differ on a gain that is real but
noisy."""


@dataclass
class Comparison:
    """Two configurations measured in interleaved rounds: the per-round tokens/s ratios (B ÷ A)
    and the verdict they support."""

    ratios: list[float]
    """B ÷ A of each interleaved round (A and B measured back to back)."""
    noise: float
    """The relative noise this comparison measured: the largest of the noise floor, the median
    of the probes' own step spreads, and the spread of each configuration's repeats (max − min
    over median; from 4 rounds on, without the one round farthest from the others)."""
    verdict: str
    """``faster``: every round shows B faster by more than the floor, the slowest B beats the
    fastest A by the floor (the repeats do not overlap), and the median gain is beyond ``noise``;
    ``not_faster``: the median ratio is within
    the floor and so is most rounds' (or B no longer fits); ``undecided``: the repeats disagree or
    the gain is inside the noise."""
    proposal: float | None = None
    """B ÷ A of the probes that proposed the candidate: not a round — they ran at different
    moments of the search, so a host busy during one of them (a CPU tune beside another job
    measured a configuration at 132 tokens/s, then at 4,831-5,501 on every repeat) would make
    the round's ratio and the repeats' spread the host's, not the knob's.  Said, never counted."""
    ended: str | None = None
    """Why the rounds stopped before all were measured: ``no_longer_fits`` (a re-measure of B ran
    out of memory), ``budget`` (``--budget-s`` was spent before the next round: none or some ran);
    None otherwise (all ran, or a round contradicted the gain)."""
    why: str | None = None
    """For ``undecided``: the rule the rounds did not pass, in words (every round faster and
    the median beyond the noise read as a contradiction when the repeats overlapped: a QA run)."""
    redone: float | None = None
    """B ÷ A of a round measured again and not counted (tune's search, once a comparison): one
    side ran at under half its own pace in it (another process took the cores for it); None when
    no round was. With equally fast configurations and 30 % of probes disturbed to 0.3× (σ 0.3),
    the rounds then pass 1 in 68 (177 of 12,000 simulated; 1 in 85 without the redo)."""

    @classmethod
    def of(cls, a_s: list[float], b_s: list[float], spreads: list[float], floor: float,
           rounds: int, proposal: float | None = None) -> Comparison:
        ratios = [b / a for a, b in zip(a_s, b_s, strict=True) if a > 0]
        if not ratios:
            # no round ran (the budget): nothing is decided, but a proposal that was not faster
            # keeps the incumbent, as it proposed nothing (a review: the search's best, 0.12×
            # the current configuration in its one probe, became the pick after a budget cut)
            slower = proposal is not None and proposal <= 1 + floor
            return cls(ratios=[], noise=0.0, verdict="not_faster" if slower else "undecided",
                       proposal=proposal, ended="budget")

        def rel_range(xs: list[float]) -> float:
            med = statistics.median(xs)
            return (max(xs) - min(xs)) / med if med else 0.0
        # each side's repeats without the round farthest from the others, from 4 rounds on
        # (another process took the cores for it): one baseline repeat at a 14th of its speed
        # read as 404 % noise and left a gain every round showed (1.83-1.95×, no overlap)
        # undecided (an audit). That round still counts in every rule below: its ratio, the
        # overlap. The probes' own spreads stay whole: their order is the caller's
        near_a, near_b = a_s, b_s
        if len(ratios) >= 4 and len(ratios) == len(a_s):
            med = statistics.median(ratios)
            odd = max(range(len(ratios)), key=lambda i: abs(ratios[i] - med))
            near_a, near_b = a_s[:odd] + a_s[odd + 1:], b_s[:odd] + b_s[odd + 1:]
        # the probes' own step spreads by their median: one probe a neighbour disturbed (its
        # steps 145 % apart, where the rounds' repeats moved 27-31 %) set the noise of the whole
        # comparison and left a gain every round showed, 1.67-3.03× with no overlap, "inside the
        # noise" (an audit); the repeats' spread still counts whole
        noise = max(floor, statistics.median(spreads) if spreads else 0.0, rel_range(near_a),
                    rel_range(near_b))
        # every round faster, and no overlap: the slowest B beats the fastest A. For two equally
        # fast configurations under any noise the chance of that is 1 / C(2n, n) (n = 4 rounds:
        # 1 in 70), so a knob without an effect is not taken. And the gain beyond the noise this
        # run measured: a real gain inside it passes in some runs and not in others (eager
        # attention, 5-10 % over sdpa at 5-14 % noise on this CPU, was the pick in 2 of 5 runs
        # of the same tune), so such a gain is left undecided in every run; one beyond the
        # noise always passes
        full = len(ratios) >= rounds and min(ratios) > 1 + floor and \
            min(b_s) > max(a_s) * (1 + floor) and statistics.median(ratios) > 1 + noise
        # fewer rounds (the budget stopped them): a gain beyond DECISIVE_NOISE × the noise this
        # run measured in every round and between the repeats (bf16 autocast 2.2× and 2.5× the
        # tokens/s of fp32 at 8 % noise, a CPU tune of llama-tiny-58m, was left "undecided")
        margin = 1 + DECISIVE_NOISE * noise
        decisive = len(ratios) >= 2 and min(ratios) > margin and min(b_s) > max(a_s) * margin
        why = None
        if full or decisive:
            verdict = "faster"
        elif statistics.median(ratios) <= 1 + floor and \
                2 * sum(r <= 1 + floor for r in ratios) > len(ratios):
            # most rounds show no gain: a median pulled down by one round of two, against a
            # gain in the other, is not agreement (a doctor run on a busy host: 1.77× then
            # 0.02×, its after round 463 ms against 16 ms, was called "did not make it faster")
            verdict = "not_faster"
        else:
            verdict = "undecided"
            why = _undecided_why(ratios, a_s, b_s, floor, noise, rounds)
        return cls(ratios=ratios, noise=noise, verdict=verdict, proposal=proposal, why=why)

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None


def _undecided_why(ratios: list[float], a_s: list[float], b_s: list[float], floor: float,
                   noise: float, rounds: int) -> str:
    """The first rule of :meth:`Comparison.of`'s ``faster`` the rounds did not pass."""
    # a round that contradicts the gain first: the rounds stop at it, so "only 2 of 4 rounds
    # ran" would read as the budget's doing (a review)
    if min(ratios) <= 1 + floor:
        # in percent to a hundredth: "not faster by more than 3% (1.03×)" read as a rule that
        # contradicts itself, the ratio rounded up from 1.0299 (an audit)
        return (f"a round was not faster by more than {floor:.0%} "
                f"({min(ratios) - 1:+.2%})")
    if len(ratios) < rounds:
        return f"only {len(ratios)} of {rounds} rounds ran, and the gain is not decisive"
    if min(b_s) <= max(a_s) * (1 + floor):
        return (f"the repeats overlap: the slowest repeat of the candidate ({min(b_s):,.0f} "
                f"tokens/s) does not beat the fastest of the other ({max(a_s):,.0f}) by "
                f"{floor:.0%}")
    return f"the median gain, {statistics.median(ratios):.2f}×, is inside the noise ({noise:.0%})"
