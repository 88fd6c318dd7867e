"""A trainer's record → the job (pure: no script runs): precision from the weights' dtypes and the
flags, what is refused rather than under-predicted, the lengths planned at, and the keyword diff."""

from __future__ import annotations

import pytest
from script_records import record

from trainfit.job import JobError, JobSpec
from trainfit.script.diff import SWITCH_OFF, keyword_diff
from trainfit.script.mapping import map_record


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


def test_padded_batches_are_planned_with_their_mask():
    """The script's collator pads (seed 000's batches): the plan carries the padding mask
    (JobSpec.padded), which transformers cannot skip; a padding-free read does not."""
    from trainfit.render.script import note_words

    j = map_record(record())
    assert j.fields["padded"] == "longest"
    assert "with the padding mask" in note_words(next(n for n in j.notes if n.kind == "padded"))
    rows = [{"rows": 2, "length": 90, "label_length": 90, "tokens": 90, "padded": False,
             "position_ids": False}]
    assert "padded" not in map_record(record(lengths__batches=rows)).fields
    for given in ({"padded"}, {"padding_free"}):  # the command line's say (a review)
        assert "padded" not in map_record(record(), given=frozenset(given)).fields
    # a padded batch of one row (padding="max_length"): every batch padded, one row too
    one = [{**rows[0], "rows": 1, "padded": True}]
    assert map_record(record(lengths__batches=one)).fields["padded"] == "always"
    eager = map_record(record(model__attn_implementation="eager"))
    assert "eager attention builds its mask anyway" in note_words(
        next(n for n in eager.notes if n.kind == "padded"))


def test_a_float32_run_with_flash_attention_2_is_planned_with_sdpa():
    """A QLoRA script with bitsandbytes' default float32 compute dtype and no bf16 flag reads as
    fp32, which flash-attention-2 refuses; the script runs (its hidden states stay bf16): planned
    with SDPA, said to err high (a review: the script was refused)."""
    from trainfit.render.script import note_words

    j = map_record(record(**{"model__loaded_in_4bit": True, "args__bf16": False,
                             "model__quantization": {"bnb_4bit_quant_type": "nf4"},
                             "model__attn_implementation": "flash_attention_2"}))
    assert j.fields["precision"] == "fp32" and j.fields["attention"] == "sdpa"
    note = next(n for n in j.notes if n.kind == "flash_fp32")
    assert "errs high" in note_words(note)
    # with a 16-bit run flash-attention-2 stays
    j = map_record(record(model__attn_implementation="flash_attention_2"))
    assert j.fields["attention"] == "flash-attention-2"
    assert not any(n.kind == "flash_fp32" for n in j.notes)


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
        "the call that enables it before the trainer (train.py:31)", SWITCH_OFF, False)
    # said as the instruction it is (QA: "...gradient_checkpointing_enable()=False" is no code)
    from trainfit.render.script import change_words

    assert change_words(ch[-1:]) == [
        "the call that enables it before the trainer (train.py:31): checkpointing off: drop "
        "model.gradient_checkpointing_enable() there, or pass prepare_model_for_kbit_training"
        "(..., use_gradient_checkpointing=False)"]


def test_checkpointing_switched_on_twice_is_switched_off_at_both():
    """An audit: a script calling ``model.gradient_checkpointing_enable()`` with SFTConfig's
    ``gradient_checkpointing=True`` (TRL's default) was told only the keyword; applied, the
    model still checkpointed.  Both places are read and both are changed."""
    r = record(args__gradient_checkpointing=True, model__gradient_checkpointing=True,
               ckpt_calls=["sft.py:12"])
    j = map_record(r)
    assert j.fields["grad_ckpt"] == "full" and "sft.py:12" in j.where["grad_ckpt"]
    pick = JobSpec.from_dict({**j.fields, "grad_ckpt": "off", "micro_batch": 8, "grad_accum": 1})
    ch = keyword_diff(r, JobSpec.from_dict(j.fields), pick)
    assert [(c.keyword, c.after) for c in ch if c.keyword in (
        "gradient_checkpointing", SWITCH_OFF)] == [("gradient_checkpointing", False),
                                                  (SWITCH_OFF, False)]
    # the arguments alone: the keyword alone
    r = record(args__gradient_checkpointing=True, model__gradient_checkpointing=True)
    ch = keyword_diff(r, JobSpec.from_dict(map_record(r).fields), pick)
    assert [c.keyword for c in ch if c.keyword in ("gradient_checkpointing", SWITCH_OFF)] == [
        "gradient_checkpointing"]


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
    assert where == {"the model's build (no from_pretrained call was read: pass it to "
                     "from_config(...), or set it on the model the script makes)"}


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


