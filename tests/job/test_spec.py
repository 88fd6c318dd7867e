import pytest

from trainfit.job import JobError, JobSpec


def test_effective_batch_derives_accumulation():
    job = JobSpec(model="gpt2", micro_batch=4, effective_batch=32, ranks=2)
    assert job.grad_accum == 4
    assert job.effective_batch == 32


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


def test_qlora_defaults_to_double_quant():
    assert JobSpec(model="gpt2", method="qlora").quant == "nf4-dq"


def test_replace_keeps_effective_batch():
    job = JobSpec(model="gpt2", micro_batch=2, effective_batch=16)
    assert job.replace(micro_batch=8).grad_accum == 2
    assert job.replace(micro_batch=4, grad_accum=1).effective_batch == 4
