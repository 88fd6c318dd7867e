"""``trainfit plan -- python train.py``: the three seed-like scripts read without weights, the plan
read from each equal to ``trainfit plan`` of the equivalent job file (peaks to the byte), the
printed diff applied to the script giving the pick's configuration, and the refusals."""

from __future__ import annotations

import json
import sys

import pytest
from plan_json import PEAKS, job_file, peak_rows, plan_json
from script_seeds import chat_rows, pair_rows, text_rows
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.script.launch import ScriptError, run_script
from trainfit.script.mapping import map_record


def _applied(read_cmd: list[str], changes: list[dict]) -> list[str]:
    """The script's command with the printed TrainingArguments/SFTConfig changes applied (the
    scripts take them as --args-json, as a user edits the call)."""
    kw = {c["keyword"]: c["after"] for c in changes if c["where"] in (
        "TrainingArguments", "SFTConfig", "Seq2SeqTrainingArguments")}
    assert len(kw) == len(changes), changes  # every change is an argument of the trainer here
    return [*read_cmd, "--args-json", json.dumps(kw)]


def test_seed000_trainer_lora_read(seed000):
    # an output_dir two levels below anything that exists (an audit: its parents were left)
    seed000.out = seed000.script.parent / "nest" / "a" / "out"
    rec = run_script(seed000.cmd(), mode="plan", gpu={"name": "A10G", "free_bytes": 20 * 2**30})
    # the output_dir its Trainer made (should_save) is removed, empty, with the parents it
    # made: nothing left on disk
    assert not seed000.out.exists() and not (seed000.script.parent / "nest").exists()
    read = map_record(rec)
    f = read.fields
    assert rec["trainer"] == "Trainer" and rec["model"]["device"] == "meta"  # no weights loaded
    assert rec["model"]["class"] == "GemmaForCausalLM" and f["model"] == str(seed000.model)
    assert (f["method"], f["lora_r"], f["lora_alpha"], f["lora_dropout"], f["lora_targets"]) == \
        ("lora", 8, 16, 0.05, ["q_proj", "v_proj"])
    assert len(rec["lora"]["adapted"]) == 4  # 2 layers × q, v
    # bf16 base + fp32 adapters + bf16=True is trainfit's amp-bf16
    assert (rec["model"]["frozen_dtype"], rec["model"]["trainable_dtype"]) == ("bfloat16", "float32")
    assert (f["precision"], f["optimizer"], f["optimizer_impl"]) == ("amp-bf16", "adamw", "fused")
    assert (f["micro_batch"], f["grad_accum"], f["grad_ckpt"], f["attention"]) == (2, 4, "full", "sdpa")
    # the real lengths: one token per character, truncated at the script's max_length=96
    longest = min(96, max(len(r["text"]) for r in text_rows()))
    ln = read.lengths
    assert ln.longest == longest == ln.sample_max == ln.batch_max_length and f["seq_len"] == longest
    assert ln.samples_read == ln.dataset_samples == 48 and ln.all_samples_read
    assert ln.batches_read == 24 and ln.sample_min == min(len(r["text"]) for r in text_rows())
    assert ln.padded and ln.batch_quantile_length <= longest


