"""plan's local GPU through a fake NVML: the name maps to the catalog, the capacity is what is free
now (other processes counted), no GPU is None."""

from __future__ import annotations

import sys

from fake_nvml import GIB, make_fake_pynvml

from trainfit.hardware.gpus import find_gpu
from trainfit.monitor.local_gpu import local_gpu


def test_first_gpu_maps_to_the_catalog_with_free_memory(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    g = local_gpu()
    assert g is not None and g.device_name == "NVIDIA H100 80GB HBM3"
    assert g.total_bytes == 80 * GIB and g.used_bytes == 40 * GIB and g.free_bytes == 40 * GIB
    assert g.spec is not None and g.spec.name == find_gpu("h100").name
    assert g.spec.memory_bytes == 40 * GIB  # other processes' 40 GiB are not the job's
    assert str(40 * GIB) in g.spec.memory_source and "measured" in g.spec.memory_source
    # the catalog's peaks stay (published), only the capacity is the machine's
    assert g.spec.peak_tflops == find_gpu("h100").peak_tflops


def test_second_gpu_bytes_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    g = local_gpu(1)
    assert g is not None and g.device_name == "NVIDIA A10G" and g.spec is not None
    assert g.spec.name == "a10g" and g.spec.memory_bytes == 21 * GIB


def test_no_gpu_is_none(no_nvml):
    assert local_gpu() is None


def test_unknown_card_has_no_spec(monkeypatch):
    fake = make_fake_pynvml()
    fake.nvmlDeviceGetName = lambda h: "AMD Instinct MI300X"
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    g = local_gpu()
    assert g is not None and g.spec is None and g.total_bytes == 80 * GIB
