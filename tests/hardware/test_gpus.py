"""Tests for the GPU catalog (trainfit.hardware.gpus)."""

from __future__ import annotations

import dataclasses

import pytest

from trainfit.hardware import gpus as _gpus
from trainfit.hardware.gpu_catalog import CATALOG
from trainfit.hardware.gpus import (
    DTYPES,
    GENERIC_CUDA_SHARE,
    GIB,
    GPUS,
    MIB,
    GpuSpec,
    find_gpu,
    find_gpu_by_device_name,
    gpu_names,
)
from trainfit.hardware.spec import _ctx

REQUIRED = (
    "t4", "v100-16gb", "v100-32gb", "rtx-3080-10gb", "rtx-3080-12gb",
    "rtx-3080-20gb", "rtx-3090", "rtx-4090", "a10g", "a10", "l4", "l40s",
    "rtx-a6000", "a100-40gb-sxm", "a100-40gb-pcie", "a100-80gb-sxm",
    "a100-80gb-pcie", "h100-sxm", "h100-pcie", "h200",
)
# The cards people with one GPU own (issue "The GPU they actually have") and more datacenter parts.
ADDED = (
    "rtx-3060-12gb", "rtx-3060-ti", "rtx-3070", "rtx-3070-ti", "rtx-3080-ti", "rtx-4060-ti-8gb",
    "rtx-4060-ti-16gb", "rtx-4070", "rtx-4070-super", "rtx-4070-ti", "rtx-4070-ti-super",
    "rtx-4080", "rtx-4080-super", "rtx-5080", "rtx-5090", "rtx-2080-ti", "gtx-1080-ti",
    "rtx-3050-laptop-4gb", "gtx-1650-4gb", "a2", "rtx-a4000", "rtx-a4500", "rtx-a5000", "a40",
    "l40", "rtx-6000-ada", "h100-nvl", "gh200-96gb", "b200", "p100-16gb",
)
# Marketed size (GB read as GiB) of entries whose name does not carry it.
ADVERTISED_GIB = {
    "h200": 141, "rtx-3060-ti": 8, "rtx-3070": 8, "rtx-3070-ti": 8, "rtx-3080-ti": 12,
    "rtx-4070": 12, "rtx-4070-super": 12, "rtx-4070-ti": 12, "rtx-4070-ti-super": 16,
    "rtx-4080": 16, "rtx-4080-super": 16, "rtx-5080": 16, "rtx-5090": 32, "rtx-2080-ti": 11,
    "gtx-1080-ti": 11, "a2": 16, "rtx-a4000": 16, "rtx-a4500": 20, "rtx-a5000": 24, "a40": 48,
    "l40": 48, "rtx-6000-ada": 48, "h100-nvl": 94, "b200": 180,
}
# No tensor cores: fp16 matmuls with FP32 accumulate run on the FP32 units.
NO_TENSOR_CORES = {"p100-16gb", "gtx-1080-ti", "gtx-1650-4gb"}


def test_catalog_has_required_gpus() -> None:
    assert set(REQUIRED) <= set(gpu_names())
    assert set(ADDED) <= set(gpu_names())
    assert gpu_names() == list(GPUS)


@pytest.mark.parametrize("spec", list(GPUS.values()), ids=list(GPUS))
def test_every_spec_is_sane(spec: GpuSpec) -> None:
    assert spec.memory_bytes > 0
    assert spec.memory_source
    assert spec.source
    assert set(spec.peak_tflops) == set(DTYPES)
    assert spec.peak_tflops["fp32"] is not None and spec.peak_tflops["fp32"] > 0
    assert spec.peak_tflops["fp16"] is not None
    if spec.name in NO_TENSOR_CORES:
        assert spec.peak_tflops["fp16"] == spec.peak_tflops["fp32"]
    else:
        assert spec.peak_tflops["fp16"] > spec.peak_tflops["fp32"]
    assert spec.memory_bandwidth_gbs is not None and spec.memory_bandwidth_gbs > 0
    assert spec.bf16_supported == (spec.peak_tflops["bf16"] is not None)
    assert spec.sm_count is not None and spec.sm_count > 0
    # the base measured on an H100 (515 MiB) + 1 KiB of stack per resident thread
    assert 515 * MIB < spec.cuda_context_bytes <= 900 * MIB
    assert spec.interconnect_gbs is not None and spec.interconnect_gbs > 0
    assert all(a == a.lower() for a in spec.aliases)
    # The CUDA-visible total is a bit under the advertised size in GiB.
    advertised_gib = ADVERTISED_GIB.get(spec.name)
    if advertised_gib is None:
        digits = [int(p[:-2]) for p in spec.name.split("-") if p.endswith("gb")]
        advertised_gib = digits[0] if digits else None
    if advertised_gib is not None:
        assert 0.9 * advertised_gib * GIB < spec.memory_bytes <= advertised_gib * GIB


