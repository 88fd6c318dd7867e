"""Tests for the GPU catalog (trainfit.hardware.gpus)."""

from __future__ import annotations

import dataclasses

import pytest

from trainfit.hardware.gpus import (
    DTYPES,
    GIB,
    GPUS,
    MIB,
    GpuSpec,
    find_gpu,
    find_gpu_by_device_name,
    gpu_names,
)

REQUIRED = (
    "t4", "v100-16gb", "v100-32gb", "rtx-3080-10gb", "rtx-3080-12gb",
    "rtx-3080-20gb", "rtx-3090", "rtx-4090", "a10g", "a10", "l4", "l40s",
    "rtx-a6000", "a100-40gb-sxm", "a100-40gb-pcie", "a100-80gb-sxm",
    "a100-80gb-pcie", "h100-sxm", "h100-pcie", "h200",
)


def test_catalog_has_required_gpus() -> None:
    assert set(REQUIRED) <= set(gpu_names())
    assert gpu_names() == list(GPUS)


@pytest.mark.parametrize("spec", list(GPUS.values()), ids=list(GPUS))
def test_every_spec_is_sane(spec: GpuSpec) -> None:
    assert spec.memory_bytes > 0
    assert spec.memory_source
    assert spec.source
    assert set(spec.peak_tflops) == set(DTYPES)
    assert spec.peak_tflops["fp32"] is not None and spec.peak_tflops["fp32"] > 0
    assert spec.peak_tflops["fp16"] is not None
    assert spec.peak_tflops["fp16"] > spec.peak_tflops["fp32"]
    assert spec.memory_bandwidth_gbs is not None and spec.memory_bandwidth_gbs > 0
    assert spec.bf16_supported == (spec.peak_tflops["bf16"] is not None)
    assert spec.sm_count is not None and spec.sm_count > 0
    assert 300 * MIB <= spec.cuda_context_bytes <= 600 * MIB
    assert spec.interconnect_gbs is not None and spec.interconnect_gbs > 0
    assert all(a == a.lower() for a in spec.aliases)
    # The CUDA-visible total is a bit under the advertised size in GiB.
    advertised_gib = {"h200": 141}.get(spec.name)
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
        ("Tesla V100-PCIE-16GB", "v100-16gb"), ("  a10g  ", "a10g"),
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
    assert spec.memory_bytes == int(gib * GIB)
    assert spec.name == f"generic-{gib:g}gb"
    assert all(v is None for v in spec.peak_tflops.values())
    assert spec.peak_flops("bf16") is None
    assert spec.memory_bandwidth_gbs is None
    assert "ESTIMATE" in spec.memory_source
    assert spec.name not in GPUS


@pytest.mark.parametrize(
    "query",
    ["", "unknown", "rtx-9999", "a99", "NVIDIA GeForce RTX 3080 Ti", "generic-0gb",
     "NVIDIA H100 NVL", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA L40"],
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
    assert find_gpu_by_device_name("NVIDIA GeForce RTX 3080 Ti", 12 * GIB) is None
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
    assert GPUS["a100-80gb-sxm"].cuda_context_bytes == 516 * MIB
    assert GPUS["h100-sxm"].cuda_context_bytes == GPUS["h200"].cuda_context_bytes
