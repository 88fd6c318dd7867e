"""The script's FSDP / DeepSpeed ZeRO (:mod:`trainfit.script.sharding`): read from real
TrainingArguments and accelerate's launch environment, mapped to the job's sharding fields (pure,
on records), and planned end to end as the job file of the same engine is."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from plan_json import PEAKS, job_file, peak_rows, plan_json
from script_records import record

from trainfit.job import JobError, JobSpec
from trainfit.script.mapping import map_record
from trainfit.script.sharding import read_sharding

DEEPSPEED = next((Path(__file__).resolve().parents[2] / "build" / "reference").glob(
    "deepspeed-*"), None)


def _args(monkeypatch, **kw):
    import transformers.training_args as ta

    # as the hooks do (no GPU here); FSDP's arguments write this variable themselves: restored
    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda *a, **k: True)
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    return ta.TrainingArguments(output_dir="/nonexistent/out", bf16=True, report_to=[], **kw)


def _clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("FSDP_", "ACCELERATE_")):
            monkeypatch.delenv(k)


def test_fsdp_read_from_the_training_arguments(monkeypatch):
    _clean_env(monkeypatch)
    assert read_sharding(_args(monkeypatch)) is None  # DDP / one process
    s = read_sharding(_args(monkeypatch, fsdp="full_shard auto_wrap",
                            fsdp_config={"activation_checkpointing": True}))
    assert (s["engine"], s["version"], s["strategy"], s["activation_checkpointing"],
            s["cpu_offload"]) == ("fsdp", 2, "FULL_SHARD", True, False)
    assert read_sharding(_args(monkeypatch, fsdp="shard_grad_op"))["strategy"] == "SHARD_GRAD_OP"
    one = read_sharding(_args(monkeypatch, fsdp="full_shard offload", fsdp_config={"version": 1}))
    # transformers' FSDP1 plugin arguments: sync_module_states defaults to true
    assert (one["version"], one["strategy"], one["cpu_offload"], one["sync_module_states"]) == \
        (1, "FULL_SHARD", True, True)


def test_fsdp_read_from_accelerate_launch_environment(monkeypatch):
    """``accelerate launch`` with an FSDP config writes ACCELERATE_USE_FSDP and FSDP_* (read with
    accelerate's defaults: version 1, FULL_SHARD); a strategy may be a number (1-5)."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    s = read_sharding(_args(monkeypatch))
    assert (s["version"], s["strategy"], s["where"]) == \
        (1, "FULL_SHARD", "accelerate launch (ACCELERATE_USE_FSDP)")
    assert read_sharding(_args(monkeypatch))["auto_wrap_policy"] == "NO_WRAP"  # accelerate's default
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "3")
    assert read_sharding(_args(monkeypatch))["strategy"] == "NO_SHARD"
    # FSDP1: the environment's strategy over transformers' reshard_after_forward (accelerate's
    # plugin sets sharding_strategy first, and prepare takes it)
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP")
    assert read_sharding(_args(monkeypatch, fsdp="full_shard", fsdp_config={"version": 1}))["strategy"] == \
        "SHARD_GRAD_OP"
    monkeypatch.delenv("FSDP_SHARDING_STRATEGY")
    assert read_sharding(_args(monkeypatch, fsdp="shard_grad_op", fsdp_config={"version": 1}))[
        "strategy"] == "FULL_SHARD"
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    s = read_sharding(_args(monkeypatch))
    assert (s["version"], s["strategy"], s["cpu_offload"]) == (2, "SHARD_GRAD_OP", True)


def test_deepspeed_config_read():
    """The config as HF's HfTrainerDeepSpeedConfig / accelerate's plugin hold it ("auto" sizes
    left unread: HF fills them from the hidden size, as plan models them)."""
    cfg = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                 "offload_param": {"device": "cpu", "pin_memory": False},
                                 "reduce_bucket_size": "auto",
                                 "stage3_prefetch_bucket_size": 5e8},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}}}
    args = SimpleNamespace(deepspeed=cfg, deepspeed_plugin=SimpleNamespace(deepspeed_config=cfg))
    s = read_sharding(args)
    assert (s["stage"], s["offload_optimizer"], s["offload_param"], s["pin_memory"]) == \
        (3, "cpu", "cpu", False)
    assert s["buckets"] == {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": 5e8}
    assert s["knobs"] == {}
    assert s["optimizer"] == {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}}


