"""GPU catalog data, part 2: GeForce desktop and laptop cards (meanings: gpus.py).

Peaks are dense.  GeForce tensor cores run FP16/BF16 with FP32 accumulate (what mixed-precision
training uses) at half their FP16-accumulate rate: the Ampere GA102, Ada AD102 and RTX Blackwell
GB202 whitepapers list "Peak FP16 Tensor TFLOPS with FP32 Accumulate" at half "with FP16
Accumulate" for every GeForce card (RTX 3080: 59.5 vs 119; RTX 4090: 165.2 vs 330.3; RTX 5090:
209.5 vs 419).  Per SM and clock that is, on Ampere/Ada/Blackwell GeForce: FP32 and TF32 256
FLOP, FP16/BF16 (FP32 acc) 512, INT8 2048 -- so a card the whitepapers do not tabulate is
derived as SMs x boost clock (NVIDIA's product page) x those rates, and says so.  Turing GeForce
(RTX 2080 Ti): FP32 128, FP16 (FP32 acc) 512, INT8 2048; no TF32/BF16.

``memory_bytes`` is the CUDA total (torch ``total_memory``).  Where a published reading of that
figure was found it is cited ("11.76 GiB total capacity" in a PyTorch OOM message is that figure,
rounded to 0.01 GiB, so +-5 MiB); where none was found it is DERIVED from the marketed size and
the reservation a sibling card shows, and memory_source says "derived".
"""

from __future__ import annotations

from trainfit.hardware.spec import (
    MIB,
    PCIE3_X16_GBS,
    PCIE4_X16_GBS,
    PCIE5_X16_GBS,
    GpuSpec,
    _ctx,
    _peaks,
)

_AMPERE_WP = "NVIDIA Ampere GA102 whitepaper (GeForce tensor rates, FP32 acc at half the FP16-acc rate)"
_ADA_WP = "NVIDIA Ada (AD102) whitepaper (GeForce tensor rates, FP32 acc at half the FP16-acc rate)"
_BW_WP = "NVIDIA RTX Blackwell (GB202) whitepaper (GeForce: FP32 acc at half the FP16-acc rate)"

# CUDA totals of 8/12 GB cards found in published PyTorch OOM messages (Linux).
_GA104_8GB = 7967 * MIB  # RTX 3070 "7.78 GiB total capacity"
_GA10X_12GB = 12_629_508_096  # RTX 3060 12GB deviceQuery 12044 MiB
_AD10X_8GB = 7813 * MIB  # RTX 4060 (AD107) "7.63 GiB total capacity"
# Ada reserves ~360-380 MiB whatever the size (4090: 24576 - 24217 = 359; 4060: 8192 - 7813 = 379).
_ADA_RESERVED_MIB = 379
_AD10X_12GB = (12288 - _ADA_RESERVED_MIB) * MIB
_AD10X_16GB = (16384 - _ADA_RESERVED_MIB) * MIB
_ADA_12GB_MEM = (
    "DERIVED: marketed 12 GB GDDR6X = 12288 MiB; driver-visible total taken as 12288 - 379 = "
    "11909 MiB, the reservation an 8 GB RTX 4060 shows on Linux ('7.63 GiB total capacity', "
    "MagicQuill#126, HairFastGAN#8; the 4090 loses 359 MiB); no published reading of this card"
)
_ADA_16GB_MEM = (
    "DERIVED: marketed 16 GB = 16384 MiB; driver-visible total taken as 16384 - 379 = 16005 MiB, "
    "the reservation an 8 GB RTX 4060 shows on Linux ('7.63 GiB total capacity', MagicQuill#126; "
    "the 4090 loses 359 MiB); no published Linux reading of this card (Windows prints 15.99 GiB)"
)
_GA104_8GB_MEM = (
    "DERIVED from the RTX 3070 (same GA104 board, 8 GB): torch '7.78 GiB total capacity' on "
    "Linux (OW-DETR#46, codellama#82; 7.76 GiB in GASDA#19) = 7967 MiB; nvidia-smi 8192 MiB"
)
_ADA_4070_PEAKS = _peaks(29.1, 29.1, 58.3, 58.3, 233.2)

