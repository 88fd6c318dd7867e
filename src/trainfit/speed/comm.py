"""Gradient synchronisation for ``ranks`` > 1: collective bytes, time over the interconnect, and
the part of it the backward does not hide.

* DDP (``sharding: none``): one ring all-reduce of the gradients per optimizer step (HF Trainer and
  accelerate skip it on accumulation micro-steps with ``no_sync``).  A ring all-reduce sends
  2(N−1)/N × the gradient bytes per rank (Patarasuk & Yuan 2009; NCCL's "bus bandwidth"
  definition, nccl-tests doc/PERFORMANCE.md).  DDP launches each 25 MiB bucket as soon as its
  gradients exist, so the all-reduce runs under the rest of the last micro-step's backward; what
  shows is max(comm − backward, the last bucket).
* DeepSpeed ZeRO-2 (``sharding: zero2``): every micro-step's backward reduces the gradients
  (``reduce_ready_partitions_and_remove_grads``; ``no_sync`` is refused under ZeRO-2,
  deepspeed/runtime/engine.py), each bucket all-reduced (``use_multi_rank_bucket_allreduce``
  defaults to true: stage_1_and_2.py ``average_tensor``) — 2(N−1)/N × the gradient bytes per
  micro-step — and after the optimizer step the updated partitions of the trainable
  parameters are all-gathered once ((N−1)/N × their bytes). DeepSpeed 0.19.8's default
  ``overlap_comm`` is false below stage 3 (runtime/zero/config.py ``overlap_comm_valid``): the
  reductions are not hidden.
* FSDP (``sharding: fsdp``, full shard): every micro-step all-gathers the parameters for the
  forward and again for the backward ((N−1)/N × parameter bytes each) and reduce-scatters the
  gradients ((N−1)/N × gradient bytes); prefetching overlaps them with compute, so what shows per
  micro-step is max(0, comm − compute).  DeepSpeed ZeRO-3 (``sharding: zero3``) moves the same
  bytes; its device copies beside them (each gathered parameter out of the flat buffer, each
  gradient into the reduce bucket, concatenated and pre-divided: ``ZERO3_COPY_HBM_FACTOR``,
  ``ZERO3_GRAD_HBM_FACTOR``) take memory bandwidth as below.

Hidden is not free: NCCL's kernels move what they send and receive through the GPU's memory,
"at least 2x [the link's bytes] ... as we need to store to memory, then read back from it. If you
add reading from or writing to user data, it can be 3x" (NCCL's maintainer, NVIDIA/nccl#1428,
where an A100's GEMMs ran 1.18 → 2.08 ms under an overlapped all-gather).  While a collective
runs under compute, that traffic takes the memory bandwidth the compute kernels would have had:
the hidden part's HBM bytes (2× an all-gather's bus bytes: stored, then read back to forward;
3× a reduction's: its received chunk and the local one read, the sum written) at the card's
peak bandwidth are added to the step (``contention_s``), less what a longer collective or a
host-bound step's idle device absorbs.  Below what nccl#1428 measured: there the GEMMs slowed
76 % where the traffic took a third of the A100's 2,039 GB/s (~3 × 230 GB/s); the SMs NCCL's
kernels occupy are not counted.

Every number here is a prediction; the overlap model is stated in the output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from trainfit.job import JobError
from trainfit.speed.predict import SpeedPrediction, unknown_speed

RING_BUS_EFFICIENCY = 0.75
"""Fraction of the link's per-direction bandwidth a large NCCL ring all-reduce reaches as bus
bandwidth (nccl-tests: ~230 of 300 GB/s on A100 NVLink3, ~22-24 of 31.5 GB/s on PCIe gen4)."""
DDP_BUCKET_BYTES = 25 * 2**20
"""``DistributedDataParallel(bucket_cap_mb=25)``, torch's default."""
BACKWARD_SHARE = 2.0 / 3.0
"""Share of a micro-step's compute that is backward: backward costs twice the forward's FLOPs
(Kaplan et al. 2020, sec. 2.1), which the gradient all-reduce can hide under."""
GATHER_HBM_FACTOR = 2.0
"""HBM bytes per bus byte of a ring all-gather (received chunks stored, then read back to be
forwarded: NVIDIA/nccl#1428)."""
REDUCE_HBM_FACTOR = 3.0
"""HBM bytes per bus byte of a ring reduction step (the received and the local chunk read, the
sum written: NVIDIA/nccl#1428's "can be 3x" with user data)."""
ZERO3_COPY_HBM_FACTOR = 2.0
"""HBM bytes per parameter byte DeepSpeed ZeRO-3 copies on the device beside each gather (read,
then written), on its side stream: each gathered parameter ``torch.cat`` out of the gathered flat
buffer (``AllGatherCoalescedHandle.wait``, runtime/zero/partition_parameters.py, under the
coordinator's allgather stream), twice per micro-step — DeepSpeed 0.19.8.  FSDP2's copy-in/out
are kernels of its simulated step, timed there."""
ZERO3_GRAD_HBM_FACTOR = 6.0
"""HBM bytes per gradient byte of ZeRO-3's reduction beside the collective, each read and
written once: the copy into the contiguous reduce bucket (stage3.py
``__add_grad_to_ipg_bucket``), its ``torch.cat`` into the interleaved flat buffer and the
``div_`` that pre-divides it (runtime/comm/coalesced_collectives.py
``reduce_scatter_coalesced``, DeepSpeed's default ``reduce_scatter: true``; a review)."""
INTERCONNECTS_GBS = {"pcie3": 15.75, "pcie4": 31.5, "pcie5": 63.0, "nvlink2": 150.0,
                     "nvlink3": 300.0, "nvlink4": 450.0, "nvlink5": 900.0}
