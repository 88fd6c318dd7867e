"""``trainfit tune``'s result as a rich table: the probes (measured beside predicted) and the pick."""

from __future__ import annotations

from typing import Any

from trainfit.render.layout import Col, fit_table, out_console, say
from trainfit.render.tune_words import tune_json

GIB = 2**30

TUNE_COLS = [Col("#"), Col("stage", "left", drop=3), Col("micro×acc"), Col("precision", "left"),
             Col("ckpt", "left"), Col("attn", "left", drop=2), Col("optim", "left", drop=4),
             Col("wk"), Col("status", "left"), Col("alloc m/p"), Col("tok/s m/p"),
             Col("wait%", drop=1)]
"""Designed for 100 terminal columns; a narrower one leaves out wait%, attn, stage, optim in that
order (and says so). The probe times are in --json; the search's total is printed below."""


def _f(v: Any, scale: float = 1, fmt: str = ".3f") -> str:
    return "—" if v is None else format(v / scale, fmt)


def _optim(optimizer: str, impl: str) -> str:
    """torch's AdamW/SGD by their kernel (fused, foreach, forloop); the others by name."""
    return impl if optimizer == "adamw" else (f"{impl} sgd" if optimizer == "sgd" else optimizer)


def _cells(p: dict[str, Any]) -> list[str]:
    m, pr = p["measured"] or {}, p["predicted"] or {}
    status = "> margin" if p["status"] == "ok" and not p["fits"] else p["status"]
    wait = m.get("data_wait_fraction")
    return [str(p["index"]), p["stage"], f"{p['micro_batch']}×{p['grad_accum']}", p["precision"],
            p["grad_ckpt"], p["attention"], _optim(p["optimizer"], p["optimizer_impl"]),
            str(p["num_workers"]), status,
            f"{_f(m.get('peak_allocated_bytes'), GIB)}/{_f(pr.get('peak_allocated_bytes'), GIB)}",
            f"{_f(m.get('tokens_per_s'), 1, ',.0f')}/{_f(pr.get('tokens_per_s'), 1, ',.0f')}"
            + ("*" if pr.get("from_busy_timings") and pr.get("tokens_per_s") else ""),
            _f(None if wait is None else wait * 100, 1, ".1f")]


def render_tune_dict(d: dict[str, Any], *, stderr: bool = False) -> None:
    """``d``: ``trainfit tune --json``'s content."""
    con = out_console(stderr=stderr)
    title = (f"trainfit tune — probes on {d['device_name']}: peak allocated GiB and tokens/s, "
             "measured / predicted (predicted = data-less simulation of the same step)")
    table, dropped = fit_table(con, title, TUNE_COLS, [_cells(p) for p in d["probes"]])
    con.print(table)
    legend = ("m/p: measured / predicted · tok/s: tokens/s · wk: loader workers · wait%: data "
              "wait, % of the step · > margin: ran within the capacity, not within its margin")
    if any((p["predicted"] or {}).get("from_busy_timings") and (p["predicted"] or {}).get(
            "tokens_per_s") for p in d["probes"]):
        # said where it is (an audit: 344 predicted in one run, 10,211-11,134 in the next, the
        # table silent; the JSON alone had from_busy_timings)
        legend += (" · *: predicted from kernel times measured while other processes used "
                   "this CPU — too slow by an unknown factor, not comparable with the other rows")
    if dropped:
        legend += f" · narrow terminal: {', '.join(dropped)} left out (widen it, or --json)"
    say(con, legend, "dim")
    lim = d["memory_limit_bytes"]
    # a script's search is timed inside it, from its trainer on: its own start (imports, the
    # model's build) is not in it (a QA run read "8 s in all" for a 17.8 s command)
    took = (f"the search took {d['search_time_s']:.0f} s from the script's trainer on (measured; "
            "the script's start before it is not counted)" if d.get("step_source") == "script"
            else f"tune took {d['search_time_s']:.0f} s in all, loading included (measured)")
    say(con, f"capacity: {'none' if lim is None else f'{lim / GIB:.3f} GiB'}, margin "
             f"{d['margin']:.0%}; {took}")
    say(con, d["reason"], lead="pick:")
    if d.get("link"):
        lk = d["link"]
        say(con, f"link between the {lk['ranks']} ranks ({lk['backend']}): all-gather bus "
                 f"bandwidth {lk['bus_gbs']:.2f} GB/s (measured, spread {lk['spread_gbs']:.2f}); "
                 f"plan with --interconnect {lk['bus_gbs']:.2f}")
    for n in d["notes"]:
        say(con, f"  note: {n}")


def render_tune(result: Any, *, stderr: bool = False) -> None:
    """``stderr``: when stdout carries something else (``--emit``'s payload)."""
    render_tune_dict(tune_json(result), stderr=stderr)
