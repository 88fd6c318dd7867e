"""The search logic over fake probes: memory bisection from the prediction, exact accumulation,
noise-guarded speed comparisons, budget."""

import pytest
from search_fakes import GIB, fake, pred

from trainfit.job import JobSpec
from trainfit.render.tune_words import note_words
from trainfit.tune.result import Measured, ProbeResult, SearchNote
from trainfit.tune.search import Predicted, Searcher, SearchOptions, micro_options


def test_micro_options_exact_accumulation():
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=24, ranks=2)
    ok, excluded = micro_options(job, dataset_samples=1000)
    assert ok == [1, 2, 3, 4, 6, 12]
    assert excluded == [5, 7, 8, 9, 10, 11]
    assert micro_options(job, dataset_samples=10)[0] == [1, 2, 3, 4]  # capped by the data


def test_bisection_starts_at_prediction_and_confirms_in_two_probes():
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=64)
    tps = lambda j: 100.0 * min(j.micro_batch, 8)  # noqa: E731
    s = Searcher(job, fake(GIB, 2 * GIB, tps, calls), pred(GIB, 2 * GIB, tps), 10 * GIB,
                 SearchOptions(margin=0.1, knobs=()), 10_000)
    out = s.search()
    # capacity 10 GiB, margin 10 %: 2 + m ≤ 9 → m ≤ 7; divisors of 64: 1 2 4 8 16 32 64 → 4
    assert out.largest_fitting_micro == 4
    batch = [c for c in calls if c[2] == 0]
    assert batch == [(4, "sdpa", 0), (8, "sdpa", 0)]  # the predicted boundary and its neighbour
    assert out.best.job.micro_batch == 4 and out.best.job.grad_accum == 16
    assert out.best.job.effective_batch == 64


def test_bisection_when_prediction_is_wrong():
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=64)
    tps = lambda j: 100.0  # noqa: E731
    # the prediction says everything fits; reality: 2 + m ≤ 9
    s = Searcher(job, fake(GIB, 2 * GIB, tps, calls), pred(0, 0, tps), 10 * GIB,
                 SearchOptions(margin=0.1, knobs=()), 10_000)
    out = s.search()
    assert out.largest_fitting_micro == 4
    assert len([c for c in calls if c[2] == 0]) <= 4


def test_noise_needs_confirmation():
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8)
    seen = {"eager": 0}

    def tps(j):
        if j.attention == "eager":
            seen["eager"] += 1
            return 130.0 if seen["eager"] == 1 else 100.0  # a lucky first measurement
        return 100.0
    s = Searcher(job, fake(GIB, GIB, tps, calls), pred(GIB, GIB, lambda j: 100.0), None,
                 SearchOptions(knobs=("attention",)), 10_000)
    out = s.search()
    assert out.best.job.attention == "sdpa"  # the gain did not survive the re-measurement
    assert [t.stage for t in out.trials].count("confirm") == 2
    # dropped after the one round that contradicted it, and said (an audit: no trace was left)
    (n,) = [n for n in out.notes if n.kind == "contradicted"]
    assert n.data["proposal"] == pytest.approx(1.3) and n.data["ratios"] == pytest.approx([1.0])
    assert note_words(n) == ("dropped: attention eager ran 1.30× when first probed (not a round), "
                             "then 1.00× the tokens/s of the current best in interleaved rounds: "
                             "a round contradicted the gain, so no more rounds could confirm it; "
                             "kept the current best")
    # a re-measure that no longer fits before any round: no ratio to state (a review)
    gone = SearchNote("contradicted", {"changes": [("attention", "eager")], "proposal": 1.3,
                                       "ratios": [], "ended": "no_longer_fits"})
    assert note_words(gone) == ("dropped: attention eager ran 1.30× when first probed (not a "
                                "round), then its re-measure no longer fit; kept the current best")


