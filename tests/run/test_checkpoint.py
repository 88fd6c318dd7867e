

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
