"""train --backend hf|trl: HF Trainer / TRL SFTTrainer run the same step as the own loop (same
losses, same samples), and keep trainfit's OOM split, interrupt and resume guarantees (fp32, CPU)."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.job import JobError, JobSpec
from trainfit.run.backend import resolve_backend, run_backend
from trainfit.run.hf_backend import run_hf
from trainfit.run.loop import RunOptions, train

runner = CliRunner()


@pytest.fixture()
def job(micro_model_json, chat_jsonl):
    return JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                   precision="fp32", data=str(chat_jsonl))


@pytest.mark.parametrize("backend", ["hf", "trl"])
def test_same_losses_and_samples_through_oom_interrupt_resume(job, tmp_path, backend):
    ref = train(job, RunOptions(out_dir=tmp_path / "ref", max_steps=6, record_samples=True))
    out = tmp_path / backend
    a = run_hf(job, RunOptions(out_dir=out, max_steps=6, record_samples=True,
                               inject_oom_at_steps=(1,), inject_interrupt_at_step=3), backend)
    assert a.interrupted and a.steps == 4
    # the OOM came in the last micro-step: the first micro-step's gradients were dropped and redone
    assert [e.to_dict() for e in a.oom_events] == [{"step": 1, "phase": "step", "micro_batch_before": 4,
                             "micro_batch_after": 2, "grad_accum_after": 4}]
    assert a.checkpoints == [str(out / "checkpoint-4")]
    assert (out / "checkpoint-4" / "model.safetensors").exists()
    # resume at another micro-batch (same effective batch): HF skips the consumed samples; no
    # length given, the checkpoint's (TrainerState.max_steps) and its schedule are kept
    b = run_hf(job.replace(micro_batch=1), RunOptions(out_dir=out, resume=out,
                                                      record_samples=True), backend)
    assert b.resumed_from == str(out / "checkpoint-4") and b.steps == 6
    assert b.losses[:4] == a.losses  # the record holds both segments
    assert b.losses == pytest.approx(ref.losses, rel=1e-6)
    assert [sorted(s) for s in a.samples + b.samples] == [sorted(s) for s in ref.samples]
    d = json.loads((out / "train.json").read_text())
    assert d["job"]["backend"] == backend and d["steps"] == 6
    assert not any("decays to 0" in n for seg in d["segments"] for n in seg.get("notes", []))
    with pytest.raises(JobError, match="already at step 6: no step is left"):
        run_hf(job, RunOptions(out_dir=out, resume=out), backend)


def test_hf_memory_limit_oom_splits(job, tmp_path, limit_between):
    limit = limit_between(job, fits=2, ooms=4)
    ref = train(job.replace(micro_batch=2), RunOptions(out_dir=tmp_path / "r", max_steps=3))
    res = run_hf(job, RunOptions(out_dir=tmp_path / "m", max_steps=3, memory_limit_bytes=limit),
                 "hf")
    assert [e["micro_batch_after"] for e in (x.to_dict() for x in res.oom_events)] == [2]
    assert res.losses == pytest.approx(ref.losses, rel=1e-6)


def test_text_through_hf_equals_own_loop(micro_model_json, text_jsonl, tmp_path):
    job = JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=4, micro_batch=2,
                  precision="fp32", data=str(text_jsonl))
    ref = train(job, RunOptions(out_dir=tmp_path / "ref", max_steps=3))
    res = run_backend(job, RunOptions(out_dir=tmp_path / "auto", max_steps=3), "auto")
    assert res.job["backend"] == "hf"
    assert res.losses == pytest.approx(ref.losses, rel=1e-6)
    assert res.tokens_seen == 3 * 4 * 32
    # packed text has no padding, hence no mask, which TRL's compute_loss requires: it refused
    # the README's own tuned job as "--resume None: Expected 'attention_mask' …" (an audit); an
    # all-ones mask changes no loss
    trl = run_backend(job, RunOptions(out_dir=tmp_path / "trl", max_steps=3), "trl")
    assert trl.losses == pytest.approx(ref.losses, rel=1e-6)


def test_optimizer_in_backward_through_hf_equals_own_loop(micro_model_json, text_jsonl, tmp_path):
    """HF Trainer takes the optimizer stepped in the backward as its optimizer: its own step then
    finds no gradient left, and the losses are the own loop's."""
    job = JobSpec(model=str(micro_model_json), seq_len=32, micro_batch=4, grad_accum=1,
                  precision="fp32", data=str(text_jsonl), optimizer_in_backward=True,
                  max_grad_norm=None)
    ref = train(job, RunOptions(out_dir=tmp_path / "ref", max_steps=3))
    res = run_backend(job, RunOptions(out_dir=tmp_path / "hf", max_steps=3), "hf")
    assert res.losses == pytest.approx(ref.losses, rel=1e-6) and len(res.losses) == 3
    assert res.losses[0] != res.losses[-1]  # it trained


