"""A plan's sentences beyond the pick (render/words.py): what it was planned under, which rows
are shown, and what the pick means for the questions people bring — offloading, a number they
saw, host RAM, a pick that trains in pure bf16. Every number is formatted here, none computed
(the checks are trainfit.plan's)."""

from __future__ import annotations

from typing import Any

from trainfit.hardware.gpus import find_gpu
from trainfit.job.choices import ENGINE_NAMES
from trainfit.plan.context import OffloadCheck, PlanAssumptions
from trainfit.plan.result import PlanResult
from trainfit.plan.rows import effective_batches

GIB = 2**30

_KERNELS = {"cudnn": "cuDNN", "flash": "flash", "efficient": "memory-efficient", "math": "math",
            "flash_cpu": "flash (CPU)"}


def _decay_words(job: Any) -> str:
    """The optimizer's weight decay where the job has one (SGD's copies the gradients)."""
    decay = getattr(job, "weight_decay", 0.0) or 0.0
    return f" with weight decay {decay!r}" if decay else ""


def _assumed(a: Any, name: str, text: str) -> str:
    return f"{text} (assumed)" if name in a.assumed else text


_OFFLOAD = {"optimizer": "optimizer states on the CPU",
            "all": "parameters and optimizer states on the CPU"}


def _engine(a: PlanAssumptions) -> str:
    """" (FSDP)", " (DeepSpeed ZeRO-3, optimizer states on the CPU)": how the ranks share the
    model; nothing for one rank without sharding."""
    if a.ranks == 1 and a.sharding == "none":
        return ""
    if a.ranks == 1 and a.sharding == "fsdp" and a.offload == "none":
        # engine.dist.Dist.wrap: FSDP over one rank shards nothing and only adds copies, so train
        # does not wrap it, and the plan's numbers are the unwrapped model's (a QA run read the
        # header's "(FSDP)" as FSDP planned)
        return " (--sharding fsdp over one rank shards nothing: planned without FSDP, as train " \
               "runs it)"
    return f" ({ENGINE_NAMES.get(a.sharding, a.sharding)}" + (
        f", {_OFFLOAD[a.offload]}" if a.offload in _OFFLOAD else "") + ")"


def _kernels_words(a: Any) -> str:
    """"flash kernel", or where precisions differ "flash kernel (bf16-true, amp-bf16), math
    kernel (fp32)": SDPA picks by dtype, so one row's kernel is not every row's."""
    def named(kernels: Any) -> str:
        return ", ".join(_KERNELS.get(k, k) for k in kernels) or "none called"

    by = {p: tuple(k) for p, k in getattr(a, "attention_kernels_by_precision", {}).items()}
    if len(set(by.values())) <= 1:
        if not a.attention_kernels and a.attention == "eager":  # the model's own attention
            return "no SDPA kernel (the model's own matmul + softmax, its S×S scores kept)"
        if not a.attention_kernels:
            return "no SDPA call in the step"
        return named(a.attention_kernels) + " kernel"
    groups: dict[tuple[str, ...], list[str]] = {}
    for precision, kernels in by.items():
        groups.setdefault(kernels, []).append(precision)
    return ", ".join(f"{named(k)} kernel ({', '.join(p)})" for k, p in groups.items())


def _loss_words(job: Any) -> str:
    """Which loss path every row ran: TRL's fused log-prob head, transformers' head in chunks,
    or the whole logits — the same flags' rows differ by GiB (an audit: 21.28 against 28.96 GiB
    allocated under one identical header)."""
    if getattr(job, "trl_logprob_head", False):
        return "loss: TRL's fused log-prob head (no whole logits)"
    if getattr(job, "lm_head_chunk", None):
        return f"loss: head and loss in chunks of {job.lm_head_chunk:,} tokens"
    return "loss over the whole logits"


def _lora_modules_words(a: Any) -> str:
    """`` on q_proj, v_proj (peft's default for llama)``: what was adapted, and whence."""
    mods = getattr(a, "lora_modules", None)
    if not mods:
        return ""
    return f" on {', '.join(mods)} ({a.lora_modules_from})"