def test_real_gain_is_taken_and_prediction_prunes():
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8)
    tps = lambda j: 150.0 if j.optimizer_impl == "foreach" else 100.0  # noqa: E731
    ptps = lambda j: 10.0 if j.precision == "amp-bf16" else 100.0  # noqa: E731
    s = Searcher(job.replace(precision="fp32", grad_ckpt="off"), fake(GIB, GIB, tps, calls),
                 pred(GIB, GIB, ptps), None,
                 SearchOptions(knobs=("precision", "optimizer_impl"),
                               precisions=("fp32", "amp-bf16")), 10_000)
    out = s.search()
    assert out.best.job.optimizer_impl == "foreach"
    assert not any(t.job.precision == "amp-bf16" for t in out.trials)
    assert any("predicted 0.10×" in n for n in map(note_words, out.notes))
    pruned = [n for n in out.notes if n.kind == "pruned"]
    assert pruned and pruned[0].data["ratio"] == pytest.approx(0.10)
    assert pruned[0].data["changes"] == [("precision", "amp-bf16")]


def test_a_prediction_from_a_busy_hosts_timings_prunes_nothing():
    """An audit: kernel times taken while another job loaded the CPU put one configuration at
    68 tokens/s, a quiet run at 311: a candidate predicted slow from such times is probed, and
    the note says why (here it is the faster one, and is taken)."""
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8)
    tps = lambda j: 150.0 if j.precision == "amp-bf16" else 100.0  # noqa: E731

    def busy(j):
        return Predicted(peak_allocated_bytes=2 * GIB,
                         tokens_per_s=10.0 if j.precision == "amp-bf16" else 100.0,
                         from_busy_timings=True)
    s = Searcher(job.replace(precision="fp32", grad_ckpt="off"), fake(GIB, GIB, tps, calls), busy,
                 None, SearchOptions(knobs=("precision",), precisions=("fp32", "amp-bf16")),
                 10_000)
    out = s.search()
    assert out.best.job.precision == "amp-bf16"
    assert not [n for n in out.notes if n.kind == "pruned"]
    (n,) = [n for n in out.notes if n.kind == "not_pruned_busy"]
    assert note_words(n).startswith("probed although predicted at 0.10× the current best's "
                                    "tokens/s (precision amp-bf16; below 0.6× it would not be)")


def test_nothing_fits_tries_checkpointing():
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=4, grad_ckpt="off")

    def probe(j, timed):
        calls.append(j.grad_ckpt)
        return ProbeResult(status="oom", measured=None)
    s = Searcher(job, probe, lambda j: None, GIB, SearchOptions(knobs=()), 100)
    out = s.search()
    assert out.best is None
    assert "full" in calls and "off" in calls
    assert any("no micro-batch fits" in n for n in map(note_words, out.notes))


def test_loader_details_are_searched_only_with_workers():
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, micro_batch=8, precision="fp32",
                  grad_ckpt="off")
    # deeper prefetch helps, pinned memory helps more (a GPU); both only matter with workers
    tps = lambda j: 100.0 * (1.3 if j.num_workers else 1.0) * (  # noqa: E731
        1.2 if j.prefetch_factor == 4 else 1.0) * (1.2 if j.pin_memory else 1.0)
    seen = []

    def probe(j, timed):
        seen.append((j.num_workers, j.prefetch_factor, j.pin_memory))
        # without workers the step waits for data 1 − 1/1.3 of its time: what workers remove
        return fake(GIB, GIB, tps, calls, wait_of=lambda j: 0.0 if j.num_workers else 0.23)(j, timed)
    s = Searcher(job, probe, pred(GIB, GIB, lambda j: None), None,
                 SearchOptions(knobs=("num_workers", "loader"), worker_counts=(0, 2), cuda=True),
                 10_000)
    best = s.search().best.job
    assert (best.num_workers, best.prefetch_factor, best.pin_memory) == (2, 4, True)
    cpu = Searcher(job, probe, pred(GIB, GIB, lambda j: None), None,
                   SearchOptions(knobs=("num_workers", "loader"), worker_counts=(0, 2)), 10_000)
    assert cpu.search().best.job.pin_memory is False  # no GPU: pinning is never tried
    seen.clear()
    none = Searcher(job, probe, pred(GIB, GIB, lambda j: None), None,
                    SearchOptions(knobs=("loader",), cuda=True), 10_000)
    assert none.search().best.job.prefetch_factor == 2  # no workers: nothing to tune
    assert all(p == 2 and not pin for _, p, pin in seen)


