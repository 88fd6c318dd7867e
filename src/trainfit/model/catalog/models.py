"""Built-in catalog of model architectures.

Each entry carries the architecture fields of the model's *published*
Hugging Face ``config.json`` (see ``model_configs.py``), so that a model can be
instantiated without hub access::

    import copy
    from transformers import AutoConfig

    entry = find_model("llama-3.2-1b")
    cfg = AutoConfig.for_model(**copy.deepcopy(entry.config))

Always pass a deep copy: ``transformers`` mutates nested dicts (``rope_scaling``)
in place.  ``param_count`` is the number of unique parameters (tied weights
counted once) of the model built for ``task`` from ``config``; it equals the
published count for every entry and is checked by the test-suite.

This module deliberately imports neither ``torch`` nor ``transformers``.
"""

from __future__ import annotations

from trainfit.model.catalog import model_configs as cfg
from trainfit.model.catalog.entry import _HF, CatalogModel
from trainfit.model.catalog.large_models import LARGE_ENTRIES

__all__ = ["MODELS", "CatalogModel", "find_model", "model_names"]

TASKS: tuple[str, ...] = ("causal-lm", "seq2seq-lm", "sequence-classification")



_ENTRIES: tuple[CatalogModel, ...] = (
    # -- models from the users' scenarios ---------------------------------
    CatalogModel(
        name="gemma-2b",
        hf_id="google/gemma-2b",
        config=cfg.GEMMA_2B,
        aliases=("gemma-2b-base", "gemma-2b-it", "google/gemma-2b-it"),
        param_count=2_506_172_416,
        source=f"{_HF}/google/gemma-2b config.json, as mirrored in derivative repos "
        "(_name_or_path google/gemma-2b, e.g. damadei/gemma-2b-sql-finetuned, "
        "PrunaAI/google-gemma-2b-HQQ-4bit-smashed)",
        note="Published hidden_act is the legacy 'gelu' (hidden_activation "
        "'gelu_pytorch_tanh'); transformers uses the tanh GELU, given directly here.",
    ),
    CatalogModel(
        name="granite-4.0-h-1b",
        hf_id="ibm-granite/granite-4.0-h-1b",
        config=cfg.GRANITE_4_0_H_1B,
        aliases=("granite-4-h-1b", "granite4-h-1b", "granite-4.0-h-1b-base",
                 "ibm-granite/granite-4.0-h-1b-base"),
        param_count=1_461_538_368,
        source=f"{_HF}/ibm-granite/granite-4.0-h-1b config.json: fields quoted verbatim "
        "in a public test fixture (GRANITE_H_1B_HF) and in the config.json copy at "
        f"{_HF}/bnbnoman01/test (hidden 1536, 40 layers with attention at 5/15/25/35, "
        "mamba 48 heads x 64, d_state 128, attention_multiplier 0.0078125, "
        "logits_scaling 6); nano-vllm-go GRANITE docs (12 q / 4 kv heads)",
        note="Built with transformers' own 'granitemoehybrid' (Mamba2 + 4 NoPE GQA "
        "layers, dense: num_local_experts 0, shared MLP 4096). rms_norm_eps and "
        "position_embedding_type 'nope' follow the Granite 4.0 family (not seen "
        "verbatim for this checkpoint); residual_multiplier omitted (no effect on "
        "shapes).",
    ),
    CatalogModel(
        name="chatlm-mini-chinese",
        hf_id="charent/ChatLM-mini-Chinese",
        config=cfg.CHATLM_MINI_CHINESE,
        task="seq2seq-lm",
        aliases=("chatlm-mini-chinese-0.2b", "chatlm-chinese-0.2b", "chatlm-0.2b"),
        param_count=187_692_288,
        source="github.com/charent/ChatLM-mini-Chinese: config.py T5ModelConfig "
        "(d_ff 3072, d_model 768, num_heads 12, d_kv 64, num_layers 10, "
        "num_decoder_layers 10), model/chat_model.py (T5Config() defaults + those "
        "overrides), README (vocab 29298, '0.2B, ~210M with shared weight')",
        note="T5 (relu FFN, tied embeddings). 187.7M unique parameters; the README's "
        "~210M counts the tied lm_head separately (+29298*768).",
    ),
    CatalogModel(
        name="gpt2",
        hf_id="openai-community/gpt2",
        config=cfg.GPT2,
        aliases=("gpt2-100m", "gpt2-124m", "gpt2-small", "gpt-2", "gpt-2-small"),
        param_count=124_439_808,
        source=f"{_HF}/openai-community/gpt2 config.json (n_embd 768, n_layer 12, "
        "n_head 12, n_positions 1024, vocab 50257)",
        note="Stands in for any GPT-2-class ~100M model ('gpt2-100m').",
    ),
    CatalogModel(
        name="distilgpt2",
        hf_id="distilbert/distilgpt2",
        config=cfg.DISTILGPT2,
        aliases=("distil-gpt2",),
        param_count=81_912_576,
        source=f"{_HF}/distilbert/distilgpt2 config.json (GPT-2 with n_layer 6)",
    ),
    CatalogModel(
        name="t5-small",
        hf_id="google-t5/t5-small",
        config=cfg.T5_SMALL,
        task="seq2seq-lm",
        aliases=("t5-small-60m",),
        param_count=60_506_624,
        source=f"{_HF}/google-t5/t5-small config.json (d_model 512, d_ff 2048, 6+6 layers, "
        "8 heads, vocab 32128)",
    ),
    CatalogModel(
        name="llama-tiny-58m",
        hf_id="trainfit/llama-tiny-58m",
        config=cfg.LLAMA_TINY_58M,
        aliases=("llama-tiny", "llama-58m", "llama-50m"),
        param_count=58_466_816,
        source="trainfit: a Llama-architecture config for CPU runs (not a published model)",
        note="Not a published checkpoint: Llama architecture (hidden 512, 8 layers, vocab 32000) "
        "sized for real CPU runs.",
    ),
    CatalogModel(
        name="gpt2-medium",
        hf_id="openai-community/gpt2-medium",
        config=cfg.GPT2_MEDIUM,
        aliases=("gpt2-355m", "gpt-2-medium", "gpt-medium", "medium-gpt"),
        param_count=354_823_168,
        source=f"{_HF}/openai-community/gpt2-medium config.json (n_embd 1024, "
        "n_layer 24, n_head 16)",
    ),
    # -- common models ----------------------------------------------------
    CatalogModel(
        name="llama-3.2-1b",
        hf_id="meta-llama/Llama-3.2-1B",
        config=cfg.LLAMA_3_2_1B,
        aliases=("llama3.2-1b", "llama-3.2-1b-instruct", "meta-llama/llama-3.2-1b-instruct"),
        param_count=1_235_814_400,
        source=f"{_HF}/meta-llama/Llama-3.2-1B config.json (verbatim copy in "
        "kevinstephano/thunder_model_blocks hf_llama/llama_config.py)",
    ),
    CatalogModel(
        name="llama-3.2-3b",
        hf_id="meta-llama/Llama-3.2-3B",
        config=cfg.LLAMA_3_2_3B,
        aliases=("llama3.2-3b", "llama-3.2-3b-instruct", "meta-llama/llama-3.2-3b-instruct"),
        param_count=3_212_749_824,
        source=f"{_HF}/meta-llama/Llama-3.2-3B config.json (copy at "
        f"{_HF}/mlx-community/Llama-3.2-3B-bf16)",
    ),
    CatalogModel(
        name="llama-3.1-8b",
        hf_id="meta-llama/Llama-3.1-8B",
        config=cfg.LLAMA_3_1_8B,
        aliases=("llama3.1-8b", "meta-llama-3.1-8b", "meta-llama/meta-llama-3.1-8b",
                 "llama-3.1-8b-instruct", "meta-llama/llama-3.1-8b-instruct"),
        param_count=8_030_261_248,
        source=f"{_HF}/meta-llama/Llama-3.1-8B config.json (copy at "
        f"{_HF}/NbAiLab/nb-llama-3.1-8B, _name_or_path meta-llama/Llama-3.1-8B)",
    ),
    CatalogModel(
        name="llama-3-8b",
        hf_id="meta-llama/Meta-Llama-3-8B",
        config=cfg.LLAMA_3_8B,
        aliases=("llama3-8b", "meta-llama-3-8b", "llama-3-8b-instruct",
                 "meta-llama/meta-llama-3-8b-instruct"),
        param_count=8_030_261_248,
        source=f"{_HF}/meta-llama/Meta-Llama-3-8B config.json (copy at "
        f"{_HF}/pandyamarut/Meta-Llama-3-8B)",
    ),
    CatalogModel(
        name="llama-2-7b",
        hf_id="meta-llama/Llama-2-7b-hf",
        config=cfg.LLAMA_2_7B,
        aliases=("llama2-7b", "llama-2-7b-hf", "llama-2-7b-chat", "meta-llama/llama-2-7b-chat-hf"),
        param_count=6_738_415_616,
        source=f"{_HF}/meta-llama/Llama-2-7b-hf config.json (derivatives with "
        "_name_or_path meta-llama/Llama-2-7b-hf, e.g. anatal/stack-llama-2)",
    ),
    CatalogModel(
        name="llama-2-13b",
        hf_id="meta-llama/Llama-2-13b-hf",
        config=cfg.LLAMA_2_13B,
        aliases=("llama2-13b", "llama-2-13b-hf", "llama-2-13b-chat", "meta-llama/llama-2-13b-chat-hf"),
        param_count=13_015_864_320,
        source=f"{_HF}/meta-llama/Llama-2-13b-hf config.json (derivatives with "
        "_name_or_path meta-llama/Llama-2-13b-hf, e.g. LoftQ/Llama-2-13b-hf-4bit-64rank)",
    ),
    CatalogModel(
        name="mistral-7b-v0.1",
        hf_id="mistralai/Mistral-7B-v0.1",
        config=cfg.MISTRAL_7B_V0_1,
        aliases=("mistral-7b", "mistral7b", "mistral-7b-instruct-v0.1",
                 "mistralai/mistral-7b-instruct-v0.1"),
        param_count=7_241_732_096,
        source=f"{_HF}/mistralai/Mistral-7B-v0.1 config.json (copy in "
        "Capstone-lpx/mistral7b_instruct, 'Duplicate from mistralai/Mistral-7B-Instruct-v0.1')",
    ),
    CatalogModel(
        name="mistral-7b-v0.2",
        hf_id="mistral-community/Mistral-7B-v0.2",
        config=cfg.MISTRAL_7B_V0_2,
        aliases=("mistralai/mistral-7b-v0.2", "mistral-7b-instruct-v0.2",
                 "mistralai/mistral-7b-instruct-v0.2"),
        param_count=7_241_732_096,
        source=f"{_HF}/mistral-community/Mistral-7B-v0.2 config.json (rope_theta 1e6, "
        "32k context) and mistralai/Mistral-7B-Instruct-v0.2 (sliding_window null)",
        note="The base v0.2 weights are published under mistral-community; its "
        "config.json says sliding_window 32768 (= the context), i.e. no window; "
        "null is used, as in the official Instruct-v0.2 config.",
    ),
    CatalogModel(
        name="qwen2.5-0.5b",
        hf_id="Qwen/Qwen2.5-0.5B",
        config=cfg.QWEN2_5_0_5B,
        aliases=("qwen2.5-0.5b-instruct", "qwen/qwen2.5-0.5b-instruct", "qwen-2.5-0.5b"),
        param_count=494_032_768,
        source=f"{_HF}/Qwen/Qwen2.5-0.5B config.json (copy at "
        f"{_HF}/osllmai-community/Qwen2.5-0.5B, _name_or_path Qwen/Qwen2.5-0.5B)",
        note="Sliding-window attention disabled (use_sliding_window false), so "
        "sliding_window/max_window_layers are omitted.",
    ),
    CatalogModel(
        name="qwen2.5-1.5b",
        hf_id="Qwen/Qwen2.5-1.5B",
        config=cfg.QWEN2_5_1_5B,
        aliases=("qwen2.5-1.5b-instruct", "qwen/qwen2.5-1.5b-instruct", "qwen-2.5-1.5b"),
        param_count=1_543_714_304,
        source=f"{_HF}/Qwen/Qwen2.5-1.5B(-Instruct) config.json (copy at "
        f"{_HF}/onnx-community/Qwen2.5-1.5B-Instruct)",
    ),
    CatalogModel(
        name="qwen2.5-7b",
        hf_id="Qwen/Qwen2.5-7B",
        config=cfg.QWEN2_5_7B,
        aliases=("qwen2.5-7b-instruct", "qwen/qwen2.5-7b-instruct", "qwen-2.5-7b"),
        param_count=7_615_616_512,
        source=f"{_HF}/Qwen/Qwen2.5-7B config.json (derivatives with _name_or_path "
        "Qwen/Qwen2.5-7B, e.g. AmberYifan/Qwen2.5-7B-gen-dpo-10k)",
        note="The Instruct variant publishes max_position_embeddings 32768; "
        "otherwise identical.",
    ),
    CatalogModel(
        name="phi-2",
        hf_id="microsoft/phi-2",
        config=cfg.PHI_2,
        aliases=("phi2", "microsoft-phi-2"),
        param_count=2_779_683_840,
        source=f"{_HF}/microsoft/phi-2 config.json (in-library 'phi' version; copies "
        "with _name_or_path microsoft/phi-2, e.g. LoftQ/phi-2-4bit-64rank)",
    ),
    CatalogModel(
        name="tinyllama-1.1b",
        hf_id="TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
        config=cfg.TINYLLAMA_1_1B,
        aliases=("tinyllama", "tinyllama-1.1b-chat", "tinyllama/tinyllama-1.1b-chat-v1.0"),
        param_count=1_100_048_384,
        source=f"{_HF}/TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json "
        "(derivatives with that _name_or_path, e.g. abuelnasr/TinyLlama-1.1B-chat-dare-v1)",
    ),
    CatalogModel(
        name="gpt2-large",
        hf_id="openai-community/gpt2-large",
        config=cfg.GPT2_LARGE,
        aliases=("gpt2-774m", "gpt-2-large"),
        param_count=774_030_080,
        source=f"{_HF}/openai-community/gpt2-large config.json (n_embd 1280, "
        "n_layer 36, n_head 20)",
    ),
    CatalogModel(
        name="gpt2-xl",
        hf_id="openai-community/gpt2-xl",
        config=cfg.GPT2_XL,
        aliases=("gpt2-1.5b", "gpt-2-xl"),
        param_count=1_557_611_200,
        source=f"{_HF}/openai-community/gpt2-xl config.json (n_embd 1600, "
        "n_layer 48, n_head 25)",
    ),
    CatalogModel(
        name="bert-large-uncased",
        hf_id="google-bert/bert-large-uncased",
        config=cfg.BERT_LARGE_UNCASED,
        task="sequence-classification",
        aliases=("bert-large", "bert-large-uncased-classifier"),
        param_count=335_143_938,
        source=f"{_HF}/google-bert/bert-large-uncased config.json",
        note="Counted as BertForSequenceClassification with the default 2 labels "
        "(encoder + pooler 335,141,888 + classifier 2,050); the published ~336M "
        "includes the MLM head instead.",
    ),
    # -- calibration set --------------------------------------------------
    CatalogModel(
        name="falcon-7b",
        hf_id="tiiuae/falcon-7b",
        config=cfg.FALCON_7B,
        aliases=("falcon7b",),
        param_count=6_921_720_704,
        source=f"{_HF}/tiiuae/falcon-7b config.json (in-library 'falcon' version; "
        "copies with _name_or_path tiiuae/falcon-7b, e.g. ybelkada/falcon-7b-sharded-bf16)",
        note="tie_word_embeddings and max_position_embeddings (2048) are not in the "
        "published file; transformers' FalconConfig defaults apply.",
    ),
    CatalogModel(
        name="gemma-7b",
        hf_id="google/gemma-7b",
        config=cfg.GEMMA_7B,
        aliases=("gemma-7b-it", "google/gemma-7b-it"),
        param_count=8_537_680_896,
        source=f"{_HF}/google/gemma-7b config.json (derivatives with _name_or_path "
        "google/gemma-7b, e.g. lewtun/gemma-7b-sft-full-dolly-v0)",
        note="Published hidden_act 'gelu' is legacy; the tanh GELU is used.",
    ),
    CatalogModel(
        name="gemma-2-2b",
        hf_id="google/gemma-2-2b",
        config=cfg.GEMMA_2_2B,
        aliases=("gemma2-2b", "gemma-2-2b-it", "google/gemma-2-2b-it"),
        param_count=2_614_341_888,
        source=f"{_HF}/google/gemma-2-2b config.json (copy at "
        f"{_HF}/kemura/gemma-2b-sql-finetuned, _name_or_path google/gemma-2-2b)",
    ),
    CatalogModel(
        name="gemma-2-9b",
        hf_id="google/gemma-2-9b",
        config=cfg.GEMMA_2_9B,
        aliases=("gemma2-9b", "gemma-2-9b-it", "google/gemma-2-9b-it"),
        param_count=9_241_705_984,
        source=f"{_HF}/google/gemma-2-9b config.json (copies at "
        f"{_HF}/ashercn97/blanked-v011 and hfhugs/gemma-2-9b-it)",
    ),
    CatalogModel(
        name="gemma-3-4b",
        hf_id="google/gemma-3-4b-it",
        config=cfg.GEMMA_3_4B,
        aliases=("gemma3-4b", "gemma-3-4b-it", "gemma-3-4b-pt", "google/gemma-3-4b-pt"),
        param_count=4_300_079_472,
        source=f"{_HF}/google/gemma-3-4b-it config.json, as quoted verbatim in public test "
        "suites that pin it (\"the original gemma-3-4b-it's config.json\"; the 4.30e9 "
        "parameters its model card advertises are reproduced)",
    ),
    CatalogModel(
        name="phi-3-mini-4k",
        hf_id="microsoft/Phi-3-mini-4k-instruct",
        config=cfg.PHI_3_MINI_4K,
        aliases=("phi-3-mini", "phi3-mini-4k", "phi-3-mini-4k-instruct"),
        param_count=3_821_079_552,
        source=f"{_HF}/microsoft/Phi-3-mini-4k-instruct config.json (copy at "
        "Alignment-Lab-AI/idfkphi4kiguess, 'Duplicate from microsoft/Phi-3-mini-4k-instruct')",
    ),
    CatalogModel(
        name="stablelm-base-alpha-3b",
        hf_id="stabilityai/stablelm-base-alpha-3b",
        config=cfg.STABLELM_BASE_ALPHA_3B,
        aliases=("stablelm-alpha-3b", "stablelm-3b-alpha"),
        param_count=3_637_321_728,
        source=f"{_HF}/stabilityai/stablelm-base-alpha-3b config.json (gpt_neox; "
        "refs/pr/8 revision)",
    ),
    *LARGE_ENTRIES,  # 12B-72B dense, Qwen3, mixture-of-experts (large_models.py)
)


