"""The invariants of tests/plan/test_invariants.py at catalog scale, on the plans users reported.

For each case ``plan()`` runs as the CLI runs it, and every row is checked: breakdown terms ≥ 0
summing to the allocated peak, allocated and device peaks non-decreasing in the micro-batch
within a (precision, checkpointing) group, reserved ≥ allocated, ``fits`` against the capacity,
▲ only on the largest fitting micro-batch of its group, MFU and HFU within [0, 1] and HFU ≥ MFU
on full fine-tuning, and the memory ladder lowering the peak at every rung.  Ten extrapolated
rows per case are re-simulated at full size: allocated within 1 %, and the extrapolated allocator
reserve not below the full-size replay's.

Run: ``python benchmarks/invariants.py`` → results/invariants.{json,md}; ``--cases 5 6``: only
those entries of CASES (by index), merged into the previous results.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
CASES = [
    {"model": "qwen2.5-7b", "gpu": "h100", "job": {"method": "full", "ranks": 8,
                                                   "sharding": "fsdp"}},
    {"model": "mistral-7b", "gpu": "3090", "job": {}},
    {"model": "llama-2-7b", "gpu": "a10g", "job": {"method": "lora", "effective_batch": 16}},
    {"model": "qwen2.5-7b", "gpu": "a100-80gb", "job": {"method": "qlora", "ranks": 2,
                                                        "sharding": "fsdp"}},
    # found by a new-user pass (2026-11-27): the amp checkpointed rows at micro-batch 1 read
    # 39.0 GiB against 23.5 simulated (a peak moment moving between the small depths)
    {"model": "llama-3.2-1b", "gpu": "rtx-3060-12gb",
     "job": {"method": "full", "seq_len": 2048, "effective_batch": 32}},
    # Answer.AI's fsdp_qlora as a user plans it: FSDP1's wrap replayed before the step
    # (fsdp_init, memory/wrap.py) must keep every invariant and extrapolate in depth
    {"model": "llama-2-7b", "gpu": "3090",
     "job": {"method": "qlora", "ranks": 2, "sharding": "fsdp", "fsdp_init": "wrap-sync"}},
    # litgpt's loop as a user plans it: chunked head, logits held to the next forward and
    # converted to fp32 by Fabric (fp32_outputs) — a head-side term that must extrapolate
    {"model": "llama-2-7b", "gpu": "a100-40gb",
     "job": {"method": "lora", "lora_targets": "q,v", "lm_head_chunk": 128,
             "hold_outputs": True, "fp32_outputs": True, "max_grad_norm": None}},
    # torchtune 0.1's QLoRA as a user plans it: torchao 0.1's quantizer history before the step
    # (quant_lib, memory/loading.py), one per base weight, and its layers deep-copied from a
    # template (clone_layers), each copy quantized again, must extrapolate in depth
    {"model": "llama-2-7b", "gpu": "rtx-4090",
     "job": {"method": "qlora", "quant_lib": "torchao-0.1", "precision": "bf16-true",
             "max_grad_norm": None, "clone_layers": True}},
    # torchtune 0.1's bf16 LoRA on one GPU: the template layer freed into the cache before the
    # step, its copies in the trace (clone_layers)
    {"model": "llama-2-7b", "gpu": "rtx-4090",
     "job": {"method": "lora", "lora_targets": "q,v", "lora_r": 8, "lora_alpha": 16,
             "precision": "bf16-true", "max_grad_norm": None, "clone_layers": True}},
    # lit-gpt's QLoRA as a user plans it: q/k/v as views of one fused projection with lit-gpt's
    # LoRA (fused_qkv), every Linear 4-bit incl. the head, and bitsandbytes < 0.43.2 keeping
    # each 4-bit matmul's input with the logits held to the next forward (bnb_legacy)
    {"model": "llama-2-7b", "gpu": "a100-40gb",
     "job": {"method": "qlora", "lora_targets": "q,v", "fused_qkv": True, "lm_head_chunk": 128,
             "hold_outputs": True, "fp32_outputs": True, "quant_lm_head": True,
             "bnb_legacy": True, "quant_from_fp16": True, "max_grad_norm": None}},
    # a 70B QLoRA over two cards, the users' scenario (catalog entry added 2026-11-30)
    {"model": "llama-3.1-70b", "gpu": "a100-80gb",
     "job": {"method": "qlora", "ranks": 2, "sharding": "fsdp"}},
    # a mixture of experts: grouped matmuls (bf16) or transformers' fallback loop (fp32/fp16),
    # experts 16-bit under QLoRA, sharded (catalog entry added 2026-11-30)
    {"model": "mixtral-8x7b", "gpu": "a100-80gb",
     "job": {"method": "qlora", "ranks": 2, "sharding": "fsdp"}},
    # sliding and global attention layers alternating: extrapolated in pairs (model/depth.py,
    # 2026-11-30; they were simulated at full depth), one GPU and 8-rank FSDP
    {"model": "gemma-2-9b", "gpu": "rtx-4090",
     "job": {"method": "qlora", "seq_len": 2048, "effective_batch": 16, "attention": "eager"}},
    {"model": "gemma-2-2b", "gpu": "a100-80gb",
     "job": {"method": "full", "ranks": 8, "sharding": "fsdp", "effective_batch": 64,
             "attention": "eager"}},
    # a multimodal checkpoint (2026-11-30): Gemma-3-4B as AutoModelForCausalLM builds it, its
    # vision tower held (4-bit under QLoRA) but not run, on seed 000's card
    {"model": "gemma-3-4b", "gpu": "t4",
     "job": {"method": "qlora", "seq_len": 1024, "effective_batch": 8}},
    # transformers' flash_attention_2 (2026-12-06): no T×T mask, the GQA heads as they are, and
    # for Gemma-2 (no SDPA) built eager then run through the attention interface with its softcap
    {"model": "gemma-2-2b", "gpu": "rtx-4090",
     "job": {"method": "qlora", "seq_len": 2048, "effective_batch": 16,
             "attention": "flash-attention-2"}},
    {"model": "llama-3.1-8b", "gpu": "rtx-4090",
     "job": {"method": "lora", "seq_len": 4096, "effective_batch": 16,
             "attention": "flash-attention-2"}},
    # a padded batch's mask (2026-12-06): none at micro-batch 1, a B×1×S×S one above it
    {"model": "llama-3.1-8b", "gpu": "a100-80gb",
     "job": {"method": "lora", "seq_len": 2048, "effective_batch": 32, "padded": "longest"}},
    # the same padded under flash_attention_2 (2026-12-07): q, k, v unpadded, the output padded
    # back, the variable-length kernel once over the rows; nothing padded at micro-batch 1
    {"model": "llama-3.1-8b", "gpu": "a100-80gb",
     "job": {"method": "lora", "seq_len": 2048, "effective_batch": 32, "padded": "longest",
             "attention": "flash-attention-2"}},
    # compiled (2026-12-07): the blocks as AOTAutograd's graphs, the variable-length kernel a
    # custom op carrying its rows through them
    {"model": "llama-3.2-1b", "gpu": "a100-80gb",
     "job": {"method": "lora", "seq_len": 2048, "effective_batch": 32, "padded": "longest",
             "attention": "flash-attention-2", "compile": True}},
]
FULL_SIZE_CHECKS = 12
"""Extrapolated rows per case re-simulated at full size: each (precision, checkpointing) group's
smallest micro-batch first (where the moment a phase peaks moves with depth: the small depths
hold the fewest activations against the same gradients), then rows spread over the rest."""


def _ladder_checks(c: Any, res: Any) -> None:
    # a rung that takes back a change the fitting rung made needless (undoes) raises the peak
    # by design, and must still fit
    peaks = [r.peak_device_bytes for r in res.ladder if getattr(r, "undoes", None) is None]
    for a, b in itertools.pairwise(peaks):
        c.check("every ladder rung lowers the peak", b < a, f"{res.model}: {peaks}")
    for r in res.ladder:
        if getattr(r, "undoes", None) is not None:
            c.check("a rung taking a change back still fits", r.fits is True,
                    f"{res.model}: {r.change}")


def run_case(case: dict[str, Any], T: Any) -> dict[str, Any]:
    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec
    from trainfit.model.source import resolve_model
    from trainfit.plan.grid import plan

    src = resolve_model(case["model"])
    gpu = find_gpu(case["gpu"])
    t0 = time.perf_counter()
    res = plan(JobSpec(model=case["model"], **case["job"]), src, gpu)
    plan_s = time.perf_counter() - t0
    c = T.Checked()
    T.check_plan(c, res)
    _ladder_checks(c, res)
    fulls = []
    for row in _checked_rows([r for r in res.rows if r.how == "extrapolated"]):
        exact = _full(row, src, gpu)
        fulls.append(exact)
        c.check("extrapolated allocated within 1 % of full size",
                abs(exact["allocated_error"]) <= T.EXTRAPOLATION_TOLERANCE, json.dumps(exact))
        c.check("extrapolated reserved >= full-size replay",
                exact["extrapolated_reserve_bytes"] >= exact["simulated_reserve_bytes"],
                json.dumps(exact))
    return {**case, "configurations": c.configurations, "plan_s": round(plan_s, 1),
            "violations": dict(c.violations), "examples": c.examples, "full_size": fulls,
            "ladder_gib": [round(r.peak_device_bytes / 2**30, 2) for r in res.ladder]}


def _checked_rows(extrap: list[Any]) -> list[Any]:
    """Up to FULL_SIZE_CHECKS rows: every group's smallest micro-batch, then a spread."""
    first: dict[tuple[str, str], Any] = {}
    for r in extrap:
        key = (r.job.precision, r.job.grad_ckpt)
        if key not in first or r.job.micro_batch < first[key].job.micro_batch:
            first[key] = r
    chosen = list(first.values())[:FULL_SIZE_CHECKS]
    rest = [r for r in extrap if all(r is not c for c in chosen)]
    room = FULL_SIZE_CHECKS - len(chosen)
    if room > 0 and rest:
        chosen += rest[::max(1, len(rest) // room)][:room]
    return chosen


def _full(row: Any, src: Any, gpu: Any) -> dict[str, Any]:
    from trainfit.memory.predict import predict_memory

    exact = predict_memory(row.job, src, gpu)
    m = row.memory
    return {"precision": row.job.precision, "grad_ckpt": row.job.grad_ckpt,
            "micro_batch": row.job.micro_batch, "grad_accum": row.job.grad_accum,
            "extrapolated_allocated_bytes": m.peak_allocated_bytes,
            "simulated_allocated_bytes": exact.peak_allocated_bytes,
            "allocated_error": m.peak_allocated_bytes / exact.peak_allocated_bytes - 1,
            "extrapolated_reserve_bytes": m.peak_reserved_bytes - m.peak_allocated_bytes,
            "simulated_reserve_bytes": exact.peak_reserved_bytes - exact.peak_allocated_bytes}


def _markdown(cases: list[dict[str, Any]], total: int, violations: int) -> str:
    lines = ["# Invariants at catalog scale", "",
             "`python benchmarks/invariants.py`: the invariants of tests/plan/test_invariants.py "
             "on the plans users reported (every row of each plan checked; "
             f"{FULL_SIZE_CHECKS} extrapolated rows per plan re-simulated at full size).", "",
             f"**{total} configurations checked, {violations} violations.**", "",
             "| model | GPU | job | configurations | plan s | violations | ladder (GiB) |",
             "|---|---|---|---|---|---|---|"]
    for c in cases:
        lines.append(f"| {c['model']} | {c['gpu']} | {json.dumps(c['job'])} | "
                     f"{c['configurations']} | {c['plan_s']} | {c['violations'] or 0} | "
                     f"{c['ladder_gib'] or '—'} |")
    lines += ["", "Extrapolated rows against full-size simulations:", "",
              "| model | precision | ckpt | micro × accum | allocated error | reserve extrapolated "
              "/ simulated (MiB) |", "|---|---|---|---|---|---|"]
    for c in cases:
        for f in c["full_size"]:
            lines.append(f"| {c['model']} | {f['precision']} | {f['grad_ckpt']} | "
                         f"{f['micro_batch']} × {f['grad_accum']} | {f['allocated_error']:+.3%} | "
                         f"{f['extrapolated_reserve_bytes'] / 2**20:.0f} / "
                         f"{f['simulated_reserve_bytes'] / 2**20:.0f} |")
    return "\n".join(lines) + "\n"


def _key(case: dict[str, Any]) -> str:
    """A case's identity in the results: its model, GPU and job."""
    return json.dumps([case["model"], case["gpu"], case["job"]], sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warnings.filterwarnings("ignore")
    # one process: the full-size checks build models in this process, and a worker pool forked
    # after that deadlocks (plan/workers.py: SimulationWorkers)
    os.environ["TRAINFIT_WORKERS"] = "1"
    sys.path.insert(0, str(ROOT / "tests" / "plan"))
    import invariant_checks as T  # the checks themselves, shared with the test

    only = [int(a) for a in argv[argv.index("--cases") + 1:]] if "--cases" in argv else None
    if only is not None and not (OUT / "invariants.json").exists():
        print("error: --cases merges into a previous full run's results\n"
              "hint: run python benchmarks/invariants.py once without --cases", file=sys.stderr)
        return 2
    if only is not None and any(not 0 <= i < len(CASES) for i in only):
        print(f"error: --cases {only}: CASES has {len(CASES)} entries (0 … {len(CASES) - 1})",
              file=sys.stderr)
        return 2
    if only is None:
        cases = [run_case(case, T) for case in CASES]
    else:
        done = {_key(c): c for c in json.loads((OUT / "invariants.json").read_text())["cases"]}
        for i in only:
            c = run_case(CASES[i], T)
            done[_key(c)] = c
        cases = [done[_key(c)] for c in CASES if _key(c) in done]
    total = sum(c["configurations"] for c in cases)
    violations = sum(sum(c["violations"].values()) for c in cases)
    OUT.mkdir(exist_ok=True)
    (OUT / "invariants.json").write_text(json.dumps(
        {"configurations": total, "violations": violations, "cases": cases}, indent=1) + "\n")
    (OUT / "invariants.md").write_text(_markdown(cases, total, violations))
    print(f"{total} configurations checked, {violations} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
