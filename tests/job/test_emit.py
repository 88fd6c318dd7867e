"""``trainfit emit`` / ``tune FILE --emit``: the payload alone on stdout, accepted as it is by the
real TrainingArguments, trl's SFTConfig and accelerate's config loader; exactly the file's knobs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.job import JobSpec
from trainfit.job.emit import emit
from trainfit.job.script_settings import checkpointing_name, script_settings
from trainfit.job.tuned_file import job_yaml

runner = CliRunner()


def _tuned_file(tmp_path: Path, device: str = "cpu", **fields) -> Path:
    """A job file as tune writes it (knobs, device, memory limit, measured)."""
    base = dict(model="llama-tiny-58m", seq_len=64, micro_batch=2, grad_accum=4, precision="fp32",
                grad_ckpt="off", packing=True, data="examples/data/tiny_text.jsonl")
    job = JobSpec.from_dict({**base, **fields})
    p = tmp_path / "tuned.yaml"
    p.write_text(job_yaml(job, device=device, memory_limit_bytes=1_288_490_188,
                          measured={"peak_allocated_bytes": 900_000_000, "tokens_per_s": 184.0,
                                    "samples_per_s": 2.9}))
    return p


def _emit(path: Path, to: str, *extra: str) -> tuple[str, str]:
    res = runner.invoke(app, ["emit", str(path), "--to", to, *extra])
    assert res.exit_code == 0, res.output
    return res.stdout, res.stderr


def _strict(build):
    """Build with every warning raised: a deprecated name must not be emitted."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        return build()


@pytest.mark.parametrize("fields", [
    {},
    {"precision": "amp-bf16", "grad_ckpt": "full", "micro_batch": 1, "grad_accum": 8},
    {"optimizer_impl": "foreach", "num_workers": 2, "packing": False},
    {"grad_ckpt": "full", "ckpt_reentrant": True},
])
def test_hf_payload_builds_training_arguments_on_cpu(tmp_path, fields):
    from transformers import TrainingArguments

    out, err = _emit(_tuned_file(tmp_path, **fields), "hf")
    kw = json.loads(out)  # stdout is the payload alone
    args = _strict(lambda: TrainingArguments(output_dir=str(tmp_path / "o"), **kw))
    job = JobSpec.from_dict({"micro_batch": 2, "grad_accum": 4, "precision": "fp32",
                             "grad_ckpt": "off", **fields})
    assert args.use_cpu is True
    assert args.per_device_train_batch_size == job.micro_batch
    assert args.gradient_accumulation_steps == job.grad_accum
    assert args.bf16 is (job.precision == "amp-bf16") and args.fp16 is False
    assert args.activation_checkpointing is (job.grad_ckpt == "full")
    if job.grad_ckpt == "full":
        assert args.activation_checkpointing_kwargs == {"use_reentrant": job.ckpt_reentrant}
    assert args.dataloader_num_workers == job.num_workers
    assert args.optim.value == ("adamw_torch_fused" if job.optimizer_impl == "fused"
                                else "adamw_torch")
    assert "memory limit 1.20 GiB" in err and "no probe run" in err


@pytest.mark.parametrize("packing", [True, False])
def test_trl_payload_builds_sft_config_with_the_measured_packing(tmp_path, packing):
    from trl import SFTConfig

    out, _ = _emit(_tuned_file(tmp_path, packing=packing, grad_ckpt="full", micro_batch=1,
                               grad_accum=8), "trl")
    cfg = _strict(lambda: SFTConfig(output_dir=str(tmp_path / "o"), **json.loads(out)))
    assert cfg.packing is packing
    assert cfg.max_length == 64
    if packing:  # trainfit cuts full seq_len sequences across documents: TRL's "wrapped"
        assert cfg.packing_strategy == "wrapped"
    assert cfg.activation_checkpointing is True and cfg.use_cpu is True
    assert cfg.bf16 is False  # SFTConfig defaults bf16 to True: the fp32 job must say False


