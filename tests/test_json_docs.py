"""docs/json-formats.md names every key plan --json and tune --json write (an audit found 35 of
a plan's keys written but said nowhere). Read from the committed example outputs, which
benchmarks/seed_plans.py regenerates from the code; a job's own fields are docs/job-fields.md's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from trainfit.job import JobSpec

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "json-formats.md").read_text()
MAPS = {"attention_kernels", "attention_kernels_by_precision", "linear_subclasses_16bit_params",
        "model_config"}
"""Keys whose own keys are data (kernel names, precisions, class names), not a format's."""


def _keys(obj: Any, out: set[str]) -> set[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(k)
            if k not in MAPS:
                _keys(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _keys(v, out)
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "examples" / "results").glob(
    "*.json")))
def test_every_key_an_example_output_holds_is_documented(name: str) -> None:
    data = json.loads((ROOT / "examples" / "results" / name).read_text())
    job_fields = set(JobSpec.__dataclass_fields__)
    missing = sorted(k for k in _keys(data, set()) - job_fields
                     if not re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", DOC))
    assert not missing, f"{name}: keys not in docs/json-formats.md: {missing}"
