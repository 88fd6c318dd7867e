"""Tables fit the terminal by leaving out the least useful columns (named), never by cutting a
number; piped, they keep every column."""

from __future__ import annotations

from rich.console import Console

from trainfit.render.layout import PIPE_WIDTH, Col, fit_table, out_console

COLS = [Col("name", "left"), Col("alloc GiB", drop=2), Col("device GiB"),
        Col("how", "left", drop=3)]
ROWS = [["amp-bf16 off 8×16", "123456.78", "234567.89", "extrapolated"],
        ["fp32 full 1×128", "1.00", "2.00", "simulated"]]


def _render(width: int) -> tuple[str, list[str]]:
    console = Console(width=width, record=True, force_terminal=True)
    table, dropped = fit_table(console, "t", COLS, ROWS)
    console.print(table)
    return console.export_text(), dropped


def test_wide_terminal_keeps_every_column():
    text, dropped = _render(200)
    assert dropped == [] and "extrapolated" in text and "123456.78" in text


def test_narrow_terminal_drops_columns_in_order_and_cuts_no_number():
    text, dropped = _render(36)
    assert dropped == ["alloc GiB", "how"]  # how first, then alloc (the order of the table)
    assert "…" not in text
    assert "234567.89" in text and "amp-bf16 off 8×16" in text
    assert max(len(line) for line in text.splitlines()) <= 36


def test_piped_console_is_wide():
    import io
    import sys

    old = sys.stdout
    sys.stdout = io.StringIO()  # not a terminal
    try:
        assert out_console().width == PIPE_WIDTH
    finally:
        sys.stdout = old
