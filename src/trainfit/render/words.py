"""Results in words: the sentences the terminal, ``--json`` and the YAML header show.

The compute returns typed results (which row is picked, which fields change, which probe was not
run and why); these functions turn them into text and nothing else — no number here is computed,
only formatted — so a test asserts on the result and the wording can change without touching it.
"""

from __future__ import annotations

from typing import Any

from trainfit.job.choices import ENGINE_OFFLOADS
from trainfit.job.combinations import FLASH_ATTENTION_2_DTYPES_NOTE, FSDP_MIXED_DTYPES
from trainfit.plan.result import PlanResult, smallest_row
from trainfit.plan.rows import precision_inversion
from trainfit.render.plan_words import numerics_words
from trainfit.speed.bands import SpeedBand

GIB = 2**30

FIELD_LABELS = {"effective_batch": "effective batch", "micro_batch": "micro-batch",
                "grad_accum": "accumulation",
                "grad_ckpt": "checkpointing", "precision": "precision", "attention": "attention",
                "optimizer_impl": "optimizer implementation"}

SPEED_TRUSTED = 0.12
"""Issue 19's throughput target (median |error| ≤ 12 %): a scale whose band is wider says that
rows closer than the band are not ranked by the prediction."""

PLAN_NOTES = (
    "peaks are predictions (no GPU was used); GiB = 2^30 bytes",
    "allocated = torch.cuda.max_memory_allocated, reserved = max_memory_reserved, "
    "device = what nvidia-smi shows (reserved + CUDA context + managed memory)",
    "fits = device peak × (1 + {under:.0%}) ≤ GPU memory and device peak ≤ (1 − {margin:.0%}) × "
    "GPU memory ({under:.0%}: how far predictions of this kind of run ({kind}) came under the "
    "published peak, at most, in {within} of {cases} cases, benchmarks/results/bands.md)",
    "ranked by predicted tokens/s among configurations that fit (roofline over the "
    "simulated step's operations, trainfit/speed/)",
)


