"""A plan set against what the user saw or has: a measured device number at their current
configuration (:class:`ObservedCheck`) and the host RAM they have free (:class:`HostRamCheck`).

Both are arithmetic on the rows the plan already predicted — no simulation is added.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainfit.job import JobSpec

SEQ_SCALED_TERMS = ("activations", "temporaries")
"""Breakdown terms that grow with micro-batch × sequence length (the rest does not: weights,
gradients, optimizer states, buffers, workspaces)."""

HOST_BATCH_TENSORS = 3
"""input_ids, labels, attention_mask: int64 host tensors per micro-batch (trainfit's collate)."""


@dataclass(frozen=True, kw_only=True)
class ScaledFit:
    """One (precision, checkpointing) group: the largest micro-batch that fits as predicted, and
    if every row's device peak were ``ratio`` × the prediction."""

    precision: str
    grad_ckpt: str
    largest_micro_predicted: int | None
    largest_micro_if_scaled: int | None


@dataclass(frozen=True, kw_only=True)
class ObservedCheck:
    """A device-memory number the user saw at their current configuration, against the plan's."""

    observed_device_bytes: int
    source: str
    """Where the number comes from, e.g. "nvidia-smi in the notes"."""
    predicted_device_bytes: int
    """The current configuration's device peak (simulated at full size)."""
    ratio: float
    """observed ÷ predicted."""
    fixed_bytes: int
    """Of the current configuration's allocated peak: weights, gradients, optimizer states,
    buffers, workspaces — independent of the sequence length and micro-batch."""
    seq_scaled_bytes: int
    """Of the same peak: activations and temporaries, ∝ micro-batch × sequence length."""
    scaled: list[ScaledFit] = field(default_factory=list)
    """What the answer would become if the device peaks were ``ratio`` × the predictions."""
    assumed: list[str] = field(default_factory=list)
    """The job fields the prediction assumed (not in the user's notes)."""


@dataclass(frozen=True, kw_only=True)
class HostRamCheck:
    """The host RAM the job needs that trainfit can state, against what is free."""

    free_bytes: int
    ranks: int
    weights_load_bytes_per_rank: int
    """The weights passing through host memory while loading, in their load dtype (4 B per
    parameter for full fine-tuning in fp32/AMP, 2 B otherwise; at most: a sharded safetensors
    load holds one shard at a time)."""
    host_batch_bytes_per_rank: int
    """The pick's collated host batches: micro × seq_len × 8 B × 3 tensors × (1 + workers ×
    prefetch)."""
    known_bytes: int
    """ranks × (weights at load + host batches + the CPU offload's bytes + the activation
    offload's pinned bytes)."""
    offload_bytes_per_rank: int = 0
    """What the pick's CPU offload holds in host RAM per rank (predicted; 0 without)."""
    activation_offload_bytes_per_rank: int = 0
    """The pinned host RAM the pick's activation offload holds per rank (predicted; 0 without
    one, or where not known — ``unknown`` says so: :mod:`trainfit.memory.host_offload`)."""
    activation_offload_exact: bool = True
    """False: ``activation_offload_bytes_per_rank`` is a bound (at most)."""
    unknown: str = "the CUDA libraries' and Python's own host memory per process (not modelled)"


def _largest_fitting(rows: list[Any], scale: float, limit: float) -> int | None:
    fitting = [r.job.micro_batch for r in rows if r.memory.peak_device_bytes * scale <= limit]
    return max(fitting) if fitting else None


def observed_check(result: Any, observed_device_bytes: int, source: str,
                   assumed: list[str] | None = None) -> ObservedCheck | None:
    """``result``: a PlanResult with a simulated current configuration and a GPU (else None)."""
    cur = result.current
    if cur is None or result.gpu_memory_bytes is None:
        return None
    predicted = cur.memory.peak_device_bytes
    ratio = observed_device_bytes / predicted
    bd = cur.memory.breakdown
    seq = sum(int(bd.get(k, 0)) for k in SEQ_SCALED_TERMS)
    fixed = sum(int(v) for k, v in bd.items() if k not in SEQ_SCALED_TERMS)
    limit = (1 - result.margin) * result.gpu_memory_bytes
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in result.rows:
        groups.setdefault((r.job.precision, r.job.grad_ckpt), []).append(r)
    scaled = [ScaledFit(precision=p, grad_ckpt=c,
                        largest_micro_predicted=_largest_fitting(rows, 1.0, limit),
                        largest_micro_if_scaled=_largest_fitting(rows, ratio, limit))
              for (p, c), rows in groups.items()]
    return ObservedCheck(observed_device_bytes=observed_device_bytes, source=source,
                         predicted_device_bytes=predicted, ratio=ratio, fixed_bytes=fixed,
                         seq_scaled_bytes=seq, scaled=scaled, assumed=list(assumed or []))


def host_ram_check(job: JobSpec, total_params: int, free_bytes: int,
                   offload_bytes: int = 0, activation_bytes: int | None = 0,
                   activation_exact: bool = True) -> HostRamCheck:
    """``job``: the pick's configuration; ``offload_bytes``: its CPU offload's host bytes per
    rank (``MemoryPrediction.host_offload_bytes``), ``activation_bytes`` its activation
    offload's pinned bytes per rank (``MemoryPrediction.host_activation_bytes``; None: not
    known, said in ``unknown``), ``activation_exact``: False where those are a bound."""
    load_b = 4 if job.method == "full" and job.precision != "bf16-true" else 2
    weights = total_params * load_b
    batches = (job.micro_batch or 1) * job.seq_len * 8 * HOST_BATCH_TENSORS * (
        1 + job.num_workers * job.prefetch_factor)
    return HostRamCheck(free_bytes=free_bytes, ranks=job.ranks, weights_load_bytes_per_rank=weights,
                        host_batch_bytes_per_rank=batches,
                        known_bytes=job.ranks * (weights + batches + offload_bytes
                                                 + (activation_bytes or 0)),
                        offload_bytes_per_rank=offload_bytes,
                        activation_offload_bytes_per_rank=activation_bytes or 0,
                        activation_offload_exact=activation_exact,
                        unknown=HostRamCheck.unknown + "".join(_host_unknowns(job,
                                                                             activation_bytes)))


def _host_unknowns(job: JobSpec, activation_bytes: int | None) -> list[str]:
    """What the known host bytes leave out for this job, each a clause."""
    out = []
    if activation_bytes is None:
        out.append(", and the saved activations --activation-offload keeps in host RAM "
                   "(reentrant checkpointing: not sized)")
    if job.offload != "none" and job.sharding in ("zero2", "zero3") and not job.zero_pin_memory:
        # DeepSpeed 0.19 pins its offloaded partitions by default (offload_config.py), through
        # PyTorch's pinned-memory cache, which rounds each up to a power of two
        # (memory/zero_host.py)
        out.append(", and, if DeepSpeed pins its partitions (pin_memory: true, DeepSpeed 0.19's "
                   "default), the power-of-two rounding of its pinned partitions "
                   "(--zero-pin-memory plans it)")
    return out


def with_checks(result: Any, *, observed_device_bytes: int | None = None,
                observed_source: str = "", host_ram_free_bytes: int | None = None,
                assumed: list[str] | None = None) -> Any:
    """``result`` (a PlanResult) with what a job file adds: the fields it marks as assumed, a
    device number observed at the current configuration, the host RAM free."""
    changes: dict[str, Any] = {}
    if assumed and result.assumptions is not None:
        changes["assumptions"] = dataclasses.replace(result.assumptions, assumed=list(assumed))
    if observed_device_bytes is not None:
        changes["observed"] = observed_check(result, observed_device_bytes, observed_source,
                                             assumed)
    if host_ram_free_bytes is not None and result.pick is not None:
        changes["host_ram"] = host_ram_check(result.pick.job, result.total_params,
                                             host_ram_free_bytes,
                                             result.pick.memory.host_offload_bytes,
                                             result.pick.memory.host_activation_bytes,
                                             result.pick.memory.host_activation_exact)
    return dataclasses.replace(result, **changes) if changes else result
