"""Bad values an audit found accepted, ignored or ending in a traceback: each is now one JobError
(or DataError / MonitorError / ReportInputError: exit 2 through the CLI) before anything runs —
and the values a user writes as a matter of course (``lr: 2e-5``) are read as meant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainfit.job import JobError, JobSpec
from trainfit.job.files import file_memory_limit, read_job_file
from trainfit.run.options import RunOptions
from trainfit.tune.tuner import TuneOptions


def test_a_learning_rate_written_without_a_dot_is_a_number(tmp_path):
    """PyYAML (YAML 1.1) reads ``2e-5`` as a string: the usual way to write a learning rate was
    refused, with the hint ``e.g. lr: 1e-4`` — itself refused. A quoted one stays a string."""
    f = tmp_path / "job.yaml"
    f.write_text("model: gpt2\nlr: 2e-5\nmax_grad_norm: 1e0\n")
    fields, _ = read_job_file(f)
    assert fields["lr"] == 2e-5 and fields["max_grad_norm"] == 1.0
    assert JobSpec(**fields).lr == 2e-5
    f.write_text("model: gpt2\nlr: '2e-5'\n")
    assert read_job_file(f)[0]["lr"] == "2e-5"


@pytest.mark.parametrize("kw, needle", [
    ({"seed": -1}, "seed -1: must be in 0 … 2^32 − 1"),
    ({"seed": 2**70}, "must be in 0 … 2^32 − 1"),
    ({"num_workers": 10**6}, "more loader processes than trainfit allows (256)"),
    # FSDP's simulation shards per rank: 100,000 ranks ran for minutes with no word (a review)
    ({"ranks": 100_000, "sharding": "fsdp"}, "--ranks 100000: more data-parallel ranks than "
     "trainfit plans (4096)")])
def test_job_fields_out_of_range(kw, needle):
    with pytest.raises(JobError, match=needle.replace("^", r"\^").replace("(", r"\(")
                       .replace(")", r"\)")):
        JobSpec(model="gpt2", **kw)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0])
def test_a_file_memory_limit_must_be_finite(value):
    with pytest.raises(JobError, match="must be a finite number ≥ 1 byte"):
        file_memory_limit({"memory_limit": value})


def test_options_that_were_taken_as_no_limit():
    with pytest.raises(JobError, match="--epochs inf: must be a finite number > 0"):
        RunOptions(out_dir="x", epochs=float("inf"))
    with pytest.raises(JobError, match="--budget-s nan: must be a finite number of seconds"):
        TuneOptions(budget_s=float("nan"))
    with pytest.raises(JobError, match="--run-steps 0: must be ≥ 1"):
        TuneOptions(run_steps=0)


@pytest.mark.parametrize("row, needle", [
    ({"input_ids": [-5, 3, 4]}, "input_ids must be a list of token ids"),
    ({"input_ids": [True, False]}, "input_ids must be a list of token ids"),
    ({"messages": ["hi", "there"]}, "'messages' must be a non-empty list"),
    ({"messages": [{"role": "user"}]}, "'messages' must be a non-empty list"),
    ({"messages": [{"role": "user", "content": 5}]}, "'messages' must be a non-empty list")])
def test_malformed_rows_are_refused(row, needle):
    from trainfit.data.dataset import DataError, tokenize_rows
    from trainfit.data.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin-bytes", "micro", "local", 300)
    with pytest.raises(DataError, match=needle):
        tokenize_rows([row], tok, seq_len=16, task="causal-lm", path="d.jsonl")


def test_monitor_does_not_append_to_a_file_that_is_not_its_log(tmp_path):
    from trainfit.monitor.sampler import MonitorError, Sampler

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(MonitorError, match="is not a trainfit monitor log"):
        Sampler(log_path=data, live=False, append=True).open()
    assert data.read_text().count("\n") == 1


def test_report_does_not_write_over_its_input(tmp_path):
    from trainfit.report import make_report
    from trainfit.report.json_fields import ReportInputError

    p = tmp_path / "train.json"
    p.write_text((Path(__file__).parents[1] / "report" / "fixtures" / "train.json").read_text())
    before = p.read_text()
    with pytest.raises(ReportInputError, match="is one of the report's inputs"):
        make_report([str(p)], p)
    assert p.read_text() == before


def test_rows_with_nothing_to_predict(tmp_path):
    """One-token rows have no label token: a micro-batch of them made a 0/0 loss, reported as a
    diverged run with "lower the lr" (an audit). Left out, and said; all of them: refused."""
    from trainfit.data.dataset import DataError, tokenize_rows
    from trainfit.data.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin-bytes", "micro", "local", 300)
    rows = [{"input_ids": [7]}] * 15 + [{"input_ids": [1, 2, 3, 4]}]
    data = tokenize_rows(rows, tok, seq_len=8, task="causal-lm", path="d.jsonl")
    assert data.stats.samples == 1 and "15 of 16 rows have fewer than 2 tokens" in data.stats.notes[0]
    with pytest.raises(DataError, match="every row has fewer than 2 tokens"):
        tokenize_rows([{"input_ids": [7]}] * 4, tok, seq_len=8, task="causal-lm", path="d.jsonl")


def test_chat_rows_chat_templates_render_are_kept():
    """The message check refuses strings and numbers, not what chat templates render: content
    as a list of parts, and null beside an assistant's tool_calls (a review: both refused)."""
    from trainfit.data.dataset import tokenize_rows
    from trainfit.data.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin-bytes", "micro", "local", 300)
    rows = [{"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": None, "tool_calls": [
                              {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                          {"role": "assistant", "content": "yo"}]}]
    assert tokenize_rows(rows, tok, seq_len=64, task="causal-lm", path="d").stats.samples == 2


def test_train_micro_batch_keeps_a_hand_written_files_effective_batch(tmp_path):
    """A file of micro_batch 4 × grad_accum 2 and no effective_batch, trained with
    --micro-batch 2, keeps 8 samples a step (2 × 4), as the help says (it trained at 2 × 1; the
    resume check then refused the README's own --resume --micro-batch 2: a review)."""
    from trainfit.cli.train import _job_of

    f = tmp_path / "hand.yaml"
    f.write_text("model: gpt2\nseq_len: 32\nmicro_batch: 4\ngrad_accum: 2\n")
    job, _ = _job_of(str(f), 2, False, False)
    assert (job.micro_batch, job.grad_accum, job.effective_batch) == (2, 4, 8)


def test_a_commands_json_result_is_not_a_job_file(tmp_path):
    """train.json nests its job: it was read as a job file; plan/tune results were refused as an
    'unknown key kind' with 60 fields listed."""
    for kind, body in (("train", {"job": {"model": "gpt2"}}), ("plan", {"model": "gpt2"})):
        f = tmp_path / f"{kind}.json"
        f.write_text(json.dumps({"kind": kind, **body}))
        with pytest.raises(JobError, match=f"a `trainfit {kind}` result"):
            read_job_file(f)


def test_a_config_of_a_million_layers_is_refused(tmp_path):
    """plan simulated it for minutes with no end in sight (an audit)."""
    from trainfit.model.source import resolve_model

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1_000_000,
        "num_attention_heads": 4, "vocab_size": 300, "intermediate_size": 128}))
    with pytest.raises(JobError, match="num_hidden_layers = 1,000,000: more layers than"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("extra, needle", [
    ("measured: 5", "measured: must be tune's mapping"),
    ("measured: {tokens_per_s: fast}", "measured.tokens_per_s: 'fast' is not a measured number"),
    ("measured: {peak_allocated_bytes: -3}", "measured.peak_allocated_bytes: -3"),
    ("measured: {at: 5}", "measured.at must be a mapping"),
    ("memory_limit: abc", "memory_limit abc: not a size")])
def test_a_hand_edited_file_block_is_refused_when_read(tmp_path, extra, needle):
    """An audit: emit printed measured numbers with format codes and the limit with int(): a
    size string or a hand-edited block ended in a traceback (exit 1)."""
    f = tmp_path / "job.yaml"
    f.write_text(f"model: gpt2\n{extra}\n")
    with pytest.raises(JobError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        read_job_file(f)


def test_emit_reads_a_size_string_memory_limit(tmp_path):
    from trainfit.job.emit import emit
    from trainfit.render.emit import emit_messages

    f = tmp_path / "job.yaml"
    f.write_text("model: gpt2\nmicro_batch: 2\nprecision: bf16-true\ngrad_ckpt: 'off'\n"
                 "memory_limit: 2GiB\nmeasured: {status: ok, tokens_per_s: 5.0}\n")
    fields, extra = read_job_file(f)
    lines = emit_messages(emit(JobSpec(**fields), "hf"), str(f), extra, searched=False, edited=[])
    assert "memory limit 2.00 GiB" in lines[1] and "5 tokens/s (measured)" in lines[1]


@pytest.mark.parametrize("flags, needle", [
    ({"ranks": 5000}, "--ranks 5000: more data-parallel ranks than trainfit plans (4096)"),
    ({"num_workers": 1000}, "more loader processes than trainfit allows (256)")])
def test_a_scripts_flags_out_of_range_are_refused_before_it_runs(flags, needle):
    """A script's flags are checked alone before the script runs (job.fields.check_given): the
    ranks' and workers' limits too (a review: ``plan --ranks 5000 -- python train.py`` recorded
    the script for up to its timeout, then refused the ranks)."""
    from trainfit.job.fields import check_given

    with pytest.raises(JobError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        check_given(flags)
    check_given({"ranks": 4096, "num_workers": 256})
