"""What a job's step can take when a command runs it: the micro-batches and precisions (tune's and
doctor's search space), and which switches only plan can honour."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from trainfit.job.spec import JobError
from trainfit.job.validate import divisors

if TYPE_CHECKING:
    from trainfit.job.spec import JobSpec


def dividing_micro_batches(per_rank_batch: int, upto: int | None = None) -> list[int]:
    """The micro-batches (≤ ``upto``, default the per-rank batch) that divide the per-rank effective
    batch: with them gradient accumulation keeps the effective batch exact."""
    top = per_rank_batch if upto is None else min(upto, per_rank_batch)
    return [m for m in divisors(per_rank_batch) if m <= top]


def step_micro_batches(job: JobSpec, per_rank_batch: int, upto: int | None = None) -> list[int]:
    """The micro-batches ``job``'s step can take for this per-rank batch: those dividing it
    (:func:`dividing_micro_batches`), and with ``optimizer_in_backward`` only the whole batch (it
    cannot accumulate)."""
    ok = dividing_micro_batches(per_rank_batch, upto)
    return [m for m in ok if m == per_rank_batch] if job.optimizer_in_backward else ok


def step_precisions(job: JobSpec, precisions: Iterable[str]) -> list[str]:
    """The ``precisions`` ``job``'s step can run: amp-fp16's GradScaler checks the whole step's
    gradients, which ``optimizer_in_backward`` never holds at once."""
    return [p for p in precisions if not (job.optimizer_in_backward and p == "amp-fp16")]


def refuse_other_model_code(job: JobSpec, command: str) -> None:
    """``train`` and ``tune`` run the installed transformers model: a job whose switches describe
    other model code (transformers < 4.40's per-layer RoPE tables, lit-gpt's fused q/k/v) is for
    ``plan``, which models it, and is refused with the hint to drop the switch."""
    does = {"train": "runs", "tune": "measures", "doctor": "measures"}[command]
    if job.rope_cache != "none":
        raise JobError(f"--rope-cache {job.rope_cache} describes transformers < 4.40's RoPE "
                       f"tables; {command} {does} the installed transformers, which has none",
                       f"drop --rope-cache for {command} (plan predicts the tables)")
    if job.attention == "flash-attention-2":
        raise JobError(f"--attention flash-attention-2 describes transformers' flash_attention_2 "
                       f"(the flash-attn package); {command} {does} transformers' SDPA",
                       f"use --attention sdpa-flash for {command} (SDPA's flash kernel), or plan "
                       "the flash-attention-2 job")
    if job.softmax_saves_input:
        raise JobError(f"--softmax-saves-input describes torch ≤ 1.10's autograd; {command} "
                       f"{does} the installed torch", f"drop --softmax-saves-input for {command} "
                       "(plan predicts what the old torch held)")
    if job.expand_kv:
        raise JobError(f"--expand-kv describes model code that copies k and v to the query "
                       f"heads (torchtune); {command} {does} the transformers model",
                       f"drop --expand-kv for {command} (plan predicts what the copies hold)")
    if job.fused_qkv:
        raise JobError(f"--fused-qkv describes model code that fuses q/k/v (lit-gpt); {command} "
                       f"{does} the transformers model", f"drop --fused-qkv for {command} (plan "
                       "predicts what the fused code holds)")
