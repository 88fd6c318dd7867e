

def test_step_of_and_state_counts_read_only_what_they_should(tmp_path):
    from trainfit.run.checkpoint import state_count, step_of

    assert [step_of(tmp_path / n) for n in ("checkpoint-12", "checkpoint-x", "ckpt-3",
                                              "checkpoint-")] == [12, None, None, None]
    ck = tmp_path / "checkpoint-12"
    ck.mkdir()
    assert state_count(ck, "max_steps") is None  # no file
    for text, want in (('{"max_steps": 40}', 40), ('{"max_steps": 0}', None),
                       ('{"max_steps": true}', None), ('{"max_steps": "40"}', None),
                       ("[1, 2]", None), ("{not json", None)):
        (ck / "trainer_state.json").write_text(text)
        assert state_count(ck, "max_steps") == want, text


def test_a_garbage_random_state_is_a_corrupt_checkpoint_not_a_traceback(
        micro_model_json, chat_jsonl, tmp_path):
    """A ``trainer_state.json`` whose digests match but whose numpy state is garbage raised
    ValueError out of the resume (exit 1, a traceback: an audit); it is bad input like any other
    corrupt file."""
    import json

    import pytest

    from trainfit.job import JobError, JobSpec
    from trainfit.run.checkpoint import write_digests
    from trainfit.run.loop import RunOptions, train

    job = JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                  precision="fp32", data=str(chat_jsonl))
    train(job, RunOptions(out_dir=tmp_path / "r", max_steps=1))
    ck = tmp_path / "r" / "checkpoint-1"
    # the weights have the mode of every other file (safetensors wrote them 0600: an audit)
    assert (ck / "model.safetensors").stat().st_mode == (ck / "trainer_state.json").stat().st_mode
    state = json.loads((ck / "trainer_state.json").read_text())
    state["numpy_rng"] = ["MT19937", [1, 2, 3], 0, 0, 0.0]
    (ck / "trainer_state.json").write_text(json.dumps(state))
    (ck / "digests.json").unlink()
    write_digests(ck)
    with pytest.raises(JobError, match=r"checkpoint-1: the checkpoint is corrupt \((Value|Index)Err"):
        train(job, RunOptions(out_dir=tmp_path / "r", max_steps=2, resume=ck))


def test_a_cut_torch_save_is_said_in_words():
    """torch.save's zip writer on a full disk raises without an errno: its words were
    "[enforce fail at inline_container.cc:672] . unexpected pos 699328 vs 699220" (an audit)."""
    from trainfit.run.rundir import os_reason

    err = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 699328 vs 699220")
    assert os_reason(err) == "the write was cut short, most likely a full disk (torch.save's writer)"
    assert os_reason(OSError(28, "x")) == "No space left on device"