"""Per-direction GB/s (1e9) of an x16 PCIe link or one GPU's NVLink total (half the datasheet's
bidirectional figure) — the same convention as the GPU catalog's ``interconnect_gbs``."""


@dataclass(frozen=True)
class SyncTime:
    collective: str
    bytes_per_rank: float
    """Bytes each rank sends per optimizer step (bus bytes)."""
    comm_s: float
    """Time of the collectives per optimizer step at the modelled bus bandwidth."""
    exposed_s: float
    """The part not hidden behind compute: what it adds to the step."""
    overlap: str
    contention_s: float = 0.0
    """What the hidden part's traffic through the GPU's memory adds to the step, per optimizer
    step: its HBM bytes at the card's peak bandwidth, less what a longer collective or an idle
    device absorbs (see the module docstring)."""


def _hidden_hbm_s(hidden_share: float, gathered: float, reduced: float,
                  hbm_gbs: float | None) -> float:
    """Seconds of the card's memory bandwidth the hidden share of ``gathered`` all-gather and
    ``reduced`` reduction bus bytes takes from compute (0 where the bandwidth is unknown)."""
    if not hbm_gbs or hidden_share <= 0:
        return 0.0
    hbm_bytes = GATHER_HBM_FACTOR * gathered + REDUCE_HBM_FACTOR * reduced
    return hidden_share * hbm_bytes / (hbm_gbs * 1e9)


