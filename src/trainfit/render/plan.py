"""Rich renderers: they print results, they never compute them."""

from __future__ import annotations

from rich.console import Console

from trainfit.hardware.gpus import find_gpu
from trainfit.monitor.progress import duration_words
from trainfit.plan.result import PlanResult, PlanRow
from trainfit.render.layout import Col, fit_table, out_console, say
from trainfit.render.plan_words import (
    batch_note,
    host_ram_words,
    numerics_words,
    observed_words,
    offload_words,
    plan_header,
    rows_note,
    step_time_words,
    unaligned_words,
)
from trainfit.render.words import (
    plan_notes,
    plan_reason,
    plan_versus,
    share_words,
)

GIB = 2**30


_TERM_WORDS = {"allocator_blocks": "allocator rounding (512 B blocks)",
               "data_parallel": "data-parallel buffers (DDP buckets / FSDP's gathered layers)"}
"""The breakdown's keys (JSON) as the text says them."""

def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.2f}"


def _num(v: float | None, fmt: str) -> str:
    return "unknown" if v is None else fmt.format(v)


def _console() -> Console:
    """The terminal, or a wide console when piped (rich assumes 80 columns there)."""
    return out_console()


def render_simple(title: str, columns: list[str], rows: list[list[str]]) -> None:
    console = _console()
    table, _ = fit_table(console, title, [Col(c, "left") for c in columns], rows)
    console.print(table)


PLAN_COLS = [Col("", "left"), Col("precision", "left"), Col("ckpt", "left"), Col("micro×acc"),
             Col("alloc", drop=3), Col("reserved", drop=4), Col("device"), Col("fits"),
             Col("spare", drop=2), Col("tokens/s"), Col("MFU", drop=1), Col("how", "left", drop=5)]
"""The plan table: 12 columns designed for 100 terminal columns; a narrower terminal leaves out
how, reserved, alloc, spare, MFU in that order (and says so)."""


def _row_cells(row: PlanRow) -> list[str]:
    j, m = row.job, row.memory
    mark = "★" if row.recommended else ("▲" if row.largest_fitting else "")
    fits = "unknown" if m.fits is None else ("yes" if m.fits else
                                             "limit" if _at_limit(row) else "no")
    return [mark, j.precision or "", j.grad_ckpt or "", f"{j.micro_batch}×{j.grad_accum}",
            _gib(m.peak_allocated_bytes), _gib(m.peak_reserved_bytes), _gib(m.peak_device_bytes),
            fits, _gib(m.headroom_bytes),
            _num(row.speed.tokens_per_s if row.speed else None, "{:,.0f}"),
            "unknown" if row.speed is None or row.speed.mfu is None else share_words(row.speed.mfu),
            row.how]


def _at_limit(row: PlanRow) -> bool:
    """A row that runs only by the allocator releasing its cache at the card's limit: its
    reserved and device peaks are what it holds after the release (under the card), its fit is
    judged on the reserve it asks for (memory.predict), so "no" beside a device peak under the
    fit line read as a contradiction (an audit)."""
    return bool(row.memory.alloc_retries)  # retries only past the card: fits is then False


def plan_table(console: Console, result: PlanResult, all_rows: bool = False) -> list[str]:
    """Print the configurations table; returns the headers a narrow terminal left out."""
    rows = [r for r in result.rows if all_rows or r.shown]
    cells = [_row_cells(r) for r in rows]
    cols = list(PLAN_COLS)
    speed_known = any(r.speed is not None and r.speed.tokens_per_s for r in result.rows)
    gone = set()
    if not speed_known:  # a GPU without a known peak: one statement instead of two columns
        gone |= {"tokens/s", "MFU"}
    if result.gpu is None:  # device (reserved + the card's CUDA context), fits, spare: unknown
        gone |= {"device", "fits", "spare"}
    keep = [i for i, c in enumerate(cols) if c.header not in gone]
    cols, cells = [cols[i] for i in keep], [[c[i] for i in keep] for c in cells]
    ranks = max((r.job.ranks for r in result.rows), default=1)
    together = f" of the {ranks} ranks together" if ranks > 1 else ""
    title = ("peak GiB per rank (predicted): alloc / reserved"  # no GPU: the notes say why
             + ("" if result.gpu is None else " / device")
             + (f" · tokens/s{together}, MFU (predicted)" if speed_known else ""))
    table, dropped = fit_table(console, title, cols, cells,
                               ["bold" if r.recommended else ("red" if r.memory.fits is False
                                                              else None) for r in rows])
    console.print(table)
    return dropped


