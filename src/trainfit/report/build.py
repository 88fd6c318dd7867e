"""``build_report(inputs) -> Report``: pure computation, no drawing, no files.

A plan and a tune of the same model become one section: the plan's predicted configurations are the
stacked bars and the predicted line, the tune's probes the measured points, merged by setting
(precision, checkpointing ... everything but micro-batch and accumulation) and micro-batch.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

from trainfit.report.inputs import (
    Inputs,
    PlanConfig,
    PlanInput,
    Probe,
    TuneInput,
    UndecidedChange,
)
from trainfit.report.model import (
    GIB,
    Family,
    MemoryBar,
    Pick,
    Point,
    Report,
    Section,
)
from trainfit.report.runs import build_doctor, build_train
from trainfit.report.settings import FAMILY_KEYS, family_key, matches, norm, setting_label
from trainfit.report.tables import RowAcc, judged_peak, reference_for, seed_table
from trainfit.report.timeline import build_timeline
from trainfit.report.variants import reference_variant, variant_rows

BREAKDOWN_ORDER = ("parameters", "gradients", "optimizer", "activations", "temporaries")


def _unknown_speed_reasons(plan: PlanInput | None) -> dict[str, list[str]]:
    """The plan's reasons for rows without tokens/s → those rows ("amp-fp16, checkpointing
    full, 8 × 1"), in the plan's order."""
    out: dict[str, list[str]] = {}
    if plan is not None and not plan.gpu:
        return out  # every row, for one reason the section's title says (no GPU given)
    for c in plan.configs if plan else []:
        if c.tokens_per_s is None and c.speed_unknown_reason:
            out.setdefault(c.speed_unknown_reason, []).append(
                f"{setting_label(c.job)}, {c.micro_batch} × {c.grad_accum}")
    return out