def plan_header(result: PlanResult) -> str | None:
    """One line: the fields every row shares and the stack the simulation ran."""
    a = result.assumptions
    if a is None:
        return None
    method = _assumed(a, "method", a.method) + (
        " " + _assumed(a, "quant", a.quant) if a.quant else "") + (
        ", " + _assumed(a, "lora_r", f"LoRA r {a.lora_r}") + _lora_modules_words(a)
        if a.lora_r is not None else "")
    # --grad-accum without an effective batch: every row accumulates that many micro-batches
    accums = sorted({r.job.grad_accum or 1 for r in getattr(result, "rows", [])})
    if accums == [1] or not accums:
        per_row = "micro-batch × ranks"
    elif len(accums) == 1:
        per_row = f"micro-batch × {accums[0]} × ranks"
    else:
        per_row = "micro-batch × accumulation × ranks"
    batch = f"effective batch {a.effective_batch}" if a.effective_batch is not None else \
        f"effective batch not given (= {per_row} per row)"
    ranks = f"{a.ranks} rank{'s' if a.ranks > 1 else ''}" + _engine(a)
    kernels = _kernels_words(a)
    name = getattr(result, "gpu", None)
    gpu = find_gpu(name) if isinstance(name, str) else None
    if gpu is not None and not gpu.compute_capability and a.attention_kernels:
        # memory/predict.target_for: a generic card's kernels are the ones that hold the most
        kernels += (" (the card's compute capability is unknown: " + (
            "every row simulated as on Hopper, FlashAttention-2 running on Ampere or newer "
            "only" if a.attention == "flash-attention-2" else
            "fp32/fp16 rows simulated with a pre-Ampere card's kernels, bf16 rows with "
            "Hopper's") + ", and Hopper's cuBLAS workspaces: what holds the most memory)")
    versions = ", ".join(f"{k} {v or 'not installed'}" for k, v in a.versions.items())
    rows = getattr(result, "rows", None) or []
    packed = bool(rows) and getattr(rows[0].job, "padding_free", False)
    padding = getattr(rows[0].job, "padded", "none") if rows else "none"
    padded = {"longest": " (padded to each batch's longest: its padding mask reaches attention "
                         "from micro-batch 2)",
              "always": " (padded: each batch's padding mask reaches attention)"}.get(padding, "")
    parts = [method, _assumed(a, "seq_len", f"seq {a.seq_len}") + (
                 " (padding-free: a micro-batch's sequences packed into one row)"
                 if packed else padded),
             _assumed(a, "effective_batch", batch), ranks,
             a.optimizer + (" stepped in the backward pass" if a.optimizer_in_backward else "")
             + _decay_words(rows[0].job if rows else None),
             *([_loss_words(rows[0].job)] if rows else []),
             _assumed(a, "attention", f"attention {a.attention} → {kernels}"),
             "allocator: " + ("expandable segments" if a.expandable_segments else
                              "PyTorch's default segments" + (
                                  " (this shell sets expandable_segments:True: a run started "
                                  "here uses it; --expandable-segments plans for it)"
                                  if a.shell_expandable_segments else ""))]
    if rows and getattr(rows[0].job, "softmax_saves_input", False):
        # the installed torch's autograd, with an older one's saved tensors booked on top
        versions += " (softmax/log_softmax also holding their inputs, as torch ≤ 1.10's did)"
    return "planned for: " + ", ".join(parts) + f" · simulated with {versions}"


def rows_note(result: PlanResult, all_rows: bool) -> str | None:
    """How many rows are shown, and why the others are not."""
    hidden = 0 if all_rows else sum(not r.shown for r in result.rows)
    if not hidden:
        return None
    return (f"{len(result.rows) - hidden} of {len(result.rows)} configurations shown: near each "
            f"precision × checkpointing group's fitting frontier; the {hidden} others are further "
            "from it (--all-rows, or --json, shows them)")


def batch_note(result: PlanResult) -> str | None:
    """Rows of different effective batches: said, with what to do."""
    batches = effective_batches(result.rows)
    if len(batches) <= 1:
        return None
    return (f"effective batches differ between rows ({batches[0]:,} … {batches[-1]:,} samples "
            "per optimizer step: no --effective-batch was given, so accumulation is 1): rows are "
            "ranked only against rows of the same effective batch, and the pick is the fastest "
            "step that fits — give --effective-batch N to plan the batch you train with")