def _fsdp(**over) -> dict:
    return {"engine": "fsdp", "where": "TrainingArguments(fsdp=...)", "version": 2,
            "strategy": "FULL_SHARD", "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "cpu_offload": False, "activation_checkpointing": False,
            "sync_module_states": False, "cpu_ram_efficient_loading": False, **over}


def _zero(**over) -> dict:
    return {"engine": "deepspeed", "where": "TrainingArguments(deepspeed=...)", "stage": 3,
            "offload_optimizer": "none", "offload_param": "none", "pin_memory": True,
            "optimizer": None, "knobs": {}, "buckets": {}, **over}


def test_fsdp_mapped_as_hf_trainer_runs_it():
    j = map_record(record(args__sharding=_fsdp(activation_checkpointing=True),
                          args__gradient_checkpointing=False))
    f = j.fields
    assert (f["sharding"], f["fsdp_version"], f["fsdp_no_sync"], f["fsdp_reduce_dtype"]) == \
        ("fsdp", "2", True, "param")
    assert (f["grad_ckpt"], f.get("ckpt_reentrant", False)) == ("full", False)
    assert j.where["grad_ckpt"].startswith("FSDP's activation_checkpointing")
    assert [n.kind for n in j.notes if n.kind == "fsdp"] == ["fsdp"]
    JobSpec.from_dict({**f, "ranks": 2})
    one = map_record(record(args__sharding=_fsdp(version=1, sync_module_states=True,
                                                 cpu_offload=True))).fields
    assert (one["fsdp_version"], one["fsdp_init"], one["offload"]) == ("1", "wrap-sync", "all")
    JobSpec.from_dict({**one, "ranks": 2})
    no_shard = map_record(record(args__sharding=_fsdp(version=1, strategy="NO_SHARD"))).fields
    assert (no_shard["sharding"], no_shard["fsdp_init"]) == ("none", "wrap")


def test_fsdp_strategies_plan_cannot_represent_are_refused():
    for strategy in ("SHARD_GRAD_OP", "HYBRID_SHARD"):
        with pytest.raises(JobError, match=strategy) as err:
            map_record(record(args__sharding=_fsdp(strategy=strategy)))
        assert "--sharding" in err.value.hint
    # another engine given: the script's is not read
    j = map_record(record(args__sharding=_fsdp(strategy="SHARD_GRAD_OP")),
                   frozenset({"sharding"}), sharding_flag="none")
    assert "sharding" not in j.fields and "sharding" not in j.where
    assert "fsdp_no_sync" not in j.fields
    # the hint's --sharding fsdp: planned as FULL_SHARD with the script's other FSDP settings
    # (HF's no_sync accumulation kept: unsharded gradients between micro-steps)
    j = map_record(record(args__sharding=_fsdp(strategy="SHARD_GRAD_OP")),
                   frozenset({"sharding"}), sharding_flag="fsdp")
    assert (j.fields["fsdp_no_sync"], j.fields["fsdp_reduce_dtype"]) == (True, "param")