def plan_notes(result: PlanResult) -> list[str]:
    """What every plan's numbers are (predicted, which peak, the fit rule, the ranking)."""
    m = result.rows[0].memory if result.rows else None
    band = {"under": m.error_band_under if m else 0.0, "kind": m.error_band_kind if m else "",
            "cases": m.error_band_cases if m else 0,
            "within": m.error_band_within if m else 0}
    notes = [n.format(margin=result.margin, **band) for n in PLAN_NOTES]
    if result.gpu is None:
        # no card: its CUDA context is unknown, not 0, and no row can be said to fit (an audit)
        notes[1] = ("allocated = torch.cuda.max_memory_allocated, reserved = max_memory_reserved, "
                    "device (what nvidia-smi shows) = reserved + the CUDA context, which "
                    "depends on the card (0.52-0.79 GiB over the catalog with lazy module "
                    "loading, 0.86 GiB more with eager): unknown without --gpu, so not printed")
        notes[2] = "fits: unknown without a GPU (--gpu NAME plans one; trainfit gpus lists them)"
    elif any(r.memory.breakdown.get("managed") for r in result.rows):
        notes[2] += ("; paged optimizer states (CUDA managed memory) are left out of the fit: "
                     "they page to the host when the card is full")
    if any(r.job.method in ("lora", "qlora") for r in result.rows) and \
            any(r.speed is not None and r.speed.mfu for r in result.rows):
        notes.append("MFU of LoRA/QLoRA rows counts 6 FLOPs per token per trainable weight and 4 "
                     "per frozen one (no weight gradient), plus attention's 12·L·H·Q·T: PaLM's "
                     "6N split by what trains (trainfit/speed/predict.py)")
    if not any(r.speed is not None and r.speed.tokens_per_s for r in result.rows):
        # no row has a speed: the pick is made without one (plan.grid._sort_key)
        notes[-1] = ("no row has a predicted tokens/s, so the pick among configurations that "
                     + ("fit" if result.gpu is not None else "were planned (their fit unknown)")
                     + " prefers no recomputation, then the largest micro-batch, then mixed "
                     "precision")
    experts = result.assumptions.experts_16bit_params if result.assumptions else 0
    if experts:
        notes.insert(0, experts_note(experts, result.total_params,
                                     result.assumptions.sharding != "none",
                                     result.assumptions.experts_4bit_if_stored))
    kept = result.assumptions.linear_subclasses_16bit_params if result.assumptions else {}
    if sum(kept.values()):
        notes.insert(0, linear_subclass_note(kept, result.total_params))
    if "amp-fp16" in result.precisions_not_planned:
        notes.append(f"amp-fp16 not planned: on {result.gpu_display_name} autocast casts the "
                     "same operations to 2 bytes as amp-bf16, at the same tensor-core rate "
                     "(the GPU catalog's), with loss scaling on top: its rows cannot beat "
                     "amp-bf16's; --precision amp-fp16 plans it")
    if "bf16-true" in result.precisions_not_planned:
        fsdp = result.assumptions is not None and result.assumptions.sharding == "fsdp"
        notes.append("bf16-true not planned: the model keeps trainable weights in fp32 as "
                     f"transformers loads it in bf16, and {FSDP_MIXED_DTYPES}" if fsdp else
                     "bf16-true not planned: DeepSpeed's bf16 mode keeps an fp32 master "
                     "partition of the weights whether asked as amp-bf16 or bf16-true, so its rows "
                     "are amp-bf16's")
    if "fp32" in result.precisions_not_planned:
        notes.append(f"fp32 not planned: {FLASH_ATTENTION_2_DTYPES_NOTE}; --attention sdpa "
                     "plans it")
    inversion = inversion_note(result)
    if inversion:
        notes.append(inversion)
    if result.speed_band is not None and any(r.speed is not None and r.speed.tokens_per_s
                                             for r in result.rows):
        # how close such speeds came to published ones: said only where a row has one
        notes.append(speed_note(result.speed_band))
    if result.link is not None and (result.link_gbs is None or any(
            r.speed is not None and r.speed.tokens_per_s for r in result.rows)):
        # said where a row was timed over it (a review: "timed over nvlink4" under an offload
        # plan whose every speed is unknown)
        notes.append(link_note(result))
    launch = [r for r in result.rows if r.speed is not None and r.speed.bound == "launch-bound"]
    if launch:
        measured = sum(bool(r.speed.host_measured) for r in launch)
        per_op = [f"{r.job.precision} {r.job.grad_ckpt} {r.job.micro_batch}×{r.job.grad_accum}"
                  for r in launch if not r.speed.host_measured]
        notes.append(launch_note(len(launch), len(result.rows), measured, per_op))
        busy = [r.speed.host_busy_cores for r in launch
                if r.speed.host_busy and r.speed.host_busy_cores is not None]
        if busy:
            notes.append(busy_note(len(busy), max(busy)))
    hooked = [r for r in result.rows if r.speed is not None and r.speed.framework_host_s]
    if hooked:
        pick = result.pick
        row = pick if pick is not None and pick in hooked else hooked[0]
        notes.append(zero_hooks_note(row.job.sharding, row.speed.framework_host_s,
                                     row is pick))
    return notes


def zero_hooks_note(sharding: str, seconds: float, is_pick: bool) -> str:
    """DeepSpeed's hooks as host time (:mod:`trainfit.speed.zero_hooks`): the figure, what it
    comes from, and what it leaves out (a review: no trainfit command measures these rows —
    tune probes DDP — and the fit's residuals are in-sample, on a CPU)."""
    from trainfit.speed.zero_hooks import DEEPSPEED_MEASURED, FIT_RESIDUALS

    stage = "ZeRO-3" if sharding == "zero3" else "ZeRO-2"
    what = ("fetch and release around every module, forward and backward, and a gradient hook "
            "per trainable parameter" if sharding == "zero3"
            else "a gradient hook per trainable parameter")
    return (f"DeepSpeed {stage}'s hooks ({what}) add {seconds * 1e3:,.0f} ms of host time to "
            f"each micro-step of {'the pick' if is_pick else 'its rows'} (predicted: counted on "
            f"the model, at DeepSpeed {DEEPSPEED_MEASURED}'s cost per count measured on tiny "
            f"models on a CPU, which the fit follows within "
            f"{FIT_RESIDUALS[sharding]}, benchmarks/results/zero_hooks.md; not checked on a GPU "
            "host, where their CUDA stream and event calls come on top, so these rows' tokens/s "
            "lean high; no trainfit command measures a DeepSpeed step)")


