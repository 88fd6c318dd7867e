"""The GPU, the compared peak statistic and the model of one held-out published case
(``data/heldout_memory.json``), for :mod:`heldout_mapping`: each read from the case's own
fields, every assumption said through ``note``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Note = Callable[[str], None]
"""Records one mapping note of the case."""


# --- GPUs and peaks -----------------------------------------------------------------------------
def _titan_rtx() -> dict[str, Any]:
    from trainfit.hardware.gpus import CUDA_CONTEXT_BASE_BYTES, CUDA_STACK_BYTES_PER_THREAD

    # TU102, 72 SMs × 1024 threads (Turing), the 23.65 GiB "total capacity" of the OOM message
    return {"name": "titan-rtx (substitute)", "display_name": "NVIDIA TITAN RTX",
            "memory_bytes": int(23.65 * 2**30), "sm_count": 72,
            "memory_source": "the case's OOM message: 23.65 GiB total capacity",
            "cuda_context_bytes": CUDA_CONTEXT_BASE_BYTES + 72 * 1024 * CUDA_STACK_BYTES_PER_THREAD}


def gpu_for(case: dict[str, Any], note: Note) -> tuple[str, dict[str, Any]]:
    """The catalog GPU of a case (and the fields replaced for a card the catalog lacks)."""
    text = case["gpu"]
    low = text.lower()
    if "96gb hbm2e" in low:
        note("H100 96GB HBM2e is not in the catalog: h100-sxm (cc 9.0, 132 SMs) with 96 GB "
               "(89.4 GiB, the advertised size: the CUDA total is not published)")
        return "h100-sxm", {"name": "h100-96gb (substitute)", "memory_bytes": 96 * 10**9}
    if "titan rtx" in low:
        note("TITAN RTX is not in the catalog: rtx-2080-ti (Turing, cc 7.5) with 72 SMs and "
               "the 23.65 GiB the OOM message states")
        return "rtx-2080-ti", _titan_rtx()
    rules = [("h100 80gb", "h100-sxm"), ("rtx 4090", "rtx-4090"), ("rtx 3090", "rtx-3090"),
             ("rtx a6000", "rtx-a6000"), ("a100-sxm4-40gb", "a100-40gb-sxm"),
             ("a100 80gb", "a100-80gb-sxm"), ("x 40gb", "a100-40gb-sxm")]
    for key, name in rules:
        if key in low:
            if key == "x 40gb":
                note("GPU not named (2 × 40GB): a100-40gb-sxm assumed")
            return name, {}
    if "40/80gb" in low:
        note("A100 40/80GB variant not stated: a100-80gb-sxm assumed")
        return "a100-80gb-sxm", {}
    if "24gb" in low:
        note("GPU not named (24 GB card, e.g. RTX 3090/4090): rtx-3090 assumed")
        return "rtx-3090", {}
    note("GPU not named: a100-80gb-sxm assumed (only the fit check depends on it)")
    return "a100-80gb-sxm", {}


def compare_for(case: dict[str, Any], note: Note) -> str:
    """Which predicted peak the published one is: allocated, reserved or device."""
    m = case["measured"]
    text = m["measure"].lower()
    if m["outcome"] != "trained" or m.get("peak_memory_bytes") is None:
        return "device"
    if "device-level" in text:
        return "device"
    if text.startswith("not stated in the readme"):
        note("peak statistic not stated (torchtune 0.3 logs active, allocated and reserved): "
               "compared with allocated (the same README's other table reports peak active)")
        return "allocated"
    if "active_bytes" in text or text.startswith("peak active"):
        note("peak active bytes compared with predicted allocated (active ≈ allocated: "
               "blocks in use, rounded)")
        return "allocated"
    if "max_memory_reserved" in text or "reserved_bytes" in text:
        return "reserved"
    if "max_memory_allocated" in text:
        return "allocated"
    note("peak statistic not stated: compared as device-level (the case's reading)")
    return "device"


# --- models -------------------------------------------------------------------------------------
def _config_fields(m: dict[str, Any]) -> dict[str, Any]:
    """A transformers config dict from the case's dimensions (model types seen in the data)."""
    ex, mt = m.get("extra", {}), m["model_type"]
    base = {"model_type": mt, "vocab_size": m["vocab_size"], "hidden_size": m["hidden_size"],
            "num_hidden_layers": m["num_hidden_layers"],
            "num_attention_heads": m["num_attention_heads"],
            "tie_word_embeddings": m["tie_word_embeddings"]}
    if mt in ("llama", "mistral"):
        base.update(intermediate_size=m["intermediate_size"], head_dim=m["head_dim"],
                    num_key_value_heads=m["num_key_value_heads"], rope_theta=ex.get("rope_theta"),
                    max_position_embeddings=ex.get("max_position_embeddings", 131072))
        if ex.get("rope_scaling") == "llama3":
            base["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}
    elif mt == "falcon":
        base.update(num_kv_heads=m["num_key_value_heads"], new_decoder_architecture=True,
                    parallel_attn=True, bias=False, alibi=False,
                    ffn_hidden_size=m["intermediate_size"])
    elif mt == "phi":
        base.update(intermediate_size=m["intermediate_size"], hidden_act="gelu_new",
                    num_key_value_heads=m["num_key_value_heads"], max_position_embeddings=2048,
                    partial_rotary_factor=ex.get("rotary_percentage", 0.5), rope_theta=10000.0)
    elif mt == "bart":
        base = {"model_type": "bart", "vocab_size": m["vocab_size"], "d_model": m["hidden_size"],
                "encoder_layers": m["num_hidden_layers"], "decoder_layers": m["num_hidden_layers"],
                "encoder_attention_heads": m["num_attention_heads"],
                "decoder_attention_heads": m["num_attention_heads"],
                "encoder_ffn_dim": m["intermediate_size"], "decoder_ffn_dim": m["intermediate_size"]}
    return {k: v for k, v in base.items() if v is not None}


def model_for(case: dict[str, Any], note: Note, litgpt: bool) -> dict[str, Any]:
    """The case's model: a catalog entry, else a transformers config from its dimensions."""
    from trainfit.model.catalog.models import find_model

    m = case["model"]
    entry = find_model(m["hf_id"]) or find_model(m["name"])
    spec: dict[str, Any] = {"litgpt": litgpt, "untie": litgpt and bool(m.get(
        "litgpt_untied_lm_head")), "dims": m}
    if entry is not None:
        spec.update(kind="catalog", name=entry.name)
        note(f"model: catalog {entry.name}")
    else:
        spec.update(kind="config", config=_config_fields(m))
        note(f"model: not in the catalog — transformers {m['model_type']} config built from "
               "the case's dimensions (random weights never needed: meta/fake build)")
    return spec
