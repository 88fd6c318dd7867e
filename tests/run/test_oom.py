"""What train says when an OOM at micro-batch 1 leaves nothing to split (run/oom.py)."""

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
