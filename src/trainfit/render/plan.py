"""Rich renderers: they print results, they never compute them."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainfit.plan.grid import PlanResult
from trainfit.render.words import plan_notes, plan_reason, plan_versus

GIB = 2**30


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.2f}"


def _num(v: float | None, fmt: str) -> str:
    return "unknown" if v is None else fmt.format(v)


def _console() -> Console:
    """Wide enough for the tables when output goes to a pipe or a file (rich assumes 80)."""
    console = Console()
    return console if console.is_terminal else Console(width=150)


def render_simple(title: str, columns: list[str], rows: list[list[str]]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*r)
    _console().print(table)


def render_plan(result: PlanResult) -> None:
    console = _console()
    gpu = result.gpu or "no GPU given"
    cap = f" ({_gib(result.gpu_memory_bytes)} GiB as CUDA reports it)" \
        if result.gpu_memory_bytes else ""
    console.print(f"[bold]trainfit plan[/bold] — {result.model} ({result.model_origin}) on "
                  f"{gpu}{cap}")
    if result.model_note:
        console.print(f"note: {result.model_note}")
    console.print(f"parameters: {result.total_params / 1e6:,.1f} M total, "
                  f"{result.trainable_params / 1e6:,.2f} M trainable (counts)")
    table = Table(title="predicted peak GPU memory per rank (GiB = 2^30 B)", show_lines=False)
    for col in ("", "precision", "ckpt", "micro×accum", "allocated\n(predicted)",
                "reserved\n(predicted)", "device\n(predicted)", "fits", "headroom\nGiB",
                "tokens/s\n(predicted)", "MFU\n(predicted)", "peak in", "how"):
        table.add_column(col, justify="right" if col not in ("precision", "how", "ckpt") else "left")
    for i, row in enumerate(result.rows):
        j, m = row.job, row.memory
        mark = "★" if row.recommended else ("▲" if row.largest_fitting else "")
        fits = "unknown" if m.fits is None else ("yes" if m.fits else "[red]no[/red]")
        table.add_row(mark, j.precision, j.grad_ckpt, f"{j.micro_batch}×{j.grad_accum}",
                      _gib(m.peak_allocated_bytes), _gib(m.peak_reserved_bytes),
                      _gib(m.peak_device_bytes), fits,
                      _gib(m.headroom_bytes) if m.headroom_bytes is not None else "unknown",
                      _num(row.speed.tokens_per_s if row.speed else None, "{:,.0f}"),
                      _num(row.speed.mfu if row.speed else None, "{:.0%}"),
                      m.peak_phase, row.how, style="bold" if row.recommended else None)
        del i
    console.print(table)
    console.print("★ recommended  ▲ largest micro-batch that fits")
    if result.ladder:
        lt = Table(title="nothing fits — memory-saving ladder (cumulative, from the smallest "
                         "configuration above, predicted)")
        for col in ("change", "device GiB (predicted)", "tokens/s (predicted)", "fits",
                    "alters what is learned"):
            lt.add_column(col)
        for r in result.ladder:
            lt.add_row(r.change, _gib(r.peak_device_bytes), _num(r.tokens_per_s, "{:,.0f}"),
                       "unknown" if r.fits is None else ("yes" if r.fits else "no"),
                       "yes" if r.alters_learning else "no")
        console.print(lt)
    if result.dataset_tokens is not None and result.recommended_index is not None:
        row = result.rows[result.recommended_index]
        t = result.time_for_dataset_s({"tokens_per_s": row.speed.tokens_per_s}
                                      if row.speed else None)
        console.print(f"time for {result.epochs or 1:g} epoch(s) of {result.dataset_tokens:,} "
                      f"tokens: {'unknown' if t is None else f'{t / 3600:.2f} h'} (predicted)")
    console.print(f"[bold]pick:[/bold] {plan_reason(result)}")
    versus = plan_versus(result)
    if versus:
        console.print(f"[bold]against what you run now:[/bold] {versus}")
    if result.recommended_index is not None:
        m = result.rows[result.recommended_index].memory
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in m.breakdown.items() if v)
        console.print(f"breakdown at the allocated peak (GiB, predicted): {parts}")
        for note in m.model_notes:
            console.print(f"  · {note}")
    for note in plan_notes(result):
        console.print(f"[dim]{note}[/dim]")
    console.print(f"[dim]planned in {result.plan_time_s:.1f} s (measured wall time)[/dim]")
