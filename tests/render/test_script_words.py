"""The script form's words say what follows them."""

from trainfit.render.script import length_words
from trainfit.script.mapping import LengthStats


def _lengths(p95: int, longest: int) -> LengthStats:
    return LengthStats(dataset_samples=100, samples_read=100, sample_min=10, sample_median=50,
                       sample_max=longest, label_max=None, batches_read=50, batches_total=50,
                       batch_quantile_length=p95, batch_max_length=longest, quantile=0.95,
                       padded=True, padding_free=False, longest=longest, all_samples_read=True)


def test_the_p95_grid_is_announced_only_when_it_is_shown():
    """p95 = max = 256: no second grid followed, yet the words said 'the grid is also shown at
    the p95'."""
    same = length_words(_lengths(256, 256), 2, quantile_grid=False)
    assert "also shown" not in same and "no second grid at the p95" in same
    shorter = length_words(_lengths(128, 256), 2, quantile_grid=True)
    assert shorter.endswith("; the grid is also shown at the p95")
    assert "grid" not in length_words(_lengths(128, 256), 2).split(").")[-1]  # tune: no grid


def test_the_scripts_own_flags_that_carry_a_changed_value_are_named():
    """A script that takes its batch from its own argparse (--bs 4 --accum 2) was told only the
    TrainingArguments keywords to change (a QA run)."""
    from trainfit.render.script import own_flag_words
    from trainfit.script.diff import KeywordChange

    changes = [KeywordChange("TrainingArguments", "per_device_train_batch_size", 4, 8),
               KeywordChange("TrainingArguments", "gradient_accumulation_steps", 2, 1),
               KeywordChange("TrainingArguments", "bf16", True, False)]
    words = own_flag_words(["python", "train.py", "--bs", "4", "--accum=2", "--lr", "1e-4"],
                           changes)
    assert words is not None and "(--bs 4, --accum 2)" in words and "--lr" not in words
    assert own_flag_words(["python", "train.py"], changes) is None
    # a bool's "True" is no flag value to match
    assert own_flag_words(["python", "t.py", "--x", "True"], changes[2:]) is None
    # an audit: --lora-r 4 and --steps 4 were named for their value alone, and the switch --gc
    # that turns checkpointing on (the change turns it off) was missed
    more = [KeywordChange("TrainingArguments", "per_device_train_batch_size", 4, 16),
            KeywordChange("TrainingArguments", "gradient_accumulation_steps", 4, 1),
            KeywordChange("TrainingArguments", "gradient_checkpointing", True, False)]
    words = own_flag_words(["python", "t.py", "--batch-size", "4", "--grad-accum", "4",
                            "--lora-r", "4", "--steps", "4", "--gc", "--bf16"], more)
    assert "(--batch-size 4, --grad-accum 4, --gc)" in words
    # flags left at the script's argparse defaults (an audit: nothing was said of --bs / --gc
    # when the command line did not give them); a plain argparse flag spelled like the keyword
    # is the script's own too (an audit: skipped; HfArgumentParser's are never recorded)
    parsed = [{"flags": ["--bs"], "value": 4}, {"flags": ["--accum"], "value": 4},
              {"flags": ["--gc"], "value": True}, {"flags": ["--lora-r"], "value": 4},
              {"flags": ["--per_device_train_batch_size"], "value": 4}]
    words = own_flag_words(["python", "t.py", "--accum", "4"], more, parsed)
    assert words.startswith("the script's own command line and argparse defaults carry what the "
                            "change replaces (--accum 4, --bs (its default 4), --gc (its default "
                            "True), --per_device_train_batch_size (its default 4))")
    assert own_flag_words(["python", "t.py"], more, parsed[3:4]) is None
    # a flag that chooses the keyword by its value (an audit: --precision fp16 was missed)
    half = [KeywordChange("TrainingArguments", "fp16", True, False),
            KeywordChange("TrainingArguments", "bf16", False, True)]
    words = own_flag_words(["python", "t.py", "--precision", "fp16", "--dtype=bf16"], half)
    assert "(--precision fp16)" in words and "--dtype" not in words  # bf16 is turned on
    words = own_flag_words(["python", "t.py"], half, [{"flags": ["--mixed-precision"],
                                                       "value": "float16"}])
    assert "(--mixed-precision (its default float16))" in words
    assert own_flag_words(["python", "t.py", "--precision", "fp32"], half) is None
    # a bare 16 is fp16 under a precision's flag alone (a review: --batch-size 16 was named)
    assert "(--precision 16)" in own_flag_words(["python", "t.py", "--precision", "16"], half)
    assert own_flag_words(["python", "t.py", "--batch-size", "16", "--epochs=16"], half) is None
    words = own_flag_words(["python", "t.py"], half, [{"flags": ["-p", "--precision"],
                                                       "value": 16}])
    assert "(--precision (its default 16))" in words


def test_a_change_the_rounds_did_not_confirm_is_not_headed_measured():
    """A review: with --budget-s cutting the interleaved rounds, the script's change still read
    "measured by tune" under a pick line saying no speed-up could be confirmed."""
    from types import SimpleNamespace

    from trainfit.render.script import _change_source
    from trainfit.speed.compare import Comparison
    from trainfit.tune.result import SearchNote

    def result(verdict, budget=False):
        vs = None if verdict is None else Comparison(ratios=[9.61, 3.57], noise=6.06,
                                                     verdict=verdict)
        notes = [SearchNote("budget", {})] if budget else []
        return SimpleNamespace(vs_baseline=vs, notes=notes)

    assert _change_source(result("faster")) == "measured by tune"
    assert _change_source(result(None)) == "measured by tune"  # no baseline to compare with
    cut = _change_source(result("undecided", budget=True))
    assert cut.startswith("the search's best, not confirmed faster than yours: --budget-s")
    assert "measured by tune" not in _change_source(result("undecided"))


def test_a_slower_script_change_from_the_flags_given_says_so():
    from types import SimpleNamespace

    from trainfit.render.script import plan_change_heading

    def sp(ratio):
        return SimpleNamespace(plan=SimpleNamespace(speedup_vs_current=ratio),
                               current=SimpleNamespace(effective_batch=8), given={"micro_batch"})

    assert plan_change_heading(sp(0.51)) == (
        "[bold]change in the script[/bold] (predicted 0.51× the tokens/s the script runs now — "
        "slower, as the flags given set it; the effective batch kept, 8):")
    assert plan_change_heading(sp(1.7)) == \
        "[bold]change in the script[/bold] (the effective batch kept, 8):"
    assert "slower" not in plan_change_heading(sp(None))
    bare = sp(0.8)
    bare.given = set()  # no flag given: not said to come from them
    assert "slower; the effective batch" in plan_change_heading(bare)