def test_trl_off_checkpointing_overrides_trl_default(tmp_path):
    """TRL defaults checkpointing on: the emitted False must win."""
    from trl import SFTConfig

    out, _ = _emit(_tuned_file(tmp_path), "trl")
    cfg = _strict(lambda: SFTConfig(output_dir=str(tmp_path / "o"), **json.loads(out)))
    assert cfg.activation_checkpointing is False and cfg.gradient_checkpointing is False


@pytest.mark.parametrize("device,ranks,sharding,want", [
    ("cpu", 1, "none", ("NO", True, 1)),
    ("cpu", 2, "none", ("MULTI_CPU", True, 2)),
    ("cuda", 1, "none", ("NO", False, 1)),
    ("cuda", 2, "none", ("MULTI_GPU", False, 2)),
    ("cuda", 4, "fsdp", ("FSDP", False, 4)),
])
def test_accelerate_config_loads_and_matches_the_job(tmp_path, device, ranks, sharding, want):
    from accelerate.commands.config.config_args import load_config_from_file

    f = _tuned_file(tmp_path, device=device, ranks=ranks, sharding=sharding, grad_accum=None,
                    effective_batch=2 * ranks * 2, precision="amp-bf16")
    out, _ = _emit(f, "accelerate")
    cfg_file = tmp_path / "accel.yaml"
    cfg_file.write_text(out)
    cfg = load_config_from_file(str(cfg_file))
    assert (cfg.distributed_type.value, cfg.use_cpu, cfg.num_processes) == want
    assert cfg.mixed_precision == "bf16"


def test_accelerate_fsdp_on_a_cpu_is_refused(tmp_path):
    """An audit: sharding fsdp emitted for a CPU gave a MULTI_CPU config, plain DDP, unsaid."""
    f = _tuned_file(tmp_path, device="cpu", ranks=2, sharding="fsdp", grad_accum=None,
                    effective_batch=8, precision="amp-bf16")
    res = runner.invoke(app, ["emit", str(f), "--to", "accelerate"])
    assert res.exit_code == 2
    assert "error: sharding: fsdp on a CPU: accelerate's FSDP runs on GPUs" in res.output
    assert "--device cuda" in res.output


def test_accelerate_fsdp_cannot_say_reentrant(tmp_path):
    """accelerate's fsdp_activation_checkpointing is non-reentrant: a reentrant job is refused."""
    f = _tuned_file(tmp_path, device="cuda", ranks=2, sharding="fsdp", grad_accum=None,
                    effective_batch=8, grad_ckpt="full", ckpt_reentrant=True)
    res = runner.invoke(app, ["emit", str(f), "--to", "accelerate"])
    assert res.exit_code == 2
    assert "checkpoints non-reentrantly" in res.output and "use_reentrant" in res.output


def test_emit_reads_the_file_without_probing(tmp_path, monkeypatch):
    """tune FILE --emit on a tuned file emits its knobs: the tuner is never called."""
    import trainfit.tune.tuner as tuner

    def no_search(*a, **k):
        raise AssertionError("tune searched again")
    monkeypatch.setattr(tuner, "tune", no_search)
    f = _tuned_file(tmp_path, micro_batch=4, grad_accum=1)
    res = runner.invoke(app, ["tune", str(f), "--emit", "hf"])
    assert res.exit_code == 0, res.output
    kw = json.loads(res.stdout)
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"]) == (4, 1)
    assert kw["use_cpu"] is True and kw["bf16"] is False