def test_seed000_plan_equals_job_file_and_the_diff_gives_the_pick(seed000, tmp_path):
    flags = ["--gpu", "a10g", "--precision", "amp-bf16"]
    got = plan_json([*flags, "--", *seed000.cmd()])
    longest = min(96, max(len(r["text"]) for r in text_rows()))
    job = job_file(tmp_path, {
        "model": str(seed000.model), "method": "lora", "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_targets": ["q_proj", "v_proj"], "seq_len": longest,
        "base_dtype": "bf16",  # the script loads from_pretrained(dtype=torch.bfloat16)
        "effective_batch": 8, "optimizer": "adamw", "optimizer_impl": "fused", "attention": "sdpa",
        "padded": got["job"]["padded"]},  # the collator pads: the plan carries the mask
        {"micro_batch": 2, "grad_accum": 4, "grad_ckpt": "full"})
    want = plan_json([job, *flags])
    assert peak_rows(got["plan"]) == peak_rows(want)  # every configuration, every peak, to the byte
    assert [got["plan"]["current"][k] for k in PEAKS] == [want["current"][k] for k in PEAKS]
    assert got["model_check"]["equal"], got["model_check"]
    # transformers and accelerate ask torch.cuda.is_available() themselves: not the script's ask
    assert got["read"]["cuda_asked"] == []
    pick = next(c for c in got["plan"]["configs"] if c["recommended"])
    assert pick["micro_batch"] * pick["grad_accum"] == 8  # the effective batch kept
    changes = got["changes"]
    assert {c["keyword"] for c in changes} >= {"per_device_train_batch_size",
                                               "gradient_accumulation_steps"}
    again = map_record(run_script(_applied(seed000.cmd(), changes), mode="plan")).fields
    assert (again["micro_batch"], again["grad_accum"], again["grad_ckpt"], again["precision"]) == \
        (pick["micro_batch"], pick["grad_accum"], pick["grad_ckpt"], pick["precision"])


def test_seed000_on_gemma3_plans_the_tower_as_the_job_file_does(seed000_gemma3, tmp_path):
    """Seed 000's script on a Gemma-3 4B-shaped checkpoint: AutoModelForCausalLM builds
    Gemma3ForConditionalGeneration (a causal LM with a vision tower), the script's model and
    trainfit's are the same (LoRA on the tower's q/v too, as peft matches them), and the plan
    equals that of the job file naming the model directory, to the byte."""
    seed = seed000_gemma3
    flags = ["--gpu", "a10g", "--precision", "amp-bf16"]
    got = plan_json([*flags, "--", *seed.cmd()])
    assert got["model_check"]["equal"], got["model_check"]
    longest = min(96, max(len(r["text"]) for r in text_rows()))
    job = job_file(tmp_path, {
        "model": str(seed.model), "method": "lora", "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_targets": ["q_proj", "v_proj"], "seq_len": longest,
        "base_dtype": "bf16", "effective_batch": 8, "optimizer": "adamw",
        "optimizer_impl": "fused", "attention": "sdpa", "padded": got["job"]["padded"]},
        {"micro_batch": 2, "grad_accum": 4, "grad_ckpt": "full"})
    want = plan_json([job, *flags])
    assert peak_rows(got["plan"]) == peak_rows(want)
    assert "its vision tower" in want["model_note"] and "not run" in want["model_note"]
    rec = run_script(seed.cmd(), mode="plan")
    assert rec["model"]["class"] == "Gemma3ForConditionalGeneration"
    assert map_record(rec).fields["model"] == str(seed.model)
    assert len(rec["lora"]["adapted"]) == 8  # q, v of 2 text layers and of 2 tower layers


def test_seed000_qlora_after_prepare_model_for_kbit_training(seed000):
    """seed 000's own recipe: a 4-bit base, prepare_model_for_kbit_training(use_gradient_
    checkpointing=True) — the unquantized weights in float32, checkpointing on before the
    Trainer."""
    from trainfit.job import JobSpec
    from trainfit.script.diff import keyword_diff
    from trainfit.script.plan import model_check, script_source

    rec = run_script(seed000.cmd("--qlora", "--args-json", '{"gradient_checkpointing": false}'),
                     mode="plan")
    read = map_record(rec)
    f = read.fields
    assert (f["method"], f["quant"], f["kbit_prepared"], f["grad_ckpt"]) == ("qlora", "nf4", True, "full")
    assert read.where["grad_ckpt"] == "the model, before the trainer (fine_tune_gemma.py:29)"
    source, name = script_source(rec, False)
    job = JobSpec.from_dict({**f, "model": name})
    check = model_check(rec, job, source)
    assert check.equal, check  # the float32 embeddings and norms counted as the script holds them
    without = model_check(rec, job.replace(kbit_prepared=False), source)
    assert without.planned_frozen_bytes * 2 == check.script_frozen_bytes  # bf16 instead of fp32
    change = keyword_diff(rec, job, job.replace(grad_ckpt="off", micro_batch=8, grad_accum=1))
    assert (change[-1].where, change[-1].after) == (
        "the call that enables it before the trainer (fine_tune_gemma.py:29)", False)