def test_fsdp_settings_the_gpu_run_refuses_or_plan_cannot_hold_are_refused():
    # both checkpointings: transformers raises when it builds the Trainer with FSDP
    with pytest.raises(JobError, match="gradient_checkpointing=True"):
        map_record(record(args__sharding=_fsdp(activation_checkpointing=True)))
    # a full fine-tune under accelerate's default NO_WRAP: one unit, not a layer each
    with pytest.raises(JobError, match="NO_WRAP"):
        map_record(record(args__sharding=_fsdp(auto_wrap_policy="NO_WRAP"), lora=None,
                          model__trainable_params=81472, model__frozen_dtype=None))
    # peft replaces the policy with its own per layer (update_fsdp_plugin_peft) under FSDP1
    # alone: transformers calls it where it delays the optimizer, which FSDP2 does not
    assert map_record(record(args__sharding=_fsdp(version=1, auto_wrap_policy="NO_WRAP"))
                      ).fields["sharding"] == "fsdp"
    with pytest.raises(JobError, match="NO_WRAP"):
        map_record(record(args__sharding=_fsdp(auto_wrap_policy="NO_WRAP")))
    # NO_SHARD under --sharding fsdp: FULL_SHARD with the script's FSDP settings, said
    j = map_record(record(args__sharding=_fsdp(version=1, strategy="NO_SHARD")),
                   frozenset({"sharding"}), sharding_flag="fsdp")
    assert (j.fields["fsdp_version"], j.fields["fsdp_no_sync"]) == ("1", True)
    assert [n.data["what"] for n in j.notes if n.kind == "engine_ignored"] == \
        ["strategy NO_SHARD"]
    with pytest.raises(JobError, match="NO_SHARD with CPU offload"):
        map_record(record(args__sharding=_fsdp(strategy="NO_SHARD", cpu_offload=True)))


