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
