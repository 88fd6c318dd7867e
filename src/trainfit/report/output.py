"""Render a report and write it: every file to a temporary name first, renamed only when all are
written, so a failure leaves nothing half-written."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainfit.report.build import build_report
from trainfit.report.figures import render_figures
from trainfit.report.html import render_html
from trainfit.report.load import ReportInputError, load_inputs
from trainfit.report.markdown import render_markdown
from trainfit.report.model import Report

FILE_MODE = 0o644
"""mkstemp makes 0600 files; a report is meant to be shared."""


@dataclass(frozen=True)
class Written:
    report: Report
    paths: list[Path]
    warnings: list[str]


def _check_dir(d: Path, what: str) -> None:
    flag = what.split()[0]  # --out or --png-dir: the hint names the flag that was wrong
    if not d.exists():
        raise ReportInputError(f"{what}: directory {d} does not exist",
                               f"create it first, or choose another {flag}")
    if not d.is_dir():
        raise ReportInputError(f"{what}: {d} is not a directory", f"choose another {flag}")


def write_atomically(files: dict[Path, bytes]) -> None:
    """All files or none: temporaries next to their targets (same file system, so rename is atomic)."""
    for path in files:
        if path.exists() and not path.is_file():
            # a rename over it would replace the node itself (an audit, as root: /dev/full
            # became an HTML file)
            raise ReportInputError(f"{path}: exists and is not a regular file (a device, pipe "
                                   "or socket): the report would replace it",
                                   "give another --out (and --png-dir), e.g. --out report.html")
    temps: list[tuple[str, Path]] = []
    current = next(iter(files), Path("."))
    try:
        for path, data in files.items():
            current = path
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, FILE_MODE)
        for tmp, path in temps:
            current = path
            os.replace(tmp, path)
    except OSError as e:
        for tmp, _ in temps:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise ReportInputError(f"{current}: cannot write ({e.strerror or e})",
                               "choose an --out (and --png-dir) in a directory you can write to") from None


def _check_not_an_input(files: dict[Path, bytes], inputs: list[str]) -> None:
    """Nothing the report writes may replace what it reads: an input file, or the train.json and
    monitor log of an input run directory (an audit: ``--out`` naming the input train.json
    replaced the run's record with the HTML)."""
    read: set[Path] = set()
    for i in inputs:
        p = Path(i).resolve()
        read |= {p / "train.json", p / "monitor.jsonl"} if p.is_dir() else {p}
    for f in files:
        if f.resolve() in read:
            raise ReportInputError(f"{f}: is one of the report's inputs; writing the report there "
                                   "would replace it", "give another --out, e.g. --out report.html")


def make_report(inputs: list[str], out: Path, *, png_dir: Path | None = None, markdown: bool = False,
                dataset_tokens: int | None = None) -> Written:
    """Read ``inputs``, build the report, write ``out`` (HTML), its PNGs and optionally Markdown."""
    if out.exists() and out.is_dir():
        raise ReportInputError(f"--out {out}: is a directory", "give a file name, e.g. report.html")
    _check_dir(out.parent if str(out.parent) else Path("."), f"--out {out}")
    if markdown and out.suffix.lower() == ".md":
        raise ReportInputError(f"--out {out}: --markdown writes <out>.md, which would replace the HTML",
                               "give the HTML file name, e.g. --out report.html --markdown")
    if dataset_tokens is not None and dataset_tokens <= 0:
        raise ReportInputError(f"--dataset-tokens {dataset_tokens}: must be > 0",
                               "the number of tokens in one epoch of the training data")
    report = build_report(load_inputs(inputs), dataset_tokens)
    figures = render_figures(report)
    made_dir = False
    png_dir = png_dir if png_dir is not None else out.parent
    if not png_dir.exists():
        if not png_dir.parent.is_dir():
            # the directory itself is made, not a tree of them (an audit: --png-dir
            # /nonexistent/pngs made a new top-level /nonexistent), as --out's must exist
            raise ReportInputError(f"--png-dir {png_dir}: {png_dir.parent} "
                                   + ("is not a directory" if png_dir.parent.exists() else
                                      "does not exist"),
                                   "give a directory whose parent exists (it is made if it "
                                   "is not there)")
        try:
            png_dir.mkdir()
            made_dir = True
        except OSError as e:
            raise ReportInputError(f"--png-dir {png_dir}: cannot create ({e.strerror or e})",
                                   "choose a directory you can write to") from None
    _check_dir(png_dir, f"--png-dir {png_dir}")
    pngs = {f.name: png_dir / f"{out.stem}-{f.name}.png" for f in figures}
    files: dict[Path, bytes] = {out: render_html(report, figures).encode("utf-8")}
    if markdown:
        md = out.with_suffix(".md")
        rel = {name: os.path.relpath(p, md.parent) for name, p in pngs.items()}
        files[md] = render_markdown(report, figures, rel).encode("utf-8")
    files.update({pngs[f.name]: f.png for f in figures})
    _check_not_an_input(files, inputs)
    try:
        write_atomically(files)
    except ReportInputError:
        if made_dir:
            try:
                png_dir.rmdir()
            except OSError:
                pass
        raise
    return Written(report, list(files), report.warnings)