def test_workers_not_probed_when_the_step_does_not_wait_for_data():
    """Workers can gain at most the measured data wait: below the noise floor they are not probed
    (a probe could only measure noise); above it they are, and kept when faster."""
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, micro_batch=8, precision="fp32",
                  grad_ckpt="off")
    for wait, probed in ((0.004, False), (0.2, True)):
        calls = []
        tps = lambda j, w=wait: 100.0 / (1 - w) if j.num_workers else 100.0  # noqa: E731
        s = Searcher(job, fake(GIB, GIB, tps, calls, wait_of=lambda j, w=wait: 0.0 if j.num_workers else w),
                     pred(GIB, GIB, lambda j: None), None,
                     SearchOptions(knobs=("num_workers",), worker_counts=(0, 2)), 10_000)
        out = s.search()
        assert any(t.job.num_workers == 2 for t in out.trials) is probed
        assert out.best.job.num_workers == (2 if probed else 0)
        words = map(note_words, out.notes)
        assert any("loader workers: not probed" in n and "0.40%" in n for n in words) is not probed


def test_eight_bit_adamw_frees_memory_for_a_larger_micro_batch():
    """8-bit AdamW states (2 B per weight instead of 8) free memory: tried at the same
    micro-batch and at the largest larger one that then fits (memory probes), and kept when
    faster; without bitsandbytes it is not tried (noted)."""
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, precision="fp32", grad_ckpt="off")

    def peak(j):  # 2 GiB of weights; states 4 GiB (AdamW) or 1 GiB (8-bit); 0.5 GiB per sample
        return int((2 + (1 if j.optimizer == "adamw-8bit" else 4) + 0.5 * j.micro_batch) * GIB)

    def probe(j, timed):
        if peak(j) > 10 * GIB:
            return ProbeResult(status="oom", measured=None)
        tps = 100.0 * j.micro_batch if timed else None
        return ProbeResult(status="ok", measured=Measured(
            peak_allocated_bytes=peak(j), peak_reserved_bytes=None, peak_device_bytes=None,
            host_rss_bytes=1, step_time_s=1000 / tps if tps else None,
            step_time_spread_s=0.0 if tps else None, tokens_per_s=tps, samples_per_s=None,
            data_wait_fraction=0.0 if tps else None))

    def predict(j):
        return Predicted(peak_allocated_bytes=peak(j), tokens_per_s=None)

    for bnb in (True, False):
        s = Searcher(job, probe, predict, 10 * GIB,
                     SearchOptions(margin=0.1, knobs=("optimizer_8bit",), bitsandbytes=bnb), 10_000)
        out = s.search()
        # capacity 9 GiB after the margin: AdamW 6 + m/2 → micro 4 (of 1 2 4 8); 8-bit 3 + m/2 → 8
        tried = [(t.job.optimizer, t.job.micro_batch) for t in out.trials]
        assert (("adamw-8bit", 4) in tried and ("adamw-8bit", 8) in tried) is bnb
        best = out.best.job
        assert (best.optimizer, best.micro_batch, best.grad_accum) == \
            (("adamw-8bit", 8, 1) if bnb else ("adamw", 4, 2))
        assert any("bitsandbytes is not installed" in n for n in map(note_words, out.notes)) is not bnb


def test_prune_decision_is_taken_by_every_rank_even_without_a_prediction():
    """Under torchrun the prune decision is all-reduced: a rank whose speed prediction is unknown
    still takes part (else the ranks' collectives would fall out of step), and follows a rank
    that pruned."""
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, micro_batch=8, precision="fp32",
                  grad_ckpt="off")
    flags = []

    def other_rank_prunes(flag: bool) -> bool:
        flags.append(flag)
        return True

    calls = []
    s = Searcher(job, fake(GIB, GIB, lambda j: 100.0, calls), pred(GIB, GIB, lambda j: None), None,
                 SearchOptions(knobs=("attention",)), 10_000, agree=other_rank_prunes)
    out = s.search()
    # this rank's own view of every decision it asked (the prune, a probe's re-measure): no
    # prediction, so False — yet it asked, and followed the other rank
    assert flags and not any(flags)
    assert {t.job.attention for t in out.trials} == {"sdpa"}  # eager was not probed
    words = list(map(note_words, out.notes))
    assert any("not probed: attention eager" in n and "(on another rank)" in n for n in words)