def test_the_payload_leaves_the_scripts_recipe_and_the_librarys_defaults_alone(tmp_path):
    """A hand-written file's payload carried trainfit's learning rate (1e-4) and seed (0), which
    replaced TrainingArguments' own (5e-5, 42) unseen, and a script passing learning_rate= too
    raised a TypeError; and pin_memory false, which the file never set (a QA run).  Now: no
    learning rate or seed, said on stderr; pin_memory only where the file states it (a tuned file
    does: tune chose it)."""
    from transformers import TrainingArguments

    p = tmp_path / "knobs.yaml"
    p.write_text(yaml.safe_dump({"model": "llama-tiny-58m", "method": "lora", "seq_len": 64,
                                 "micro_batch": 4, "grad_accum": 2, "precision": "amp-bf16",
                                 "grad_ckpt": "full", "optimizer": "adamw"}))
    out, err = _emit(p, "hf", "--device", "cpu")
    kw = json.loads(out)
    assert not {"learning_rate", "seed", "dataloader_pin_memory"} & set(kw)
    args = _strict(lambda: TrainingArguments(output_dir=str(tmp_path / "o"), learning_rate=2e-4,
                                             **kw))
    assert (args.learning_rate, args.seed) == (2e-4, 42)
    assert "learning rate, seed and weight decay: your script's" in err and " — " not in err
    p2 = tmp_path / "with_lr.yaml"  # a file that states them: named, never set
    p2.write_text(p.read_text() + "lr: 0.0002\nweight_decay: 0.01\n")
    out2, err2 = _emit(p2, "hf", "--device", "cpu")
    assert not {"learning_rate", "weight_decay"} & set(json.loads(out2))
    assert f"lr 0.0002 in {p2}: set learning_rate= in your script if you want it" in err2
    assert "weight_decay 0.01 in" in err2 and "set weight_decay= in your script" in err2
    assert "pin_memory: not stated in" in err
    stated, _ = _emit(_tuned_file(tmp_path, pin_memory=True), "hf")
    assert json.loads(stated)["dataloader_pin_memory"] is True
    p.write_text(p.read_text() + "pin-memory: false\n")  # a hyphenated key is stated too
    out, err = _emit(p, "hf", "--device", "cpu")
    assert json.loads(out)["dataloader_pin_memory"] is False and "not stated" not in err


def test_emit_untuned_file_is_a_clear_error(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump({"model": "llama-tiny-58m", "effective_batch": 8}))
    res = runner.invoke(app, ["emit", str(p), "--to", "hf"])
    assert res.exit_code == 2
    assert "nothing tuned to emit" in res.stderr and res.stdout == ""


def test_emit_unknown_target(tmp_path):
    res = runner.invoke(app, ["emit", str(_tuned_file(tmp_path)), "--to", "deepspeed"])
    assert res.exit_code == 2 and "use hf, trl or accelerate" in res.stderr


def test_script_settings_name_what_the_payload_cannot_carry():
    job = JobSpec(model="gemma-2b", method="qlora", quant="nf4-dq", micro_batch=2, grad_accum=4,
                  precision="bf16-true", grad_ckpt="off", attention="eager")
    e = emit(job, "hf", device="cuda")
    knobs = {s.knob for s in e.script}
    assert {"attention", "quant", "method", "precision"} <= knobs
    assert e.payload["bf16"] is False  # bf16-true loads bf16 weights; no autocast on top
    assert "use_cpu" not in e.payload
    assert "expandable_segments" not in knobs
    # an allocator setting no payload carries: every target names it, in the environment
    for target in ("hf", "trl", "accelerate"):
        got = {s.knob: s for s in emit(job.replace(expandable_segments=True), target,
                                       device="cuda").script}
        assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in got["expandable_segments"].where


def test_checkpointing_name_follows_the_transformers_version():
    assert checkpointing_name("5.23.0") == "activation_checkpointing"
    assert checkpointing_name("4.57.1") == "gradient_checkpointing"
    assert checkpointing_name(None) == "activation_checkpointing"
    # the accelerate script's checkpointing call has the same version's name
    job = JobSpec(model="gemma-2b", micro_batch=2, grad_accum=4, grad_ckpt="full",
                  precision="amp-bf16")
    for version, name in (("5.23.0", "activation_checkpointing"),
                          ("4.57.1", "gradient_checkpointing")):
        got = {s.knob: s.where for s in script_settings(job, "accelerate", version)}
        assert got["grad_ckpt"] == (f'model.{name}_enable({name}_kwargs='
                                    '{"use_reentrant": False})')


