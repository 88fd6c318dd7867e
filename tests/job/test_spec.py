import pytest

from trainfit.job import JobError, JobSpec


def test_effective_batch_derives_accumulation():
    job = JobSpec(model="gpt2", micro_batch=4, effective_batch=32, ranks=2)
    assert job.grad_accum == 4
    assert job.effective_batch == 32


def test_accumulation_and_effective_batch_fix_the_micro_batch():
    """--grad-accum with --effective-batch and no micro-batch was dropped: plan gridded every
    micro-batch and picked another accumulation (a QA run)."""
    job = JobSpec(model="gpt2", grad_accum=2, effective_batch=16, ranks=2)
    assert (job.micro_batch, job.grad_accum, job.effective_batch) == (4, 2, 16)
    with pytest.raises(JobError, match="not divisible by grad-accum 3 × ranks 1"):
        JobSpec(model="gpt2", grad_accum=3, effective_batch=8)


def test_micro_and_accum_give_effective():
    job = JobSpec(model="gpt2", micro_batch=2, grad_accum=4)
    assert job.effective_batch == 8


@pytest.mark.parametrize("kwargs, needle", [
    ({"micro_batch": 0}, "--micro-batch 0: must be an integer ≥ 1"),
    ({"seq_len": -5}, "--seq-len -5"),
    ({"micro_batch": 3, "effective_batch": 8}, "not divisible"),
    ({"micro_batch": 2, "grad_accum": 2, "effective_batch": 8}, "≠"),
    ({"method": "full", "lora_r": 8}, "--lora-r given with --method full"),
    ({"method": "full", "quant": "nf4"}, "--quant given with --method full"),
    ({"method": "lora", "quant": "nf4"}, "needs --method qlora"),
    ({"precision": "bf32"}, "--precision 'bf32'"),
    ({"optimizer": "adamw8bit"}, "--optimizer"),
])
def test_bad_input_is_one_clear_error(kwargs, needle):
    with pytest.raises(JobError) as info:
        JobSpec(model="gpt2", **kwargs)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_close_choice_is_suggested():
    with pytest.raises(JobError) as info:
        JobSpec(model="gpt2", optimizer="adamw8bit")
    assert info.value.hint == "did you mean 'adamw-8bit'?"


def test_unknown_yaml_key_suggests(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("model: gpt2\nmicro_bach: 4\n")
    with pytest.raises(JobError) as info:
        JobSpec.from_yaml(p)
    assert "unknown key 'micro_bach'" in str(info.value)
    assert "micro_batch" in info.value.hint


def test_a_key_given_twice_is_refused(tmp_path):
    """YAML keeps the last of two keys silently: a second seq_len appended to a tuned file
    would change the job unseen. Refused with its line; nested mappings checked too."""
    from trainfit.job import read_job_file

    p = tmp_path / "job.yaml"
    p.write_text("model: gpt2\nseq_len: 64\nmicro_batch: 2\nseq_len: 128\n")
    with pytest.raises(JobError, match="line 4: 'seq_len' is given twice") as info:
        read_job_file(p)
    assert info.value.hint == "keep one `seq_len:` line"
    p.write_text("job:\n  model: gpt2\n  lora_r: 8\n  lora_r: 16\n")
    with pytest.raises(JobError, match="'lora_r' is given twice"):
        read_job_file(p)
    p.write_text("model: gpt2\nseq_len: 64\n")
    assert read_job_file(p)[0]["seq_len"] == 64


def test_qlora_defaults_to_double_quant():
    assert JobSpec(model="gpt2", method="qlora").quant == "nf4-dq"


def test_replace_keeps_effective_batch():
    job = JobSpec(model="gpt2", micro_batch=2, effective_batch=16)
    assert job.replace(micro_batch=8).grad_accum == 2
    assert job.replace(micro_batch=4, grad_accum=1).effective_batch == 4


@pytest.mark.parametrize("given", [1, "1", 2, "2"])
def test_fsdp_version_reads_accelerates_number(given):
    """accelerate's config writes ``fsdp_version: 2`` (a YAML number); JobSpec reads it as the
    choice '2', and a version it does not know is still one clear error."""
    job = JobSpec(model="llama-3.2-1b", sharding="fsdp", ranks=2, fsdp_version=given,
                  fsdp_init="sharded" if str(given) == "2" else "wrap")
    assert job.fsdp_version == str(given)
    assert job.fsdp_flat is (str(given) == "1")
    with pytest.raises(JobError, match=r"--fsdp-version '3': must be one of auto, 1, 2"):
        JobSpec(model="llama-3.2-1b", sharding="fsdp", ranks=2, fsdp_version=3)


def test_a_known_unmodelled_choice_says_what_to_use():
    """A review: `--sharding zero1` was asked "did you mean 'zero3'?"."""
    from trainfit.job import JobError

    with pytest.raises(JobError) as err:
        JobSpec(model="m", sharding="zero1")
    assert err.value.hint.startswith("ZeRO-1 is not modelled: a rank holds between --sharding zero2")
    with pytest.raises(JobError) as err:
        JobSpec(model="m", sharding="zer3")
    assert err.value.hint == "did you mean 'zero3'?"


def test_a_micro_batch_that_does_not_divide_lists_the_ones_that_do():
    """The hint gives the micro-batches that divide the per-rank batch, by the flag's name; train,
    which takes the micro-batch as a flag too, keeps it so and adds no "(in job.yaml)" (an audit:
    the value came from --micro-batch)."""
    from trainfit.job.fields import in_file_words

    with pytest.raises(JobError) as e:
        JobSpec(model="gpt2", micro_batch=5, effective_batch=12)
    assert str(e.value) == "--effective-batch 12 is not divisible by --micro-batch 5 × ranks 1"
    assert e.value.hint == "--micro-batch 1, 2, 3, 4, 6 or 12 (the divisors of 12)"
    flag = in_file_words(e.value, "job.yaml", keep=("micro_batch",))
    assert (str(flag), flag.hint) == (
        "effective_batch: 12 is not divisible by --micro-batch 5 × ranks 1",
        "--micro-batch 1, 2, 3, 4, 6 or 12 (the divisors of 12)")
    file = in_file_words(e.value, "job.yaml")
    assert (str(file), file.hint) == (
        "effective_batch: 12 is not divisible by micro_batch: 5 × ranks 1",
        "micro_batch: 1, 2, 3, 4, 6 or 12 (the divisors of 12) (in job.yaml)")
    # fewer samples than ranks: no micro-batch divides it (an audit: an IndexError traceback)
    with pytest.raises(JobError) as e:
        JobSpec(model="gpt2", micro_batch=1, effective_batch=8, ranks=16, sharding="fsdp")
    assert e.value.hint == "choose an effective batch divisible by the 16 ranks (e.g. 16)"