def sync_time(*, ranks: int, sharding: str, grad_accum: int, grad_bytes: float,
              param_bytes: float, link_gbs: float, micro_step_s: float,
              hbm_gbs: float | None = None, device_share: float = 1.0,
              reduce_once: bool = False) -> SyncTime | None:
    """``grad_bytes``/``param_bytes``: the full (unsharded) trainable-gradient and parameter
    bytes; ``micro_step_s``: one micro-step's predicted time without synchronisation;
    ``hbm_gbs``: the card's memory bandwidth (GB/s), for what hidden traffic takes from compute
    (None: not counted); ``device_share``: the share of the micro-step the GPU is busy (a
    host-bound step's idle device absorbs the contention first); ``reduce_once``: FSDP under
    ``no_sync`` (HF Trainer / accelerate's accumulation, ``JobSpec.fsdp_no_sync``) reduce-scatters
    the gradients in the last micro-step only, the earlier ones keeping them unsharded (a review:
    the flag doubled the memory and left every micro-step's reduce-scatter in the time)."""
    if ranks <= 1:
        return None
    bus = link_gbs * 1e9 * RING_BUS_EFFICIENCY
    frac = (ranks - 1) / ranks
    if sharding in ("fsdp", "zero3"):  # ZeRO-3 gathers and reduce-scatters as FSDP does
        reducing = 1 if reduce_once and sharding == "fsdp" else grad_accum
        # (micro-steps, gradient bytes each reduce-scatters): under no_sync all but the last
        # only gather
        kinds = [_prefetched_micro_steps(n, param_bytes, grads, frac, bus, micro_step_s,
                                         hbm_gbs, device_share, zero3=sharding == "zero3")
                 for n, grads in ((grad_accum - reducing, 0.0), (reducing, grad_bytes)) if n > 0]
        moved, comm_s, exposed, contention = (sum(k[i] for k in kinds) for i in range(4))
        who = "DeepSpeed ZeRO-3" if sharding == "zero3" else "FSDP"
        # FSDP's rows are timed through FSDP2's own step (its copy-in/out kernels counted);
        # ZeRO-3's compute is the plain step's plus DeepSpeed's hooks as host time
        # (speed/zero_hooks.py; an audit: without them a launch-bound Mixtral read 155k
        # tokens/s under ZeRO-3 against FSDP's 114k)
        untimed = ("; DeepSpeed's per-module hooks (fetch and release, forward and backward, "
                   "the gradient hooks) are counted as host time (framework_host_s: their "
                   "Python as measured on a CPU, without their CUDA stream and event calls, so "
                   "this tokens/s leans high); its device copies (each gathered parameter out "
                   "of the flat buffer; each gradient into the reduce bucket, then concatenated "
                   "and pre-divided for the reduce-scatter) are counted in that traffic"
                   ) if sharding == "zero3" else ""
        what = ("all-gather ×2 per micro-step + reduce-scatter in the last (FSDP, no_sync on "
                "accumulation)" if reducing < grad_accum
                else f"all-gather ×2 + reduce-scatter per micro-step ({who})")
        return SyncTime(what, moved, comm_s, exposed,
                        "prefetched: hidden under each micro-step's compute up to its length"
                        + _contention_words(contention) + untimed, contention)
    if sharding == "zero2":  # param_bytes: the trainable parameters' (what is gathered)
        per_micro = 2.0 * frac * grad_bytes
        gather = frac * param_bytes
        comm = (per_micro * grad_accum + gather) / bus
        return SyncTime("all-reduce of gradients per micro-step + all-gather of the updated "
                        "partitions per step (DeepSpeed ZeRO-2)", per_micro * grad_accum + gather,
                        comm, comm, "not hidden (DeepSpeed's default overlap_comm: false below "
                        "ZeRO-3, as accelerate's plugin leaves it; a config with overlap_comm: "
                        "true, as the HF docs' examples, hides it as ZeRO-3 does — the memory "
                        "counts that case's second bucket: a bound)")
    moved = 2.0 * frac * grad_bytes
    comm = moved / bus
    last_bucket = 2.0 * frac * min(grad_bytes, DDP_BUCKET_BYTES) / bus
    window = BACKWARD_SHARE * micro_step_s  # the last micro-step's backward hides it
    exposed = min(comm, max(comm - window, last_bucket))
    # a ring all-reduce is a reduce-scatter then an all-gather, half its bus bytes each; what
    # runs hidden (≤ the window) slows the window's device time, unless the device idles; the
    # last bucket goes after the (slowed) backward, a longer all-reduce ends on its own
    taken = _hidden_hbm_s(1.0 - exposed / comm if comm else 0.0, moved / 2, moved / 2, hbm_gbs)
    base = window + exposed
    contention = max(base, max(window, device_share * window + taken) + last_bucket) - base
    return SyncTime("ring all-reduce of gradients once per step (DDP, no_sync on accumulation)",
                    moved, comm, exposed,
                    "bucketed: hidden under the last micro-step's backward except the last "
                    "25 MiB bucket" + _contention_words(contention), contention)