def test_seed001_sft_qlora_read_and_plan_equals_job_file(seed001, tmp_path):
    flags = ["--gpu", "rtx-3060", "--precision", "bf16-true", "--grad-ckpt", "full"]
    got = plan_json([*flags, "--", *seed001.cmd()])
    rec = got["read"]
    f = got["job"]
    assert rec["trainer"] == "SFTTrainer" and rec["model"]["loaded_in_4bit"]
    # trl 1.16's SFTTrainer computes its loss through add_fused_lm_head's tiles, not the logits
    assert rec["model"]["loss_head"] == "trl-logprob" and f["trl_logprob_head"] is True
    assert (f["method"], f["quant"], f["lora_r"], f["lora_targets"]) == \
        ("qlora", "nf4-dq", 8, ["k_proj", "o_proj", "q_proj", "v_proj"])
    # device_map="auto" placed by transformers on the planned card: nothing offloaded
    assert rec["device_maps"] == [{"asked": "auto", "checked": True, "gpu": "NVIDIA GeForce RTX 3060",
                                   "offloaded": [], "max_memory": None}]
    assert (f["micro_batch"], f["grad_accum"], f["grad_ckpt"], f["pin_memory"], f["packing"]) == \
        (1, 8, "full", False, False)
    assert f["seq_len"] == 128 == got["lengths"]["longest"]  # SFTConfig(max_length=128) cut them
    assert got["lengths"]["samples_read"] == len(chat_rows())
    job = job_file(tmp_path, {
        "model": str(seed001.model), "method": "qlora", "quant": "nf4-dq", "lora_r": 8,
        "lora_alpha": 16, "lora_dropout": 0.05, "lora_targets": ["k_proj", "o_proj", "q_proj", "v_proj"],
        "seq_len": 128, "effective_batch": 8, "trl_logprob_head": True},
        {"micro_batch": 1, "grad_accum": 8, "grad_ckpt": "full"})
    want = plan_json([job, *flags])
    assert peak_rows(got["plan"]) == peak_rows(want)
    assert got["model_check"]["equal"], got["model_check"]
    pick = next(c for c in got["plan"]["configs"] if c["recommended"])
    again = map_record(run_script(_applied(seed001.cmd(), got["changes"]), mode="plan")).fields
    assert (again["micro_batch"], again["grad_accum"], again["grad_ckpt"]) == \
        (pick["micro_batch"], pick["grad_accum"], pick["grad_ckpt"])


def test_seed002_t5_seq2seq_read_and_plan_equals_job_file(seed002, tmp_path):
    flags = ["--gpu", "rtx-3080-20gb", "--precision", "fp32", "--grad-ckpt", "off"]
    got = plan_json([*flags, "--", *seed002.cmd()])
    f, ln = got["job"], got["lengths"]
    assert got["read"]["trainer"] == "Seq2SeqTrainer" and got["read"]["model"]["task"] == "seq2seq-lm"
    assert (f["method"], f["precision"], f["micro_batch"], f["grad_accum"], f["grad_ckpt"]) == \
        ("full", "fp32", 4, 2, "off")
    rows = pair_rows()
    assert ln["sample_max"] == min(64, max(len(r["prompt"]) for r in rows))
    assert ln["label_max"] == max(len(r["response"]) for r in rows)
    assert f["seq_len"] == ln["sample_max"]  # encoder and decoder planned at the longer
    assert any("targets up to" in n for n in got["notes"])
    assert f["padded"] in ("longest", "always")  # the seq2seq collator pads
    job = job_file(tmp_path, {"model": str(seed002.model), "seq_len": f["seq_len"],
                               "effective_batch": 8, "padded": f["padded"]},
                   {"micro_batch": 4, "grad_accum": 2})
    want = plan_json([job, *flags])
    assert peak_rows(got["plan"]) == peak_rows(want)
    pick = next(c for c in got["plan"]["configs"] if c["recommended"])
    again = map_record(run_script(_applied(seed002.cmd(), got["changes"]), mode="plan")).fields
    assert (again["micro_batch"], again["grad_accum"], again["grad_ckpt"]) == \
        (pick["micro_batch"], pick["grad_accum"], pick["grad_ckpt"])


