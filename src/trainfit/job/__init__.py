"""The job: what to train and how (schema, validation, YAML) — the bottom of the package, no torch."""

from trainfit.job.choices import (
    ATTENTIONS,
    DEFAULT_MARGIN,
    GRAD_CKPT,
    LORA_ALIASES,
    METHODS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    QUANTS,
    SHARDINGS,
    JobError,
)
from trainfit.job.files import FACTORY_SPEC, FILE_ONLY_KEYS, is_code_spec, job_with_current, read_job_file
from trainfit.job.spec import JobSpec
from trainfit.job.step_options import dividing_micro_batches, step_micro_batches, step_precisions

__all__ = [
    "ATTENTIONS",
    "DEFAULT_MARGIN",
    "FACTORY_SPEC",
    "FILE_ONLY_KEYS",
    "GRAD_CKPT",
    "LORA_ALIASES",
    "METHODS",
    "OPTIMIZERS",
    "OPTIMIZER_IMPLS",
    "PRECISIONS",
    "QUANTS",
    "SHARDINGS",
    "JobError",
    "JobSpec",
    "dividing_micro_batches",
    "is_code_spec",
    "job_with_current",
    "read_job_file",
    "step_micro_batches",
    "step_precisions",
]