def test_flags_over_the_script_keep_its_effective_batch():
    """QA: --micro-batch 2 on a 2 × 4 script planned 2 × 1 (the accumulation dropped) and said no
    change; --effective-batch 16 was refused as three flags. The script's effective batch is kept
    unless the command line sets it (--effective-batch, or --micro-batch with --grad-accum)."""
    from trainfit.script.mapping import with_flags

    read = map_record(record()).fields  # 2 × 4 × 1
    assert (lambda f: (f["micro_batch"], f["grad_accum"]))(with_flags(read, {"micro_batch": 2})) \
        == (2, 4)
    got = {k: with_flags(read, flags) for k, flags in {
        "mb1": {"micro_batch": 1}, "eff16": {"effective_batch": 16}, "ga8": {"grad_accum": 8},
        "ranks2": {"ranks": 2}, "both": {"micro_batch": 4, "grad_accum": 4}}.items()}
    assert {k: (f["micro_batch"], f["grad_accum"], f.get("ranks"), f.get("effective_batch"))
            for k, f in got.items()} == {
        "mb1": (1, 8, 1, 8), "eff16": (2, 8, 1, 16), "ga8": (1, 8, 1, 8),
        "ranks2": (2, 2, 2, 8), "both": (4, 4, 1, None)}
    assert JobSpec.from_dict(got["both"]).effective_batch == 16  # the two flags' product
    with pytest.raises(JobError, match=r"--micro-batch 3 does not divide the script's effective "
                                       r"batch 8 \(2 × 4 × 1\)") as err:
        with_flags(read, {"micro_batch": 3})
    assert "--grad-accum too" in err.value.hint
    with pytest.raises(JobError, match="not divisible by --ranks 3"):
        with_flags(read, {"ranks": 3})


def test_method_flag_drops_the_scripts_lora_fields():
    """QA: --method full on a LoRA script was refused as '--lora-r given with --method full'
    (no --lora-r was given: the rank came from the script's LoraConfig)."""
    from trainfit.script.mapping import with_flags

    read = map_record(record()).fields
    fields = with_flags(read, {"method": "full"})
    assert not {"lora_r", "lora_alpha", "lora_targets", "base_dtype"} & set(fields)
    assert JobSpec.from_dict(fields).method == "full"  # no refusal