def inversion_note(result: PlanResult) -> str | None:
    """Why bf16-true can need more memory than amp-bf16 (:func:`trainfit.plan.rows.
    precision_inversion`): on a Mamba-2 hybrid's PyTorch fallback, measured on its saved tensors
    (Granite-4.0-H, 2 layers, 2 × 512 tokens), the scan's matmuls take ``.float()`` copies —
    autocast casts them back to bf16 and saves 2-byte operands, bf16-true runs them in fp32 and
    saves 4-byte ones — and its gated RMSNorm's ``.to(float32)`` copies are new tensors under
    bf16-true but the fp32 residual stream itself under autocast."""
    inv = precision_inversion(result.rows)
    if inv is None:
        return None
    where = "from" if inv.every_larger else "at"
    head = (f"bf16-true needs more memory than amp-bf16 {where} micro-batch {inv.micro_batch} "
            f"(checkpointing {inv.grad_ckpt}: {inv.bf16_true_bytes / GIB:.2f} against "
            f"{inv.amp_bf16_bytes / GIB:.2f} GiB allocated, predicted)")
    how = ("autocast runs the matmuls on those copies in bf16 and keeps 2-byte operands for the "
           "backward, bf16-true runs them in fp32 and keeps 4-byte ones, which outgrows its "
           "savings on weights and optimizer states as the micro-batch grows")
    if "PyTorch fallbacks" in result.model_note:
        # the mechanism measured on the fallback (this function's docstring)
        return (f"{head}: transformers' PyTorch fallbacks for this model's fused kernels (see "
                f"the model note) compute parts of it in fp32 (.float() copies: Mamba-2's scan, "
                f"measured on Granite-4.0-H); {how}")
    return (f"{head}: the simulated step keeps more for the backward under bf16-true; where a "
            f"model's code computes in fp32 (.float() copies) {how}")


def experts_note(experts: int, total: int, sharded: bool, if_stored: bool = False) -> str:
    """QLoRA of a mixture-of-experts model under transformers 5: the stacked experts stay 16-bit
    (``if_stored``: a checkpoint published 4-bit would have them 4-bit, Llama-4's)."""
    room = "more ranks" if sharded else "sharding over several GPUs (--sharding fsdp)"
    if if_stored:
        room = ("a checkpoint published 4-bit (bitsandbytes quantization_config, e.g. a "
                "*-bnb-4bit upload: transformers unstacks these experts into nn.Linear layers "
                f"before it loads one, so they are 4-bit; plan its config.json), {room}")
    return (f"QLoRA of a mixture-of-experts model: transformers 5 converts nn.Linear layers to "
            f"4 bits and this model's routed experts are stacked tensors, so {experts / 1e9:.1f} B "
            f"of its {total / 1e9:.1f} B parameters stay 16-bit ({experts * 2 / GIB:.1f} GiB in "
            f"bf16, whole model), as planned: 4-bit weights save little here; {room} or more "
            "memory per GPU is what makes room for them")


def linear_subclass_note(kept: dict[str, int], total: int) -> str:
    """QLoRA through transformers 5 of a model whose layers subclass ``nn.Linear``: they stay
    16-bit (:func:`trainfit.model.standins.linear_subclass_params`)."""
    n = sum(kept.values())
    names = ", ".join(sorted(kept))
    return (f"QLoRA: transformers 5 converts exactly nn.Linear layers to 4 bits, and this "
            f"model's {names} layers subclass it, so {n / 1e9:.2f} B of its {total / 1e9:.2f} B "
            f"parameters load, and are planned, 16-bit ({n * 2 / GIB:.2f} GiB in bf16): 4-bit "
            "weights save little here; a loader that quantizes every linear layer (Lightning's "
            "BitsandbytesPrecision: --quant-from-fp16) or more memory per GPU is what saves it")


def busy_note(n: int, busy_cores: float) -> str:
    """Launch-bound rows whose host time was measured while the machine was busy
    (:attr:`trainfit.speed.host.HostStep.busy`)."""
    return (f"{n} launch-bound row(s) had their host time measured while other processes (or the "
            f"hypervisor) used up to {busy_cores:.1f} CPU cores (measured): timed on one thread, "
            "a neighbour on the other core did not raise a step's cost on a 2-core VM "
            "(benchmarks/results/host_busy.md), but one sharing a core or its caches may, so "
            "their tokens/s may be too low; the next plan measures again and keeps the lower "
            "cost")


