"""``--model module:factory``: the user's own nn.Module (seed 003) is planned, measured and trained
through the same step as a transformers model."""

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.job import JobError, JobSpec
from trainfit.memory.cpu_truth import measure_cpu_step
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.source import resolve_model

ROOT = Path(__file__).resolve().parents[2]
SPEC = f"{ROOT / 'examples/custom/tiny_gpt.py'}:build_model"
TEXT = ROOT / "examples/data/tiny_text.jsonl"


@pytest.fixture(scope="module")
def source():
    return resolve_model(SPEC)


def test_the_module_is_described_from_its_layers(source):
    cfg = source.config
    assert source.task == "custom-lm" and source.origin == "custom"
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (512, 128, 4)
    assert cfg.max_position_embeddings == 256  # from the `pos` embedding
    # no gradient_checkpointing_enable(): plan's "off"-only rows say why (an audit)
    assert not cfg.supports_grad_ckpt and "checkpointing is planned off only" in source.note


@pytest.mark.parametrize("kw", [
    {"method": "full", "micro_batch": 2, "grad_ckpt": "off"},
    {"method": "full", "micro_batch": 4, "grad_accum": 2, "optimizer_impl": "foreach"},
    {"method": "lora", "micro_batch": 4, "lora_targets": "all-linear"},
])
def test_predicted_peak_matches_the_cpu_step_within_1_percent(source, kw):
    job = JobSpec(model=SPEC, seq_len=64, precision="fp32", **kw)
    sim = simulate_step(job, source, SimTarget(device="cpu"))
    real = measure_cpu_step(job, source)
    assert real.peak_allocated_bytes > real.base_bytes
    assert sim.peak_allocated_bytes == pytest.approx(real.peak_allocated_bytes, rel=0.01)


def test_the_modules_own_checkpointing_picks_its_mode(source):
    job = JobSpec(model=SPEC, seq_len=64, micro_batch=2, grad_ckpt="full", ckpt_reentrant=True)
    with pytest.raises(JobError, match="picks its checkpointing mode") as err:
        simulate_step(job, source, SimTarget(device="cpu"))
    assert err.value.hint == "drop --ckpt-reentrant"


def test_fp32_outputs_upcast_what_the_module_returns(source):
    """``--fp32-outputs`` on a user's own module: the adapter upcasts the logits it returns, and
    the simulation holds the same bytes as the CPU step (the copy a held output keeps)."""
    kw = {"method": "full", "micro_batch": 2, "seq_len": 64, "precision": "bf16-true",
          "output_in_backward": True, "max_grad_norm": None}
    plain, fp32 = JobSpec(model=SPEC, **kw), JobSpec(model=SPEC, **kw, fp32_outputs=True)
    sim = [simulate_step(j, source, SimTarget(device="cpu")).peak_allocated_bytes
           for j in (plain, fp32)]
    real = measure_cpu_step(fp32, source)
    assert sim[1] == pytest.approx(real.peak_allocated_bytes, rel=0.01)
    assert sim[1] - sim[0] >= 2 * 2 * 64 * source.config.vocab_size  # +2 B per held logit


def test_train_runs_it_and_the_first_loss_is_that_of_a_uniform_guess(tmp_path):
    from trainfit.run.loop import RunOptions, train

    job = JobSpec(model=SPEC, seq_len=64, micro_batch=2, grad_accum=2, precision="fp32",
                  data=str(TEXT), lr=3e-3)
    res = train(job, RunOptions(out_dir=tmp_path / "run", max_steps=8))
    assert res.steps == 8
    # random init: logits near zero, so the first loss is ln(vocab) (within init noise)
    assert res.losses[0] == pytest.approx(math.log(512), abs=0.3)
    assert res.losses[-1] < res.losses[0] - 0.5  # it learns


def test_plan_cli_answers_for_a_custom_module(tmp_path):
    import json

    r = CliRunner().invoke(app, ["plan", "--model", SPEC, "--gpu", "t4", "--seq-len", "128",
                                 "--micro-batch", "4", "--grad-ckpt", "off", "--precision",
                                 "amp-fp16", "--json"])
    assert r.exit_code == 0, r.output
    cfg = json.loads(r.stdout)["configs"][0]
    assert cfg["fits"] is True and cfg["peak_allocated_bytes"] > 0


@pytest.mark.parametrize("spec, says", [
    ("examples/custom/nope.py:build_model", "does not exist"),
    (f"{ROOT / 'examples/custom/tiny_gpt.py'}:missing", "has no callable missing"),
    (f"{ROOT / 'examples/custom/tiny_gpt.py'}:Block", "needs arguments"),
    ("no_such_module_xyz:build", "cannot import"),
])
def test_bad_factories_say_what_to_fix(spec, says):
    with pytest.raises(JobError, match=says):
        resolve_model(spec)
    r = CliRunner().invoke(app, ["plan", "--model", spec, "--gpu", "t4", "--seq-len", "64",
                                 "--micro-batch", "1"])
    assert r.exit_code == 2 and says in r.output
