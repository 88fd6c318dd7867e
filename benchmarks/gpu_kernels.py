"""The kernel rates the speed model takes per GPU family (``trainfit.speed.kernels``), measured on
the GPU this runs on: bf16 GEMMs (the best large shape, as MAMF takes it, and the shapes of a
1B and a 7B model's training step), IEEE fp32 and TF32 GEMMs, an unaligned-vocabulary head,
scaled_dot_product_attention forward+backward (flash and memory-efficient back-ends, causal,
head_dim 128 and 64, S = 512…16k at a fixed 16k tokens), and a streaming copy.

Each figure is the median of ``REPS`` CUDA-event timings after warm-up, as a fraction of the
catalog's datasheet peak of the GPU CUDA reports (``trainfit.hardware.gpus``), beside the rate the
speed model assumes for that family. Attention FLOPs are FlashAttention's convention (causal:
half the S² work; backward 2.5× forward), the convention of ``Attention.eff_inf``.

Without CUDA it says so, writes nothing and exits 1; ``--device cpu`` runs every code path at toy
sizes (a dry run, nothing written). Where a GPU is: ``python benchmarks/gpu_kernels.py`` →
results/gpu_kernels.{json,md}; ``--render`` rewrites the markdown from the JSON (no GPU).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parent / "results"
REPS = 20
TOKENS = 16384
"""Attention sweep: batch × sequence kept at this many tokens, as a training step keeps it."""

# (label, M, N, K): M = tokens of a step (8192), N × K the weight; the 1B shapes are
# Llama-3.2-1B's (2048 hidden, 8192 ffn), the 7B ones Llama-2/Mistral-7B's (4096, 11008/14336)
GEMMS = [
    ("best: 8192³", 8192, 8192, 8192),
    ("1B qkv/o: 8192×2048×2048", 8192, 2048, 2048),
    ("1B ffn up: 8192×8192×2048", 8192, 8192, 2048),
    ("1B ffn down: 8192×2048×8192", 8192, 2048, 8192),
    ("7B qkv/o: 8192×4096×4096", 8192, 4096, 4096),
    ("7B ffn up: 8192×14336×4096", 8192, 14336, 4096),
    ("7B ffn down: 8192×4096×14336", 8192, 4096, 14336),
    ("7B weight grad: 4096×4096×8192", 4096, 4096, 8192),
    ("small: 2048×768×768 (GPT-2, 2k tokens)", 2048, 768, 768),
    ("head aligned: 8192×50304×768", 8192, 50304, 768),
    ("head unaligned: 8192×50257×768", 8192, 50257, 768),
]
SEQS = [512, 1024, 2048, 4096, 8192, 16384]
SWEEP_MIB = [0.25, 1, 4, 16, 64, 256, 1024]  # one operand's size, MiB (bf16 add: 3 moved)


def _time(fn, reps: int = REPS, warm: int = 3) -> tuple[float, float]:
    """Median and spread (max − min over the reps) in seconds, CUDA events around each call."""
    for _ in range(warm):
        fn()
    if not torch.cuda.is_available():
        import time

        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts), max(ts) - min(ts)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts), max(ts) - min(ts)


def gemms(dev: torch.device, scale: int) -> list[dict[str, Any]]:
    rows = []
    for label, m, n, k in GEMMS:
        m, n, k = max(m // scale, 1), max(n // scale, 1), max(k // scale, 1)
        for dtype, mode in ((torch.bfloat16, "bf16"), (torch.float32, "fp32"), (torch.float32, "tf32")):
            if mode != "bf16" and not label.startswith(("best", "7B qkv")):
                continue
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            # two operand sets used in turn: 8192² bf16 is 128 MiB, past the L2 anyway
            sets = [(torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype))
                    for _ in range(2)]
            i = [0]

            def run(sets=sets, i=i) -> None:
                a, b = sets[i[0] % 2]
                i[0] += 1
                torch.mm(a, b)

            t, spread = _time(run)
            rows.append({"kernel": "gemm", "label": label, "mode": mode, "m": m, "n": n, "k": k,
                         "time_s": t, "spread_s": spread, "tflops": 2 * m * n * k / t / 1e12})
            del sets
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def attention(dev: torch.device, scale: int) -> list[dict[str, Any]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    # "default": what SDPA picks by itself (what a transformers model without an
    # attn_implementation gets); its kernel is named from a profiler trace of one call
    backends: list[tuple[str, Any]] = [
        ("default", None), ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    if dev.type == "cpu":
        backends = [("default", None), ("math", SDPBackend.MATH)]
    for hd, heads in ((128, 32), (64, 12)):
        for seq in SEQS:
            s = max(seq // scale, 8)
            b = max(TOKENS // seq, 1)
            if hd == 64 and seq > 8192:
                continue
            q, k, v = (torch.randn(b, heads, s, hd, device=dev, dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            g = torch.randn(b, heads, s, hd, device=dev, dtype=torch.bfloat16)
            # FlashAttention's convention: forward 4·B·H·S²·D, halved for causal; backward 2.5×
            fwd_flops = 4 * b * heads * s * s * hd / 2
            for name, be in backends:
                def fwd(be=be, q=q, k=k, v=v) -> torch.Tensor:
                    with sdpa_kernel(be) if be is not None else contextlib.nullcontext():
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

                def fwd_bwd(fwd=fwd, g=g, qkv=(q, k, v)) -> None:
                    fwd().backward(g)
                    for t in qkv:
                        t.grad = None

                try:
                    t_f, sp_f = _time(fwd)
                    t_fb, sp_fb = _time(fwd_bwd)
                except RuntimeError as err:  # a back-end that does not take this shape
                    rows.append({"kernel": "attention", "backend": name, "head_dim": hd, "seq": s,
                                 "batch": b, "heads": heads, "error": str(err).splitlines()[0][:160]})
                    continue
                rows.append({"kernel": "attention", "backend": name, "head_dim": hd, "seq": s,
                             "batch": b, "heads": heads, "kernels": _kernel_names(fwd_bwd),
                             "fwd_time_s": t_f, "fwd_spread_s": sp_f,
                             "fwd_bwd_time_s": t_fb, "fwd_bwd_spread_s": sp_fb,
                             "fwd_tflops": fwd_flops / t_f / 1e12,
                             "fwd_bwd_tflops": 3.5 * fwd_flops / t_fb / 1e12})
            del q, k, v, g
    return rows


def _kernel_names(fn) -> list[str]:
    """The device kernels one call of ``fn`` runs (profiler), largest total time first."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    ev = [e for e in prof.key_averages() if getattr(e, "self_device_time_total" if kind == "cuda"
                                                    else "self_cpu_time_total", 0) > 0]
    ev.sort(key=lambda e: -(e.self_device_time_total if kind == "cuda" else e.self_cpu_time_total))
    return [e.key[:90] for e in ev[:4]]


