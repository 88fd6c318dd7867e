"""``emit --to trl`` of a padding-free job: the SFTConfig it writes builds TRL's SFTTrainer, with
and without packing."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainfit.job import JobSpec
from trainfit.job.emit import emit


@pytest.mark.parametrize("packing", [None, True])
def test_a_padding_free_jobs_sft_config_builds_trls_trainer(packing, tmp_path):
    """A review: SFTConfig(max_length=seq_len, padding_free=True) without packing makes trl
    1.16's SFTTrainer raise ("max_length is not enforced"). Without packing: max_length=None and
    the script told to truncate; with packing: TRL's padding-free bfd strategy."""

    import transformers as T
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    job = JobSpec(model="t", seq_len=64, micro_batch=2, grad_accum=1, precision="fp32",
                  grad_ckpt="off", padding_free=True, packing=packing)
    out = emit(job, "trl", device="cpu")
    if packing:
        assert (out.payload["packing_strategy"], out.payload["max_length"]) == ("bfd", 64)
    else:
        assert out.payload["max_length"] is None
        assert any(s.knob == "padding_free" and "truncate each sample to 64" in s.where
                   for s in out.script)
    tok = T.AutoTokenizer.from_pretrained(
        Path(__file__).resolve().parents[2] / "benchmarks" / "doctor_jobs" / "byt5_tokenizer")
    model = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             vocab_size=400, pad_token_id=0))
    SFTTrainer(model=model, args=SFTConfig(output_dir=str(tmp_path), report_to=[], **out.payload),
               train_dataset=Dataset.from_dict({"text": ["hello world"] * 8}),
               processing_class=tok)
