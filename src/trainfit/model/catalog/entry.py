"""One catalog entry: a model's published architecture plus lookup metadata (``models.py``
holds the entries; this module is separate so that entry lists can live in several files)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class CatalogModel:
    """One built-in model: published architecture plus lookup metadata."""

    name: str  # canonical lower-case name, e.g. "llama-3.2-1b"
    hf_id: str  # e.g. "meta-llama/Llama-3.2-1B"
    config: dict = field(repr=False)  # AutoConfig.for_model(**config) kwargs; read-only
    task: str = "causal-lm"  # "causal-lm" | "seq2seq-lm" | "sequence-classification"
    aliases: tuple[str, ...] = ()  # lower-case alternative names
    param_count: int | None = None  # published / computed parameter count
    source: str = ""  # where the config values come from
    note: str = ""  # approximations and caveats


# Where most values were read: Hugging Face config.json files (the official repo
# or a derivative repo whose config.json names the official one in
# ``_name_or_path`` and carries the same architecture fields).
_HF = "huggingface.co"
