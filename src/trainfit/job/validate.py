"""Field-level checks JobSpec.__post_init__ runs before the checks between fields: each value
has its field's declared type, and each size is an integer ≥ 1 — one clear JobError naming the
field and an example value, never a TypeError deep inside the simulator."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from trainfit.job.choices import SGD_MOMENTUM, JobError, _flag


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` (none below 1), ascending, found in √n steps (a mistyped 10**12 effective
    batch took a long wait listed one by one: a review)."""
    if n < 1:
        return []
    low = [m for m in range(1, math.isqrt(n) + 1) if n % m == 0]
    return sorted({*low, *(n // m for m in low)})


def check_positive(job: Any, name: str) -> None:
    """A size field (micro-batch, seq_len, ranks ...) is an integer ≥ 1 or unset."""
    value = getattr(job, name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise JobError(f"{_flag(name)} {value}: must be an integer ≥ 1",
                       f"e.g. {_flag(name)} {job.example(name)}")


def check_numbers(job: Any) -> None:
    """The seed, learning rate, weight decay, SGD's momentum, clipping threshold and LoRA dropout
    in their ranges (NaN fails every comparison, so it is refused with the rest)."""
    if isinstance(job.seed, int) and not 0 <= job.seed < 2**32:
        # numpy's permutation refuses a negative seed, torch.manual_seed one ≥ 2^64: both
        # ended in a traceback after the model was built (an audit)
        raise JobError(f"seed {job.seed}: must be in 0 … 2^32 − 1", "e.g. seed: 0")
    if not 0 < job.lr < float("inf"):
        raise JobError(f"--lr {job.lr}: must be a finite number > 0", "e.g. --lr 1e-4")
    if not 0 <= job.weight_decay < float("inf"):
        raise JobError(f"--weight-decay {job.weight_decay}: must be a finite number ≥ 0",
                       "e.g. --weight-decay 0.01 (0: none)")
    if job.max_grad_norm is not None and not 0 < job.max_grad_norm < float("inf"):
        raise JobError(f"--max-grad-norm {job.max_grad_norm}: must be > 0",
                       "e.g. --max-grad-norm 1.0 (max_grad_norm: null in a job file turns "
                       "clipping off)")
    if not 0 <= job.sgd_momentum < float("inf"):
        raise JobError(f"--sgd-momentum {job.sgd_momentum}: must be a finite number ≥ 0",
                       "e.g. --sgd-momentum 0.9 (0: plain SGD, no state)")
    if job.sgd_momentum != SGD_MOMENTUM and job.optimizer != "sgd":
        raise JobError(f"--sgd-momentum given with --optimizer {job.optimizer}",
                       "it is SGD's: use --optimizer sgd, or drop --sgd-momentum")
    if not 0.0 <= job.lora_dropout < 1.0:
        raise JobError(f"--lora-dropout {job.lora_dropout}: must be in [0, 1)",
                       "e.g. --lora-dropout 0.05 (0 turns it off)")


_KINDS = {int: "an integer", float: "a number", str: "text", bool: "true or false", list: "a list"}


def check_types(job: Any) -> None:
    """Each field holds its declared type (a YAML ``lr: fast`` or ``seq_len: "big"`` is one clear
    error, not a TypeError deep inside): ints are not bools, a float field takes an int; None only
    where the type admits it (the sizes that may be unset are typed ``int | None``)."""
    hints = typing.get_type_hints(type(job))
    for f in dataclasses.fields(job):
        value = getattr(job, f.name)
        hint = hints[f.name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = [typing.get_origin(a) or a for a in (typing.get_args(hint) if union else (hint,))
                 if a is not type(None)]
        if value is None:
            if union and type(None) in typing.get_args(hint):
                continue
            # a YAML ``lr: null`` / ``weight_decay: null`` on a field that has no "unset" (a
            # review: a TypeError from the range check)
            raise JobError(f"{_flag(f.name)} is empty (null): must be "
                           f"{_KINDS.get(kinds[0], kinds[0])}",
                           f"e.g. {f.name}: {job.example(f.name)}, or leave it out for the default")
        ok = any(isinstance(value, k) and not (k in (int, float) and isinstance(value, bool))
                 for k in kinds) or (float in kinds and isinstance(value, int)
                                     and not isinstance(value, bool)) \
            or (list in kinds and isinstance(value, str))  # "q,v": JobSpec splits it
        if f.name == "grad_ckpt" and isinstance(value, bool):
            ok = True  # grad_ckpt: true/false reads as full/off
        if not ok:
            raise JobError(f"{_flag(f.name)} {value!r}: must be {_KINDS.get(kinds[0], kinds[0])}",
                           f"e.g. {f.name}: {job.example(f.name)}")


def resolve_batch(mb: int | None, ga: int | None, eff: int | None, ranks: int
                  ) -> tuple[int | None, int | None, int | None]:
    """(micro-batch, grad-accum, effective batch) with what two of them fix filled in; an
    effective batch the others cannot divide is refused with the values that would."""
    if mb is not None and ga is not None:
        total = mb * ga * ranks
        if eff is not None and eff != total:
            raise JobError(f"--effective-batch {eff} ≠ micro-batch {mb} × grad-accum {ga} × "
                           f"ranks {ranks} = {total}", "drop one of the three (the other two "
                           "fix it), or make them agree")
        eff = total
    elif mb is not None and eff is not None:
        if eff % (mb * ranks):
            if eff % ranks:  # (an effective batch under the ranks: no micro-batch divides it)
                raise JobError(f"--effective-batch {eff} is not divisible by --micro-batch {mb} "
                               f"× ranks {ranks}", f"choose an effective batch divisible by the "
                               f"{ranks} ranks (e.g. {ranks * mb})")
            per_rank = eff // ranks
            fits = divisors(per_rank)  # the first eight and the last two said
            shown = [*fits[:8], "…", *fits[-2:]] if len(fits) > 10 else fits
            said = ", ".join(map(str, shown[:-1])) + (" or " if len(shown) > 1 else "") + \
                str(shown[-1])
            # the flag's name: train keeps it where --micro-batch gave the value (an audit
            # read "(in job.yaml)" after a flag's micro-batch), else the file's key
            raise JobError(f"--effective-batch {eff} is not divisible by --micro-batch {mb} × "
                           f"ranks {ranks}", f"--micro-batch {said} (the divisors of "
                           f"{per_rank})")
        ga = eff // (mb * ranks)
    elif ga is not None and eff is not None:
        # the accumulation given fixes the micro-batch (it was dropped: the grid planned every
        # micro-batch and picked another accumulation, a QA run)
        if eff % (ga * ranks):
            raise JobError(f"--effective-batch {eff} is not divisible by grad-accum {ga} × "
                           f"ranks {ranks}", "choose an accumulation dividing "
                           f"{eff // ranks}, or drop --grad-accum to plan every micro-batch"
                           if eff % ranks == 0 else "choose an effective batch divisible by "
                           "the ranks")
        mb = eff // (ga * ranks)
    elif eff is not None and eff % ranks:
        raise JobError(f"--effective-batch {eff} is not divisible by --ranks {ranks}",
                       f"choose an effective batch that is a multiple of {ranks}, e.g. "
                       f"{max(ranks, eff - eff % ranks)}")
    elif mb is not None and eff is None:
        ga = ga or 1
        eff = mb * ga * ranks
    return mb, ga, eff