def bandwidth(dev: torch.device, scale: int) -> list[dict[str, Any]]:
    n = (1 << 28) // scale  # 256 Mi elements of fp32: 1 GiB read + 1 GiB written
    x = torch.randn(n, device=dev)
    y = torch.empty_like(x)
    t, sp = _time(lambda: y.copy_(x))
    rows = [{"kernel": "copy", "bytes": 2 * x.numel() * 4, "time_s": t, "spread_s": sp,
             "gbs": 2 * x.numel() * 4 / t / 1e9}]
    z = torch.randn(n, device=dev)
    t, sp = _time(lambda: torch.add(x, z, alpha=2.0, out=y))
    rows.append({"kernel": "add", "bytes": 3 * x.numel() * 4, "time_s": t, "spread_s": sp,
                 "gbs": 3 * x.numel() * 4 / t / 1e9})
    # the same elementwise kernel by size (bf16, as a training step's activations are): a step's
    # elementwise kernels move 0.1-100 MB each, and a kernel that small pays its start and its
    # tail at any bandwidth; on an H200 the memory-bound steps gained 4-16 % over an H100 where
    # 4.8 / 3.35 TB/s would give 43 % (gpu_validate_h200.md). The curve measures that ramp.
    for mib in SWEEP_MIB:
        n = int(mib * 2**20) // 2 // scale
        a, b = torch.randn(n, device=dev, dtype=torch.bfloat16), torch.randn(
            n, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(a)
        t, sp = _time(lambda a=a, b=b, out=out: torch.add(a, b, out=out), reps=50)
        rows.append({"kernel": "add-by-size", "bytes": 3 * n * 2, "time_s": t, "spread_s": sp,
                     "gbs": 3 * n * 2 / t / 1e9})
    return rows


def measure(dev: torch.device) -> dict[str, Any]:
    scale = 1 if dev.type == "cuda" else 32
    torch.manual_seed(0)
    doc: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "date": datetime.date.today().isoformat()}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        doc.update(device=torch.cuda.get_device_name(dev), total_memory_bytes=p.total_memory,
                   sms=p.multi_processor_count)
    else:
        doc.update(device="cpu (dry run)", total_memory_bytes=None)
    doc["rows"] = []
    for part in (bandwidth, gemms, attention):
        doc["rows"] += part(dev, scale)
        print(json.dumps(doc["rows"][-1]), flush=True)
    return doc


