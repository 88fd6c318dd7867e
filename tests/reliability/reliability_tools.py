"""Helpers of the reliability suite (a module of its own: the name ``conftest`` is shared by
several test directories)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass
class Cli:
    code: int
    stdout: str
    stderr: str

    @property
    def errors(self) -> list[str]:
        return [x for x in self.stderr.splitlines() if x.startswith("error:")]

    @property
    def hints(self) -> list[str]:
        return [x for x in self.stderr.splitlines() if x.startswith("hint:")]

    def clean_error(self) -> bool:
        """Exit 2, exactly one ``error:`` and one ``hint:`` line, no traceback."""
        return (self.code == 2 and len(self.errors) == 1 and len(self.hints) == 1
                and "Traceback" not in self.stderr + self.stdout)


def write_job(path: Path, model: Path, data: Path, **fields) -> Path:
    """The micro Llama (~0.1 M parameters) on 24 padded chat rows, fp32: a job file."""
    job = {"model": str(model), "seq_len": 32, "effective_batch": 8, "micro_batch": 4,
           "precision": "fp32", "data": str(data), **fields}
    path.write_text(yaml.safe_dump(job))
    return path


def tree(d: Path) -> dict[str, int]:
    """Every file under ``d`` with its size: what 'nothing written' compares."""
    return {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}


def losses(run: Path) -> list[float]:
    return json.loads((run / "train.json").read_text())["losses"]
