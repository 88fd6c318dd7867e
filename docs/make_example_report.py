#!/usr/bin/env python3
"""Regenerate docs/example-report.html and its Chromium screenshot docs/example-report.png.

Inputs: the real seed-002 plan (examples/results/seed002_3080_chatlm_sft.json; the seed whose
hand-written batch → VRAM table `trainfit report` replaces) plus, when they exist, every
examples/results/*.json whose `kind` is tune, train or doctor, and every monitor log there
(*.jsonl, *.csv).

    python docs/make_example_report.py            # from the repository root or anywhere
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from PIL import Image

from trainfit.report.browser import find_chromium, look
from trainfit.report.output import make_report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("examples/results")
PLAN = RESULTS / "seed002_3080_chatlm_sft.json"
LATER_KINDS = ("tune", "train", "doctor")
HTML = Path("docs/example-report.html")
SHOT = Path("docs/example-report.png")
WIDTH, HEIGHT = 1280, 4000


def _kind(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data.get("kind") if isinstance(data, dict) else None


def inputs() -> list[str]:
    """The plan, then outputs of tune / train / doctor (by their `kind`) and monitor logs."""
    files = [PLAN]
    files += [p for p in sorted(RESULTS.rglob("*.json")) if _kind(p) in LATER_KINDS]
    files += sorted(RESULTS.glob("*.jsonl")) + sorted(RESULTS.glob("*.csv"))
    return [str(p) for p in files]


def trim_white_bottom(png: Path) -> Image.Image:
    """The screenshot is a fixed 1280 × 4000 window; drop the empty page below the content."""
    img = Image.open(png).convert("RGB")
    ink = img.convert("L").point(lambda v: 255 if v < 245 else 0).getbbox()
    bottom = HEIGHT if ink is None else min(HEIGHT, ink[3] + 24)
    return img.crop((0, 0, img.width, bottom))


def main() -> int:
    os.chdir(ROOT)  # relative paths in the committed page, not this machine's
    files = inputs()
    with tempfile.TemporaryDirectory() as tmp:
        # the page embeds its figures; the PNG files beside it are not needed in docs/
        make_report(files, HTML, png_dir=Path(tmp))
        print(f"wrote {HTML} from {', '.join(files)}")
        if find_chromium() is None:
            print("warning: chromium is not installed; docs/example-report.png not updated", file=sys.stderr)
            return 1
        raw = Path(tmp) / "shot.png"
        look(HTML, raw, WIDTH, HEIGHT)
        part = SHOT.with_name(f".{SHOT.name}.tmp")  # same directory: the rename is atomic
        trim_white_bottom(raw).save(part, format="PNG", optimize=True)
        os.replace(part, SHOT)
    print(f"wrote {SHOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
