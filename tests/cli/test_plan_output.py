"""plan's output: attention by model, the header, the breakdown, the legends, the link."""

import json

import pytest
from typer.testing import CliRunner

from trainfit.cli.main import app

runner = CliRunner()


def _tiny_gemma2(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({
        "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 256,
        "layer_types": ["sliding_attention", "full_attention"]}))
    return p


def test_a_model_without_sdpa_is_planned_with_its_eager_attention(tmp_path):
    """Gemma-2 (and gpt-oss, Mamba, BLOOM ...) have no SDPA in transformers: the default
    attention falls back to eager, said; an explicit --attention sdpa is one clear error."""
    cfg = _tiny_gemma2(tmp_path)
    args = ["plan", str(cfg), "--gpu", "generic-1gb", "--micro-batch", "2", "--seq-len", "64",
            "--precision", "bf16-true", "--grad-ckpt", "off", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # (the table form says it on stderr too)
    assert out["assumptions"]["attention"] == "eager"
    assert out["configs"][0]["peak_allocated_bytes"] > 0
    res = runner.invoke(app, [*args, "--attention", "sdpa"])
    assert res.exit_code == 2
    assert "has no SDPA implementation" in res.stderr and "--attention eager" in res.stderr


def test_default_attention_is_shared_by_plan_tune_and_train(tmp_path):
    """cli.jobargs.default_attention: the default falls back to eager on a model without SDPA,
    a given attention is kept, a model with SDPA keeps it, the user's own module is not
    imported to find out."""
    from trainfit.cli.jobargs import default_attention
    from trainfit.job import JobSpec

    cfg = str(_tiny_gemma2(tmp_path))
    said = []
    job = JobSpec(model=cfg, seq_len=64)
    assert default_attention(job, {"model": cfg}, said.append).attention == "eager"
    assert said and "no SDPA implementation" in said[0]
    assert default_attention(job, {"model": cfg, "attention": "sdpa"}).attention == "sdpa"
    llama = JobSpec(model="llama-3.2-1b", seq_len=64)
    assert default_attention(llama, {"model": "llama-3.2-1b"}).attention == "sdpa"
    own = JobSpec(model="nowhere_module:build", seq_len=64)
    assert default_attention(own, {"model": own.model}).attention == "sdpa"


def test_the_breakdown_line_sums_to_the_allocated_peak_and_names_managed_memory_apart():
    """A paged optimizer's states live in CUDA managed memory, outside the allocator: listed
    among the terms, the line summed to more than the allocated peak it is 'at'."""
    r = runner.invoke(app, ["plan", "llama-tiny-58m", "--gpu", "a10g", "--method", "full",
                            "--optimizer", "paged-adamw", "--micro-batch", "1", "--grad-accum",
                            "1", "--seq-len", "64", "--precision", "bf16-true", "--grad-ckpt",
                            "off"])
    assert r.exit_code == 0, r.output
    line = " ".join(r.output.split("breakdown at the allocated peak")[1].split("\n  ·")[0].split())
    terms, beside = line.split("; beside it, outside PyTorch's allocator: ")
    assert "managed" not in terms and beside.startswith("managed 0.44 (paged optimizer states")


def test_the_header_says_the_accumulation_every_row_has_without_an_effective_batch():
    r = runner.invoke(app, ["plan", "llama-tiny-58m", "--gpu", "a10g", "--seq-len", "64",
                            "--grad-accum", "4", "--precision", "bf16-true", "--grad-ckpt", "off"])
    assert r.exit_code == 0, r.output
    assert "effective batch not given (= micro-batch × 4 × ranks per row)" in " ".join(
        r.output.split())


def test_a_plan_without_any_speed_does_not_say_it_ranked_by_speed():
    """Two GeForce cards (no PCIe peer-to-peer): no row has a tokens/s, so the notes say what the
    pick preferred instead of 'ranked by predicted tokens/s'."""
    r = runner.invoke(app, ["plan", "llama-tiny-58m", "--gpu", "rtx-3080", "--ranks", "2",
                            "--seq-len", "64", "--micro-batch", "1", "--grad-accum", "1",
                            "--precision", "bf16-true", "--grad-ckpt", "off"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "ranked by predicted tokens/s" not in text
    assert "no row has a predicted tokens/s, so the pick" in text


@pytest.mark.parametrize("gpu", ["generic-0gb", "generic--1gb"])
def test_a_generic_card_without_a_size_is_one_clear_line(gpu):
    r = runner.invoke(app, ["plan", "gpt2", "--gpu", gpu])
    assert r.exit_code == 2
    assert f"--gpu {gpu}: a generic card is generic-<N>gb" in r.output


def test_the_spare_legend_names_the_fit_line_the_spare_is_measured_from():
    """With --margin 0 the line is GPU ÷ (1 + error band), not 100 % of the GPU."""
    r = runner.invoke(app, ["plan", "llama-tiny-58m", "--gpu", "a10g", "--seq-len", "64",
                            "--micro-batch", "1", "--grad-accum", "1", "--precision", "bf16-true",
                            "--grad-ckpt", "off", "--margin", "0", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    row = d["configs"][0]
    text = runner.invoke(app, ["plan", "llama-tiny-58m", "--gpu", "a10g", "--seq-len", "64",
                               "--micro-batch", "1", "--grad-accum", "1", "--precision",
                               "bf16-true", "--grad-ckpt", "off", "--margin", "0"]).output
    line_bytes = row["headroom_bytes"] + row["peak_device_bytes"]
    band = row["error_band_under"]
    assert band > 0  # below the GPU: the band's line, whatever bands.json now measures
    assert line_bytes == pytest.approx(d["gpu_memory_bytes"] / (1 + band), abs=2**20)
    assert f"fit line ({line_bytes / d['gpu_memory_bytes']:.0%} of the GPU: GPU ÷ (1 + its" \
        in " ".join(text.split())


def test_an_interconnect_for_one_rank_is_refused():
    r = runner.invoke(app, ["plan", "gpt2", "--gpu", "t4", "--interconnect", "nvlink4"])
    assert r.exit_code == 2 and "--interconnect nvlink4 with 1 rank" in r.output


def test_two_models_are_not_run_as_a_command():
    r = runner.invoke(app, ["plan", "gpt2", "gpt2-medium", "--gpu", "t4"])
    assert r.exit_code == 2 and "gpt2 gpt2-medium: plan takes one model or job file" in r.output
    # a switch given a value leaves the value as a second target: said as that (an audit)
    r = runner.invoke(app, ["plan", "gpt2", "--gpu", "t4", "--trl-logprob-head", "true"])
    assert r.exit_code == 2 and "true: a switch takes no value" in r.output


def test_a_measured_link_is_taken_with_or_without_its_unit():
    """The README writes `--interconnect 2.7GB/s`; it was refused as an unknown interconnect."""
    from trainfit.cli.gpu_arg import with_interconnect
    from trainfit.hardware.gpus import find_gpu

    gpu = find_gpu("rtx-3090")
    for given in ("2.7", "2.7GB/s", "2.7 GB/s", "2.7gbps"):
        assert with_interconnect(gpu, given).interconnect == "2.7 GB/s measured (given)", given
