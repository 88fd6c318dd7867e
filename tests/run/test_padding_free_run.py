"""train with ``padding_free``: each micro-batch one row of its samples, unpadded, with
position_ids restarting per sample (transformers' DataCollatorWithFlattening) — the same losses
as padded rows, because the model reads the packing from position_ids and each sample attends to
itself alone; and the batch is what plan simulates."""

from __future__ import annotations

import pytest

from trainfit.data.loader import Collate, label_tokens
from trainfit.run.loop import RunOptions, train


def test_a_padding_free_run_has_the_padded_runs_losses(job, tmp_path):
    """Chat rows of different lengths (prompt labels masked), 8 = 2 × 4, fp32 on this CPU: the
    packed run's losses equal the padded run's, step for step, and its OOM split and resume keep
    them."""
    rows = train(job, RunOptions(out_dir=tmp_path / "rows", max_steps=4))
    packed = train(job.replace(padding_free=True),
                   RunOptions(out_dir=tmp_path / "packed", max_steps=4, inject_oom_at_steps=(1,)))
    assert packed.losses == pytest.approx(rows.losses, rel=2e-5)
    assert [e.to_dict()["micro_batch_after"] for e in packed.oom_events] == [2]


def test_the_packed_batch_is_one_unpadded_row_with_the_same_label_count(job):
    """What DataCollatorWithFlattening builds (``separator_id=-100``): ids concatenated,
    position_ids restarting, each sample's first label -100 — the label count the padded rows
    have, so the token weighting of the loss is unchanged."""
    import numpy as np
    from transformers import DataCollatorWithFlattening

    from trainfit.data.load import load_data
    from trainfit.model.source import resolve_model

    data = load_data(job, resolve_model(job.model))
    items = [(i, data.input_ids[i], data.labels[i] if data.labels is not None else None)
             for i in (0, 5, 9)]
    ours = Collate(data, "causal-lm", packed=True)(items)
    rows = Collate(data, "causal-lm")(items)
    assert ours["input_ids"].shape[0] == 1 and "attention_mask" not in ours
    assert ours["input_ids"].shape[1] == sum(len(x[1]) for x in items) < rows["input_ids"].numel()
    assert label_tokens(ours, "causal-lm") == label_tokens(rows, "causal-lm")
    theirs = DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)(
        [{"input_ids": list(map(int, x[1])),
          "labels": list(map(int, x[2] if x[2] is not None else x[1]))} for x in items],
        return_tensors="pt")
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(ours[k].numpy(), theirs[k].numpy()), k


def test_a_model_that_is_not_a_transformers_causal_lm_is_refused(job):
    """A module:factory model reads no position_ids: its samples would attend to each other."""
    from trainfit.data.load import load_data
    from trainfit.job import JobError
    from trainfit.model.source import resolve_model

    data = load_data(job, resolve_model(job.model))
    with pytest.raises(JobError, match="padding-free with a custom-lm model"):
        Collate(data, "custom-lm", packed=True)
