"""The numbers the terminal shows beside the doctor's medians are the result's (the renderer only
formats them), and the split helpers both targets share."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from trainfit.doctor.observation import Finding
from trainfit.doctor.result import DoctorResult, Metrics, ratio
from trainfit.doctor.split import StepRecord, device_idle_s, input_fraction, median_split
from trainfit.render.doctor import render


def result(after: Metrics | None, gpu: float | None = None) -> DoctorResult:
    recs = [StepRecord({"data_wait": 0.02, "forward": 0.03, "backward": 0.05}, 0.1)]
    before = Metrics(step_time_s=0.1, tokens_per_s=1000.0, data_wait_fraction=0.2, gpu_util_percent=gpu,
                     step_time_spread_s=0.02, tokens_per_s_spread=100.0, rounds=2)
    nxt = Finding("compute-bound", {}, "fix", None, "MFU 40%")
    return DoctorResult(target="job.yaml", kind="job", device="cpu", steps_measured=1,
                        split=median_split(recs), findings=[], before=before, after=after,
                        after_findings=[nxt] if after else [])


def test_compared_rows_carry_the_spread_and_the_ratio():
    after = Metrics(step_time_s=0.05, tokens_per_s=2000.0, data_wait_fraction=0.01, gpu_util_percent=None,
                    step_time_spread_s=0.0, tokens_per_s_spread=50.0, rounds=2)
    rows = {c.key: c for c in result(after, gpu=40.0).compared()}
    assert list(rows) == ["step_time_s", "tokens_per_s", "data_wait_fraction", "gpu_util_percent"]
    assert rows["step_time_s"].before_pm == pytest.approx(0.01) and rows["step_time_s"].after_pm is None
    assert rows["step_time_s"].change == pytest.approx(0.5)
    assert rows["tokens_per_s"].after_pm == pytest.approx(25.0) and rows["tokens_per_s"].change == 2.0
    assert rows["gpu_util_percent"].after is None and rows["gpu_util_percent"].change is None
    assert result(after).after_bottleneck.bottleneck == "compute-bound"


def test_one_round_states_no_spread_and_no_after_no_change():
    one = Metrics(step_time_s=0.1, tokens_per_s=None, data_wait_fraction=None, gpu_util_percent=None,
                  step_time_spread_s=0.02)
    assert one.half_spread(one.step_time_spread_s) is None
    rows = result(None).compared()
    assert [c.key for c in rows] == ["step_time_s", "tokens_per_s", "data_wait_fraction"]
    assert all(c.after is None and c.change is None for c in rows)
    assert result(None).after_bottleneck is None
    assert ratio(None, 1.0) is None and ratio(1.0, 0.0) is None and ratio(3.0, 2.0) == 1.5


def test_render_prints_the_results_numbers():
    after = Metrics(step_time_s=0.05, tokens_per_s=2000.0, data_wait_fraction=0.01, gpu_util_percent=None,
                    step_time_spread_s=0.004, tokens_per_s_spread=50.0, rounds=2)
    buf = io.StringIO()
    Console(file=buf, width=140).print(render(result(after, gpu=40.0)))
    text = buf.getvalue()
    assert "100.00 ms ± 10.00 ms" in text and "50.00 ms ± 2.00 ms" in text and "0.50×" in text
    assert "40 %" in text and "after the fixes the step is compute-bound: MFU 40%" in text
    # the split's step and 'before' agree here (0.1 s): no caption; apart, the two are explained
    assert "median of the rounds' own medians" not in text
    r = result(after)
    r.before.step_time_s = 0.12
    buf = io.StringIO()
    Console(file=buf, width=200).print(render(r))
    assert "the median over every measured step, pooled — 20% apart" in \
        " ".join(buf.getvalue().split())


def test_data_wait_and_idle_are_read_one_way_for_both_targets():
    recs = [StepRecord({"data_wait": 0.1, "h2d_copy": 0.1}, 1.0), StepRecord({"data_wait": 0.3}, 0.6),
            StepRecord({}, 0.0)]
    # one reading for the split table, the input-bound rule and the before/after rows: the
    # median wait + the median copy over the median step (an audit saw 0.7 % and 2.2 %)
    split = median_split(recs[:2])
    assert input_fraction(split) == pytest.approx((0.2 + 0.05) / 0.8)
    assert input_fraction(split) == pytest.approx(
        (split.data_wait_s + split.h2d_copy_s) / split.step_time_s)
    assert device_idle_s({"device_busy_s": 0.4}, recs[:2]) == pytest.approx(0.4)
    assert device_idle_s({"device_busy_s": None}, recs) is None and device_idle_s(None, recs) is None
    assert device_idle_s({"device_busy_s": 2.0}, recs[:2]) == 0.0


def test_verdict_stability_across_rounds():
    from trainfit.doctor.result import DoctorResult

    def res(rounds):
        return DoctorResult(target="t", kind="job", device="cpu", steps_measured=6,
                            split=None, findings=[], before=None,  # type: ignore[arg-type]
                            round_bottlenecks=rounds)
    assert res(["compute-bound"]).verdict_stable is None
    assert res(["compute-bound", "compute-bound"]).verdict_stable is True
    assert res(["compute-bound", "bandwidth-bound"]).verdict_stable is False


def _round(step_s: float, spread_s: float = 0.0, tokens: float = 1024.0):
    from types import SimpleNamespace as NS

    return NS(split=NS(step_time_s=step_s, step_time_spread_s=spread_s), tokens_per_step=tokens,
              tokens_per_s=tokens / step_s, data_wait_fraction=0.0,
              host=NS(gpu_util_percent=None), records=[StepRecord({}, step_s)])


def test_tokens_per_s_is_the_median_step_times_rate():
    """Two rounds at 45.85 and 462.97 ms: the median step is their mean, and tokens/s is the
    tokens of a step over it — not the mean of the two rates (a QA run printed step time 0.52×
    beside tokens/s 5.89× for the same steps)."""
    from trainfit.doctor.run import _metrics

    before = _metrics([_round(0.4875), _round(0.4959)])
    after = _metrics([_round(0.04585), _round(0.46297)])
    assert after.tokens_per_s / before.tokens_per_s == pytest.approx(
        before.step_time_s / after.step_time_s)


@pytest.mark.parametrize("befores, afters, words", [
    # a busy host (the QA run): before 1,038 / 353 / 525 ms, after 998 / 996 / 1,000 ms — not
    # faster; not called slower either, the before repeats 98 % apart
    ([1.038, 0.353, 0.525], [0.998, 0.996, 1.000], "not_faster"),
    ([1.0, 1.01], [2.0, 2.02], "slower"),
    ([1.0, 0.36], [0.5, 0.9], "undecided"),             # one round faster, one slower
    ([1.0, 1.01], [0.5, 0.49], "faster"),               # 2× in both rounds, repeats 1 % apart
    ([1.0], [0.5], "undecided"),                        # one round cannot decide
    ([1.0, 1.0], [1.0, 1.01], "not_faster"),
])
def test_the_fix_is_called_faster_only_when_the_rounds_agree(befores, afters, words):
    from trainfit.doctor.verdict import gain_of as _gain

    g = _gain([_round(t) for t in befores], [_round(t) for t in afters])
    r = result(None)
    r.gain = g
    r.applied = ["a fix"]
    assert r.gain_words == words
    assert r.to_dict()["gain"]["verdict"] == words
    buf = io.StringIO()
    Console(file=buf, width=200).print(render(r))
    text = buf.getvalue()
    heading = "applied to the re-measured run (measured faster; your job file is unchanged" \
        if words == "faster" else "tried (not confirmed"
    assert heading in text
    assert {"faster": "faster in every round", "slower": "made the step slower",
            "undecided": "could not decide", "not_faster": "did not make the step faster"}[words] \
        in text


def test_the_split_of_a_noisy_run_sums_to_its_step():
    """Medians taken part by part summed to 108 % of the median step on a busy host: the parts
    are scaled to the step, in their medians' proportions."""
    recs = [StepRecord({"data_wait": 0.2, "forward": 0.3, "backward": 0.4}, 0.9),
            StepRecord({"data_wait": 0.1, "forward": 0.35, "backward": 0.45}, 0.5),
            StepRecord({"data_wait": 0.15, "forward": 0.2, "backward": 0.5}, 0.7)]
    s = median_split(recs)
    assert s.step_time_s == pytest.approx(0.7)
    parts = s.data_wait_s + s.forward_s + s.backward_s
    assert parts == pytest.approx(0.7) and s.other_s == 0.0
    assert s.forward_s / s.backward_s == pytest.approx(0.3 / 0.45)
    # and the scaling is said, in the JSON and under the table (an audit: it was silent)
    assert s.parts_scale == pytest.approx(0.7 / 0.9)
    assert s.to_dict()["parts_scale"] == pytest.approx(0.7 / 0.9)
    r = result(None)
    r.split = s
    buf = io.StringIO()
    Console(file=buf, width=200).print(render(r))
    text = " ".join(buf.getvalue().split())  # the caption wraps at the table's width
    assert "summed to 129% of the median step" in text
    assert "scaled by 0.778" in text
    # the step's range says what it is (an audit read "spread" in the % column as a share)
    assert "range 400.00 ms (slowest − fastest step)" in text


