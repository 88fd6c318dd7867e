"""Every bad input is one ``error:`` line and one ``hint:`` line, exit code 2, no traceback and
nothing written — table-driven: (name, how the input is made) → the command line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from reliability_tools import tree, write_job

LLAMA = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "vocab_size": 300}


def _config(d: Path, **fields) -> str:
    p = d / "cfg" / "config.json"
    p.parent.mkdir(exist_ok=True)
    data = {k: v for k, v in {**LLAMA, **fields}.items() if v is not None}
    p.write_text(json.dumps(data) if "raw" not in fields else fields["raw"])
    return str(p)


def _script(d):
    p = d / "train.py"
    p.write_text("from transformers import Trainer\nTrainer(model=None).train()\n")
    return str(p)


def _yaml(d: Path, text: str, name: str = "j.yaml") -> str:
    p = d / name
    p.write_text(text)
    return str(p)


def _plan(model: str, *more: str) -> list[str]:
    return ["plan", model, "--gpu", "t4", *more]


# (name, f(dir, job file) → args, what the error line names)
CASES: list[tuple[str, Callable[[Path, str], list[str]], str]] = [
    # config.json: the architecture stated, never filled in from defaults
    ("config.json with only model_type",
     lambda d, j: _plan(_config(d, hidden_size=None, num_hidden_layers=None,
                                num_attention_heads=None, vocab_size=None)), "does not state"),
    # Llama's default MLP width (11008) is a constant, not derived from the width given
    ("config.json without intermediate_size",
     lambda d, j: _plan(_config(d, intermediate_size=None)),
     "does not state intermediate_size (transformers would fill in LlamaConfig's default "
     "intermediate_size = 11008, a constant"),
    ("num_hidden_layers: -1", lambda d, j: _plan(_config(d, num_hidden_layers=-1)),
     "num_hidden_layers = -1"),
    ("heads do not divide hidden", lambda d, j: _plan(_config(d, hidden_size=130)),
     "not divisible"),
    ('hidden_size: "big"', lambda d, j: _plan(_config(d, hidden_size="big")), "hidden_size = 'big'"),
    ("kv heads do not divide heads", lambda d, j: _plan(_config(d, num_key_value_heads=3)),
     "num_key_value_heads"),
    ("config.json not JSON", lambda d, j: _plan(_config(d, raw="{nope")), "not valid JSON"),
    ("config.json a JSON list", lambda d, j: _plan(_config(d, raw="[1, 2, 3]")),
     "config.json holds an array, not a JSON object"),
    ("config.json null", lambda d, j: _plan(_config(d, raw="null")),
     "config.json holds null, not a JSON object"),
    ("unknown model_type", lambda d, j: _plan(_config(d, model_type="nope")), "model_type"),
    # plan's flags
    ("gpt2 --seq-len 4096 (1024 positions)", lambda d, j: _plan("gpt2", "--seq-len", "4096"),
     "1024 positions"),
    ("--seq-len 0", lambda d, j: _plan("gpt2", "--seq-len", "0"), "--seq-len 0"),
    ("--method LoRA", lambda d, j: _plan("gpt2", "--method", "LoRA"), "--method 'LoRA'"),
    ("--effective-batch 3 --ranks 2", lambda d, j: _plan("gpt2", "--effective-batch", "3",
                                                         "--ranks", "2"), "--ranks 2"),
    ("--lr 0", lambda d, j: _plan("gpt2", "--lr", "0"), "--lr"),
    # job files
    ("malformed YAML", lambda d, j: ["plan", _yaml(d, "model: [gpt2\n")], "not valid YAML"),
    # an audit: an error in a file's current: block named a flag never given
    ("current: micro_batch: 0", lambda d, j: ["plan", _yaml(
        d, "model: gpt2\ngpu: t4\nseq_len: 128\ncurrent:\n  micro_batch: 0\n")],
     "in its current: block, micro_batch: 0: must be an integer ≥ 1"),
    # an audit: a script given as the job file read as a YAML error at its line 25
    ("train train.py", lambda d, j: ["train", _script(d)], "a Python script, not a job file"),
    ("emit train.py", lambda d, j: ["emit", _script(d), "--to", "hf"],
     "a Python script, not a job file"),
    ("YAML quant nf4-dq + --method lora",
     lambda d, j: ["plan", _yaml(d, "model: gpt2\nmethod: qlora\nquant: nf4-dq\n"),
                   "--method", "lora"], "quant: nf4-dq needs --method qlora"),
    ("unknown YAML key", lambda d, j: ["plan", _yaml(d, "model: gpt2\nmicro_bach: 4\n")],
     "unknown key 'micro_bach'"),
    # a value from the file is named by its YAML key (the hint may offer a flag that fixes it)
    ("YAML lr: fast", lambda d, j: ["plan", _yaml(d, "model: gpt2\nlr: fast\n")], "lr: 'fast'"),
    ('YAML seq_len: "big"', lambda d, j: ["plan", _yaml(d, "model: gpt2\nseq_len: big\n")],
     "seq_len: 'big'"),
    ("YAML is a list", lambda d, j: ["plan", _yaml(d, "- model: gpt2\n")], "expected a mapping"),
    ("job file is a directory", lambda d, j: ["plan", _mkdir(d / "dir.yaml")], "is a directory"),
    ("job file not UTF-8", lambda d, j: ["plan", _bytes(d / "bin.yaml", b"\xff\xfe\x00model")],
     "not UTF-8"),
    ("job path too long", lambda d, j: ["plan", str(d / ("x" * 300 + ".yaml"))], "x" * 20),
    ("job file missing", lambda d, j: ["train", str(d / "missing.yaml")], "no such file"),
    # code in a job file: never run without the command line naming it
    ("module:factory model in a job file",
     lambda d, j: ["plan", _yaml(d, f"model: {d / 'evil.py'}:build\n")], "Python code"),
    ("trust_remote_code: true in a job file",
     lambda d, j: ["plan", _yaml(d, "model: someone/model\ntrust_remote_code: true\n")],
     "trust_remote_code"),
    # train's flags and data
    ("--nproc 0", lambda d, j: ["train", j, "--out", str(d / "o"), "--nproc", "0"], "--nproc 0"),
    ("--memory-limit 0.5", lambda d, j: ["train", j, "--out", str(d / "o"), "--memory-limit",
                                         "0.5"], "a number without a unit is bytes (0.5 B here)"),
    ("--memory-limit 1KiB", lambda d, j: ["train", j, "--out", str(d / "o"), "--memory-limit",
                                          "1KiB"], "weights alone"),
    ("--memory-limit 0", lambda d, j: ["train", j, "--out", str(d / "o"), "--memory-limit", "0"],
     "must be > 0"),
    ("--memory-limit lots", lambda d, j: ["train", j, "--out", str(d / "o"), "--memory-limit",
                                          "lots"], "not a size"),
    ("--inject-oom-at abc", lambda d, j: ["train", j, "--out", str(d / "o"), "--inject-oom-at",
                                          "abc"], "--inject-oom-at abc"),
    ("data smaller than one effective batch",
     lambda d, j: ["train", _small_batch(d, j), "--out", str(d / "o")], "fewer than one effective"),
    ("--out is an existing file", lambda d, j: ["train", j, "--out", _bytes(d / "f", b"x")],
     "is a file"),
    ("--out under a file", lambda d, j: ["train", j, "--out", str(Path(_bytes(d / "g", b"x")) / "r")],
     "is a file"),
    ("--out too long", lambda d, j: ["train", j, "--out", str(d / ("r" * 300))],
     "File name too long"),
    # a run that fails before its first step in a directory that was there leaves it as it was
    # (its lock file was left behind: an audit)
    ("OOM at micro-batch 1 into an existing directory",
     lambda d, j: ["train", j, "--out", _mkdir(d / "pre"), "--micro-batch", "1",
                   "--inject-oom-at", "0"], "out of memory"),
    ("--resume missing", lambda d, j: ["train", j, "--out", str(d / "o"), "--resume",
                                       str(d / "none")], "does not exist"),
    ("--max-steps 0", lambda d, j: ["train", j, "--out", str(d / "o"), "--max-steps", "0"],
     "--max-steps 0"),
    ("--save-every 0", lambda d, j: ["train", j, "--out", str(d / "o"), "--save-every", "0"],
     "--save-every 0"),
    ("--epochs 0", lambda d, j: ["train", j, "--out", str(d / "o"), "--epochs", "0"], "--epochs"),
    ("--max-steps and --epochs", lambda d, j: ["train", j, "--out", str(d / "o"), "--max-steps",
                                                "5", "--epochs", "2"], "each sets the run's length"),
    ("--eval-fraction 2", lambda d, j: ["train", j, "--out", str(d / "o"), "--eval-fraction", "2"],
     "--eval-fraction"),
    ("--backend nope", lambda d, j: ["train", j, "--out", str(d / "o"), "--backend", "nope"],
     "--backend nope"),
    ("--device tpu", lambda d, j: ["train", j, "--out", str(d / "o"), "--device", "tpu"],
     "--device tpu"),
    ("module:factory model in train's job file",
     lambda d, j: ["train", _yaml(d, f"model: {d / 'evil.py'}:build\n"), "--out", str(d / "o")],
     "Python code"),
    # tune: --out checked before the search
    ("tune --out into a missing directory",
     lambda d, j: ["tune", j, "--out", str(d / "nowhere" / "t.yaml")], "does not exist"),
    ("tune --out is a directory", lambda d, j: ["tune", j, "--out", _mkdir(d / "outdir")],
     "is a directory"),
    ("tune --memory-limit 0", lambda d, j: ["tune", j, "--memory-limit", "0"], "must be > 0"),
    ("tune --margin 2", lambda d, j: ["tune", j, "--margin", "2"], "--margin"),
    ("tune --knobs nope", lambda d, j: ["tune", j, "--knobs", "nope"], "nope"),
    ("tune --knobs ''", lambda d, j: ["tune", j, "--knobs", ""], "names no knob"),
    # plan refused a job file's unknown gpu:, tune and train ran on without a word (an audit)
    ("tune gpu: rtx-9999 in the file", lambda d, j: ["tune", _changed(d, j, gpu="rtx-9999")],
     "gpu: rtx-9999 (in "),
    ("train gpu: rtx-9999 in the file", lambda d, j: [
        "train", _changed(d, j, gpu="rtx-9999"), "--out", str(d / "o")], "unknown GPU"),
    ("doctor gpu: rtx-9999 in the file", lambda d, j: [
        "doctor", _changed(d, j, gpu="rtx-9999")], "gpu: rtx-9999 (in "),
    # doctor
    ("doctor --steps 1", lambda d, j: ["doctor", j, "--steps", "1"], "--steps 1"),
    ("doctor --warmup -1", lambda d, j: ["doctor", j, "--warmup", "-1"], "--warmup -1: must be ≥ 0"),
    # train takes the job from its file alone: the field is named by its key, not a flag
    ("train lr: -1 in the file", lambda d, j: ["train", _yaml(d, yaml.safe_dump(
        {**yaml.safe_load(Path(j).read_text()), "lr": -1})), "--out", str(d / "o")],
     "lr: -1: must be a finite number > 0"),
    ("resume at another seq_len", lambda d, j: ["train", _other_seq_len(d, j), "--out",
                                                str(d / "run"), "--resume", _run(d, j)],
     "seq_len 16 differs from the checkpoint's 32"),
    # the optimizer's and scheduler's states are the checkpoint's: another optimizer raised
    # KeyError at its first step, another lr was silently the checkpoint's
    ("resume with another optimizer", lambda d, j: ["train", _changed(d, j, optimizer="sgd"),
                                                   "--out", str(d / "run"), "--resume", _run(d, j)],
     "optimizer 'sgd' differs from the checkpoint's 'adamw': its optimizer and learning-rate "
     "schedule continue"),
    ("resume at or past --max-steps", lambda d, j: ["train", j, "--out", str(d / "run2"),
                                                    "--resume", _run(d, j), "--max-steps", "1"],
     "--max-steps 1: the checkpoint"),
    ("resume with another lr", lambda d, j: ["train", _changed(d, j, lr=0.1), "--out",
                                            str(d / "run"), "--resume", _run(d, j)],
     "lr 0.1 differs from the checkpoint's"),
    # the decay is a parameter group's option: the checkpoint's would be stepped, unsaid
    ("resume with another weight decay", lambda d, j: [
        "train", _changed(d, j, weight_decay=0.1), "--out", str(d / "run"), "--resume", _run(d, j)],
     "weight_decay 0.1 differs from the checkpoint's 0.0"),
    ("weight_decay: -1 in the file", lambda d, j: ["plan", _changed(d, j, weight_decay=-1)],
     "weight_decay: -1: must be a finite number ≥ 0"),
    # a null on a field with no "unset": one line, not the range check's TypeError (a review)
    ("weight_decay: null in the file", lambda d, j: ["plan", _changed(d, j, weight_decay=None)],
     "weight_decay: is empty (null): must be a number"),
    ("sgd_momentum with adamw", lambda d, j: ["plan", _changed(d, j, sgd_momentum=0.5,
                                                            optimizer="adamw")],
     "sgd_momentum: given with optimizer: adamw"),
    # 20 steps at 8 samples and 2 at 16 were recorded as a run at 16 (an audit)
    ("resume at another effective batch", lambda d, j: [
        "train", _changed(d, j, effective_batch=2 * (yaml.safe_load(Path(j).read_text())
                                                     .get("effective_batch") or 8)),
        "--out", str(d / "run"), "--resume", _run(d, j)],
     "effective_batch 16 differs from the checkpoint's 8: its steps so far took"),
    # a new run written into a checkpoint: pruning the parent run would delete it (an audit)
    ("--out inside a checkpoint", lambda d, j: [
        "train", j, "--out", str(Path(_run(d, j)) / "checkpoint-1" / "new")],
     "checkpoint-1, which is not a run directory"),
]


def _changed(d: Path, j: str, **fields: object) -> str:
    job = yaml.safe_load(Path(j).read_text())
    return _yaml(d, yaml.safe_dump({**job, **fields}))


def _mkdir(p: Path) -> str:
    p.mkdir()
    return str(p)


def _bytes(p: Path, data: bytes) -> str:
    p.write_bytes(data)
    return str(p)


def _run(d: Path, j: str) -> str:
    """A run of one step of the job file (its checkpoint to resume from)."""
    from trainfit.job import JobSpec
    from trainfit.run.loop import RunOptions, train

    out = d / "run"
    train(JobSpec.from_dict(yaml.safe_load(Path(j).read_text())),
          RunOptions(out_dir=out, max_steps=1))
    return str(out)


def _other_seq_len(d: Path, j: str) -> str:
    job = yaml.safe_load(Path(j).read_text())
    return _yaml(d, yaml.safe_dump({**job, "seq_len": 16}))


def _small_batch(d: Path, j: str) -> str:
    job = yaml.safe_load(Path(j).read_text())
    return str(write_job(d / "big_batch.yaml", job["model"], job["data"], effective_batch=32,
                         micro_batch=4))


@pytest.mark.parametrize("name, make, names", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line_and_nothing_written(cli, job_file, tmp_path, name, make,
                                                         names):
    d = tmp_path / "case"
    d.mkdir()
    (d / "evil.py").write_text(f"open({str(d / 'RAN')!r}, 'w').write('x')\n"
                               "def build():\n    return None\n")
    args = make(d, str(job_file))
    before = tree(tmp_path)
    r = cli(*args)
    assert r.clean_error(), f"{name}: exit {r.code}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    assert names in r.errors[0], f"{name}: {r.errors[0]}"
    assert r.hints[0].strip() != "hint:", name
    after = {k: v for k, v in tree(tmp_path).items() if not k.startswith("_cache")}
    assert after == {k: v for k, v in before.items() if not k.startswith("_cache")}, name
    assert not (d / "RAN").exists(), f"{name}: code from a job file ran"



def test_every_error_trainfit_raises_carries_a_hint():
    """The source itself: every JobError / DataError / DoctorError / MonitorError /
    ReportInputError constructed in src/ passes a hint (a non-empty second argument or hint=).
    Before: 36 constructions without one (--seq-len 0, malformed YAML, --memory-limit 0, ...)."""
    import ast

    import trainfit

    names = {"JobError", "DataError", "DoctorError", "MonitorError", "ReportInputError",
             "CheckpointWriteError"}
    missing = []
    for path in sorted(Path(trainfit.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name not in names:
                continue
            hint = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "hint"), None)
            if hint is None or (isinstance(hint, ast.Constant) and not hint.value):
                missing.append(f"{path.name}:{node.lineno}")
    assert not missing, missing


@pytest.mark.parametrize("what", ["job file", "config.json"])
def test_unreadable_file_is_one_line(cli, job_file, micro_model_json, tmp_path, monkeypatch, what):
    """A file without read permission (simulated: the tests run as root, who reads anything)."""
    import errno
    import os

    target = Path(job_file) if what == "job file" else Path(micro_model_json)
    real = Path.read_text

    def read_text(self, *a, **k):
        if self == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    before = tree(tmp_path)
    r = cli("plan", job_file, "--gpu", "t4") if what == "job file" else \
        cli("plan", micro_model_json, "--gpu", "t4")
    assert r.clean_error() and "Permission denied" in r.errors[0], r.stderr
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("_cache")} == \
        {k: v for k, v in before.items() if not k.startswith("_cache")}


def test_a_yaml_field_is_cleared_from_the_command_line(cli, tmp_path):
    """--quant none clears the file's quant: the error's hint says so, and it works."""
    job = tmp_path / "j.yaml"
    job.write_text("model: gpt2\nmethod: qlora\nquant: nf4\n")
    r = cli("plan", job, "--method", "lora")
    assert r.clean_error() and "--quant none" in r.hints[0], r.stderr
    r = cli("plan", job, "--method", "lora", "--quant", "none", "--gpu", "t4", "--micro-batch", "1",
            "--seq-len", "64", "--precision", "fp32", "--grad-ckpt", "off", "--no-verify", "--json")
    assert r.code == 0, r.stderr


def test_quant_none_under_qlora_is_refused_not_silently_nf4(cli, tmp_path):
    """--quant none clears a quant; under qlora the default nf4-dq would have come back unsaid
    (a newcomer audit: the plan showed nf4-dq). It is one error line, whether the method comes
    from the command line or from the job file."""
    r = cli("plan", "gpt2", "--method", "qlora", "--quant", "none", "--gpu", "t4")
    assert r.clean_error() and "--quant none with --method qlora" in r.errors[0], r.stderr
    assert "--method lora" in r.hints[0]
    job = tmp_path / "j.yaml"
    job.write_text("model: gpt2\nmethod: qlora\nquant: nf4\n")
    before = tree(tmp_path)
    r = cli("plan", job, "--quant", "none", "--gpu", "t4")
    assert r.clean_error() and "always 4-bit" in r.errors[0], r.stderr
    assert tree(tmp_path) == before