def slugify(text: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "section"
    slug, n = base, 2
    while slug in taken:
        slug, n = f"{base}-{n}", n + 1
    taken.add(slug)
    return slug


def memory_components_gib(c: PlanConfig) -> dict[str, float]:
    """The device peak as stacked parts: breakdown at the peak (allocated), the caching allocator's
    reserve above it, paged (managed) optimizer states, and the CUDA context (device − reserved −
    managed: trainfit/memory/predict.py adds exactly these)."""
    b = c.breakdown
    parts = {k: b.get(k, 0) for k in BREAKDOWN_ORDER}
    # the rest of the allocated peak, whatever the breakdown names it (memory/predict.py adds
    # allocator_blocks, the 512-byte rounding; a term added later lands here, never lost)
    parts["other (buffers, workspaces, DDP)"] = sum(
        v for k, v in b.items() if k not in BREAKDOWN_ORDER and k != "managed")
    allocated = sum(v for k, v in b.items() if k != "managed")
    managed = b.get("managed", 0)
    if c.peak_reserved_bytes is not None:
        parts["allocator cache (reserved − allocated)"] = max(0, c.peak_reserved_bytes - allocated)
        if c.peak_device_bytes is not None:
            parts["CUDA context"] = max(0, c.peak_device_bytes - c.peak_reserved_bytes - managed)
    parts["managed (paged optimizer)"] = managed
    return {k: v / GIB for k, v in parts.items()}


def _epoch_positions(t: TuneInput) -> tuple[int | None, str]:
    """The tokens one epoch computes, counted as tokens/s counts them: tune's samples × the
    sequence length each is padded or packed to (tune/probe.py: positions computed per step).
    Not tune's ``dataset_tokens``, the non-padding tokens: chat rows of 100 tokens padded to
    320 took 3× the time the report said an epoch takes (a review) — except for a script's tune,
    whose tokens/s counts its batches' non-padding tokens (an audit: positions over that rate
    made an epoch 4.5 % too long)."""
    if t.step_source == "script" and t.dataset_tokens is not None:
        return (t.dataset_tokens,
                f"tune's {t.dataset_tokens:,} non-padding tokens, as a script's tokens/s counts "
                f"them, {t.path}")
    seq = _tune_seq_len(t)
    if t.dataset_samples is None or seq is None:
        return None, f"unknown: {t.path} does not give its samples and sequence length"
    real = ("" if t.dataset_tokens is None else
            f"; {t.dataset_tokens:,} of them not padding")
    return (t.dataset_samples * seq,
            f"tune's {t.dataset_samples:,} samples × {seq:,} positions, padding included as "
            f"tokens/s counts it{real}, {t.path}")


def _tune_jobs(t: TuneInput) -> list[dict[str, Any]]:
    """The jobs tune's file holds: its pick's, then each probe's."""
    return ([t.pick.job] if t.pick else []) + [p.job for p in t.probes]


def _tune_seq_len(t: TuneInput) -> int | None:
    """The sequence length tune's jobs ran at (None: not in the file)."""
    return next((j["seq_len"] for j in _tune_jobs(t) if isinstance(j.get("seq_len"), int)),
                None)


def _tune_model(t: TuneInput) -> str | None:
    for j in _tune_jobs(t):
        if j.get("model"):
            return str(j["model"])
    return None


class _SectionBuilder:
    def __init__(self, plan: PlanInput | None, tune: TuneInput | None) -> None:
        self.plan, self.tune = plan, tune
        self.families: list[Family] = []
        self.rows: dict[tuple[Any, ...], RowAcc] = {}
        jobs = [c.job for c in plan.configs] if plan else []
        jobs += [p.job for p in tune.probes] if tune else []
        self.varying = {k for k in FAMILY_KEYS if len({norm(j.get(k)) for j in jobs if k in j}) > 1}
        # the pick's loader/compile settings: what a row's words are said against (a row's
        # main probes ran them, or, where none of its probes did, its first probe's settings)
        self.ref_variant = reference_variant(tune)
        self._variant_of: dict[int, str] | None = None

    def family(self, job: dict[str, Any]) -> Family:
        for f in self.families:
            if matches(f.key, job):
                return f
        f = Family(key=family_key(job), label=setting_label(job, self.varying))
        self.families.append(f)
        return f

    def variant_words(self, p: Probe) -> str:
        if self._variant_of is None:
            self._variant_of = variant_rows(self.tune.probes if self.tune else [],
                                            lambda q: self.family(q.job).key, self.ref_variant)
        return self._variant_of.get(id(p), "")

    def row(self, fam: Family, mb: int, ga: int, variant: str = "") -> RowAcc:
        key = (fam.key, mb, ga, variant)
        if key not in self.rows:
            self.rows[key] = RowAcc(f"{fam.label}, {variant}" if variant else fam.label, mb, ga)
        return self.rows[key]

    def script_token_share(self) -> float | None:
        """Where the section's tune is a script's (its tokens/s counts non-padding tokens) and a
        plan's rows sit beside it (positions, padding included): the non-padding share of tune's
        samples at its sequence length, which puts the plan's tokens/s in the tune's count (a
        review: the two were shown side by side, and an epoch read 222 s against 709 s)."""
        t = self.tune
        if t is None or t.step_source != "script" or self.plan is None:
            return None
        seq = _tune_seq_len(t)
        if not (t.dataset_tokens and t.dataset_samples and seq):
            return None
        return min(1.0, t.dataset_tokens / (t.dataset_samples * seq))

    def add_plan(self, plan: PlanInput) -> None:
        share = self.script_token_share() or 1.0
        for c in plan.configs:
            fam = self.family(c.job)
            pick = c.recommended or c.index == plan.recommended_index
            fam.bars.append(MemoryBar(c.micro_batch, c.grad_accum, memory_components_gib(c),
                                      None if c.peak_device_bytes is None else c.peak_device_bytes / GIB,
                                      c.fits, pick))
            tps = None if c.tokens_per_s is None else c.tokens_per_s * share
            if tps is not None:
                fam.tokens_per_s_predicted.append(Point(c.micro_batch, tps, "plan"))
            r = self.row(fam, c.micro_batch, c.grad_accum)
            r.device_predicted_bytes, r.tokens_per_s_predicted = c.peak_device_bytes, tps
            r.reserved_predicted_bytes = c.peak_reserved_bytes
            r.fits_predicted = c.fits
            if pick:
                r.pick.add("plan")

    def add_tune(self, tune: TuneInput, capacity_gib: float | None) -> None:
        cpu = tune_on_cpu(tune)
        # tune's own rule (tune/search.py peak_of): its capacity less its margin, judged by the
        # reserved peak where there is one, else the live tensor bytes
        usable = None if not tune.memory_limit_bytes or tune.margin is None \
            else tune.memory_limit_bytes * (1 - tune.margin)
        for p in tune.probes:
            fam = self.family(p.job)
            r = self.row(fam, p.micro_batch, p.grad_accum, self.variant_words(p))
            # the pick itself is decided, whatever a note said of it on the way (a review)
            is_pick = tune.pick is not None and _is_change(p, tune.pick, {})
            if not is_pick and any(_is_undecided(p, tune.pick, u) for u in tune.undecided):
                r.undecided = True
            q, m = p.predicted, p.measured
            planned = any(b.micro_batch == p.micro_batch for b in fam.bars)
            if q is not None and not planned:  # the plan's prediction of the same step wins
                if judged_peak(q, cpu) is not None:
                    fam.memory_predicted_gib.append(Point(p.micro_batch, judged_peak(q, cpu) / GIB,
                                                          f"probe {p.index}"))
                if q.tokens_per_s is not None:
                    fam.tokens_per_s_predicted.append(Point(p.micro_batch, q.tokens_per_s,
                                                            f"probe {p.index}"))
                if r.device_predicted_bytes is None:
                    r.device_predicted_bytes = judged_peak(q, cpu)
                    r.tokens_per_s_predicted = q.tokens_per_s
                tune_peak = q.peak_reserved_bytes if q.peak_reserved_bytes is not None \
                    else q.peak_allocated_bytes
                if r.fits_predicted is None and usable is not None and tune_peak is not None:
                    # a plan's row, when there is one, keeps the plan's verdict
                    r.fits_predicted = tune_peak <= usable
            if p.status == "oom" and capacity_gib is not None:
                fam.memory_measured_gib.append(Point(p.micro_batch, capacity_gib, f"probe {p.index}",
                                                     "oom"))
            if m is not None and p.status == "ok":
                if judged_peak(m, cpu) is not None:
                    fam.memory_measured_gib.append(Point(p.micro_batch, judged_peak(m, cpu) / GIB,
                                                         f"probe {p.index}"))
                if m.tokens_per_s is not None:
                    fam.tokens_per_s_measured.append(Point(p.micro_batch, m.tokens_per_s,
                                                           f"probe {p.index}"))
                # several probes of one row (knob stage, rounds): settled to their median
                if m.tokens_per_s is not None:
                    r.probes.append((m.tokens_per_s, judged_peak(m, cpu), m.host_rss_bytes))
                elif r.tokens_per_s_measured is None and r.device_measured_bytes is None:
                    r.device_measured_bytes, r.host_ram_measured_bytes = (judged_peak(m, cpu),
                                                                          m.host_rss_bytes)
            if r.status_measured != "ok":
                r.status_measured = p.status
        for key, r in self.rows.items():
            main = self.rows.get((*key[:3], ""))
            if key[3] and "compile" not in key[3] and main is not None \
                    and r.tokens_per_s_predicted is None and r.device_predicted_bytes is None:
                # the loader feeds the step, it does not change it: a row that differs from the
                # pick's in loader settings alone has its step's predictions (a baseline landing
                # in one lost every predicted speed-up: a review); a compiled one is another step
                r.device_predicted_bytes = main.device_predicted_bytes
                r.reserved_predicted_bytes = main.reserved_predicted_bytes
                r.tokens_per_s_predicted = main.tokens_per_s_predicted
                r.fits_predicted = main.fits_predicted
            r.settle()
        if tune.pick is not None:
            fam = self.family(tune.pick.job)
            row = self.row(fam, tune.pick.micro_batch, tune.pick.grad_accum)
            row.pick.add("tune")
            m = tune.pick.measured
            if m is not None and m.tokens_per_s:
                # the pick's figure is the one tune states (its repeats' median among those that
                # fit, compile spread over the run): the row's own median of every probe read
                # 2,668 where tune said 2,431 (an audit; a review)
                row.tokens_per_s_measured = m.tokens_per_s

    def baseline_row(self) -> RowAcc | None:
        t = self.tune
        if t is None or t.baseline is None:
            return None
        # the row the baseline's own probe landed in: its setting (the pick may change
        # checkpointing or precision too: a review) and its loader (maybe not the pick's)
        mine = [p for p in t.probes if p.stage == "baseline"
                and (p.micro_batch, p.grad_accum) == (t.baseline.micro_batch, t.baseline.grad_accum)]
        fam = self.family(mine[0].job) if mine else self.family(t.pick.job) if t.pick else (
            self.families[0] if self.families else None)
        if fam is None:
            return RowAcc("baseline", t.baseline.micro_batch, t.baseline.grad_accum)
        words = self.variant_words(mine[0]) if mine else ""
        return self.rows.get((fam.key, t.baseline.micro_batch, t.baseline.grad_accum, words),
                             RowAcc(fam.label, t.baseline.micro_batch, t.baseline.grad_accum))


def _knobs(x: Any) -> dict[str, Any]:
    """A probe's or a pick's job with the loader and compile knobs the report keeps apart."""
    extra = {k: getattr(x, k) for k in ("num_workers", "pin_memory", "compile")
             if getattr(x, k, None) is not None}
    return {**x.job, **extra}


@functools.cache
def _job_field_names() -> frozenset[str]:
    """JobSpec's field names (read once: asked per probe and undecided change)."""
    from trainfit.job import JobSpec

    return frozenset(f.name for f in dataclasses.fields(JobSpec))


def _is_undecided(probe: Probe, pick: Any, u: UndecidedChange) -> bool:
    """Whether a probe measured a change tune could not decide: the note's own probe, else (a
    file from before notes named it) the pick with the change made."""
    if u.probe is not None:
        return probe.index == u.probe
    return pick is not None and _is_change(probe, pick, u.changes)


def _is_change(probe: Probe, pick: Any, change: dict[str, Any]) -> bool:
    """Whether a probe's job is tune's pick with ``change`` made to it (and nothing else: the
    job fields both hold compared, not the probe's own annotations such as its ``note``). A
    micro-batch change keeps the effective batch: the accumulation follows it (a review: no
    micro-batch change ever matched)."""
    fields = _job_field_names()
    job, picked = _knobs(probe), _knobs(pick)
    follows = {"grad_accum"} if "micro_batch" in change else set()
    # ... and the effective batch stays: a probe of another one is not that change (a review)
    same_batch = not follows or _samples_per_step(job) == _samples_per_step(picked)
    return same_batch and all(job.get(k) == v for k, v in change.items()) and \
        all(job[k] == v for k, v in picked.items()
            if k in fields and k in job and k not in change and k not in follows)


def _samples_per_step(job: dict[str, Any]) -> int | None:
    """Micro-batch × accumulation of a probe's or a pick's fields (None where unknown)."""
    mb, acc = job.get("micro_batch"), job.get("grad_accum")
    return mb * acc if isinstance(mb, int) and isinstance(acc, int) else None


def _picks(b: _SectionBuilder) -> list[Pick]:
    out = []
    for r in b.rows.values():
        for source in sorted(r.pick):
            why: list[str] = []
            if source == "plan" and b.plan is not None:
                why = [b.plan.reason or "fastest predicted configuration that fits"]
            elif b.tune is not None:
                why = ["tune's pick, from its measured probes."]
                why += b.tune.notes
            out.append(Pick(source, r.setting, r.micro_batch, r.grad_accum, why,
                            None if r.device_predicted_bytes is None else r.device_predicted_bytes / GIB,
                            None if r.device_measured_bytes is None else r.device_measured_bytes / GIB,
                            r.tokens_per_s_predicted, r.tokens_per_s_measured,
                            None if r.reserved_predicted_bytes is None
                            else r.reserved_predicted_bytes / GIB))
    return out


def build_section(plan: PlanInput | None, tune: TuneInput | None, dataset_tokens: int | None,
                  taken: set[str]) -> Section:
    assert plan is not None or tune is not None
    b = _SectionBuilder(plan, tune)
    capacity_bytes, capacity_source, capacity_label = None, "unknown", "GPU memory"
    on_cpu = plan is None and tune is not None and tune_on_cpu(tune)
    if on_cpu:
        capacity_label = "memory limit"  # a CPU's stand-in for a GPU's capacity
    if plan is not None and plan.gpu_memory_bytes:
        capacity_bytes, capacity_source = plan.gpu_memory_bytes, f"{plan.gpu} (GPU catalog)"
    elif tune is not None and tune.memory_limit_bytes:
        capacity_bytes = tune.memory_limit_bytes
        capacity_source = f"{tune.device_name or tune.device} (tune's memory limit)"
        if not str(tune.device).startswith("cuda"):
            capacity_label = "memory limit"  # a CPU's stand-in for a GPU's capacity
    capacity_gib = None if capacity_bytes is None else capacity_bytes / GIB
    if plan is not None:
        b.add_plan(plan)
    if tune is not None:
        b.add_tune(tune, capacity_gib)
    for f in b.families:
        f.bars.sort(key=lambda x: x.micro_batch)
    base = b.baseline_row()
    base_tps = (tune.baseline.measured.tokens_per_s if tune and tune.baseline and tune.baseline.measured
                else None)
    if base is not None and base.probes:
        base_tps = base.tokens_per_s_measured  # the same statistic as every row: the median
    order = {f.key: i for i, f in enumerate(b.families)}
    accs = [b.rows[k] for k in sorted(b.rows, key=lambda k: (order[k[0]], k[1], k[2], k[3]))]
    ref = reference_for(accs, base, base_tps)
    tokens, source = dataset_tokens, "given with --dataset-tokens"
    if tokens is None and tune is not None:
        tokens, source = _epoch_positions(tune)
    if plan is not None:
        model = plan.model
    else:
        model = (_tune_model(tune) if tune else None) or "unknown model"
    if plan is not None and plan.gpu:
        where = plan.gpu
    else:
        where = (tune.device_name or tune.device) if tune is not None else "no GPU given"
    notes = list(plan.notes) if plan else []
    if tune is not None and tune.step_source == "script" and plan is not None:
        share = b.script_token_share()
        notes.append(
            f"the plan's predicted tokens/s × {share:.3f} (the non-padding share of tune's "
            "samples at its sequence length): the script's tune counts its batches' non-padding "
            "tokens, the plan every position" if share is not None else
            "the plan's predicted tokens/s count every position, padding included, and the "
            "script's tune its batches' non-padding tokens: the two columns count different "
            "tokens (tune's file gives no non-padding share)")
    reasons = _unknown_speed_reasons(plan)
    throughput_unknown = None
    if not any(f.tokens_per_s_predicted or f.tokens_per_s_measured for f in b.families):
        why = (max(reasons, key=lambda r: len(reasons[r])) if reasons
               else "no GPU named: --gpu NAME predicts speed" if plan is not None and not plan.gpu
               else "no known peak throughput for its dtype")
        throughput_unknown = (f"no tokens/s: the plan predicts none on {where} ({why}) and "
                              "nothing was measured")
    else:
        notes += [f"tokens/s unknown on {', '.join(rows)} (predicted): {why}"
                  for why, rows in reasons.items()]
    return Section(
        slug=slugify(f"{model} {where}", taken), title=f"{model} on {where}",
        sources=[x.path for x in (plan, tune) if x is not None], capacity_gib=capacity_gib,
        capacity_source=capacity_source, capacity_label=capacity_label, on_cpu=on_cpu,
        margin=plan.margin if plan and plan.margin is not None else (tune.margin if tune else None),
        families=b.families,
        table=seed_table(accs, ref, tokens, source, no_gpu=plan is not None and not plan.gpu),
        picks=_picks(b),
        ladder=list(plan.ladder) if plan else [], probes=list(tune.probes) if tune else [],
        probes_on_cpu=tune is not None and tune_on_cpu(tune),
        notes=notes, throughput_unknown_reason=throughput_unknown)


def tune_on_cpu(tune: TuneInput) -> bool:
    """The tune ran on a CPU: its peaks are live tensor bytes, no device peak. One test for the
    section, its pick and its probes (a review: three tests disagreed on a file whose device is
    unknown, which is not taken for a CPU)."""
    return str(tune.device).startswith("cpu")


def _same_device(plan: PlanInput, tune: TuneInput) -> bool:
    """A plan pairs with a tune measured on a CUDA device (which card is not compared: a tune
    names its device as NVML does, a plan by the catalog). A plan without a GPU is still a CUDA
    step's (reserved and device peaks by the CUDA allocator's rules), not a CPU's live tensor
    bytes: an audit read its 1.09 GiB device peak beside a CPU tune's 1.00 GiB live bytes as a
    9 % over-prediction."""
    return tune.device.startswith("cuda")


def build_report(inputs: Inputs, dataset_tokens: int | None = None) -> Report:
    taken: set[str] = set()
    tunes = list(inputs.tunes)
    sections = []
    warnings = list(inputs.warnings)
    for plan in inputs.plans:
        same_model = [t for t in tunes if _tune_model(t) in (None, plan.model)]
        tune = next((t for t in same_model if _same_device(plan, t)), None)
        for t in same_model:
            if t is not tune and not _same_device(plan, t):
                # a T4 plan's rows beside a CPU tune's read "predicted 0.57 GiB, measured 0.01"
                # and speed-ups of 0.00× (a QA run): shown apart, and said
                warnings.append(f"{t.path} was measured on {t.device_name or t.device}, "
                                f"{plan.path} predicts "
                                # a plan without --gpu names no card: a GPU's step, card unknown
                                # (an audit: "a GPU step" read as if one was named)
                                f"{'a ' + plan.gpu if plan.gpu else 'a GPU step, no card named'}"
                                ": shown apart (their numbers are of different devices)")
        if tune is not None:
            tunes.remove(tune)
        sections.append(build_section(plan, tune, dataset_tokens, taken))
    sections += [build_section(None, t, dataset_tokens, taken) for t in tunes]
    timelines = [build_timeline(m, slugify(f"timeline {Path(m.path).stem}", taken))
                 for m in inputs.monitors]
    doctors = [build_doctor(d, slugify(f"doctor {Path(d.path).stem}", taken)) for d in inputs.doctors]
    sources = ([(p.path, "plan") for p in inputs.plans] + [(t.path, "tune") for t in inputs.tunes]
               + [(t.path, "train") for t in inputs.trains] + [(d.path, "doctor") for d in inputs.doctors]
               + [(m.path, "monitor log") for m in inputs.monitors])
    names = [s.title for s in sections] or [d.target for d in doctors] or ["training run"]
    return Report(title="trainfit report: " + "; ".join(names), sources=sources, sections=sections,
                  trains=[build_train(t, slugify(f"loss {Path(t.path).parent.name or 'run'}",
                                                 taken)) for t in inputs.trains],
                  timelines=timelines,
                  doctors=doctors, warnings=warnings)
