"""Paths and a Typer app shared by the report tests (imported by file name: tests/ has no packages)."""

from __future__ import annotations

from pathlib import Path

import typer

from trainfit.cli import report as report_cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# seed 002's plan as committed at 1430299, when its speeds were predicted over the catalog's
# PCIe link; the current plan (examples/results) says the link of two GeForce cards is unknown
SEED002 = FIXTURES / "plan_seed002.json"
SEED002_NOW = ROOT / "examples" / "results" / "seed002_3080_chatlm_sft.json"
ALL_INPUTS = [str(SEED002), *(str(FIXTURES / n) for n in ("tune.json", "train.json", "doctor.json",
                                                            "monitor.csv"))]


def report_app() -> typer.Typer:
    """A Typer app with only ``report`` (a callback keeps it a sub-command, as in trainfit's app)."""
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root() -> None:
        pass

    report_cli.register(app)
    return app
