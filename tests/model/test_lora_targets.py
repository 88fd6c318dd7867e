"""The portable LoRA aliases (q, k, v, o, mlp, all-linear) resolved on real module trees."""

import pytest
import torch

from trainfit.job import JobError
from trainfit.model.lora_targets import classify_linears, resolve_targets


def _meta(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _leafs(names):
    return sorted({n.split(".")[-1] for n in names})


def test_llama_q_v_are_its_q_and_v_projections(tiny_llama):
    model = _meta(tiny_llama.config)
    names = resolve_targets(model, ["q", "v"], "llama")
    assert _leafs(names) == ["q_proj", "v_proj"]
    assert len(names) == 2 * tiny_llama.config.num_hidden_layers


def test_gpt2s_fused_qkv_is_adapted_for_any_of_q_k_v(tiny_gpt2):
    model = _meta(tiny_gpt2.config)
    assert _leafs(resolve_targets(model, ["v"], "gpt2")) == ["c_attn"]


def test_latent_attention_maps_q_and_v_to_its_projections():
    """DeepSeek-V3's multi-head latent attention has no q_proj/v_proj: q goes through
    q_a_proj → q_b_proj, k and v both come from kv_a_proj_with_mqa → kv_b_proj."""
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                           q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                           qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4,
                           num_experts_per_tok=2, first_k_dense_replace=1, vocab_size=256)
    model = _meta(cfg)
    kinds = classify_linears(model)
    assert {k for n, k in kinds.items() if n.endswith("kv_b_proj")} == {"kv"}
    assert _leafs(resolve_targets(model, ["q", "v"], "deepseek_v3")) == [
        "kv_a_proj_with_mqa", "kv_b_proj", "q_a_proj", "q_b_proj"]
    assert _leafs(resolve_targets(model, ["q"], "deepseek_v3")) == ["q_a_proj", "q_b_proj"]
    assert "o_proj" in _leafs(resolve_targets(model, ["o"], "deepseek_v3"))


def test_a_target_that_matches_nothing_is_one_clear_error(tiny_llama):
    model = _meta(tiny_llama.config)
    with pytest.raises(JobError, match="no linear layer of this model is named so") as e:
        resolve_targets(model, ["query_key"], "llama")
    assert "q_proj" in e.value.hint


def test_an_architecture_without_attention_and_without_a_peft_default_says_what_to_give():
    """Mamba: peft has no default target list and there is no q/v to fall back on; the error
    names what was not given and lists the model's linear layers."""
    from transformers import MambaConfig

    model = _meta(MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=256,
                              state_size=8))
    with pytest.raises(JobError, match="peft has no default for mamba") as e:
        resolve_targets(model, ["default"], "mamba")
    assert "in_proj" in e.value.hint and "x_proj" in e.value.hint
    with pytest.raises(JobError, match="--lora-targets q,v: matches no layer"):
        resolve_targets(model, ["q", "v"], "mamba")
