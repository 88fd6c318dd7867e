"""The search ``tune`` runs over real probes: the largest micro-batch that fits, then the fastest
knobs — starting from the prediction, keeping the effective batch exact, and calling a speed
difference real only when it survives an interleaved re-measurement (CPU timings here move by up to
35 % between repeats: docs/notes/cpu-timing-noise.md).

Pure logic over two callables (``probe``, ``predict``), so it is tested with fake probes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from trainfit.job import JobSpec
from trainfit.job.fields import KNOB_NAMES
from trainfit.job.fields import KNOBS as KNOB_REGISTRY
from trainfit.speed.compare import Comparison
from trainfit.tune.knobs import KnobStage
from trainfit.tune.result import ProbeResult, SearchNote
from trainfit.tune.trial import (
    Outcome,
    Predicted,
    SearchOptions,
    Trial,
    changed_fields,
    micro_options,
    peak_of,
    rel_spread,
)

KNOBS = KNOB_NAMES  # the registry of tune's knobs (trainfit.job.fields)
KNOB_FIELDS = {k.name: k.fields for k in KNOB_REGISTRY}


OUTLIER_BELOW = 1 / 3
"""A candidate's one probe below this fraction of the tokens/s its prediction gives at the
incumbent's measured pace (measured ÷ predicted of the incumbent, times the candidate's
prediction) is re-measured once before it is dropped: the speed model's held-out errors are
within ±50 % (benchmarks/results/speed_published.md), so a third is not a prediction's miss."""
UNSTEADY_SPREAD = 2.0
"""Fastest ÷ slowest timed probe of one configuration beyond which a run's timings are called
unsteady (:meth:`Searcher.repeat_spread_note`): on a quiet host this machine's kind moved a
configuration's tokens/s by up to ~35 % between repeats, 1.5× between the fastest and slowest of
three (docs/notes/cpu-timing-noise.md: 3,543 against 2,362), where a CPU tune beside another job
measured one configuration at 132 and 5,501."""


