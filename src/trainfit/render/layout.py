"""Tables that fit the terminal without cutting a number, and the full width when piped.

A table is built from columns with a drop order: when its natural width is wider than the
terminal, the least useful columns are left out (and named) until it fits — rich would otherwise
shrink the cells and cut numbers to ``1…``. Piped to a file or another program there is no
terminal width: the console is as wide as the widest table (rich assumes 80 columns there).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table

PIPE_WIDTH = 240
"""Console width when the output is not a terminal: wider than any table here, so none is cut."""


def out_console(stderr: bool = False) -> Console:
    """The terminal as it is, or a wide console when piped."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=PIPE_WIDTH)


def say(console: Console, text: str, style: str | None = None, *, lead: str = "") -> None:
    """A line of prose: wrapped at word boundaries on a terminal, one line when piped (a file
    keeps its own lines; grep finds the sentence whole). ``lead``: a bold first word or two. The
    text is never read as markup (job values such as ``[q, v]`` print as they are)."""
    from rich.text import Text

    line = Text()
    if lead:
        line.append(lead + " ", style="bold")
    line.append(text, style=style or "")
    console.print(line, soft_wrap=not console.is_terminal, highlight=False)


@dataclass(frozen=True)
class Col:
    header: str
    justify: str = "right"
    drop: int = 0
    """0: always shown; otherwise the order in which a narrow terminal leaves it out (highest
    first)."""


def fit_table(console: Console, title: str, cols: list[Col], rows: list[list[str]],
              row_styles: list[str | None] | None = None) -> tuple[Table, list[str]]:
    """The table with as many columns as fit ``console``'s width (never a cut cell), and the
    headers of the columns left out."""
    keep = list(range(len(cols)))
    dropped: list[str] = []
    while True:
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      padding=(0, 1), title_justify="left", show_edge=False)
        for i in keep:
            table.add_column(cols[i].header, justify=cols[i].justify, no_wrap=True)  # type: ignore[arg-type]
        for n, r in enumerate(rows):
            table.add_row(*(r[i] for i in keep),
                          style=(row_styles[n] if row_styles else None))
        droppable = [i for i in keep if cols[i].drop > 0]
        # measured unbounded: rich clamps a measurement to the width it is offered
        natural = console.measure(table, options=console.options.update_width(10 * PIPE_WIDTH))
        if natural.maximum <= console.width or not droppable:
            return table, dropped
        worst = max(droppable, key=lambda i: cols[i].drop)
        keep.remove(worst)
        dropped.insert(0, cols[worst].header)
