"""DeepSpeed ZeRO-2/3's hooks: their host cost per micro-step, measured on a CPU and fitted to counts.

``trainfit.speed.zero_hooks`` predicts the Python DeepSpeed runs around a micro-step from counts
of the model as it trains (module hook calls, partitioned parameters fetched, trainable
parameters' gradient hooks).  This measures it: each case in its own process (a ZeRO-3 engine
leaves process-wide state), DeepSpeed on one gloo rank with its CPU accelerator, a tiny Llama
(hidden 32: its widths keep the real ratio to HF's "auto" persistence threshold of 10 × hidden),
its forward + backward under the engine against an identical plain model's, interleaved in
``ROUNDS`` rounds, each repeat timed in reference ops (``host_timing.reference_op_s`` around it:
the VM's speed drifts ~2× within minutes).  ``stage3_max_reuse_distance`` 0: every fetch
gathers again, as at scale.  The gradient accumulation is left unfinished (no optimizer step:
its cost is the optimizer's, timed apart by plan).  The extra ops are then fitted by least
squares (ZeRO-3: module calls, fetches, trainable parameters; ZeRO-2: trainable parameters)
and written with each case's residual.

Needs DeepSpeed (``scripts/test.sh`` puts 0.19.8 under build/reference; ``--deepspeed DIR``
elsewhere).  Run: ``python benchmarks/zero_hooks.py`` → results/zero_hooks.{json,md} (~4 min).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
HIDDEN = 32
ROUNDS = int(os.environ.get("ZERO_HOOKS_ROUNDS", "7"))
"""Rounds of timed repeats (fewer: tests/benchmarks/test_zero_hooks_bench.py checks the run, not the
time)."""
REPEATS = 8
# (stage, layers, method, lora_r, checkpointed)
CASES = [(3, 2, "full", 0, False), (3, 6, "full", 0, False), (3, 4, "full", 0, True),
         (3, 8, "full", 0, False), (3, 4, "lora", 8, False), (3, 4, "lora", 16, False),
         (3, 4, "lora", 16, True), (3, 6, "lora", 8, True),
         (2, 2, "full", 0, False), (2, 6, "full", 0, False), (2, 4, "lora", 8, False),
         (2, 6, "lora", 16, False)]


def _model(layers: int, method: str, r: int, checkpointed: bool) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64))
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=r, lora_alpha=2 * r, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj"]))
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _ds_config(stage: int) -> dict[str, Any]:
    h = HIDDEN
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": h * h}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * h * h),
                    stage3_param_persistence_threshold=10 * h, stage3_max_reuse_distance=0)
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 10**6,
            "bf16": {"enabled": False},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
            "zero_optimization": zero, "steps_per_print": 10**9}


def _case(stage: int, layers: int, method: str, r: int, checkpointed: bool) -> dict[str, Any]:
    """One case, in this process (the child)."""
    import importlib

    import torch

    torch.set_num_threads(1)  # as plan times a GPU step's host side (speed/host.one_thread)
    import deepspeed

    from trainfit.speed.host_timing import reference_op_s
    from trainfit.speed.zero_hooks import hook_counts

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    plain = _model(layers, method, r, checkpointed)
    wrapped = _model(layers, method, r, checkpointed)
    counts = hook_counts(wrapped, HIDDEN, checkpointed)
    engine, *_ = deepspeed.initialize(
        model=wrapped, model_parameters=[p for p in wrapped.parameters() if p.requires_grad],
        config=_ds_config(stage))
    # what DeepSpeed itself partitioned, and the modules whose forward runs (where its hooks
    # fire: a hook of our own on each module of the identical plain model, one forward)
    partitioned = sum(1 for p in wrapped.parameters() if not getattr(p, "ds_persist", True))
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    fired: list[int] = []
    handles = [m.register_forward_pre_hook(lambda *_: fired.append(1)) for m in plain.modules()]
    with torch.no_grad():
        plain(**batch)
    for h in handles:
        h.remove()

    def run_plain() -> None:
        plain(**batch).loss.backward()

    def run_ds() -> None:
        engine.backward(engine(**batch).loss)

    def ops(fn: Any, ref: float) -> list[float]:
        out = []
        for _ in range(REPEATS):
            t = time.thread_time()
            fn()
            out.append((time.thread_time() - t) / ref)
        return out

    for _ in range(3):  # warm-up: ZeRO-3 records its trace in the first micro-steps
        run_plain()
        run_ds()
    plain_ops: list[float] = []
    ds_ops: list[float] = []
    refs: list[float] = []
    for _ in range(ROUNDS):
        ref = statistics.median(reference_op_s() for _ in range(3))
        refs.append(ref)
        plain_ops += ops(run_plain, ref)
        ds_ops += ops(run_ds, ref)
    return {"stage": stage, "layers": layers, "method": method, "lora_r": r,
            "checkpointed": checkpointed, "modules": counts.modules,
            "module_calls": counts.module_calls, "fetches": counts.fetches,
            "partitioned": counts.partitioned, "trainable": counts.trainable,
            "modules_run": len(fired),
            "deepspeed_partitioned": partitioned if stage == 3 else None,
            "plain_ops": statistics.median(plain_ops), "deepspeed_ops": statistics.median(ds_ops),
            "extra_ops": statistics.median(ds_ops) - statistics.median(plain_ops),
            "reference_op_us": statistics.median(refs) * 1e6}


COLUMNS = {3: ("per_micro_step", "module_calls", "fetches", "trainable"),
           2: ("per_micro_step", "trainable")}
"""What each stage's extra cost is fitted over: a fixed cost per micro-step (the engine's own
forward and backward wrappers) and the counts of ``trainfit.speed.zero_hooks.HookCounts``."""


def _nnls(a: Any, b: Any) -> Any:
    """Least squares with every coefficient ≥ 0 (a cost cannot be negative): the best of the
    unconstrained fits over each subset of the columns whose coefficients all come out ≥ 0 —
    exact for these few columns, and numpy alone."""
    import itertools

    import numpy as np

    best, best_err = np.zeros(a.shape[1]), float(b @ b)
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            c, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (c < 0).any():
                continue
            full = np.zeros(a.shape[1])
            full[list(cols)] = c
            err = float(((a @ full) - b) @ ((a @ full) - b))
            if err < best_err:
                best, best_err = full, err
    return best


def _fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    import numpy as np

    fit: dict[str, float] = {}
    for stage, cols in COLUMNS.items():
        mine = [r for r in rows if r["stage"] == stage]
        a = np.array([[1.0 if c == "per_micro_step" else r[c] for c in cols] for r in mine])
        coef = _nnls(a, np.array([r["extra_ops"] for r in mine]))
        fit.update({f"zero{stage}_ops_{c}": float(v) for c, v in zip(cols, coef, strict=True)})
    return fit


def _predicted(row: dict[str, Any], fit: dict[str, float]) -> float:
    return sum(fit[f"zero{row['stage']}_ops_{c}"] * (1.0 if c == "per_micro_step" else row[c])
               for c in COLUMNS[row["stage"]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepspeed", type=Path, default=None,
                    help="directory DeepSpeed is installed in (default: build/reference/deepspeed-*)")
    ap.add_argument("--case", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--refit", action="store_true",
                    help="fit the cases in results/zero_hooks.json again, measuring nothing")
    args = ap.parse_args()
    if args.case is not None:
        print(json.dumps(_case(*CASES[args.case])))
        return
    if args.refit:
        saved = json.loads((OUT / "zero_hooks.json").read_text())
        _write(saved["deepspeed"], saved["cases"])
        return
    found = args.deepspeed or next(iter(sorted((ROOT.parent / "build" / "reference").glob(
        "deepspeed-*"))), None)
    if found is None:
        sys.exit("error: DeepSpeed not found\nhint: bash scripts/test.sh installs it under "
                 "build/reference, or give --deepspeed DIR")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0", "MASTER_ADDR": "127.0.0.1",
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT.parent / "src"), str(found),
                                          os.environ.get("PYTHONPATH", "")])}
    rows = []
    for i, case in enumerate(CASES):
        proc = subprocess.run([sys.executable, __file__, "--case", str(i)], capture_output=True,
                              text=True, timeout=900, env={**env, "MASTER_PORT": str(29650 + i)})
        line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode or not line:
            sys.exit(f"error: case {case} failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(line[-1]))
        print(rows[-1], flush=True)
    _write(found.name.removeprefix("deepspeed-"), rows)


def _write(version: str, rows: list[dict[str, Any]]) -> None:
    fit = _fit(rows)
    for r in rows:
        r["fitted_ops"] = _predicted(r, fit)
        r["residual_pct"] = 100.0 * (r["fitted_ops"] - r["extra_ops"]) / r["extra_ops"]
    OUT.mkdir(exist_ok=True)
    (OUT / "zero_hooks.json").write_text(json.dumps(
        {"deepspeed": version, "hidden": HIDDEN, "rounds": ROUNDS, "repeats": REPEATS,
         "fit": fit, "cases": rows}, indent=1) + "\n")
    lines = [f"# DeepSpeed {version} ZeRO hooks: host cost per micro-step (measured, reference ops)",
             "", "One gloo rank on this CPU, tiny Llama (hidden 32), `python benchmarks/"
             "zero_hooks.py` (`--refit`: the fit again from the JSON). Fit (reference ops, each ≥ 0): "
             + ", ".join(f"{k} {v:.1f}" for k, v in fit.items()) + ".", "",
             "| stage | layers | method | ckpt | module calls | fetches | trainable | plain step "
             "| extra (measured) | extra (fitted) | residual |", "|" + "---|" * 11]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['layers']} | {r['method']}"
                     f"{' r' + str(r['lora_r']) if r['lora_r'] else ''} | "
                     f"{'full' if r['checkpointed'] else 'off'} | {r['module_calls']} | "
                     f"{r['fetches']} | {r['trainable']} | {r['plain_ops']:,.0f} | "
                     f"{r['extra_ops']:,.0f} | {r['fitted_ops']:,.0f} | {r['residual_pct']:+.1f} % |")
    (OUT / "zero_hooks.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(fit))


if __name__ == "__main__":
    main()
