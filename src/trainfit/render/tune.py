"""``trainfit tune``'s result as a rich table: the probes (measured beside predicted) and the pick."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from trainfit.render.words import optimizer_words, tune_json


def render_tune(result: Any, *, stderr: bool = False) -> None:
    """``stderr``: when stdout carries something else (``--emit``'s payload)."""
    d = tune_json(result)
    con = Console(stderr=stderr)
    gib = 2**30
    t = Table(title=f"trainfit tune — probes on {d['device_name']} (measured; predicted = "
                    "data-less simulation of the same step)")
    for col in ("#", "stage", "micro×accum", "precision", "ckpt", "attn", "optim", "workers",
                "status", "peak alloc GiB meas / pred", "tokens/s meas / pred", "data wait %",
                "probe s"):
        t.add_column(col)
    for p in d["probes"]:
        m, pr = p["measured"] or {}, p["predicted"] or {}

        def f(v: Any, scale: float = 1, fmt: str = ".3f") -> str:
            return "—" if v is None else format(v / scale, fmt)
        t.add_row(str(p["index"]), p["stage"], f"{p['micro_batch']}×{p['grad_accum']}",
                  p["precision"], p["grad_ckpt"], p["attention"],
                  optimizer_words(p["optimizer"], p["optimizer_impl"]),
                  str(p["num_workers"]), p["status"] + ("" if p["fits"] or p["status"] != "ok"
                                                        else " (over margin)"),
                  f"{f(m.get('peak_allocated_bytes'), gib)} / {f(pr.get('peak_allocated_bytes'), gib)}",
                  f"{f(m.get('tokens_per_s'), 1, ',.0f')} / {f(pr.get('tokens_per_s'), 1, ',.0f')}",
                  f(None if m.get("data_wait_fraction") is None else m["data_wait_fraction"] * 100,
                    1, ".1f"),
                  f"{p['probe_time_s']:.1f}")
    con.print(t)
    lim = d["memory_limit_bytes"]
    con.print(f"capacity: {'none' if lim is None else f'{lim / gib:.3f} GiB'}, margin "
              f"{d['margin']:.0%}; search took {d['search_time_s']:.0f} s (measured)")
    con.print(f"[bold]pick:[/bold] {d['reason']}")
    for n in d["notes"]:
        con.print(f"  note: {n}")