def test_known_memory_totals() -> None:
    assert GPUS["t4"].memory_bytes == 15_835_398_144
    assert GPUS["a100-40gb-sxm"].memory_bytes == 42_505_273_344
    assert GPUS["a100-80gb-sxm"].memory_bytes == 85_095_874_560
    assert GPUS["rtx-4090"].memory_bytes == 25_393_692_672
    # CUDA-visible total, below NVML's 81559 MiB.
    assert GPUS["h100-sxm"].memory_bytes < 81_559 * MIB
    assert "ESTIMATE" in GPUS["rtx-3080-20gb"].memory_source
    assert GPUS["rtx-3080-20gb"].memory_bytes > GPUS["rtx-3080-12gb"].memory_bytes


def test_peak_ordering_and_values() -> None:
    h100, a100, a10g = GPUS["h100-sxm"], GPUS["a100-80gb-sxm"], GPUS["a10g"]
    assert h100.peak_flops("bf16") > a100.peak_flops("bf16") > a10g.peak_flops("bf16")
    assert a100.peak_tflops == {
        "fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0
    }
    assert h100.peak_tflops["bf16"] == 989.4
    assert GPUS["t4"].peak_tflops["fp16"] == 65.0
    assert GPUS["t4"].peak_tflops["fp32"] == 8.1
    # GeForce: FP32-accumulate tensor rate.
    assert GPUS["rtx-4090"].peak_tflops["bf16"] == 165.2
    assert GPUS["rtx-3090"].peak_tflops["fp16"] == 71.0
    assert GPUS["rtx-3080-10gb"].peak_tflops["fp16"] == 59.5
    assert GPUS["rtx-3080-20gb"].peak_tflops == GPUS["rtx-3080-10gb"].peak_tflops
    assert GPUS["h200"].memory_bandwidth_gbs > GPUS["h100-sxm"].memory_bandwidth_gbs


@pytest.mark.parametrize("name", ["t4", "v100-16gb", "v100-32gb"])
def test_pre_ampere_has_no_bf16_or_tf32(name: str) -> None:
    spec = GPUS[name]
    assert spec.bf16_supported is False
    assert spec.peak_tflops["bf16"] is None
    assert spec.peak_tflops["tf32"] is None
    assert spec.peak_flops("bf16") is None


