"""The rendered files: Markdown table numbers, a self-contained HTML page, PNGs next to it."""

from __future__ import annotations

import base64
import re

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _md_table(md: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split(" | ")]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip().strip("*") for c in ln.strip().strip("|").split(" | ")])
    return header, rows


def test_markdown_seed_table(rendered):
    md = rendered.with_suffix(".md").read_text()
    header, rows = _md_table(md, "setting")
    assert len(rows) == 12
    row = dict(zip(header, next(r for r in rows if r[0] == "amp-bf16, checkpointing off" and r[1] == "16"),
                   strict=True))
    assert row["accumulation"] == "2"
    assert row["peak device (GiB), predicted"] == "11.24"
    assert row["peak device (GiB), measured"] == "12.10"
    assert row["host RAM (GiB), measured"] == "13.90"
    assert row["tokens/s, measured"] == "34,500"
    assert row["speed-up, measured"] == "2.46×"  # 34,500 / 14,000 baseline
    assert row["time per epoch (h:mm:ss), measured"] == "0:12:22"  # 25.6 M tokens / 34,500 tokens/s
    assert row["pick"] == "tune"
    # every number column says predicted or measured (micro-batch / accumulation are the configuration)
    for h in header[3:-1]:
        assert "predicted" in h or "measured" in h, h
    assert "None" not in md and "nan" not in md.lower()


def test_html_is_self_contained(rendered):
    html = rendered.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html)
    assert "<script" not in html and "<link" not in html and "@import" not in html
    srcs = re.findall(r'<img src="([^"]+)"', html)
    assert len(srcs) == 5  # memory + throughput, two timelines, doctor's split
    for s in srcs:
        assert s.startswith("data:image/png;base64,")
        assert base64.b64decode(s.split(",", 1)[1]).startswith(PNG_MAGIC)


def test_pngs_next_to_html(rendered):
    pngs = sorted(p.name for p in rendered.parent.glob("report-*.png"))
    assert len(pngs) == 5 and "report-timeline-monitor.png" in pngs
    md = rendered.with_suffix(".md").read_text()
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(linked) == pngs
    for name in pngs:
        assert (rendered.parent / name).read_bytes().startswith(PNG_MAGIC)