def _unknown_speed_rows(result: PlanResult, all_rows: bool = True) -> dict[str, list[str]]:
    """The rows' own reasons for an unknown speed → those rows ("amp-fp16 full 8×1"), in the
    plan's order (``all_rows``: every row, else the shown ones)."""
    by_reason: dict[str, list[str]] = {}
    for r in result.rows:
        if (all_rows or r.shown) and r.speed is not None and r.speed.unknown_reason:
            j = r.job
            by_reason.setdefault(r.speed.unknown_reason, []).append(
                f"{j.precision} {j.grad_ckpt} {j.micro_batch}×{j.grad_accum}")
    return by_reason


def _unknown_speed_why(result: PlanResult) -> str:
    """Why no row has a speed: the rows' own reason (most rows'), e.g. a multi-GPU plan on cards
    without peer-to-peer, not always a missing peak."""
    reasons = _unknown_speed_rows(result)
    return max(reasons, key=lambda why: len(reasons[why])) if reasons else \
        f"no known peak FLOP/s for {result.gpu}"


def _some_unknown_why(result: PlanResult, all_rows: bool) -> str:
    """Why the shown rows whose speed is unknown have none, while other rows have one (e.g. the
    allocator retrying at the card's limit), named by row; "" when every shown row has one."""
    return "".join(f" · tokens/s unknown on {', '.join(names)}: {why}"
                   for why, names in _unknown_speed_rows(result, all_rows).items())


def _over_card_speed(result: PlanResult, all_rows: bool) -> str:
    """A row that does not fit still shows its step's speed, for comparing rows, while a row at
    the card's limit shows "unknown" (the allocator's retries are not timed): said, since an
    audit read the bigger rows' numbers as speeds they would reach here."""
    if not any((all_rows or r.shown) and r.memory.fits is False and r.speed is not None
               and r.speed.tokens_per_s for r in result.rows):
        return ""
    return (" · tokens/s of a row that does not fit: its step as if the GPU had room for it "
            "(here it runs out of memory), for comparing rows")


def marks_words(result: PlanResult, all_rows: bool) -> str:
    """The legend's marks: ★, and ▲ only where a shown row carries it apart from ★ (the ★ row's
    own ▲ is not drawn: an audit read a ▲ in the legend that no row showed)."""
    if not any(r.memory.fits for r in result.rows):
        return "fit unknown (no GPU) · " if all(r.memory.fits is None for r in result.rows) \
            else "no row fits · "
    # one micro-batch planned (--micro-batch given): ▲ is then only the largest of that one (a
    # review read every row's ▲ as "the largest that fits")
    one = len({r.job.micro_batch for r in result.rows}) == 1
    up = any(r.largest_fitting and not r.recommended for r in result.rows
             if all_rows or r.shown)
    # without --effective-batch the grid plans powers of 2 (plan/grid._micro_candidates): a
    # size between two rows may fit too (an audit: 5 and 6 fitted beside a ▲ at 4)
    a = getattr(result, "assumptions", None)
    powers = not one and a is not None and a.effective_batch is None
    which = " (of the one planned: --micro-batch sets it)" if one else \
        " (of the powers of 2 planned: --micro-batch N plans a size between two rows)" \
        if powers else ""
    tri = f"  ▲ largest micro-batch that fits{which}" if up else ""
    return f"★ recommended{tri} · "