def test_activation_offload_is_sftconfigs_own_field_and_a_script_setting_for_hf(tmp_path):
    from trl import SFTConfig

    job = JobSpec(model="gpt2", method="lora", micro_batch=2, grad_accum=2,
                  precision="bf16-true", grad_ckpt="full", activation_offload=True)
    trl = emit(job, "trl", device="cuda")
    cfg = _strict(lambda: SFTConfig(output_dir=str(tmp_path / "o"), use_cpu=True,
                                    **{k: v for k, v in trl.payload.items() if k != "bf16"}))
    assert cfg.activation_offloading is True
    assert "activation_offload" not in {s.knob for s in trl.script}
    hf = emit(job, "hf", device="cuda")
    assert "activation_offloading" not in hf.payload  # TrainingArguments has no such field
    assert "activation_offload" in {s.knob for s in hf.script}


def test_emit_a_tuned_module_factory_job(tmp_path):
    """tune's file for a ``module:factory`` model: emit prints its knobs (it never imports the
    model), where it asked for an --allow-code it does not have."""
    p = _tuned_file(tmp_path, model="examples/custom/tiny_gpt.py:build_model", micro_batch=4,
                    grad_accum=2)
    out, _ = _emit(p, "hf")
    kw = json.loads(out)
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"]) == (4, 2)


def test_what_the_payloads_cannot_carry_is_said_not_dropped():
    """QA: a ZeRO-3 + optimizer-offload job came out as plain DDP with nothing said, and the
    peft line read target_modules=['default'], which peft rejects."""
    job = JobSpec(model="gpt2", method="lora", micro_batch=2, grad_accum=2, precision="amp-bf16",
                  grad_ckpt="full", ranks=8, sharding="zero3", offload="optimizer")
    for target in ("hf", "trl"):
        said = {s.knob: s.where for s in emit(job, target, device="cuda").script}
        assert "DeepSpeed ZeRO-3, optimizer states offloaded to CPU: not in this payload" in \
            said["sharding"], target
        assert "zero_stage: 3, offload_optimizer_device: cpu" in said["sharding"]
        assert "target_modules=None (peft's default" in said["method"]
    # accelerate's config carries DeepSpeed itself (an audit: it launched the job as plain DDP)
    acc = emit(job, "accelerate", device="cuda")
    assert acc.payload["distributed_type"] == "DEEPSPEED"
    assert acc.payload["deepspeed_config"] == {
        "zero_stage": 3, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
        "offload_optimizer_device": "cpu", "offload_param_device": "none",
        "zero3_init_flag": True, "zero3_save_16bit_model": True}
    # plan's "auto" buckets (hidden², HF's and accelerate's fill) take a DeepSpeed config file:
    # without one, accelerate's config runs DeepSpeed's own defaults (5e8 / 5e7 elements)
    auto = {s.knob: s.where for s in acc.script}["sharding"]
    assert "reduce_bucket_size: auto, stage3_prefetch_bucket_size: auto" in auto
    ds_defaults = job.replace(zero_reduce_bucket=500_000_000, zero_prefetch_bucket=50_000_000)
    assert "sharding" not in {s.knob for s in emit(ds_defaults, "accelerate",
                                                   device="cuda").script}
    said = {s.knob: s.where for s in emit(ds_defaults.replace(zero_pin_memory=False),
                                          "accelerate", device="cuda").script}
    assert "pin_memory: false" in said["sharding"]  # an unpinned offload needs DeepSpeed's file
    from accelerate.commands.config.config_args import ClusterConfig

    ClusterConfig(**acc.payload)  # accelerate reads it as it is
    fsdp = job.replace(sharding="fsdp", offload="all")
    assert emit(fsdp, "accelerate", device="cuda").payload["fsdp_config"]["fsdp_offload_params"]
    # transformers 5's fsdp=True + fsdp_config (a string of options is deprecated), with the
    # checkpointing in FSDP's config, not the top-level flag (a redundant all-gather)
    hf = emit(fsdp, "hf", device="cuda")
    assert hf.payload["fsdp"] is True and hf.payload["activation_checkpointing"] is False
    assert hf.payload["fsdp_config"] == {"version": 2, "reshard_after_forward": True,
                                         "cpu_offload": True, "activation_checkpointing": True}
    assert "sharding" not in {s.knob for s in hf.script}
    v1 = emit(fsdp.replace(fsdp_version="1", fsdp_init="wrap-sync", offload="none"), "accelerate",
              device="cuda").payload["fsdp_config"]
    assert v1["fsdp_version"] == 1 and v1["fsdp_sync_module_states"] is True
    assert v1["fsdp_cpu_ram_efficient_loading"] is True
    assert "sharding" not in {s.knob for s in emit(job.replace(sharding="none", offload="none"),
                                                      "hf", device="cuda").script}
    lin = {s.knob: s.where for s in emit(job.replace(lora_targets=["all-linear"]), "hf").script}
    assert 'target_modules="all-linear"' in lin["method"]


