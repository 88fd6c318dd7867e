"""Catalog of GPUs: memory as CUDA reports it, dense peak throughput, bandwidth.

* ``memory_bytes``: the total CUDA gives a process (torch ``total_memory`` ==
  ``cudaMemGetInfo`` total == deviceQuery), i.e. PyTorch's OOM "total capacity".
  nvidia-smi/NVML often show more (T4 15360 vs 15102 MiB, H100 81559 vs ~81090
  MiB: they count driver-reserved memory); that figure is only quoted in
  ``memory_source``.  The CUDA total moves by up to ~0.5 % between drivers.
* ``peak_tflops``: DENSE (no 2:4 sparsity) vendor peaks, TFLOP/s (TOPS for
  int8).  fp32 = non-tensor; tf32 = TF32 tensor; fp16/bf16 = tensor with FP32
  accumulate, the mode mixed-precision training uses (GeForce cards and the A10G
  run it at half the FP16-accumulate rate: RTX 4090 165.2, not 330.3); int8 =
  INT8 TOPS.  None = unsupported.
* ``memory_bandwidth_gbs``/``interconnect_gbs``: GB/s (1e9).  The interconnect
  figure is theoretical, per GPU and per direction: PCIe gen3/4/5 x16 =
  15.75/31.5/63, NVLink2/3/4 = 150/300/450 (half the bidirectional datasheet).
* ``cuda_context_bytes``: what nvidia-smi shows for the process beyond PyTorch's
  caching allocator after a training step, with CUDA lazy module loading (the
  default since PyTorch 1.13 + CUDA 11.7): ``CUDA_CONTEXT_BASE_BYTES`` (300 MiB:
  driver/runtime plus lazily loaded PyTorch/cuBLAS kernels) + the stack the
  driver reserves for every resident thread (1 KiB x max threads/SM x SMs; 216
  MiB on an A100).  Checked against PyTorch OOM reports (in use - allocated -
  reserved-unallocated): ~500 MiB on A100 40/80GB (model 516), 460-500 MiB on
  RTX 4090 (model 492); PyTorch issues #107667/#109888 quote 300-400 MiB for a
  bare context.  Without lazy loading (CUDA < 11.7, CUDA_MODULE_LOADING=EAGER)
  add ``EAGER_MODULE_LOADING_EXTRA_BYTES``: 460 + 880 MiB reproduces the 1343 MiB
  the Hugging Face docs measured on a V100 with CUDA 11.2.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

MIB = 1024**2
GIB = 1024**3

DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "int8")
_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32", "tensorfloat32": "tf32",
    "float16": "fp16", "half": "fp16", "f16": "fp16", "bfloat16": "bf16", "i8": "int8",
}

CUDA_CONTEXT_BASE_BYTES = 300 * MIB
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


_A100 = _peaks(19.5, 156.0, 312.0, 312.0, 624.0)
_H100_SXM = _peaks(67.0, 494.7, 989.4, 989.4, 1978.9)
_RTX3080 = _peaks(29.8, 29.8, 59.5, 59.5, 238.0)
_A100_SRC = (
    "NVIDIA A100 datasheet: FP32 19.5, TF32 156, BF16/FP16 312, INT8 624 TOPS dense; "
    "1555 GB/s (40GB), 2039 GB/s (80GB SXM), 1935 GB/s (80GB PCIe); "
    "NVLink3 600 GB/s bidirectional on SXM4"
)
_RTX3080_SRC = (
    "NVIDIA Ampere GA102 whitepaper v1 (RTX 3080): FP32 29.8; dense tensor FP16/BF16 "
    "with FP32 accumulate 59.5 (119 with FP16 acc), TF32 29.8, INT8 238; 760 GB/s"
)

_CATALOG: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="t4", display_name="Tesla T4",
        aliases=("t4", "tesla-t4", "nvidia-t4", "t4-16gb"),
        memory_bytes=15_835_398_144,
        memory_source="torch total_memory 15102 MiB (Colab/Kaggle); deviceQuery shows "
        "14918-15110 MiB across drivers; nvidia-smi 15360 MiB",
        peak_tflops=_peaks(8.1, None, 65.0, None, 130.0),
        memory_bandwidth_gbs=320.0, bf16_supported=False, compute_capability="7.5",
        sm_count=40, cuda_context_bytes=_ctx(40, 1024),
        interconnect="pcie3x16", interconnect_gbs=PCIE3_X16_GBS,
        source="NVIDIA T4 datasheet: FP32 8.1, mixed FP16/FP32 65, INT8 130 TOPS; "
        "320 GB/s; PCIe gen3 x16; no TF32/BF16 (Turing)",
    ),
    GpuSpec(
        name="v100-16gb", display_name="Tesla V100-SXM2-16GB",
        aliases=("v100", "v100-16gb", "v100-16g", "v100-sxm2-16gb", "tesla-v100"),
        memory_bytes=16_945_512_448,
        memory_source="deviceQuery/NVML 16160 MiB (16945512448 B), several reports; "
        "newer nvidia-smi 16384 MiB",
        peak_tflops=_peaks(15.7, None, 125.0, None, 62.8),
        memory_bandwidth_gbs=900.0, bf16_supported=False, compute_capability="7.0",
        sm_count=80, cuda_context_bytes=_ctx(80, 2048),
        interconnect="nvlink2", interconnect_gbs=150.0,
        source="NVIDIA V100 datasheet / Volta whitepaper (SXM2): FP32 15.7, tensor "
        "FP16 "
        "125; 900 GB/s; NVLink2 300 GB/s bidirectional. INT8 = DP4A (no INT8 tensor "
        "cores). PCIe V100 (14 / 112 TFLOPS) maps here too",
    ),
    GpuSpec(
        name="v100-32gb", display_name="Tesla V100-SXM2-32GB",
        aliases=("v100-32gb", "v100-32g", "v100-sxm2-32gb"),
        memory_bytes=34_089_730_048,
        memory_source="deviceQuery 32510 MiB (34089730048 B), CUDA 11.2/11.4 drivers; "
        "32494-32511 MiB on others",
        peak_tflops=_peaks(15.7, None, 125.0, None, 62.8),
        memory_bandwidth_gbs=900.0, bf16_supported=False, compute_capability="7.0",
        sm_count=80, cuda_context_bytes=_ctx(80, 2048),
        interconnect="nvlink2", interconnect_gbs=150.0,
        source="NVIDIA V100 datasheet (SXM2 32GB): as V100 16GB",
    ),
    GpuSpec(
        name="rtx-3080-10gb", display_name="NVIDIA GeForce RTX 3080",
        aliases=("rtx-3080", "3080", "rtx-3080-10gb", "3080-10gb"),
        memory_bytes=10_472_390_656,
        memory_source="deviceQuery 9987 MiB (10472390656 B), Linux driver 525; Windows "
        "reports 10240 MiB; nvidia-smi 10240 MiB",
        peak_tflops=_RTX3080,
        memory_bandwidth_gbs=760.0, bf16_supported=True, compute_capability="8.6",
        sm_count=68, cuda_context_bytes=_ctx(68, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS, source=_RTX3080_SRC,
    ),
    GpuSpec(
        name="rtx-3080-12gb", display_name="NVIDIA GeForce RTX 3080 (12 GB)",
        aliases=("rtx-3080-12gb", "3080-12gb"),
        memory_bytes=12_629_508_096,
        memory_source="ESTIMATE: the Linux CUDA total of a 12 GB GA10x card (RTX 3060 "
        "12GB deviceQuery 12044 MiB); no RTX 3080 12GB measurement found",
        peak_tflops=_peaks(30.6, 30.6, 61.3, 61.3, 245.1),
        memory_bandwidth_gbs=912.0, bf16_supported=True, compute_capability="8.6",
        sm_count=70, cuda_context_bytes=_ctx(70, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: GA102 whitepaper per-SM rates x 70 SMs x 1710 MHz boost; "
        "384-bit 19 Gbps GDDR6X = 912 GB/s",
    ),
    GpuSpec(
        name="rtx-3080-20gb", display_name="NVIDIA GeForce RTX 3080 (20 GB, modded)",
        aliases=("rtx-3080-20gb", "3080-20gb", "rtx-3080-20gb-modded"),
        memory_bytes=21_160_263_680,
        memory_source="ESTIMATE: 20480 MiB less ~300 MiB driver reservation (10 GB "
        "3080 loses 253 MiB, 24 GB 3090 338 MiB) = 20180 MiB",
        peak_tflops=_RTX3080,
        memory_bandwidth_gbs=760.0, bf16_supported=True, compute_capability="8.6",
        sm_count=68, cuda_context_bytes=_ctx(68, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="Chinese-market modded board (GA102, 2 GB GDDR6X chips), not an NVIDIA "
        "SKU: specs taken = RTX 3080 10GB. " + _RTX3080_SRC,
    ),
    GpuSpec(
        name="rtx-3090", display_name="NVIDIA GeForce RTX 3090",
        aliases=("rtx-3090", "3090", "rtx-3090-24gb"),
        memory_bytes=25_414_860_800,
        memory_source="deviceQuery 24238 MiB (25414860800 B), CUDA 12.1/12.2 drivers; "
        "24268 MiB on 11.x drivers; nvidia-smi 24576 MiB",
        peak_tflops=_peaks(35.6, 35.6, 71.0, 71.0, 284.7),
        memory_bandwidth_gbs=936.0, bf16_supported=True, compute_capability="8.6",
        sm_count=82, cuda_context_bytes=_ctx(82, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA GA102 whitepaper v1 (RTX 3090): FP32 35.6; dense FP16/BF16 with "
        "FP32 accumulate 71, TF32 35.6, INT8 284; 936 GB/s (NVLink bridge optional)",
    ),
    GpuSpec(
        name="rtx-4090", display_name="NVIDIA GeForce RTX 4090",
        aliases=("rtx-4090", "4090", "rtx-4090-24gb"),
        memory_bytes=25_393_692_672,
        memory_source="torch total_memory / cudaMemGetInfo 25393692672 B (24217 MiB), "
        "several Linux reports; nvidia-smi 24564 MiB",
        peak_tflops=_peaks(82.6, 82.6, 165.2, 165.2, 660.6),
        memory_bandwidth_gbs=1008.0, bf16_supported=True, compute_capability="8.9",
        sm_count=128, cuda_context_bytes=_ctx(128, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA Ada (AD102) whitepaper (RTX 4090): FP32 82.6; dense FP16/BF16 "
        "with FP32 acc 165.2 (330.3 with FP16 acc), TF32 82.6, INT8 660.6; 1008 GB/s; "
        "no NVLink, no P2P",
    ),
    GpuSpec(
        name="a10g", display_name="NVIDIA A10G",
        aliases=("a10g", "nvidia-a10g", "a10g-24gb"),
        memory_bytes=23_609_475_072,
        memory_source="A10 deviceQuery 22515.75 MiB (driver 535); an idle A10G shows "
        "23028 MiB total / 22515 MiB free in nvidia-smi, i.e. the same CUDA total",
        peak_tflops=_peaks(35.0, 35.0, 70.0, 70.0, 140.0),
        memory_bandwidth_gbs=600.0, bf16_supported=True, compute_capability="8.6",
        sm_count=80, cuda_context_bytes=_ctx(80, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="no NVIDIA datasheet (AWS G5 part): 80 SMs x 1710 MHz, GeForce-rate "
        "tensor cores (half-rate FP32 accumulate) -> 70 BF16/FP16, 35 TF32, 140 INT8, "
        "35 FP32; 600 GB/s. Public matmul benchmark reaches 69.5 TFLOPS BF16",
    ),
    GpuSpec(
        name="a10", display_name="NVIDIA A10",
        aliases=("a10", "a10-24gb"),
        memory_bytes=23_609_475_072,
        memory_source="deviceQuery 22516 MiB (23609475072 B), driver 535; 22599 MiB on "
        "driver 570; nvidia-smi 23028 MiB",
        peak_tflops=_peaks(31.2, 62.5, 125.0, 125.0, 250.0),
        memory_bandwidth_gbs=600.0, bf16_supported=True, compute_capability="8.6",
        sm_count=72, cuda_context_bytes=_ctx(72, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA A10 datasheet: FP32 31.2, TF32 62.5, BF16/FP16 125, INT8 250 "
        "dense; 600 GB/s; PCIe gen4 x16",
    ),
    GpuSpec(
        name="l4", display_name="NVIDIA L4",
        aliases=("l4", "l4-24gb"),
        memory_bytes=23_612_293_120,
        memory_source="deviceQuery 22518 MiB (23612293120 B), driver 525; nvidia-smi "
        "23034 MiB",
        peak_tflops=_peaks(30.3, 60.0, 121.0, 121.0, 242.5),
        memory_bandwidth_gbs=300.0, bf16_supported=True, compute_capability="8.9",
        sm_count=58, cuda_context_bytes=_ctx(58, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA L4 datasheet (sparse figures halved): FP32 30.3, TF32 60, "
        "BF16/FP16 121, INT8 242.5; 300 GB/s; PCIe gen4 x16",
    ),
    GpuSpec(
        name="l40s", display_name="NVIDIA L40S",
        aliases=("l40s", "l40s-48gb"),
        memory_bytes=47_576_711_168,
        memory_source="deviceQuery 45373 MiB (47576711168 B), driver 550; a torch "
        "print "
        "of 45589 MiB also seen; nvidia-smi 46068 MiB",
        peak_tflops=_peaks(91.6, 183.0, 366.0, 366.0, 733.0),
        memory_bandwidth_gbs=864.0, bf16_supported=True, compute_capability="8.9",
        sm_count=142, cuda_context_bytes=_ctx(142, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA L40S datasheet (sparse figures halved): FP32 91.6, TF32 183, "
        "BF16/FP16 366, INT8 733; 864 GB/s; PCIe gen4 x16",
    ),
    GpuSpec(
        name="rtx-a6000", display_name="NVIDIA RTX A6000",
        aliases=("rtx-a6000", "a6000", "a6000-48gb"),
        memory_bytes=51_040_485_376,
        memory_source="torch total_memory 48676 MiB (3 reports, MiB-rounded); "
        "deviceQuery "
        "48790 MiB on driver 565; nvidia-smi 49140 MiB",
        peak_tflops=_peaks(38.7, 77.4, 154.8, 154.8, 309.7),
        memory_bandwidth_gbs=768.0, bf16_supported=True, compute_capability="8.6",
        sm_count=84, cuda_context_bytes=_ctx(84, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA RTX A6000 datasheet / GA102 whitepaper: FP32 38.7, TF32 77.4, "
        "BF16/FP16 (FP32 acc, full rate) 154.8, INT8 309.7; 768 GB/s",
    ),
    GpuSpec(
        name="a100-40gb-sxm", display_name="NVIDIA A100-SXM4-40GB",
        aliases=("a100-40gb", "a100-40g", "a100-sxm4-40gb", "a100-40gb-sxm4"),
        memory_bytes=42_505_273_344,
        memory_source="torch total_memory 40536 MiB (older drivers); deviceQuery shows "
        "40339 MiB on driver 535, 40441 MiB on 580; nvidia-smi 40960 MiB",
        peak_tflops=_A100,
        memory_bandwidth_gbs=1555.0, bf16_supported=True, compute_capability="8.0",
        sm_count=108, cuda_context_bytes=_ctx(108, 2048),
        interconnect="nvlink3", interconnect_gbs=300.0, source=_A100_SRC,
    ),
    GpuSpec(
        name="a100-40gb-pcie", display_name="NVIDIA A100-PCIE-40GB",
        aliases=("a100-pcie-40gb", "a100-40gb-pcie"),
        memory_bytes=42_298_834_944,
        memory_source="deviceQuery 40339 MiB (42298834944 B), driver 535, 4 reports; "
        "40326-40441 MiB on drivers 550-580",
        peak_tflops=_A100,
        memory_bandwidth_gbs=1555.0, bf16_supported=True, compute_capability="8.0",
        sm_count=108, cuda_context_bytes=_ctx(108, 2048),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS, source=_A100_SRC,
    ),
    GpuSpec(
        name="a100-80gb-sxm", display_name="NVIDIA A100-SXM4-80GB",
        aliases=("a100", "a100-80gb", "a100-80g", "a100-sxm4-80gb", "a100-80gb-sxm4"),
        memory_bytes=85_095_874_560,
        memory_source="torch total_memory 81153.75 MiB; deviceQuery 81158 MiB on "
        "driver "
        "555, 81051 MiB on 535; nvidia-smi 81920 MiB",
        peak_tflops=_A100,
        memory_bandwidth_gbs=2039.0, bf16_supported=True, compute_capability="8.0",
        sm_count=108, cuda_context_bytes=_ctx(108, 2048),
        interconnect="nvlink3", interconnect_gbs=300.0, source=_A100_SRC,
    ),
    GpuSpec(
        name="a100-80gb-pcie", display_name="NVIDIA A100 80GB PCIe",
        aliases=("a100-80gb-pcie", "a100-pcie-80gb"),
        memory_bytes=84_974_239_744,
        memory_source="deviceQuery 81038 MiB (84974239744 B), driver 550; OOM message "
        "'total capacity of 79.14 GiB' agrees; nvidia-smi 81920 MiB",
        peak_tflops=_A100,
        memory_bandwidth_gbs=1935.0, bf16_supported=True, compute_capability="8.0",
        sm_count=108, cuda_context_bytes=_ctx(108, 2048),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS, source=_A100_SRC,
    ),
    GpuSpec(
        name="h100-sxm", display_name="NVIDIA H100 80GB HBM3",
        aliases=("h100", "h100-80gb", "h100-sxm5", "h100-80gb-hbm3", "h100-sxm-80gb"),
        memory_bytes=85_028_896_768,
        memory_source="deviceQuery 81090 MiB (85028896768 B), driver 570; 81079-81106 "
        "MiB "
        "on 565-580, torch prints 81082-81090 MiB. nvidia-smi/NVML show 81559 MiB "
        "(85520809984 B) but CUDA never exposes that much",
        peak_tflops=_H100_SXM,
        memory_bandwidth_gbs=3350.0, bf16_supported=True, compute_capability="9.0",
        sm_count=132, cuda_context_bytes=_ctx(132, 2048),
        interconnect="nvlink4", interconnect_gbs=450.0,
        source="NVIDIA H100 datasheet (SXM5, sparse figures halved): FP32 67, TF32 "
        "494.7, BF16/FP16 989.4, INT8 1978.9; 3.35 TB/s; NVLink4 900 GB/s bidirect.",
    ),
    GpuSpec(
        name="h100-pcie", display_name="NVIDIA H100 PCIe",
        aliases=("h100-pcie", "h100-pcie-80gb"),
        memory_bytes=84_943_044_608,
        memory_source="torch total_memory print 81008 MiB (MiB-rounded, one report); "
        "nvidia-smi 81559 MiB",
        peak_tflops=_peaks(51.2, 378.0, 756.5, 756.5, 1513.0),
        memory_bandwidth_gbs=2000.0, bf16_supported=True, compute_capability="9.0",
        sm_count=114, cuda_context_bytes=_ctx(114, 2048),
        interconnect="pcie5x16", interconnect_gbs=PCIE5_X16_GBS,
        source="NVIDIA H100 datasheet (PCIe, sparse figures halved): FP32 51.2, TF32 "
        "378, "
        "BF16/FP16 756.5, INT8 1513; 2.0 TB/s; PCIe gen5 x16",
    ),
    GpuSpec(
        name="h200", display_name="NVIDIA H200",
        aliases=("h200", "h200-sxm", "h200-141gb"),
        memory_bytes=150_109_945_856,
        memory_source="torch total_memory print 143156 MiB (MiB-rounded, one report); "
        "nvidia-smi 143771 MiB",
        peak_tflops=_H100_SXM,
        memory_bandwidth_gbs=4800.0, bf16_supported=True, compute_capability="9.0",
        sm_count=132, cuda_context_bytes=_ctx(132, 2048),
        interconnect="nvlink4", interconnect_gbs=450.0,
        source="NVIDIA H200 datasheet (SXM): compute as H100 SXM (BF16 989.4 dense), "
        "141 GB HBM3e, 4.8 TB/s, NVLink4 900 GB/s bidirectional",
    ),
)

GPUS: dict[str, GpuSpec] = {spec.name: spec for spec in _CATALOG}


def _norm(text: str) -> str:
    """Lower-case key with brand words, separators and GB/GiB/G spelling removed."""
    s = text.lower().replace("_", " ")
    s = re.sub(r"(?<![a-z0-9])(\d+)\s*(?:gib|gb|g)\b", r"\1gb", s)
    s = re.sub(r"\b(?:nvidia|geforce|tesla)\b", " ", s)
    return re.sub(r"[^a-z0-9]+", "", s)


def _build_index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for spec in _CATALOG:
        for key in {_norm(k) for k in (spec.name, spec.display_name, *spec.aliases)}:
            if index.get(key, spec) is not spec:
                other = index[key].name
                raise RuntimeError(f"alias {key!r} names {other} and {spec.name}")
            index[key] = spec
    return index


_INDEX = _build_index()

_GENERIC_RE = re.compile(
    r"^(?:generic[\s:_-]*(?P<a>\d+(?:\.\d+)?)\s*(?:gib|gb|g)?"
    r"|(?P<b>\d+(?:\.\d+)?)\s*(?:gib|gb|g))$"
)


def generic_gpu(gigabytes: float) -> GpuSpec:
    """A card known only by its advertised size: ``gigabytes`` GiB of memory.

    A card sold as "N GB" reports a little under N GiB to CUDA (e.g. "4.00 GiB"
    or "3.94 GiB" total capacity for 4 GB cards), so N GiB is the closest single
    figure.  Peaks, bandwidth, SMs and compute capability are unknown (None);
    bf16 is assumed supported so a dtype choice is not blocked.
    """
    if not 0 < gigabytes <= 4096:
        raise ValueError(f"generic GPU size must be in (0, 4096] GB, got {gigabytes}")
    size = f"{gigabytes:g}"
    return GpuSpec(
        name=f"generic-{size}gb", display_name=f"Generic {size} GB GPU", aliases=(),
        memory_bytes=int(gigabytes * GIB),
        memory_source=f"ESTIMATE: generic card, {size} GiB (advertised GB read as GiB)",
        peak_tflops=dict.fromkeys(DTYPES),
        memory_bandwidth_gbs=None, bf16_supported=True, compute_capability=None,
        sm_count=None, cuda_context_bytes=GENERIC_CUDA_CONTEXT_BYTES,
        interconnect="unknown", interconnect_gbs=None,
        source="generic: only the memory size is known",
    )


def find_gpu(name: str) -> GpuSpec | None:
    """Look a GPU up by canonical name, alias or display/device name.

    Case-insensitive; spaces, underscores and dashes are equivalent, as are
    "80GB"/"80G"/"80GiB".  "generic-8gb", "8gb", "generic:8GiB" build a generic
    card of 8 GiB.  Bare family names pick the usual variant: "a100" -> A100
    80GB SXM, "v100" -> V100 16GB, "rtx-3080" -> 10GB, "h100" -> SXM.
    Returns None for unknown names.
    """
    text = name.strip().lower()
    if not text:
        return None
    match = _GENERIC_RE.match(text)
    if match:
        size = float(match.group("a") or match.group("b"))
        return generic_gpu(size) if 0 < size <= 4096 else None
    spec = _INDEX.get(_norm(text))
    if spec is not None:
        return spec
    return find_gpu_by_device_name(name)


# (pattern on the space-separated lower-case device name, candidates); an empty
# candidate tuple marks a known card that is deliberately not in the catalog.
_DEVICE_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"\b(?:laptop|mobile|max q)\b", ()),
    (r"\bh200 nvl\b", ()),
    (r"\bh200\b", ("h200",)),
    (r"\bh100 nvl\b", ()),
    (r"\bh100 pcie\b", ("h100-pcie",)),
    (r"\bh100\b", ("h100-sxm",)),
    (r"\ba100\b.*\bpcie\b|\bpcie\b.*\ba100\b", ("a100-80gb-pcie", "a100-40gb-pcie")),
    (r"\ba100\b", ("a100-80gb-sxm", "a100-40gb-sxm")),
    (r"\bv100s\b", ()),
    (r"\bv100\b", ("v100-16gb", "v100-32gb")),
    (r"\bt4\b", ("t4",)),
    (r"\ba10g\b", ("a10g",)),
    (r"\ba10\b", ("a10",)),
    (r"\bl40s\b", ("l40s",)),
    (r"\bl4\b", ("l4",)),
    (r"\brtx a6000\b", ("rtx-a6000",)),
    (r"\b3080 ti\b", ()),
    (r"\b3080\b", ("rtx-3080-10gb", "rtx-3080-12gb", "rtx-3080-20gb")),
    (r"\b3090 ti\b", ()),
    (r"\b3090\b", ("rtx-3090",)),
    (r"\b4090 d\b", ()),
    (r"\b4090\b", ("rtx-4090",)),
)

_MEMORY_MISMATCH = 0.10


def find_gpu_by_device_name(
    device_name: str, total_memory_bytes: int | None = None
) -> GpuSpec | None:
    """Map a torch/NVML device name to the catalog.

    ``total_memory_bytes`` (torch ``total_memory`` or NVML total) picks among
    variants sharing a name (V100 16/32GB, A100 40/80GB, RTX 3080 10/12/20GB);
    a size written in the name ("A100-SXM4-80GB") wins over it.  When the
    reported memory is more than 10 % away from the matched entry (e.g. a modded
    48 GB RTX 4090) the entry is returned with the reported memory substituted
    and its name suffixed ``-<N>gb-reported``.
    """
    text = " ".join(re.sub(r"[^a-z0-9]+", " ", device_name.lower()).split())
    text = re.sub(r"\b(\d+) (gb|gib)\b", r"\1\2", text)
    candidates: tuple[str, ...] | None = None
    for pattern, names in _DEVICE_RULES:
        if re.search(pattern, text):
            candidates = names
            break
    if not candidates:
        return None
    specs = [GPUS[n] for n in candidates]
    size = re.search(r"\b(\d+)gi?b\b", text)
    if size and len(specs) > 1:
        sized = [s for s in specs if f"-{size.group(1)}gb" in s.name]
        specs = sized or specs
    if total_memory_bytes is not None and total_memory_bytes > 0:
        spec = min(specs, key=lambda s: abs(s.memory_bytes - total_memory_bytes))
        gap = abs(spec.memory_bytes - total_memory_bytes)
        if gap > _MEMORY_MISMATCH * spec.memory_bytes:
            gib = round(total_memory_bytes / GIB)
            return dataclasses.replace(
                spec,
                name=f"{spec.name}-{gib}gb-reported",
                aliases=(),
                memory_bytes=total_memory_bytes,
                memory_source=f"as reported by the device ({device_name!r}); catalog "
                f"entry {spec.name} has {spec.memory_bytes} B",
            )
        return spec
    return specs[0]


def gpu_names() -> list[str]:
    """Canonical names of the catalog entries (generic cards not included)."""
    return list(GPUS)
