"""Shared fixtures: tiny models built from configurations (no download, no GPU)."""

from __future__ import annotations

import warnings

import pytest

warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def tiny_llama():
    from transformers import LlamaConfig

    from trainfit.model_source import ModelSource

    cfg = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=2000,
                      max_position_embeddings=256)
    return ModelSource("tiny-llama", cfg, "causal-lm", "local")


@pytest.fixture(scope="session")
def tiny_gpt2():
    from transformers import GPT2Config

    from trainfit.model_source import ModelSource

    cfg = GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=2000, n_positions=256)
    return ModelSource("tiny-gpt2", cfg, "causal-lm", "local")


@pytest.fixture()
def tiny_config_json(tmp_path):
    import json

    p = tmp_path / "config.json"
    p.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 128, "intermediate_size": 344,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 2000, "max_position_embeddings": 256}))
    return p