def _spec(doc: dict[str, Any]):
    from trainfit.hardware.gpus import find_gpu_by_device_name
    from trainfit.speed.kernels import kernels_for

    gpu = find_gpu_by_device_name(doc["device"], doc.get("total_memory_bytes"))
    if gpu is None:
        return None, None
    return gpu, kernels_for(gpu.compute_capability, gpu.name)


def _short(kernels: list[str]) -> str:
    """The back-end SDPA picked, from the name of its largest kernel."""
    k = kernels[0].lower()
    for word in ("cudnn", "for_cpu", "flash", "efficient", "fmha", "cutlass"):
        if word in k:
            return {"fmha": "efficient", "cutlass": "efficient", "for_cpu": "cpu flash"}.get(word, word)
    return kernels[0][:30]


def shape_ratio(gpu: Any, row: dict[str, Any]) -> float | None:
    """The speed model's time for a measured GEMM's shape over the measured time (0.78: predicted
    22 % faster than it ran); None where the model has no rate for it (TF32, an unknown GPU)."""
    from trainfit.speed.roofline import DeviceSpeed, gemm_time

    if gpu is None or row["mode"] not in ("bf16", "fp32"):
        return None
    t = gemm_time(DeviceSpeed.from_gpu(gpu), (1, row["m"], row["n"], row["k"]), row["mode"],
                  aligned="unaligned" not in row["label"])
    return None if t is None else t / row["time_s"]


