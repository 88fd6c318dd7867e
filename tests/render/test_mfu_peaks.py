"""The plan legend's MFU words: which peak each precision's rows are a share of."""

from __future__ import annotations

from types import SimpleNamespace


def test_mfu_of_rows_against_different_peaks_is_said_not_comparable():
    """An audit: OLMoE under amp-bf16 ran its experts' grouped matmuls in fp32 (the master
    weights), so its MFU (70 %) was a share of the fp32 peak beside bf16-true's 23 % of the bf16
    peak, 4.8× faster — unsaid.  Each row's peak dtype is kept (speed.mfu_peak_dtype) and the
    legend says which peak each precision's rows are against."""
    from trainfit.render.plan import _mfu_peaks

    def row(precision, dtype, mfu):
        return SimpleNamespace(job=SimpleNamespace(precision=precision, method="full"),
                               speed=SimpleNamespace(mfu=mfu, mfu_peak_dtype=dtype), shown=True)
    moe = SimpleNamespace(rows=[row("amp-bf16", "fp32", 0.70), row("bf16-true", "bf16", 0.23)],
                          gpu="h100-sxm")
    said = _mfu_peaks(moe, False)
    assert "amp-bf16 rows: the fp32 peak; bf16-true rows: the bf16 peak" in said
    assert "not comparable across them" in said and "grouped matmuls" in said
    dense = SimpleNamespace(rows=[row("amp-bf16", "bf16", 0.40), row("bf16-true", "bf16", 0.45)],
                            gpu="h100-sxm")
    assert _mfu_peaks(dense, False) == ""
    # one precision alone, against the fp32 peak: said too (a review)
    alone = SimpleNamespace(rows=[row("amp-bf16", "fp32", 0.70)], gpu="h100-sxm")
    assert "amp-bf16 rows: the fp32 peak" in _mfu_peaks(alone, False)
