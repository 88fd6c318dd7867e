"""Fixtures of the script tests: the tiny models (built once), the seed-like scripts and data."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from script_seeds import (
    SEED000,
    SEED001,
    SEED002,
    chat_rows,
    pair_rows,
    text_rows,
    write_jsonl,
    write_model,
)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {name: write_model(root, name) for name in ("gemma", "llama", "t5", "gemma3")}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub: the scripts' models are local


class Seed:
    """One seed-like script: the command that runs it, its model and data."""

    def __init__(self, tmp: Path, name: str, text: str, model: Path, data: Path) -> None:
        self.script = tmp / name
        self.script.write_text(text)
        self.model, self.data, self.out = model, data, tmp / "out"

    def cmd(self, *extra: str) -> list[str]:
        return [sys.executable, str(self.script), "--model", str(self.model), "--data",
                str(self.data), "--out", str(self.out), *extra]


@pytest.fixture()
def seed000(tmp_path, tiny_models) -> Seed:
    return Seed(tmp_path, "fine_tune_gemma.py", SEED000, tiny_models["gemma"],
                write_jsonl(tmp_path / "text.jsonl", text_rows()))


@pytest.fixture()
def seed001(tmp_path, tiny_models) -> Seed:
    return Seed(tmp_path, "sft_granite.py", SEED001, tiny_models["llama"],
                write_jsonl(tmp_path / "chat.jsonl", chat_rows()))


@pytest.fixture()
def seed002(tmp_path, tiny_models) -> Seed:
    return Seed(tmp_path, "train_sft.py", SEED002, tiny_models["t5"],
                write_jsonl(tmp_path / "pairs.jsonl", pair_rows()))


@pytest.fixture()
def seed000_gemma3(tmp_path, tiny_models) -> Seed:
    """Seed 000's script on a Gemma-3 4B-shaped model (a vision tower beside the language model)."""
    return Seed(tmp_path, "fine_tune_gemma.py", SEED000, tiny_models["gemma3"],
                write_jsonl(tmp_path / "text.jsonl", text_rows()))
