"""The GPU catalog data: one ``GpuSpec`` per GPU, with its sources (meanings: gpus.py).

Part 1 (this module): the original datacenter/cloud cards and the RTX 3080/3090/4090/A6000.
Part 2: GeForce desktop and laptop cards (gpu_catalog_consumer.py).  Part 3: workstation and
datacenter cards (gpu_catalog_datacenter.py).  ``CATALOG`` is all three, in that order.
"""

from __future__ import annotations

from trainfit.hardware.gpu_catalog_consumer import CONSUMER
from trainfit.hardware.gpu_catalog_datacenter import DATACENTER
from trainfit.hardware.spec import (
    PCIE3_X16_GBS,
    PCIE4_X16_GBS,
    PCIE5_X16_GBS,
    GpuSpec,
    _ctx,
    _peaks,
)

_A100 = _peaks(19.5, 156.0, 312.0, 312.0, 624.0)
_H100_SXM = _peaks(67.0, 494.7, 989.4, 989.4, 1978.9)
_RTX3080 = _peaks(29.8, 29.8, 59.5, 59.5, 238.0)
_V100_PCIE = _peaks(14.0, None, 112.0, None, 56.0)
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
        "cores). The PCIe board (14 / 112 TFLOPS) is v100-pcie-16gb",
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
    # the 250 W PCIe board: its own peaks (a PCIe V100 mapped to the SXM2 entry took its 125 /
    # 15.7 TFLOPS and, since the SXM2 boards' own measured GEMM rates, an fp32 rate above the
    # PCIe card's peak: a review); its GEMMs keep Volta's rate, measured on a V100 PCIe
    GpuSpec(
        name="v100-pcie-16gb", display_name="Tesla V100-PCIE-16GB",
        aliases=("v100-pcie", "v100-pcie-16gb", "v100-pcie-16g"),
        memory_bytes=16_945_512_448,
        memory_source="as the SXM2 16GB (16160 MiB: the same HBM2 stacks)",
        peak_tflops=_V100_PCIE,
        memory_bandwidth_gbs=900.0, bf16_supported=False, compute_capability="7.0",
        sm_count=80, cuda_context_bytes=_ctx(80, 2048),
        interconnect="pcie3x16", interconnect_gbs=PCIE3_X16_GBS,
        source="NVIDIA V100 datasheet (PCIe, 250 W): FP32 14, tensor FP16 112; 900 GB/s; "
        "PCIe gen3 x16. INT8 = DP4A (4x FP32)",
    ),
    GpuSpec(
        name="v100-pcie-32gb", display_name="Tesla V100-PCIE-32GB",
        aliases=("v100-pcie-32gb", "v100-pcie-32g"),
        memory_bytes=34_089_730_048,
        memory_source="as the SXM2 32GB (32510 MiB)",
        peak_tflops=_V100_PCIE,
        memory_bandwidth_gbs=900.0, bf16_supported=False, compute_capability="7.0",
        sm_count=80, cuda_context_bytes=_ctx(80, 2048),
        interconnect="pcie3x16", interconnect_gbs=PCIE3_X16_GBS,
        source="NVIDIA V100 datasheet (PCIe 32GB): as V100 PCIe 16GB",
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

CATALOG: tuple[GpuSpec, ...] = _CATALOG + CONSUMER + DATACENTER
