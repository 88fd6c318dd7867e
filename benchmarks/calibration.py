"""Predicted vs published GPU training memory (benchmarks/data/published.json + our own cases).

Each case pins a configuration from the source's own files; we translate it into a JobSpec,
including the quirks of the framework that measured it (read from the case's notes):
* litgpt (Lightning): separate (untied) lm_head, head + cross-entropy in chunks of 128 tokens,
  torch AdamW with the foreach kernel, no gradient clipping in its LoRA recipes, Fabric's
  bitsandbytes precision quantizes every Linear including the head, nf4 without double quant,
  bnb PagedAdamW (32-bit) for QLoRA; peak = ``max_memory_allocated``.
* HF docs 2022 (BERT-large on a V100): Trainer with ``adamw_hf`` (a per-parameter Python loop),
  gradient clipping 1.0, CUDA 11.2 (no lazy module loading: +880 MiB context); peak = nvidia-smi.
Compare like with like: ``max_memory_allocated`` against our predicted allocated peak, nvidia-smi
against our device peak.  OOM cases must be predicted as not fitting.

Run: ``python benchmarks/calibration.py [--cases ID ...] [--workers 2]`` → results/calibration.{json,md}
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
PUBLISHED = ROOT / "data" / "published.json"
EXTRA = ROOT / "calibration_extra.json"
OUT = ROOT / "results"

OPTIMIZERS = {"adamw": ("adamw", "foreach"), "adamw_hf": ("adamw", "forloop"),
              "adafactor": ("adafactor", "fused"), "adam8bit": ("adamw-8bit", "fused"),
              "paged_adamw_32bit": ("paged-adamw", "fused"), "paged_adamw8bit": ("paged-adamw-8bit", "fused")}
GPUS = {"Tesla V100-SXM2 16GB": "v100-16gb", "NVIDIA A10G": "a10g"}


def _targets(lora: dict[str, Any]) -> list[str]:
    out = []
    for t in lora["targets"]:
        out.append("mlp" if t.startswith("mlp") else t)
    return out


def case_to_job(case: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(job fields, gpu name, options) for one published case."""
    from trainfit.model.catalog.models import find_model

    m = case["model"]
    hf_id = m["hf_id"].split(" ")[0]
    entry = find_model(hf_id) or find_model(m["name"])
    if entry is None:
        raise KeyError(f"no catalog model for {hf_id}")
    litgpt = case["id"].startswith("litgpt")
    opt, impl = OPTIMIZERS[case["optimizer"]]
    job: dict[str, Any] = {
        "model": entry.name, "method": case["method"], "seq_len": case["seq_len"],
        "micro_batch": case["micro_batch"], "grad_accum": case["grad_accum"],
        "precision": case["precision"], "optimizer": opt, "optimizer_impl": impl,
        "grad_ckpt": "full" if case["grad_ckpt"] else "off",
        "attention": "eager" if case["attention"].startswith("eager") else "sdpa",
        "max_grad_norm": None if litgpt else 1.0,
    }
    if "2022" in case.get("notes", "") or "CUDA 11.2" in case["gpu"]:
        # torch < 2.0: Trainer's model.zero_grad() kept zeroed gradients alive between steps
        job["grads_to_none"] = False
    if case["id"].startswith("hf_perf_gpu_one"):
        # transformers' perf_train_gpu_one page of Jan 2022 (transformers 4.16, before torch
        # 1.11 of Mar 2022): torch ≤ 1.10, whose softmax saved its input for the backward
        job["softmax_saves_input"] = True  # checkpointing then reentrant, as 4.16's was
    if case.get("lora"):
        job.update(lora_r=case["lora"]["r"], lora_alpha=case["lora"]["alpha"],
                   lora_dropout=case["lora"]["dropout"], lora_targets=_targets(case["lora"]))
    if case.get("quant"):
        job.update(quant=case["quant"], quant_lm_head=litgpt)
    if litgpt:
        job["lm_head_chunk"] = 128
        job["hold_outputs"] = True  # litgpt's loop holds `logits` until the next forward
        # Fabric's module wrapper converts the returned chunks to fp32 (convert_output)
        job["fp32_outputs"] = True
        job["bnb_legacy"] = bool(case.get("quant"))  # litgpt pins bitsandbytes 0.42
        job["quant_from_fp16"] = bool(case.get("quant"))  # Fabric quantizes from weight.half()
        from heldout_mapping import LITGPT_FUSES

        # litgpt's CausalSelfAttention: one q/k/v projection split into views, LoRAQKVLinear
        job["fused_qkv"] = m.get("model_type") in LITGPT_FUSES
    gpu = next(v for k, v in GPUS.items() if case["gpu"].startswith(k))
    opts = {"untie": litgpt and bool(m.get("litgpt_untied_lm_head")), "litgpt": litgpt,
            "eager_modules": "CUDA 11.2" in case["gpu"] or "CUDA 11.2" in case.get("notes", ""),
            "measure": "device" if case["measured"]["measure"].startswith("nvidia-smi")
            else "allocated"}
    return job, gpu, opts