def offload_words(result: PlanResult) -> str | None:
    """Does the pick run entirely on the GPU; what would make HF offload."""
    o = result.offload
    if o is None:
        return None
    a = result.assumptions
    # said of device_map="auto" whether or not the model is loaded so: a script or job that
    # never names it is told what would happen if it did, not that it does (a QA run)
    load = (f"loaded with device_map=\"auto\", transformers would offload: the weights "
            f"({o.weights_bytes / GIB:.2f} GiB, "
            f"predicted) exceed the {o.auto_map_budget_bytes / GIB:.2f} GiB transformers gives "
            "the GPU for weights (90 % of its free memory) — modules beyond go to host RAM"
            if o.weights_offloaded else
            f"loaded with device_map=\"auto\", transformers would keep every module on the "
            f"GPU: the weights are "
            f"{o.weights_bytes / GIB:.2f} GiB (predicted), under the "
            f"{o.auto_map_budget_bytes / GIB:.2f} GiB transformers gives the GPU for weights "
            "(90 % of its free memory; it offloads modules to host RAM only when the weights "
            "alone exceed that, at load time, e.g. when other processes hold GPU memory)")
    run = (f"the pick runs entirely on the GPU: device peak {o.device_peak_bytes / GIB:.2f} of "
           f"{o.capacity_bytes / GIB:.2f} GiB (predicted)" if o.runs_on_gpu else
           "the pick does not run entirely on the GPU" + host_held_words(o))
    if a is not None and a.ranks > 1:
        # device_map="auto" is one process's placement: DDP, FSDP and ZeRO put each rank's
        # model (or shard) on its own GPU, so that clause would not apply (a QA run)
        load = ""
    return (f"{run}{'; ' + load if load else ''}. Running out during training is an "
            "out-of-memory error, not an offload (on Windows, drivers ≥ 536.40 have a 'CUDA "
            "sysmem fallback policy' that pages GPU memory to host RAM instead, slowly, when the "
            "device peak passes the card's memory)")


def _on_machine(ranks: int, per_rank_bytes: int) -> str:
    return (f", {ranks} × that = {ranks * per_rank_bytes / GIB:.2f} GiB on the machine"
            if ranks > 1 else "")


def host_held_words(o: OffloadCheck) -> str:
    """What the pick itself keeps in host RAM (its CPU / activation offload), with the bytes."""
    held = []
    if o.offload != "none":
        what = ("optimizer states, fp32 master and gradient partitions" if o.offload == "optimizer"
                else "parameter shards, gradients and optimizer states")
        held.append(f"--offload {o.offload} keeps its {what} in host RAM: "
                    f"{o.host_offload_bytes / GIB:.2f} GiB per rank"
                    f"{_on_machine(o.ranks, o.host_offload_bytes)} (predicted), and "
                    "the optimizer step runs on the CPU")
    if o.activation_offload:
        pinned = o.host_activation_bytes
        held.append("--activation-offload keeps the saved activations in host RAM between the "
                    "forward and the backward: " + (
                        "host bytes unknown (reentrant checkpointing: see the memory notes)"
                        if pinned is None else
                        f"{'' if o.host_activation_exact else 'at most '}{pinned / GIB:.2f} GiB "
                        f"of pinned memory per rank{_on_machine(o.ranks, pinned)} (predicted)"))
    return ": " + "; ".join(held) if held else ""


def observed_words(result: PlanResult) -> list[str]:
    """A number the user saw, against the prediction: the gap, what was assumed, what the answer
    becomes if the gap holds, and which measurement settles it."""
    o = result.observed
    if o is None or result.current is None:
        return []
    cur = result.current.job
    where = f"{cur.precision}, {cur.micro_batch}×{cur.grad_accum}, checkpointing {cur.grad_ckpt}"
    lines = [f"your notes saw {o.observed_device_bytes / GIB:.2f} GiB ({o.source}) at your current "
             f"configuration ({where}); predicted device peak {o.predicted_device_bytes / GIB:.2f} "
             f"GiB: observed = {o.ratio:.2f}× predicted"]
    if o.assumed:
        lines.append(f"  assumed, not in your notes: {', '.join(o.assumed)}. Of the predicted "
                     f"allocated peak, {o.fixed_bytes / GIB:.2f} GiB (weights, gradients, optimizer "
                     "states, buffers) does not depend on the sequence length or micro-batch and "
                     f"{o.seq_scaled_bytes / GIB:.2f} GiB (activations, temporaries) grows with "
                     "micro-batch × sequence length")
    moved = [f"{s.precision} checkpointing {s.grad_ckpt}: {s.largest_micro_predicted or 'none'} → "
             f"{s.largest_micro_if_scaled or 'none'}" for s in o.scaled
             if s.largest_micro_predicted != s.largest_micro_if_scaled]
    if moved:
        lines.append(f"  if every peak were {o.ratio:.2f}× the prediction, the largest micro-batch "
                     "that fits would move: " + "; ".join(moved))
    else:
        lines.append(f"  if every peak were {o.ratio:.2f}× the prediction, the largest micro-batch "
                     "that fits would not change in any group")
    lines.append("  what settles it: the peak measured on the card — `trainfit tune FILE --device "
                 "cuda` (max_memory_reserved + context per probe), or `trainfit monitor --pid PID` "
                 "during a training step (nvidia-smi's number every second; a single reading may "
                 "fall between steps)")
    return lines


