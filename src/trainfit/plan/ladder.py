"""The memory-saving ladder ``plan`` prints when nothing fits: one change at a time, cumulative,
each with its predicted memory and speed, stopping at the first rung that fits — then taking
back, one rung each (``undoes``), an earlier change to what is learned that the fitting rung
made needless (the ladder only adds, cheapest first: a 4-bit base can make a halved sequence
unnecessary). Its answer is the last rung.

Order: the allocator's setting first (expandable segments: what is learned stays, and mapping
pages costs time only while the segment grows), then what costs only time (checkpointing, an
8-bit optimizer, the optimizer step in the backward pass, activation offloading, a sharded
job's CPU offload; a multi-rank job without sharding is first sharded with FSDP over the ranks it
has), then what changes what is learned (smaller LoRA rank, fewer LoRA targets, a
shorter sequence, 4-bit base weights), then more hardware (FSDP over twice the ranks). Rungs
that alter learning say so.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainfit.job import JobError, JobSpec
from trainfit.job.choices import ENGINE_NAMES, ENGINE_OFFLOADS, SGD_MOMENTUM

LORA_FOR_FULL = {"lora_r": 16, "lora_alpha": 32}
"""The adapters a full fine-tune's rungs switch to (LoRA, then QLoRA)."""
MIN_RUNG_SAVING = 0.01
"""A rung must lower the device peak by at least 1 % (the extrapolation's own tolerance) to be
taken: halving Mistral-7B's sequence under bf16-true saved 2 MiB of 41 GiB (the peak is the
optimizer states) while changing what is learned."""


@dataclass
class Rung:
    change: str
    """What this rung changes (cumulative with the rungs above it)."""
    job: dict[str, Any]
    peak_device_bytes: int
    tokens_per_s: float | None
    fits: bool | None
    alters_learning: bool
    """True when the change alters what is learned (not only memory and speed)."""
    undoes: int | None = None
    """The index of the earlier rung this one takes back (None: a change of its own)."""

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "peak_device_bytes": self.peak_device_bytes,
                "tokens_per_s": self.tokens_per_s, "fits": self.fits,
                "alters_learning": self.alters_learning, "micro_batch": self.job["micro_batch"],
                "grad_accum": self.job["grad_accum"], "undoes": self.undoes}