def test_backend_choice():
    assert resolve_backend("auto", "causal-lm", "chat") == "trl"
    assert resolve_backend("auto", "causal-lm", "text") == "hf"
    assert resolve_backend("auto", "custom-lm", "text") == "trainfit"
    with pytest.raises(JobError, match="module:factory"):
        resolve_backend("hf", "custom-lm", "text")
    with pytest.raises(JobError, match="only causal-LM"):
        resolve_backend("trl", "seq2seq-lm", "text")
    with pytest.raises(JobError, match="unknown"):
        resolve_backend("deepspeed", "causal-lm", "text")


def test_cli_backend_from_file_and_bad_input(job, tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({**job.to_dict(), "backend": "trl"}))
    out = tmp_path / "run"
    r = runner.invoke(app, ["train", str(f), "--out", str(out), "--max-steps", "2", "--json"])
    assert r.exit_code == 0, r.output
    # stdout alone: transformers' own warnings (stderr, "{'eos_token_id': …}") are quieted only
    # by main(), which a test that ran before in this worker may or may not have called
    d = json.loads(r.stdout[r.stdout.index("{"):])
    assert d["job"]["backend"] == "trl" and d["steps"] == 2 and len(d["losses"]) == 2
    assert (out / "checkpoint-2" / "trainer_state.json").exists()
    r = runner.invoke(app, ["train", str(f), "--backend", "nope", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown" in r.output
    assert not (tmp_path / "x").exists()
    # a directory without HF checkpoints: refused before anything is written
    empty = tmp_path / "empty"
    empty.mkdir()
    r = runner.invoke(app, ["train", str(f), "--backend", "hf", "--out", str(tmp_path / "y"),
                            "--resume", str(empty)])
    assert r.exit_code == 2 and "no complete HF checkpoint" in r.output
    assert not (tmp_path / "y").exists()


def test_custom_module_refused_by_hf(tmp_path):
    spec = f"{Path(__file__).parents[2] / 'examples' / 'custom' / 'tiny_gpt.py'}:build_model"
    job = JobSpec(model=spec, seq_len=16, effective_batch=2, micro_batch=2, precision="fp32",
                  data="unused.jsonl")
    with pytest.raises(JobError, match="module:factory"):
        run_backend(job, RunOptions(out_dir=tmp_path / "c", max_steps=1), "hf")


def test_hf_two_ranks_gloo_match_one_rank(job, tmp_path):
    """torchrun, 2 CPU ranks (gloo; accelerate's DDP inside HF Trainer): the global losses equal
    one rank's with the same effective batch, and each step's samples are the same."""
    import subprocess
    import sys

    one = train(job.replace(micro_batch=2), RunOptions(out_dir=tmp_path / "one", max_steps=3,
                                                       record_samples=True))
    p = tmp_path / "job2.yaml"
    p.write_text(yaml.safe_dump({**job.replace(ranks=2, micro_batch=2).to_dict(), "backend": "hf"}))
    out = tmp_path / "two"
    proc = subprocess.run([sys.executable, "-m", "trainfit.cli.main", "train", str(p), "--out",
                           str(out), "--max-steps", "3", "--nproc", "2", "--no-live"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads((out / "train.json").read_text())
    assert d["job"]["backend"] == "hf" and d["samples_seen"] == 24
    assert d["losses"] == pytest.approx(one.losses, rel=1e-5)


def test_hf_evaluation_equals_own_loop(job, tmp_path):
    """The same evaluation code at the same moments: 8 of 24 samples held out (16 left: epochs of
    whole steps, where both backends draw the same samples), every 2 steps and at the end; an
    injected evaluation OOM lowers the evaluation batch only."""
    kw = {"max_steps": 3, "eval_fraction": 0.3, "eval_every_steps": 2, "record_samples": True}
    ref = train(job, RunOptions(out_dir=tmp_path / "ref", **kw))
    res = run_hf(job, RunOptions(out_dir=tmp_path / "hf", inject_eval_oom_at_steps=(2,), **kw),
                 "hf")
    assert [e["step"] for e in res.evals] == [e["step"] for e in ref.evals] == [2, 3]
    assert [e["eval_loss"] for e in res.evals] == pytest.approx([e["eval_loss"] for e in ref.evals],
                                                                rel=1e-6)
    assert res.losses == pytest.approx(ref.losses, rel=1e-6)
    events = [x.to_dict() for x in res.oom_events]
    assert [(e["phase"], e["eval_batch_after"]) for e in events] == [("eval", 2)]
    assert res.evals[-1]["eval_batch"] == 2
    # the held-out samples are never trained on, in the file's numbering
    assert sorted(i for s in res.samples for i in s) == sorted(i for s in ref.samples for i in s)


def test_hf_checkpoints_are_verified_before_the_trainer_loads_them(tmp_path):
    """The trainers' checkpoint-N get digests.json at each save (on_save); a resume verifies them:
    a flipped bit names the file and offers the newest intact one; a newer incomplete checkpoint
    (no digests: its save was cut) is passed over with a note."""
    from trainfit.run.checkpoint import write_digests
    from trainfit.run.hf_checkpoint import last_checkpoint

    for n in (2, 4):
        ck = tmp_path / f"checkpoint-{n}"
        ck.mkdir()
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": n}))
        (ck / "model.safetensors").write_bytes(bytes(range(256)) * 8)
        write_digests(ck)
    (tmp_path / "checkpoint-6").mkdir()  # a save that did not finish
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text("{}")
    ck, note = last_checkpoint(tmp_path)
    assert ck == str(tmp_path / "checkpoint-4") and "checkpoint-6 is incomplete" in note
    raw = bytearray((tmp_path / "checkpoint-4" / "model.safetensors").read_bytes())
    raw[100] ^= 4
    (tmp_path / "checkpoint-4" / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(JobError, match=r"model\.safetensors: damaged") as info:
        last_checkpoint(tmp_path / "checkpoint-4")
    assert info.value.hint.endswith(str(tmp_path / "checkpoint-2"))
    # the run directory: the finished checkpoint's damage is the same error, not a silent step
    # back past it (an audit)
    with pytest.raises(JobError, match=r"checkpoint-4/model\.safetensors: damaged") as info:
        last_checkpoint(tmp_path)
    assert info.value.hint.endswith(str(tmp_path / "checkpoint-2"))


def test_hf_keep_last_and_training_on_from_a_finished_run(job, tmp_path):
    """A review of --keep-last and of the finished-run rate, on the HF backend: HF's
    save_total_limit removes the older checkpoints, which the record no longer lists; a finished
    run trained on takes the new schedule's rate at its first step (the checkpoint's is 0)."""
    from safetensors.torch import load_file

    out = tmp_path / "h"
    a = run_hf(job, RunOptions(out_dir=out, max_steps=3, save_every_steps=1, keep_last=1), "hf")
    assert [Path(c).name for c in a.checkpoints] == ["checkpoint-3"]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    b = run_hf(job, RunOptions(out_dir=out, resume=out, max_steps=5, save_every_steps=1), "hf")
    assert b.steps == 5
    w3 = load_file(str(out / "checkpoint-3" / "model.safetensors"))
    w4 = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    assert max((w4[k] - w3[k]).abs().max().item() for k in w3) > 0
    notes = [n for s in b.segments for n in s.get("notes", [])]
    assert any("the checkpoint's run ended at step 3" in n for n in notes), notes


def test_a_checkpoint_is_resumed_by_the_backend_that_wrote_it(job, tmp_path):
    """Each backend's checkpoint handed to the other: a TypeError from HF's TrainerState, and
    "belongs to another model" for the same model, before (an audit); now it is said which wrote
    it, and nothing is written."""
    own, hf = tmp_path / "own", tmp_path / "hf"
    train(job, RunOptions(out_dir=own, max_steps=2, save_every_steps=2))
    run_hf(job, RunOptions(out_dir=hf, max_steps=2), "hf")
    with pytest.raises(JobError, match="written by trainfit's own loop"):
        run_hf(job, RunOptions(out_dir=tmp_path / "a", resume=own, max_steps=4), "hf")
    with pytest.raises(JobError, match=r"written by train --backend hf\|trl"):
        train(job, RunOptions(out_dir=tmp_path / "b", resume=hf, max_steps=4))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_hf_backend_fits_torchs_threads_on_a_busy_host(job, tmp_path, monkeypatch):
    """An audit: --backend hf ran 2× slower than the own loop beside a busy neighbour, silently;
    it lowers torch's pool as the loop does, says so, and gives the threads back."""
    import torch

    import trainfit.run.hf_backend as hf
    from trainfit.run.backend import run_backend
    from trainfit.run.loop import RunOptions

    before = torch.get_num_threads()

    def busy_and_fitted(window_s):
        torch.set_num_threads(1)  # as threads_for_load does
        return 1, before, 1.4, 2

    monkeypatch.setattr(hf, "threads_for_load", busy_and_fitted)
    res = run_backend(job, RunOptions(out_dir=tmp_path / "r", max_steps=1), "hf")
    assert torch.get_num_threads() == before
    assert any("other processes used 1.4 of 2 CPU cores" in n for n in res.notes)