def test_gain_the_repeats_contradict_is_not_taken_and_said():
    """A candidate faster in two rounds and slower in the third: the repeats disagree, so the
    simpler configuration stays and the search names what it could not decide."""
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8)
    eager = iter([140.0, 130.0, 90.0])

    def tps(j):
        return next(eager) if j.attention == "eager" else 100.0
    s = Searcher(job, fake(GIB, GIB, tps, calls), pred(GIB, GIB, lambda j: 100.0), None,
                 SearchOptions(knobs=("attention",)), 10_000)
    out = s.search()
    assert out.best.job.attention == "sdpa"
    undecided = [n for n in out.notes if n.kind == "undecided"]
    assert len(undecided) == 1 and undecided[0].data["changes"] == [("attention", "eager")]
    # the probe that proposed it (1.4×) is said, not counted as a round
    assert undecided[0].data["ratios"] == pytest.approx([1.3, 0.9])
    assert undecided[0].data["proposal"] == pytest.approx(1.4)
    assert "1.40× when first probed (not a round), then 1.30×, 0.90×" in note_words(undecided[0])
    assert "could not decide: attention eager" in note_words(undecided[0])


def test_picks_repeat_under_a_noisy_host():
    """The same search under ±35 % timing noise (what this machine's kind showed between repeats,
    docs/notes/cpu-timing-noise.md), 20 seeds: knobs without a real effect are never taken, a real
    2.5× gain always is — the pick is the same every time."""
    import random

    picks = set()
    for seed in range(20):
        rng = random.Random(seed)

        def tps(j, rng=rng):
            true = 250.0 if j.optimizer_impl == "foreach" else 100.0  # precision, attention: no effect
            return true * rng.uniform(0.65, 1.35)
        s = Searcher(JobSpec(model="gpt2", seq_len=64, effective_batch=8, micro_batch=8,
                             precision="fp32", grad_ckpt="off"),
                     fake(GIB, GIB, tps, []), pred(GIB, GIB, lambda j: 100.0), None,
                     SearchOptions(knobs=("precision", "attention", "optimizer_impl"),
                                   precisions=("fp32", "amp-bf16")), 10_000)
        out = s.search()
        picks.add((out.best.job.precision, out.best.job.attention, out.best.job.optimizer_impl))
    assert picks == {("fp32", "sdpa", "foreach")}


def test_a_probe_at_the_card_limit_says_the_allocator_retried():
    def probe(job: JobSpec, timed: int) -> ProbeResult:
        return ProbeResult(status="ok", measured=Measured(
            peak_allocated_bytes=GIB, peak_reserved_bytes=GIB, peak_device_bytes=GIB,
            host_rss_bytes=1, step_time_s=None, step_time_spread_s=None, tokens_per_s=None,
            samples_per_s=None, data_wait_fraction=None,
            alloc_retries=3 if job.micro_batch > 2 else 0))

    s = Searcher(JobSpec(model="gpt2", seq_len=64, effective_batch=8), probe, lambda j: None,
                 10 * GIB, SearchOptions(), dataset_samples=100)
    at_limit = s.run(JobSpec(model="gpt2", seq_len=64, micro_batch=4, effective_batch=8), "batch", 0)
    roomy = s.run(JobSpec(model="gpt2", seq_len=64, micro_batch=2, effective_batch=8), "batch", 0)
    assert "released its cache 3×" in at_limit.note and "num_alloc_retries" in at_limit.note
    assert "num_alloc_retries" not in roomy.note


def test_steady_timings_say_nothing_of_unsteadiness():
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8)
    tps = lambda j: 90.0 if j.attention == "eager" else 100.0  # noqa: E731
    s = Searcher(job, fake(GIB, GIB, tps, calls), pred(GIB, GIB, lambda j: 100.0), None,
                 SearchOptions(knobs=("attention",)), 10_000)
    s.search()
    assert ([("attention", "eager")], pytest.approx(0.9)) in s.one_probe
    assert s.repeat_spread_note() is None


def test_the_threads_note_says_what_was_measured_and_set():
    from trainfit.tune.result import SearchNote

    words = note_words(SearchNote("threads_for_load", {"threads": 1, "was": 2, "others": 1.5,
                                                       "cpus": 2}))
    assert words.startswith("other processes used 1.5 of 2 CPU cores when tune started "
                            "(measured): the probes ran torch at 1 thread instead of 2")