def _legend(console: Console, result: PlanResult, dropped: list[str], all_rows: bool) -> None:
    speed_known = any(r.speed is not None and r.speed.tokens_per_s for r in result.rows)
    # the fit line is the lower of (1 − margin) × GPU and GPU ÷ (1 + the error band)
    # (memory.predict._fit); every row of a plan is one kind of run, so one band
    under = result.rows[0].memory.error_band_under if result.rows else 0.0
    line = min(1 - result.margin, 1 / (1 + under))
    marks = marks_words(result, all_rows)
    legend = (f"{marks}spare: GiB left under the fit "
              f"line ({line:.0%} of the GPU" + (f": GPU ÷ (1 + its {under:.0%} error band)"
                                                if line < 1 - result.margin else "") + ")") \
        if result.gpu is not None else marks.rstrip(" ·")
    if any(_at_limit(r) for r in result.rows if all_rows or r.shown):
        legend += (" · limit: runs only by the allocator releasing its cache at the card's limit "
                   "(its reserved/device peaks after the release; spare from the reserve it asks "
                   "for): no margin left, not a pick")
    if not speed_known and result.gpu is not None:
        legend += f" · tokens/s and MFU: unknown ({_unknown_speed_why(result)})"
    elif speed_known:
        legend += _some_unknown_why(result, all_rows) + _over_card_speed(result, all_rows) \
            + _mfu_peaks(result, all_rows)
    if dropped:
        legend += f" · narrow terminal: {', '.join(dropped)} left out (widen it, or pipe/--json)"
    say(console, legend)
    for note in (rows_note(result, all_rows), batch_note(result)):
        if note:
            say(console, note, "dim")


def _count(n: int) -> str:
    """Millions, or the count itself under a million (a tiny model's 3,584 read "0.00 M")."""
    return f"{n:,}" if n < 1_000_000 else f"{n / 1e6:,.2f} M"


def _mfu_peaks(result: PlanResult, all_rows: bool) -> str:
    """Where fp32 rows stand beside 16-bit ones, what each MFU is a share of: the peak of the
    dtype the row's matmuls run in (speed.predict.dominant_peak), so a fp32 row's higher MFU is
    not a faster step — tokens/s compares rows."""
    rows = [r for r in result.rows if (all_rows or r.shown) and r.speed is not None
            and r.speed.mfu]
    shown = {r.job.precision for r in rows}
    peaks: dict[str, set[str]] = {}
    for r in rows:
        peaks.setdefault(r.job.precision, set()).add(getattr(r.speed, "mfu_peak_dtype", None)
                                                     or "?")
    nominal = {"fp32": "fp32", "amp-fp16": "fp16", "bf16-true": "bf16", "amp-bf16": "bf16"}
    off = {p: d for p, d in peaks.items() if d - {nominal.get(p, "?"), "?"}
           and not (p == "fp32" and "fp32" not in d)}
    if off:
        # a 16-bit row whose matmul FLOPs run mostly in fp32 (an MoE's experts under autocast
        # keep the fp32 master weights: an audit read amp-bf16 at MFU 70 % beside bf16-true's
        # 23 %, 4.8× faster, unsaid)
        return (" · MFU: a share of the peak FLOP/s of the dtype most of each row's matmul FLOPs "
                "run in — " + "; ".join(f"{p} rows: the {'/'.join(sorted(d))} peak"
                                        for p, d in sorted(peaks.items()))
                + (" (e.g. a mixture of experts: autocast leaves its experts' grouped "
                   "matmuls in the fp32 master weights)"
                   if any("fp32" in d for p, d in off.items()) else "")
                + (", so MFU is not comparable across them: compare rows by tokens/s"
                   if len({d for ds in peaks.values() for d in ds}) > 1 else
                   ": compare with another run's MFU by tokens/s"))
    if "fp32" not in shown or len(shown) < 2:
        return ""
    gpu = getattr(result, "gpu", None)  # a bare result (tests) names none
    bf16_card = gpu is None or getattr(find_gpu(gpu), "bf16_supported", True)
    if any(r.job.method == "qlora" for r in result.rows) and bf16_card:
        # the 4-bit base's matmuls run in the compute dtype (bf16 under fp32 too: what the plan
        # simulates and emit writes, bnb_4bit_compute_dtype), and they are most of the FLOPs: a
        # QA run read the legend's "fp32 rows: the fp32 peak" against a 38 % MFU of the bf16 one
        return (" · MFU: a share of the peak FLOP/s of the dtype most of each row's matmuls run "
                "in — QLoRA's 4-bit base computes in bf16 (bnb_4bit_compute_dtype) in fp32 rows "
                "too, so where the base is most of the FLOPs a fp32 row's MFU is of the bf16 "
                "peak; compare rows by tokens/s")
    return (" · MFU: a share of the peak FLOP/s of the dtype each row's matmuls run in (fp32 "
            "rows: the fp32 peak, 16-bit rows: the bf16/fp16 one), so compare rows by tokens/s")


