"""The CLI: one clear error line + hint and exit code 2 on bad input; JSON on success."""

import json
import sys

import pytest
from typer.testing import CliRunner

from trainfit.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("args, needle", [
    (["plan", "llama-3.2-1bb", "--gpu", "t4"], "unknown model"),
    (["plan", "gpt2", "--gpu", "t5000"], "unknown GPU"),
    (["plan", "gpt2", "--gpu", "t4", "--micro-batch", "0"], "--micro-batch 0: must be"),
    (["plan", "gpt2", "--gpu", "t4", "--seq-len", "-1"], "--seq-len -1"),
    (["plan", "gpt2", "--gpu", "t4", "--micro-batch", "3", "--effective-batch", "8"],
     "not divisible"),
    (["plan", "gpt2", "--gpu", "t4", "--micro-batch", "2", "--effective-batch", "8",
      "--ranks", "3"], "not divisible"),
    (["plan", "gpt2", "--gpu", "t4", "--method", "full", "--lora-r", "8"],
     "--lora-r given with --method full"),
    (["plan", "gpt2", "--gpu", "t4", "--precision", "amp-bf16"], "no bf16 support"),
    (["plan", "gpt2", "--gpu", "t4", "--method", "lora", "--lora-targets", "nope"],
     "--lora-targets nope"),
    (["plan", "missing.yaml"], "missing.yaml: no such file"),
    # an audit: the positional model was dropped for --model's, unsaid
    (["plan", "llama-2-7b", "--model", "gpt2", "--gpu", "a100-80gb"], "two models"),
    (["tune", "llama-2-7b", "--model", "gpt2"], "two models"),
    (["plan", "/nonexistent/config.json", "--gpu", "t4"], "no such file or directory"),
    (["plan", "./missing-model-dir", "--gpu", "t4"], "no such file or directory"),
    (["plan", "gpt2", "--gpu", "t4", "--optimizer-in-backward"], "gradient clipping"),
    (["plan", "gpt2", "--gpu", "a100-80gb", "--optimizer-in-backward", "--max-grad-norm", "none",
      "--micro-batch", "2", "--effective-batch", "8"], "grad-accum 4"),
    (["plan", "gpt2", "--gpu", "t4", "--max-grad-norm", "big"], "--max-grad-norm 'big'"),
    # flags that cannot act: refused, not ignored (a QA run)
    (["plan", "gpt2", "--gpu", "t4", "--grad-ckpt", "off", "--ckpt-reentrant"],
     "no checkpointing to make reentrant"),
    (["plan", "gpt2", "--gpu", "t4", "--grad-accum", "3", "--effective-batch", "8"],
     "not divisible by grad-accum 3"),
    # a size the card does not have is another card (a QA run planned these as the catalog's)
    (["plan", "gpt2", "--gpu", "a100-99gb"], "--gpu a100-99gb: unknown GPU"),
    (["plan", "gpt2", "--gpu", "l40s-24gb"], "--gpu l40s-24gb: unknown GPU"),
    (["plan", "gpt2", "--gpu", "a100", "--ranks", "2", "--interconnect", "0GB/s"],
     "must be > 0 GB/s"),
])
def test_bad_input_exits_2_with_one_line(args, needle):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    err = res.stderr if hasattr(res, "stderr") else res.output
    first = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(first) == 1 and needle in first[0], err


@pytest.mark.parametrize("args, needle", [
    (["plan", "gpt2", "--gpu", "t4", "--seq-len", "abc"], "invalid value for '--seq-len'"),
    (["plan", "gpt2", "--gpux", "t4"], "no such option: --gpux"),
    (["bogus"], "no such command 'bogus'"),
])
def test_unparsable_flags_are_one_line_too(args, needle, monkeypatch):
    """QA: click's usage errors (a flag's type, an unknown option) were typer's boxed screen;
    trainfit.cli.main.main() makes them one error line and a hint, exit code 2."""
    from typer import rich_utils

    from trainfit.cli.startup import one_line_usage_errors

    # typer's own function comes back after the test (main() installs this for the process)
    monkeypatch.setattr(rich_utils, "rich_format_error", rich_utils.rich_format_error)
    one_line_usage_errors()
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 2 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert lines[1].startswith("hint: ") and "--help" in lines[1]


