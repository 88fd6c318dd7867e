"""Doctor fixtures: a tiny model config, a slow (pure-Python) tokenizer dir, an isolated cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEXT = REPO / "examples" / "data" / "tiny_text.jsonl"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture()
def input_bound_yaml(tmp_path) -> Path:
    """Seed 003's loader in a trainfit job: rows tokenized in __getitem__ by ByT5's pure-Python
    tokenizer, for a model far smaller than the tokenizer's work."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 384,
        "max_position_embeddings": 128}))
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text('{"tokenizer_class": "ByT5Tokenizer"}')
    p = tmp_path / "job.yaml"
    p.write_text(f"doctor: {{tokenize: lazy}}\nmodel: model/config.json\ntokenizer: tok\ndata: {TEXT}\n"
                 "seq_len: 32\nmicro_batch: 32\ngrad_accum: 1\nprecision: fp32\n")
    return p