def _prefetched_micro_steps(n: int, param_bytes: float, grad_bytes: float, frac: float,
                            bus: float, micro_step_s: float, hbm_gbs: float | None,
                            device_share: float, *, zero3: bool
                            ) -> tuple[float, float, float, float]:
    """(bus bytes, collective s, exposed s, contention s) of ``n`` FSDP / ZeRO-3 micro-steps that
    each gather ``param_bytes`` twice and reduce-scatter ``grad_bytes``, prefetched under the
    micro-step's compute."""
    gathered, reduced = frac * 2.0 * param_bytes, frac * grad_bytes
    comm_micro = (gathered + reduced) / bus
    hidden = min(comm_micro, micro_step_s) / comm_micro if comm_micro else 0.0
    taken = _hidden_hbm_s(hidden, gathered, reduced, hbm_gbs)
    if zero3 and hbm_gbs:
        # its copies run whatever the overlap: all of their traffic takes bandwidth
        taken += (ZERO3_COPY_HBM_FACTOR * 2.0 * param_bytes
                  + ZERO3_GRAD_HBM_FACTOR * grad_bytes) / (hbm_gbs * 1e9)
    # the micro-step ends when both the collectives and the slowed device are done: a longer
    # collective, or an idle device (host-bound), absorbs the slow-down first
    base = max(comm_micro, micro_step_s)
    return (n * (gathered + reduced), n * comm_micro, n * max(0.0, comm_micro - micro_step_s),
            n * (max(base, device_share * micro_step_s + taken) - base))


def _contention_words(contention_s: float) -> str:
    return (f"; its hidden traffic through the GPU's memory (2× an all-gather's bytes, 3× a "
            f"reduction's) slows compute by {contention_s:.3g} s per step"
            if contention_s > 0 else "")


def with_sync(speed: SpeedPrediction, sync: SyncTime | None) -> SpeedPrediction:
    """The speed with the exposed synchronisation added to the step."""
    if sync is None or speed.step_time_s is None:
        return speed
    old = speed.step_time_s
    new = old + sync.exposed_s + sync.contention_s
    k = old / new
    return replace(speed, step_time_s=new,
                   tokens_per_s=None if speed.tokens_per_s is None else speed.tokens_per_s * k,
                   samples_per_s=None if speed.samples_per_s is None else speed.samples_per_s * k,
                   mfu=None if speed.mfu is None else speed.mfu * k,
                   hfu=None if speed.hfu is None else speed.hfu * k,
                   device_busy_fraction=None if speed.device_busy_fraction is None
                   else speed.device_busy_fraction * k,
                   # waiting on the link is over half the step: its largest share
                   bound="communication-bound" if sync.exposed_s + sync.contention_s > old
                   else speed.bound,
                   sync_s=sync.comm_s, sync_exposed_s=sync.exposed_s,
                   sync_contention_s=sync.contention_s,
                   sync_note=f"{sync.collective}; {sync.overlap}")


def measured_link(gpu: Any) -> bool:
    """The link is a measured bus bandwidth given with ``--interconnect`` (cli/gpu_arg)."""
    return "measured (given)" in gpu.interconnect


def given_link(gpu: Any) -> bool:
    """The link between the GPUs was given (``--interconnect``: a name or a measured GB/s), not
    the GPU catalog's."""
    return "(given)" in gpu.interconnect


