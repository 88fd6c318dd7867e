"""plan's local GPU through a fake NVML: the name maps to the catalog, the capacity is what is free
now (other processes counted), no GPU is None."""

from __future__ import annotations

import sys

import pytest
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


@pytest.mark.parametrize("visible, name", [
    ("1", "NVIDIA A10G"), ("1,0", "NVIDIA A10G"), ("GPU-1111", "NVIDIA A10G"),
    ("0", "NVIDIA H100 80GB HBM3"), ("", None), ("-1", None), ("7", None),
    ("MIG-3f2a-slice", None), ("GPU-9", None)])
def test_the_card_is_the_one_cuda_programs_get_as_cuda0(monkeypatch, visible, name):
    """NVML numbers cards in PCI order whatever CUDA_VISIBLE_DEVICES says: plan read GPU 0 under
    Slurm's CUDA_VISIBLE_DEVICES=5 (a review). The first visible entry, by index or UUID, is the
    card; none visible, one NVML does not have, or a MIG slice (not the card's memory): None."""
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    g = local_gpu()
    assert (g.device_name if g else None) == name


def test_a_card_in_mig_mode_is_not_read_as_the_job_s(monkeypatch):
    """A MIG-mode card gives CUDA a slice (Kubernetes names it in NVIDIA_VISIBLE_DEVICES): the
    card's 80 GB are not the slice's, so no local card is taken (a review)."""
    fake = make_fake_pynvml()
    fake.nvmlDeviceGetMigMode = lambda h: (1, 1) if h == 0 else (0, 0)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert local_gpu() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert local_gpu().device_name == "NVIDIA A10G"


def test_own_gpu_bytes_are_this_process_trees_on_that_card(monkeypatch):
    """tune's device peak reads this process's memory on its card from NVML (context and
    libraries beside PyTorch's reserve), not the card's use, which counts other processes."""
    import os

    from fake_nvml import FOREIGN_PID

    from trainfit.monitor.local_gpu import own_gpu_bytes

    me = os.getpid()
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(processes={
        0: {"compute": [(me, 9 * GIB)]},
        1: {"compute": [(me, 5 * GIB), (FOREIGN_PID, 7 * GIB)]}}))
    assert own_gpu_bytes("GPU-1111-fake") == 5 * GIB
    assert own_gpu_bytes("GPU-0000") == 9 * GIB
    assert own_gpu_bytes("GPU-2222") is None  # no such card


def test_no_gpu_is_none(no_nvml):
    assert local_gpu() is None


def test_unknown_card_has_no_spec(monkeypatch):
    fake = make_fake_pynvml()
    fake.nvmlDeviceGetName = lambda h: "AMD Instinct MI300X"
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    g = local_gpu()
    assert g is not None and g.spec is None and g.total_bytes == 80 * GIB


def _plan_json(args: list[str]) -> tuple[dict, str]:
    import json

    from typer.testing import CliRunner

    from trainfit.cli.main import app

    res = CliRunner().invoke(app, ["plan", *args, "--seq-len", "32", "--micro-batch", "1",
                                   "--precision", "amp-bf16", "--grad-ckpt", "off", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.output


def test_plan_without_gpu_uses_this_machines_gpu(monkeypatch, tiny_config_json):
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    d, _ = _plan_json([str(tiny_config_json)])
    assert d["gpu"] == find_gpu("h100").name
    assert d["gpu_memory_bytes"] == 40 * GIB  # free now: the other 40 GiB are another process's
    assert "NVML on this machine" in d["gpu_memory_source"] and "measured" in d["gpu_memory_source"]
    assert d["configs"][0]["fits"] is True and d["configs"][0]["tokens_per_s"] is not None


def test_plan_names_a_gpu_over_the_local_one(monkeypatch, tiny_config_json):
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    d, _ = _plan_json([str(tiny_config_json), "--gpu", "a10g"])
    assert d["gpu"] == "a10g" and "NVML" not in d["gpu_memory_source"]


def test_plan_without_nvml_plans_without_a_gpu(no_nvml, tiny_config_json):
    d, _ = _plan_json([str(tiny_config_json)])
    assert d["gpu"] is None and d["configs"][0]["fits"] is None and d.get("gpu_memory_source") is None
    # an audit: the device peak's CUDA context was said to be "0 MiB, GPU catalog", and the
    # legend "no row fits", with no GPU to fit on: both are unknown, and said so
    from typer.testing import CliRunner

    from trainfit.cli.main import app

    res = CliRunner().invoke(app, ["plan", str(tiny_config_json), "--seq-len", "32",
                                   "--micro-batch", "1", "--precision", "fp32", "--grad-ckpt", "off"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "fit unknown (no GPU)" in text and "no row fits" not in text
    assert "CUDA context (0 MiB" not in text
    assert "device: unknown without a GPU — reserved + the CUDA context" in text
    assert "fits: unknown without a GPU" in text
    # F2: the device peak is not printed as the reserve alone under a name that says device
    assert "alloc / reserved / device" not in text and " spare " not in text
    assert "unknown without --gpu, so not printed" in text
    c = d["configs"][0]
    assert c["peak_device_bytes"] is None and c["peak_device_upper_bytes"] is None
    assert d["smallest_device_bytes"] is None and c["peak_reserved_bytes"] > 0


def test_plan_on_an_unknown_card_plans_its_free_memory_speed_unknown(monkeypatch, tiny_config_json):
    fake = make_fake_pynvml()
    fake.nvmlDeviceGetName = lambda h: "AMD Instinct MI300X"
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    d, _ = _plan_json([str(tiny_config_json)])
    assert d["gpu_memory_bytes"] == 40 * GIB and d["gpu_display_name"] == "AMD Instinct MI300X"
    assert d["configs"][0]["fits"] is True and d["configs"][0]["tokens_per_s"] is None


def test_plan_says_it_plans_for_this_machines_gpu(monkeypatch, tiny_config_json):
    from typer.testing import CliRunner

    from trainfit.cli.main import app

    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    res = CliRunner().invoke(app, ["plan", str(tiny_config_json), "--seq-len", "32",
                                   "--micro-batch", "1", "--precision", "amp-bf16",
                                   "--grad-ckpt", "off"])
    assert res.exit_code == 0, res.output
    assert ("GPU: this machine's NVIDIA H100 80GB HBM3 (NVML) → catalog h100-sxm — capacity 40.00 GiB "
            "free of 80.00 GiB (40.00 GiB in use by other processes and the driver, measured now)"
            ) in res.output
