"""The layer stack's repeating pattern, read from the model built on the meta device."""

import pytest
import transformers as tf

from trainfit.model.depth import LayerPattern, layer_pattern, with_layers
from trainfit.model.source import ModelSource

SMALL = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=1000)


def _src(cfg, name: str = "m") -> ModelSource:
    return ModelSource(name, cfg, "causal-lm", "config", "")


def _pattern(cfg, repeats=(2, 3)):
    return layer_pattern(_src(cfg), repeats)


def test_one_layer_repeated():
    pat = _pattern(tf.LlamaConfig(**SMALL, num_hidden_layers=16))
    assert pat == LayerPattern(full=16, prefix=0, period=1)
    assert (pat.depth(2), pat.depth(3)) == (2, 3)  # the depths the extrapolation always used


def test_alternating_attention_layers_repeat_in_pairs():
    """Gemma-2 and gpt-oss alternate sliding-window and global attention (``layer_types``):
    the modules are alike but for their window, so the repeat is the pair."""
    gemma2 = _pattern(tf.Gemma2Config(**SMALL, num_hidden_layers=26, head_dim=32))
    assert gemma2 == LayerPattern(full=26, prefix=0, period=2)
    assert (gemma2.depth(2), gemma2.depth(3)) == (4, 6)
    oss = _pattern(tf.GptOssConfig(**SMALL, num_hidden_layers=24, num_local_experts=4,
                                   head_dim=32))
    assert oss.period == 2 and oss.prefix == 0


def test_gemma3_five_local_one_global():
    pat = _pattern(tf.Gemma3TextConfig(**SMALL, num_hidden_layers=48, head_dim=32))
    assert pat == LayerPattern(full=48, prefix=0, period=6)
    # 26 layers: 2 and 3 repeats are 14 and 20 layers, 34 together: the full stack is cheaper
    assert _pattern(tf.Gemma3TextConfig(**SMALL, num_hidden_layers=26, head_dim=32)) is None


def test_dense_prefix_before_the_expert_layers():
    """DeepSeek-V3's first ``first_k_dense_replace`` layers are dense: 2-3 layer stacks would be
    all dense and the experts would vanish from the extrapolation."""
    cfg = tf.DeepseekV3Config(**SMALL, num_hidden_layers=20, first_k_dense_replace=3,
                              n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                              n_group=1, topk_group=1, q_lora_rank=64, kv_lora_rank=32,
                              qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32)
    pat = _pattern(cfg)
    assert pat == LayerPattern(full=20, prefix=3, period=1)
    assert (pat.depth(2), pat.depth(3)) == (5, 6)
    qwen_moe = tf.Qwen2MoeConfig(**SMALL, num_hidden_layers=24, mlp_only_layers=[0, 1, 2, 3],
                                 num_experts=4, moe_intermediate_size=64,
                                 shared_expert_intermediate_size=128)
    assert _pattern(qwen_moe).prefix == 4


def test_llama4_interleaved_experts_and_nope_layers():
    """Maverick: experts every 2nd layer, no RoPE every 4th (``no_rope_layers``); Scout:
    experts in every layer, whose ``moe_layers`` (every layer's index) is not a per-layer
    setting."""
    common = dict(**SMALL, num_hidden_layers=24, num_local_experts=4,
                  intermediate_size_mlp=256, head_dim=32)
    assert _pattern(tf.Llama4TextConfig(**common, interleave_moe_layer_step=2)).period == 4
    assert _pattern(tf.Llama4TextConfig(**common, interleave_moe_layer_step=1)).period == 4


def test_a_stack_ending_inside_a_period_counts_those_layers_first():
    """Gemma-3-27B's 62 layers are 10 sixes and 2 sliding layers: the repeats are counted to the
    end (2 + 10 × 6), so the small stacks differ from the full one by whole periods."""
    cfg = tf.Gemma3TextConfig(**SMALL, num_hidden_layers=62, head_dim=32)
    pat = _pattern(cfg)
    assert pat == LayerPattern(full=62, prefix=2, period=6)
    assert pat.repeats == 10 and (pat.depth(2), pat.depth(3)) == (14, 20)
    cut = with_layers(_src(cfg), 14)
    assert cut.config.num_hidden_layers == 14
    assert cut.config.layer_types == cfg.layer_types[:14]


def test_every_per_layer_list_is_cut_but_a_derived_one():
    """Llama-4's ``no_rope_layers`` is cut with ``layer_types``; Mamba's ``layer_types`` is a
    read-only property derived from the depth (setting it raised, and the stack was simulated
    whole)."""
    cfg = tf.Llama4TextConfig(**SMALL, num_hidden_layers=24, num_local_experts=4,
                              intermediate_size_mlp=256, head_dim=32)
    cut = with_layers(_src(cfg), 8).config
    assert len(cut.no_rope_layers) == 8 and cut.no_rope_layers == cfg.no_rope_layers[:8]
    mamba = tf.MambaConfig(hidden_size=64, num_hidden_layers=12, vocab_size=1000)
    assert with_layers(_src(mamba), 3).config.num_hidden_layers == 3
    assert _pattern(mamba) == LayerPattern(full=12, prefix=0, period=1)


@pytest.mark.parametrize("cfg", [
    # a hybrid whose repeat is too long for small stacks shallower than the full one
    tf.JambaConfig(**SMALL, num_hidden_layers=24, num_experts=4),
    # an encoder-decoder: not one stack
    tf.T5Config(d_model=64, d_ff=128, num_layers=6, num_heads=4, vocab_size=1000,
                is_encoder_decoder=True),
])
def test_no_pattern_simulates_the_full_stack(cfg):
    src = ModelSource("m", cfg, "seq2seq-lm" if cfg.is_encoder_decoder else "causal-lm",
                      "config", "")
    assert layer_pattern(src, (2, 3)) is None


def test_a_stack_too_shallow_for_the_sharded_depths():
    cfg = tf.LlamaConfig(**SMALL, num_hidden_layers=6)
    assert _pattern(cfg, (2, 3)) is not None  # 2 + 3 < 6
    assert _pattern(cfg, (3, 4)) is None  # 3 + 4 > 6: whole is cheaper



def test_a_mixer_only_some_layers_have_is_told_apart_by_position_only():
    """Granite-4.0-H-like hybrids: three Mamba layers to one attention layer, each Mamba mixer
    holding its layer's index (``mamba.layer_idx`` = 0, 1, 2, None, 4, …). The index was read
    as a setting, every layer differed, and the stack was simulated whole at every fit point
    (a review); it is each layer's position where it is there, so the repeat is the four."""
    cfg = tf.GraniteMoeHybridConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=128, layer_types=(["mamba"] * 3 + ["attention"]) * 6,
        mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1,
        max_position_embeddings=512, vocab_size=512)
    assert _pattern(cfg) == LayerPattern(full=24, prefix=0, period=4)


def test_a_flag_two_layers_have_is_not_their_index():
    """False/True equal 0/1 in Python: a yes/no setting present in the first two layers only
    must stay a setting that tells them apart (a review)."""
    from trainfit.model.depth import _index_like

    assert not _index_like([False, True, None, None, None, None])
    assert not _index_like([False, True])
    assert _index_like([0, 1, 2, None, 4, 5, 6, None])
    assert _index_like([None, None, None, 3, None, None, None, 7])
