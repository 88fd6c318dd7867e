"""The job: what to train and how (schema, validation, YAML) — the bottom of the package, no torch."""

from trainfit.job.spec import (
    ATTENTIONS,
    DEFAULT_MARGIN,
    FILE_ONLY_KEYS,
    GRAD_CKPT,
    LORA_ALIASES,
    METHODS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    QUANTS,
    SHARDINGS,
    JobError,
    JobSpec,
    dividing_micro_batches,
    job_with_current,
    read_job_file,
)

__all__ = [
    "ATTENTIONS",
    "DEFAULT_MARGIN",
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
    "job_with_current",
    "read_job_file",
]
