"""The job file's fields with the command line's over them (:func:`trainfit.cli.jobflags.
merge_job_fields`): what the command line's engine replaces goes with it."""

from __future__ import annotations

from trainfit.cli.jobflags import merge_job_fields
from trainfit.job import JobSpec


def test_a_files_deepspeed_buckets_go_with_the_engine_the_command_line_replaces():
    """A review: a file with ZeRO-3's prefetch bucket planned with --sharding zero2 (or fsdp)
    was refused as "drop --zero-prefetch-bucket", a flag never given."""
    file = {"model": "gpt2", "ranks": 2, "sharding": "zero3", "zero_reduce_bucket": 500_000_000,
            "zero_prefetch_bucket": 50_000_000}
    zero2 = merge_job_fields(file, {"sharding": "zero2"}, "usage")
    assert (zero2["zero_reduce_bucket"], "zero_prefetch_bucket" in zero2) == (500_000_000, False)
    JobSpec.from_dict(zero2)
    fsdp = merge_job_fields(file, {"sharding": "fsdp"}, "usage")
    assert not {"zero_reduce_bucket", "zero_prefetch_bucket"} & set(fsdp)
    JobSpec.from_dict(fsdp)
    kept = merge_job_fields(file, {"micro_batch": 2}, "usage")  # no engine given: the file's
    assert kept["zero_prefetch_bucket"] == 50_000_000