def _litgpt_multi_query(cfg: Any) -> None:
    """lit-gpt's multi-query attention (Falcon-7B) as lit-gpt runs it in training.

    lit-gpt's CausalSelfAttention expands its one key/value head to every query head while
    training (``k.expand(...)`` then ``reshape``: copies) and calls SDPA with ``is_causal`` and no
    mask. transformers' FalconAttention of the old decoder architecture (``multi_query``) hands
    SDPA the single key head. transformers' grouped layout (``new_decoder_architecture`` with one
    key/value head and one shared layer norm) has the same weights ([q×71 | k | v] per group, as
    lit-gpt lays them out) and broadcasts k and v to every query head, copied by its flatten:
    lit-gpt's step. transformers' Falcon still builds its mask (allow_is_causal_skip=False),
    where lit-gpt passes none: SDPA's memory-efficient kernel then keeps a float copy of it per
    layer (0.5 MiB at 512 tokens) where lit-gpt's flash kernel keeps none — more, never less."""
    if getattr(cfg, "model_type", None) == "falcon" and getattr(cfg, "multi_query", False) \
            and not getattr(cfg, "new_decoder_architecture", False) \
            and getattr(cfg, "parallel_attn", False) and not getattr(cfg, "alibi", False):
        cfg.new_decoder_architecture = True
        cfg.num_kv_heads = 1
        cfg.num_ln_in_parallel_attn = 1


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    import copy

    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec
    from trainfit.memory.predict import predict_memory
    from trainfit.model.source import resolve_model

    t0 = time.perf_counter()
    fields, gpu_name, opts = case_to_job(case)
    job = JobSpec(**fields)
    source = resolve_model(job.model)
    source.config = copy.deepcopy(source.config)
    if opts["untie"]:
        source.config.tie_word_embeddings = False
    if opts["litgpt"]:
        # litgpt's GPT has no dropout layers and uses the fused tanh GELU
        for key, value in source.config.to_dict().items():
            if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
                setattr(source.config, key, 0.0)
        if getattr(source.config, "hidden_act", None) == "gelu_new":
            source.config.hidden_act = "gelu_pytorch_tanh"
        _litgpt_multi_query(source.config)
    gpu = find_gpu(gpu_name)
    pred = predict_memory(job, source, gpu, eager_module_loading=opts["eager_modules"])
    measured = case["measured"].get("peak_memory_bytes")
    predicted = pred.peak_device_bytes if opts["measure"] == "device" else pred.peak_allocated_bytes
    oom = case["measured"].get("outcome") == "OOM"
    return {
        "id": case["id"], "gpu": gpu_name, "confidence": case.get("confidence"),
        "compare": opts["measure"], "measured_bytes": measured, "predicted_bytes": predicted,
        "predicted_allocated_bytes": pred.peak_allocated_bytes,
        "predicted_reserved_bytes": pred.peak_reserved_bytes,
        "predicted_device_bytes": pred.peak_device_bytes,
        "error": None if not measured else predicted / measured - 1,
        "oom_case": oom, "predicted_fits": pred.fits,
        "oom_predicted_correctly": (not pred.fits) if oom else None,
        "job": fields, "sim_time_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="*", help="case ids (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    cases = json.loads(PUBLISHED.read_text())["cases"]
    if EXTRA.exists():
        cases += json.loads(EXTRA.read_text())["cases"]
    if args.cases:
        cases = [c for c in cases if c["id"] in args.cases]
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        results = pool.map(run_case, cases, chunksize=1)
    scored = [r for r in results if r["error"] is not None and r["confidence"] in ("high", "medium")]
    summary = {
        "cases": len(results),
        "scored_high_medium": len(scored),
        "median_abs_error": statistics.median(abs(r["error"]) for r in scored) if scored else None,
        "max_abs_error": max((abs(r["error"]) for r in scored), default=None),
        "oom_cases": sum(r["oom_case"] for r in results),
        "oom_predicted_not_fitting": sum(bool(r["oom_predicted_correctly"]) for r in results),
        "wall_time_s": time.perf_counter() - t0,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "calibration.json").write_text(json.dumps({"summary": summary, "results": results},
                                                     indent=1))
    lines = ["# Predicted vs published GPU memory", "",
             "Regenerate: `python benchmarks/calibration.py` (no GPU; ~10 min on 2 cores).", "",
             f"- cases: {summary['cases']}; scored (high/medium confidence, measured): "
             f"{summary['scored_high_medium']}",
             f"- median |error|: {summary['median_abs_error']:.1%}" if scored else "",
             f"- max |error|: {summary['max_abs_error']:.1%}" if scored else "",
             f"- OOM cases predicted as not fitting: {summary['oom_predicted_not_fitting']} of "
             f"{summary['oom_cases']}", "",
             "| case | GPU | peak compared | measured (GiB) | predicted (GiB) | error | conf. |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        meas = "OOM" if r["oom_case"] else f"{r['measured_bytes'] / 2**30:.2f}"
        err = ("fits: no ✓" if r["oom_predicted_correctly"] else "fits: yes ✗") if r["oom_case"] \
            else f"{r['error']:+.1%}"
        lines.append(f"| {r['id']} | {r['gpu']} | {r['compare']} | {meas} | "
                     f"{r['predicted_bytes'] / 2**30:.2f} | {err} | {r['confidence']} |")
    (OUT / "calibration.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