def peer_to_peer(gpu: Any) -> bool:
    """Whether NCCL can copy GPU to GPU over the catalog's link.  GeForce cards have PCIe
    peer-to-peer disabled by the driver (RTX 30 series only across an NVLink bridge, RTX 40/50
    not at all): NCCL then stages every transfer through host memory (its SHM transport), at a
    speed set by the host — not the slot's figure, nor that of a PCIe generation named with
    --interconnect (a review: ``--interconnect pcie4`` timed a GeForce pair at the slot's 31.5
    GB/s).  A measured bus bandwidth is taken as is, an NVLink (bridge) as NCCL's P2P."""
    if measured_link(gpu) or gpu.interconnect.startswith("nvlink"):
        return True
    return "geforce" not in gpu.display_name.lower()


HOSTS_NETWORK = "the network between hosts (InfiniBand, RoCE, Ethernet)"
"""What joins GPUs past one host's link (8 of them), which no GPU datasheet gives."""


def untimed_link(gpu: Any, ranks: int) -> tuple[str, bool] | None:
    """Why the sync of ``ranks`` > 1 cannot be timed over ``gpu``'s link, and whether naming a
    link would time it (unknown_interconnect's ``why`` and ``names``); None: it can. What plan
    times its rows by (plan.row_speed.synced) and names as their link (plan.grid)."""
    if not gpu.interconnect_gbs:
        return "", True
    if ranks > gpu.link_ranks and not given_link(gpu):
        # the catalog's link is one host's (NVLink, PCIe; a bridge a pair's): the ranks past it
        # sync over the network between hosts, often 10× slower than NVLink (a review: 64
        # ranks were timed on one NVLink domain)
        if gpu.link_ranks == 1:
            return (f"how many GPUs one {gpu.display_name} node joins over {gpu.interconnect} "
                    "is not known (one superchip in most servers, four in a quad blade)"), False
        beyond = HOSTS_NETWORK if gpu.link_ranks >= 8 else \
            "the path between the pairs (PCIe, or the network between hosts)"
        return (f"the {gpu.interconnect} of the GPU catalog joins {gpu.link_ranks} of them: "
                f"{beyond} is not known"), False
    if not peer_to_peer(gpu):
        return (f"{gpu.display_name} has no PCIe peer-to-peer: NCCL goes through host memory, "
                "at the host's speed"), False
    return None


def check_link_reach(spec: Any, interconnect: str, ranks: int | None) -> None:
    """A link named joins one host's GPUs (a bridge a pair): more ranks also sync over what
    joins those, which only a measured bus bandwidth gives (a review: ``--interconnect nvlink4``
    timed 16 ranks on one NVLink domain)."""
    if ranks is None or ranks <= spec.link_ranks or measured_link(spec):
        return
    beyond = HOSTS_NETWORK if spec.link_ranks >= 8 else \
        "PCIe between the bridged pairs, or the network between hosts"
    raise JobError(f"--interconnect {interconnect} with {ranks} ranks: "
                   f"{spec.interconnect.removesuffix(' (given)')} joins {spec.link_ranks} GPUs; "
                   f"the others sync over {beyond}",
                   "give the measured all-gather bus bandwidth across all the ranks, e.g. "
                   "--interconnect 50GB/s (nccl-tests' busbw, or trainfit tune under torchrun)")


def unknown_interconnect(speed: SpeedPrediction, ranks: int, why: str = "",
                         names: bool = True) -> SpeedPrediction:
    """``speed`` made unknown, with why and the fix; ``names``: a link's name would give its
    speed (False: only a measured bus bandwidth does — a link through host memory or across
    hosts)."""
    return unknown_speed(speed.model_flops_per_token,
                         f"{ranks} ranks but {why or 'this GPU' + chr(39) + 's interconnect is unknown'}"
                         ": run trainfit tune under torchrun (it measures the link) and give "
                         "--interconnect GBPS" + (", or name it (pcie3|pcie4|pcie5|nvlink2|"
                                                  "nvlink3|nvlink4|nvlink5)" if names else
                                                  " (the measured all-gather bus bandwidth, "
                                                  "e.g. nccl-tests' busbw)"))
