"""GPU specification record and its helpers (see gpus.py for what each number means)."""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1024**2
GIB = 1024**3

DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "int8")
_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32", "tensorfloat32": "tf32",
    "float16": "fp16", "half": "fp16", "f16": "fp16", "bfloat16": "bf16", "i8": "int8",
}

CUDA_CONTEXT_BASE_BYTES = 515 * MIB
"""Measured: on an H100 SXM (torch 2.11 + CUDA 13.0, driver 580) cudaMemGetInfo's used memory
after trainfit's probe steps was 751-779 MiB above max_memory_reserved over 25 configurations
(benchmarks/results/gpu_measured.json), of which 264 MiB is the per-thread stack (132 SMs × 2048
threads × 1 KiB): 515 MiB of driver, runtime and lazily loaded kernels, the largest seen. Older
stacks' OOM reports put it at ~300 MiB (A100, RTX 4090; gpus.py): those are now over-predicted
by ~0.2 GiB, the side the fit can afford."""
CUDA_STACK_BYTES_PER_THREAD = 1024
EAGER_MODULE_LOADING_EXTRA_BYTES = 880 * MIB
GENERIC_CUDA_CONTEXT_BYTES = 400 * MIB

PCIE3_X16_GBS = 15.75
PCIE4_X16_GBS = 31.5
PCIE5_X16_GBS = 63.0


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU model; see the module docstring for the meaning of each number."""

    name: str
    display_name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    memory_source: str
    peak_tflops: dict[str, float | None] = field(hash=False)
    memory_bandwidth_gbs: float | None
    bf16_supported: bool
    compute_capability: str | None
    sm_count: int | None
    cuda_context_bytes: int
    interconnect: str
    interconnect_gbs: float | None
    source: str
    link_ranks: int = 8
    """The most ranks ``interconnect`` joins: one host's GPUs (an HGX / DGX board's 8, a PCIe
    server's 8 slots). More ranks span hosts, whose network (InfiniBand, RoCE, Ethernet) no GPU
    datasheet gives: plan's speed is then unknown unless ``--interconnect`` gives the link."""

    def __post_init__(self) -> None:
        if set(self.peak_tflops) != set(DTYPES):
            raise ValueError(f"{self.name}: peak_tflops keys must be {DTYPES}")
        if self.memory_bytes <= 0:
            raise ValueError(f"{self.name}: memory_bytes must be positive")

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s (OP/s for int8) for ``dtype``, or None if unsupported.

        Accepts the catalog keys and common spellings ("bfloat16", "torch.float16").
        """
        key = dtype.lower().removeprefix("torch.")
        key = _DTYPE_ALIASES.get(key, key)
        if key not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
        tflops = self.peak_tflops[key]
        return None if tflops is None else tflops * 1e12


def _peaks(
    fp32: float, tf32: float | None, fp16: float, bf16: float | None, int8: float | None
) -> dict[str, float | None]:
    return {"fp32": fp32, "tf32": tf32, "fp16": fp16, "bf16": bf16, "int8": int8}


def _ctx(sm_count: int, max_threads_per_sm: int) -> int:
    stack = sm_count * max_threads_per_sm * CUDA_STACK_BYTES_PER_THREAD
    return CUDA_CONTEXT_BASE_BYTES + stack