def test_deepspeed_zero_mapped():
    f = map_record(record(args__sharding=_zero(offload_optimizer="cpu"))).fields
    assert (f["sharding"], f["offload"], f["zero_pin_memory"]) == ("zero3", "optimizer", True)
    # bucket sizes the config leaves out are DeepSpeed's own defaults (accelerate fills only
    # "auto" keys); "auto" is hidden² (the job's unset); a number is the config's
    assert (f["zero_reduce_bucket"], f["zero_prefetch_bucket"]) == (500_000_000, 50_000_000)
    auto = map_record(record(args__sharding=_zero(buckets={
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": 2e7}))).fields
    assert (auto["zero_reduce_bucket"], auto["zero_prefetch_bucket"]) == (None, 20_000_000)
    JobSpec.from_dict({**f, "ranks": 2})
    f = map_record(record(args__sharding=_zero(offload_optimizer="cpu", offload_param="cpu",
                                               pin_memory=False))).fields
    assert (f["offload"], f["zero_pin_memory"]) == ("all", False)
    z2 = map_record(record(args__sharding=_zero(stage=2))).fields
    assert (z2["sharding"], z2["zero_reduce_bucket"]) == ("zero2", 500_000_000)
    assert "zero_prefetch_bucket" not in z2  # ZeRO-3's alone
    JobSpec.from_dict({**z2, "ranks": 2})
    # stage 0: DeepSpeed's own fp32 master and 5e8-element all-reduce buckets beside DDP's
    with pytest.raises(JobError, match="ZeRO stage 0"):
        map_record(record(args__sharding=_zero(stage=0)))
    with pytest.raises(JobError, match="NVMe") as err:
        map_record(record(args__sharding=_zero(offload_optimizer="nvme")))
    # the hint's way out is no loop: the script's own stage given with a CPU offload
    assert "--sharding zero3 --offload optimizer" in err.value.hint
    j = map_record(record(args__sharding=_zero(offload_optimizer="nvme")),
                   frozenset({"sharding", "offload"}), sharding_flag="zero3")
    assert j.fields["zero_reduce_bucket"] == 500_000_000
    # a partial offload's ratio as DeepSpeed reads it: 0.0 keeps all on the GPU, refused too;
    # read only where the optimizer is offloaded
    s = read_sharding(SimpleNamespace(deepspeed={}, deepspeed_plugin=SimpleNamespace(
        deepspeed_config={"zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "cpu", "ratio": 0.0}}})))
    assert s["offload_ratio"] == 0.0
    s = read_sharding(SimpleNamespace(deepspeed={}, deepspeed_plugin=SimpleNamespace(
        deepspeed_config={"zero_optimization": {"stage": 3, "offload_optimizer": {
            "device": "none", "ratio": 0.3}}})))
    assert s["offload_ratio"] == 1.0


@pytest.mark.parametrize("over, what", [
    ({"stage": 1}, "ZeRO stage 1"),  # its 5e8 buckets beside DDP's holdings: no bound of plan's
    ({"offload_optimizer": "cpu", "offload_ratio": 0.3}, "ratio 0.3"),
    ({"hpz_partition_size": 8}, "zero_hpz_partition_size 8"),
    ({"mics_shard_size": 4}, "mics_shard_size 4"),
    ({"grad_accum_dtype": "fp32"}, "grad_accum_dtype fp32")])
def test_deepspeed_settings_that_hold_more_are_refused(over, what):
    with pytest.raises(JobError, match=what) as err:
        map_record(record(args__sharding=_zero(**over)))
    assert "--sharding zero" in err.value.hint
    # the script's own stage given: planned as asked, what it leaves out said (the hint's way
    # out); ZeRO-1's hint names DDP and ZeRO-2, no stage of its own
    if "stage" not in over:
        assert "--sharding zero3" in err.value.hint
        j = map_record(record(args__sharding=_zero(**over)), frozenset({"sharding"}),
                       sharding_flag="zero3")
        assert j.fields.get("zero_reduce_bucket") == 500_000_000
        assert [n.data["engine"] for n in j.notes if n.kind == "engine_ignored"] == ["DeepSpeed"]


def test_a_deepspeed_optimizer_block_decides_the_optimizer():
    """HF hands DeepSpeed a DummyOptim when the config has an optimizer: args.optim does not
    run (here an optim plan refuses), DeepSpeed's fused Adam does, with the block's decay."""
    block = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.05}}
    j = map_record(record(args__optim="adamw_anyprecision",
                          args__sharding=_zero(optimizer=block)))
    assert (j.fields["optimizer"], j.fields["optimizer_impl"], j.fields["weight_decay"]) == \
        ("adamw", "fused", 0.05)
    assert j.where["optimizer"].startswith("the DeepSpeed config's optimizer")
    with pytest.raises(JobError, match="Lamb"):
        map_record(record(args__sharding=_zero(optimizer={"type": "Lamb", "params": {}})))
    # torch_adam: torch's AdamW with its default kernel (foreach on a GPU) steps the partition
    torch_adam = {"type": "AdamW", "params": {"torch_adam": True}}
    assert map_record(record(args__sharding=_zero(optimizer=torch_adam))).fields[
        "optimizer_impl"] == "foreach"
    # --optimizer given: the command line's
    given = map_record(record(args__sharding=_zero(optimizer=block)), frozenset({"optimizer"}))
    assert "optimizer" not in given.fields


def test_explicit_zero_sizes_past_what_plan_models_are_said():
    j = map_record(record(model__config={"dtype": "bfloat16", "hidden_size": 64},
                          args__sharding=_zero(knobs={"stage3_param_persistence_threshold": 1e6,
                                                      "stage3_max_live_parameters": 1e9})))
    knob = [n.data for n in j.notes if n.kind == "zero_knob"]
    # the persistence threshold: HF's "auto" is 10 h = 640 elements; the live cap is
    # DeepSpeed's default, as planned
    assert knob == [{"key": "stage3_param_persistence_threshold", "value": 1_000_000,
                     "planned": 640, "more": True}]
    from trainfit.render.script import note_words

    said = note_words(next(n for n in j.notes if n.kind == "zero_knob"))
    assert "may be under" in said


def test_tune_refuses_a_sharded_script():
    from trainfit.script.tune import tune_trainer

    rec = record(args__sharding=_fsdp())
    with pytest.raises(JobError, match=r"FSDP .*one process"):
        tune_trainer(SimpleNamespace(), rec, {"device": "cpu"})


def test_a_script_with_fsdp_plans_as_the_job_file_of_the_same_engine(seed000, tmp_path):
    """Seed 000 with TrainingArguments(fsdp=..., fsdp_config={"activation_checkpointing": True})
    read in one process (transformers refuses FSDP outside a distributed run: the hooks take it
    off the arguments and record it) and planned on 2 ranks: the plan of the job file with the
    same engine, to the byte; before, it was planned as DDP. (--effective-batch 16: the
    script's 2 × 4 on 2 ranks, so that its configuration is a row of the grid, simulated whole
    in both plans.)"""
    flags = ["--gpu", "a10g", "--precision", "amp-bf16", "--ranks", "2", "--effective-batch", "16"]
    extra = {"fsdp": "full_shard auto_wrap", "fsdp_config": {"activation_checkpointing": True},
             "gradient_checkpointing": False}
    got = plan_json([*flags, "--", *seed000.cmd("--args-json", json.dumps(extra))])
    assert (got["job"]["sharding"], got["job"]["fsdp_no_sync"], got["job"]["grad_ckpt"]) == \
        ("fsdp", True, "full")
    job = job_file(tmp_path, {
        "model": str(seed000.model), "method": "lora", "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_targets": ["q_proj", "v_proj"],
        "seq_len": got["job"]["seq_len"], "base_dtype": "bf16", "effective_batch": 16,
        "optimizer": "adamw", "optimizer_impl": "fused", "attention": "sdpa",
        "padded": got["job"]["padded"], "sharding": "fsdp", "fsdp_version": "2",
        "fsdp_no_sync": True, "fsdp_reduce_dtype": "param"},
        {"micro_batch": 2, "grad_accum": 4, "grad_ckpt": "full"})
    want = plan_json([job, *flags])
    assert peak_rows(got["plan"]) == peak_rows(want)
    assert [got["plan"]["current"][k] for k in PEAKS] == [want["current"][k] for k in PEAKS]


@pytest.mark.skipif(DEEPSPEED is None, reason="DeepSpeed not installed in build/reference "
                    "(scripts/test.sh installs it)")
def test_a_script_with_a_deepspeed_config_is_planned_with_zero(seed000, monkeypatch):
    """Seed 000 with TrainingArguments(deepspeed={ZeRO-3, offload_optimizer, an AdamW block}),
    made before from_pretrained as the HF docs tell (transformers then builds the model under
    deepspeed.zero.Init, which raises outside a distributed run: the hooks load it as plan
    does): plan reads ZeRO-3 with the optimizer offloaded and DeepSpeed's own AdamW (weight
    decay from the block)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(DEEPSPEED), os.environ.get("PYTHONPATH", "")) if p))
    text = seed000.script.read_text()
    made = "args = dict(output_dir"
    load = "model = AutoModelForCausalLM.from_pretrained(a.model, **load)\n"
    block = text[text.index(made):text.index("trainer = Trainer(")]
    text = text.replace(block, "").replace(load, block + "targs = TrainingArguments(**args)\n"
                                           + load)
    seed000.script.write_text(text.replace("args=TrainingArguments(**args)", "args=targs"))
    assert text.index("targs = TrainingArguments") < text.index("ForCausalLM.from_pretrained")
    cfg = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
           "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto",
           "gradient_accumulation_steps": "auto",
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.01}}}
    flags = ["--gpu", "a10g", "--precision", "amp-bf16", "--ranks", "2"]
    got = plan_json([*flags, "--", *seed000.cmd("--args-json", json.dumps({"deepspeed": cfg}))])
    j = got["job"]
    assert (j["sharding"], j["offload"], j["optimizer"], j["optimizer_impl"], j["weight_decay"]) \
        == ("zero3", "optimizer", "adamw", "fused", 0.01)
    # the config leaves the buckets out: DeepSpeed's own defaults run
    assert (j["zero_reduce_bucket"], j["zero_prefetch_bucket"]) == (500_000_000, 50_000_000)


def test_a_deepspeed_script_without_deepspeed_says_to_install_it(seed000, monkeypatch):
    """Without the package, TrainingArguments(deepspeed=...) raises as it is built: one line
    saying so, with the install (exit 2 through the CLI's ScriptError)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed importable here")
    from trainfit.script.launch import ScriptError, run_script

    monkeypatch.delenv("PYTHONPATH", raising=False)
    cfg = {"zero_optimization": {"stage": 2}}
    with pytest.raises(ScriptError, match="needs DeepSpeed installed") as err:
        run_script(seed000.cmd("--args-json", json.dumps({"deepspeed": cfg})), mode="plan")
    assert "pip install deepspeed" in err.value.hint


def test_checkpointing_changes_are_said_in_fsdp_config():
    """Under FSDP the change to checkpointing is FSDP's own (fsdp_config's
    activation_checkpointing), where the script's FSDP checkpoints and where the pick turns it
    on; gradient_checkpointing is not what to add (transformers warns of its extra
    all-gather)."""
    from trainfit.script.diff import keyword_diff

    rec = record(args__sharding=_fsdp(activation_checkpointing=True),
                 args__gradient_checkpointing=False)
    job = JobSpec.from_dict({**map_record(rec).fields, "ranks": 2})
    off = keyword_diff(rec, job, job.replace(grad_ckpt="off"))
    assert [(c.where, c.keyword, c.before, c.after) for c in off] == [
        ("TrainingArguments(fsdp_config=...)", "activation_checkpointing", True, False)]
    rec_off = record(args__sharding=_fsdp(where="accelerate launch (ACCELERATE_USE_FSDP)"),
                     args__gradient_checkpointing=False)
    job = JobSpec.from_dict({**map_record(rec_off).fields, "ranks": 2})
    assert job.grad_ckpt == "off"
    on = keyword_diff(rec_off, job, job.replace(grad_ckpt="full"))
    assert [(c.where, c.keyword, c.after) for c in on] == [
        ("the accelerate config (fsdp_activation_checkpointing)", "activation_checkpointing",
         True)]


def test_accelerate_launch_fsdp1_environment_is_read_in_one_process(seed000, monkeypatch):
    """``accelerate config``'s usual FSDP1 settings in the environment (sync_module_states):
    accelerate's plugin, built by the Trainer, looks for a GPU and raised in plan's one process
    (a review); the hooks record the FSDP_* environment and build the trainer without it."""
    from trainfit.script.launch import run_script

    for k, v in {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1",
                 "FSDP_SYNC_MODULE_STATES": "true",
                 "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"}.items():
        monkeypatch.setenv(k, v)
    rec = run_script(seed000.cmd(), mode="plan")
    s = rec["args"]["sharding"]
    assert (s["where"], s["version"], s["sync_module_states"]) == \
        ("accelerate launch (ACCELERATE_USE_FSDP)", 1, True)
    f = map_record(rec).fields
    assert (f["sharding"], f["fsdp_version"], f["fsdp_init"]) == ("fsdp", "1", "wrap-sync")


def test_the_read_table_says_the_scripts_engine_beside_the_one_given():
    """The 'data parallel' row: the engine planned and where from; with --sharding given, the
    script's own beside it (a check: an FSDP script read "the script: none")."""
    from trainfit.render.script import _read_rows

    rec = record(args__sharding=_fsdp())
    read = map_record(rec)
    rows = {name: (value, where) for name, value, where in _read_rows(read, rec, read.fields)}
    assert rows["data parallel"] == ("fsdp", "TrainingArguments(fsdp=...)")
    given = map_record(rec, frozenset({"sharding"}), sharding_flag="none")
    f = {**given.fields, "sharding": "none"}
    rows = {name: (value, where) for name, value, where in
            _read_rows(given, rec, f, frozenset({"sharding"}))}
    assert rows["data parallel"] == ("none", "the command line (the script: fsdp)")
    zero = record(args__sharding=_zero(stage=2))
    given = map_record(zero, frozenset({"sharding"}), sharding_flag="fsdp")
    rows = {name: (value, where) for name, value, where in
            _read_rows(given, zero, {**given.fields, "sharding": "fsdp"}, frozenset({"sharding"}))}
    assert rows["data parallel"][1] == "the command line (the script: DeepSpeed ZeRO-2)"
