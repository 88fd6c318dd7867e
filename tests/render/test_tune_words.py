"""tune's convention notes: which sentence says what tokens/s counts, for each kind of pick."""

from __future__ import annotations

from types import SimpleNamespace

from trainfit.job import JobSpec
from trainfit.render.tune_words import (
    PADDING_FREE_TUNE_NOTES,
    SCRIPT_TUNE_NOTES,
    TUNE_NOTES,
    tune_notes,
)


def _result(step_source: str = "job", **job: object) -> SimpleNamespace:
    pick = SimpleNamespace(job=JobSpec(model="gpt2", **job))
    return SimpleNamespace(notes=[], data_notes=["data: 64 samples"], step_source=step_source,
                           pick=pick)


def test_padding_free_pick_says_its_row_holds_the_samples_own_tokens() -> None:
    assert tune_notes(_result()) == ["data: 64 samples", *TUNE_NOTES]
    packed = tune_notes(_result(padding_free=True))
    assert packed == ["data: 64 samples", *PADDING_FREE_TUNE_NOTES]
    assert "padding-free row" in packed[1] and "positions computed" not in packed[1]
    # a script's batches are its own: its conventions stand whatever the pick
    assert tune_notes(_result("script", padding_free=True)) == ["data: 64 samples",
                                                                *SCRIPT_TUNE_NOTES]