def _build_models(entries: tuple[CatalogModel, ...]) -> dict[str, CatalogModel]:
    models: dict[str, CatalogModel] = {}
    for entry in entries:
        if entry.name in models:
            raise ValueError(f"duplicate catalog model name {entry.name!r}")
        models[entry.name] = entry
    return models


def _build_index(models: dict[str, CatalogModel]) -> dict[str, CatalogModel]:
    index: dict[str, CatalogModel] = {}
    for entry in models.values():
        for key in (entry.name, entry.hf_id, *entry.aliases):
            key = _normalize(key)
            other = index.setdefault(key, entry)
            if other is not entry:
                raise ValueError(f"catalog key {key!r} maps to {other.name!r} and {entry.name!r}")
    return index


def _normalize(name: str) -> str:
    return name.strip().lower()


MODELS: dict[str, CatalogModel] = _build_models(_ENTRIES)
_INDEX: dict[str, CatalogModel] = _build_index(MODELS)


def find_model(name: str) -> CatalogModel | None:
    """Look a model up by canonical name, alias or Hugging Face id (case-insensitive).

    Returns ``None`` for unknown names.
    """
    return _INDEX.get(_normalize(name))


def model_names() -> list[str]:
    """Canonical names of all catalog models, sorted."""
    return sorted(MODELS)
