"""Simulated peak vs the same step really run on this CPU (profiler alloc/free replay).

The simulation is run with CPU semantics (``SimTarget(device="cpu")``) so that both sides do the
same thing; this checks the mechanism (real model code on data-less tensors + live-bytes count),
independent of the GPU-specific rules, which calibration.py checks against published GPU numbers.

Run: ``python benchmarks/cpu_truth.py`` → results/cpu_truth.{json,md} (~3 min on 2 cores).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results"


def models() -> dict[str, Any]:
    from transformers import GPT2Config, LlamaConfig, T5Config

    from trainfit.model.source import ModelSource

    return {
        "llama-h256-l4": ModelSource("llama-h256-l4", LlamaConfig(
            hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, vocab_size=8000, max_position_embeddings=512),
            "causal-lm", "local"),
        "gpt2-h256-l4": ModelSource("gpt2-h256-l4", GPT2Config(
            n_embd=256, n_layer=4, n_head=8, vocab_size=8000, n_positions=512),
            "causal-lm", "local"),
        "t5-d256-l3": ModelSource("t5-d256-l3", T5Config(
            d_model=256, d_ff=1024, num_layers=3, num_decoder_layers=3, num_heads=4, d_kv=64,
            vocab_size=8000), "seq2seq-lm", "local"),
    }


CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 1}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 4}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 8}),
    ("llama-h256-l4", {"method": "full", "precision": "amp-bf16", "micro_batch": 2}),
    ("llama-h256-l4", {"method": "full", "precision": "bf16-true", "micro_batch": 4}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 4,
                       "grad_ckpt": "full"}),
    ("llama-h256-l4", {"method": "full", "precision": "amp-bf16", "micro_batch": 2,
                       "grad_ckpt": "full"}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 2,
                       "optimizer_impl": "forloop"}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 2,
                       "optimizer_impl": "foreach"}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 2, "grad_accum": 4}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 2, "optimizer": "adafactor"}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 2, "optimizer": "sgd"}),
    ("llama-h256-l4", {"method": "lora", "precision": "fp32", "micro_batch": 4, "lora_targets": "q,k,v,o"}),
    ("llama-h256-l4", {"method": "lora", "precision": "bf16-true", "micro_batch": 4,
                       "lora_targets": "all-linear"}),
    ("llama-h256-l4", {"method": "lora", "precision": "fp32", "micro_batch": 2, "grad_ckpt": "full"}),
    ("llama-h256-l4", {"method": "lora", "precision": "fp32", "micro_batch": 2, "lm_head_chunk": 64,
                       "lora_targets": "q,v,lm_head"}),
    ("llama-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 2, "attention": "eager"}),
    ("gpt2-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 4}),
    ("gpt2-h256-l4", {"method": "full", "precision": "amp-bf16", "micro_batch": 2}),
    ("gpt2-h256-l4", {"method": "full", "precision": "fp32", "micro_batch": 2, "grad_ckpt": "full"}),
    ("gpt2-h256-l4", {"method": "lora", "precision": "fp32", "micro_batch": 4}),
    ("t5-d256-l3", {"method": "full", "precision": "fp32", "micro_batch": 4}),
    ("t5-d256-l3", {"method": "lora", "precision": "fp32", "micro_batch": 2}),
    ("t5-d256-l3", {"method": "full", "precision": "fp32", "micro_batch": 2, "grad_accum": 2}),
]


def main() -> int:
    warnings.filterwarnings("ignore")
    from trainfit.job import JobSpec
    from trainfit.memory.cpu_truth import measure_cpu_step
    from trainfit.memory.simulate import SimTarget, simulate_step

    srcs = models()
    results = []
    for name, kw in CONFIGS:
        job = JobSpec(model=name, seq_len=256, **kw)
        t0 = time.perf_counter()
        sim = simulate_step(job, srcs[name], SimTarget(device="cpu"))
        t1 = time.perf_counter()
        real = measure_cpu_step(job, srcs[name])
        t2 = time.perf_counter()
        err = sim.peak_allocated_bytes / real.peak_allocated_bytes - 1
        results.append({"model": name, "config": kw, "predicted_peak_bytes": sim.peak_allocated_bytes,
                        "measured_peak_bytes": real.peak_allocated_bytes, "error": err,
                        "predicted_phase": sim.peak_phase, "sim_time_s": t1 - t0,
                        "cpu_run_time_s": t2 - t1})
        print(f"{name:16s} {kw} {err:+.4%}", flush=True)
    errs = [abs(r["error"]) for r in results]
    summary = {"configs": len(results), "within_1pct": sum(e <= 0.01 for e in errs),
               "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
    OUT.mkdir(exist_ok=True)
    (OUT / "cpu_truth.json").write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    lines = ["# Simulated vs real CPU step (peak live bytes)", "",
             "Regenerate: `python benchmarks/cpu_truth.py` (torch profiler alloc/free replay; seq 256, "
             "2 optimizer steps).", "",
             f"- {summary['within_1pct']} of {summary['configs']} configurations within 1 %; median "
             f"|error| {summary['median_abs_error']:.4%}, max {summary['max_abs_error']:.4%}", "",
             "| model | configuration | measured (MiB) | predicted (MiB) | error | peak in |",
             "|---|---|---|---|---|---|"]
    for r in results:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        lines.append(f"| {r['model']} | {cfg} | {r['measured_peak_bytes'] / 2**20:.2f} | "
                     f"{r['predicted_peak_bytes'] / 2**20:.2f} | {r['error']:+.4%} | "
                     f"{r['predicted_phase']} |")
    (OUT / "cpu_truth.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
