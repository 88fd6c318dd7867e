"""One self-contained HTML page: inline CSS, figures as base64 PNG data URIs, no script, no network."""

from __future__ import annotations

import base64
from html import escape

from trainfit.report.figures import FigureImage
from trainfit.report.layout import Bullets, Heading, Image, Para, Table, layout
from trainfit.report.model import Report
from trainfit.report.tables import TextTable

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1500px;
       padding: 0 1em; color: #222; line-height: 1.35; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.8em; display: block; overflow-x: auto; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.4em; text-align: left; }
th { background: #f3f3f3; text-align: center; } td.n { text-align: right; white-space: nowrap; }
tr.pick td { background: #fff6d6; font-weight: bold; }
.notes { font-size: 0.85em; color: #555; margin: -0.6em 0 1em; }
.warn { color: #a00000; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
"""

NUM_TD = '<td class="n">'


def _head(t: TextTable) -> str:
    if not t.groups:
        return "<tr>" + "".join(f"<th>{escape(c)}</th>" for c in t.columns) + "</tr>"
    top, sub, col = [], [], 0
    for title, span in t.groups:
        if title:
            top.append(f'<th colspan="{span}">{escape(title)}</th>')
            sub += [f"<th>{escape(c)}</th>" for c in t.columns[col:col + span]]
        else:  # ungrouped columns span both header rows
            top += [f'<th rowspan="2">{escape(c)}</th>' for c in t.columns[col:col + span]]
        col += span
    return f"<tr>{''.join(top)}</tr><tr>{''.join(sub)}</tr>"


def _table(t: TextTable) -> str:
    head = _head(t)
    num = [t.numeric(i) and i > 0 for i in range(len(t.columns))]
    body = []
    for i, row in enumerate(t.rows):
        cls = ' class="pick"' if i < len(t.highlight) and t.highlight[i] else ""
        cells = "".join((NUM_TD if num[j] else "<td>") + f"{escape(c)}</td>" for j, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    notes = "".join(f"<li>{escape(n)}</li>" for n in t.notes)
    return (f"<table><caption>{escape(t.title)}</caption><thead>{head}</thead>"
            f"<tbody>{''.join(body)}</tbody></table>"
            + (f'<ul class="notes">{notes}</ul>' if notes else ""))


def _image(f: FigureImage) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (f'<figure id="fig-{escape(f.name)}"><img src="data:image/png;base64,{data}" '
            f'alt="{escape(f.title)}"><figcaption>{escape(f.caption)}</figcaption></figure>')


def render_html(report: Report, figures: list[FigureImage]) -> str:
    parts = []
    for b in layout(report, figures):
        if isinstance(b, Heading):
            anchor = f' id="{escape(b.anchor)}"' if b.anchor else ""
            parts.append(f"<h{b.level}{anchor}>{escape(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            cls = ' class="warn"' if b.warn else ""
            parts.append(f"<p{cls}>{escape(b.text)}</p>")
        elif isinstance(b, Bullets):
            parts.append("<ul>" + "".join(f"<li>{escape(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Image):
            parts.append(_image(b.figure))
        elif isinstance(b, Table):
            parts.append(_table(b.table))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(report.title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n"
            "</body></html>\n")