@pytest.mark.parametrize("sharding, ranks, storage", [("none", 1, None), ("fsdp", 2, "bfloat16"),
                                                      ("zero3", 4, "bfloat16")])
def test_the_quant_setting_is_the_bitsandbytes_config_the_plan_simulated(sharding, ranks,
                                                                        storage):
    """Its keywords build transformers' BitsAndBytesConfig; sharded QLoRA stores the packed
    weights in bf16 (FSDP/ZeRO flatten them with the 16-bit parameters), as simulated."""
    import ast

    import torch
    from transformers import BitsAndBytesConfig

    job = JobSpec(model="gemma-2b", method="qlora", quant="nf4", micro_batch=2, grad_accum=4,
                  precision="amp-bf16", grad_ckpt="full", ranks=ranks, sharding=sharding)
    where = {s.knob: s for s in emit(job, "hf", device="cuda").script}["quant"].where
    loading = ast.parse(where, mode="eval").body
    assert isinstance(loading, ast.Call) and loading.func.id == "from_pretrained"
    args = {k.arg: k.value for k in loading.keywords}
    call = args["quantization_config"]
    assert isinstance(call, ast.Call) and call.func.id == "BitsAndBytesConfig"
    kw = {k.arg: (getattr(torch, k.value.attr) if isinstance(k.value, ast.Attribute)
                  else ast.literal_eval(k.value)) for k in call.keywords}
    # sharded: loaded in the storage dtype, as HF pairs them (FSDP/ZeRO flatten one dtype)
    assert (args["dtype"].attr if "dtype" in args else None) == storage
    cfg = BitsAndBytesConfig(**kw)
    assert cfg.load_in_4bit and cfg.bnb_4bit_quant_type == "nf4"
    assert cfg.bnb_4bit_compute_dtype == torch.bfloat16
    assert cfg.bnb_4bit_quant_storage == (getattr(torch, storage) if storage else torch.uint8)


def test_a_file_edited_after_tune_does_not_show_its_old_measurements_as_its_own(tmp_path):
    """An audit: emit printed the measured block (peak, tokens/s) as the file's after its knobs
    were edited. The numbers now carry the knobs they were measured at, and an edited file says
    which knob changed instead of showing them."""
    f = _tuned_file(tmp_path)
    _, err = _emit(f, "hf")
    assert "peak allocated 0.84 GiB (measured)" in err and "184 tokens/s (measured)" in err
    f.write_text(f.read_text().replace("micro_batch: 2", "micro_batch: 8", 1)
                 .replace("grad_accum: 4", "grad_accum: 1", 1))
    out, err = _emit(f, "hf")
    assert json.loads(out)["per_device_train_batch_size"] == 8
    assert "(measured)" not in err
    assert ("its measured numbers are not this configuration's: micro_batch 8 in the file, "
            "measured at 2, grad_accum 1 in the file, measured at 4") in err
    # any field the numbers depend on, not only tune's knobs (a review: the LoRA rank or the
    # model changed went unnoticed); the learning rate does not count
    f = _tuned_file(tmp_path, method="lora", lora_r=16)
    f.write_text(f.read_text().replace("lr: 0.0001", "lr: 0.0003", 1))
    _, err = _emit(f, "hf")
    assert "(measured)" in err
    f.write_text(f.read_text().replace("lora_r: 16", "lora_r: 256", 1))
    _, err = _emit(f, "hf")
    assert "lora_r 256 in the file, measured at 16" in err and "(measured)" not in err
    # a fused SGD, which HF's optim="sgd" cannot say, is a line for the script (a review)
    sgd = {s.knob: s.where for s in emit(JobSpec(model="gpt2", micro_batch=2, grad_accum=1,
                                                 optimizer="sgd", precision="fp32",
                                                 grad_ckpt="off"), "hf", device="cuda").script}
    assert "momentum=0.9, fused=True" in sgd["optimizer"]
    # the one-tensor loop is foreach=False: torch's default picks foreach on CUDA (an audit)
    loop = {s.knob: s.where for s in emit(JobSpec(model="gpt2", micro_batch=2, grad_accum=1,
                                                  optimizer="sgd", precision="fp32",
                                                  optimizer_impl="forloop", grad_ckpt="off"),
                                          "hf", device="cuda").script}
    assert "momentum=0.9, foreach=False)" in loop["optimizer"]