def _ladder(console: Console, result: PlanResult) -> None:
    if not result.ladder:
        return
    cols = [Col("change", "left"), Col("device GiB"), Col("tokens/s"), Col("fits"),
            Col("alters learning", drop=1)]
    cells = [[r.change, _gib(r.peak_device_bytes), _num(r.tokens_per_s, "{:,.0f}"),
              "unknown" if r.fits is None else ("yes" if r.fits else "no"),
              "yes" if r.alters_learning else "no"] for r in result.ladder]
    table, _ = fit_table(console, "nothing fits — memory-saving ladder, cumulative from the "
                         "smallest configuration in the table above (predicted)", cols, cells)
    console.print(table)


def render_plan(result: PlanResult, all_rows: bool = False) -> None:
    console = _console()
    gpu = result.gpu or "no GPU given"
    estimate = "ESTIMATE" in (result.gpu_memory_source or "")  # hardware.gpus.generic_gpu
    cap = (f" ({_gib(result.gpu_memory_bytes)} GiB as CUDA " + (
        "would report it, an estimate" if estimate else "reports it") + ")") \
        if result.gpu_memory_bytes else ""
    a = result.assumptions
    stand_in = ", assumed: it stands in for your model" if a and "model" in a.assumed else ""
    say(console, f"— {result.model} ({result.model_origin}{stand_in}) on {gpu}{cap}",
        lead="trainfit plan")
    header = plan_header(result)
    if header:
        say(console, header)
    if result.model_note:
        say(console, f"note: {result.model_note}")
    method = result.assumptions.method if result.assumptions else None
    adapters = " (the model's and its LoRA adapters')" if method in ("lora", "qlora") else ""
    say(console, f"parameters: {_count(result.total_params)} total{adapters}, "
                 f"{_count(result.trainable_params)} trainable (counts)")
    dropped = plan_table(console, result, all_rows)
    _legend(console, result, dropped, all_rows)
    _ladder(console, result)
    if result.dataset_tokens is not None and result.recommended_index is not None:
        row = result.rows[result.recommended_index]
        t = result.time_for_dataset_s({"tokens_per_s": row.speed.tokens_per_s}
                                      if row.speed else None)
        say(console, f"time for {result.epochs or 1:g} epoch(s) of {result.dataset_tokens:,} "
                     f"tokens: {'unknown' if t is None else duration_words(t)} (predicted)")
    say(console, plan_reason(result), lead="pick:")
    versus = plan_versus(result)
    if versus:
        say(console, versus, lead="against what you run now:")
    numerics = numerics_words(result)
    if numerics:
        say(console, numerics, "bold yellow", lead="warning:")
    for line in observed_words(result):
        say(console, line)
    for extra in (offload_words(result), host_ram_words(result), step_time_words(result),
                  unaligned_words(result)):
        if extra:
            say(console, extra)
    if result.recommended_index is not None:
        m = result.rows[result.recommended_index].memory
        # the terms sum to the allocated peak; paged optimizer states live in CUDA managed
        # memory, outside the allocator (counted in the device peak), so they are named apart
        # the terms by what they are (allocator_blocks, data_parallel read as code names), and
        # a term too small for two decimals said so, not as 0.00 (an audit)
        parts = ", ".join(f"{_TERM_WORDS.get(k, k)} "
                          + (f"{v / GIB:.2f}" if v >= 0.005 * GIB else "<0.01")
                          for k, v in m.breakdown.items() if v and k != "managed")
        managed = m.breakdown.get("managed", 0)
        beside = f"; beside it, outside PyTorch's allocator: managed {managed / GIB:.2f} " \
            "(paged optimizer states in CUDA managed memory: what the card has room for counts " \
            "in the device peak, the rest pages to the host)" if managed else ""
        say(console, f"breakdown at the allocated peak (GiB, predicted, peak in the {m.peak_phase}):"
                     f" {parts}{beside}")
        for note in m.model_notes:
            say(console, f"  · {note}")
    for note in plan_notes(result):
        say(console, note, "dim")
    say(console, f"planned in {result.plan_time_s:.1f} s (measured wall time)", "dim")
