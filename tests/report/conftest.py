"""Report tests: the real seed-002 plan plus synthetic tune / train / doctor / monitor files (fixtures/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_paths import ALL_INPUTS, report_app

from trainfit.report import Report, build_report, load_inputs


@pytest.fixture(scope="session")
def full_report() -> Report:
    return build_report(load_inputs(ALL_INPUTS))


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The full report written once through the CLI (HTML + Markdown + PNGs)."""
    from typer.testing import CliRunner

    out = tmp_path_factory.mktemp("rendered") / "report.html"
    res = CliRunner().invoke(report_app(), ["report", *ALL_INPUTS, "--out", str(out), "--markdown"])
    assert res.exit_code == 0, res.output
    return out