def test_every_line_of_a_tuned_file_says_what_it_is(tmp_path):
    """An audit found 40 job fields bare in the YAML tune writes: each line now carries a comment
    (the knob's effect, else its field's own docstring; a measured number its unit), and the file
    reads back to the same job."""
    from trainfit.job import read_job_file
    from trainfit.job.files import file_memory_limit

    f = _tuned_file(tmp_path)
    lines = [ln for ln in f.read_text().splitlines() if ln and not ln.startswith("#")]
    assert all("  # " in ln for ln in lines), [ln for ln in lines if "  # " not in ln]
    assert "  peak_allocated_bytes: 900000000  # bytes, measured" in lines
    assert "  samples_per_s: 2.9  # samples per second, measured" in lines  # a rate (a review)
    fields, extra = read_job_file(f)
    job = JobSpec.from_dict(fields)
    assert (job.micro_batch, job.grad_accum, job.precision, job.grad_ckpt, job.packing) == \
        (2, 4, "fp32", "off", True)
    assert extra["measured"]["tokens_per_s"] == 184.0
    # the limit carries its unit, exact to the byte (F6: a bare number said less than it held)
    assert "memory_limit: 1288490188B  # 1.20 GiB: the capacity the pick had to fit in " \
        "(GiB = 2^30 bytes)" in lines
    assert file_memory_limit(extra) == 1_288_490_188


def test_an_unsteady_tune_runs_speed_is_said_as_such(tmp_path):
    """tune wrote 34 tokens/s, measured, from a run whose probes lay 10.9× apart, and emit
    repeated it plainly (an audit): the file keeps the spread, and emit says it."""
    base = dict(model="llama-tiny-58m", seq_len=64, micro_batch=2, grad_accum=4,
                precision="fp32", grad_ckpt="off", packing=True,
                data="examples/data/tiny_text.jsonl")
    p = tmp_path / "tuned.yaml"
    p.write_text(job_yaml(JobSpec.from_dict(base), device="cpu", measured={
        "tokens_per_s": 33.5, "timing_spread": 10.9}))
    assert "timing_spread: 10.9  # fastest ÷ slowest probe" in p.read_text()
    _, err = _emit(p, "hf")
    assert "34 tokens/s (measured; an unsteady run: one configuration's probes lay 10.9× apart)" \
        in err


def test_selective_checkpointing_forloop_adamw_and_idle_workers_are_not_dropped():
    """An audit: grad_ckpt selective came out as no checkpointing, optimizer_impl forloop as
    torch's default (foreach on CUDA), and persistent workers without workers as a payload the
    DataLoader refuses."""
    from transformers import TrainingArguments

    job = JobSpec(model="gpt2", micro_batch=2, grad_accum=2, precision="amp-bf16",
                  grad_ckpt="selective", optimizer_impl="forloop", persistent_workers=True)
    e = emit(job, "hf", device="cpu")
    said = {s.knob: s.where for s in e.script}
    assert "selective_context_fn" in said["grad_ckpt"]
    assert "foreach=False" in said["optimizer_impl"]
    assert e.payload["dataloader_persistent_workers"] is False
    TrainingArguments(output_dir="/tmp/unused", **e.payload)
    assert "grad_ckpt" in {s.knob for s in emit(job, "accelerate", device="cpu").script}


