"""Which kernel ``scaled_dot_product_attention`` runs on this GPU, left to choose by itself, for the
inputs transformers gives it: the ground truth of ``trainfit.memory.sdpa_choice.choose_sdpa_kernel``
(tests/memory/test_sdpa_choice.py checks the mirror against the file this writes).

Each configuration (dtype, head_dim, query/key heads with ``enable_gqa``, mask: none / boolean /
float / float needing a gradient, causal, dropout) runs one forward and backward under the
profiler; the kernel is named from the ATen op the profile shows (``_cudnn_attention``,
``_flash_attention``, ``_efficient_attention``, else math).

``python benchmarks/gpu_sdpa_choice.py --out DIR`` → DIR/gpu_sdpa_choice.json. Without CUDA it
says so and exits 1.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

import torch

# (dtype, head_dim, q heads, kv heads, mask, causal, dropout)
CONFIGS = [
    ("bf16", 128, 32, 32, "none", True, 0.0),
    ("bf16", 64, 32, 32, "none", True, 0.0),
    ("bf16", 128, 32, 8, "none", True, 0.0),     # GQA, enable_gqa (transformers without a mask)
    ("bf16", 64, 32, 8, "none", True, 0.0),
    ("bf16", 64, 14, 2, "none", True, 0.0),
    ("bf16", 256, 16, 16, "none", True, 0.0),    # gemma-7b's head_dim
    ("bf16", 96, 32, 32, "none", True, 0.0),     # phi-2's
    ("bf16", 128, 32, 32, "bool", False, 0.0),   # a padded batch's mask
    ("bf16", 128, 32, 32, "float", False, 0.0),
    ("bf16", 64, 8, 8, "float_grad", False, 0.1),  # T5's self-attention: a learned bias
    ("bf16", 64, 8, 8, "float", False, 0.1),       # T5's cross-attention
    ("bf16", 64, 12, 12, "none", True, 0.1),       # GPT-2 with attention dropout
    ("fp16", 128, 32, 32, "none", True, 0.0),
    ("fp32", 64, 12, 12, "none", True, 0.0),
]
B, S = 2, 512


def _dtype(name: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def kernel_of(cfg: tuple, dev: torch.device) -> str:
    from torch.profiler import ProfilerActivity, profile

    dt, hd, hq, hkv, mask_kind, causal, p = cfg
    q = torch.randn(B, hq, S, hd, device=dev, dtype=_dtype(dt), requires_grad=True)
    k, v = (torch.randn(B, hkv, S, hd, device=dev, dtype=_dtype(dt), requires_grad=True)
            for _ in range(2))
    mask: Any = None
    if mask_kind == "bool":
        mask = torch.ones(B, 1, S, S, device=dev, dtype=torch.bool).tril()
    elif mask_kind.startswith("float"):
        mask = torch.randn(B, hq, S, S, device=dev, dtype=_dtype(dt),
                           requires_grad=mask_kind == "float_grad")
    acts = [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, enable_gqa=hq != hkv)
        out.sum().backward()
    names = " ".join(e.key for e in prof.key_averages())
    for kernel, marker in (("cudnn", "_cudnn_attention"), ("flash", "_flash_attention"),
                           ("efficient", "_efficient_attention")):
        if marker in names:
            return kernel
    return "math"


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("gpu_sdpa_choice: no CUDA device here; nothing measured, nothing written")
        return 1
    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for cfg in CONFIGS:
        try:
            kernel = kernel_of(cfg, dev)
        except RuntimeError as err:
            kernel = f"error: {str(err).splitlines()[0][:120]}"
        keys = ("dtype", "head_dim", "q_heads", "kv_heads", "mask", "causal", "dropout")
        rows.append({**dict(zip(keys, cfg, strict=True)), "kernel": kernel})
        print(rows[-1], flush=True)
    major, minor = torch.cuda.get_device_capability(dev)
    doc = {"device": torch.cuda.get_device_name(dev), "compute_capability": [major, minor],
           "torch": torch.__version__, "date": datetime.date.today().isoformat(),
           "batch": B, "seq": S, "rows": rows}
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path(".")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_sdpa_choice.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