def _steps(job: JobSpec) -> list[tuple[str, dict[str, Any], bool]]:
    steps: list[tuple[str, dict[str, Any], bool]] = []
    if not job.expandable_segments:
        # the same step through the other allocator (memory/expandable.py): taken only where it
        # lowers the device peak, i.e. where the default segments' unused rests are the excess
        steps.append(("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (one segment per stream "
                      "grown by 20 MiB pages: less reserved beyond the live tensors)",
                      {"expandable_segments": True}, False))
    if job.grad_ckpt != "full":
        steps.append(("gradient checkpointing on (~30 % slower)", {"grad_ckpt": "full"}, False))
    if job.lm_head_chunk is None and not job.trl_logprob_head:
        # the output head and its loss in chunks (litgpt's lm_head_chunk_size): no full fp32
        # logits, the same loss — at long context with a large vocabulary they are the peak (an
        # audit: a 1.5B Qwen LoRA at 65,536 tokens was told to halve its sequence, 148 GiB, where
        # checkpointing + chunks fit in 53 GiB). A seq2seq model refuses it: the rung is skipped
        steps.append(("output head and loss in chunks of 4,096 tokens (no full fp32 logits; the "
                      "same loss)", {"lm_head_chunk": 4096}, False))
    sharding = job.sharding
    if job.ranks > 1 and sharding == "none":
        # the GPUs the job already has, sharded: each holds 1/N of the weights, gradients and
        # optimizer states, learning unchanged (a review: a 4×H100 DDP full fine-tune was sent to
        # 8-bit AdamW, then LoRA, where FSDP on the same 4 ranks fit at 45 GiB)
        sharding = "fsdp"
        steps.append((f"FSDP over the {job.ranks} ranks you have (each holds 1/{job.ranks} of the "
                      "weights, gradients and optimizer states; the layers gathered in turn)",
                      {"sharding": "fsdp", "optimizer_in_backward": False}, False))
    if job.optimizer in ("adamw", "paged-adamw") and importlib.util.find_spec("bitsandbytes"):
        # block-wise quantized states change the updates slightly: it alters learning, as tune
        # says (--try-8bit-optimizer is opt-in for it; an audit read "alters learning: no")
        steps.append(("8-bit AdamW (states 2 B instead of 8 B per trainable weight, block-wise "
                      "quantized: the updates differ slightly)", {"optimizer": "adamw-8bit"}, True))
    if job.method == "full" and not job.optimizer_in_backward:
        # the whole model's gradients never exist at once (trainfit.model.in_backward); clipping
        # needs them all, so it goes, which alters the updates when it was on. A job it cannot
        # run (accumulation, several ranks, amp-fp16) fails JobSpec's check: the rung is skipped
        steps.append(("optimizer step in the backward pass (gradients freed as they arrive"
                      + ("; no gradient clipping)" if job.max_grad_norm is not None else ")"),
                      {"optimizer_in_backward": True, "max_grad_norm": None},
                      job.max_grad_norm is not None))
    if not job.activation_offload and importlib.util.find_spec("trl"):
        # TRL's OffloadActivations (trainfit.model.offload): the saved activations — with
        # checkpointing, the blocks' inputs — wait in host memory; the copies are streamed
        steps.append(("activation offloading (saved activations in host memory; host↔GPU "
                      "copies streamed beside compute, their time not predicted)",
                      {"activation_offload": True}, False))
    offload_step = _offload_step(job, sharding, steps)
    if offload_step is not None:
        steps.append(offload_step)
    if job.method == "full":
        # the usual first answer to a full fine-tune that does not fit, before anything that
        # shortens the data or quantizes the weights: frozen base, rank-16 adapters (the
        # gradients and optimizer states of the adapters only; the base weights as before)
        steps.append(("LoRA instead of a full fine-tune (rank-16 adapters; base weights frozen)",
                      {"method": "lora", **LORA_FOR_FULL,
                       "optimizer_in_backward": job.optimizer_in_backward,
                       "max_grad_norm": job.max_grad_norm}, True))
    if job.method in ("lora", "qlora") and job.lora_r > 8:
        steps.append((f"LoRA rank {job.lora_r} → 8", {"lora_r": 8, "lora_alpha": 16}, True))
    if job.method in ("lora", "qlora") and job.lora_targets not in (["q", "v"],):
        steps.append(("LoRA on q,v only", {"lora_targets": ["q", "v"]}, True))
    if job.seq_len > 256:
        steps.append((f"sequence {job.seq_len} → {job.seq_len // 2} tokens",
                      {"seq_len": job.seq_len // 2}, True))
    if job.method != "qlora" and importlib.util.find_spec("bitsandbytes"):
        lora = LORA_FOR_FULL if job.method == "full" else {}
        # a job built as torchtune builds (clone_layers) keeps torchtune's 4-bit weights
        torchtune = {"quant_lib": "torchao"} if job.clone_layers else {}
        steps.append(("QLoRA: 4-bit NF4 base weights, LoRA adapters",
                      {"method": "qlora", "quant": "nf4-dq", **lora, **torchtune}, True))
    # more GPUs of the engine the job shards with (FSDP for an unsharded one), its offload kept;
    # torchtune's distributed recipes build on meta: no copies of a template on the GPU
    engine = sharding if sharding != "none" else "fsdp"
    steps.append((f"{ENGINE_NAMES[engine]} over {job.ranks * 2} ranks",
                  {"sharding": engine, "ranks": job.ranks * 2, "optimizer_in_backward": False,
                   "clone_layers": False}, False))
    return steps


def _offload_step(job: JobSpec, sharding: str, steps: list[tuple[str, dict[str, Any], bool]]
                  ) -> tuple[str, dict[str, Any], bool] | None:
    """The CPU-offload rung: the most the engine offers (job/combinations.py check_sharding) — FSDP's
    CPUOffload / ZeRO-3's offload_param keep the shards and the optimizer step on the host
    (Answer.AI's 70B QLoRA on two 24 GB cards), ZeRO-2 only the optimizer — or None where the
    engine has none or the job has it already. Costs time only, much of it: the speed of such rows
    is unknown (plan/row_speed.py)."""
    offload = ENGINE_OFFLOADS[sharding][-1]
    if offload == "none" or job.offload == offload:
        return None
    # the optimizer steps on the host then: under ZeRO accelerate swaps in DeepSpeed's CPU Adam
    # whatever was asked (JobSpec refuses planning another); FSDP steps the job's own, not an
    # 8-bit rung's bitsandbytes optimizer, whose kernels need the GPU
    zero = sharding in ("zero2", "zero3")
    own = "adamw" if zero else job.optimizer
    eight_bit_rung = any(f.get("optimizer") == "adamw-8bit" for _, f, _ in steps)
    if zero and (job.optimizer != "adamw" or eight_bit_rung):
        said = "; the optimizer: DeepSpeed's CPU Adam (accelerate swaps it in under ZeRO-Offload)"
    elif not zero and eight_bit_rung and job.optimizer != "adamw-8bit":
        said = f"; the optimizer: the job's {own} (an 8-bit one steps on the GPU)"
    else:
        said = ""
    what = ("the optimizer states and step" if offload == "optimizer"
            else "the parameters' shards, gradients and optimizer step")
    return (f"CPU offload of {what} (host memory; the step waits on host↔GPU copies: much "
            f"slower{said})", {"offload": offload, "optimizer": own,
                               # SGD's momentum goes with SGD (JobSpec refuses it on another)
                               **({} if own == "sgd" else {"sgd_momentum": SGD_MOMENTUM})},
            False)


def build_ladder(job: JobSpec, evaluate: Callable[[JobSpec], tuple[int, float | None, bool | None]]
                 ) -> list[Rung]:
    """``evaluate(job) → (peak device bytes, tokens/s or None, fits)``; ``job`` is the grid's
    smallest configuration, and each rung keeps its micro-batch and effective batch.  More ranks
    keep the effective batch with less accumulation where it divides; where it does not (a 70B
    QLoRA over two cards at micro-batch 1: an effective batch of 2 over 4 ranks), the rung takes
    micro-batch × accumulation × the new ranks, says so, and is marked as altering learning —
    before, it was left out and the ladder ended without the one change that fits.

    The start is evaluated the way every rung is (at full size), and a change that does not
    lower the peak is left out: the grid's smallest row is extrapolated, so measuring the first
    rung against it compared two different predictions (Mistral-7B on a 3090: "checkpointing
    on" read 54.72 → 55.37 GiB), and where the peak is the weights, gradients and optimizer
    states (the optimizer phase), checkpointing saves nothing and only costs ~30 % time."""
    rungs: list[Rung] = []
    taken: list[tuple[int, dict[str, Any]]] = []  # (rung index, the fields it changed)
    cur = job
    try:
        cur_peak = evaluate(job)[0]
    except JobError:
        cur_peak = None
    for change, fields, alters in _steps(job):
        try:
            d = cur.to_dict()
            d.update(fields)
            step_alters = alters
            if "ranks" in fields and cur.effective_batch is not None:
                eff, micro = cur.effective_batch, cur.micro_batch or 1
                if eff % (fields["ranks"] * micro):  # the batch cannot be kept: it grows
                    d["effective_batch"] = None  # micro-batch × accumulation × the new ranks
                    d["grad_accum"] = cur.grad_accum or 1
                    change = (f"{change} (effective batch {eff} → "
                              f"{micro * d['grad_accum'] * fields['ranks']})")
                    step_alters = True
                else:
                    d["grad_accum"] = None
            nxt = JobSpec(**d)
        except JobError:
            continue
        try:
            peak, tps, fits = evaluate(nxt)
        except JobError:
            continue  # a rung this model cannot take (a custom module without checkpointing)
        if cur_peak is not None and peak > (1 - MIN_RUNG_SAVING) * cur_peak and not fits:
            continue  # saves (almost) nothing here: not worth its cost (time, or what is learned)
        rungs.append(Rung(change, nxt.to_dict(), peak, tps, fits, step_alters))
        taken.append((len(rungs) - 1, fields))
        cur, cur_peak = nxt, peak
        if fits:
            rungs += _undo_unneeded(job, rungs, taken, evaluate)
            break
    return rungs


def _undo_unneeded(job: JobSpec, rungs: list[Rung], taken: list[tuple[int, dict[str, Any]]],
                   evaluate: Callable[[JobSpec], tuple[int, float | None, bool | None]]
                   ) -> list[Rung]:
    """Rungs that take back an earlier change once the last rung fits without it, each one
    evaluated: first those altering what is learned, then those costing only time (checkpointing,
    activation or CPU offload, the optimizer in the backward), latest first.  The ladder only
    adds, cheapest first, so a later rung can make an earlier one needless (an audit:
    Llama-3.1-8B on a T4 ended with "sequence 2048 → 1024" and QLoRA, where QLoRA alone fits at
    the full sequence).  Kept: the allocator's setting (free), a method, sharding or ranks the
    last rung builds on."""
    out: list[Rung] = []
    last = rungs[-1]
    cur = JobSpec(**last.job)
    start = job.to_dict()
    earlier = list(reversed(taken[:-1]))
    order = [t for t in earlier if rungs[t[0]].alters_learning] + \
        [t for t in earlier if not rungs[t[0]].alters_learning]
    for index, fields in order:
        rung = rungs[index]
        if {"ranks", "method", "sharding", "expandable_segments"} & set(fields):
            continue  # free, or what the last rung builds on
        back = {k: start[k] for k in fields if k in start}
        d = cur.to_dict()
        if all(d.get(k) == v for k, v in back.items()):
            continue  # a later rung set it back already (ZeRO offload's own optimizer)
        try:
            nxt = JobSpec(**{**d, **back})
            peak, tps, fits = evaluate(nxt)
        except JobError:
            continue
        if fits:
            out.append(Rung(f"undo “{rung.change}”: not needed once the steps after it are "
                            "taken", nxt.to_dict(), peak, tps, fits, False, undoes=index))
            cur = nxt
    return out