def test_accelerate_says_the_loop_settings_and_carries_compile():
    """An audit: compile, the optimizer, clipping and the loader went unsaid for accelerate;
    the LoRA example named MLP modules for a q,v job; the eval batch was the library's 8."""
    from accelerate.commands.config.config_args import ClusterConfig

    job = JobSpec(model="gpt2", method="lora", lora_targets="q,v", micro_batch=2, grad_accum=2,
                  precision="amp-bf16", grad_ckpt="off", compile=True, optimizer="adamw-8bit",
                  num_workers=2, max_grad_norm=1.0)
    acc = emit(job, "accelerate", device="cuda")
    assert acc.payload["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}
    ClusterConfig(**acc.payload)
    said = {s.knob: s.where for s in acc.script}
    assert said["optimizer"].startswith("bitsandbytes.optim.AdamW8bit(")
    assert "clip_grad_norm_(model.parameters(), 1.0)" in said["max_grad_norm"]
    assert "num_workers=2" in said["grad_accum"] and "prefetch_factor=" in said["grad_accum"]
    assert "e.g. q_proj, v_proj for Llama" in said["method"]
    assert emit(job, "hf", device="cuda").payload["per_device_eval_batch_size"] == 2


def test_the_accelerate_config_says_each_knobs_effect_and_reads_back_unchanged():
    """An audit: the accelerate YAML was bare yaml.safe_dump, where tune's file comments each
    knob. Every key the job sets carries its effect as a YAML comment; the file loads back as
    the payload."""
    from trainfit.job.emit import ACCELERATE_COMMENTS, emit

    for sharding in ("zero3", "fsdp", "none"):
        job = JobSpec(model="llama-tiny-58m", seq_len=64, micro_batch=2, grad_accum=2,
                      effective_batch=8, ranks=2, sharding=sharding, precision="amp-bf16",
                      grad_ckpt="full")
        e = emit(job, "accelerate", device="cuda")
        text = e.text()
        assert yaml.safe_load(text) == e.payload
        nested = {k for v in e.payload.values() if isinstance(v, dict) for k in v}
        for key in (set(e.payload) | nested) & set(ACCELERATE_COMMENTS):
            (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:")]
            assert line.endswith(f"# {ACCELERATE_COMMENTS[key]}"), line
        assert "# 2 shards optimizer states" in text if sharding == "zero3" else True


def test_emit_names_a_files_bad_value_by_its_key(tmp_path):
    """An audit: emit said "--micro-batch 0" of a file's micro_batch: 0 (emit has no such flag),
    and "drop one of the three flags" of three keys."""
    p = tmp_path / "z.yaml"
    p.write_text("model: llama-tiny-58m\nseq_len: 64\nmicro_batch: 0\neffective_batch: 8\n")
    res = runner.invoke(app, ["emit", str(p), "--to", "hf"])
    assert res.exit_code == 2 and "error: micro_batch: 0: must be an integer" in res.stderr
    assert "--micro-batch" not in res.stderr
    p.write_text("model: llama-tiny-58m\nseq_len: 64\nmicro_batch: 2\ngrad_accum: 3\n"
                 "effective_batch: 8\n")
    res = runner.invoke(app, ["emit", str(p), "--to", "hf"])
    assert res.exit_code == 2 and "error: effective_batch: 8 ≠ micro-batch 2" in res.stderr
    assert "flags" not in res.stderr and "drop one of the three" in res.stderr


def test_commented_yaml_reads_back_long_and_multi_line_values():
    """A review: a value longer than the dump's width, or over several lines, took the comment
    inside it (the YAML then failed to parse, or read back changed)."""
    from trainfit.job.emit import commented_yaml

    for payload in ({"gpu_ids": "a" * 100 + " " + "b" * 50, "num_processes": 2},
                    {"gpu_ids": "line1\nline2", "use_cpu": False},
                    {"deepspeed_config": {"zero_stage": 3, "gradient_clipping": 1.0},
                     "mixed_precision": "bf16"}):
        text = commented_yaml(payload)
        assert yaml.safe_load(text) == payload, text
    assert "# 2 shards" in commented_yaml({"deepspeed_config": {"zero_stage": 3}})