def test_peak_flops_units_and_aliases() -> None:
    a100 = GPUS["a100-80gb-sxm"]
    assert a100.peak_flops("bf16") == pytest.approx(312e12)
    assert a100.peak_flops("fp32") == pytest.approx(19.5e12)
    assert a100.peak_flops("bfloat16") == a100.peak_flops("bf16")
    assert a100.peak_flops("torch.float16") == a100.peak_flops("fp16")
    assert a100.peak_flops("float32") == a100.peak_flops("fp32")
    with pytest.raises(ValueError):
        a100.peak_flops("fp4")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("t4", "t4"), ("T4", "t4"), ("tesla-t4", "t4"), ("Tesla T4", "t4"),
        ("v100", "v100-16gb"), ("V100 32GB", "v100-32gb"),
        ("a100", "a100-80gb-sxm"), ("A100 80GB", "a100-80gb-sxm"),
        ("a100-80g", "a100-80gb-sxm"), ("a100_40gb", "a100-40gb-sxm"),
        ("A100 80GB PCIe", "a100-80gb-pcie"), ("a100-pcie-40gb", "a100-40gb-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
        ("rtx-3080-20gb", "rtx-3080-20gb"), ("RTX 3080 20GB", "rtx-3080-20gb"),
        ("rtx_3080_20g", "rtx-3080-20gb"), ("3080", "rtx-3080-10gb"),
        ("rtx-3080-12gb", "rtx-3080-12gb"), ("rtx3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("4090", "rtx-4090"),
        ("NVIDIA A10G", "a10g"), ("a10", "a10"), ("L4", "l4"), ("l40s", "l40s"),
        ("a6000", "rtx-a6000"), ("RTX A6000", "rtx-a6000"),
        ("h100", "h100-sxm"), ("H100 SXM5", "h100-sxm"), ("h100 pcie", "h100-pcie"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("h200", "h200"),
        ("Tesla V100-PCIE-16GB", "v100-pcie-16gb"),
        ("Tesla V100-SXM2-32GB", "v100-32gb"), ("v100 pcie", "v100-pcie-16gb"), ("  a10g  ", "a10g"),
    ],
)
def test_find_gpu_aliases(query: str, expected: str) -> None:
    spec = find_gpu(query)
    assert spec is not None, query
    assert spec.name == expected


@pytest.mark.parametrize(
    ("query", "gib"),
    [
        ("generic-4gb", 4), ("4gb", 4), ("generic:4GB", 4), ("generic-8GiB", 8),
        ("8gb", 8), ("generic-12", 12), ("24 GB", 24), ("generic-7.5gb", 7.5),
    ],
)
def test_generic_cards(query: str, gib: float) -> None:
    spec = find_gpu(query)
    assert spec is not None
    # sold as N GB: CUDA reports less (the catalog's least share, so a fit is never optimistic);
    # a size given in GiB is a capacity, taken as it is
    share = 1.0 if query.lower().endswith("gib") else GENERIC_CUDA_SHARE
    assert spec.memory_bytes == int(gib * share * GIB)
    # the catalog's cards by the size they are sold as (ECC on datacenter cards takes ~8 %)
    sold_gb = {"gtx-1650-4gb": 4, "rtx-3050-laptop-4gb": 4, "t4": 16, "a2": 16, "a10g": 24,
               "a10": 24, "l4": 24, "rtx-2080-ti": 11, "rtx-4060-ti-8gb": 8, "rtx-3090": 24,
               "a100-40gb-pcie": 40, "h100-pcie": 80, "rtx-a6000": 48, "l40s": 48}
    shares = {n: find_gpu(n).memory_bytes / (gb * GIB) for n, gb in sold_gb.items()}
    assert min(shares.values()) >= GENERIC_CUDA_SHARE > min(shares.values()) - 0.005, shares
    assert spec.name == f"generic-{gib:g}gb"
    assert all(v is None for v in spec.peak_tflops.values())
    assert spec.peak_flops("bf16") is None
    assert spec.memory_bandwidth_gbs is None
    assert ("given" if share == 1.0 else "ESTIMATE") in spec.memory_source
    assert spec.name not in GPUS


@pytest.mark.parametrize(
    "query",
    ["", "unknown", "rtx-9999", "a99", "NVIDIA TITAN RTX", "generic-0gb",
     "generic--1gb",
     "NVIDIA H200 NVL", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA L20", "rtx-4060",
     "NVIDIA GeForce RTX 3050 Ti Laptop GPU"],
)
def test_unknown_returns_none(query: str) -> None:
    assert find_gpu(query) is None


@pytest.mark.parametrize(
    ("device_name", "total", "expected"),
    [
        ("Tesla T4", 15_835_398_144, "t4"),
        ("Tesla T4", None, "t4"),
        ("NVIDIA A100-SXM4-80GB", 85_095_874_560, "a100-80gb-sxm"),
        ("NVIDIA A100-SXM4-40GB", None, "a100-40gb-sxm"),
        ("NVIDIA A100-PCIE-40GB", 42_298_834_944, "a100-40gb-pcie"),
        ("NVIDIA A100 80GB PCIe", None, "a100-80gb-pcie"),
        ("NVIDIA GeForce RTX 4090", 25_393_692_672, "rtx-4090"),
        ("NVIDIA GeForce RTX 3090", 25_447_170_048, "rtx-3090"),
        ("NVIDIA H100 80GB HBM3", 85_520_809_984, "h100-sxm"),
        ("NVIDIA H100 PCIe", None, "h100-pcie"),
        ("NVIDIA H200", 150_754_820_096, "h200"),
        ("NVIDIA A10G", 23_609_475_072, "a10g"),
        ("NVIDIA A10", None, "a10"),
        ("NVIDIA L4", None, "l4"),
        ("NVIDIA L40S", None, "l40s"),
        ("NVIDIA RTX A6000", None, "rtx-a6000"),
        # Same name, memory picks the variant.
        ("Tesla V100-SXM2-16GB", 16_945_512_448, "v100-16gb"),
        ("Tesla V100-SXM2-32GB", None, "v100-32gb"),
        ("NVIDIA GeForce RTX 3080", 10_472_390_656, "rtx-3080-10gb"),
        ("NVIDIA GeForce RTX 3080", 12_629_508_096, "rtx-3080-12gb"),
        ("NVIDIA GeForce RTX 3080", 21_000_000_000, "rtx-3080-20gb"),
        ("GeForce RTX 3080", None, "rtx-3080-10gb"),
    ],
)
def test_device_name_mapping(
    device_name: str, total: int | None, expected: str
) -> None:
    spec = find_gpu_by_device_name(device_name, total)
    assert spec is not None
    assert spec.name == expected


def test_device_name_memory_mismatch_substitutes_reported_memory() -> None:
    modded = find_gpu_by_device_name("NVIDIA GeForce RTX 4090", 48 * GIB)
    assert modded is not None
    assert modded.memory_bytes == 48 * GIB
    assert modded.name == "rtx-4090-48gb-reported"
    assert modded.peak_tflops == GPUS["rtx-4090"].peak_tflops
    assert GPUS["rtx-4090"].memory_bytes == 25_393_692_672  # catalog untouched


def test_device_name_unknown() -> None:
    assert find_gpu_by_device_name("NVIDIA GeForce GTX 1080") is None
    assert find_gpu_by_device_name("NVIDIA TITAN RTX", 24 * GIB) is None
    assert find_gpu_by_device_name("NVIDIA GeForce RTX 4060 Laptop GPU") is None


@pytest.mark.parametrize(("device_name", "total_gib", "expected"), [
    ("NVIDIA GeForce RTX 3080 Ti", 12, "rtx-3080-ti"),
    ("NVIDIA GeForce RTX 3060", 12, "rtx-3060-12gb"),
    ("NVIDIA GeForce RTX 3060 Ti", 8, "rtx-3060-ti"),
    ("NVIDIA GeForce RTX 4060 Ti", 16, "rtx-4060-ti-16gb"),
    ("NVIDIA GeForce RTX 4060 Ti", 8, "rtx-4060-ti-8gb"),
    ("NVIDIA GeForce RTX 4070 Ti SUPER", 16, "rtx-4070-ti-super"),
    ("NVIDIA GeForce RTX 4070 SUPER", 12, "rtx-4070-super"),
    ("NVIDIA GeForce RTX 3050 Laptop GPU", 4, "rtx-3050-laptop-4gb"),
    ("NVIDIA GeForce GTX 1650", 4, "gtx-1650-4gb"),
    ("NVIDIA H100 NVL", 94, "h100-nvl"),
    ("NVIDIA GH200 480GB", 95, "gh200-96gb"),
    ("Tesla P100-PCIE-16GB", 16, "p100-16gb"),
    ("NVIDIA L40", 45, "l40"),
    ("NVIDIA A40", 45, "a40"),
    ("NVIDIA RTX 6000 Ada Generation", 48, "rtx-6000-ada"),
])
def test_device_names_of_the_added_cards(device_name: str, total_gib: int, expected: str) -> None:
    """The names torch / NVML report map to the catalog (tune, doctor, the local GPU)."""
    spec = find_gpu_by_device_name(device_name, total_gib * GIB)
    assert spec is not None and spec.name.startswith(expected), (device_name, spec)
    assert find_gpu_by_device_name("AMD Instinct MI300X") is None


def test_spec_is_frozen_and_validated() -> None:
    t4 = GPUS["t4"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t4.memory_bytes = 1  # type: ignore[misc]
    assert hash(t4) == hash(GPUS["t4"])
    with pytest.raises(ValueError):
        dataclasses.replace(t4, peak_tflops={"fp32": 1.0})
    with pytest.raises(ValueError):
        dataclasses.replace(t4, memory_bytes=0)


def test_cuda_context_scales_with_sms() -> None:
    assert GPUS["t4"].cuda_context_bytes < GPUS["a100-80gb-sxm"].cuda_context_bytes
    assert GPUS["a100-80gb-sxm"].cuda_context_bytes == (515 + 216) * MIB
    # the H100's measured above max_memory_reserved: 751-779 MiB (benchmarks/results/gpu_measured.json)
    assert GPUS["h100-sxm"].cuda_context_bytes == 779 * MIB
    assert GPUS["h100-sxm"].cuda_context_bytes == GPUS["h200"].cuda_context_bytes


# ---- the cards people own (issue "The GPU they actually have") ----

# Max resident threads per SM by compute capability (CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability").
THREADS_PER_SM = {"6.0": 2048, "6.1": 2048, "7.0": 2048, "7.5": 1024, "8.0": 2048, "8.6": 1536,
                  "8.9": 1536, "9.0": 2048, "10.0": 2048, "12.0": 1536}


@pytest.mark.parametrize("spec", CATALOG, ids=[s.name for s in CATALOG])
def test_every_entry_names_its_sources(spec: GpuSpec) -> None:
    assert spec.source.strip()
    assert spec.memory_source.strip()


@pytest.mark.parametrize("name", ADDED)
def test_added_memory_is_a_reading_or_says_derived(name: str) -> None:
    text = GPUS[name].memory_source
    reading = any(w in text for w in ("torch", "deviceQuery", "cuMemGetInfo", "totalGlobalMem"))
    assert reading or text.startswith("DERIVED")
    assert "measured" not in text.lower()


def test_no_alias_names_two_gpus() -> None:
    owner: dict[str, str] = {}
    for spec in CATALOG:
        for key in {_gpus._norm(k) for k in (spec.name, spec.display_name, *spec.aliases)}:
            assert owner.setdefault(key, spec.name) == spec.name, (key, owner[key], spec.name)
    assert len({s.name for s in CATALOG}) == len(CATALOG)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("RTX 4090", "rtx-4090"), ("rtx-3060", "rtx-3060-12gb"), ("3060", "rtx-3060-12gb"),
        ("rtx3060", "rtx-3060-12gb"), ("rtx-3060-12gb", "rtx-3060-12gb"),
        ("RTX 3060 12GB", "rtx-3060-12gb"), ("NVIDIA GeForce RTX 3060", "rtx-3060-12gb"),
        ("NVIDIA GeForce RTX 3060 Ti", "rtx-3060-ti"), ("rtx 3070", "rtx-3070"),
        ("NVIDIA GeForce RTX 3070 Ti", "rtx-3070-ti"), ("3080 Ti", "rtx-3080-ti"),
        ("NVIDIA GeForce RTX 3080 Ti", "rtx-3080-ti"), ("4060 Ti", "rtx-4060-ti-8gb"),
        ("rtx-4060-ti-16gb", "rtx-4060-ti-16gb"), ("RTX 4060 Ti 16G", "rtx-4060-ti-16gb"),
        ("NVIDIA GeForce RTX 4070", "rtx-4070"), ("rtx_4070_super", "rtx-4070-super"),
        ("NVIDIA GeForce RTX 4070 Ti", "rtx-4070-ti"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", "rtx-4070-ti-super"), ("4080", "rtx-4080"),
        ("NVIDIA GeForce RTX 4080 SUPER", "rtx-4080-super"), ("RTX 5080", "rtx-5080"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"), ("2080ti", "rtx-2080-ti"),
        ("NVIDIA GeForce RTX 2080 Ti", "rtx-2080-ti"), ("GTX 1080 Ti", "gtx-1080-ti"),
        ("NVIDIA GeForce GTX 1080 Ti", "gtx-1080-ti"), ("GeForce GTX 1080 Ti", "gtx-1080-ti"),
        ("NVIDIA GeForce RTX 3050 Laptop GPU", "rtx-3050-laptop-4gb"),
        ("rtx-3050-laptop", "rtx-3050-laptop-4gb"), ("gtx 1650", "gtx-1650-4gb"),
        ("NVIDIA GeForce GTX 1650", "gtx-1650-4gb"), ("NVIDIA A2", "a2"),
        ("NVIDIA RTX A4000", "rtx-a4000"), ("a4500", "rtx-a4500"), ("RTX A5000", "rtx-a5000"),
        ("NVIDIA A40", "a40"), ("NVIDIA L40", "l40"), ("l40s", "l40s"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"), ("NVIDIA H100 NVL", "h100-nvl"),
        ("h100", "h100-sxm"), ("NVIDIA GH200 480GB", "gh200-96gb"), ("gh200", "gh200-96gb"),
        ("NVIDIA B200", "b200"), ("Tesla P100-PCIE-16GB", "p100-16gb"), ("p100", "p100-16gb"),
    ],
)
def test_find_added_gpus_by_common_spellings(query: str, expected: str) -> None:
    spec = find_gpu(query)
    assert spec is not None, query
    assert spec.name == expected


@pytest.mark.parametrize("spec", CATALOG, ids=[s.name for s in CATALOG])
def test_no_bf16_or_tf32_before_ampere(spec: GpuSpec) -> None:
    major = int((spec.compute_capability or "0").split(".")[0])
    if major < 8:  # Pascal (6.x), Volta (7.0), Turing (7.5)
        assert spec.bf16_supported is False
        assert spec.peak_tflops["bf16"] is None
        assert spec.peak_tflops["tf32"] is None
    else:
        assert spec.bf16_supported is True
        assert spec.peak_tflops["tf32"] is not None


@pytest.mark.parametrize("spec", CATALOG, ids=[s.name for s in CATALOG])
def test_fp16_at_least_fp32_where_tensor_cores_exist(spec: GpuSpec) -> None:
    fp16, fp32 = spec.peak_tflops["fp16"], spec.peak_tflops["fp32"]
    assert fp16 is not None and fp32 is not None
    assert fp16 >= fp32
    if spec.name not in NO_TENSOR_CORES:
        assert fp16 >= 2 * fp32 * 0.99  # tensor path: at least twice the FP32 units


def test_cards_without_tensor_cores() -> None:
    for name in NO_TENSOR_CORES:
        spec = GPUS[name]
        assert spec.compute_capability in ("6.0", "6.1", "7.5")
        assert spec.peak_tflops["fp16"] == spec.peak_tflops["fp32"]
    assert GPUS["p100-16gb"].peak_tflops["int8"] is None  # GP100: no DP4A


GEFORCE_HALF_RATE = [
    n for n in ADDED
    if GPUS[n].compute_capability in ("8.6", "8.9", "12.0") and GPUS[n].display_name.startswith(
        "NVIDIA GeForce")
]


@pytest.mark.parametrize("name", GEFORCE_HALF_RATE)
def test_geforce_tensor_rates_follow_the_whitepaper_ratios(name: str) -> None:
    # Ampere/Ada/Blackwell GeForce per SM and clock: FP32 = TF32 = 256, FP16/BF16 (FP32 acc) 512
    # (half the FP16-acc rate), INT8 2048.
    p = GPUS[name].peak_tflops
    assert p["tf32"] == p["fp32"]
    assert p["bf16"] == p["fp16"]
    assert p["fp16"] == pytest.approx(2 * p["fp32"], rel=0.01)
    assert p["int8"] == pytest.approx(8 * p["fp32"], rel=0.01)


@pytest.mark.parametrize("spec", CATALOG, ids=[s.name for s in CATALOG])
def test_context_uses_the_threads_per_sm_of_the_compute_capability(spec: GpuSpec) -> None:
    assert spec.compute_capability is not None and spec.sm_count is not None
    threads = THREADS_PER_SM[spec.compute_capability]
    assert spec.cuda_context_bytes == _ctx(spec.sm_count, threads)


def test_added_values() -> None:
    assert GPUS["rtx-3060-12gb"].memory_bytes == GPUS["rtx-3080-12gb"].memory_bytes
    assert GPUS["rtx-3070"].memory_bytes == 7967 * MIB
    assert GPUS["rtx-5090"].peak_tflops["bf16"] == 209.5
    assert GPUS["rtx-4080"].peak_tflops["fp16"] == 97.5
    assert GPUS["rtx-2080-ti"].peak_tflops["fp16"] == 53.8
    assert GPUS["l40"].peak_tflops["bf16"] == 181.0  # half the L40S: GeForce-like FP32 acc
    assert GPUS["gh200-96gb"].peak_tflops == GPUS["h100-sxm"].peak_tflops
    assert GPUS["b200"].peak_tflops["bf16"] == 2250.0
    assert GPUS["rtx-4060-ti-8gb"].interconnect == "pcie4x8"
    assert GPUS["rtx-4060-ti-16gb"].memory_bytes > GPUS["rtx-4060-ti-8gb"].memory_bytes
    # seed users' 4 GB cards: under 4 GiB as CUDA reports them
    for name in ("rtx-3050-laptop-4gb", "gtx-1650-4gb"):
        assert 3.7 * GIB < GPUS[name].memory_bytes < 4 * GIB


def test_a_bare_family_name_names_its_other_memory_sizes():
    """"a100" plans the 80 GB SXM card: the 40 GB ones are named beside it (a QA run read
    "fits" for 80 GB as an A100-40GB owner); an exact name, or a family of one size, none."""
    from trainfit.hardware.gpus import find_gpu, memory_variants

    a100 = find_gpu("a100")
    assert a100.name == "a100-80gb-sxm"
    assert {g.name for g in memory_variants("a100", a100)} == {"a100-40gb-sxm", "a100-40gb-pcie"}
    assert [g.name for g in memory_variants("v100", find_gpu("v100"))] == ["v100-32gb"]
    assert memory_variants("a100-40gb", find_gpu("a100-40gb")) == []
    assert memory_variants("h100", find_gpu("h100")) == []  # SXM, PCIe: both 80 GB
    assert memory_variants("t4", find_gpu("t4")) == []
    # the family as the resolved card names it, not only as typed (an audit: "3080" and
    # "rtx3080" planned the 10 GB card with no word of the 12 and 20 GB ones)
    for typed in ("3080", "rtx3080", "RTX 3080", "rtx-3080"):
        assert {g.name for g in memory_variants(typed, find_gpu(typed))} == \
            {"rtx-3080-12gb", "rtx-3080-20gb"}, typed
    for typed in ("a100-40g", "rtx-3080-12g", "a100 40 GB"):  # a size given: one card
        assert memory_variants(typed, find_gpu(typed)) == [], typed


def test_a_near_miss_is_offered_the_card_with_its_model_number():
    """An audit: "3090ti" was offered the 3080/3070/3060 Ti (spelling alone), not the 3090 (now
    a card of the catalog: resolved, and a near miss of it is offered it)."""
    from trainfit.hardware.gpus import close_gpu_names

    assert find_gpu("3090ti").name == "rtx-3090-ti"
    assert find_gpu_by_device_name("NVIDIA GeForce RTX 3090 Ti", 24 * GIB).name == "rtx-3090-ti"
    assert close_gpu_names("3090tii")[0] == "rtx-3090-ti"
    assert close_gpu_names("3070tix")[0] == "rtx-3070-ti"
    assert close_gpu_names("4080super")[0] == "rtx-4080-super"
    assert close_gpu_names("rtx4900")[0] == "rtx-4090"  # no card has 4900: spelling


def test_a_size_the_card_does_not_have_names_no_card():
    """QA: "a100-99gb", "h100-40gb", "l40s-24gb" were planned as the catalog's 80/80/48 GB
    cards; a size a card is sold at, or the one its NVML name states, still finds it."""
    from trainfit.hardware.gpus import find_gpu

    for wrong in ("a100-99gb", "h100-40gb", "l40s-24gb", "rtx-4090-48gb", "t4-32gb"):
        assert find_gpu(wrong) is None, wrong
    for right, name in (("t4-16gb", "t4"), ("l40s-48gb", "l40s"), ("rtx-4090-24gb", "rtx-4090"),
                        ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA A10G", "a10g")):
        assert find_gpu(right).name == name, right


def test_a_name_without_its_board_says_the_other_boards():
    """A review: --gpu a100-80gb and --gpu h100 silently meant the SXM boards (NVLink), whose
    link between GPUs is ~10× the PCIe boards' that the same names also cover."""
    from trainfit.hardware.gpus import find_gpu, form_variants

    def forms(name):
        return [g.name for g in form_variants(name, find_gpu(name))]

    assert forms("a100-80gb") == ["a100-80gb-pcie"]
    assert forms("h100") == ["h100-pcie"]  # the 94 GB NVL board is another memory size
    assert forms("h100-sxm") == forms("a100-80gb-pcie") == forms("rtx-4090") == []
    for named in ("a100-pcie-80gb", "h100-sxm5", "a100-sxm4-80gb", "NVIDIA H100 80GB HBM3"):
        if find_gpu(named) is not None:
            assert forms(named) == [], named
    sxm, pcie = find_gpu("a100-80gb"), find_gpu("a100-80gb-pcie")
    assert sxm.interconnect_gbs > 5 * pcie.interconnect_gbs