def _refused(args: list[str]) -> list[str]:
    res = CliRunner().invoke(app, ["plan", *args])
    assert res.exit_code == 2, res.output
    return [ln for ln in res.output.splitlines() if ln.startswith(("error:", "hint:"))]


def test_offloading_device_map_is_refused_with_the_modules_named(seed001):
    lines = _refused(["--gpu", "rtx-3060", "--", *seed001.cmd("--max-memory", "60000")])
    assert lines[0].startswith("error: device_map='auto' would put")
    assert "lm_head" in lines[0] and "capped by the script's max_memory" in lines[0]
    assert lines[1].startswith("hint: load with device_map={'': 0}")


def test_a_script_without_a_trainer_is_refused(tmp_path):
    (tmp_path / "loop.py").write_text(
        "import torch\nm = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "m(torch.ones(2)).sum().backward()\nopt.step()\n")
    (tmp_path / "nothing.py").write_text("print('no training here')\n")
    lines = _refused(["--gpu", "t4", "--", sys.executable, str(tmp_path / "loop.py")])
    assert lines[0].startswith("error: the script steps a SGD optimizer itself (at loop.py:5)")
    assert "--model path/to/model.py:factory" in lines[1] and "doctor" in lines[1]
    lines = _refused(["--gpu", "t4", "--", sys.executable, str(tmp_path / "nothing.py")])
    assert "without building a transformers Trainer or TRL SFTTrainer" in lines[0]
    assert "--model path/to/model.py:factory" in lines[1] and "trainfit doctor --" in lines[1]


def test_an_own_loop_over_a_pretrained_model_is_refused_as_one(tmp_path, tiny_models):
    """plan's model has no weights: the loop's first forward fails (``Tensor.item()`` on a meta
    tensor, in transformers' mask code) before its optimizer step could be seen. Refused as the
    loop it is, not blamed on the script (a QA run); a computation before the trainer trains
    (no optimizer of its own) is said as such."""
    head = ("import sys, torch\nfrom transformers import AutoModelForCausalLM\n"
            "m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n")
    (tmp_path / "loop.py").write_text(
        head + "opt = torch.optim.AdamW(m.parameters(), lr=1e-4)\n"
        "ids = torch.ones(2, 8, dtype=torch.long)\n"
        "print(m(input_ids=ids, labels=ids).loss.item())\nopt.step()\n")
    (tmp_path / "peek.py").write_text(
        head + "ids = torch.ones(2, 8, dtype=torch.long)\n"
        "print(m(input_ids=ids, labels=ids).loss.item())\n")
    model = str(tiny_models["llama"])
    lines = _refused(["--gpu", "t4", "--", sys.executable, str(tmp_path / "loop.py"), model])
    assert lines[0].startswith("error: the script computes with the model before its trainer "
                               "trains (at loop.py:6: ")
    assert "it had built an AdamW optimizer (at loop.py:4) and no transformers Trainer — a loop " \
        "of its own?" in lines[0]
    # the model it loaded, planned as a job (an audit: the hint offered a module:factory file)
    assert f"a loop of your own: trainfit plan {model} --micro-batch N --grad-accum K" in lines[1]
    assert "after trainer.train()" in lines[1]
    lines = _refused(["--gpu", "t4", "--", sys.executable, str(tmp_path / "peek.py"), model])
    assert lines[0].startswith("error: the script computes with the model before its trainer "
                               "trains (at peek.py:5: ")
    assert "optimizer" not in lines[0]
    # the script's own error (not a meta-tensor one) stays its own, traceback and all
    (tmp_path / "typo.py").write_text(head + "opt = torch.optim.AdamW(m.parameters())\n"
                                      "open('missing-data.jsonl')\n")
    res = CliRunner().invoke(app, ["plan", "--gpu", "t4", "--", sys.executable,
                                   str(tmp_path / "typo.py"), model])
    assert res.exit_code == 2 and "exited with code 1 before its trainer started" in res.output
    assert "FileNotFoundError" in res.output and "loop of its own" not in res.output


def test_remote_code_needs_trust_remote_code(tmp_path):
    d = tmp_path / "custom"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "tiny-custom", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig",
                                                  "AutoModelForCausalLM": "modeling_custom.Model"}}))
    marker = tmp_path / "ran"
    (d / "configuration_custom.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "train.py").write_text(
        "import sys\nfrom transformers import AutoModelForCausalLM\n"
        "AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)\n")
    lines = _refused(["--gpu", "t4", "--", sys.executable, str(tmp_path / "train.py"), str(d)])
    assert "needs its own Python code (configuration_custom.CustomConfig, from its directory)" \
        in lines[0]
    assert lines[1] == "hint: add --trust-remote-code to the trainfit command if you trust its authors"
    assert not marker.exists()  # its code never ran