def host_ram_words(result: PlanResult) -> str | None:
    h = result.host_ram
    if h is None:
        return None
    per = "per rank" if h.ranks > 1 else "in the process"
    return (f"host RAM: {h.free_bytes / GIB:.2f} GiB free (your notes). What trainfit can state "
            f"{per}: the weights pass through host memory while loading "
            f"({h.weights_load_bytes_per_rank / GIB:.2f} GiB at most), the pick's host batches "
            f"take {h.host_batch_bytes_per_rank / 2**20:.2f} MiB — the micro-batch barely changes "
            f"host RAM"
            + (f" — and its CPU offload holds {h.offload_bytes_per_rank / GIB:.2f} GiB "
               "(predicted)" if h.offload_bytes_per_rank else "")
            + (" — and its activation offload pins "
               f"{'' if h.activation_offload_exact else 'at most '}"
               f"{h.activation_offload_bytes_per_rank / GIB:.2f} GiB (predicted)"
               if h.activation_offload_bytes_per_rank else "")
            + f"; {h.ranks} × that = {h.known_bytes / GIB:.2f} GiB of the "
            f"{h.free_bytes / GIB:.2f} GiB free. Unknown: {h.unknown}; `trainfit tune` measures "
            "the process tree's RSS, `trainfit monitor --pid PID` follows it")


UNALIGNED_SHARE_SHOWN = 0.01
"""Below 1 % of the step the unaligned matmuls are not worth a line."""


def unaligned_words(result: PlanResult) -> str | None:
    """The pick's share of time in 16-bit matmuls whose rows are not 16-byte aligned, and the
    dimension to pad (the vocabulary-padding advice, from the simulated step's own shapes)."""
    if result.recommended_index is None:
        return None
    sp = result.rows[result.recommended_index].speed
    if sp is None or not sp.step_time_s or sp.unaligned_gemm_s < UNALIGNED_SHARE_SHOWN * \
            sp.step_time_s:
        return None
    dims = ", ".join(f"{d:,}" for d in sp.unaligned_dims) or "unknown"
    padded = ", ".join(f"{d:,} → {-(-d // 64) * 64:,}" for d in sp.unaligned_dims)
    return (f"{sp.unaligned_gemm_s / sp.step_time_s:.1%} of the pick's step (predicted) is "
            f"16-bit matmuls with rows that are not 16-byte aligned (dimension {dims}: not a "
            f"multiple of 8), which cuBLAS runs at {_unaligned_rate_words(result.gpu)}; padding "
            "that dimension to a multiple of 64" + (f" ({padded})" if padded else "")
            + " removes it")


_FAMILY_WORDS = {"volta": "Volta", "turing": "Turing", "ampere_dc": "Ampere (data centre)",
                 "ampere_consumer": "Ampere (workstation/consumer)", "ada": "Ada",
                 "hopper": "Hopper", "blackwell": "Blackwell (data centre)",
                 "blackwell_geforce": "Blackwell (GeForce/workstation)"}


def _unaligned_rate_words(gpu_name: str | None) -> str:
    """The planned GPU's own rate for unaligned 16-bit GEMMs (speed/kernels.py), where its family
    has a measurement; the plan's stated assumption otherwise (the text named Ada's 71 % on a T4
    and an A6000, a QA run)."""
    from trainfit.hardware.gpus import find_gpu
    from trainfit.speed.kernels import GEMM_UNALIGNED_HALF, family, kernels_for

    spec = find_gpu(gpu_name) if gpu_name else None
    cc = spec.compute_capability if spec else None
    k = kernels_for(cc, spec.name if spec else "")
    if k is None or k.gemm_unaligned == GEMM_UNALIGNED_HALF:
        fam = _FAMILY_WORDS.get(family(cc) or "", "this GPU")
        return (f"half its aligned rate or less (the plan's assumption: no measurement on "
                f"{fam})")
    return (f"{k.gemm_unaligned:.0%} of its aligned rate on {_FAMILY_WORDS[family(cc) or '']} "
            "(measured)")


