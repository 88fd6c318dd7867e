"""A job file as doctor reads it: the job every command reads, its ``doctor:`` options, paths
resolved from the file's directory, the card it names checked. Out of doctor/run.py, which
measures the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainfit.doctor.inject import DoctorError
from trainfit.doctor.measure import resolve_relative
from trainfit.job import JobSpec, read_job_file
from trainfit.job.step_options import refuse_other_model_code

DOCTOR_KEYS = {"tokenize": ("lazy", "eager")}
"""The ``doctor:`` mapping a job file may carry: ``tokenize: lazy`` measures seed 003's loader."""


def read_doctor_file(path: str | Path, *, allow_code: bool = False, trust_remote_code: bool = False
                     ) -> tuple[JobSpec, dict[str, Any], dict[str, Any]]:
    """A job YAML → (job, doctor options, file-only keys). Paths in it resolve from the file's
    directory when they do not exist from here. ``allow_code`` / ``trust_remote_code``: the
    command line's --allow-code / --trust-remote-code (a job file alone never runs code)."""
    p = Path(path)
    if not p.exists():  # a directory or an unreadable file: read_job_file's own words
        raise DoctorError(f"{path}: no such file", "give a trainfit job YAML, or -- CMD for a script")
    # the same parse (and errors) as every other command
    fields, extra = read_job_file(p, allow_code=allow_code, trust_remote_code=trust_remote_code)
    if trust_remote_code:
        fields["trust_remote_code"] = True
    opts = extra.pop("doctor", None) or {}
    if not isinstance(opts, dict):
        raise DoctorError(f"{path}: doctor: must be a mapping", "e.g. doctor: {tokenize: lazy}")
    for k, v in opts.items():
        if k not in DOCTOR_KEYS:
            raise DoctorError(f"{path}: doctor: unknown key {k!r}", f"known: {', '.join(DOCTOR_KEYS)}")
        if v not in DOCTOR_KEYS[k]:
            raise DoctorError(f"{path}: doctor.{k}: {v!r} must be one of {', '.join(DOCTOR_KEYS[k])}",
                              f"e.g. doctor: {{{k}: {DOCTOR_KEYS[k][0]}}}")
    for key in ("data", "tokenizer", "model"):
        if isinstance(fields.get(key), str):
            fields[key] = resolve_relative(fields[key], p.parent)
    if extra.get("gpu") is not None:  # as plan, tune and train read it (a review)
        from trainfit.hardware.gpus import known_gpu

        known_gpu(str(extra["gpu"]), f"gpu: {extra['gpu']} (in {path})", "gpu: generic-24gb")
    job = JobSpec.from_dict(fields, source=str(path))
    refuse_other_model_code(job, "doctor")  # it measures the installed transformers model
    return job, opts, extra