def test_bf16_script_on_a_card_without_bf16_is_refused(seed000):
    lines = _refused(["--gpu", "t4", "--", *seed000.cmd()])
    assert lines[0].startswith("error: the script trains in bf16 (amp-bf16) but Tesla T4 has no "
                               "bf16 support")
    # the flag that plans it without editing the script comes first (a QA run)
    assert lines[1].startswith("hint: plan it in fp16 as is with --precision amp-fp16")
    assert not seed000.out.exists()
    seed000.out.mkdir()  # one the user made stays, empty or not
    _refused(["--gpu", "t4", "--", *seed000.cmd()])
    assert seed000.out.is_dir()


def test_script_errors_keep_the_last_lines(tmp_path):
    (tmp_path / "crash.py").write_text("import sys\nprint('loading', flush=True)\nsys.exit(3)\n")
    with pytest.raises(ScriptError) as err:
        run_script([sys.executable, str(tmp_path / "crash.py")], mode="plan")
    assert "exited with code 3" in str(err.value) and err.value.tail == ["loading"]


def test_options_that_do_not_apply_to_a_script_say_so(seed000):
    lines = _refused(["--gpu", "a10g", "--current", "--", *seed000.cmd()])
    assert lines[0] == "error: --current with a script: the script's configuration is the current one"
    res = CliRunner().invoke(app, ["tune", "--out", "x.yaml", "--", *seed000.cmd()])
    assert res.exit_code == 2 and "error: --out/--emit apply to a job" in res.output


@pytest.mark.parametrize("command", ["plan", "tune"])
@pytest.mark.parametrize("flags,said", [
    (["--micro-batch", "0"], "error: --micro-batch 0: must be an integer ≥ 1"),
    (["--grad-accum", "0"], "error: --grad-accum 0: must be an integer ≥ 1"),
    (["--micro-batch", "abc"], "error: --micro-batch 'abc': must be an integer"),
    (["--effective-batch", "0"], "error: --effective-batch 0: must be an integer ≥ 1"),
    (["--precision", "fp64"], "error: --precision 'fp64': must be one of"),
    (["--timeout-s", "-1"], "error: --timeout-s -1: must be a finite number of seconds > 0"),
    (["--timeout-s", "nan"], "error: --timeout-s nan: must be a finite number of seconds > 0"),
    (["--timeout-s", "inf"], "error: --timeout-s inf: must be a finite number of seconds > 0"),
])
def test_a_scripts_flags_are_checked_before_it_runs(tmp_path, command, flags, said):
    """An audit: with a script, --micro-batch 0 ran the script, then ended in a ZeroDivisionError
    traceback; --effective-batch 0 was taken as not given; --timeout-s -1 was said only after the
    script ran, nan not at all. Each is one error line now, and the script never starts."""
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    gpu = ["--gpu", "t4"] if command == "plan" else []
    res = CliRunner().invoke(app, [command, *gpu, *flags, "--", sys.executable, str(script)])
    assert res.exit_code == 2, res.output
    assert said in res.output and "Traceback" not in res.output
    assert not marker.exists()


