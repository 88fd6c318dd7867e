"""The FSDP units a model is sharded into (``shard_units``)."""

import torch

from trainfit.engine.dist import shard_units


def _meta(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_the_blocks_are_the_units(tiny_llama):
    model = _meta(tiny_llama.config)
    units = shard_units(model)
    assert [type(u).__name__ for u in units] == ["LlamaDecoderLayer"] * 3


def test_a_unit_holding_a_tied_weight_is_left_to_the_root():
    """BERT names BertEmbeddings a block, but its word embeddings are also the output
    decoder's weight: FSDP2 refuses one parameter in two groups, so the root keeps it."""
    from transformers import BertConfig

    cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, vocab_size=256, is_decoder=True)
    model = _meta(cfg)
    names = [type(u).__name__ for u in shard_units(model)]
    assert "BertEmbeddings" not in names
    assert names.count("BertLayer") == 2


def test_a_module_reachable_under_two_names_ties_nothing(tiny_llama):
    """The chunked-head wrapper holds the decoder as ``model`` and ``_decoder``: the same module
    twice, not a weight shared by two modules. Counted by names, every weight looked tied and
    the whole model became one FSDP unit (gathered at once)."""
    from trainfit.job import JobSpec
    from trainfit.model.workload import build_model_on_meta

    job = JobSpec(model="tiny-llama", method="lora", seq_len=64, micro_batch=1,
                  lm_head_chunk=16)
    model, _ = build_model_on_meta(job, tiny_llama)
    assert type(model).__name__ == "ChunkedHeadLM"
    assert [type(u).__name__ for u in shard_units(model)] == ["LlamaDecoderLayer"] * 3


def test_a_submodule_shared_by_two_blocks_keeps_both_with_the_root(tiny_llama):
    """One MLP object held by two layers: its weights have two owners, so neither layer is a
    unit of its own (fully_shard would refuse a parameter in two groups)."""
    model = _meta(tiny_llama.config)
    layers = model.model.layers
    layers[1].mlp = layers[0].mlp
    assert [type(u).__name__ for u in shard_units(model)] == ["LlamaDecoderLayer"]
    assert shard_units(model)[0] is layers[2]
