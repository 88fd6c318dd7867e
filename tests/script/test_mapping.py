"""A trainer's record → the job (pure: no script runs): precision from the weights' dtypes and the
flags, what is refused rather than under-predicted, the lengths planned at, and the keyword diff."""

from __future__ import annotations

import copy

import pytest

from trainfit.job import JobError, JobSpec
from trainfit.script.diff import keyword_diff
from trainfit.script.mapping import map_record


def record(**over) -> dict:
    """seed 000's record (Trainer, LoRA on a bf16 Gemma, bf16=True, 2 × 4, checkpointing on)."""
    r = {
        "trainer": "Trainer", "mode": "plan", "ckpt_calls": [], "device_maps": [], "optimizer": None,
        "args": {"class": "TrainingArguments", "optim": "adamw_torch_fused",
                 "has_activation_checkpointing": True, "per_device_train_batch_size": 2,
                 "gradient_accumulation_steps": 4, "world_size": 1, "bf16": True, "fp16": False,
                 "learning_rate": 2e-4, "max_grad_norm": 1.0, "seed": 42, "weight_decay": 0.0,
                 "dataloader_num_workers": 0, "dataloader_pin_memory": True,
                 "dataloader_persistent_workers": False, "dataloader_prefetch_factor": None,
                 "torch_compile": False, "gradient_checkpointing_kwargs": None, "max_length": None,
                 "max_seq_length": None, "packing": None, "padding_free": None,
                 "packing_strategy": None, "gradient_checkpointing": True},
        "model": {"class": "GemmaForCausalLM", "task": "causal-lm", "name_or_path": "/m/gemma",
                  "config": {"dtype": "bfloat16"}, "device": "meta", "attn_implementation": "sdpa",
                  "total_params": 81472, "trainable_params": 3328, "quantized_params": 0,
                  "params_by_dtype": [], "frozen_dtype": "bfloat16", "trainable_dtype": "float32",
                  "gradient_checkpointing": False, "quantization": None, "loaded_in_4bit": False,
                  "loaded_in_8bit": False},
        "lora": {"type": "LoraConfig", "r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
                 "target_modules": ["q_proj", "v_proj"], "modules_to_save": [], "use_dora": False,
                 "bias": "none", "use_rslora": False, "adapted": ["a", "b", "c", "d"]},
        "loads": [{"this_model": True, "dtype": "torch.bfloat16", "at": "train.py:19"}],
        "lengths": {"dataset_samples": 6, "samples_read": 6, "sample_lengths": [10, 20, 30, 40, 50, 90],
                    "sample_label_lengths": [],
                    "batches": [{"rows": 2, "length": n, "label_length": n, "tokens": n,
                                 "padded": True, "position_ids": False} for n in (20, 40, 90)],
                    "batches_read": 3, "batches_total": 3, "keys": ["input_ids"]},
    }
    for path, value in over.items():
        *head, last = path.split("__")
        d = r
        for k in head:
            d = d[k]
        d[last] = value
    return copy.deepcopy(r)


def test_seed000_record():
    j = map_record(record())
    assert (j.fields["method"], j.fields["precision"], j.fields["grad_ckpt"], j.fields["seq_len"]) == \
        ("lora", "amp-bf16", "full", 90)
    assert j.where["grad_ckpt"] == "TrainingArguments(gradient_checkpointing=True)"
    JobSpec.from_dict(j.fields)  # a valid job


def test_the_scripts_reentrant_checkpointing_is_planned_for():
    """use_reentrant=True in the Trainer's gradient_checkpointing_kwargs, or in the model's own
    enable() before the trainer (read from its layers' checkpoint function): ckpt_reentrant."""
    assert "ckpt_reentrant" not in map_record(record()).fields  # None: transformers 5's default
    args = map_record(record(args__gradient_checkpointing_kwargs={"use_reentrant": True}))
    assert args.fields["ckpt_reentrant"] is True
    model = map_record(record(args__gradient_checkpointing=False,
                              model__gradient_checkpointing=True,
                              model__checkpoint_reentrant=True))
    assert (model.fields["grad_ckpt"], model.fields["ckpt_reentrant"]) == ("full", True)
    JobSpec.from_dict(model.fields)