class Searcher(KnobStage):
    def __init__(self, base: JobSpec, probe: Callable[[JobSpec, int], ProbeResult],
                 predict: Callable[[JobSpec], Predicted | None], capacity_bytes: int | None,
                 options: SearchOptions, dataset_samples: int,
                 progress: Callable[[str], None] | None = None,
                 agree: Callable[[bool], bool] | None = None) -> None:
        self.base = base
        self.agree = agree or (lambda flag: flag)
        """Under many ranks: a decision flag all ranks share (any rank's True)."""
        self._probe = probe
        self.predict = predict
        self.capacity = capacity_bytes
        self.o = options
        self.n_samples = dataset_samples
        self.trials: list[Trial] = []
        self.notes: list[SearchNote] = []
        self.cut_candidates: list[str] = []
        self.repeats_timed = False
        """Some configuration's timed probes were repeated (:meth:`repeat_spread_note`)."""
        self.one_probe: list[tuple[list[tuple[str, Any]], float]] = []
        """Candidates dropped on one probe no faster than the incumbent: (changes, ratio)."""
        self.t0 = time.perf_counter()  # the budget is the search's (tune/tuner.py run_search)
        self.stopped = False
        self.progress = progress or (lambda _s: None)

    # --- probing ------------------------------------------------------------------------------
    def limit_bytes(self) -> int | None:
        return None if self.capacity is None else int(self.capacity * (1 - self.o.margin))

    def _fits(self, r: ProbeResult) -> bool:
        if r.status != "ok":
            return False
        lim = self.limit_bytes()
        p = peak_of(r)
        return lim is None or p is None or p <= lim

    def _next_probe_s(self, timed: int, probes: int) -> float:
        """How long the next ``probes`` probes of ``timed`` timed steps each should take: the
        last probe with as many timed steps, else the last probe scaled by its step count. The
        last probe alone (a 1-step memory probe before a 4-step timed one, or two back-to-back
        round probes counted as one) let a 60 s budget overrun by 30-60 % (an audit)."""
        same = [t.result.probe_time_s for t in self.trials if t.timed_steps == timed]
        if same:
            return probes * same[-1]
        last = self.trials[-1]
        return probes * last.result.probe_time_s * (1 + timed) / (1 + last.timed_steps)

    def over_budget(self, timed: int = 3, probes: int = 1) -> bool:
        """Whether the budget leaves no time for the next ``probes`` probe(s) of ``timed`` timed
        steps (a collective under many ranks); notes the budget the first time."""
        if self.o.budget_s is None or not self.trials:
            return False  # the first probe always runs: with none there is nothing to report
        spent = time.perf_counter() - self.t0
        if self.agree(spent + self._next_probe_s(timed, probes) > self.o.budget_s):
            if not self.stopped:
                self.notes.append(SearchNote("budget", {"budget_s": self.o.budget_s, "spent_s": spent,
                                                       "probes": len(self.trials)}))
            self.stopped = True
        return self.stopped

    def run(self, job: JobSpec, stage: str, timed: int, note: str = "") -> Trial:
        self.progress(f"{stage}: micro-batch {job.micro_batch} × {job.grad_accum}, "
                      f"{job.precision}, ckpt {job.grad_ckpt}, {job.attention}, "
                      f"{job.optimizer_impl}, workers {job.num_workers}"
                      + (", compiled" if job.compile else ""))
        r = self._probe(job, timed)
        fits = self._fits(r)
        said = [note] if note else []
        if r.status == "ok" and not fits:
            said.append("ran, but above the margin")
        retries = r.measured.alloc_retries if r.measured is not None else None
        if retries:
            said.append(f"at the card's limit: the allocator released its cache {retries}× "
                        "(num_alloc_retries), each a GPU synchronization")
        t = Trial(index=len(self.trials), stage=stage, job=job, result=r, predicted=self.predict(job),
                  fits=fits, note="; ".join(said), timed_steps=timed)
        self.trials.append(t)
        return t

    def tps(self, t: Trial) -> float:
        """Measured tokens/s; with torch.compile, its one-off compile time is spread over the
        planned run (unknown run length: over 1,000 steps, stated in the notes)."""
        m = t.result.measured
        if m is None or not m.tokens_per_s:
            return 0.0
        if t.job.compile and m.compile_time_s:
            steps = self.o.run_steps or 1000
            step = m.step_time_s + m.compile_time_s / steps
            return m.tokens_per_s * m.step_time_s / step
        return m.tokens_per_s

    # --- stage 1: the largest micro-batch that fits ------------------------------------------
    def largest_fitting(self, job: JobSpec, options: list[int]) -> int | None:
        """Index in ``options`` of the largest micro-batch that fits (memory probes: one metered
        step each), starting at the predicted boundary and checking its neighbour first."""
        if not options:
            return None
        lim = self.limit_bytes()
        start = len(options) - 1
        if lim is not None:
            pred_ok = []
            for i, m in enumerate(options):
                p = self.predict(job.replace(micro_batch=m))
                peak = None if p is None else (p.peak_reserved_bytes or p.peak_allocated_bytes)
                if peak is None or peak <= lim:
                    pred_ok.append(i)
            start = max(pred_ok) if pred_ok else 0
        lo, hi = -1, len(options)  # options[lo] fits, options[hi] does not (sentinels)
        i, first = start, True
        while lo + 1 < hi and not self.over_budget(timed=0):
            t = self.run(job.replace(micro_batch=options[i]), "batch", 0)
            if t.fits:
                lo = i
            else:
                hi = i
            if lo + 1 >= hi:
                break
            # first the neighbour of the predicted boundary (confirms an exact prediction in two
            # probes), then bisection
            i = (lo + 1 if t.fits else hi - 1) if first else (lo + hi) // 2
            first = False
        return lo if lo >= 0 else None

    # --- comparisons ----------------------------------------------------------------------------
    def better(self, cand: Trial, best: Trial) -> bool:
        """Whether ``cand`` is faster than ``best`` beyond the noise this run measured; when the
        repeats cannot decide, the simpler configuration (``best``, the incumbent) is kept and the
        search says what it could not decide."""
        if not cand.fits:
            return False
        # the incumbent by the median of its timed probes: one taken while the host was busy
        # would wave every candidate through to the rounds
        a, b = self.tps(self.median_of(best)), self.tps(cand)
        again, looked = None, None
        if b <= a * (1 + self.o.noise_floor):
            again, looked = self._measure_again(cand, best, a, b)
            if again is not None:
                cand, b = again, self.tps(again)
        no_longer_fits = looked is not None and again is None  # said so in its note
        if no_longer_fits or b <= a * (1 + self.o.noise_floor):
            if looked is None:
                # over_budget() is a collective under many ranks and notes the budget: asked
                # where it always was, once (the branch is the same on every rank: they share
                # probes)
                if a > 0 and b > 0 and not self.over_budget():
                    self.one_probe.append((changed_fields(cand.job, best.job), b / a))
            elif not no_longer_fits:  # measured twice: not "dropped on one probe"
                looked.data["dropped"] = True
            return False
        if self.over_budget(probes=2):
            if looked is not None:  # measured again, faster, and then no time for the rounds
                looked.data["not_compared"] = True
            # faster on its one probe, with no time left for the rounds that decide: said, so a
            # probe table showing it faster than the pick is explained (a review)
            self.notes.append(SearchNote("not_compared", {
                "changes": changed_fields(cand.job, best.job), "probe": cand.index,
                "ratio": b / a if a > 0 else None}))
            return False
        c = self.compare(best, cand, first=(a, b))
        if c.verdict == "not_faster":
            # faster on the probe that proposed it, not in the rounds: dropped, and said (an
            # audit: a candidate dropped after one contradicting round left no trace)
            self.notes.append(SearchNote("contradicted", {
                "changes": changed_fields(cand.job, best.job), "probe": cand.index, "proposal": c.proposal,
                "ratios": c.ratios, "ended": c.ended, "redone": c.redone}))
        if c.verdict == "undecided":
            self.notes.append(SearchNote("undecided", {
                "changes": changed_fields(cand.job, best.job), "probe": cand.index, "ratios": c.ratios,
                "noise": c.noise,
                "proposal": c.proposal, "rounds": self.o.rounds, "budget": self.stopped,
                "why": c.why, "redone": c.redone}))
        if c.verdict == "faster":
            # every change taken says on what rounds and noise (an audit: a precision change
            # taken at 2.40/1.67/1.35/1.85× with 37 % noise left no trace, where the repeat that
            # could not decide said all); "redone": with a round measured again (a review)
            self.notes.append(SearchNote("taken" if c.redone is None else "redone", {
                "changes": changed_fields(cand.job, best.job), "probe": cand.index, "ratios": c.ratios,
                "noise": c.noise, "redone": c.redone}))
        return c.verdict == "faster"

    def _measure_again(self, cand: Trial, best: Trial, a: float, b: float
                       ) -> tuple[Trial | None, SearchNote | None]:
        """``cand`` measured again before it is dropped on its one probe when that probe is
        suspect. Two cases:

        * ``outlier``: it fell far below what its prediction gives at the incumbent's measured
          pace (below :data:`OUTLIER_BELOW` of it): the host's, most likely, not the knob's — a
          foreach AdamW probe at 231 tokens/s against 13,969 predicted (14,625 measured in the
          run before) was dropped on it, unsaid (a QA run);
        * ``second_look``: its prediction says it is faster than the incumbent beyond the noise
          floor, and its one probe says it is not: measurement and prediction disagree, and one
          probe is the weaker evidence on a busy host. A candidate was otherwise dropped on one
          probe where a gain needs every interleaved round (the asymmetry behind a pick that
          differed between repeats on a loaded host: benchmarks/results/tune_repeat.md).

        Both need the candidate's predicted tokens/s, which only the CPU target's predictor
        gives (tuner.py ``CpuPredictor``; on CUDA the probes decide alone).

        (the re-measure or None where it no longer fits, the note) — (None, None) where the
        probe was neither."""
        pc, pb = cand.predicted, best.predicted
        known = pc is not None and pb is not None and bool(pc.tokens_per_s) and \
            bool(pb.tokens_per_s) and a > 0 and b > 0
        predicted_ratio = pc.tokens_per_s / pb.tokens_per_s if known else 0.0  # type: ignore[union-attr,operator]
        expected = a * predicted_ratio
        outlier = known and b < OUTLIER_BELOW * expected
        contradicts = known and predicted_ratio > 1 + self.o.noise_floor
        # a collective under many ranks (each measured its own): every rank decides together
        if not self.agree(outlier or contradicts) or self.over_budget():
            return None, None
        # (another rank may have decided it: this one's prediction can be unknown — each rank's
        # CPU rates are its own —, so the kind is a collective too: every rank writes one note)
        outlier = self.agree(outlier)
        if outlier:
            pace = f"at {b / expected:.2f}× " if expected else "far below "
            said = f"{pace}what its prediction gives at the current best's measured pace"
        else:
            said = ((f"{b / a:.2f}× " if a > 0 else "no faster than ") + "the current best's "
                    "tokens/s where its prediction gives "
                    + (f"{predicted_ratio:.2f}×" if predicted_ratio else "more"))
        again = self.run(cand.job, "confirm", 3,
                         note=f"re-measure of probe {cand.index}: it ran {said}")
        again_tps = self.tps(again) if again.fits else None
        if outlier:
            note = SearchNote("outlier", {
                "changes": changed_fields(cand.job, best.job), "first_tokens_per_s": b,
                "expected_tokens_per_s": expected or None, "again_tokens_per_s": again_tps})
        else:
            note = SearchNote("second_look", {
                "changes": changed_fields(cand.job, best.job), "first_ratio": b / a if a > 0 else None,
                "predicted_ratio": predicted_ratio or None,
                "again_ratio": None if again_tps is None or not a else again_tps / a})
        self.notes.append(note)
        return (again if again.fits else None), note

    def compare(self, best: Trial, cand: Trial, first: tuple[float, float] | None = None
                ) -> Comparison:
        """``cand`` against ``best`` in interleaved rounds (A B, then B A, …: a drift of the host
        load hits both alike), each round's tokens/s ratio kept. ``first``: the tokens/s of the
        probes that proposed the candidate — said beside the rounds, not one of them
        (:attr:`Comparison.proposal`). Stops early once a round contradicts the gain. Once in a
        comparison, a round in which either side ran under 1 / :data:`UNSTEADY_SPREAD` of its
        own pace (its rounds so far, else the probes that proposed it) is measured again instead
        of counted (:attr:`Comparison.redone`): whichever side it slowed, so that the rule takes
        no side."""
        proposal = first[1] / first[0] if first and first[0] > 0 else None
        a_s: list[float] = []
        b_s: list[float] = []
        spreads: list[float] = []
        redone: float | None = None
        cut = False
        while len(a_s) < self.o.rounds:
            if self.over_budget(probes=2):
                cut = True
                break
            # the order by the rounds counted: a round measured again repeats its order
            pair = [(best, "a"), (cand, "b")][:: -1 if len(a_s) % 2 else 1]
            got: dict[str, Trial] = {}
            for trial, side in pair:
                got[side] = self.run(trial.job, "confirm", 3, note=f"re-measure of probe {trial.index}")
            if not got["b"].fits:
                return Comparison(ratios=[y / x for x, y in zip(a_s, b_s, strict=True) if x],
                                  noise=0.0, verdict="not_faster", proposal=proposal,
                                  ended="no_longer_fits", redone=redone)
            a, b = self.tps(got["a"]), self.tps(got["b"])
            # one side far below its own pace: another process took the cores for it (one
            # round beside a busy neighbour read amp-bf16 at 0.63× where its proposal and three
            # other runs' rounds measured 1.5-1.8×, and the gain was dropped: an audit)
            pace_a = statistics.median(a_s) if a_s else (first[0] if first else 0.0)
            pace_b = statistics.median(b_s) if b_s else (
                math.sqrt(first[0] * first[1]) if first else 0.0)
            disturbed = a < pace_a / UNSTEADY_SPREAD or b < pace_b / UNSTEADY_SPREAD
            if redone is None and self.agree(disturbed) and not self.over_budget(probes=2):
                redone = b / a if a > 0 else 0.0
                continue
            a_s.append(a)
            b_s.append(b)
            spreads += [rel_spread(got["a"]), rel_spread(got["b"])]
            if disturbed and redone is not None and b <= a * (1 + self.o.noise_floor):
                # measured again once already, and again under half a side's pace: the host
                # took the cores a second time — no contradiction the knob made (an audit: a
                # redone round at 0.04× read "a round contradicted the gain")
                c = Comparison.of(a_s, b_s, spreads, self.o.noise_floor, self.o.rounds, proposal)
                return dataclasses.replace(c, verdict="undecided", redone=redone, why=(
                    f"its last round ran a side under 1/{UNSTEADY_SPREAD:g} of its own pace "
                    "again after one was measured again (another process took the cores), so "
                    "that round's contradiction is the host's, not the change's"))
            if b <= a * (1 + self.o.noise_floor):
                break  # a repeat contradicts the gain: no more rounds can make it certain
        c = Comparison.of(a_s, b_s, spreads, self.o.noise_floor, self.o.rounds, proposal)
        # the budget stopped the rounds after some ran: said as when none ran (an audit found
        # ``ended`` null beside "only 2 of 4 rounds ran", the JSON silent on why)
        return dataclasses.replace(c, redone=redone, ended="budget" if cut else c.ended)

    # --- the whole search ---------------------------------------------------------------------
    def search(self) -> Outcome:
        base = self.base
        options, excluded = micro_options(base, self.n_samples)
        if excluded:
            self.notes.append(SearchNote("excluded_micro", {
                "micro_batches": excluded, "per_rank_batch": (base.effective_batch or 1) // base.ranks}))
        job = base
        idx = self.largest_fitting(job, options)
        if idx is None and self.stopped:
            # the budget ran out before any memory probe: that is not "nothing fits" — keep the
            # fastest configuration measured that fitted (the user's current one, probed first)
            self._say_untried([k for k in self.o.knobs
                               if k not in self.o.fixed | self.o.unsupported])
            return self._outcome(self._best_measured(), None, excluded)
        if idx is None and base.grad_ckpt != "full" and "grad_ckpt" not in self.o.fixed | self.o.unsupported:
            self.notes.append(SearchNote("needs_ckpt"))
            job = base.replace(grad_ckpt="full")
            idx = self.largest_fitting(job, options)
        if idx is None:
            self.notes.append(SearchNote("nothing_fits"))
            return self._outcome(None, None, excluded)
        largest = options[idx]
        best = self.run(job.replace(micro_batch=largest), "speed", 3)
        # smaller micro-batches: usually slower (less work per kernel); stop at the first that is
        # not faster
        j = idx - 1
        while j >= 0 and not self.over_budget():
            cand = self.run(job.replace(micro_batch=options[j]), "speed", 3)
            if self.better(cand, best):
                best = self._latest_of(cand.job)
                j -= 1
            else:
                break
        untried: list[str] = []
        for knob in self.o.knobs:
            if knob in self.o.fixed or knob in self.o.unsupported:
                # said, not skipped in silence (an audit)
                self.notes.append(SearchNote(
                    "knob_unsupported" if knob in self.o.unsupported else "knob_fixed",
                    {"knob": knob, "fields": list(KNOB_FIELDS[knob]),
                     "values": [getattr(best.job, f) for f in KNOB_FIELDS[knob]]}))
                continue
            if self.over_budget():
                untried.append(knob)
                continue
            best = self._try_knob(knob, best, options)
        self._say_untried(untried)
        return self._outcome(best, largest, excluded)

    def _say_untried(self, knobs: list[str]) -> None:
        """The knobs the budget left unprobed, named in its note (an audit: a run cut after the
        micro-batch presented its pick as a plain decision, precision — worth 1.8× in the
        repeat — never tried, unsaid)."""
        for n in self.notes:
            if n.kind == "budget":
                if knobs:
                    n.data["untried_knobs"] = list(knobs)
                if self.cut_candidates:
                    n.data["cut_candidates"] = list(self.cut_candidates)

    def _best_measured(self) -> Trial | None:
        """The fastest trial that fitted and was timed (None: none was)."""
        timed = [t for t in self.trials if t.fits and self.tps(t) > 0]
        return max(timed, key=self.tps) if timed else None

    def median_of(self, trial: Trial) -> Trial:
        """The timed probe of ``trial``'s configuration with the median tokens/s of all its
        timed probes (the lower one of an even count): the number a pick is reported with — one
        probe taken while the host was busy said 2,157 tokens/s of a configuration its six
        re-measurements put at 22-24k (a QA run)."""
        same = sorted((t for t in self.trials if t.job == trial.job and t.fits and self.tps(t) > 0),
                      key=self.tps)
        return same[(len(same) - 1) // 2] if same else trial

    def repeat_spread_note(self) -> SearchNote | None:
        """A note when one configuration's timed probes in this run lie further apart than
        :data:`UNSTEADY_SPREAD` (fastest ÷ slowest, measured): the rounds decide nothing then
        (said per comparison), and a candidate dropped on one slower probe may not be slower —
        those are named.  None on a steady run."""
        def raw(t: Trial) -> float:
            # the probe's own tokens/s: tps() spreads a compile over the run, and a re-probe
            # finds dynamo's cache warm (a review: a compiled winner read as unsteady timings)
            m = t.result.measured
            return (m.tokens_per_s or 0.0) if m is not None else 0.0
        timed = [t for t in self.trials if t.fits and raw(t) > 0]
        spreads = []
        for t in timed:  # JobSpec is not hashable: grouped by equality
            same = [raw(u) for u in timed if u.job == t.job]
            if len(same) > 1:
                spreads.append(max(same) / min(same))
        self.repeats_timed = bool(spreads)
        if not spreads or max(spreads) <= UNSTEADY_SPREAD:
            return None
        return SearchNote("unsteady", {"spread": max(spreads), "one_probe": self.one_probe})

    def _latest_of(self, job: JobSpec) -> Trial:
        return [t for t in self.trials if t.job == job and t.result.measured is not None][-1]

    def _outcome(self, best: Trial | None, largest: int | None, excluded: list[int]) -> Outcome:
        return Outcome(best=best, trials=self.trials, notes=self.notes,
                       largest_fitting_micro=largest, excluded_micro=excluded,
                       search_time_s=time.perf_counter() - self.t0, stopped_by_budget=self.stopped)

