"""train's evaluation: a token-weighted eval loss that no eval batch size, rank count or OOM redo
changes; an OOM in evaluation lowers the evaluation batch only (fp32, CPU)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.data.load import load_data
from trainfit.data.loader import SampleOrder, label_count, make_loader, micro_batch_ids, step_weights
from trainfit.engine.step import train_step
from trainfit.job import JobError, JobSpec
from trainfit.memory.limit import LimitTracker
from trainfit.memory.tracker import PeakSnapshot
from trainfit.model.runtime import build_real
from trainfit.model.source import resolve_model
from trainfit.run import evaluate as ev
from trainfit.run.loop import RunOptions, train

runner = CliRunner()
CPU = torch.device("cpu")


@pytest.fixture()
def job(micro_model_json, chat_jsonl):
    # chat rows: padded, of different lengths (7..37 label tokens) — the token weighting matters
    return JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                   precision="fp32", data=str(chat_jsonl))


def _workload(job):
    src = resolve_model(job.model)
    return src, load_data(job, src), build_real(job, src, CPU, seed=job.seed, lr=job.lr)


def test_eval_loss_exact_across_eval_batches_and_ln_vocab(job, tmp_path, one_thread):
    src, data, wl = _workload(job)
    res = {b: ev.evaluate(wl.model, data, task=src.task, batch=b, step=0, device=CPU)
           for b in (1, 2, 4, 24)}
    assert wl.model.training  # the mode is restored
    tokens = sum(label_count(data, i, src.task) for i in range(len(data)))
    assert {r.tokens for r in res.values()} == {tokens} and {r.samples for r in res.values()} == {24}
    # Σ mean × label tokens: the same number for any batch size (measured: ≤ 5.1e-7 apart)
    for b in (2, 4, 24):
        assert res[b].eval_loss == pytest.approx(res[1].eval_loss, rel=1e-6, abs=0)
    assert res[4].eval_perplexity == pytest.approx(math.exp(res[4].eval_loss))
    # the mean of per-batch means (HF Trainer's) moves with the batch size: at batch 1 it is
    # 1.4e-4 away here, 100× the tolerance above, even on an untrained model
    per_sample = [ev.evaluate(wl.model, ev.subset(data, [i]), task=src.task, batch=1, step=0,
                              device=CPU).eval_loss for i in range(len(data))]
    assert abs(float(np.mean(per_sample)) - res[1].eval_loss) > 1e-5

    # untrained: logits ≈ N(0, σ²) with σ ≈ 0.02 (init std) × √64 (after RMSNorm) ≈ 0.16, so the
    # loss is ln V + σ²/2 (≈ ln 300 + 0.013) up to the labels' own logits, whose mean over ~1000
    # uniformly random labels scatters by σ/√1000 ≈ 0.005: tolerance 0.03 (6 of those).
    rng = np.random.default_rng(0)
    p = tmp_path / "random.jsonl"
    p.write_text("".join(json.dumps({"input_ids": rng.integers(0, 256, 32).tolist()}) + "\n"
                         for _ in range(32)))
    rand = load_data(job.replace(data=str(p)), src)
    with torch.no_grad():
        sigma = float(wl.model(input_ids=torch.as_tensor(np.stack(rand.input_ids))).logits.std())
    assert 0.12 < sigma < 0.2
    r = ev.evaluate(wl.model, rand, task=src.task, batch=8, step=0, device=CPU)
    vocab = int(src.config.vocab_size)
    assert r.tokens == 32 * 31
    assert r.eval_loss == pytest.approx(math.log(vocab) + sigma ** 2 / 2, abs=0.03)
    assert abs(r.eval_loss - math.log(vocab)) < 0.05


def test_injected_eval_oom_halves_the_eval_batch_only(job, tmp_path, chat_jsonl, one_thread):
    none = train(job, RunOptions(out_dir=tmp_path / "none", max_steps=3))
    ref = train(job, RunOptions(out_dir=tmp_path / "ref", max_steps=3, eval_data=chat_jsonl,
                                eval_every_steps=2))
    inj = train(job, RunOptions(out_dir=tmp_path / "inj", max_steps=3, eval_data=chat_jsonl,
                                eval_every_steps=2, inject_eval_oom_at_steps=(2,)))
    # the OOM hit the last batch (samples 20..23) of the eval at step 2: redone from it at batch 2
    assert [e.to_dict() for e in inj.oom_events] == [{"step": 2, "phase": "eval", "eval_batch_before": 4,
                               "eval_batch_after": 2, "redone_from_sample": 20}]
    assert [(e["step"], e["eval_batch"]) for e in ref.evals] == [(2, 4), (3, 4)]  # + the end
    assert [(e["step"], e["eval_batch"]) for e in inj.evals] == [(2, 2), (3, 2)]  # stays lowered
    # training untouched: same micro-batch, bit-identical losses, with or without evaluation
    assert inj.losses == ref.losses == none.losses
    state = json.loads((Path(inj.checkpoints[-1]) / "trainer_state.json").read_text())
    assert (state["micro_batch"], state["grad_accum"]) == (4, 2)
    for a, b in zip(inj.evals, ref.evals, strict=True):
        assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-6, abs=0)
        assert (a["samples"], a["tokens"]) == (b["samples"], b["tokens"]) == (24, 738)
    # train.json and monitor.jsonl carry every evaluation
    d = json.loads((tmp_path / "inj" / "train.json").read_text())
    assert d["evals"] == inj.evals
    rows = [json.loads(x) for x in (tmp_path / "inj" / "monitor.jsonl").read_text().splitlines()]
    logged = [(r["eval_step"], r["eval_loss"], r["eval_batch"]) for r in rows if "eval_step" in r]
    assert logged == [(e["step"], e["eval_loss"], e["eval_batch"]) for e in inj.evals]


def _measured_peaks(job, eval_batches):
    """Peak live tensor bytes (the CPU limit's own tracker) of 2 training steps, then of an
    evaluation at each batch size, on the state those steps leave (weights, AdamW's states)."""
    src, data, wl = _workload(job)
    tracker = LimitTracker(None)
    for t in [*wl.model.parameters(), *wl.model.buffers()]:
        tracker.track(t, "parameters")
    order, eff, micro = SampleOrder(len(data), seed=job.seed), job.effective_batch, job.micro_batch
    for s in range(2):
        def batches(pos=s * eff):
            for b in make_loader(data, src.task, micro_batch_ids(order, pos, eff, micro)):
                b.pop("sample_ids")
                for v in b.values():
                    tracker.track(v, "buffers")
                yield b
        with tracker:
            train_step(wl.model, wl.optimizer, batches(), grad_accum=eff // micro,
                       loss_weights=step_weights(data, order, s * eff, eff, micro, src.task))
    peaks = {"train": tracker.peak.peak_bytes}
    for b in eval_batches:
        tracker.peak = PeakSnapshot(tracker.current_bytes)
        ev.evaluate(wl.model, data, task=src.task, batch=b, step=2, device=CPU, tracker=tracker)
        peaks[b] = tracker.peak.peak_bytes
    return peaks


def test_real_memory_limit_oom_in_eval_only(job, tmp_path, chat_jsonl, one_thread):
    """A limit between what training at micro-batch 1 (and eval at 8) needs and what eval at 16
    needs (16 × 32 × 300 fp32 logits, twice with the log-softmax): only the eval runs out."""
    job1 = job.replace(micro_batch=1)
    peaks = _measured_peaks(job1, (16, 8))
    fits = max(peaks["train"], peaks[8])
    assert peaks[16] > fits + 100_000  # measured: 2.83 MB vs 2.43 MB (train), 2.14 MB (eval at 8)
    limit = (fits + peaks[16]) // 2
    ref = train(job1, RunOptions(out_dir=tmp_path / "r", max_steps=2, eval_data=chat_jsonl,
                                 eval_batch=16))
    res = train(job1, RunOptions(out_dir=tmp_path / "m", max_steps=2, eval_data=chat_jsonl,
                                 eval_batch=16, memory_limit_bytes=limit))
    assert [e.to_dict() for e in res.oom_events] == [{"step": 2, "phase": "eval", "eval_batch_before": 16,
                               "eval_batch_after": 8, "redone_from_sample": 0}]
    assert res.losses == pytest.approx(ref.losses, rel=1e-6)
    assert res.evals[0]["eval_batch"] == 8
    assert res.evals[0]["eval_loss"] == pytest.approx(ref.evals[0]["eval_loss"], rel=1e-6, abs=0)
    # an OOM at eval batch 1: a clear error, not a crash or a loop
    with pytest.raises(JobError, match="evaluation at step 1 with eval batch 1") as err:
        train(job1, RunOptions(out_dir=tmp_path / "x", max_steps=1, eval_data=chat_jsonl,
                               eval_batch=1, inject_eval_oom_at_steps=(1,)))
    assert "seq-len" in err.value.hint


def test_held_out_fraction_is_never_trained(job, tmp_path, one_thread):
    res = train(job, RunOptions(out_dir=tmp_path / "h", max_steps=4, eval_fraction=0.25,
                                record_samples=True))
    src = resolve_model(job.model)
    data = load_data(job, src)
    _, held, train_ids, eval_ids = ev.hold_out(data, 0.25, job.seed, src.task)
    assert len(eval_ids) == 6 and sorted(train_ids + eval_ids) == list(range(24))
    trained = [i for step in res.samples for i in step]
    assert len(trained) == 32 and set(trained) == set(train_ids)  # 18 samples, 2 epochs' worth
    assert not set(trained) & set(eval_ids)
    assert res.evals[-1]["step"] == 4 and res.evals[-1]["samples"] == 6
    assert res.evals[-1]["tokens"] == sum(label_count(held, i, src.task) for i in range(6))
    # by the seed alone
    assert ev.hold_out(data, 0.25, job.seed, src.task)[3] == eval_ids
    assert ev.hold_out(data, 0.25, job.seed + 1, src.task)[3] != eval_ids
    # one sample cannot be split: said so (the hint was "a fraction below 0": an audit)
    with pytest.raises(JobError) as err:
        ev.hold_out(ev.subset(data, [0]), 0.5, job.seed, src.task)
    assert err.value.hint == "one sample cannot be split: give --eval-data FILE, or more data"


def test_cli_eval_bad_input_and_summary(job, tmp_path, chat_jsonl):
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job.to_dict()))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out = tmp_path / "o"
    for args, says in [
        (["--eval-data", str(empty)], "--eval-data"),
        (["--eval-data", str(tmp_path / "nope.jsonl")], "no such file"),
        (["--eval-fraction", "1.5"], "between 0 and 1"),
        (["--eval-fraction", "0"], "between 0 and 1"),
        (["--eval-fraction", "0.99"], "leaves none to train on"),
        (["--eval-fraction", "0.1", "--eval-data", str(chat_jsonl)], "both given"),
        (["--eval-data", str(chat_jsonl), "--eval-every", "0"], "--eval-every 0"),
        (["--eval-data", str(chat_jsonl), "--eval-batch", "0"], "--eval-batch 0"),
        (["--eval-every", "5"], "without an evaluation set"),
    ]:
        res = runner.invoke(app, ["train", str(p), "--out", str(out), "--max-steps", "1", *args])
        assert res.exit_code == 2, (args, res.output)
        errors = [x for x in res.output.splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and says in errors[0], (args, res.output)
        assert not out.exists()  # nothing written
    res = runner.invoke(app, ["train", str(p), "--out", str(out), "--max-steps", "2", "--no-live",
                              "--eval-fraction", "0.25", "--eval-batch", "2"])
    assert res.exit_code == 0, res.output
    assert "eval at step 2: loss " in res.output and "(6 samples" in res.output


def test_two_ranks_gloo_same_eval_loss(job, tmp_path):
    """torchrun, 2 CPU ranks (gloo): the eval set sharded 2 + 3 (one rank runs a dropped filler
    batch), sums all-reduced; an injected eval OOM taken by both ranks together; the same eval
    losses as 1 rank."""
    kw = {"eval_fraction": 0.2, "eval_every_steps": 2, "eval_batch": 2}
    one = train(job.replace(micro_batch=2), RunOptions(out_dir=tmp_path / "one", max_steps=3, **kw))
    p = tmp_path / "job2.yaml"
    p.write_text(yaml.safe_dump(job.replace(ranks=2, micro_batch=2).to_dict()))
    out = tmp_path / "two"
    proc = subprocess.run([sys.executable, "-m", "trainfit.cli.main", "train", str(p), "--out",
                           str(out), "--max-steps", "3", "--nproc", "2", "--no-live",
                           "--eval-fraction", "0.2", "--eval-every", "2", "--eval-batch", "2",
                           "--inject-eval-oom-at", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads((out / "train.json").read_text())
    assert d["losses"] == pytest.approx(one.losses, rel=1e-5)
    assert [e["eval_batch_after"] for e in d["oom_events"]] == [1]
    assert [(e["step"], e["samples"], e["tokens"]) for e in d["evals"]] == \
        [(e["step"], e["samples"], e["tokens"]) for e in one.evals]
    assert [e["samples"] for e in one.evals] == [5, 5]
    for a, b in zip(d["evals"], one.evals, strict=True):
        assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-5)


def test_an_evaluation_an_interrupt_skipped_runs_at_the_resume(job, tmp_path):
    """An interrupt at an evaluation step skips the evaluation (the run leaves promptly); the
    resume at that step runs it (an audit: the point was lost, unsaid)."""
    kw = {"eval_fraction": 0.25, "eval_every_steps": 2}
    full = train(job, RunOptions(out_dir=tmp_path / "full", max_steps=6, **kw))
    out = tmp_path / "cut"
    cut = train(job, RunOptions(out_dir=out, max_steps=6, inject_interrupt_at_step=3, **kw))
    assert cut.interrupted and cut.steps == 4 and [e["step"] for e in cut.evals] == [2]
    res = train(job, RunOptions(out_dir=out, max_steps=6, resume=out, **kw))
    assert [e["step"] for e in res.evals] == [e["step"] for e in full.evals] == [2, 4, 6]
    for a, b in zip(res.evals, full.evals, strict=True):
        assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-6)