def test_the_scripts_allocator_setting_is_planned_for():
    """A script that sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (in its shell or its
    own os.environ before the trainer) is planned with that allocator; a flag given wins."""
    assert map_record(record()).fields["expandable_segments"] is False  # an older record: none
    j = map_record(record(expandable_segments=True))
    assert j.fields["expandable_segments"] is True
    assert j.where["expandable_segments"] == "the script's environment (PYTORCH_CUDA_ALLOC_CONF)"
    given = map_record(record(expandable_segments=True), given=frozenset({"expandable_segments"}))
    assert "expandable_segments" not in given.fields


def test_a_float32_base_under_bf16_autocast_is_planned_as_loaded():
    """from_pretrained without a dtype on transformers < 5 loads float32: base_dtype fp32 (the
    frozen bytes doubled), not the autocast dtype."""
    j = map_record(record(model__frozen_dtype="float32"))
    assert (j.fields["precision"], j.fields["base_dtype"]) == ("amp-bf16", "fp32")
    JobSpec.from_dict(j.fields)


@pytest.mark.parametrize(("over", "precision", "note"), [
    ({"model__frozen_dtype": None, "model__trainable_dtype": "float32", "lora": None}, "amp-bf16", None),
    ({"model__frozen_dtype": None, "lora": None, "args__bf16": False}, "fp32", None),
    ({"model__frozen_dtype": None, "model__trainable_dtype": "bfloat16", "lora": None}, "bf16-true",
     "autocast_over_bf16"),
    ({"args__bf16": False}, "amp-bf16", "no_autocast"),
    ({"model__frozen_dtype": "float16", "args__bf16": False, "args__fp16": True}, "amp-fp16", None),
    # TRL's QLoRA: adapters cast to bf16, compute dtype bf16, bf16=True
    ({"model__loaded_in_4bit": True, "model__trainable_dtype": "bfloat16",
      "model__quantization": {"bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_type": "nf4"}},
     "bf16-true", "autocast_over_bf16"),
])
def test_precision_from_the_weights_and_the_flags(over, precision, note):
    j = map_record(record(**over))
    assert j.fields["precision"] == precision
    assert (note is None) or any(n.kind == note for n in j.notes)


