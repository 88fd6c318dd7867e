"""The search under --budget-s (fake probes): the next probe reckoned by its own steps, what the
budget cut said — the knobs never started, the candidates cut inside a knob, rounds cut short, a
faster probe left uncompared — and the measured configuration kept."""

import pytest
from search_fakes import GIB, fake, pred

from trainfit.job import JobSpec
from trainfit.render.tune_words import note_words
from trainfit.tune.result import SearchNote
from trainfit.tune.search import Searcher, SearchOptions


def test_budget_spent_before_any_memory_probe_keeps_the_current_configuration(monkeypatch):
    """A loaded host: --budget-s ran out during the probe of the user's own configuration. That is
    not 'nothing fits' (tune said so and wrote no file): the measured configuration that fitted is
    kept, and the budget is named."""
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, precision="fp32", grad_ckpt="off")
    s = Searcher(job, fake(GIB, GIB, lambda j: 100.0, calls), pred(GIB, GIB, lambda j: 100.0),
                 10 * GIB, SearchOptions(knobs=(), budget_s=50.0), 10_000)
    baseline = s.run(job.replace(micro_batch=1), "baseline", 3)
    baseline.result.probe_time_s = 60.0  # the probe alone outlasted the budget
    s.t0 -= 60.0  # ... and the search's clock with it
    out = s.search()
    assert out.best is baseline and out.best.job.micro_batch == 1
    kinds = [n.kind for n in out.notes]
    assert "budget" in kinds and "nothing_fits" not in kinds and "needs_ckpt" not in kinds
    assert "untried_knobs" not in out.notes[kinds.index("budget")].data  # no knob asked


def test_a_budget_cut_names_the_knobs_it_never_tried():
    """An audit: a run cut after the micro-batch probes kept fp32 and said only that the budget
    was spent; precision, worth 1.8× in the repeat, was never tried, unsaid. The budget note
    names every knob left unprobed."""
    from trainfit.render.tune_words import note_words

    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, precision="fp32", grad_ckpt="off")
    s = Searcher(job, fake(GIB, GIB, lambda j: 100.0, []), pred(GIB, GIB, lambda j: 100.0),
                 10 * GIB, SearchOptions(knobs=("precision", "attention"), budget_s=50.0,
                                         precisions=("fp32", "amp-bf16")), 10_000)
    real = s._probe

    def slow(j, timed):  # each probe takes 20 s of the 50
        s.t0 -= 20.0
        r = real(j, timed)
        r.probe_time_s = 20.0
        return r
    s._probe = slow
    out = s.search()
    (note,) = [n for n in out.notes if n.kind == "budget"]
    assert note.data["untried_knobs"] == ["precision", "attention"]
    assert note_words(note).endswith("— not tried: precision, attention (kept as the "
                                     "configuration had them; a longer --budget-s, or --knobs, "
                                     "tries them)")


def test_the_budget_reckons_the_next_probe_by_its_own_steps():
    """An audit: --budget-s overran by 30-60 %: the next probe was reckoned as long as the last,
    a 1-step memory probe before a 4-step timed one, and a round's two probes as one."""
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, precision="fp32", grad_ckpt="off")
    s = Searcher(job, fake(GIB, GIB, lambda j: 100.0, []), pred(GIB, GIB, lambda j: 100.0),
                 10 * GIB, SearchOptions(knobs=(), budget_s=100.0), 10_000)
    mem = s.run(job.replace(micro_batch=8), "batch", 0)
    mem.result.probe_time_s = 10.0
    s.t0 -= 50.0  # 50 s spent
    assert s._next_probe_s(3, 1) == pytest.approx(40.0)  # 4 steps at the memory probe's pace
    assert s.over_budget(timed=0) is False and s.over_budget(timed=3) is False
    timed = s.run(job.replace(micro_batch=4), "speed", 3)
    timed.result.probe_time_s = 30.0
    assert s._next_probe_s(3, 2) == pytest.approx(60.0)  # a round: two timed probes
    assert s.over_budget(timed=3, probes=2) is True
    assert [n.kind for n in s.notes] == ["budget"]


def test_an_undecided_note_says_when_the_budget_cut_the_rounds():
    """'within the noise of this run (8 %)' was said of 2.23× and 2.47× gains: the budget had
    stopped the rounds, the noise had not hidden the gain."""

    data = {"changes": [("precision", "amp-bf16")], "ratios": [1.31, 1.36], "noise": 0.08,
            "rounds": 4}
    cut = note_words(SearchNote("undecided", {**data, "budget": True}))
    assert ("only 2 of the 4 rounds ran before --budget-s ran out (a gain needs all of them, "
            "or 2 each beyond 5× the noise measured in this run by then, 8%, measured)") in cut
    assert "within the noise" not in cut
    noisy = note_words(SearchNote("undecided", {**data, "budget": False}))
    assert "noise measured in this run by then (8%, measured); kept" in noisy
    # the rule the rounds failed, where the comparison named it (speed.compare._undecided_why)
    why = note_words(SearchNote("undecided", {**data, "budget": False,
                                              "why": "the repeats overlap: …"}))
    assert "noise measured in this run by then (8%, measured): the repeats overlap: …; kept" in why


def test_a_faster_probe_the_budget_left_uncompared_is_said():
    """A review: the probe table showed a smaller micro-batch faster than the pick, no note —
    --budget-s had been spent before the interleaved rounds that decide could run."""
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, precision="fp32", grad_ckpt="off")
    tps = lambda j: 120.0 if j.micro_batch == 4 else 100.0  # noqa: E731
    s = Searcher(job, fake(GIB, GIB // 4, tps, calls), pred(GIB, GIB // 4, tps), 10 * GIB,
                 SearchOptions(knobs=()), 10_000)
    s.over_budget = lambda **kw: sum(t.stage == "speed" for t in s.trials) >= 2  # spent by then
    out = s.search()
    assert out.best.job.micro_batch == 8  # the largest that fits, kept
    (n,) = [n for n in out.notes if n.kind == "not_compared"]
    assert n.data["changes"] == [("micro_batch", 4)]
    assert n.data["ratio"] == pytest.approx(1.2)
    words = note_words(n)
    assert words.startswith("not decided: micro_batch 4 ran 1.20× the tokens/s")
    assert "--budget-s left no time for the interleaved rounds" in words


def test_a_budget_cut_inside_a_knob_names_the_candidates_it_cut():
    """A review: a knob cut after its first candidate was in neither the untried list nor any
    note. The candidates the budget cut inside a knob are named too."""
    from trainfit.render.tune_words import note_words

    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, micro_batch=8, precision="fp32",
                  grad_ckpt="off", optimizer_impl="forloop")
    s = Searcher(job, fake(GIB, GIB, lambda j: 100.0, []), pred(GIB, GIB, lambda j: 100.0),
                 10 * GIB, SearchOptions(knobs=("optimizer_impl",), budget_s=1e9), 10_000)
    def over_budget(timed=3, probes=1):
        # spent once the knob's first candidate (fused) has been probed
        if not any(t.job.optimizer_impl == "fused" for t in s.trials):
            return False
        if not s.stopped:
            s.notes.append(SearchNote("budget", {"budget_s": 1.0, "spent_s": 2.0, "probes": 2}))
        s.stopped = True
        return True
    s.over_budget = over_budget
    out = s.search()
    (note,) = [n for n in out.notes if n.kind == "budget"]
    assert note.data["cut_candidates"] == ["optimizer_impl foreach"], note.data
    assert "candidates cut: optimizer_impl foreach" in note_words(note)
