"""Probes of one step fed or compiled otherwise: which of a report row's probes are the row's.

tune tries knobs beside the step (tune/search.py ``_knob``: ``compile``, the loader's workers,
pinned memory, prefetch depth) that plan's rows do not state — a plan row is its step's, whatever
feeds it.  A probe that ran them otherwise than tune's pick (compile on, 0 loader workers) gets a
row of its own, named by what differs, so the pick's measured median is the pick's own."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from trainfit.report.inputs import Probe, TuneInput, TunePick

VARIANT_KEYS = ("compile", "num_workers", "pin_memory", "prefetch_factor")
"""Not ``persistent_workers``: tune sets it on its pick by rule (a copy of the probe that measured
it), and it acts only at an epoch boundary, which no probe reaches."""


def variant(job: dict[str, Any], **beside: Any) -> dict[str, Any]:
    """The ``VARIANT_KEYS`` a probe states: the report's loader keeps compile, num_workers and
    pin_memory beside a probe's job (``beside``), prefetch_factor in it."""
    out = {k: job[k] for k in VARIANT_KEYS if job.get(k) is not None}
    out.update({k: v for k, v in beside.items() if v is not None})
    return out


def probe_variant(p: Probe | TunePick) -> dict[str, Any]:
    return variant(p.job, compile=p.compile, num_workers=p.num_workers, pin_memory=p.pin_memory)


def reference_variant(tune: TuneInput | None) -> dict[str, Any]:
    """The settings rows' words are said against: the pick's, else (no pick) the first probe's;
    {} without tune."""
    if tune is None:
        return {}
    first = tune.pick or (tune.probes[0] if tune.probes else None)
    return probe_variant(first) if first is not None else {}


def _word(v: Any) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


def variant_words(v: dict[str, Any], ref: dict[str, Any]) -> str:
    """What ``v`` runs otherwise than ``ref``: "compile on, num_workers 4"; "" where nothing both
    state differs (a field either leaves unstated does not count)."""
    # prefetch_factor acts through loader workers only: beside num_workers 0 it is no difference
    idle = v.get("num_workers") == 0
    return ", ".join(f"{k} {_word(v[k])}" for k in VARIANT_KEYS
                     if k in v and k in ref and v[k] != ref[k]
                     and not (k == "prefetch_factor" and idle))


def variant_rows(probes: Sequence[Probe], row_of: Callable[[Probe], Hashable],
                 ref: dict[str, Any]) -> dict[int, str]:
    """``id(probe)`` → the words its row adds to the setting ("" for a row's main probes).

    A row (``row_of``, with the micro-batch and accumulation) keeps as its main probes those
    that ran the reference's settings, or, where none did, those that ran its first probe's: a row
    measured only with 0 loader workers stays beside plan's prediction of the same step.  Other
    probes are named by what they ran otherwise than the reference."""
    groups: dict[tuple[Hashable, int, int], list[Probe]] = {}
    for p in probes:
        groups.setdefault((row_of(p), p.micro_batch, p.grad_accum), []).append(p)
    out: dict[int, str] = {}
    for group in groups.values():
        ran_ref = any(not variant_words(probe_variant(p), ref) for p in group)
        main = ref if ran_ref else probe_variant(group[0])
        for p in group:
            v = probe_variant(p)
            out[id(p)] = "" if not variant_words(v, main) else (
                variant_words(v, ref) or variant_words(v, main))
    return out