CONSUMER: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="rtx-3060-12gb", display_name="NVIDIA GeForce RTX 3060",
        aliases=("rtx-3060", "3060", "rtx3060", "rtx-3060-12gb", "3060-12gb", "geforce-rtx-3060"),
        memory_bytes=_GA10X_12GB,
        memory_source="deviceQuery 12044 MiB (12629508096 B) on Linux; torch '11.75 GiB total "
        "capacity' (StyleGaussian#12, Linux); Windows prints 12.00 GiB; nvidia-smi 12288 MiB",
        peak_tflops=_peaks(12.7, 12.7, 25.5, 25.5, 101.9),
        memory_bandwidth_gbs=360.0, bf16_supported=True, compute_capability="8.6",
        sm_count=28, cuda_context_bytes=_ctx(28, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _AMPERE_WP + " per-SM rates x 28 SMs x 1777 MHz boost (NVIDIA spec: "
        "3584 CUDA cores) = FP32/TF32 12.7, FP16/BF16 (FP32 acc) 25.5, INT8 101.9; 192-bit 15 Gbps "
        "GDDR6 = 360 GB/s; PCIe gen4 x16",
    ),
    GpuSpec(
        name="rtx-3060-ti", display_name="NVIDIA GeForce RTX 3060 Ti",
        aliases=("rtx-3060-ti", "3060-ti", "3060ti", "rtx3060ti", "rtx-3060-ti-8gb"),
        memory_bytes=_GA104_8GB, memory_source=_GA104_8GB_MEM,
        peak_tflops=_peaks(16.2, 16.2, 32.4, 32.4, 129.6),
        memory_bandwidth_gbs=448.0, bf16_supported=True, compute_capability="8.6",
        sm_count=38, cuda_context_bytes=_ctx(38, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _AMPERE_WP + " per-SM rates x 38 SMs x 1665 MHz boost (4864 cores) = "
        "FP32/TF32 16.2, FP16/BF16 (FP32 acc) 32.4, INT8 129.6; 256-bit 14 Gbps GDDR6 = 448 GB/s",
    ),
    GpuSpec(
        name="rtx-3070", display_name="NVIDIA GeForce RTX 3070",
        aliases=("rtx-3070", "3070", "rtx3070", "rtx-3070-8gb", "3070-8gb"),
        memory_bytes=_GA104_8GB,
        memory_source="torch '7.78 GiB total capacity' on Linux (OW-DETR#46 2023, codellama#82; "
        "7.76 GiB in GASDA#19) = 7967 MiB; Windows prints 8.00 GiB; nvidia-smi 8192 MiB",
        peak_tflops=_peaks(20.3, 20.3, 40.6, 40.6, 162.5),
        memory_bandwidth_gbs=448.0, bf16_supported=True, compute_capability="8.6",
        sm_count=46, cuda_context_bytes=_ctx(46, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source=_AMPERE_WP + " (RTX 3070 column): FP32 20.3, FP16/BF16 with FP32 acc 40.6 (81.3 "
        "with FP16 acc), TF32 20.3, INT8 162.5 (46 SMs x 1725 MHz); 448 GB/s; PCIe gen4 x16",
    ),
    GpuSpec(
        name="rtx-3070-ti", display_name="NVIDIA GeForce RTX 3070 Ti",
        aliases=("rtx-3070-ti", "3070-ti", "3070ti", "rtx3070ti", "rtx-3070-ti-8gb"),
        memory_bytes=_GA104_8GB, memory_source=_GA104_8GB_MEM,
        peak_tflops=_peaks(21.7, 21.7, 43.5, 43.5, 174.0),
        memory_bandwidth_gbs=608.0, bf16_supported=True, compute_capability="8.6",
        sm_count=48, cuda_context_bytes=_ctx(48, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _AMPERE_WP + " per-SM rates x 48 SMs x 1770 MHz boost (6144 cores) = "
        "FP32/TF32 21.7, FP16/BF16 (FP32 acc) 43.5, INT8 174; 256-bit 19 Gbps GDDR6X = 608 GB/s",
    ),
    GpuSpec(
        name="rtx-3080-ti", display_name="NVIDIA GeForce RTX 3080 Ti",
        aliases=("rtx-3080-ti", "3080-ti", "3080ti", "rtx3080ti", "rtx-3080-ti-12gb"),
        memory_bytes=_GA10X_12GB,
        memory_source="DERIVED: marketed 12 GB GDDR6X = 12288 MiB; driver-visible total taken as "
        "the RTX 3060 12GB's Linux deviceQuery 12044 MiB (same GA10x 12 GB reservation); no "
        "published Linux reading of this card (Windows prints 12.00 GiB)",
        peak_tflops=_peaks(34.1, 34.1, 68.2, 68.2, 272.8),
        memory_bandwidth_gbs=912.0, bf16_supported=True, compute_capability="8.6",
        sm_count=80, cuda_context_bytes=_ctx(80, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _AMPERE_WP + " per-SM rates x 80 SMs x 1665 MHz boost (10240 cores) = "
        "FP32/TF32 34.1, FP16/BF16 (FP32 acc) 68.2, INT8 272.8; 384-bit 19 Gbps = 912 GB/s",
    ),
    GpuSpec(
        name="rtx-3090-ti", display_name="NVIDIA GeForce RTX 3090 Ti",
        aliases=("rtx-3090-ti", "3090-ti", "3090ti", "rtx3090ti", "rtx-3090-ti-24gb"),
        memory_bytes=25_414_860_800,
        memory_source="DERIVED: marketed 24 GB GDDR6X on GA102; driver-visible total taken as the "
        "RTX 3090's Linux deviceQuery 24238 MiB (same GA102 24 GB reservation); no published "
        "Linux reading of this card",
        peak_tflops=_peaks(40.0, 40.0, 80.0, 80.0, 320.0),
        memory_bandwidth_gbs=1008.0, bf16_supported=True, compute_capability="8.6",
        sm_count=84, cuda_context_bytes=_ctx(84, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _AMPERE_WP + " per-SM rates x 84 SMs x 1860 MHz boost (10752 cores) = "
        "FP32/TF32 40.0, FP16/BF16 (FP32 acc) 80.0, INT8 320.0; 384-bit 21 Gbps = 1008 GB/s "
        "(NVLink bridge optional; an audit found the card refused as unknown)",
    ),
    GpuSpec(
        name="rtx-4060-ti-8gb", display_name="NVIDIA GeForce RTX 4060 Ti (8 GB)",
        aliases=("rtx-4060-ti", "4060-ti", "4060ti", "rtx4060ti", "rtx-4060-ti-8gb", "4060-ti-8gb"),
        memory_bytes=_AD10X_8GB,
        memory_source="DERIVED from the 8 GB RTX 4060 (AD107, same 8 GB GDDR6 on 128 bits): torch "
        "'7.63 GiB total capacity' on Linux (HairFastGAN#8 Ubuntu 24.04, MagicQuill#126) = 7813 MiB",
        peak_tflops=_peaks(22.1, 22.1, 44.1, 44.1, 176.5),
        memory_bandwidth_gbs=288.0, bf16_supported=True, compute_capability="8.9",
        sm_count=34, cuda_context_bytes=_ctx(34, 1536),
        interconnect="pcie4x8", interconnect_gbs=PCIE4_X16_GBS / 2,
        source="derived: " + _ADA_WP + " per-SM rates x 34 SMs x 2535 MHz boost (4352 cores) = "
        "FP32/TF32 22.1, FP16/BF16 (FP32 acc) 44.1, INT8 176.5; 128-bit 18 Gbps = 288 GB/s; "
        "PCIe gen4 x8 (AD106 has 8 lanes)",
    ),
    GpuSpec(
        name="rtx-4060-ti-16gb", display_name="NVIDIA GeForce RTX 4060 Ti (16 GB)",
        aliases=("rtx-4060-ti-16gb", "4060-ti-16gb", "4060ti-16gb", "rtx4060ti-16gb"),
        memory_bytes=_AD10X_16GB, memory_source=_ADA_16GB_MEM,
        peak_tflops=_peaks(22.1, 22.1, 44.1, 44.1, 176.5),
        memory_bandwidth_gbs=288.0, bf16_supported=True, compute_capability="8.9",
        sm_count=34, cuda_context_bytes=_ctx(34, 1536),
        interconnect="pcie4x8", interconnect_gbs=PCIE4_X16_GBS / 2,
        source="derived as the 8 GB RTX 4060 Ti (same AD106, 34 SMs x 2535 MHz, 288 GB/s, PCIe "
        "gen4 x8), 16 GB in clamshell: " + _ADA_WP,
    ),
    GpuSpec(
        name="rtx-4070", display_name="NVIDIA GeForce RTX 4070",
        aliases=("rtx-4070", "4070", "rtx4070", "rtx-4070-12gb", "4070-12gb"),
        memory_bytes=_AD10X_12GB,
        memory_source=_ADA_12GB_MEM + "; nvidia-smi 12282 MiB (meta-llama/llama#466)",
        peak_tflops=_ADA_4070_PEAKS,
        memory_bandwidth_gbs=504.0, bf16_supported=True, compute_capability="8.9",
        sm_count=46, cuda_context_bytes=_ctx(46, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _ADA_WP + " per-SM rates x 46 SMs x 2475 MHz boost (5888 cores) = "
        "FP32/TF32 29.1, FP16/BF16 (FP32 acc) 58.3, INT8 233.2; 192-bit 21 Gbps GDDR6X = 504 GB/s",
    ),
    GpuSpec(
        name="rtx-4070-super", display_name="NVIDIA GeForce RTX 4070 SUPER",
        aliases=("rtx-4070-super", "4070-super", "4070super", "rtx4070super"),
        memory_bytes=_AD10X_12GB, memory_source=_ADA_12GB_MEM,
        peak_tflops=_peaks(35.5, 35.5, 71.0, 71.0, 283.9),
        memory_bandwidth_gbs=504.0, bf16_supported=True, compute_capability="8.9",
        sm_count=56, cuda_context_bytes=_ctx(56, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _ADA_WP + " per-SM rates x 56 SMs x 2475 MHz boost (7168 cores) = "
        "FP32/TF32 35.5, FP16/BF16 (FP32 acc) 71.0, INT8 283.9; 192-bit 21 Gbps = 504 GB/s",
    ),
    GpuSpec(
        name="rtx-4070-ti", display_name="NVIDIA GeForce RTX 4070 Ti",
        aliases=("rtx-4070-ti", "4070-ti", "4070ti", "rtx4070ti", "rtx-4070-ti-12gb"),
        memory_bytes=_AD10X_12GB, memory_source=_ADA_12GB_MEM,
        peak_tflops=_peaks(40.1, 40.1, 80.2, 80.2, 320.7),
        memory_bandwidth_gbs=504.0, bf16_supported=True, compute_capability="8.9",
        sm_count=60, cuda_context_bytes=_ctx(60, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _ADA_WP + " per-SM rates x 60 SMs x 2610 MHz boost (7680 cores; the "
        "whitepaper's 'RTX 4080 12GB') = FP32/TF32 40.1, FP16/BF16 (FP32 acc) 80.2, INT8 320.7; "
        "192-bit 21 Gbps = 504 GB/s",
    ),
    GpuSpec(
        name="rtx-4070-ti-super", display_name="NVIDIA GeForce RTX 4070 Ti SUPER",
        aliases=("rtx-4070-ti-super", "4070-ti-super", "4070tisuper", "rtx4070tisuper"),
        memory_bytes=_AD10X_16GB, memory_source=_ADA_16GB_MEM,
        peak_tflops=_peaks(44.1, 44.1, 88.2, 88.2, 352.8),
        memory_bandwidth_gbs=672.0, bf16_supported=True, compute_capability="8.9",
        sm_count=66, cuda_context_bytes=_ctx(66, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _ADA_WP + " per-SM rates x 66 SMs x 2610 MHz boost (8448 cores, "
        "AD103) = FP32/TF32 44.1, FP16/BF16 (FP32 acc) 88.2, INT8 352.8; 256-bit 21 Gbps = 672 GB/s",
    ),
    GpuSpec(
        name="rtx-4080", display_name="NVIDIA GeForce RTX 4080",
        aliases=("rtx-4080", "4080", "rtx4080", "rtx-4080-16gb", "4080-16gb"),
        memory_bytes=_AD10X_16GB, memory_source=_ADA_16GB_MEM,
        peak_tflops=_peaks(48.7, 48.7, 97.5, 97.5, 389.9),
        memory_bandwidth_gbs=716.8, bf16_supported=True, compute_capability="8.9",
        sm_count=76, cuda_context_bytes=_ctx(76, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source=_ADA_WP + " (RTX 4080 16GB column: 76 SMs x 2505 MHz): FP32/TF32 48.7, FP16/BF16 "
        "with FP32 acc 97.5 (194.9 with FP16 acc), INT8 389.9; 256-bit 22.4 Gbps = 716.8 GB/s",
    ),
    GpuSpec(
        name="rtx-4080-super", display_name="NVIDIA GeForce RTX 4080 SUPER",
        aliases=("rtx-4080-super", "4080-super", "4080super", "rtx4080super"),
        memory_bytes=_AD10X_16GB, memory_source=_ADA_16GB_MEM,
        peak_tflops=_peaks(52.2, 52.2, 104.4, 104.4, 417.8),
        memory_bandwidth_gbs=736.0, bf16_supported=True, compute_capability="8.9",
        sm_count=80, cuda_context_bytes=_ctx(80, 1536),
        interconnect="pcie4x16", interconnect_gbs=PCIE4_X16_GBS,
        source="derived: " + _ADA_WP + " per-SM rates x 80 SMs x 2550 MHz boost (10240 cores) = "
        "FP32/TF32 52.2, FP16/BF16 (FP32 acc) 104.4, INT8 417.8; 256-bit 23 Gbps = 736 GB/s",
    ),
    GpuSpec(
        name="rtx-5080", display_name="NVIDIA GeForce RTX 5080",
        aliases=("rtx-5080", "5080", "rtx5080", "rtx-5080-16gb", "5080-16gb"),
        memory_bytes=(16384 - 655) * MIB,
        memory_source="DERIVED: marketed 16 GB GDDR7 = 16384 MiB; driver-visible total taken as "
        "16384 - 655 = 15729 MiB, the reservation the RTX 5090 shows (32768 MiB -> torch '31.36 "
        "GiB total capacity', TrajectoryCrafter#20); no published Linux reading of this card",
        peak_tflops=_peaks(56.3, 56.3, 112.6, 112.6, 450.2),
        memory_bandwidth_gbs=960.0, bf16_supported=True, compute_capability="12.0",
        sm_count=84, cuda_context_bytes=_ctx(84, 1536),
        interconnect="pcie5x16", interconnect_gbs=PCIE5_X16_GBS,
        source=_BW_WP + " (RTX 5080: 84 SMs x 2617 MHz): FP32/TF32 56.3, FP16/BF16 with FP32 acc "
        "112.6 (225.1 with FP16 acc), INT8 450.2 dense; 256-bit 30 Gbps GDDR7 = 960 GB/s; PCIe "
        "gen5 x16",
    ),
    GpuSpec(
        name="rtx-5090", display_name="NVIDIA GeForce RTX 5090",
        aliases=("rtx-5090", "5090", "rtx5090", "rtx-5090-32gb", "5090-32gb"),
        memory_bytes=32113 * MIB,
        memory_source="torch '31.36 GiB total capacity' (TrajectoryCrafter#20, run from a tty; "
        "31.37 GiB in Wan2.1#465) = 32113 MiB; nvidia-smi 32607 MiB (club-3090#1322)",
        peak_tflops=_peaks(104.8, 104.8, 209.5, 209.5, 838.0),
        memory_bandwidth_gbs=1792.0, bf16_supported=True, compute_capability="12.0",
        sm_count=170, cuda_context_bytes=_ctx(170, 1536),
        interconnect="pcie5x16", interconnect_gbs=PCIE5_X16_GBS,
        source=_BW_WP + " (RTX 5090: 170 SMs x 2407 MHz): FP32/TF32 104.8, FP16/BF16 with FP32 acc "
        "209.5 (419 with FP16 acc), INT8 838 dense; 512-bit 28 Gbps GDDR7 = 1792 GB/s; PCIe gen5 "
        "x16; no NVLink",
    ),
    GpuSpec(
        name="rtx-2080-ti", display_name="NVIDIA GeForce RTX 2080 Ti",
        aliases=("rtx-2080-ti", "2080-ti", "2080ti", "rtx2080ti", "rtx-2080-ti-11gb"),
        memory_bytes=11_348_738_048,
        memory_source="cuMemGetInfo total 10822.94 MiB (nvshare#26, 2025 driver); older drivers "
        "gave torch '10.76 GiB total capacity' (JDAI-CV/image-captioning#11 2020, TMA#5) = the "
        "nvidia-smi 11019 MiB; the newer, smaller total is taken",
        peak_tflops=_peaks(13.4, None, 53.8, None, 215.2),
        memory_bandwidth_gbs=616.0, bf16_supported=False, compute_capability="7.5",
        sm_count=68, cuda_context_bytes=_ctx(68, 1024),
        interconnect="pcie3x16", interconnect_gbs=PCIE3_X16_GBS,
        source="NVIDIA Turing TU102 whitepaper (RTX 2080 Ti reference, 68 SMs x 1545 MHz): FP32 "
        "13.4, FP16 tensor with FP32 acc 53.8 (107.6 with FP16 acc; Founders Edition 1635 MHz: "
        "56.9), INT8 215.2; no TF32/BF16 (Turing); 352-bit 14 Gbps = 616 GB/s; PCIe gen3 x16 "
        "(NVLink bridge optional, not modelled)",
    ),
    GpuSpec(
        name="gtx-1080-ti", display_name="NVIDIA GeForce GTX 1080 Ti",
        aliases=("gtx-1080-ti", "1080-ti", "1080ti", "gtx1080ti", "gtx-1080-ti-11gb"),
        memory_bytes=11178 * MIB,
        memory_source="torch get_device_properties 11178 MiB (BachiLi/redner#97, 2020); torch "
        "'10.91 GiB total capacity' (3DIoUMatch-PVRCNN#3, 2021); newer drivers may reserve a "
        "little more (the RTX 2080 Ti lost 196 MiB between such reports)",
        peak_tflops=_peaks(11.3, None, 11.3, None, 45.4),
        memory_bandwidth_gbs=484.0, bf16_supported=False, compute_capability="6.1",
        sm_count=28, cuda_context_bytes=_ctx(28, 2048),
        interconnect="pcie3x16", interconnect_gbs=PCIE3_X16_GBS,
        source="NVIDIA GTX 1080 Ti spec (3584 cores, 1582 MHz boost): FP32 11.3; Pascal GP102 has "
        "no tensor cores, no TF32/BF16, and native FP16 at 1/64 rate, so fp16 = FP16 storage with "
        "FP32 math (cuBLAS compute-32F, torch's default) = the FP32 rate; INT8 45.4 = DP4A at 4x "
        "FP32 (as the GP102 Tesla P40 datasheet's 47 TOPS); 352-bit 11 Gbps GDDR5X = 484 GB/s",
    ),
    GpuSpec(
        name="rtx-3050-laptop-4gb", display_name="NVIDIA GeForce RTX 3050 Laptop GPU",
        aliases=("rtx-3050-laptop", "rtx-3050-laptop-gpu", "3050-laptop", "rtx3050-laptop",
                 "rtx-3050-laptop-4gb", "rtx-3050-mobile", "rtx-3050-4gb-laptop"),
        memory_bytes=3901 * MIB,
        memory_source="torch '3.81 GiB total capacity' for a 4 GB RTX 3050 laptop (NVlabs/RVT#7, "
        "2023) = 3901 MiB; Windows prints 4.00 GiB (DeforumStableDiffusionLocal#50)",
        peak_tflops=_peaks(7.1, 7.1, 14.3, 14.3, 57.0),
        memory_bandwidth_gbs=192.0, bf16_supported=True, compute_capability="8.6",
        sm_count=16, cuda_context_bytes=_ctx(16, 1536),
        interconnect="pcie4x8", interconnect_gbs=PCIE4_X16_GBS / 2,
        source="derived: " + _AMPERE_WP + " per-SM rates x 16 SMs (2048 cores, GA107) x 1740 MHz, "
        "the top of NVIDIA's laptop boost range (1057-1740 MHz: the laptop's power limit sets it) = "
        "FP32/TF32 7.1, FP16/BF16 (FP32 acc) 14.3, INT8 57.0; 128-bit GDDR6 at 12 Gbps (the usual "
        "fit; NVIDIA gives no speed) = 192 GB/s; PCIe gen4 x8 (GA107)",
    ),
    GpuSpec(
        name="gtx-1650-4gb", display_name="NVIDIA GeForce GTX 1650",
        aliases=("gtx-1650", "1650", "gtx1650", "gtx-1650-4gb", "1650-4gb"),
        memory_bytes=3901 * MIB,
        memory_source="torch '3.81 GiB total capacity' (ultralytics/yolov5#285 2020; DFDNet#39, "
        "Ubuntu 20.04) = 3901 MiB; nvidia-smi 4096 MiB",
        peak_tflops=_peaks(3.0, None, 3.0, None, None),
        memory_bandwidth_gbs=128.0, bf16_supported=False, compute_capability="7.5",
        sm_count=14, cuda_context_bytes=_ctx(14, 1024),
        interconnect="pcie3x16", interconnect_gbs=PCIE3_X16_GBS,
        source="NVIDIA GTX 1650 spec (TU117, 896 cores, 1665 MHz boost, 4 GB GDDR5 128-bit 8 Gbps "
        "= 128 GB/s): FP32 3.0; no tensor cores (GTX 16 series), so no TF32/BF16 and fp16 = FP16 "
        "storage with FP32 math (cuBLAS compute-32F) = the FP32 rate (its FP16 units double only "
        "FP16-accumulate math); INT8 None (no tensor path). GDDR6 (192 GB/s) and laptop variants "
        "differ",
    ),
)
