"""DeepSpeed ZeRO-2 / ZeRO-3 per rank, as accelerate and HF Trainer run it (deepspeed 0.14-0.19),
and CPU offload: analytic terms over the one-process step simulated in the compute dtype.

DeepSpeed's partitioning hooks do not run on this machine's fake tensors, so what it holds is
written down from its code (stated per term, bytes per rank, Ψ = parameter bytes in the compute
dtype, Ψ_t = trainable parameters, N = ranks) and checked against DeepSpeed itself run by 2 gloo
ranks on this CPU (its CPU accelerator; ``tests/memory/test_zero_vs_gloo.py``):

* ZeRO-2 (``runtime/zero/stage_1_and_2.py``): the bf16/fp16 parameters whole on every rank
  (``bit16_groups_flat``); the fp32 master partition (``single_partition_of_fp32_groups``,
  4Ψ_t/N) and the optimizer states on it; the gradient partition (``grads_in_partition``,
  2Ψ_t/N); the reduce buckets (``reduce_bucket_size`` elements of the gradient dtype, two with
  ``overlap_comm``) re-allocated in every backward; at the step a fp32 copy of the gradient
  partition (4Ψ_t/N).
* ZeRO-3 (``runtime/zero/stage3.py``, ``partition_parameters.py``): the parameters partitioned
  (Ψ/N); the same master, states and gradient partition; one reduce bucket; and the gathered
  parameters, :func:`zero3_gathered_bytes`: the module in flight plus the prefetch bucket
  (``stage3_prefetch_bucket_size`` elements), or, once the first step has recorded the trace,
  what DeepSpeed keeps gathered from its forward to its backward: the modules its prefetcher,
  which runs ahead of the forward into the backward's uses, has marked, up to
  ``stage3_max_live_parameters`` (1e9 elements) — all of a model under 1 B — and past it by up
  to one parameter (its last pop: a bound, the largest parameter), or, where more, those used
  again within ``stage3_max_reuse_distance`` (1e9 elements; both DeepSpeed's defaults and the
  HF docs' configs).
* Buckets: accelerate and the HF docs' configs write ``"auto"``, which HF fills from the hidden
  size h: ``reduce_bucket_size = h²``, ``stage3_prefetch_bucket_size = 0.9·h²``
  (transformers ``integrations/deepspeed.py``); ``overlap_comm: true`` as in those configs.
* ZeRO-3's ``memory_efficient_linear`` (``true`` by default; the HF docs' configs leave it so):
  ``torch.nn.functional.linear`` becomes ``LinearFunctionForZeroStage3`` (``runtime/zero/
  linear.py``), installed by ``zero.Init`` and left installed for the rest of the process, which
  saves every call's input for the backward even where the weight is frozen (plain autograd
  keeps a frozen linear's weight, not its input): a LoRA rank keeps each frozen projection's
  input.  The one-process step is simulated with the same function (:func:`zero3_linear`).
* bitsandbytes' quantization state is a Python attribute of each layer, not a parameter: it is
  whole on every rank under any sharding.
* ``offload: optimizer`` moves the fp32 master, the states and the fp32 gradient partition to the
  host; ``all`` (ZeRO-3 ``offload_param``, FSDP ``CPUOffload``) the parameter partitions too.
The optimizer runs on DeepSpeed's flat fp32 partitions, not on the model's weights: its states
and temporaries are those of one 1-D tensor of the partition's size (:mod:`trainfit.memory.
zero_step`, measured by running the job's optimizer on one), not the one-process step's.  The
CPU run checks the per-rank bytes at a small size (ZeRO-2 and ZeRO-3, full and LoRA: +0.04 …
+1.3 %; the step's own peak too); it does not see what only a GPU run has — the fused Adam,
offloading to the host, DeepSpeed's CUDA streams (its prefetch stream keeps the allocator from
reusing those blocks at once), NCCL — so the error band still states the published misses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from trainfit.job import JobSpec
from trainfit.memory.allocator import K_MIN_BLOCK
from trainfit.memory.zero_step import flat_optimizer_bytes, step_temporary_bytes
from trainfit.model.source import ModelSource, hidden_size


class _KeepInputLinear(torch.autograd.Function):
    """DeepSpeed's ``LinearFunctionForZeroStage3`` (deepspeed 0.19.8 ``runtime/zero/linear.py``)
    as memory sees it: the forward's ``input.matmul(weight.t())`` (+ bias) and
    ``save_for_backward(input, weight, bias)`` whatever needs a gradient; the backward's
    products only for the inputs that need one.  Written here, not imported: trainfit does not
    depend on DeepSpeed, and its function asks DeepSpeed's accelerator for the autocast state."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        ctx.save_for_backward(input, weight, bias)
        if input.dim() == 2 and bias is not None:
            return torch.addmm(bias, input, weight.t())
        out = input.matmul(weight.t())
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.matmul(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(
                input.reshape(-1, input.shape[-1]))
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(list(range(grad_output.dim() - 1)))
        return grad_input, grad_weight, grad_bias


def _zero3_linear(input: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    return _KeepInputLinear.apply(input, weight, bias)


@contextlib.contextmanager
def zero3_linear() -> Iterator[None]:
    """``torch.nn.functional.linear`` as a ZeRO-3 process has it (``memory_efficient_linear``),
    for the one-process step simulated for a ZeRO-3 job; restored after (DeepSpeed leaves its own
    installed: each plan worker process simulates one step at a time)."""
    original = torch.nn.functional.linear
    torch.nn.functional.linear = _zero3_linear
    try:
        yield
    finally:
        torch.nn.functional.linear = original


def compute_job(job: JobSpec) -> JobSpec:
    """The one-process step DeepSpeed runs: the module in the compute dtype (bf16/fp16 mode: no
    autocast, no fp32 weights on the GPU besides the master partition, added here)."""
    precision = "bf16-true" if (job.precision or "fp32").startswith("amp") else job.precision
    # the rank's own micro-steps: one rank keeping the effective batch would accumulate `ranks`
    # times as many (JobSpec.replace), and a one-micro-step row ran two
    return job.replace(precision=precision, sharding="none", ranks=1, offload="none",
                       grad_accum=job.grad_accum, effective_batch=None,
                       zero_reduce_bucket=None, zero_prefetch_bucket=None)


def compute_dtype_bytes(job: JobSpec) -> int:
    """Bytes per element of the dtype DeepSpeed's module computes in (:func:`compute_job`): 4 in
    fp32 mode, 2 in bf16/fp16 mode."""
    return 4 if (job.precision or "fp32") == "fp32" else 2


def master_bytes_per_param(job: JobSpec) -> int:
    """fp32 master weights DeepSpeed keeps apart from a bf16/fp16 module, whose 16-bit copy the
    step refreshes (its ZeRO optimizers' fp32 partitions: ``single_partition_of_fp32_groups``,
    stage 3's ``fp32_partitioned_groups_flat``); 0 in fp32 mode, where the parameters are the
    master (the partition is still a clone of them: counted in :func:`zero_phases`)."""
    return 0 if compute_dtype_bytes(job) == 4 else 4


def end_parameter_bytes(job: JobSpec, source: ModelSource) -> tuple[int, int]:
    """(input embedding, output head) parameter bytes in the compute dtype: vocabulary × width
    each, 4-bit packed (half a byte per weight) when QLoRA quantizes the head too.  A head tied
    to the embedding is one parameter, booked at its last use in the forward, the head: (0,
    embedding)."""
    cfg = source.config
    weights = int(getattr(cfg, "vocab_size", 0) or 0) * hidden_size(source)
    embed = weights * compute_dtype_bytes(job)
    if getattr(cfg, "tie_word_embeddings", False):
        return 0, embed
    return embed, (weights // 2 if job.quant_lm_head else embed)


MAX_REUSE_DISTANCE = 1_000_000_000
"""``stage3_max_reuse_distance``, in elements: DeepSpeed's default (``runtime/zero/config.py``)
and the value the HF DeepSpeed docs' ZeRO-3 configs write."""


MAX_LIVE_PARAMETERS = 1_000_000_000
"""``stage3_max_live_parameters``, in elements: DeepSpeed's default (``runtime/zero/config.py``)
and the HF DeepSpeed docs' ZeRO-3 configs' value; the prefetcher's cap."""


def zero3_gathered_bytes(param_bytes: int, *, layers: int, end_bytes: tuple[int, int],
                         compute_bytes: int, prefetch_bytes: int, embed_in_backward: bool = True,
                         largest_param_bytes: int | None = None,
                         max_reuse_distance: int = MAX_REUSE_DISTANCE,
                         max_live_parameters: int = MAX_LIVE_PARAMETERS) -> int:
    """Parameters one ZeRO-3 rank holds gathered at the backward's start (its activation peak):
    :func:`zero3_gathered`'s first."""
    return zero3_gathered(param_bytes, layers=layers, end_bytes=end_bytes,
                          compute_bytes=compute_bytes, prefetch_bytes=prefetch_bytes,
                          embed_in_backward=embed_in_backward,
                          largest_param_bytes=largest_param_bytes,
                          max_reuse_distance=max_reuse_distance,
                          max_live_parameters=max_live_parameters)[0]


def zero3_gathered(param_bytes: int, *, layers: int, end_bytes: tuple[int, int],
                   compute_bytes: int, prefetch_bytes: int, embed_in_backward: bool = True,
                   largest_param_bytes: int | None = None,
                   max_reuse_distance: int = MAX_REUSE_DISTANCE,
                   max_live_parameters: int = MAX_LIVE_PARAMETERS) -> tuple[int, int | None]:
    """(bytes one ZeRO-3 rank holds gathered at the backward's start, the bound past the live
    cap they include: 0 where the cap's term is not the one taken, None where the largest
    parameter is not known).

    After a module's forward, DeepSpeed releases its gathered parameters unless they are used
    again within ``stage3_max_reuse_distance`` elements of the recorded trace
    (``PartitionedParameterCoordinator.__params_to_release``: it walks the trace after the
    module, adding each visited module's elements, and keeps every parameter it meets before the
    sum reaches the distance).  In the forward → backward trace the next use of module i comes
    after every later module's forward and backward: kept when 2 × (elements of the modules after
    it) < the distance — the output head always (and with it a tied embedding), then layers from
    the last, and all of a model under half the distance.  The first step (no trace yet) releases
    every module; the optimizer step starts by releasing all (``stage3.py``:
    ``_partition_all_parameters``).  The module in flight (one layer when nothing is kept) and
    the prefetch bucket come on top.  The prefetcher keeps more (below, ``live``): up to
    ``max_live_parameters`` elements, every reachable module of a model under it, and past the
    cap by up to one parameter (the one its last pop adds: no bucket past the cap).  That bound
    is the prefetcher's: a module fetched on demand is not held to the cap (a review saw LoRA
    with checkpointing, whose recompute keeps its frozen weights gathered to the layer's
    backward, 5 k elements past the cap + the largest on 2 gloo ranks, not at a phase's peak,
    which stayed 4.7-5.7 % under plan's).  The window is
    the one iteration's trace: a module with no
    backward (``embed_in_backward`` False: a frozen embedding whose output needs no gradient —
    LoRA without checkpointing; transformers' checkpointing makes that output require one) is
    not met again and is released after its forward.  ``param_bytes`` excludes bitsandbytes'
    quantization state (not a parameter); packed 4-bit weights count in elements of their
    storage dtype, as DeepSpeed's ``ds_numel`` does (read at ``compute_bytes`` per element: uint8
    storage counts half its elements, keeping more layers — the safe side).
    ``largest_param_bytes``: the largest parameter's gathered bytes, by which the prefetcher can
    pass ``max_live_parameters`` (None: not known, the larger of the end modules and a layer)."""
    embed, head = end_bytes
    layer = max(param_bytes - embed - head, 0) // max(layers, 1)
    modules = [embed, *([layer] * max(layers, 1)), head]  # forward order
    kept, after = 0, 0
    for i, nbytes in reversed(list(enumerate(modules))):
        reused = embed_in_backward or i > 0
        if reused and 2 * after // compute_bytes < max_reuse_distance:
            kept += nbytes
        after += nbytes
    # The prefetcher (PartitionedParameterCoordinator._fetch_sub_module_impl) runs on every
    # module's fetch, the parameterless ones (decoder layer, attention, MLP, act_fn) and the
    # persistent norms too, and pops parameters off the trace until a bucket's worth is
    # gathering: one projection a step, about 5-7 a Llama layer against its 13 steps.  It outruns
    # the forward, reaches the forward's end, walks over the backward entries of the modules it
    # gathered for the forward and has not used yet (in flight: nothing to gather, no cost) and
    # marks them (``__most_recent_step_id_param_fetched_for``), which ``__params_to_release``
    # then keeps to their backward; then it gathers the released ones back for the backward.
    # What bounds it is ``stage3_max_live_parameters`` (``max_params_to_prefetch = min(max_live
    # - n_available, bucket)``): every module (bar a frozen embedding with no backward) when the
    # model is under it, else about that many elements (the head and the last layers); the
    # reuse window keeps less than that unless a head past it is within reach (the trainfit
    # reviews: a 4-layer and a 12-layer Llama on 2 gloo ranks, 0.25 M … 190 M elements).
    reachable = param_bytes - (0 if embed_in_backward else embed)
    # the cap is in elements, read at compute_bytes each: a bf16 model's fp32 parameters (kept
    # in fp32, LoRA's) would count as more elements than the cap's bytes hold (a few, in reach
    # of the head only), 4-bit storage's 1-byte elements as fewer (over: the safe side)
    cap = max_live_parameters * compute_bytes
    if reachable <= cap:
        return min(param_bytes, max(kept, reachable, layer) + prefetch_bytes), 0
    # Past the cap: its loop (``while ... numel_prefetching < max_params_to_prefetch``) adds a
    # parameter while the count is under the cap, so the last one it pops passes it by up to
    # that parameter, less one element, and nothing more is prefetched (the bucket is bounded by
    # the cap).  Seen on 2 gloo ranks (DeepSpeed 0.19.8, a 1.06 M-element Llama, the reuse
    # distance 0, 14 caps 330 k … 800 k elements): the phases' peaks held 0.9 k … 31 k elements
    # past the cap, where a layer's largest projection is 44 k, and 256 k past 800 k, the head's
    # (the whole model gathered); a cap + the prefetch bucket (15 k) had been 0.5 MB under there
    # (tests/memory/test_zero_vs_gloo.py); between the peaks up to 201 k (a review).  At
    # Llama-3-8B the head is 1.0 GiB in bf16.  Not known: a layer's or an end module's (more
    # than a parameter: the safe side).
    largest = max(embed, head, layer) if largest_param_bytes is None else largest_param_bytes
    past = max(largest - compute_bytes, 0)
    live = min(reachable, cap + past)
    other = max(kept + prefetch_bytes, layer + prefetch_bytes)
    gathered = min(param_bytes, max(other, live))
    # the bound's share: what the pass past the cap adds over the other terms (the whole model
    # gathered when the cap + the largest reaches it — a review: there the note had gone)
    share = max(0, min(gathered, live) - max(other, cap))
    return gathered, (None if largest_param_bytes is None and share else share)


def zero_phases(job: JobSpec, phases: dict[str, dict[str, int]], *, trainable_params: int,
                quant_state_bytes: int, hidden: int, layers: int, compute_bytes: int,
                end_bytes: tuple[int, int] = (0, 0), largest_trainable_numel: int = 0,
                largest_param_bytes: int | None = None
                ) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Each simulated phase's breakdown as one ZeRO rank holds it.  ``phases`` come from the
    compute-dtype one-process step (:func:`compute_job`); ``compute_bytes``: bytes per element
    of that dtype; ``end_bytes``: (input embedding, output head) parameter bytes outside the
    layers (:func:`end_parameter_bytes`; ZeRO-3's reuse distance); ``largest_trainable_numel``:
    the elements of the largest trainable parameter (ZeRO-2 offload's GPU staging buffer);
    ``largest_param_bytes``: the largest parameter's bytes in that step (ZeRO-3's prefetcher
    passes ``stage3_max_live_parameters`` by up to one; None: not known)."""
    n = job.ranks
    stage3 = job.sharding == "zero3"
    off_opt = job.offload in ("optimizer", "all")
    off_par = job.offload == "all"
    params = max(b.get("parameters", 0) for b in phases.values())
    # reduce_bucket_size: "auto" = h² elements, or the config's (DeepSpeed's 5e8 where it is left
    # out: JobSpec.zero_reduce_bucket)
    bucket = (job.zero_reduce_bucket or hidden * hidden) * compute_bytes
    grad_part = -(-trainable_params * compute_bytes // n)
    # the fp32 partition, in every mode: in fp32 mode too ZeRO-2 clones its partition
    # (stage_1_and_2.py: ``...[partition_id].detach().clone().to(device,
    # dtype=master_weights_and_grads_dtype)``), and so does ZeRO-3: its no-copy branch
    # (stage3.py _create_fp32_partitions) asks ``flat.device == self.device``, a torch.device
    # against the accelerator's device *name* (a str: 'cuda:0'), which is never equal — the
    # ``else`` clones (a review: ZeRO-3 fp32 measured 12 % over plan at the step, 7 % at the
    # peak, on 2 gloo ranks)
    master = -(-trainable_params * 4 // n)
    gathered, past_cap = 0, 0
    if stage3:
        partitioned = -(-(params - quant_state_bytes) // n)
        gathered, past_cap = zero3_gathered(
            params - quant_state_bytes, layers=layers, end_bytes=end_bytes,
            compute_bytes=compute_bytes,
            prefetch_bytes=(job.zero_prefetch_bucket or int(0.9 * hidden * hidden)) * compute_bytes,
            embed_in_backward=job.method == "full" or job.grad_ckpt != "off",
            # the module's settings as read now (a default is bound at definition: the gloo
            # tests set them below a tiny model)
            largest_param_bytes=largest_param_bytes, max_live_parameters=MAX_LIVE_PARAMETERS,
            max_reuse_distance=MAX_REUSE_DISTANCE)
        param_term = (0 if off_par else partitioned) + quant_state_bytes + gathered
        buckets = bucket
    else:
        param_term, buckets = params, 2 * bucket  # overlap_comm: two reduce buckets
    # ZeRO-2 offload stages each gradient through temp_grad_buffer_for_gpu_offload, the largest
    # trainable parameter in the compute dtype, made at init on the GPU and kept
    # (stage_1_and_2.py, beside its host twin: zero_host.zero_host_extra_bytes); ~1 GiB for a
    # 128k-vocabulary 8B model's embedding, missing until a review
    staging = largest_trainable_numel * compute_bytes if off_opt and not stage3 else 0
    step_temp = 0 if off_opt else step_temporary_bytes(
        job, partition=-(-trainable_params // n), largest_partition=-(-largest_trainable_numel // n),
        compute_bytes=compute_bytes, stage3=stage3)
    # the optimizer's states on the rank's flat fp32 partition (memory/zero_step.py: Adafactor
    # keeps a full second moment there, a paged optimizer's are managed memory), once its first
    # step has made them: the phases before it (the first step's forward) hold none
    flat_states = int(-(-trainable_params // n) * flat_optimizer_bytes(
        job.optimizer, job.optimizer_impl, sgd_momentum=job.sgd_momentum).states_per_element
        + 0.5)
    out: dict[str, dict[str, int]] = {}
    for key, b in phases.items():
        states = flat_states if b.get("optimizer", 0) or key == "optimizer" else 0
        step = key == "optimizer"
        # in the tracker's order (CATEGORIES), as every other breakdown
        # ZeRO-3's step begins by releasing every gathered parameter, the persistent ones too
        # (stage3.py ``step``: ``_partition_all_parameters`` → the coordinator's
        # ``release_and_reset_all``, which raises unless all are NOT_AVAILABLE): the step holds
        # the partitions only.  Counting the gathered layers there put Llama-3.2-1B's 2-rank
        # ZeRO-3 step 0.63 GiB above its backward and above ZeRO-2's peak.
        t = {"parameters": param_term - gathered if step else param_term,
             "gradients": 0 if off_opt else grad_part,
             "optimizer": 0 if off_opt else master + states,
             "activations": b.get("activations", 0),
             # the step: the fp32 gradient (DeepSpeed's fused Adam, not torch's foreach lists);
             # on the host when offloaded
             "temporaries": step_temp if step else b.get("temporaries", 0),
             "buffers": b.get("buffers", 0) + staging}
        if not step or stage3:
            # ZeRO-3's reduce bucket is made once, at init (stage3.py: ``bucket.buffer =
            # torch.empty(reduce_bucket_size)`` with contiguous_gradients); ZeRO-2's are dropped
            # at the backward's end (``_release_ipg_buffers``) — both seen in the gloo run's step
            t["data_parallel"] = buckets
        # each term is whole flat buffers, and the caching allocator hands out 512-byte blocks
        # (CUDACachingAllocator kMinBlockSize): a partition of P/N bytes takes the next multiple
        out[key] = {c: -(-v // K_MIN_BLOCK) * K_MIN_BLOCK for c, v in t.items()}
    return out, _zero_notes(job, gathered=gathered, bucket=bucket,
                            quant_state_bytes=quant_state_bytes,
                            whole_bytes=params, held_bytes=param_term, past_cap_bytes=past_cap)


def _zero_notes(job: JobSpec, *, gathered: int, bucket: int, quant_state_bytes: int,
                whole_bytes: int = 0, held_bytes: int = 0, past_cap_bytes: int | None = 0
                ) -> list[str]:
    """What :func:`zero_phases` modelled, said: each term's source and how it was counted."""
    n = job.ranks
    stage3 = job.sharding == "zero3"
    off_par = job.offload == "all"
    where = "host" if job.offload in ("optimizer", "all") else "GPU"
    # the partitions are what offload_param moves; the gathered modules stay on the GPU (a
    # review read "(on the host)" after the gathered MiB)
    past = ""
    if stage3 and past_cap_bytes != 0:
        # the cap's term is the one taken: what the prefetcher's last pop adds past the cap is a
        # bound (measured on 2 gloo ranks at the phases' peaks: 0.9 k elements … the whole head)
        largest = (f"{past_cap_bytes / 2**20:,.0f} MiB" if past_cap_bytes else
                   "a layer's or an end module's size")
        past = (f", of which up to {largest} is a bound on how far its last pop passes the cap "
                "(the largest parameter" + ("" if past_cap_bytes else ", not known") + ")")
    held = (f"partitioned ÷ {n}{' (on the host)' if off_par else ''} + "
            f"{gathered / 2**20:,.0f} MiB gathered on the GPU{past} (the larger of: what the "
            f"prefetcher, which runs ahead of the forward into the backward's uses, keeps up to "
            f"stage3_max_live_parameters = {MAX_LIVE_PARAMETERS:.0e} elements and past it by up "
            f"to one parameter; the modules reused within stage3_max_reuse_distance = "
            f"{MAX_REUSE_DISTANCE:.0e} elements, or one layer, where more, with the prefetch "
            f"bucket)" if stage3 else "whole")
    checked = "+0.04 … +1.3 %" + (", the bound past the cap +3 %" if past else "")
    notes = [f"DeepSpeed ZeRO-{3 if stage3 else 2} over {n} rank{'s' if n > 1 else ''} (terms "
             f"from its code, stage{'3' if stage3 else '_1_and_2'}.py, checked against DeepSpeed "
             f"0.19 on 2 CPU ranks within {checked}): parameters {held}; fp32 master, "
             "optimizer states and gradient "
             f"partition ÷ {n} on the {where}; reduce bucket{'' if stage3 else 's ×2'} of "
             + (f"{job.zero_reduce_bucket:,} elements ({bucket / 2**20:.0f} MiB, "
                "zero_reduce_bucket: the config's reduce_bucket_size, or DeepSpeed's default)"
                if job.zero_reduce_bucket else
                f"h² elements ({bucket / 2**20:.0f} MiB, accelerate's 'auto')")
             + ("" if stage3 else " — two with overlap_comm: true (the HF docs' configs), one "
                "with DeepSpeed's default false: counted two, a bound; the speed takes the "
                "default's unhidden reduce")]
    if n == 1:
        # nothing to partition over: ZeRO on one GPU pays only through its CPU offload (as FSDP
        # over one rank is said to shard nothing)
        notes.append(f"ZeRO-{3 if stage3 else 2} over one rank partitions nothing: it saves "
                     "memory only with --offload" + ("" if job.offload == "none" else
                                                      " (this job's)"))
    if stage3 and n > 1 and not off_par and held_bytes >= whole_bytes > 0:
        # a model small enough for the reuse distance to keep all of it gathered: its partition
        # comes on top of a whole copy (Qwen2.5-1.5B QLoRA on 2 ranks: 1.49 GiB of parameters
        # against DDP's 1.07, its peak above DDP's, unsaid until a review)
        notes.append(
            f"ZeRO-3 saves no parameter memory here: its partition and the modules kept gathered "
            f"hold {held_bytes / 2**30:.2f} GiB per rank (predicted), at least the whole model's "
            f"{whole_bytes / 2**30:.2f} GiB, which DDP (no sharding) holds; at this size the "
            "prefetcher " + ("may keep (the bound past its cap)" if past_cap_bytes != 0 else
                             "keeps") + " every module gathered from its forward to its "
            "backward, so ZeRO-3 "
            "shards only the trainable state (gradients, fp32 master, optimizer states)"
            + (": with LoRA/QLoRA that is small, and --sharding none or zero2 may hold less"
               if job.method != "full" else ""))
    if stage3 and job.method != "full":
        notes.append("ZeRO-3's linear (memory_efficient_linear, DeepSpeed's default) keeps every "
                     "projection's input for the backward, frozen weight or not: simulated so")
    if quant_state_bytes:
        notes.append(f"bitsandbytes quantization state whole on every rank "
                     f"({quant_state_bytes / 2**30:.2f} GiB)")
    return notes


def fsdp_offload_phases(phases: dict[str, dict[str, int]], quant_state_bytes: int = 0
                        ) -> tuple[dict[str, dict[str, int]], list[str]]:
    """FSDP ``CPUOffload(offload_params=True)``: the sharded parameters, their gradients and the
    optimizer (its step too) live on the host; the GPU holds the units gathered in flight, the
    activations and the forward/backward temporaries (torch ``_fully_shard``: CPUOffloadPolicy).

    ``quant_state_bytes``: bitsandbytes' quantization state (absmax, its nested statistics and
    code tables) stays on the GPU, whole on every rank.  It is an attribute of the ``Params4bit``
    and of its ``Linear4bit`` (``module.quant_state``), neither a parameter nor a buffer, so
    FSDP's offload never moves it: it remains where the weight was quantized (Answer.AI's
    train.py, ``load_and_quantize``: "FSDP only syncs parameters and buffers, so the quant_state
    isn't copied" — every rank quantizes on its GPU to make it).  Llama-2-70B's is 1.0 GiB."""
    out = {k: {c: (min(v, quant_state_bytes) if c == "parameters" else
                   0 if c in ("gradients", "optimizer")
                   or (k == "optimizer" and c == "temporaries") else v) for c, v in b.items()}
           for k, b in phases.items()}
    notes = ["FSDP CPU offload: sharded parameters, gradients and optimizer (and its step) on the "
             "host; the GPU holds the gathered units, activations and temporaries"]
    if quant_state_bytes:
        notes.append(f"bitsandbytes quantization state on the GPU, whole on every rank (not a "
                     f"parameter: FSDP's offload leaves it): {quant_state_bytes / 2**20:,.1f} MiB")
    return out, notes
