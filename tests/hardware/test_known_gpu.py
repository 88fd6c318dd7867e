"""The one unknown-GPU check plan, tune, train and doctor share (hardware/gpus.py known_gpu)."""

from __future__ import annotations

import pytest


def test_known_gpu_is_the_one_unknown_card_check() -> None:
    """plan, tune, train and doctor share one check: a card, its close names, the generic rule."""
    from trainfit.hardware.gpus import find_gpu, known_gpu
    from trainfit.job import JobError

    assert known_gpu("H100 SXM", "--gpu H100 SXM") is find_gpu("h100-sxm")
    assert known_gpu("generic-24gb", "x").name == "generic-24gb"
    with pytest.raises(JobError) as err:
        known_gpu("rtx-3095", "gpu: rtx-3095 (in job.yaml)")
    assert str(err.value) == "gpu: rtx-3095 (in job.yaml): unknown GPU"
    assert err.value.hint.startswith("did you mean rtx-3090")
    with pytest.raises(JobError, match="generic-<N>gb with N its memory"):
        known_gpu("generic-0gb", "--gpu generic-0gb")
    # a job file's card, for a command without --gpu: the hint gives the file's key
    with pytest.raises(JobError) as err:
        known_gpu("generic-0gb", "gpu: generic-0gb (in job.yaml)", "gpu: generic-24gb")
    assert err.value.hint == "e.g. gpu: generic-24gb"
