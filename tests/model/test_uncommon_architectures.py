"""Architectures an audit tried beyond the catalog: each plans, or is refused with what to do,
never a traceback (configs built with transformers' own classes, no download)."""

from __future__ import annotations

import pytest
import transformers as T

from trainfit.job import JobError, JobSpec
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.source import resolve_model


def _saved(tmp_path, cfg) -> str:
    cfg.to_json_file(tmp_path / "config.json")
    return str(tmp_path / "config.json")


def test_a_config_with_a_non_finite_float_reads(tmp_path):
    """transformers writes Mamba-2's time_step_limit (0, inf) as {"__float__": "Infinity"} and
    reads it back so; trainfit's plain json.loads left the object, refused by the validator."""
    path = _saved(tmp_path, T.Mamba2Config(hidden_size=64, num_hidden_layers=2, vocab_size=256,
                                           num_heads=4, head_dim=32, state_size=16, n_groups=1,
                                           chunk_size=32))
    assert '"__float__"' in (tmp_path / "config.json").read_text()
    assert resolve_model(path).config.time_step_limit[1] == float("inf")


def test_peft_refusing_targets_is_said_with_the_fix(tmp_path):
    """An MoE's expert parameters take no LoRA dropout in peft: --lora-dropout 0 (a traceback)."""
    path = _saved(tmp_path, T.Qwen3MoeConfig(hidden_size=64, intermediate_size=128,
                                             moe_intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             num_experts=4, num_experts_per_tok=2,
                                             vocab_size=256))
    src = resolve_model(path)
    job = JobSpec(model=path, method="lora", lora_targets="all-linear", seq_len=32,
                  micro_batch=1, precision="fp32")
    with pytest.raises(JobError, match="peft refuses them for qwen3_moe") as err:
        simulate_step(job, src, SimTarget(device="cpu"))
    assert err.value.hint == "--lora-dropout 0"
    ok = simulate_step(job.replace(lora_dropout=0.0), src, SimTarget(device="cpu"))
    assert ok.peak_allocated_bytes > 0


def test_jamba_qlora_runs_its_4bit_modules(tmp_path):
    """Jamba reads config._is_quantized (set by transformers' quantizer) to call dt_proj rather
    than multiply by its packed weight: unset, QLoRA ended in a dtype error."""
    path = _saved(tmp_path, T.JambaConfig(hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=256, num_experts=2,
                                          num_experts_per_tok=1, expert_layer_period=2,
                                          expert_layer_offset=1, attn_layer_period=2,
                                          attn_layer_offset=1, mamba_d_state=8,
                                          mamba_dt_rank=8, use_mamba_kernels=False))
    job = JobSpec(model=path, method="qlora", seq_len=32, micro_batch=1, precision="amp-bf16")
    sim = simulate_step(job, resolve_model(path), SimTarget(device="cuda"))
    assert sim.peak_allocated_bytes > 0


def test_mamba_all_linear_leaves_out_what_peft_refuses(tmp_path):
    """peft refuses LoRA on Mamba's out_proj and conv1d: all-linear adapts the rest, and the
    hint for a Mamba job without targets no longer suggests out_proj (which then raised)."""
    path = _saved(tmp_path, T.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=256,
                                          state_size=8))
    src = resolve_model(path)
    job = JobSpec(model=path, method="lora", lora_targets="all-linear", seq_len=32,
                  micro_batch=1, precision="fp32", attention="eager")
    sim = simulate_step(job, src, SimTarget(device="cpu"))
    assert sim.trainable_params > 0
    with pytest.raises(JobError) as err:
        simulate_step(job.replace(lora_targets=["default"]), src, SimTarget(device="cpu"))
    assert "in_proj" in err.value.hint and "out_proj" not in err.value.hint
    # dt_proj's weight is read by the mixer itself, never called: an adapter there would get
    # no gradient, counted as trained (an audit)
    assert "dt_proj" not in err.value.hint
    assert sim.info["lora_target_modules"] and not any(
        "dt_proj" in t for t in sim.info["lora_target_modules"])


def test_experts_whose_shapes_come_from_the_routing_are_refused_in_one_line(tmp_path):
    """An audit: JetMoE's per-expert loop reads each expert's token count from the data
    (expert_size.tolist()): the simulation, which has no data, ended in a traceback."""
    path = _saved(tmp_path, T.JetMoeConfig(hidden_size=64, num_hidden_layers=2,
                                           num_key_value_heads=2, kv_channels=16,
                                           intermediate_size=64, vocab_size=256,
                                           max_position_embeddings=128, num_local_experts=4,
                                           num_experts_per_tok=2))
    job = JobSpec(model=path, seq_len=32, micro_batch=1, precision="fp32")
    with pytest.raises(JobError, match="takes a tensor's shape from the values of the data") as e:
        simulate_step(job, resolve_model(path), SimTarget(device="cpu"))
    assert "experts_implementation" in (e.value.hint or "")