def test_another_tools_flag_is_given_trainfits_name(monkeypatch):
    """An audit: --batch-size got "no such option" and no word of --micro-batch."""
    from typer import rich_utils

    from trainfit.cli.startup import one_line_usage_errors

    monkeypatch.setattr(rich_utils, "rich_format_error", rich_utils.rich_format_error)
    one_line_usage_errors()
    for flag, said in (("--batch-size", "--micro-batch (samples per forward pass) and "
                        "--effective-batch"), ("--max-seq-length", "--seq-len")):
        res = runner.invoke(app, ["plan", "gpt2", flag, "8"])
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        assert res.exit_code == 2 and lines[1].startswith("hint: ") and said in lines[1], lines
    # train takes a job file: its key, not a flag it does not have (a review)
    res = runner.invoke(app, ["train", "job.yaml", "--max-seq-length", "8"])
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert lines[1].startswith("hint: seq_len: in the job file"), lines


@pytest.mark.parametrize("cmd", ["train", "emit"])
def test_train_and_emit_given_a_command_say_they_take_a_job_file(cmd, monkeypatch):
    """A review: `trainfit train -- python train.py` read "python" as the job file and said only
    "unexpected extra argument"; plan, tune and doctor take a command, train and emit do not."""
    from typer import rich_utils

    from trainfit.cli.startup import one_line_usage_errors

    monkeypatch.setattr(rich_utils, "rich_format_error", rich_utils.rich_format_error)
    one_line_usage_errors()
    res = runner.invoke(app, [cmd, "--", "python", "train.py", "--steps", "5"])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 2 and lines[0].startswith("error: got unexpected extra argument")
    assert lines[1] == (f"hint: trainfit {cmd} takes a job file (trainfit.yaml), not a command: "
                        "for your own script, trainfit tune -- python train.py prints the "
                        "keywords to change in it; then run it as you do")
    other = runner.invoke(app, [cmd, "job.yaml", "extra"])
    assert "--help lists the options" in other.stderr


@pytest.mark.parametrize("line, said", [
    ("gpu: bogus", "error: gpu: bogus (in {job}): unknown GPU"),
    ("gpu: t4\nseq_len: abc", "error: {job}: seq_len: 'abc': must be an integer"),
])
def test_a_job_files_bad_value_names_the_file(tmp_path, line, said):
    job = tmp_path / "job.yaml"
    job.write_text(f"model: gpt2\n{line}\n")
    res = runner.invoke(app, ["plan", str(job)])
    assert res.exit_code == 2
    assert said.format(job=job) in res.stderr


