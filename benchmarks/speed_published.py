"""Predicted vs published training throughput (benchmarks/throughput_published.json).

Cases used:
* HF docs BERT-large on a V100 (9 configurations; samples/s × 512 tokens): the same job mapping as
  calibration.py.
* llm-foundry MPT (GPT-2-style blocks, amp-bf16, flash attention) on 8× A100-80GB, models up to 3B
  and sequences up to 4096: tokens/s per GPU predicted as one GPU running its micro-batch; FSDP's
  collectives are assumed hidden behind compute (not modelled yet) and the sharded optimizer's
  share is small at their large accumulation — stated, and a source of error.

Run: ``python benchmarks/speed_published.py`` → results/speed_published.{json,md}
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"


def _mpt_source(case: dict[str, Any]) -> Any:
    from transformers import GPT2Config

    from trainfit.model.source import ModelSource

    m = case["model"]
    cfg = GPT2Config(n_embd=m["hidden_size"], n_layer=m["num_hidden_layers"],
                     n_head=m["num_attention_heads"], n_inner=m["intermediate_size"],
                     vocab_size=m["vocab_size"], n_positions=m["seq_len"], resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_pytorch_tanh")
    return ModelSource(m["name"], cfg, "causal-lm", "local")


def predict_case(case: dict[str, Any]) -> dict[str, Any]:
    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec
    from trainfit.memory.extrapolate import fit_group
    from trainfit.memory.predict import target_for
    from trainfit.speed.predict import model_flops_per_token
    from trainfit.speed.roofline import DeviceSpeed

    gpu = find_gpu("a100-80gb-sxm")
    src = _mpt_source(case)
    job = JobSpec(model=src.name, method="full", precision="amp-bf16", seq_len=case["model"]["seq_len"],
                  micro_batch=case["micro_batch"], grad_accum=case["grad_accum"] or 1,
                  grad_ckpt="full" if case["grad_ckpt"] else "off", optimizer_impl="foreach")
    model = fit_group(job.replace(micro_batch=2, grad_accum=2), src, target_for(gpu))
    p = model.predict(job.micro_batch, accumulating=True)
    fpt = model_flops_per_token(src.config, p["total_params"], p["trainable_params"], job.seq_len,
                                True)
    sp = model.speed(DeviceSpeed.from_gpu(gpu), job, fpt)
    return {"id": case["id"], "group": case["group"], "measured_tokens_per_s": case["measured"][
        "tokens_per_s_per_gpu"], "predicted_tokens_per_s": sp.tokens_per_s,
        "measured_mfu": case["measured"]["mfu"], "predicted_mfu": sp.mfu}


def predict_bert(case: dict[str, Any]) -> dict[str, Any]:
    from calibration import case_to_job
    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec
    from trainfit.model.source import resolve_model
    from trainfit.plan.grid import plan

    fields, gpu_name, _ = case_to_job(case)
    job = JobSpec(**fields)
    res = plan(job, resolve_model(job.model), find_gpu(gpu_name), margin=0.0)
    sp = res.rows[0].speed
    measured = case["measured"]["throughput"]["value"] * case["seq_len"]
    return {"id": case["id"], "group": "hf_docs_v100_bert_large",
            "measured_tokens_per_s": measured, "predicted_tokens_per_s": sp.tokens_per_s,
            "measured_mfu": None, "predicted_mfu": sp.mfu}


def main() -> int:
    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(ROOT))
    from calibration import PUBLISHED

    results = []
    for case in json.loads(PUBLISHED.read_text())["cases"]:
        if case["id"].startswith("hf_perf") and (case["measured"].get("throughput") or {}).get("value"):
            results.append(predict_bert(case))
            print(results[-1], flush=True)
    for case in json.loads((ROOT / "throughput_published.json").read_text())["cases"]:
        m = case["model"]
        if case["group"] == "llmfoundry_a100_80gb_x8" and m["n_params"] <= 3.5e9 \
                and 1024 <= m["seq_len"] <= 4096:
            results.append(predict_case(case))
            print(results[-1], flush=True)
    for r in results:
        r["error"] = r["predicted_tokens_per_s"] / r["measured_tokens_per_s"] - 1
    errs = [abs(r["error"]) for r in results]
    pairs = agree = 0
    for i, a in enumerate(results):
        for b in results[i + 1:]:
            if a["group"] != b["group"]:
                continue
            ma, mb = a["measured_tokens_per_s"], b["measured_tokens_per_s"]
            if abs(ma - mb) / min(ma, mb) > 0.10:
                pairs += 1
                agree += (ma < mb) == (a["predicted_tokens_per_s"] < b["predicted_tokens_per_s"])
    summary = {"cases": len(results), "median_abs_error": statistics.median(errs),
               "max_abs_error": max(errs), "order_pairs_gt_10pct": pairs, "order_agreement": agree}
    OUT.mkdir(exist_ok=True)
    (OUT / "speed_published.json").write_text(json.dumps({"summary": summary, "results": results},
                                                         indent=1))
    lines = ["# Predicted vs published training throughput", "",
             "Regenerate: `python benchmarks/speed_published.py`.", "",
             f"- {summary['cases']} cases: median |error| {summary['median_abs_error']:.1%}, "
             f"max {summary['max_abs_error']:.1%}",
             f"- order within a source (pairs differing > 10 %): {agree} of {pairs} correct", "",
             "| case | measured tokens/s (per GPU) | predicted | error | measured MFU | "
             "predicted MFU |", "|---|---|---|---|---|---|"]
    for r in results:
        mm = "" if r["measured_mfu"] is None else f"{r['measured_mfu']:.1%}"
        pm = "" if r["predicted_mfu"] is None else f"{r['predicted_mfu']:.1%}"
        lines.append(f"| {r['id']} | {r['measured_tokens_per_s']:,.0f} | "
                     f"{r['predicted_tokens_per_s']:,.0f} | {r['error']:+.1%} | {mm} | {pm} |")
    (OUT / "speed_published.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
