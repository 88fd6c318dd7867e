"""``--gpu`` and ``--interconnect`` as plan reads them: the card named (or this machine's), the
boards and memory sizes a name also covers said, and the link between GPUs given by name or as a
measured bus bandwidth. Out of cli/main.py, which parses the rest of plan's command line."""

from __future__ import annotations

from typing import Any

from trainfit.job import JobError


def gpu_spec(gpu: str | None, extra: dict[str, Any], interconnect: str | None,
             say: Any = None, ranks: int | None = None, where: str | None = None) -> Any:
    """The GPU named (--gpu, else the job file's), else the one this machine has (NVML), else
    none; ``ranks``: the job's, when known (a link for one rank is refused); ``where``: the job
    file, named when its ``gpu:`` is wrong."""
    if interconnect is not None and ranks is not None and ranks <= 1:
        raise JobError(f"--interconnect {interconnect} with 1 rank: one GPU syncs nothing "
                       "over a link", "add --ranks N (N ≥ 2), or drop --interconnect")
    from trainfit.cli.script import local_gpu_spec
    from trainfit.hardware.gpus import form_variants, known_gpu, memory_variants

    gpu_name = gpu or extra.get("gpu")
    said = f"--gpu {gpu_name}" if gpu or not where else f"gpu: {gpu_name} (in {where})"
    spec = None
    if gpu_name is not None:
        spec = known_gpu(str(gpu_name), said)
        others = memory_variants(str(gpu_name), spec)
        if others and say is not None:
            say(f"note: {said} is planned as {spec.display_name} "
                f"({spec.memory_bytes / 2**30:.2f} GiB); the name also covers "
                + ", ".join(f"{g.name} ({g.memory_bytes / 2**30:.2f} GiB)" for g in others)
                + ": name the card you have to plan for it")
        forms = form_variants(str(gpu_name), spec)
        if forms and say is not None:
            # the board sets the link between GPUs (and the clocks): ~10× apart for A100/H100
            say(f"note: {said} is planned as {spec.display_name} ({spec.interconnect}, "
                f"{spec.interconnect_gbs:g} GB/s between GPUs); the name also covers "
                + ", ".join(f"{g.name} ({g.interconnect}, {g.interconnect_gbs:g} GB/s)"
                            for g in forms)
                + ": name the board you have (its link sets every multi-GPU speed)")
    else:
        spec = local_gpu_spec(say or (lambda msg: None))
    if interconnect is not None:
        spec = with_interconnect(spec, interconnect)
        from trainfit.speed.comm import check_link_reach

        check_link_reach(spec, interconnect, ranks)
    return spec


def check_file_gpu(extra: dict[str, Any], where: str) -> None:
    """A job file's ``gpu:`` is a card trainfit knows, for the commands that do not plan on it
    (tune and train measure this machine's device): an unknown name is the same error as
    plan's, not silence (an audit: plan refused ``gpu: rtx-9999``, tune ran on)."""
    if extra.get("gpu") is not None:
        from trainfit.hardware.gpus import known_gpu

        # the file's key in the hint: tune and train have no --gpu (a review)
        known_gpu(str(extra["gpu"]), f"gpu: {extra['gpu']} (in {where})", "gpu: generic-24gb")