@pytest.mark.parametrize("before_s, after_s, rounds, words", [
    # a decisive gain (2×, repeats 1 % apart): all four rounds still run, as tune's compare
    # runs them (a review: stopping at two decisive rounds was not tune's rule)
    ([1.0, 1.01, 1.0, 1.0], [0.5, 0.49, 0.5, 0.5], 4, "faster"),
    # 10 % faster at ~1 % noise: not decisive in two rounds, so all four of tune's rule run
    ([1.0, 1.01, 1.0, 1.005], [0.91, 0.905, 0.91, 0.9], 4, "faster"),
    # the second round contradicts the first one's gain: no more rounds can make it faster
    ([1.0, 1.0, 1.0, 1.0], [0.8, 1.0, 0.8, 0.8], 2, "undecided"),
    ([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.8, 0.8], 2, "not_faster"),
])
def test_the_rounds_stop_only_where_a_round_contradicts_the_gain(before_s, after_s, rounds, words):
    """doctor's verdict asks what tune's does (all 4 interleaved rounds): an audit found it
    decided on 2; the rounds stop early only where a round was not faster, after which
    'faster' cannot be reached (tune's compare stops there too)."""
    from types import SimpleNamespace as NS

    from trainfit.doctor.run import _interleaved_rounds
    from trainfit.doctor.verdict import gain_of as _gain

    seen: list[str] = []
    times = {"before": iter(before_s[1:]), "after": iter(after_s)}

    def measure(job, mode, label):
        seen.append(label)
        return _round(next(times[label.split()[0]]))
    bench = NS(measure=measure, job=None, before_mode="eager")
    befores, afters = _interleaved_rounds(bench, _round(before_s[0]), None, "eager", 4)
    assert len(befores) == len(afters) == rounds
    assert seen[-1] == f"after #{rounds}"
    r = result(None)
    r.gain, r.applied = _gain(befores, afters), ["a fix"]
    assert r.gain_words == words


def test_a_headline_the_rounds_contradict_states_no_gain():
    """Rounds that named different bottlenecks: the note says so and the headline's gain is
    withdrawn (an audit: a +40 % gain headed the table all the same)."""
    from trainfit.doctor.observation import Finding
    from trainfit.doctor.verdict import held_across_rounds

    fs = [Finding("input-bound", {}, "num_workers=2", 0.4, "data wait 29 %"),
          Finding("sync-bound", {}, "fewer .item()", 0.1, "")]
    notes: list[str] = []
    assert held_across_rounds(fs, ["input-bound", "input-bound"], notes) == fs and notes == []
    out = held_across_rounds(fs, ["input-bound", "compute-bound"], notes)
    assert out[0].gain_fraction is None and out[1].gain_fraction == 0.1
    assert out[0].detail == ("undecided: the 'before' rounds named input-bound, compute-bound; "
                             "data wait 29 %")
    assert notes and notes[0].startswith("the verdict did not hold across the 2 'before' rounds")
    # rounds that agree with each other but not with the pooled steps: undecided too (a review)
    notes = []
    out = held_across_rounds(fs, ["sync-bound", "sync-bound"], notes)
    assert out[0].gain_fraction is None and "the pooled rounds name input-bound" in notes[0]
