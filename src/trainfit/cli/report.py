"""``trainfit report FILES... --out report.html``: one self-contained HTML page (+ PNGs, + Markdown)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        files: Annotated[list[str], typer.Argument(
            help="JSON of plan / tune / train / doctor, monitor logs (.jsonl / .csv) and run "
                 "directories of trainfit train (their train.json and monitor log), any subset.",
            show_default=False)],
        out: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")] = Path(
            "report.html"),
        markdown: Annotated[bool, typer.Option(
            "--markdown", help="Also write the report as markdown beside it (--out r.html → r.md; "
                               "for pasting into an issue).")] = False,
        png_dir: Annotated[Path | None, typer.Option(
            "--png-dir", help="Where the PNGs go (default: next to --out).")] = None,
        dataset_tokens: Annotated[int | None, typer.Option(
            "--dataset-tokens", help="Tokens one epoch computes, for time per epoch: samples × "
            "the length each is padded or packed to, as tokens/s counts them (default: tune's "
            "samples × seq_len).")] = None,
        as_json: Annotated[bool, typer.Option(
            "--json", help="Also print what the report shows as JSON on stdout (its sections, "
                           "runs, timelines and doctor results: report/model.py), after writing "
                           "the files.")] = False,
    ) -> None:
        """Draw predictions and measurements: memory and throughput vs micro-batch, the pick, the
        seed-002-style table, probes, monitor timelines, doctor's before/after."""
        from trainfit.report import ReportInputError, make_report

        try:
            written = make_report(files, out, png_dir=png_dir, markdown=markdown,
                                  dataset_tokens=dataset_tokens)
        except ReportInputError as err:
            from trainfit.cli.jobargs import say_error

            say_error(str(err), err.hint, as_json=as_json)
        for w in written.warnings:
            typer.echo(f"warning: {w}", err=True)
        if as_json:
            from dataclasses import asdict

            from trainfit import json_text

            # the built report itself, not its HTML: the numbers a program reads (an audit: every
            # other command had --json, report none)
            typer.echo(json_text.dumps({"kind": "report", **asdict(written.report),
                                        "warnings": written.warnings,
                                        "written": [str(p) for p in written.paths]}, indent=1))
            return
        typer.echo(f"wrote {written.paths[0]}")
        for p in written.paths[1:]:
            typer.echo(f"      {p}")
