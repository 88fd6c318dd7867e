"""doctor's findings about where the memory is: activation checkpointing that memory does not
need, parameters living on the CPU, a host that pages (rules of :func:`trainfit.doctor.findings.find`)."""

from __future__ import annotations

from trainfit.doctor.observation import Finding, Observation, gain_from_removing, rounded

SWAP_BYTES_PER_S = 1 << 20
"""Swap traffic above 1 MiB/s during the run: the host is paging."""
RECOMPUTE_MEMORY_FRACTION = 0.5
"""Peak memory at or below this share of the capacity: checkpointing is not what makes it fit."""


def recompute_finding(o: Observation) -> Finding | None:
    s = o.split
    if o.recompute_s <= 0 or s.step_time_s <= 0:
        return None
    # the recomputation runs inside the backward: never more than it (the first round's forward
    # read against the pooled rounds' step once gave 106 % of the step, a gain of 999,999×)
    frac = min(o.recompute_s, s.backward_s) / s.step_time_s
    mem = (o.peak_memory_bytes / o.memory_capacity_bytes
           if o.peak_memory_bytes and o.memory_capacity_bytes else None)
    ev = {"recompute_s": rounded(o.recompute_s), "recompute_fraction": rounded(frac, 4),
          "peak_memory_bytes": o.peak_memory_bytes, "memory_capacity_bytes": o.memory_capacity_bytes,
          "peak_memory_fraction": rounded(mem, 4)}
    if mem is None or mem > RECOMPUTE_MEMORY_FRACTION:
        return None  # memory may need it: recomputation is then the price of fitting
    return Finding("needless-recompute", ev,
                   "turn activation checkpointing off (grad_ckpt: off / "
                   f"model.gradient_checkpointing_disable()): the peak uses {mem:.0%} of the memory, "
                   "room for the stored activations "
                   "(trainfit plan predicts the peak without it)", rounded(gain_from_removing(frac), 4),
                   f"recomputed forward {frac:.0%} of the step while memory is {mem:.0%} used (measured)")


def offload_finding(o: Observation) -> Finding | None:
    if o.device != "cuda" or not o.params_on_cpu_fraction:
        return None
    ev = {"params_on_cpu_fraction": rounded(o.params_on_cpu_fraction, 4),
          "h2d_copy_s": rounded(o.split.h2d_copy_s), "step_time_s": rounded(o.split.step_time_s)}
    return Finding("cpu-offload", ev, "keep parameters and optimizer states on the GPU where they fit "
                   "(trainfit plan says whether they do); offload only what does not fit", None,
                   f"{o.params_on_cpu_fraction:.0%} of the parameters live on the CPU (measured)")


def swap_finding(o: Observation) -> Finding | None:
    h = o.host
    if h is None or h.swap_in_bytes_per_s is None:
        return None
    rate = (h.swap_in_bytes_per_s or 0.0) + (h.swap_out_bytes_per_s or 0.0)
    if rate < SWAP_BYTES_PER_S:
        return None
    ev = {"swap_in_bytes_per_s": rounded(h.swap_in_bytes_per_s, 0), "swap_out_bytes_per_s":
          rounded(h.swap_out_bytes_per_s, 0), "min_available_bytes": h.min_available_bytes,
          "ram_total_bytes": h.ram_total_bytes, "peak_rss_bytes": h.peak_rss_bytes}
    return Finding("host-swapping", ev, "fewer DataLoader workers or a lower prefetch_factor; a "
                   "memory-mapped token file instead of in-RAM token lists (pages shared, not copied "
                   "per worker); close other programs", None,
                   f"the host paged {rate / 2**20:.1f} MiB/s during the run (measured)")