def link_note(result: PlanResult) -> str:
    """Which link the ranks' gradient synchronisation was timed over, and whether anyone measured
    it: a link named by the catalog (or by ``--interconnect pcie4``) is the slot's theoretical
    bandwidth; a number given to ``--interconnect`` is a measured bus bandwidth."""
    link, gbs = result.link or "unknown", result.link_gbs
    if gbs is None:
        return (f"gradient sync: {link} link, speed unknown: run `trainfit tune` under torchrun "
                "(it measures the link) and give --interconnect GBPS")
    if "measured" in link:
        text = f"gradient sync timed from the all-gather bus bandwidth given: {link}"
    else:
        named = " (named)" if "given" in link else " (the GPU catalog's)"
        text = (f"gradient sync timed over {link.replace(' (given)', '')}{named} at {gbs:g} GB/s "
                "per GPU and direction: the slot's theoretical figure, not measured (fewer lanes, "
                "a PCIe switch, a second CPU socket or a VM's host-routed copies are slower; "
                "`trainfit tune` under torchrun measures the link, --interconnect GBPS gives it)")
    pick = result.pick
    if pick is not None and pick.speed is not None and pick.speed.sync_s is not None:
        text += (f"; the pick: {pick.speed.sync_s:.3g} s of communication per step, "
                 f"{pick.speed.sync_exposed_s or 0.0:.3g} s of it not hidden under compute, "
                 f"and {pick.speed.sync_contention_s or 0.0:.3g} s added by the memory "
                 "bandwidth its hidden traffic takes from compute (predicted)")
    return text


def launch_note(n: int, total: int, measured_rows: int = 0,
                per_op_rows: list[str] | None = None) -> str:
    """Launch-bound rows: their step time is the host's.  ``measured_rows`` of the ``n``: the
    host time is the step's own code run on this machine's CPU (trainfit/speed/host.py); the
    others: the per-op count alone, which misses the model's Python
    (benchmarks/results/gpu_validate.md).  Some but not all measured: each part said apart."""
    head = f"{n} of {total} rows are launch-bound (predicted): the GPU waits for the CPU to enqueue"
    measured = measured_rows >= n
    if not measured and measured_rows:
        return (f"{head} each op. {measured_rows} of them have their host time measured (the "
                "step's own code run on this machine's CPU at a tiny width, plus 6 µs a kernel: "
                "within 20 % on an H100's host, up to 73 % slow on an H200's); the other "
                f"{n - measured_rows}" + (f" ({', '.join(per_op_rows)})" if per_op_rows else "")
                + " are timed by the per-op count alone (10 µs forward, 15 µs "
                "backward, 2.5 µs a view, an H100 host's), which transformers' Python exceeds "
                "1.5-2.3×, so their tokens/s are an upper bound — `trainfit tune` measures them")
    if measured:
        return (f"{head} each op. Their host time is the step's own code, run on this machine's "
                "CPU at a tiny width (measured: CPU time of one micro-step), plus 6 µs to launch "
                "each kernel. Measured on one machine and read on another's GPU host, such "
                "steps came within 20 % (median) on an H100's host and ran up to 73 % slower "
                "than predicted on an H200's (median 42 %; benchmarks/results/gpu_validate*.md; "
                "the measurement moves ±20 % run to run). A busier or slower host is slower: "
                "`trainfit tune` measures them")
    return (f"{head} each op (10 µs forward, 15 µs backward, 2.5 µs a view, measured on an "
            "H100's host); transformers' own Python made such steps 1.5-2.3× slower than that "
            "on the same host, so their tokens/s are an upper bound — `trainfit tune` measures "
            "them")


def speed_note(b: SpeedBand) -> str:
    """How far tokens/s of this scale of run has been from published measurements."""
    lean = "faster" if b.median_signed_error > 0 else "slower"
    text = (f"tokens/s are predictions: on {b.cases} published {b.description} runs they came "
            f"within {b.median_abs_error:.0%} of the measured speed (median; 9 in 10 within "
            f"{b.p90_abs_error:.0%}), {lean} than measured by {abs(b.median_signed_error):.0%} "
            "(median), benchmarks/results/speed_published.md")
    if b.median_abs_error > SPEED_TRUSTED:
        text += ("; rows closer than that are not told apart by the prediction: "
                 "`trainfit tune` measures them")
    return text


