"""What train says when an OOM at micro-batch 1 leaves nothing to split (run/oom.py)."""

import pytest

from trainfit.job import JobSpec
from trainfit.run.oom import cannot_split


def test_cannot_split_names_the_cpu_limit_and_what_was_kept():
    """On the CPU the capacity is --memory-limit: named with its value (an audit: "give the step
    more memory" named no flag). A fresh run that did no step kept nothing: it runs again, not
    "into a new --out"."""
    job = JobSpec(model="gpt2", seq_len=128, micro_batch=4, effective_batch=4, grad_ckpt="off",
                  precision="fp32")
    err = cannot_split(0, job, cuda=False, splits=[4, 2, 1], limit_bytes=3 * 2**29,
                       steps_done=0)
    assert str(err) == "out of memory in step 1 with micro-batch 1 (after splitting micro-batch " \
        "4 → 2 → 1)"
    assert err.hint == ("in the job file: grad_ckpt: full, method: lora, or a shorter seq_len "
                        "(now 128), and run it again; or raise --memory-limit (now 1.50 GiB)")
    later = cannot_split(5, job, cuda=True, steps_done=5)
    assert later.hint.endswith("and run it into a new --out; or give the step more memory")
    assert "(or qlora)" in later.hint


def test_an_optimizer_ooms_hint_offers_only_what_the_job_lacks_and_how_to_go_on():
    """A review: a LoRA job was told "method: lora", a fused one "optimizer_impl: fused", and a
    fresh run's first step (no checkpoint) to --resume; a method or optimizer change cannot
    resume (other trainable tensors, other states)."""
    from trainfit.job import JobSpec
    from trainfit.run.oom import optimizer_oom

    lora = JobSpec(model="gpt2", method="lora", optimizer_impl="fused")
    hint = optimizer_oom(0, lora, cuda=False, limit_bytes=2**30).hint
    assert "method: lora" not in hint and "optimizer_impl" not in hint
    assert hint == "raise --memory-limit (now 1.00 GiB); then run again (no checkpoint was saved " \
        "before this step)"
    full = JobSpec(model="gpt2", optimizer_impl="foreach")
    hint = optimizer_oom(5, full, cuda=True, saved_step=4).hint
    assert hint.startswith("optimizer_impl: fused (no temporaries the size of the weights); give "
                           "the step more memory, then --resume (checkpoint-4 holds the state "
                           "before the update); or optimizer: adamw-8bit, method: lora in a new "
                           "run (a new --out)")
    err = optimizer_oom(2, full.replace(micro_batch=8, grad_accum=1, optimizer_in_backward=True,
                                        max_grad_norm=None), cuda=True)
    assert "whose backward steps the optimizer (optimizer_in_backward)" in str(err)
    assert "optimizer_in_backward: false" in err.hint


def test_an_oom_with_the_optimizer_in_the_backward_stops(micro_model_json, chat_jsonl, tmp_path):
    """A review: an OOM there was split and redone — weights already updated, then the save
    refused "--optimizer-in-backward with grad-accum 2", a flag the user never gave."""
    from trainfit.job import JobError, JobSpec
    from trainfit.run.loop import RunOptions, train

    job = JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=8,
                  grad_accum=1, precision="fp32", data=str(chat_jsonl), max_grad_norm=None,
                  optimizer_in_backward=True)
    with pytest.raises(JobError, match="whose backward steps the optimizer"):
        train(job, RunOptions(out_dir=tmp_path / "b", max_steps=2, inject_oom_at_steps=(0,)))