def test_the_change_is_said_from_what_the_script_runs():
    """QA: flags that set a knob (--precision amp-fp16 --micro-batch 16 on an fp32 4 × 4 script)
    made 'current' equal the pick and the plan said 'no change'. The script as read (only setting
    flags over it) is what the keywords change."""
    from trainfit.script.mapping import script_as_read, with_flags

    rec = record(lora=None, model__frozen_dtype=None, model__trainable_dtype="float32",
                 args__bf16=False, args__per_device_train_batch_size=4,
                 args__gradient_accumulation_steps=4)
    flags = {"precision": "amp-fp16", "micro_batch": 16, "grad_accum": 1, "seq_len": 64}
    read = map_record(rec, frozenset(flags))
    current = JobSpec.from_dict(with_flags(read.fields, flags))
    as_read = script_as_read(rec, read.fields, flags)
    assert (as_read.precision, as_read.micro_batch, as_read.grad_accum, as_read.seq_len) == \
        ("fp32", 4, 4, 64)  # --seq-len is a setting: over the script's own reading too
    changed = {(c.keyword, c.before, c.after) for c in keyword_diff(rec, as_read, current)}
    assert {("fp16", False, True), ("per_device_train_batch_size", 4, 16),
            ("gradient_accumulation_steps", 4, 1)} <= changed
    # review: --ranks / --effective-batch keep the script's own batch in what it runs now
    on_two = script_as_read(rec, read.fields, {"ranks": 2})
    assert (on_two.micro_batch, on_two.grad_accum, on_two.ranks, on_two.effective_batch) == \
        (4, 4, 2, 32)
    bigger = script_as_read(rec, read.fields, {"effective_batch": 32})
    assert (bigger.micro_batch, bigger.grad_accum) == (4, 4)
    # review: a script trainfit cannot read without a flag keeps the other flags' changes
    lion = record(args__optim="lion_32bit")
    flags = {"optimizer": "adamw", "optimizer_impl": "fused", "micro_batch": 8}
    read = map_record(lion, frozenset(flags))
    as_read = script_as_read(lion, read.fields, flags)
    assert (as_read.micro_batch, as_read.grad_accum, as_read.optimizer) == (2, 4, "adamw")
    pick = JobSpec.from_dict(with_flags(read.fields, flags))
    assert {c.keyword for c in keyword_diff(lion, as_read, pick)} >= {
        "per_device_train_batch_size", "gradient_accumulation_steps"}


def test_a_script_that_asks_for_cuda_is_told_what_that_means():
    """QA: fp16=torch.cuda.is_available() read False on this machine and planned as fp32, with
    nothing said. The hooks record where the script itself asked; the plan says it."""
    from trainfit.render.script import note_words

    notes = map_record(record(cuda_asked=["train.py:12"])).notes
    (n,) = [n for n in notes if n.kind == "cuda_asked"]
    assert "torch.cuda.is_available() (train.py:12)" in note_words(n)
    assert not [n for n in map_record(record()).notes if n.kind == "cuda_asked"]


def test_the_grid_around_a_script_keeps_a_given_accumulation_and_refuses_a_dead_flag():
    """--grad-accum 8 over the script fixed 1 × 8 as its current run, but the grid dropped it and
    planned every micro-batch (the model form fixes it); --ckpt-reentrant with --grad-ckpt off
    passed unremarked (a review)."""
    from trainfit.script.mapping import with_flags
    from trainfit.script.plan import _grid_job

    read = map_record(record()).fields  # 2 × 4 × 1
    cur = JobSpec.from_dict(with_flags(read, {"grad_accum": 8}))
    grid = _grid_job(cur, {"grad_accum"})
    assert (grid.micro_batch, grid.grad_accum, grid.effective_batch) == (1, 8, 8)
    assert _grid_job(cur, set()).micro_batch is None  # no batch flag: every micro-batch
    with pytest.raises(JobError, match="no checkpointing to make reentrant"):
        with_flags(read, {"grad_ckpt": "off", "ckpt_reentrant": True})


def test_the_precision_note_names_the_dtype_the_weights_load_in():
    """A LoRA script's weights are its frozen base's dtype, not its adapters' (an audit)."""
    from trainfit.script.tune import weights_dtype

    m = {"frozen_dtype": "bfloat16", "trainable_dtype": "float32"}
    assert weights_dtype(m, "lora") == "bfloat16"
    assert weights_dtype(m, "full") == "float32"
    assert weights_dtype({"frozen_dtype": None, "trainable_dtype": "float32"}, "lora") == "float32"


def test_a_launchers_processes_are_the_runs_ranks(tmp_path, monkeypatch):
    """An audit: under torchrun on a machine without CUDA transformers sets no DDP up (its
    ``world_size`` reads 1), so a 2-process launch was planned as 1 rank with half the
    effective batch.  The launcher's WORLD_SIZE is the GPU run's."""
    from transformers import TrainingArguments

    from trainfit.script.read import trainer_args as _args

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert _args(args)["world_size"] == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    read = _args(args)
    assert read["world_size"] == 2
    r = record()
    r["args"]["world_size"] = read["world_size"]
    assert map_record(r).fields["ranks"] == 2