def render(doc: dict[str, Any]) -> str:
    """The markdown table: each measured rate as a fraction of the datasheet peak, beside the rate
    trainfit's speed model assumes for the family (kernel benchmark, before its step factors) and,
    for a GEMM, what the model predicts for that very shape (:func:`shape_ratio`)."""
    from trainfit.speed.kernels import GEMM_SHAPE_FACTOR

    gpu, fam = _spec(doc)
    bf16 = gpu.peak_tflops.get("bf16") if gpu else None
    fp32 = gpu.peak_tflops.get("fp32") if gpu else None
    tf32 = gpu.peak_tflops.get("tf32") if gpu else None
    bw = gpu.memory_bandwidth_gbs if gpu else None
    lines = [f"# Kernel rates measured on {doc['device']}", "",
             f"Measured {doc['date']} by `python benchmarks/gpu_kernels.py` (torch {doc['torch']}, "
             f"CUDA {doc['cuda']}); trainfit's entry: {gpu.name if gpu else 'unknown'}"
             + (f", family {fam.family}" if fam else "") + ". Median of "
             f"{REPS} CUDA-event timings after 3 warm-ups; fraction = measured / datasheet dense "
             "peak (TFLOP/s = 1e12 FLOP/s, GB/s = 1e9 B/s).", "",
             "The last column is the speed model's own time for each GEMM's shape "
             "(`trainfit.speed.roofline.gemm_time`: the family's rate, its wave quantization over "
             "128 × 128 output tiles, split-K, the unaligned-row factor), as predicted / measured "
             "time: below 1 the model is too fast for that shape, above 1 too slow.", "",
             "| kernel | measured | fraction of peak | trainfit assumes | trainfit's time for the "
             "shape / measured |", "|---|---|---|---|---|"]

    def frac(x: float, peak: float | None) -> str:
        return f"{x / peak:.3f}" if peak else "unknown"

    ratios: list[float] = []

    for r in doc["rows"]:
        if r["kernel"] in ("copy", "add"):
            assumed = f"stream {fam.bandwidth_stream:.2f}, in a step {fam.bandwidth_efficiency:.2f}" \
                if fam else "unknown"
            lines.append(f"| {r['kernel']} ({r['bytes'] / 2**30:.0f} GiB moved) | {r['gbs']:,.0f} GB/s "
                         f"| {frac(r['gbs'], bw)} | {assumed} | — |")
        elif r["kernel"] == "add-by-size":
            assumed = f"in a step {fam.bandwidth_efficiency:.2f}" if fam else "unknown"
            lines.append(f"| add, bf16 ({r['bytes'] / 2**20:,.2f} MiB moved) | {r['gbs']:,.0f} GB/s "
                         f"({r['time_s'] * 1e6:,.1f} µs) | {frac(r['gbs'], bw)} | {assumed} | — |")
        elif r["kernel"] == "gemm":
            peak = {"bf16": bf16, "fp32": fp32, "tf32": tf32}[r["mode"]]
            if fam is None:
                assumed = "unknown"
            elif r["mode"] == "bf16":
                assumed = (f"best {fam.gemm_mamf:.2f}" if r["label"].startswith("best") else
                           f"in a step {fam.gemm_efficiency:.2f} (= {fam.gemm_mamf:.2f} × "
                           f"{GEMM_SHAPE_FACTOR})")
                if "unaligned" in r["label"]:
                    assumed += f" × unaligned {fam.gemm_unaligned:.2f}"
            elif r["mode"] == "fp32":
                assumed = f"in a step {fam.gemm_efficiency_fp32:.2f}"
            else:
                assumed = "—"
            ratio = shape_ratio(gpu, r)
            shape = "—" if ratio is None else (f"{ratio * r['time_s'] * 1e6:,.1f} µs / "
                                               f"{r['time_s'] * 1e6:,.1f} µs = {ratio:.2f}")
            if ratio is not None:
                ratios.append(ratio)
            lines.append(f"| GEMM {r['mode']} {r['label']} | {r['tflops']:,.1f} TFLOP/s | "
                         f"{frac(r['tflops'], peak)} | {assumed} | {shape} |")
        elif "error" in r:
            lines.append(f"| SDPA {r['backend']} hd{r['head_dim']} S={r['seq']} | not run: "
                         f"{r['error']} | | | |")
        else:
            if fam is None:
                att = None
            elif r["backend"] == "efficient":
                att = fam.efficient
            elif r["backend"] in ("default", "cudnn") and fam.cudnn is not None:
                att = fam.cudnn
            else:
                att = fam.flash
            hd = r["head_dim"]
            assumed = ("unknown" if att is None else
                       f"kernel {att.efficiency(r['seq'], hd) / att.step_factor:.3f}, in a step "
                       f"{att.efficiency(r['seq'], hd):.3f}")
            lines.append(f"| SDPA {r['backend']} causal hd{r['head_dim']} S={r['seq']} ×{r['batch']} "
                         f"fwd+bwd | {r['fwd_bwd_tflops']:,.1f} TFLOP/s (fwd {r['fwd_tflops']:,.1f}) | "
                         f"{frac(r['fwd_bwd_tflops'], bf16)} | {assumed} | — |")
            if r["backend"] == "default" and r.get("kernels"):
                lines[-1] = lines[-1].replace("| SDPA default", f"| SDPA default ({_short(r['kernels'])})", 1)
    if ratios:
        ratios.sort()
        lines += ["", f"trainfit's time for the shape / measured, over the {len(ratios)} GEMMs it "
                      f"times: median {statistics.median(ratios):.2f}, range {ratios[0]:.2f} … "
                      f"{ratios[-1]:.2f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    # ``--name h200``: another device's rates, in gpu_kernels_h200.{json,md}
    name = f"_{argv[argv.index('--name') + 1]}" if "--name" in argv else ""
    if "--render" in argv:
        doc = json.loads((OUT / f"gpu_kernels{name}.json").read_text())
        (OUT / f"gpu_kernels{name}.md").write_text(render(doc))
        print(render(doc))
        return 0
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else OUT
    if "--device" in argv and argv[argv.index("--device") + 1] == "cpu":
        doc = measure(torch.device("cpu"))
        print(render(doc))
        return 0
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device here; nothing measured, nothing written "
              "(run it on a machine with a GPU)")
        return 1
    doc = measure(torch.device("cuda", torch.cuda.current_device()))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpu_kernels{name}.json").write_text(json.dumps(doc, indent=1))
    (out / f"gpu_kernels{name}.md").write_text(render(doc))
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