@pytest.mark.parametrize(("over", "words"), [
    ({"model__frozen_dtype": "float32", "model__trainable_dtype": "bfloat16"},
     "combination trainfit does not model"),  # fp32 base, bf16 adapters, bf16 flag
    ({"lora__use_dora": True}, "DoRA"),
    ({"lora__modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"model__loaded_in_8bit": True}, "8 bits"),
    ({"lora": None, "model__loaded_in_4bit": True}, "cannot train"),
    ({"args__optim": "lion_8bit"}, "optim='lion_8bit'"),
    ({"model__task": None, "model__class": "CLIPModel"}, "CLIPModel"),
])
def test_what_would_be_under_predicted_is_refused(over, words):
    with pytest.raises(JobError) as err:
        map_record(record(**over))
    assert words in str(err.value) and err.value.hint


def test_a_flag_given_is_not_read_nor_refused():
    j = map_record(record(args__optim="lion_8bit"), given=frozenset({"optimizer"}))
    assert "optimizer" not in j.fields


def test_the_scripts_own_optimizer_and_checkpointing_on_the_model():
    r = record(optimizer={"class": "AdamW", "fused": False, "foreach": True},
               args__gradient_checkpointing=False, model__gradient_checkpointing=True,
               ckpt_calls=["train.py:31"])
    j = map_record(r)
    assert (j.fields["optimizer"], j.fields["optimizer_impl"]) == ("adamw", "foreach")
    assert j.fields["grad_ckpt"] == "full" and "train.py:31" in j.where["grad_ckpt"]
    pick = JobSpec.from_dict({**j.fields, "grad_ckpt": "off", "micro_batch": 8, "grad_accum": 1})
    ch = keyword_diff(r, JobSpec.from_dict(j.fields), pick)
    assert [(c.where, c.keyword, c.after) for c in ch][-1] == (
        "the call that enables it before the trainer (train.py:31)",
        "use_gradient_checkpointing / gradient_checkpointing_enable()", False)


def test_lengths_planned_at_the_longest_and_a_quantile():
    j = map_record(record())
    assert (j.lengths.longest, j.lengths.batch_max_length, j.lengths.batch_quantile_length) == (90, 90, 90)
    r = record(lengths__samples_read=5, lengths__sample_lengths=[10, 20, 30, 40, 50])
    ln = map_record(r).lengths  # not every sample read: the batches seen count too
    assert not ln.all_samples_read and ln.longest == 90
    r = record(model__task="seq2seq-lm", lengths__sample_label_lengths=[95, 5, 5, 5, 5, 5])
    j = map_record(r)
    assert j.fields["seq_len"] == 95 and any(n.kind == "seq2seq_lengths" for n in j.notes)


def test_keyword_diff_in_the_scripts_terms():
    r = record()
    cur = JobSpec.from_dict(map_record(r).fields)
    pick = cur.replace(micro_batch=8, grad_accum=1, grad_ckpt="off", precision="fp32",
                       attention="eager")
    got = {(c.where, c.keyword): (c.before, c.after) for c in keyword_diff(r, cur, pick)}
    assert got == {
        ("TrainingArguments", "per_device_train_batch_size"): (2, 8),
        ("TrainingArguments", "gradient_accumulation_steps"): (4, 1),
        ("TrainingArguments", "bf16"): (True, False),
        ("TrainingArguments", "gradient_checkpointing"): (True, False),
        ("from_pretrained (train.py:19)", "dtype"): ("torch.bfloat16", "torch.float32"),
        ("from_pretrained (train.py:19)", "attn_implementation"): ("sdpa", "eager"),
    }
    # the effective batch stays 8; the same micro-batch: no batch keyword at all
    assert keyword_diff(r, cur, cur) == []
    # a model built without from_pretrained (from_config): the change is at its build
    built = {**r, "loads": []}
    where = {c.where for c in keyword_diff(built, cur, pick) if c.keyword == "dtype"}
    assert where == {"the model's build (no from_pretrained call was read: "
                     "from_config(..., dtype=...) or model.to(dtype))"}


def test_a_bf16_pick_for_lora_on_a_float32_base_says_every_edit():
    """LoRA on a base loaded in float32 (``dtype="auto"`` of a float32 checkpoint) under
    bf16=True: amp-bf16, base_dtype fp32. A bf16-true pick was advised as ``bf16=False`` alone,
    which trains in float32 (a QA run): the load's dtype and peft's adapter dtype are said too —
    and the edited script reads back as bf16-true."""
    r = record(model__frozen_dtype="float32", model__config={"dtype": "float32"},
               loads=[{"this_model": True, "dtype": "torch.float32", "at": "train.py:19"}])
    cur = JobSpec.from_dict(map_record(r).fields)
    assert (cur.precision, cur.base_dtype) == ("amp-bf16", "fp32")
    got = {(c.where.split(" (")[0], c.keyword): (c.before, c.after)
           for c in keyword_diff(r, cur, cur.replace(precision="bf16-true"))}
    assert got == {
        ("TrainingArguments", "bf16"): (True, False),
        ("from_pretrained", "dtype"): ("torch.float32", "torch.bfloat16"),
        ("get_peft_model", "autocast_adapter_dtype"): (True, False),
    }
    edited = record(model__frozen_dtype="bfloat16", model__trainable_dtype="bfloat16",
                    args__bf16=False,
                    loads=[{"this_model": True, "dtype": "torch.bfloat16", "at": "train.py:19"}])
    assert map_record(edited).fields["precision"] == "bf16-true"
    # a base already loaded in bf16: no dtype edit, the adapters' still
    bf16_base = JobSpec.from_dict(map_record(record()).fields)
    kws = {c.keyword for c in keyword_diff(record(), bf16_base,
                                           bf16_base.replace(precision="bf16-true"))}
    assert kws == {"bf16", "autocast_adapter_dtype"}
    # and back: a bf16-true script picked to amp-bf16 is told peft's default again
    back = {c.keyword: (c.before, c.after) for c in keyword_diff(
        edited, JobSpec.from_dict(map_record(edited).fields),
        JobSpec.from_dict(map_record(edited).fields).replace(precision="amp-bf16"))}
    assert back["autocast_adapter_dtype"] == (False, True)


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_model_record_reads_the_layers_checkpointing_mode(tiny_llama, reentrant):
    """What the record reads off a real model whose checkpointing the script enabled."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainfit.script.read import _model

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(tiny_llama.config)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    rec = _model(m, m)
    assert rec["gradient_checkpointing"] is True
    assert rec["checkpoint_reentrant"] is reentrant
