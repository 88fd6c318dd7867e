"""GPU catalog data, part 3: workstation (RTX Axxxx / Ada) and datacenter cards (meanings: gpus.py).

Peaks are dense: datasheets that print sparse figures are halved.  Workstation and datacenter
Ampere/Ada/Hopper/Blackwell parts run FP16/BF16 with FP32 accumulate at the full tensor rate,
except the L40, whose datasheet gives half the L40S's (GeForce-like) rates.

``memory_bytes`` is the CUDA total (torch ``total_memory``): cited where a published reading was
found, else DERIVED from the marketed size and a sibling card's reservation, and said so.
"""

from __future__ import annotations

from trainfit.hardware.spec import (
    MIB,
    PCIE3_X16_GBS,
    PCIE4_X16_GBS,
    GpuSpec,
    _ctx,
    _peaks,
)

# A4000 on Linux: torch "15.61 GiB total capacity" (VGGT-Long#6) = 15985 MiB of 16384: 399 lost.
_RTX_A_RESERVED_MIB = 16384 - 15985

DATACENTER: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="a2", display_name="NVIDIA A2",
        aliases=("a2", "nvidia-a2", "a2-16gb", "a2-pcie"),
        memory_bytes=15_835_398_144,
        memory_source="DERIVED: marketed 16 GB GDDR6, a datacenter card run with ECC on like the "
        "T4 (16 GB GDDR6); driver-visible total taken as the T4's torch total 15102 MiB; no "
        "published reading of the A2 found",
        peak_tflops=_peaks(4.5, 9.0, 18.0, 18.0, 36.0),
        memory_bandwidth_gbs=200.0, bf16_supported=True, compute_capability="8.6",
        sm_count=10, cuda_context_bytes=_ctx(10, 1536),
        interconnect="pcie4x8", interconnect_gbs=PCIE4_X16_GBS / 2,
        source="NVIDIA A2 datasheet (sparse figures halved): FP32 4.5, TF32 9, BF16/FP16 18, "
        "INT8 36; 200 GB/s; PCIe gen4 x8; GA107, 10 SMs (1280 cores)",
    ),
    GpuSpec(
        name="rtx-a4000", display_name="NVIDIA RTX A4000",
        aliases=("rtx-a4000", "a4000", "rtxa4000", "a4000-16gb"),
        memory_bytes=15985 * MIB,
        memory_source="torch '15.61 GiB total capacity' on Linux (DengKaiCQ/VGGT-Long#6, 2025) = "
        "15985 MiB; nvidia-smi 16376 MiB",
        peak_tflops=_peaks(19.2, 38.3, 76.7, 76.7, 153.4),
        memory_bandwidth_gbs=448.0, bf16_supported=True, compute_capability="8.6",
        sm_count=48, cuda_context_bytes=_ctx(48, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA RTX A4000 datasheet: FP32 19.2, 'Tensor 153.4 TFLOPS' (sparse FP16) -> "
        "dense FP16/BF16 (FP32 acc, full rate on RTX A cards) 76.7, TF32 38.3, INT8 153.4 "
        "(48 SMs x 1560 MHz); 448 GB/s; PCIe gen4 x16",
    ),
    GpuSpec(
        name="rtx-a4500", display_name="NVIDIA RTX A4500",
        aliases=("rtx-a4500", "a4500", "rtxa4500", "a4500-20gb"),
        memory_bytes=(20480 - _RTX_A_RESERVED_MIB) * MIB,
        memory_source="DERIVED: marketed 20 GB GDDR6 = 20480 MiB; driver-visible total taken as "
        "20480 - 399 = 20081 MiB, the reservation the RTX A4000 shows on Linux (15.61 GiB of 16); "
        "no published reading of this card",
        peak_tflops=_peaks(23.7, 47.3, 94.6, 94.6, 189.2),
        memory_bandwidth_gbs=640.0, bf16_supported=True, compute_capability="8.6",
        sm_count=56, cuda_context_bytes=_ctx(56, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA RTX A4500 datasheet: FP32 23.7, 'Tensor 189.2 TFLOPS' (sparse FP16) -> "
        "dense FP16/BF16 94.6, TF32 47.3, INT8 189.2 (56 SMs x 1650 MHz); 640 GB/s; PCIe gen4 "
        "x16 (NVLink bridge 112.5 GB/s optional, not modelled)",
    ),
    GpuSpec(
        name="rtx-a5000", display_name="NVIDIA RTX A5000",
        aliases=("rtx-a5000", "a5000", "rtxa5000", "a5000-24gb"),
        memory_bytes=(24576 - _RTX_A_RESERVED_MIB) * MIB,
        memory_source="DERIVED: marketed 24 GB GDDR6 = 24576 MiB; driver-visible total taken as "
        "24576 - 399 = 24177 MiB, the reservation the RTX A4000 shows on Linux (the RTX 3090 "
        "loses 338 MiB, the A6000 476); no published reading of this card",
        peak_tflops=_peaks(27.8, 55.5, 111.1, 111.1, 222.2),
        memory_bandwidth_gbs=768.0, bf16_supported=True, compute_capability="8.6",
        sm_count=64, cuda_context_bytes=_ctx(64, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA RTX A5000 datasheet: FP32 27.8, 'Tensor 222.2 TFLOPS' (sparse FP16) -> "
        "dense FP16/BF16 111.1, TF32 55.5, INT8 222.2 (64 SMs x 1695 MHz); 768 GB/s; PCIe gen4 "
        "x16 (NVLink bridge 112.5 GB/s optional, not modelled)",
    ),
    GpuSpec(
        name="a40", display_name="NVIDIA A40",
        aliases=("a40", "nvidia-a40", "a40-48gb"),
        memory_bytes=45032 * MIB,
        memory_source="DERIVED: 48 GB GDDR6 with ECC on (nvidia-smi 46068 MiB, as the L40S); "
        "driver-visible total taken as 49152 MiB x 22516/24576 = 45032 MiB, the fraction the A10 "
        "(same GA102, ECC on, half the memory) shows in deviceQuery; no published reading found",
        peak_tflops=_peaks(37.4, 74.8, 149.7, 149.7, 299.3),
        memory_bandwidth_gbs=696.0, bf16_supported=True, compute_capability="8.6",
        sm_count=84, cuda_context_bytes=_ctx(84, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA A40 datasheet (sparse figures halved): FP32 37.4, TF32 74.8, BF16/FP16 "
        "149.7, INT8 299.3; 696 GB/s; PCIe gen4 x16 (NVLink bridge 112.5 GB/s optional, not "
        "modelled)",
    ),
    GpuSpec(
        name="l40", display_name="NVIDIA L40",
        aliases=("l40", "nvidia-l40", "l40-48gb"),
        memory_bytes=45466 * MIB,
        memory_source="torch 'total capacity of 44.40 GiB' (QwenLM/Qwen3-VL#2097, single L40, "
        "2026) = 45466 MiB; ECC on (nvidia-smi 46068 MiB)",
        peak_tflops=_peaks(90.5, 90.5, 181.0, 181.0, 362.0),
        memory_bandwidth_gbs=864.0, bf16_supported=True, compute_capability="8.9",
        sm_count=142, cuda_context_bytes=_ctx(142, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA L40 datasheet (sparse figures halved): FP32 90.5, TF32 90.5, BF16/FP16 "
        "181.05, INT8 362 -- half the L40S's tensor rates; 864 GB/s; PCIe gen4 x16; no NVLink",
    ),
    GpuSpec(
        name="rtx-6000-ada", display_name="NVIDIA RTX 6000 Ada Generation",
        aliases=("rtx-6000-ada", "6000-ada", "rtx6000ada", "rtx-6000-ada-generation",
                 "rtx-6000-ada-48gb"),
        memory_bytes=45496 * MIB,
        memory_source="torch 'total capacity of 44.43 GiB' (DINGYANB/MTVCrafter#21, 2025) = "
        "45496 MiB with ECC on (nvidia-smi 46068 MiB); with ECC off nvidia-smi shows 49140 MiB "
        "and CUDA ~3 GiB more",
        peak_tflops=_peaks(91.1, 182.1, 364.2, 364.2, 728.5),
        memory_bandwidth_gbs=960.0, bf16_supported=True, compute_capability="8.9",
        sm_count=142, cuda_context_bytes=_ctx(142, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="NVIDIA RTX 6000 Ada datasheet / Ada whitepaper appendix: FP32 91.1, FP16/BF16 "
        "with FP32 acc 364.2 dense (full rate; 'Tensor 1457 TFLOPS' = FP8 sparse), TF32 182.1, "
        "INT8 728.5 (142 SMs x 2505 MHz); 960 GB/s; PCIe gen4 x16; no NVLink",
    ),
    GpuSpec(
        name="h100-nvl", display_name="NVIDIA H100 NVL",
        aliases=("h100-nvl", "h100nvl", "h100-nvl-94gb", "h100-94gb"),
        memory_bytes=(95830 - 469) * MIB,
        memory_source="DERIVED: nvidia-smi 95830 MiB (NVIDIA/gpu-admin-tools#4, driver 535); "
        "CUDA total taken as 95830 - 469 = 95361 MiB, the gap H100 SXM shows between NVML "
        "(81559 MiB) and CUDA (81090 MiB); no published CUDA reading found",
        peak_tflops=_peaks(60.0, 417.5, 835.5, 835.5, 1670.5),
        memory_bandwidth_gbs=3900.0, bf16_supported=True, compute_capability="9.0",
        sm_count=132, cuda_context_bytes=_ctx(132, 2048),
        interconnect="nvlink4-bridge", interconnect_gbs=300.0,
        link_ranks=2,  # the bridge joins a pair of cards; pairs talk over PCIe
        source="NVIDIA H100 NVL datasheet, per GPU (sparse figures halved): FP32 60, TF32 417.5, "
        "BF16/FP16 835.5, INT8 1670.5; 94 GB HBM3, 3.9 TB/s; PCIe gen5 x16 and NVLink bridge "
        "600 GB/s bidirectional between the pair (300 per direction)",
    ),
    GpuSpec(
        name="gh200-96gb", display_name="NVIDIA GH200 480GB",
        aliases=("gh200", "gh200-96gb", "gh200-480gb", "gh200-hbm3"),
        memory_bytes=97308 * MIB,
        memory_source="DERIVED: 96 GB HBM3 = 98304 MiB; CUDA total taken as 98304 x 81090/81920 = "
        "97308 MiB, the fraction H100 SXM (80 GiB HBM3) exposes to CUDA; no published reading "
        "found. total_memory counts the HBM only, not the Grace LPDDR5X",
        peak_tflops=_peaks(67.0, 494.7, 989.4, 989.4, 1978.9),
        memory_bandwidth_gbs=4000.0, bf16_supported=True, compute_capability="9.0",
        sm_count=132, cuda_context_bytes=_ctx(132, 2048),
        interconnect="nvlink4", interconnect_gbs=450.0,
        # NVLink joins the superchips of one node: four in the quad GH200 blades (HPE Cray
        # EX254n, CSCS Alps), one in most other GH200 servers (every peer across the network):
        # which a user has is not known, so no multi-rank speed without --interconnect
        link_ranks=1,
        source="NVIDIA GH200 Grace Hopper datasheet (sparse figures halved): FP32 67, TF32 494, "
        "BF16/FP16 990, INT8 1979 (= H100 SXM's 494.7/989.4/1978.9); 96 GB HBM3 4 TB/s (the 144 "
        "GB HBM3e part, 4.9 TB/s, is not this entry); NVLink4 900 GB/s bidirectional, NVLink-C2C "
        "900 GB/s to the CPU",
    ),
    GpuSpec(
        name="b200", display_name="NVIDIA B200",
        aliases=("b200", "nvidia-b200", "b200-180gb", "b200-sxm"),
        memory_bytes=182630 * MIB,
        memory_source="cudaDeviceProp.totalGlobalMem printed as 178.35 GiB (pytorch/ao#4002, "
        "2026) = 182630 MiB; marketed 180 GB HBM3e (192 GB in early specs)",
        peak_tflops=_peaks(75.0, 1100.0, 2250.0, 2250.0, 4500.0),
        memory_bandwidth_gbs=7700.0, bf16_supported=True, compute_capability="10.0",
        sm_count=148, cuda_context_bytes=_ctx(148, 2048),
        interconnect="nvlink5", interconnect_gbs=900.0,
        source="NVIDIA HGX B200 datasheet, individual GPU (sparse figures halved): FP32 75, TF32 "
        "2.2 PF -> 1100, FP16/BF16 4.5 PF -> 2250, INT8 9 POPS -> 4500; 180 GB HBM3e at 7.7 TB/s "
        "(the driver's 7680-bit bus x 3996 MHz gives 7.67, pytorch/ao#4002); 148 SMs, 2048 "
        "threads/SM; NVLink5 1.8 TB/s bidirectional (900 per direction)",
    ),
    GpuSpec(
        name="p100-16gb", display_name="Tesla P100-PCIE-16GB",
        aliases=("p100", "tesla-p100", "p100-16gb", "p100-pcie-16gb", "p100-pcie"),
        memory_bytes=16259 * MIB,
        memory_source="DERIVED: 16 GB HBM2 = 16384 MiB; driver-visible total taken as 16384 x "
        "11178/11264 = 16259 MiB, the fraction the Pascal GTX 1080 Ti exposes (torch 11178 MiB "
        "of 11264); no published reading of the P100 found",
        peak_tflops=_peaks(9.3, None, 9.3, None, None),
        memory_bandwidth_gbs=732.0, bf16_supported=False, compute_capability="6.0",
        sm_count=56, cuda_context_bytes=_ctx(56, 2048),
        interconnect="pcie3x16", interconnect_gbs=PCIE3_X16_GBS,
        source="NVIDIA Tesla P100 PCIe datasheet: FP32 9.3, FP16 18.7 (half2 with FP16 "
        "accumulate); no tensor cores, no TF32/BF16, so fp16 with FP32 accumulate (cuBLAS "
        "compute-32F, torch's default) = the FP32 rate 9.3; no DP4A on GP100 (INT8 None); "
        "732 GB/s; PCIe gen3 x16. The SXM2 part (10.6 FP32, NVLink1) is not this entry",
    ),
)