def _what_to_try(row: Any) -> str:
    """The memory savers the smallest configuration does not use yet (a 70B QLoRA already
    checkpointed over two ranks was told to try checkpointing and QLoRA), the one that cuts
    what dominates its peak first: a 1B LoRA at 8,192 tokens on a T4 (weights 2.3 of 37 GiB)
    was told to try QLoRA before a shorter sequence (a QA run). A saver whose term is under
    :data:`USEFUL_SHARE` of the peak is left out: Mixtral QLoRA (16-bit experts) was told to
    try an 8-bit optimizer for adapters whose states are a few MiB, and a shorter sequence."""
    job, m = getattr(row, "job", row), getattr(row, "memory", None)  # a plan row, or a job
    terms = m.breakdown if m is not None else {}
    total = sum(terms.values())

    def useful(nbytes: int) -> bool:  # without a breakdown (a job alone), every saver is
        return not total or nbytes >= USEFUL_SHARE * total

    weights = terms.get("parameters", 0) + terms.get("optimizer", 0) + terms.get("gradients", 0)
    by_length = sum(terms.get(k, 0) for k in ("activations", "temporaries"))
    tries = []
    if job.sharding == "none" and job.ranks > 1 and useful(weights):
        # the GPUs it already has, sharded (a review read "more ranks with --sharding fsdp" as
        # "buy more GPUs" where sharding the 4 it had fit)
        tries.append(f"--sharding fsdp (or zero3) over its {job.ranks} ranks")
    if job.grad_ckpt != "full" and useful(terms.get("activations", 0)):
        tries.append("--grad-ckpt full")
    in_step = str(getattr(m, "peak_phase", "")).startswith(("forward", "backward"))
    if job.lm_head_chunk is None and not job.trl_logprob_head and total and in_step \
            and useful(terms.get("temporaries", 0)):
        # the fp32 logits and their loss are the temporaries at a forward/backward peak of a
        # long-context, large-vocabulary step (at an optimizer-phase peak they are the
        # optimizer's): chunked, the learning is unchanged (before a shorter sequence)
        tries.append("--lm-head-chunk 4096")
    if by_length > weights and useful(by_length):
        tries.append("a shorter --seq-len")
    if job.method != "qlora" and useful(weights):
        tries.append("--method " + ("lora/qlora" if job.method == "full" else "qlora"))
    if by_length <= weights and useful(by_length):
        tries.append("a shorter --seq-len")
    if job.optimizer in ("adamw", "paged-adamw") and useful(terms.get("optimizer", 0)):
        tries.append("an 8-bit optimizer")
    if job.sharding == "none":
        if useful(weights) or not tries:
            # sharding divides the weights, gradients and states only (an audit: FSDP was
            # advised where they were 2 % of a 148 GiB peak)
            tries.append("more ranks with --sharding fsdp")
    else:
        tries.append("more ranks")
        most = ENGINE_OFFLOADS[job.sharding][-1]  # the most the engine offers
        if job.offload != most:
            tries.append(f"--offload {most}")
    return ", ".join(tries[:-1]) + " or " + tries[-1] if len(tries) > 1 else tries[0]


USEFUL_SHARE = 0.10
"""A memory saver is suggested when what it cuts is at least this share of the smallest
configuration's allocated peak (below, it cannot close a gap worth a plan)."""