def test_a_probe_far_below_its_prediction_is_measured_again_before_it_is_dropped():
    """A QA run's tune dropped foreach AdamW on one probe at 231 tokens/s, 1/60 of what its
    prediction gave (a busy neighbour; 14,625 in the run before), and said nothing. Such a probe
    is measured again, and a note says so; a probe merely slower is dropped as before."""
    calls = []
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, precision="fp32", grad_ckpt="off")
    seen = {"foreach": 0}

    def tps(j):
        if j.optimizer_impl == "foreach":
            seen["foreach"] += 1
            return 231.0 if seen["foreach"] == 1 else 13_300.0
        return 13_345.0
    s = Searcher(job, fake(GIB, GIB, tps, calls), pred(GIB, GIB, lambda j: 13_969.0), None,
                 SearchOptions(knobs=("optimizer_impl",)), 10_000)
    out = s.search()
    (note,) = [n for n in out.notes if n.kind == "outlier"]
    assert note.data["first_tokens_per_s"] == 231.0 and note.data["again_tokens_per_s"] == 13_300.0
    assert "measured again at 13,300 tokens/s; then dropped" in note_words(note)
    # measured twice: not among those "dropped on one probe"
    assert not [c for c, _ in s.one_probe if ("optimizer_impl", "foreach") in c]
    assert seen["foreach"] == 2 and out.best.job.optimizer_impl != "foreach"
    # merely slower (0.9× its prediction's pace): one probe, no re-measure, no note
    seen["foreach"] = 0
    slower = Searcher(job, fake(GIB, GIB, lambda j: 12_000.0 if j.optimizer_impl == "foreach"
                                else 13_345.0, []),
                      pred(GIB, GIB, lambda j: 13_969.0), None,
                      SearchOptions(knobs=("optimizer_impl",)), 10_000).search()
    assert not [n for n in slower.notes if n.kind == "outlier"]


def test_no_8bit_optimizer_is_tried_under_a_zero_offload():
    """Under ZeRO-Offload accelerate swaps any optimizer for DeepSpeed's CPU Adam: an 8-bit
    candidate would be refused by JobSpec (it is not what runs), so it is not made."""
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, ranks=2, sharding="zero2",
                  offload="optimizer")
    s = Searcher(job, fake(GIB, GIB, lambda j: 100.0, []), pred(GIB, GIB, lambda j: 100.0),
                 10 * GIB, SearchOptions(knobs=()), 10_000)
    assert s._eight_bit(job.replace(micro_batch=2), [1, 2, 4]) == []
    assert [n.kind for n in s.notes] == ["no_8bit_zero_offload"]



def test_a_knob_fixed_by_a_flag_is_said_not_skipped_in_silence():
    """An audit: --precision on tune's command line took the knob out of the search without a
    word. The note says which field was given and its value; a knob the model cannot take (a
    module without checkpointing) says that instead."""
    job = JobSpec(model="gpt2", seq_len=64, effective_batch=8, precision="amp-bf16",
                  grad_ckpt="off")
    s = Searcher(job, fake(GIB, GIB, lambda j: 100.0, []), pred(GIB, GIB, lambda j: 100.0), None,
                 SearchOptions(knobs=("precision", "grad_ckpt"), fixed=frozenset({"precision"}),
                               unsupported=frozenset({"grad_ckpt"})), 10_000)
    out = s.search()
    notes = {n.kind: n for n in out.notes}
    assert note_words(notes["knob_fixed"]) == ("precision: not searched — the command line set "
                                               "it, so it is kept as precision amp-bf16")
    assert notes["knob_unsupported"].data["knob"] == "grad_ckpt"
    assert all(t.job.precision == "amp-bf16" and t.job.grad_ckpt == "off" for t in out.trials)


def test_a_model_without_sdpa_does_not_search_the_attention(tmp_path):
    """An audit: tune on Gemma-2 / Mamba probed eager attention (its only one), then tried sdpa
    and ended with "--attention sdpa: no SDPA implementation", exit 2, nothing written."""
    import json

    import transformers

    from trainfit.model.source import resolve_model
    from trainfit.tune.tuner import _unsupported_knobs

    cfg = transformers.AutoConfig.for_model("gemma2", hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, vocab_size=512, head_dim=16)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert _unsupported_knobs(resolve_model(str(tmp_path))) == {"attention"}
    assert _unsupported_knobs(resolve_model("llama-tiny-58m")) == frozenset()
