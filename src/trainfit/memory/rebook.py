"""Moving bytes between the terms of a memory breakdown while its total stays what it must be.

The extrapolation (:mod:`trainfit.memory.bilinear`) fits each breakdown term on its own and
then corrects the terms against a total it trusts more (a phase's total fit, a full-depth
trace's peak); these keep every term at or above 0 while doing so.
"""

from __future__ import annotations


def nonnegative(fits: dict[str, int]) -> dict[str, int]:
    """Category fits with none below 0 and the same total: a category fitted negative is 0,
    and what it took is taken from the others (temporaries, activations, gradients first).

    The moment a phase peaks can move between the two small depths (Llama-3.2-1B amp-fp16,
    checkpointed, micro-batch 1: the backward peaked at its start at 2 layers, activations
    whole, and at its end at 3, gradients complete), so one category falls with depth and
    another rises; fitted on their own, the falling one goes negative at full depth and the
    rising one grows by as much.  Clipping only the negative one at 0 kept the other's rise:
    39.0 GiB against 23.5 simulated at full size, checkpointing above no checkpointing.  The
    total's fit (the sum of the unclipped fits, the fit being linear) is kept instead."""
    out = {c: max(0, v) for c, v in fits.items()}
    return rebooked(out, sum(fits.values()) - sum(out.values()),
                    order=("temporaries", "activations", "gradients"))


def rebooked(breakdown: dict[str, int], delta: int,
             order: tuple[str, ...] = ("temporaries", "activations")) -> dict[str, int]:
    """``breakdown`` with ``delta`` bytes added to temporaries, or taken from the terms in
    ``order`` (temporaries, then activations), then the other terms (none below 0)."""
    out = dict(breakdown)
    if delta >= 0:
        out["temporaries"] = out.get("temporaries", 0) + delta
        return out
    need = -delta
    for k in (*order, *sorted(out)):
        take = min(need, out.get(k, 0))
        if take:
            out[k] -= take
            need -= take
    return out


def as_gradients(breakdown: dict[str, int], delta: int, whole: int) -> tuple[dict[str, int], int]:
    """``delta`` bytes a full-depth trace holds beyond the fitted terms, booked as gradients up
    to ``whole`` (the step's whole gradient; 0: none), and what is left to :func:`rebooked`.
    For a DeepSpeed ZeRO rank, which drops the one-process step's gradient: at full depth the
    backward peaks at its end, every gradient made, where the small depths' fits saw its start
    (Llama-3-70B 8-rank ZeRO-3 at micro-batch 8: 236 GiB against 215 simulated at full size,
    the difference read as temporaries every rank holds)."""
    if delta <= 0 or whole <= 0:
        return breakdown, delta
    grads = min(delta, max(0, whole - breakdown.get("gradients", 0)))
    return {**breakdown, "gradients": breakdown.get("gradients", 0) + grads}, delta - grads