def test_an_error_in_the_scripts_own_code_is_the_scripts_to_fix(tmp_path):
    """An audit: a Trainer subclass's compute_loss that raised while tune probed it was reported
    as 'reading its trainer failed in read … report this', with no file:line. The user's frame
    is named with the traceback; an error inside libraries alone stays trainfit's to report."""
    import json as json_mod

    from trainfit.script.hooks import _script_frame
    from trainfit.script.launch import _interpret

    user = tmp_path / "train.py"
    src = "def compute_loss():\n    raise ValueError('my loss blew up')\n"
    user.write_text(src)
    ns: dict = {}
    exec(compile(src, str(user), "exec"), ns)
    try:
        ns["compute_loss"]()
    except ValueError as e:
        frame = _script_frame(e)
    assert frame == f"{user}:2 in compute_loss"
    try:
        json_mod.loads("{")
    except ValueError as e:
        # as the hooks see it: raised inside library code called from trainfit's (not this test's)
        assert _script_frame(e.with_traceback(e.__traceback__.tb_next)) is None
    # the script's frame calls into trainfit, which raises: trainfit's failure (a review)
    src2 = "from trainfit.tune.trial import micro_options\ndef compute_loss():\n" \
        "    return micro_options(None, 1)\n"
    user2 = tmp_path / "train2.py"
    user2.write_text(src2)
    exec(compile(src2, str(user2), "exec"), ns)
    try:
        ns["compute_loss"]()
    except AttributeError as e:
        assert _script_frame(e.with_traceback(e.__traceback__.tb_next)) is None
    # the script's own error under a probe's tracker (a TorchDispatchMode: trainfit frames sit
    # below the script's for every op) is still the script's (a review)
    import torch

    from trainfit.memory.limit import LimitTracker

    src3 = "def compute_loss(a, b):\n    return a @ b\n"
    user3 = tmp_path / "train3.py"
    user3.write_text(src3)
    exec(compile(src3, str(user3), "exec"), ns)
    try:
        with LimitTracker(None):
            ns["compute_loss"](torch.ones(2, 3), torch.ones(2, 3))
    except RuntimeError as e:
        assert _script_frame(e.with_traceback(e.__traceback__.tb_next)) == \
            f"{user3}:2 in compute_loss"
    trace = "Traceback (most recent call last):\n  File ...\nValueError: my loss blew up"
    with pytest.raises(ScriptError) as err:
        _interpret(["python", "train.py"], [{"type": "error", "where": "tune", "error": trace,
                                             "script_frame": frame}], 0, False, 900.0, [])
    assert str(err.value) == (f"python train.py: the script's own code raised while tune probed "
                              f"its trainer, at {frame} (ValueError: my loss blew up)")
    assert err.value.hint.startswith("fix it there") and err.value.tail[-1].startswith("ValueError")
    with pytest.raises(ScriptError) as err:
        _interpret(["python", "train.py"], [{"type": "error", "where": "read", "error": trace,
                                             "script_frame": None}], 0, False, 900.0, [])
    assert "trainfit failed while its trainer was read" in str(err.value)
    assert err.value.hint.startswith("report this")


@pytest.mark.parametrize("flags", [["--knobs", "precision,compile"], ["--try-compile"],
                                   ["--knobs", "optimizer_8bit"]])
def test_knobs_a_script_cannot_take_are_refused_when_asked_for(tmp_path, flags):
    """An audit: tune -- script dropped --knobs compile (and precision on a LoRA script) without a
    word. Named knobs no probe can change on a script are refused before it runs; precision,
    which only reading the script can rule out, is said in a note when it is not probed."""
    from trainfit.render.tune_words import note_words
    from trainfit.tune.result import SearchNote

    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    res = CliRunner().invoke(app, ["tune", *flags, "--", sys.executable, str(script)])
    assert res.exit_code == 2, res.output
    assert "not probed on a script" in res.output and not marker.exists()
    words = note_words(SearchNote("script_precision", {"method": "lora", "dtype": "bfloat16"}))
    assert words.startswith("precision: not probed on this script — its lora trainer's weights "
                            "load in bfloat16")