def plan_reason(result: PlanResult) -> str:
    """Why this configuration: the pick, or why nothing fits and what the ladder reaches."""
    rows, gpu = result.rows, result.gpu_display_name
    if not rows:
        return "no configuration"
    pick = result.pick
    if pick is None:
        text = (f"nothing fits on {gpu or 'the GPU'}: the smallest configuration needs "
                f"{(result.smallest_device_bytes or 0) / GIB:.2f} GiB (device, predicted); try "
                + _what_to_try(smallest_row(rows)))
        if result.ladder:
            # the steps are cumulative: each one on top of those before it
            text += ("; the memory-saving ladder reaches a fit at its last step (each step on "
                     "top of those before it): " if result.ladder[-1].fits else
                     "; even the whole memory-saving ladder (each step on top of those before "
                     "it) does not fit: ")
            text += "; ".join(r.change for r in result.ladder)
        return text
    j = pick.job
    why = [f"{j.precision}, micro-batch {j.micro_batch} × accumulation {j.grad_accum}",
           f"checkpointing {j.grad_ckpt}"]
    if pick.speed is not None and pick.speed.tokens_per_s:
        mfu = f", MFU {share_words(pick.speed.mfu)}" if pick.speed.mfu else ""
        tps = pick.speed.tokens_per_s
        per_gpu = (f" ({j.ranks} ranks together: {tps / j.ranks:,.0f} per GPU)" if j.ranks > 1
                   else "")
        kept = result.numerics_kept
        pure = kept is not None and kept["precision"] == "bf16-true"
        why.append(f"fastest that fits: {tps:,.0f} tokens/s predicted{per_gpu}{mfu}" if kept is None
                   else "fastest that fits "
                   + ("keeping fp32 weights as you do" if pure else
                      f"at your precision, {j.precision}") +
                   f": {tps:,.0f} tokens/s predicted{per_gpu}{mfu} ({kept['precision']} is "
                   f"predicted {kept['gain']:+.1%}, {kept['tokens_per_s']:,.0f} tokens/s: inside "
                   f"the median error of these predictions, {kept['median_abs_error']:.0%}, so "
                   + ("not worth training without fp32 weights, which changes how the model "
                      "learns)" if pure else "not worth changing the numerics and the weights' "
                      "memory for)"))
    if result.gpu_memory_bytes is None:
        return ", ".join(why) + " (no GPU given: fit unknown)"
    return ", ".join(why) + (f": predicted {pick.memory.peak_device_bytes / GIB:.2f} of "
                             f"{result.gpu_memory_bytes / GIB:.2f} GiB (device peak)")


def _no_bf16(result: PlanResult, job: Any) -> bool:
    from trainfit.hardware.gpus import find_gpu

    spec = find_gpu(result.gpu) if result.gpu else None
    return bool(spec is not None and not spec.bf16_supported and job.precision
                and "bf16" in job.precision)


def plan_versus(result: PlanResult) -> str | None:
    """The pick against the configuration the user runs now (None: no current one was given)."""
    cur, pick = result.current, result.pick
    if cur is None:
        return None
    if pick is None:
        return "nothing fits, so nothing to change to"
    changes = [f"{FIELD_LABELS.get(c.field, c.field)} {c.before}→{c.after}"
               for c in result.changes_vs_current]
    words = ", ".join(changes) if changes else "no change: the current configuration is the pick"
    speedup = result.speedup_vs_current
    why = next((s.unknown_reason for s in (pick.speed, cur.speed)
                if s is not None and s.unknown_reason), "no known peak for this GPU")
    if cur.speed is not None and cur.speed.unknown_reason and _no_bf16(result, cur.job):
        # the script's bf16 on a T4 (--precision amp-fp16 given): not an unknown peak, a step
        # that cannot run there (a QA run read "the GPU's peak for this dtype ... is unknown")
        why = f"the current {cur.job.precision} cannot run on {result.gpu_display_name}: no bf16"
    words += (f": predicted {speedup:.2f}× tokens/s" if speedup is not None else
              f": speed-up unknown ({why})")
    if result.gpu_memory_bytes is not None:
        # the two decimals of the plan's other lines (9.24 of 14.75 there, 9.2 of 14.7 here read
        # as two different cards in a QA run)
        words += (f", {pick.memory.peak_device_bytes / GIB:.2f} of "
                  f"{result.gpu_memory_bytes / GIB:.2f} GiB (device peak, predicted)")
    return words + ("" if cur.memory.fits is not False else
                    " (the current configuration does not fit)")


def share_words(fraction: float) -> str:
    """A share of a peak as a percentage with the digits it needs: 12 %, 2.5 %, 0.25 % (an MFU
    of 0.25 % printed as "0%" reads as nothing at all)."""
    return f"{fraction:.0%}" if fraction >= 0.1 else f"{fraction:.1%}" if fraction >= 0.01 \
        else f"{fraction:.2%}"


def plan_json(result: PlanResult) -> dict[str, Any]:
    """``trainfit plan --json``: the typed result, with its sentences beside it."""
    d = {"kind": "plan", **result.to_dict()}
    d.update(reason=plan_reason(result), vs_current=plan_versus(result), notes=plan_notes(result),
             numerics_change=numerics_words(result))
    return d