def step_time_words(result: PlanResult) -> str | None:
    """Where the pick's step time goes: the micro-steps' forward + backward, the optimizer step
    (once per step: accumulation spreads it over more tokens), and the ranks' synchronisation;
    under data parallelism, whose parameters each rank's optimizer steps — every one under DDP,
    its 1/N shard under FSDP and ZeRO (why a sharded step can be faster than DDP's)."""
    if result.recommended_index is None:
        return None
    row = result.rows[result.recommended_index]
    sp, job = row.speed, row.job
    if sp is None or not sp.step_time_s or sp.optimizer_s is None:
        return None
    accum = job.grad_accum or 1
    sync = (sp.sync_exposed_s or 0.0) + (sp.sync_contention_s or 0.0)
    fb = max(0.0, sp.step_time_s - sp.optimizer_s - sync)
    text = (f"the pick's step (predicted): {sp.step_time_s:.3g} s = {accum} micro-step(s) of "
            f"forward + backward ({fb:.3g} s) + the optimizer step ({sp.optimizer_s:.3g} s, "
            f"{sp.optimizer_s / sp.step_time_s:.0%})")
    if sync:
        text += f" + synchronisation not hidden or slowing compute ({sync:.3g} s)"
    if job.ranks > 1 and job.sharding != "none":
        text += (f"; each rank's optimizer steps its 1/{job.ranks} shard of the trainable "
                 f"parameters ({job.sharding})")
    elif job.ranks > 1:
        text += ("; each rank's optimizer steps every trainable parameter (DDP: --sharding "
                 f"fsdp, zero2 or zero3 would step 1/{job.ranks} of them on each)")
        if job.precision.startswith("amp") and job.method == "full":
            text += (", and autocast casts every fp32 weight to 16 bits in each micro-step "
                     "(FSDP's mixed precision casts the rank's shard, before gathering it)")
    return text


def plan_words(result: PlanResult) -> dict[str, Any]:
    """The sentences --json carries beside the numbers."""
    return {"header": plan_header(result), "batch_note": batch_note(result),
            "offload_words": offload_words(result), "observed_words": observed_words(result),
            "host_ram_words": host_ram_words(result), "unaligned_words": unaligned_words(result),
            "step_time_words": step_time_words(result)}


def numerics_words(result: PlanResult) -> str | None:
    """A pick that trains in pure bf16 where the current configuration keeps fp32 weights (or
    master weights under autocast) changes how the model learns, not only its speed: said, with
    the fastest fitting row that keeps fp32 weights (any precision but bf16-true, at the pick's
    effective batch and ranks; None: no such change). Without a current configuration a bf16-true
    pick is said too — a newcomer's default is fp32 weights — unless every row is bf16-true (the
    user asked for it: --precision bf16-true)."""
    cur, pick = result.current, result.pick
    if pick is None or pick.job.precision != "bf16-true" or (
            cur is not None and cur.job.precision == "bf16-true"):
        return None
    if cur is None and all(r.job.precision == "bf16-true" for r in result.rows):
        return None
    what = "every weight" if pick.job.method == "full" else "the LoRA adapters"
    words = (f"bf16-true trains {what} in bf16 with no fp32 copy: optimizer updates below "
             "bf16's resolution (~0.4 % of a weight) are lost, which changes how the model "
             "learns, not only its speed")
    keep = [r for r in result.rows if r.job.precision != "bf16-true" and r.memory.fits
            and r.job.effective_batch == pick.job.effective_batch and r.job.ranks == pick.job.ranks
            and r.speed is not None and r.speed.tokens_per_s]
    if keep:
        best = max(keep, key=lambda r: r.speed.tokens_per_s or 0.0)
        b = best.job
        words += (f"; keeping fp32 weights, the fastest that fits is {b.precision}, "
                  f"micro-batch {b.micro_batch} × accumulation {b.grad_accum}, checkpointing "
                  f"{b.grad_ckpt} ({best.speed.tokens_per_s:,.0f} tokens/s, predicted)")
    return words
