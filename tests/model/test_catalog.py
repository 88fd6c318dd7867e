"""Tests for the built-in model catalog (CPU only, no network)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from trainfit.model.catalog.models import MODELS, TASKS, CatalogModel, find_model, model_names

SRC = Path(__file__).resolve().parents[2] / "src"


def _build_meta_model(entry: CatalogModel):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    auto_cls = {
        "causal-lm": transformers.AutoModelForCausalLM,
        "seq2seq-lm": transformers.AutoModelForSeq2SeqLM,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
    }[entry.task]
    config = transformers.AutoConfig.for_model(**copy.deepcopy(entry.config))
    with torch.device("meta"):
        return config, auto_cls.from_config(config)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_config_builds_and_param_count_matches(name: str) -> None:
    entry = MODELS[name]
    before = copy.deepcopy(entry.config)
    config, model = _build_meta_model(entry)
    assert config.model_type == entry.config["model_type"]
    n_params = sum(p.numel() for p in model.parameters())  # tied weights once
    assert n_params == entry.param_count, f"{name}: built {n_params:,} != {entry.param_count:,}"
    assert entry.config == before, "building the model must not mutate the catalog config"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_entry_metadata(name: str) -> None:
    entry = MODELS[name]
    assert entry.name == name == name.lower()
    assert entry.task in TASKS
    assert entry.hf_id and "/" in entry.hf_id
    assert entry.source
    assert isinstance(entry.param_count, int) and entry.param_count > 0
    assert "model_type" in entry.config
    assert all(alias == alias.lower() for alias in entry.aliases)


def test_known_published_counts() -> None:
    assert MODELS["llama-3.2-1b"].param_count == 1_235_814_400
    assert MODELS["gpt2"].param_count == 124_439_808
    assert MODELS["gpt2-medium"].param_count == 354_823_168
    assert MODELS["llama-2-7b"].param_count == 6_738_415_616
    assert MODELS["mistral-7b-v0.1"].param_count == 7_241_732_096


def test_required_models_present() -> None:
    required = {
        "gemma-2b", "granite-4.0-h-1b", "chatlm-mini-chinese", "gpt2", "gpt2-medium",
        "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-2-7b", "llama-2-13b",
        "mistral-7b-v0.1", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "phi-2",
        "tinyllama-1.1b", "gpt2-large", "gpt2-xl", "bert-large-uncased", "falcon-7b",
        "gemma-7b", "gemma-2-2b", "gemma-2-9b", "phi-3-mini-4k", "stablelm-base-alpha-3b",
        "mistral-7b-v0.2", "llama-3-8b",
    }
    assert required <= set(MODELS)
    assert model_names() == sorted(MODELS)


def test_task_and_architecture_choices() -> None:
    assert MODELS["chatlm-mini-chinese"].task == "seq2seq-lm"
    assert MODELS["chatlm-mini-chinese"].config["model_type"] == "t5"
    assert MODELS["chatlm-mini-chinese"].config["vocab_size"] == 29298
    assert MODELS["bert-large-uncased"].task == "sequence-classification"
    assert MODELS["granite-4.0-h-1b"].config["model_type"] == "granitemoehybrid"
    assert MODELS["stablelm-base-alpha-3b"].config["model_type"] == "gpt_neox"


def test_granite_layer_pattern() -> None:
    layer_types = MODELS["granite-4.0-h-1b"].config["layer_types"]
    assert len(layer_types) == 40
    assert [i for i, t in enumerate(layer_types) if t == "attention"] == [5, 15, 25, 35]


def test_lookup_by_alias_and_hf_id() -> None:
    assert find_model("gpt2-100m") is MODELS["gpt2"]
    assert find_model("llama3.2-1b") is MODELS["llama-3.2-1b"]
    assert find_model("meta-llama/Llama-3.2-1B") is MODELS["llama-3.2-1b"]
    assert find_model("google/gemma-2b") is MODELS["gemma-2b"]
    assert find_model("ibm-granite/granite-4.0-h-1b") is MODELS["granite-4.0-h-1b"]
    assert find_model("charent/ChatLM-mini-Chinese") is MODELS["chatlm-mini-chinese"]
    for entry in MODELS.values():
        assert find_model(entry.name) is entry
        assert find_model(entry.hf_id) is entry
        for alias in entry.aliases:
            assert find_model(alias) is entry


def test_lookup_is_case_insensitive() -> None:
    assert find_model("LLAMA-3.2-1B") is MODELS["llama-3.2-1b"]
    assert find_model("META-LLAMA/LLAMA-3.2-1B") is MODELS["llama-3.2-1b"]
    assert find_model("  GPT2-Medium ") is MODELS["gpt2-medium"]
    assert find_model("Gemma-2B") is MODELS["gemma-2b"]


def test_unknown_model_returns_none() -> None:
    assert find_model("no-such-model-42b") is None
    assert find_model("") is None


def test_catalog_model_is_frozen() -> None:
    entry = MODELS["gpt2"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.name = "other"  # type: ignore[misc]


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys; import trainfit.model.catalog.models; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env={"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
