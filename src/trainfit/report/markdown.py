"""Markdown for pasting into an issue: the same blocks as the HTML, images as relative PNG links."""

from __future__ import annotations

from html import escape

from trainfit.report.figures import FigureImage
from trainfit.report.layout import Bullets, Heading, Image, Para, Table, layout
from trainfit.report.model import Report
from trainfit.report.tables import TextTable


def _text(text: str) -> str:
    """Text from the input files, made inert: Markdown renderers pass raw HTML through, so a
    ``<script>`` in a model name or a note would run where the file is shown (escaped as the HTML
    report escapes it)."""
    return escape(text, quote=False)


def _cell(text: str) -> str:
    return _text(text).replace("|", "\\|").replace("\n", " ")


def table_markdown(t: TextTable) -> str:
    lines = [f"**{_cell(t.title)}**", "",
             "| " + " | ".join(_cell(c) for c in t.flat_columns()) + " |",
             "|" + "|".join("---:" if t.numeric(i) and i else "---" for i in range(len(t.columns)))
             + "|"]
    for i, row in enumerate(t.rows):
        pick = i < len(t.highlight) and t.highlight[i]
        lines.append("| " + " | ".join(f"**{_cell(c)}**" if pick and c else _cell(c) for c in row)
                     + " |")
    if t.notes:
        lines.append("")
        lines += [f"- {_text(n)}" for n in t.notes]
    return "\n".join(lines)


def render_markdown(report: Report, figures: list[FigureImage], image_paths: dict[str, str]) -> str:
    """``image_paths``: figure name → path of its PNG relative to the Markdown file."""
    out = []
    for b in layout(report, figures):
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + _text(b.text))
        elif isinstance(b, Para):
            out.append(f"**{_text(b.text)}**" if b.warn else _text(b.text))
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {_text(i)}" for i in b.items))
        elif isinstance(b, Image):
            path = image_paths.get(b.figure.name, f"{b.figure.name}.png")
            out.append(f"![{_text(b.figure.title)}]({path})\n\n*{_text(b.figure.caption)}*")
        elif isinstance(b, Table):
            out.append(table_markdown(b.table))
    return "\n\n".join(out) + "\n"
