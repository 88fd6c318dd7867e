"""A bf16-true pick says what it changes in training, with or without a current configuration."""

from __future__ import annotations

from types import SimpleNamespace as NS

from trainfit.render.plan_words import numerics_words


def _row(precision: str, tokens_per_s: float, fits: bool = True):
    job = NS(precision=precision, method="full", effective_batch=8, ranks=1, micro_batch=2,
             grad_accum=4, grad_ckpt="full")
    return NS(job=job, memory=NS(fits=fits), speed=NS(tokens_per_s=tokens_per_s))


def _result(rows, current=None):
    return NS(rows=rows, pick=rows[0], current=current)


def test_a_bf16_true_pick_warns_without_a_current_configuration():
    """The audit's gap: the warning came only with --current, so a newcomer planning from
    scratch was handed pure-bf16 training as if it were only faster."""
    rows = [_row("bf16-true", 2000.0), _row("amp-bf16", 1500.0), _row("amp-bf16", 1700.0, False)]
    words = numerics_words(_result(rows))
    assert words and "every weight in bf16 with no fp32 copy" in words
    assert "the fastest that fits is amp-bf16" in words and "(1,500 tokens/s, predicted)" in words
    # against a current configuration that keeps fp32 weights: the same warning
    assert numerics_words(_result(rows, current=_row("amp-bf16", 1.0))) == words


def test_no_warning_where_the_user_chose_bf16_true_or_the_pick_keeps_fp32():
    only = [_row("bf16-true", 2000.0), _row("bf16-true", 1000.0)]
    assert numerics_words(_result(only)) is None  # --precision bf16-true: all rows
    mixed = [_row("bf16-true", 2000.0), _row("amp-bf16", 1500.0)]
    assert numerics_words(_result(mixed, current=_row("bf16-true", 1.0))) is None
    assert numerics_words(_result([_row("amp-bf16", 1500.0), *mixed])) is None


def test_mfu_legend_names_each_rows_peak_where_fp32_sits_beside_16_bit():
    """An fp32 row's MFU is a share of the fp32 peak (1/16 of bf16's on an A100), so 40 % there
    is slower than 20 % of bf16's; the legend says so only where both kinds are shown."""
    from trainfit.render.plan import _mfu_peaks

    def row(precision, mfu, method="lora"):
        return NS(job=NS(precision=precision, method=method), shown=True, speed=NS(mfu=mfu))

    mixed = NS(rows=[row("fp32", 0.4), row("amp-bf16", 0.2)])
    assert "the fp32 peak" in _mfu_peaks(mixed, all_rows=False)
    # QLoRA's fp32 rows run the 4-bit base in bf16: not "the fp32 peak" (a QA run read 38 %)
    q = _mfu_peaks(NS(rows=[row("fp32", 0.38, "qlora"), row("amp-bf16", 0.4, "qlora")]), False)
    assert "fp32 peak" not in q and "computes in bf16" in q and "of the bf16 peak" in q
    assert _mfu_peaks(NS(rows=[row("amp-bf16", 0.2), row("bf16-true", 0.3)]), False) == ""
    assert _mfu_peaks(NS(rows=[row("fp32", 0.4), row("amp-bf16", None)]), False) == ""


def test_a_current_bf16_step_on_a_card_without_bf16_is_said_so_not_an_unknown_peak():
    """A script's bf16 planned on a T4 with --precision amp-fp16: the comparison said "speed-up
    unknown (the GPU's peak for this dtype or its bandwidth is unknown)" (a QA run)."""
    from trainfit.render.words import plan_versus

    def row(precision, unknown=""):
        return NS(job=NS(precision=precision), speed=NS(unknown_reason=unknown),
                  memory=NS(fits=True, peak_device_bytes=2**30))
    res = NS(current=row("amp-bf16", "the GPU's peak for this dtype or its bandwidth is unknown"),
             pick=row("amp-fp16"), changes_vs_current=[NS(field="precision", before="amp-bf16",
                                                          after="amp-fp16")],
             speedup_vs_current=None, gpu="t4", gpu_display_name="Tesla T4",
             gpu_memory_bytes=None)
    assert "speed-up unknown (the current amp-bf16 cannot run on Tesla T4: no bf16)" in \
        plan_versus(res)
    res.gpu = "a100-80gb"  # a card with bf16: the reason stands as it was
    assert "peak for this dtype" in plan_versus(res)


def test_tune_says_how_far_its_measurements_sit_from_the_prediction_only_when_far():
    """A CPU tune of a script read 0.25-0.4× the predicted tokens/s on every probe, unremarked
    (a QA run): said, with what the prediction leaves out; within 1.5× nothing is said."""
    from trainfit.render.tune_words import speed_ratio_note

    def probe(measured, predicted, status="ok"):
        return {"status": status, "measured": {"tokens_per_s": measured},
                "predicted": {"tokens_per_s": predicted}}
    far = [probe(17_191, 59_691), probe(12_058, 29_808), probe(4_130, 11_182),
           probe(1, 1, "oom")]
    note = speed_ratio_note(far, "cpu", "script")
    assert note.startswith("measured tokens/s are 0.37× the predicted (median of 3 probes)")
    assert "the script's trainer around the step" in note and "speed_cpu.md" in note
    assert speed_ratio_note([probe(900, 1000), probe(1100, 1000)], "cpu", "job") is None
    assert speed_ratio_note([probe(900, None)], "cuda:0", "job") is None


def test_the_legend_names_a_mark_only_a_row_shows():
    """The ★ row that is also the largest fitting draws ★ alone: the legend said ▲ where no row
    showed one (an audit)."""
    from types import SimpleNamespace as NS

    from trainfit.render.plan import marks_words

    def row(mb, fits, rec, top):
        return NS(job=NS(micro_batch=mb), memory=NS(fits=fits), recommended=rec,
                  largest_fitting=top, shown=True)

    same = NS(rows=[row(1, True, False, False), row(2, True, True, True), row(4, False, False, False)])
    assert marks_words(same, False) == "★ recommended · "
    apart = NS(rows=[row(1, True, True, False), row(2, True, False, True)])
    assert marks_words(apart, False) == "★ recommended  ▲ largest micro-batch that fits · "
    assert marks_words(NS(rows=[row(1, False, False, False)]), False) == "no row fits · "
    # no --effective-batch: the grid's powers of 2 (an audit: 5 and 6 fitted beside ▲ at 4)
    apart.assumptions = NS(effective_batch=None)
    assert "▲ largest micro-batch that fits (of the powers of 2 planned: --micro-batch N plans " \
        "a size between two rows)" in marks_words(apart, False)