def test_padding_free_packing_is_planned_as_one_row_with_its_mask():
    """An audit: TRL's padding-free packing runs one row of micro-batch × length positions,
    for which transformers 5 builds a (1, 1, N, N) boolean mask from position_ids (no flash
    kernel); plan simulated separate rows and said the mask unplanned.  Now the job is
    padding-free (simulated as that row: tests/memory/test_padding_free.py), said with the
    mask's bytes at the script's micro-batch: 2 × 256 positions → 512² bytes."""
    from trainfit.render.script import note_words

    batches = [{"rows": 1, "length": 512, "label_length": 512, "tokens": 512, "padded": False,
                "position_ids": True}]
    r = record(args__packing=True, args__max_length=256, lengths__batches=batches)
    j = map_record(r)
    assert j.fields["padding_free"] is True and j.fields["seq_len"] == 256
    note = next(n for n in j.notes if n.kind == "padding_free_mask")
    assert note.data["positions"] == 2 * 256 and note.data["mask_mib"] == 512**2 / 2**20
    said = note_words(note)
    assert "(1, 1, N, N) boolean attention mask" in said and "512 positions" in said
    assert "planned as that one row" in said and "micro-batch squared" in said
    # flash attention reads the packing from position_ids: no mask to say (a review)
    fa = map_record(record(args__packing=True, args__max_length=256, lengths__batches=batches,
                           model__attn_implementation="flash_attention_2"))
    assert [n.kind for n in fa.notes if n.kind.startswith("padding_free")] == ["padding_free"]
    assert fa.fields["padding_free"] is True and fa.fields["attention"] == "flash-attention-2"
    # a hub flash kernel is flash attention; flex_attention is planned with the dense mask, and
    # its note says so (a review: both read "no mask" while simulated with one)
    hub = map_record(record(args__packing=True, args__max_length=256, lengths__batches=batches,
                            model__attn_implementation="kernels-community/flash-attn3"))
    assert hub.fields["attention"] == "flash-attention-2"
    flex = map_record(record(args__packing=True, args__max_length=256, lengths__batches=batches,
                             model__attn_implementation="flex_attention"))
    note = next(n for n in flex.notes if n.kind == "padding_free_mask")
    assert "flex_attention builds a block mask" in note_words(note)
    # rows of their own (no position_ids): not padding-free
    rows = [{**batches[0], "rows": 2, "position_ids": False}]
    assert "padding_free" not in map_record(record(args__max_length=256,
                                                   lengths__batches=rows)).fields


def test_a_scripts_own_loss_is_said_not_planned():
    """An audit: a Trainer subclass's compute_loss (label smoothing on ``.float()`` logits) read
    as transformers' loss, unsaid.  The read names it; the plan says what it left out."""
    from trainfit.render.script import note_words
    from trainfit.script.read import _own_loss

    class Smoothing:
        compute_loss_func = None

        def compute_loss(self, model, inputs):  # the script's own
            return 0.0

    assert _own_loss(Smoothing()) == "Smoothing.compute_loss"
    j = map_record(record(own_loss="Smoothing.compute_loss"))
    note = next(n for n in j.notes if n.kind == "own_loss")
    assert "the script computes the loss itself (Smoothing.compute_loss)" in note_words(note)
    assert not any(n.kind == "own_loss" for n in map_record(record()).notes)


def test_an_fp16_pick_loads_a_bf16_base_in_fp16():
    """An audit: ``--precision amp-fp16`` on a script loading its base in bf16 (a T4 has no
    bf16) changed only bf16=False, fp16=True, keeping the bf16 base the refusal without the flag
    had told to load in float16."""
    r = record()
    j = map_record(r)
    current = JobSpec.from_dict(j.fields)
    assert current.base_dtype == "bf16" and current.precision == "amp-bf16"
    pick = current.replace(precision="amp-fp16")
    ch = {(c.keyword, c.after) for c in keyword_diff(r, current, pick)}
    assert ("fp16", True) in ch and ("bf16", False) in ch
    assert any(k == "dtype" and "float16" in str(v) for k, v in ch), ch
