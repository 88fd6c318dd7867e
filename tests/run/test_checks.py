"""What train refuses before building anything (trainfit.run.checks)."""

import pytest

from trainfit.job import JobError, JobSpec
from trainfit.run.checks import check_runnable

JOB = dict(model="llama-3.2-1b", seq_len=64, micro_batch=1, grad_accum=1, ranks=2)


def test_the_engines_train_does_not_run_are_refused_with_a_hint():
    with pytest.raises(JobError, match="sharding zero3") as err:
        check_runnable(JobSpec(**JOB, sharding="zero3"), 2)
    assert "accelerate" in err.value.hint
    with pytest.raises(JobError, match="fsdp-init wrap-sync") as err:
        check_runnable(JobSpec(**JOB, sharding="fsdp", fsdp_init="wrap-sync"), 2)
    assert "drop --fsdp-init" in err.value.hint
    check_runnable(JobSpec(**JOB, sharding="fsdp"), 2)  # FSDP built on meta: runs
    qlora = {**JOB, "method": "qlora"}
    with pytest.raises(JobError, match=r"quant-lib torchao-0\.1") as err:
        check_runnable(JobSpec(**qlora, quant_lib="torchao-0.1"), 2)
    assert "drop --quant-lib" in err.value.hint
    check_runnable(JobSpec(**qlora), 2)  # bitsandbytes' loading: what train runs
    one = {**JOB, "ranks": 1}
    with pytest.raises(JobError, match="clone-layers describes torchtune") as err:
        check_runnable(JobSpec(**one, clone_layers=True), 1)
    assert "drop --clone-layers" in err.value.hint
    check_runnable(JobSpec(**one), 1)
    with pytest.raises(JobError, match=r"rope-cache fp32 describes transformers < 4\.40") as err:
        check_runnable(JobSpec(**one, rope_cache="fp32"), 1)
    assert "drop --rope-cache" in err.value.hint
    with pytest.raises(JobError, match="fused-qkv describes model code that fuses") as err:
        check_runnable(JobSpec(**one, fused_qkv=True), 1)
    assert "drop --fused-qkv" in err.value.hint
    check_runnable(JobSpec(**one, grad_ckpt="full", ckpt_reentrant=True), 1)  # runs as asked
    check_runnable(JobSpec(**one, padding_free=True), 1)  # the own loop packs its rows


def test_the_process_count_must_be_the_jobs_ranks():
    with pytest.raises(JobError, match="ranks 2 but 1 process"):
        check_runnable(JobSpec(**JOB), 1)


def test_tune_refuses_what_only_plan_models():
    from trainfit.tune.tuner import _check_job

    with pytest.raises(JobError, match="tune measures the installed transformers") as err:
        _check_job(JobSpec(**{**JOB, "ranks": 1}, rope_cache="bf16"))
    assert "drop --rope-cache" in err.value.hint
    with pytest.raises(JobError, match="tune measures the transformers model") as err:
        _check_job(JobSpec(**{**JOB, "ranks": 1}, fused_qkv=True))
    assert "drop --fused-qkv" in err.value.hint


def test_a_resume_of_a_directory_in_use_names_the_run(tmp_path):
    """--resume of a run still writing its directory, before its first checkpoint: the run
    holding it is named (it said "no complete checkpoint in it"); a free directory passes."""
    import os

    import pytest

    from trainfit.job import JobError
    from trainfit.run.rundir import RunLock, check_not_in_use

    check_not_in_use(tmp_path)  # no lock file
    lock = RunLock(tmp_path)
    lock.acquire()
    try:
        with pytest.raises(JobError, match=f"another trainfit run is using this directory "
                                           f"\\(pid {os.getpid()} on"):
            check_not_in_use(tmp_path)
    finally:
        lock.release()
    check_not_in_use(tmp_path)  # released: free again


def test_resume_settings_and_config_compare_as_they_ran(tmp_path):
    """A review: precision None (fp32) → 'fp32' was said as a change; a NaN config value, or an
    object's str(), refused a config against itself."""
    import math
    from types import SimpleNamespace

    from trainfit.run.resume_fields import changed_settings, config_values, same_model_config

    assert changed_settings({"precision": None, "grad_ckpt": None}, {"precision": "fp32",
                                                                     "grad_ckpt": "off"}) == []
    assert changed_settings({"precision": None}, {"precision": "amp-bf16"}) == [
        "precision: 'amp-bf16' from this segment on (the checkpoint's run had 'fp32')"]

    class Cfg(SimpleNamespace):
        def to_dict(self):
            return dict(vars(self))

    cfg = Cfg(logit_softcap=math.nan, thing=object(), hidden_size=64)
    saved = config_values(cfg)
    assert set(saved) == {"logit_softcap", "hidden_size"}  # no str() of an object
    same_model_config(tmp_path, {"model_config": saved}, Cfg(logit_softcap=math.nan,
                                                             thing=object(), hidden_size=64))
    # the record as train.json holds it (strict JSON: inf and NaN written as null) resumes its
    # own config: Mamba2's time_step_limit (0.0, inf) was refused at every resume (a review)
    import json

    from trainfit import json_text
    from trainfit.job import JobError

    mamba = Cfg(time_step_limit=(0.0, math.inf), logit_softcap=math.nan, hidden_size=64)
    record = json.loads(json_text.dumps({"model_config": config_values(mamba)}))
    assert record["model_config"]["time_step_limit"] == [0.0, None]
    same_model_config(tmp_path, record, mamba)
    with pytest.raises(JobError, match="hidden_size"):
        same_model_config(tmp_path, record, Cfg(time_step_limit=(0.0, math.inf),
                                                logit_softcap=math.nan, hidden_size=32))


def test_an_earlier_segments_record_does_not_name_a_launchs_end(tmp_path):
    """A review: a rank killed on a resume exited 143, read from the earlier segment's
    'interrupted' train.json; a record older than the launch is not read."""
    import json
    import os
    import time

    from trainfit.run.launch import exit_code_of

    (tmp_path / "train.json").write_text(json.dumps({"stopped": "interrupted",
                                                     "signal": "SIGTERM"}))
    assert exit_code_of(tmp_path, 1) == 143
    old = time.time() - 60
    os.utime(tmp_path / "train.json", (old, old))
    assert exit_code_of(tmp_path, 1, since=time.time() - 1) == 1