def test_a_bf16_flag_on_a_card_without_it_is_the_flags_error(tmp_path):
    """An audit: --precision amp-bf16 on a T4 was blamed on the script ("the script trains in
    bf16 … set bf16=False in the script"), which had bf16=False; said of the flag, before the
    script runs."""
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    res = CliRunner().invoke(app, ["plan", "--gpu", "t4", "--precision", "amp-bf16", "--",
                                   sys.executable, str(script)])
    assert res.exit_code == 2
    assert "error: --precision amp-bf16: Tesla T4 has no bf16 support" in res.output
    assert not marker.exists()


def test_a_model_the_script_builds_itself_is_not_said_to_be_read_without_weights():
    """An audit: a from_config model (304M fp32 parameters built on the CPU by the script) was
    said to be read 'without weights (meta device)'; plan skips from_pretrained's loading only."""
    from trainfit.render.script import _weights_words

    assert _weights_words({"mode": "plan", "model": {"device": "meta"}}) == \
        "without weights (meta device)"
    assert _weights_words({"mode": "plan", "model": {"device": "cpu"}}).startswith(
        "with weights the script built itself on cpu")
    assert _weights_words({"mode": "tune", "model": {"device": "cpu"}}) == "with its weights"


def test_every_meta_tensor_error_is_read_as_computing_before_training():
    """An audit: a ``generate`` check before training failed with torch's device-mismatch
    message, which does not say "meta tensor", and was blamed on the script."""
    import torch

    from trainfit.script.hooks import _about_meta

    ids = torch.ones(1, 2, dtype=torch.long)
    weight = torch.nn.Embedding(4, 2, device="meta").weight
    for op in (lambda: torch.ones(4, 2)[ids] + weight[0],  # "device meta ... expected device cpu"
               lambda: weight + torch.ones(4, 2),  # "... expected device meta"
               lambda: weight.sum().item()):  # "cannot be called on meta tensors"
        with pytest.raises((RuntimeError, NotImplementedError)) as err:
            op()
        assert _about_meta(str(err.value)), str(err.value)
    assert not _about_meta("[Errno 2] No such file or directory: 'missing-data.jsonl'")


@pytest.mark.parametrize("verb", ["plan", "tune"])
def test_a_command_without_dashes_beside_job_flags_is_refused(verb, tmp_path):
    """An audit: ``plan --gpu t4 python train.py --model M --data D`` took --model and --data as
    trainfit's, ran the script without them and told the user to fix the script."""
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    res = CliRunner().invoke(app, [verb, "python", str(script), "--model", "m", "--data", "d"])
    assert res.exit_code == 2, res.output
    assert "a command goes after --; without it trainfit took --model, --data as its own" \
        in res.output
    assert f"trainfit {verb} [trainfit's options] -- python {script} [its options]" in res.output


def test_an_optimizer_the_trainer_builds_from_its_own_class_is_planned(seed000):
    """Seed 000 with ``Trainer(optimizer_cls_and_kwargs=(torch.optim.AdamW, {...}))``: the
    Trainer steps torch's AdamW with its default kernel (foreach on a GPU), not the script's
    optim="adamw_torch_fused" (planned so before: the fused step's no temporaries, where
    foreach keeps a list of them the size of the trainable weights).  Read from the optimizer the
    Trainer builds on the meta model."""
    seed000.script.write_text(seed000.script.read_text().replace(
        "train_dataset=ds,", "train_dataset=ds, optimizer_cls_and_kwargs=(torch.optim.AdamW, "
        "{'lr': 2e-4, 'betas': (0.9, 0.95)}),"))
    rec = run_script(seed000.cmd(), mode="plan", gpu={"name": "A10G", "free_bytes": 20 * 2**30})
    assert rec["model"]["device"] == "meta" and rec["optimizer"]["class"] == "AdamW"
    f = map_record(rec).fields
    assert (f["optimizer"], f["optimizer_impl"]) == ("adamw", "foreach")