def test_a_job_files_bad_value_is_named_by_its_key_then_the_flag(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt2\ngpu: t4\nseq_len: -3\n")
    res = runner.invoke(app, ["plan", str(job)])
    assert res.exit_code == 2
    assert "error: seq_len: -3: must be an integer ≥ 1" in res.stderr
    assert f"hint: e.g. seq_len: 512 in {job}, or --seq-len 512 on the command line" in res.stderr


def test_train_names_a_job_files_micro_batch_by_its_key(tmp_path):
    """QA: train's own --micro-batch flag made a job file's bad micro_batch read as the flag."""
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt2\nseq_len: 32\nmicro_batch: -2\neffective_batch: 4\n")
    res = runner.invoke(app, ["train", str(job), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert "error: micro_batch: -2: must be an integer ≥ 1" in res.stderr
    assert f"(in {job})" in res.stderr and not (tmp_path / "run").exists()


def test_unknown_model_suggests_close_names():
    res = runner.invoke(app, ["plan", "llama-3.2-1bb", "--gpu", "t4"])
    assert "hint: did you mean llama-3.2-1b" in res.stderr


def test_unknown_gpu_suggests_close_names():
    res = runner.invoke(app, ["plan", "gpt2", "--gpu", "h1000"])
    assert res.exit_code == 2
    assert "hint: did you mean h100-sxm," in res.stderr  # its alias 'h100' is the closest
    assert "rtx-3090" not in res.stderr  # the close names, not the whole catalog after them
    far = runner.invoke(app, ["plan", "gpt2", "--gpu", "zzzz"])
    assert "hint: known: " in far.stderr and "rtx-3090" in far.stderr


def test_config_json_without_fields(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama", "hidden_size": 0}')
    res = runner.invoke(app, ["plan", str(p), "--gpu", "t4"])
    assert res.exit_code == 2
    assert "error:" in res.stderr


def test_corrupt_config_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    res = runner.invoke(app, ["plan", str(p), "--gpu", "t4"])
    assert res.exit_code == 2 and "not valid JSON" in res.stderr


def test_plan_json_single_configuration(tiny_config_json):
    res = runner.invoke(app, ["plan", str(tiny_config_json), "--gpu", "generic-1gb",
                              "--micro-batch", "2", "--grad-accum", "2", "--seq-len", "64",
                              "--precision", "amp-bf16", "--grad-ckpt", "off", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    (cfg,) = out["configs"]
    assert cfg["micro_batch"] == 2 and cfg["grad_accum"] == 2 and cfg["effective_batch"] == 4
    assert cfg["how"] == "simulated"
    assert 0 < cfg["peak_allocated_bytes"] <= cfg["peak_reserved_bytes"] < cfg["peak_device_bytes"]
    assert set(cfg["breakdown"]) >= {"parameters", "gradients", "optimizer", "activations",
                                     "temporaries"}
    assert cfg["fits"] is True
    assert cfg["tokens_per_s"] is None and cfg["mfu"] is None  # a generic card: peak unknown
    # ranked by preference alone, said so (an audit read such ranks as "fastest")
    assert cfg["rank"] == 1 and cfg["rank_basis"] == "preference"


def test_plan_json_speed_on_a_known_gpu(tiny_config_json):
    res = runner.invoke(app, ["plan", str(tiny_config_json), "--gpu", "a100-80gb",
                              "--micro-batch", "2", "--grad-accum", "2", "--seq-len", "64",
                              "--precision", "amp-bf16", "--grad-ckpt", "off", "--json"])
    (cfg,) = json.loads(res.stdout)["configs"]
    assert cfg["tokens_per_s"] > 0 and 0 < cfg["mfu"] < 1 and cfg["rank"] == 1
    assert cfg["rank_basis"] == "predicted_tokens_per_s"
    assert cfg["step_time_s"] == pytest.approx(4 * 64 / cfg["tokens_per_s"])


def test_listing_commands():
    assert runner.invoke(app, ["models"]).exit_code == 0
    res = runner.invoke(app, ["gpus", "--json"])
    assert res.exit_code == 0 and any(g["name"] == "t4" for g in json.loads(res.stdout))
    wide = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["gpus"])
    t4 = next(line for line in wide.stdout.splitlines() if line.startswith("t4 "))
    assert "no bf16" in t4 and "pcie3x16 15.75" in t4  # the link plan times gradients over
    assert "pcie4x16 31.5, no peer-to-peer" in next(
        line for line in wide.stdout.splitlines() if line.startswith("rtx-4090 "))


def test_seed_examples_are_valid_jobs():
    from trainfit.cli.main import DEFAULT_EXAMPLE, _load_target, examples_dir
    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec, job_with_current

    files = sorted(examples_dir().glob("seed*.yaml"))
    assert len(files) == 5 and (examples_dir() / DEFAULT_EXAMPLE).is_file()
    for f in files:
        fields, extra = _load_target(str(f))
        JobSpec.from_dict(fields)
        assert find_gpu(extra["gpu"]) is not None
        if "current" in extra:  # the seed's starting configuration is a valid job too
            cur = job_with_current(fields, extra["current"], f.name)
            assert cur.micro_batch and cur.grad_ckpt in ("off", "full")


def test_plan_of_a_seed_yaml_runs_end_to_end():
    res = runner.invoke(app, ["plan", "seed004_4gb_gpt2_scratch.yaml", "--micro-batch", "1",
                              "--grad-ckpt", "full", "--json"])
    assert res.exit_code == 0, res.output
    (cfg,) = json.loads(res.stdout)["configs"]
    assert cfg["model"] == "gpt2" and cfg["grad_accum"] == 32 and cfg["fits"] is True


def test_bitsandbytes_kernels_warning_is_filtered():
    """bitsandbytes logs 'Failed to load CPU gemm_4bit_forward from kernels-community' once per
    process (a plan showed it twice): the CLI drops that record and nothing else."""
    import logging

    from trainfit.cli.startup import quiet_third_party

    quiet_third_party()
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    h = Keep()
    logger.addHandler(h)
    try:
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please",
                       "No module named 'kernels'")
        logger.warning("something else")
    finally:
        logger.removeHandler(h)
    assert seen == ["something else"]


def test_the_command_list_is_in_the_order_of_the_work_with_one_paragraph_summaries():
    """`trainfit --help` lists quickstart, plan, tune, train, doctor, report first, each summary
    its docstring's first paragraph on one line (typer kept the source's line breaks)."""
    names = [c.name for c in app.registered_commands]
    assert names[:6] == ["quickstart", "plan", "tune", "train", "doctor", "report"]
    assert set(names) >= {"monitor", "emit", "models", "gpus"}
    report = next(c for c in app.registered_commands if c.name == "report")
    assert "\n" not in report.short_help and "the pick, the seed-002-style table" in report.short_help
    out = runner.invoke(app, ["--help"], terminal_width=200).output
    assert out.index("quickstart") < out.index(" plan ") < out.index(" tune ") < out.index(" report ")


def test_a_config_of_a_model_without_a_language_model_head_says_so(tmp_path):
    """A wav2vec2 config.json got the hint about sizes and pad_token_id (a QA run)."""
    import json as _json

    cfg = tmp_path / "w2v" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(_json.dumps({"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForCTC"],
                                "hidden_size": 64, "num_hidden_layers": 1,
                                "num_attention_heads": 2, "intermediate_size": 128,
                                "vocab_size": 32}))
    res = runner.invoke(app, ["plan", str(cfg), "--gpu", "t4"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.startswith(("error:", "hint:"))]
    assert "has no causal- or seq2seq-LM class for model_type wav2vec2" in lines[0]
    assert lines[1].startswith("hint: trainfit plans text language models")


def test_transformers_is_quieted_when_imported_not_by_the_entry_point(fresh_cli):
    """A usage error or --help never imports transformers (~1.3 s, an audit timed flag errors
    at 11-20 s), yet once anything imports it its warnings are at the error level; the level is
    set in this process only (no TRANSFORMERS_VERBOSITY for a script doctor or tune runs)."""
    import os
    import subprocess
    import sys

    code = ("import os, sys\n"
            "from trainfit.cli.startup import quiet_transformers\n"
            "quiet_transformers()\n"
            "assert 'transformers' not in sys.modules\n"
            "assert 'TRANSFORMERS_VERBOSITY' not in os.environ\n"
            "import transformers\n"
            "from transformers.utils import logging\n"
            "print(logging.get_verbosity())\n"
            "logging.set_verbosity_warning()\n"
            "quiet_transformers()  # already imported: set at once\n"
            "print(logging.get_verbosity())\n")
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["40", "40"]  # logging.ERROR, both ways
    # a bad flag: said, exit 2, with neither transformers nor torch imported
    code, err, imported = fresh_cli(["plan", "llama-2-7b", "--gpu", "a100-80gb", "--micro-batch",
                                     "0"])
    assert "--micro-batch 0" in err
    assert (code, imported) == (2, {"torch": False, "transformers": False})

@pytest.mark.parametrize("flags, said", [
    (["--max-steps", "0"], "--max-steps 0"), (["--backend", "foo"], "--backend foo"),
    (["--eval-every", "0"], "--eval-every 0"), (["--out", "README.md"], "is a file")])
def test_trains_flag_errors_come_before_the_model_loads(flags, said, fresh_cli):
    """A flag's own error is said before the job's model is resolved (10-17 s of imports and
    building: an audit), with neither torch nor transformers imported."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    job = root / "examples" / "results" / "tune_llama_tiny.yaml"
    code, err, imported = fresh_cli(["train", str(job), "--no-live", *flags], cwd=root)
    assert said in err and err.startswith("error:"), err
    assert (code, imported) == (2, {"torch": False, "transformers": False})


def test_ctrl_c_outside_trains_own_handler_is_said(monkeypatch, capsys):
    """Ctrl-C while a model loads (before train's handler saves a checkpoint) ended with exit 130
    and no word (an audit)."""
    import trainfit.cli.main as cli_main

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "app", interrupted)
    with pytest.raises(SystemExit) as done:
        cli_main.main()
    assert done.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C) before the command finished\n"
    # inside a command typer turns the Ctrl-C into Exit(130) with a blank line (an audit: no
    # word); an exit 130 with no Ctrl-C behind it (train's own handler, which said what it
    # saved) adds nothing
    import typer

    def in_a_command() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            try:
                raise typer.Exit(130) from e
            except typer.Exit:
                sys.exit(130)

    for command, said in ((in_a_command, "interrupted (Ctrl-C) before the command finished\n"),
                          (lambda: sys.exit(130), "")):
        monkeypatch.setattr(cli_main, "app", command)
        with pytest.raises(SystemExit) as done:
            cli_main.main()
        assert done.value.code == 130 and capsys.readouterr().err == said
    # the console script imports the CLI under the same guard (a Ctrl-C during its imports)
    import trainfit.cli.entry as entry

    class CtrlCOnImport:  # a Ctrl-C while trainfit.cli.main's imports run
        def find_spec(self, name, path=None, target=None):
            if name == "trainfit.cli.main":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "trainfit.cli.main")
    monkeypatch.setattr(sys, "meta_path", [CtrlCOnImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as done:
        entry.main()
    assert done.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C) before the command finished\n"


def test_a_written_job_file_is_0644_and_a_replaced_one_keeps_its_mode(tmp_path):
    """mkstemp made every tuned YAML 0600 (an audit); a new file is 0644, as report's are."""
    import os

    from trainfit.cli.jobargs import write_atomic

    new = tmp_path / "t.yaml"
    write_atomic(new, "model: gpt2\n")
    assert new.stat().st_mode & 0o777 == 0o644 and new.read_text() == "model: gpt2\n"
    os.chmod(new, 0o640)
    write_atomic(new, "model: gpt2\nseq_len: 64\n")
    assert new.stat().st_mode & 0o777 == 0o640


def test_tune_with_nothing_that_fits_says_so_on_its_own_line(monkeypatch, tmp_path):
    """Nothing fits: exit 1 (a measured outcome) with an error: line and what to change (an
    audit: the notes were joined into the pick line, with no error: line)."""
    import types
    from pathlib import Path

    import trainfit.cli.tune as tune_cli

    monkeypatch.setattr(tune_cli, "_search", lambda job, opts, **kw: types.SimpleNamespace(
        pick=None))
    monkeypatch.setattr(tune_cli, "_report", lambda *a, **k: None)
    data = Path(__file__).resolve().parents[2] / "examples" / "data" / "tiny_text.jsonl"
    res = CliRunner().invoke(app, ["tune", "llama-tiny-58m", "--data", str(data), "--seq-len",
                                   "32", "--effective-batch", "4", "--memory-limit", "0.8GiB"])
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith(("error:", "hint:"))]
    assert errors == [
        "error: tune found no configuration that fits in memory (its notes above say what was "
        "measured)",
        "hint: a shorter --seq-len, --method lora (or qlora on a GPU), or more memory "
        "(--memory-limit on the CPU)"]


def test_tune_out_under_a_file_or_over_a_node_is_refused_with_its_fix(tmp_path):
    """An audit: --out under a file said "create it first (mkdir -p afile)", which fails; a
    pipe or device at --out would be replaced by the rename."""
    import os

    from trainfit.cli.jobargs import check_writable
    from trainfit.job import JobError

    (tmp_path / "afile").write_text("x")
    with pytest.raises(JobError, match="afile is a file, not a directory") as e:
        check_writable(tmp_path / "afile" / "x.yaml")
    assert "mkdir" not in (e.value.hint or "")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(JobError, match="not a regular file"):
        check_writable(tmp_path / "pipe")
    assert (tmp_path / "pipe").is_fifo()


def test_the_tuned_file_says_what_tune_could_not_decide(tmp_path, monkeypatch):
    """An audit: the terminal said "could not decide: precision amp-bf16 measured 1.97× …" and
    the written file said nothing of it; its header now carries each undecided change."""
    from types import SimpleNamespace

    import trainfit.cli.tune as tune_cli
    import trainfit.render.tune_words as tw
    from trainfit.job import JobSpec
    from trainfit.tune.result import SearchNote

    undecided = SearchNote("undecided", {"changes": [["precision", "amp-bf16"]],
                                         "ratios": [1.97], "noise": 0.12, "proposal": 1.97,
                                         "rounds": 4, "budget": True, "why": ""})
    rule = SearchNote("ckpt_not_needed", {})
    result = SimpleNamespace(pick=SimpleNamespace(job=JobSpec(model="gpt2", effective_batch=8,
                                                              micro_batch=8)),
                             notes=[undecided, rule])
    monkeypatch.setattr(tw, "tune_json", lambda r: {
        "reason": "the pick", "device": "cpu", "memory_limit_bytes": None,
        "pick": {"measured": {"tokens_per_s": 440.0}}})
    monkeypatch.setattr("trainfit.render.tune.render_tune", lambda *a, **k: None)
    out = tmp_path / "t.yaml"
    tune_cli._report(result, str(out), None, False, "x")
    header = [ln for ln in out.read_text().splitlines() if ln.startswith("# ")]
    assert header[1] == "# the pick"
    assert any("amp-bf16" in ln and "only 1 of the 4 rounds ran" in ln for ln in header)
    assert not any("checkpointing: not tried" in ln for ln in header)  # a rule, not a question


def test_plan_refuses_what_needs_no_model_before_resolving_it(monkeypatch):
    """An audit: --margin 1.5, --epochs without --dataset-tokens, bf16 on a T4 were said after
    10-47 s of building the model. They are refused before the model is resolved."""
    import trainfit.model.source as source

    def boom(*a, **k):
        raise AssertionError("the model was resolved")
    monkeypatch.setattr(source, "resolve_model", boom)
    for args, said in ((["--margin", "1.5"], "--margin 1.5: must be in [0, 1)"),
                       (["--epochs", "2"], "--epochs 2 needs the dataset size"),
                       (["--dataset-tokens", "-1"], "--dataset-tokens -1: must be ≥ 1"),
                       (["--precision", "bf16-true"], "has no bf16 support")):
        res = CliRunner().invoke(app, ["plan", "gpt2", "--gpu", "t4", *args])
        assert res.exit_code == 2 and said in res.output, res.output