def with_interconnect(spec: Any, name: str) -> Any:
    import dataclasses

    from trainfit.speed.comm import INTERCONNECTS_GBS, RING_BUS_EFFICIENCY

    if spec is None:
        raise JobError("--interconnect needs --gpu", "name the GPU, e.g. --gpu a100-80gb")
    import re

    # a number, with or without its unit (the README writes 2.7GB/s): GB/s = 10^9 bytes/s
    m = re.fullmatch(r"\s*([-+0-9.eE]+)\s*(gb/s|gbps|gb/sec)?\s*", name, flags=re.IGNORECASE)
    try:
        bus = float(m.group(1)) if m else None
    except ValueError:
        bus = None
    if bus is not None:
        # a measured bus bandwidth (tune under torchrun, nccl-tests' busbw): used as is
        if not bus > 0:
            raise JobError(f"--interconnect {name}: must be > 0 GB/s",
                           "give the measured all-gather bus bandwidth, e.g. --interconnect "
                           "2.7GB/s")
        return dataclasses.replace(spec, interconnect=f"{bus:g} GB/s measured (given)",
                                   interconnect_gbs=bus / RING_BUS_EFFICIENCY)
    key = name.lower().replace("x16", "")
    if key not in INTERCONNECTS_GBS:
        raise JobError(f"--interconnect {name}: unknown interconnect",
                       "known: " + ", ".join(INTERCONNECTS_GBS) + ", or a measured bus "
                       "bandwidth in GB/s, e.g. 2.7GB/s (trainfit tune under torchrun measures "
                       "it)")
    check_nvlink_generation(spec, key)
    if key.startswith("nvlink") and (not spec.interconnect.startswith("nvlink")
                                     or "bridge" in spec.interconnect):
        # a PCIe board's NVLink is a bridge between two cards, at the bridge's speed (a review:
        # an RTX 3080, which has no connector, was timed at an A100 board's 300 GB/s)
        if spec.name not in NVLINK_BRIDGE_GBS:
            raise JobError(f"--interconnect {key}: a {spec.display_name} has no NVLink "
                           "connector", "use its PCIe link (pcie3 / pcie4 / pcie5) or a "
                           "measured GB/s (trainfit tune under torchrun measures it)")
        return dataclasses.replace(spec, interconnect=f"{key}-bridge (given)",
                                   interconnect_gbs=NVLINK_BRIDGE_GBS[spec.name], link_ranks=2)
    # a PCIe link named joins a host's GPUs (an H100 NVL pair's reach is its bridge's; a review);
    # an NVLink named on a GH200, whose node size is not known, is a quad blade's
    reach = spec.link_ranks if key.startswith("nvlink") and spec.link_ranks > 1 else \
        4 if key.startswith("nvlink") else 8
    return dataclasses.replace(spec, interconnect=f"{key} (given)",
                               interconnect_gbs=INTERCONNECTS_GBS[key], link_ranks=reach)


NVLINK_BRIDGE_GBS = {
    # GB/s per direction (half the datasheets' bidirectional figure, as INTERCONNECTS_GBS)
    "rtx-2080-ti": 50.0,  # GeForce RTX 2080 Ti: NVLink bridge 100 GB/s
    "rtx-3090": 56.25, "rtx-3090-ti": 56.25,  # GeForce RTX 3090 (Ti): 112.5 GB/s
    "rtx-a6000": 56.25, "rtx-a5000": 56.25, "rtx-a4500": 56.25,  # RTX Ampere: 112.5 GB/s
    "a40": 56.25,  # A40 datasheet: NVLink 112.5 GB/s (bidirectional)
    "a100-40gb-pcie": 300.0, "a100-80gb-pcie": 300.0,  # A100 PCIe: bridge for 2 GPUs, 600
    "h100-pcie": 300.0, "h100-nvl": 300.0,  # H100 PCIe / NVL: NVLink bridge 600 GB/s
}
"""The NVLink bridge of the PCIe boards that take one (NVIDIA's product pages and datasheets):
it joins two cards. Other PCIe boards have no connector (Ada and GeForce 40/50 have no NVLink
at all; an RTX 3080 or A10 has no connector)."""


NVLINK_OF_MAJOR = {7: "nvlink2", 8: "nvlink3", 9: "nvlink4", 10: "nvlink5"}
"""The NVLink generation each architecture has (Volta and Turing 2, Ampere 3, Hopper 4: NVIDIA's
NVLink pages; data-centre Blackwell, 10.x, NVLink 5); Ada (8.9) and GeForce/workstation
Blackwell (12.x) have none (a review: a B200 took nvlink2-4 at their figures)."""


def check_nvlink_generation(spec: Any, key: str) -> None:
    """A named NVLink the card cannot have is refused (an audit: --interconnect nvlink4 on an
    A100 planned NVSwitch's NCCL buffers and its bandwidth)."""
    cc = getattr(spec, "compute_capability", None)
    if not key.startswith("nvlink") or not cc:
        return
    major, minor = (int(x) for x in str(cc).split(".")[:2])
    none = (major, minor) == (8, 9) or major == 12
    has = NVLINK_OF_MAJOR.get(major)
    if not none and (has is None or has == key):
        return  # its generation, or an architecture this table does not hold: as given
    what = "has no NVLink" if none else f"has {has}"
    raise JobError(f"--interconnect {key}: a {spec.display_name} (compute capability {cc}) "
                   f"{what}", ("use " if none else f"use --interconnect {has}, ") +
                   "its PCIe link (pcie3 / pcie4 / pcie5) or a measured GB/s (trainfit tune "
                   "under torchrun measures it)")
