"""Catalog entries of the larger dense models (12B-72B), Qwen3, and the mixture-of-experts models
(kept apart from ``models.py`` for its size; the same :class:`CatalogModel` entries)."""

from __future__ import annotations

from trainfit.model.catalog import model_configs as cfg
from trainfit.model.catalog import moe_configs as moe
from trainfit.model.catalog.entry import _HF, CatalogModel

LARGE_ENTRIES: tuple[CatalogModel, ...] = (
    # -- the large dense models of the users' multi-GPU scenarios (70B QLoRA on two cards,
    # FSDP at 8-512 GPUs): the 8B / 13B / 7B blocks scaled, dims as in the held-out cases'
    # pinned configs (benchmarks/data/heldout_memory.json) and public copies of config.json
    CatalogModel(
        name="llama-2-70b", hf_id="meta-llama/Llama-2-70b-hf", config=cfg.LLAMA_2_70B,
        aliases=("llama2-70b", "llama-2-70b-hf", "llama-2-70b-chat",
                 "meta-llama/llama-2-70b-chat-hf"),
        param_count=68_976_648_192,
        source=f"{_HF}/meta-llama/Llama-2-70b-hf config.json (8192 / 28672 / 80 layers / 64 "
        "heads / 8 key-value heads, vocab 32000)",
    ),
    CatalogModel(
        name="llama-3-70b", hf_id="meta-llama/Meta-Llama-3-70B", config=cfg.LLAMA_3_70B,
        aliases=("llama3-70b", "meta-llama-3-70b", "llama-3-70b-instruct",
                 "meta-llama/meta-llama-3-70b-instruct"),
        param_count=70_553_706_496,
        source=f"{_HF}/meta-llama/Meta-Llama-3-70B config.json (8192 / 28672 / 80 layers / 64 "
        "heads / 8 key-value heads, vocab 128256, 8192 positions)",
    ),
    CatalogModel(
        name="llama-3.1-70b", hf_id="meta-llama/Llama-3.1-70B", config=cfg.LLAMA_3_1_70B,
        aliases=("llama3.1-70b", "meta-llama-3.1-70b", "meta-llama/meta-llama-3.1-70b",
                 "llama-3.1-70b-instruct", "meta-llama/llama-3.1-70b-instruct",
                 "llama-3.3-70b", "llama-3.3-70b-instruct", "meta-llama/llama-3.3-70b-instruct"),
        param_count=70_553_706_496,
        source=f"{_HF}/meta-llama/Llama-3.1-70B config.json (the 3-70B's dims, 131072 "
        "positions, llama3 RoPE scaling ×8)",
        note="Llama-3.3-70B-Instruct has the same architecture.",
    ),
    CatalogModel(
        name="qwen2.5-14b", hf_id="Qwen/Qwen2.5-14B", config=cfg.QWEN2_5_14B,
        aliases=("qwen2.5-14b-instruct", "qwen/qwen2.5-14b-instruct", "qwen-2.5-14b"),
        param_count=14_770_033_664,
        source=f"{_HF}/Qwen/Qwen2.5-14B config.json (copy in citsjtu2020/LLM-Prof "
        "sglang/Model_Config.md)",
    ),
    CatalogModel(
        name="qwen2.5-32b", hf_id="Qwen/Qwen2.5-32B", config=cfg.QWEN2_5_32B,
        aliases=("qwen2.5-32b-instruct", "qwen/qwen2.5-32b-instruct", "qwen-2.5-32b"),
        param_count=32_763_876_352,
        source=f"{_HF}/Qwen/Qwen2.5-32B config.json (copy in citsjtu2020/LLM-Prof "
        "sglang/Model_Config.md)",
    ),
    CatalogModel(
        name="qwen2.5-72b", hf_id="Qwen/Qwen2.5-72B", config=cfg.QWEN2_5_72B,
        aliases=("qwen2.5-72b-instruct", "qwen/qwen2.5-72b-instruct", "qwen-2.5-72b"),
        param_count=72_706_203_648,
        source=f"{_HF}/Qwen/Qwen2.5-72B config.json (8192 / 29568 / 80 layers / 64 heads / 8 "
        "key-value heads, vocab 152064: Qwen2-72B's dims)",
    ),
    CatalogModel(
        name="qwen3-4b", hf_id="Qwen/Qwen3-4B", config=cfg.QWEN3_4B,
        aliases=("qwen/qwen3-4b-base", "qwen3-4b-base"),
        param_count=4_022_468_096,
        source=f"{_HF}/Qwen/Qwen3-4B config.json (copy in citsjtu2020/LLM-Prof "
        "sglang/Model_Config.md)",
    ),
    CatalogModel(
        name="qwen3-8b", hf_id="Qwen/Qwen3-8B", config=cfg.QWEN3_8B,
        aliases=("qwen/qwen3-8b-base", "qwen3-8b-base"),
        param_count=8_190_735_360,
        source=f"{_HF}/Qwen/Qwen3-8B config.json (copy in citsjtu2020/LLM-Prof "
        "sglang/Model_Config.md)",
    ),
    CatalogModel(
        name="qwen3-14b", hf_id="Qwen/Qwen3-14B", config=cfg.QWEN3_14B,
        aliases=("qwen/qwen3-14b-base", "qwen3-14b-base"),
        param_count=14_768_307_200,
        source=f"{_HF}/Qwen/Qwen3-14B config.json (copy in citsjtu2020/LLM-Prof "
        "sglang/Model_Config.md)",
    ),
    CatalogModel(
        name="qwen3-32b", hf_id="Qwen/Qwen3-32B", config=cfg.QWEN3_32B,
        param_count=32_762_123_264,
        source=f"{_HF}/Qwen/Qwen3-32B config.json (copy in citsjtu2020/LLM-Prof "
        "sglang/Model_Config.md)",
    ),
    # -- mixture-of-experts models (routed experts as stacked tensors: model/experts.py)
    CatalogModel(
        name="mixtral-8x7b", hf_id="mistralai/Mixtral-8x7B-v0.1", config=moe.MIXTRAL_8X7B,
        aliases=("mixtral-8x7b-v0.1", "mixtral-8x7b-instruct", "mixtral-8x7b-instruct-v0.1",
                 "mistralai/mixtral-8x7b-instruct-v0.1"),
        param_count=46_702_792_704,
        source=f"{_HF}/mistralai/Mixtral-8x7B-v0.1 config.json (Mistral-7B's attention, 8 "
        "experts of width 14336, 2 routed per token, 32768 positions, no sliding window)",
    ),
    CatalogModel(
        name="qwen3-30b-a3b", hf_id="Qwen/Qwen3-30B-A3B", config=moe.QWEN3_30B_A3B,
        aliases=("qwen/qwen3-30b-a3b-base", "qwen3-30b-a3b-base"),
        param_count=30_532_122_624,
        source=f"{_HF}/Qwen/Qwen3-30B-A3B config.json (copy in citsjtu2020/LLM-Prof "
        "sglang/Model_Config.md)",
    ),
    CatalogModel(
        name="mistral-nemo-12b", hf_id="mistralai/Mistral-Nemo-Base-2407",
        config=cfg.MISTRAL_NEMO_12B, param_count=12_247_782_400,
        aliases=("mistral-nemo", "mistral-nemo-instruct-2407",
                 "mistralai/mistral-nemo-instruct-2407"),
        source=f"{_HF}/mistralai/Mistral-Nemo-Base-2407 config.json",
    ),
    CatalogModel(
        name="phi-4", hf_id="microsoft/phi-4", config=cfg.PHI_4, param_count=14_659_507_200,
        source=f"{_HF}/microsoft/phi-4 config.json (phi3 model type)",
    ),
)
