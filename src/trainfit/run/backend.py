"""What ``trainfit train`` runs the job with: the own loop, transformers' Trainer or TRL's
SFTTrainer — the dispatcher and its rule (the trainers themselves are in hf_backend.py)."""

from __future__ import annotations

from trainfit.data.load import load_data
from trainfit.job import JobError, JobSpec
from trainfit.model.source import resolve_model
from trainfit.run.loop import RunOptions, TrainResult, train

BACKENDS = ("trainfit", "hf", "trl", "auto")
"""trainfit: the own loop (every guarantee, any model); hf: transformers.Trainer; trl:
trl.SFTTrainer; auto: trainfit for a ``module:factory`` model, trl for chat data, hf for text."""


def resolve_backend(name: str, task: str, data_kind: str) -> str:
    if name not in BACKENDS:
        raise JobError(f"--backend {name}: unknown", f"choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        if task == "custom-lm":
            return "trainfit"
        return "trl" if data_kind == "chat" else "hf"
    if name in ("hf", "trl") and task == "custom-lm":
        raise JobError(f"--backend {name}: a module:factory model is not a transformers model",
                       "use --backend trainfit (the own loop runs any nn.Module)")
    if name in ("hf", "trl") and task != "causal-lm":
        raise JobError(f"--backend {name}: only causal-LM models are wired ({task} given)",
                       "use --backend trainfit")
    return name


def run_backend(job: JobSpec, opts: RunOptions, backend: str = "trainfit") -> TrainResult:
    """``trainfit train``'s entry: the own loop, HF Trainer or TRL SFTTrainer (``auto`` by the
    model and the data: module:factory → trainfit, chat rows → trl, text → hf)."""
    if backend not in BACKENDS:
        raise JobError(f"--backend {backend}: unknown", f"choose one of {', '.join(BACKENDS)}")
    if backend == "trainfit":
        return train(job, opts)
    source = resolve_model(job.model, job.trust_remote_code)
    if backend != "auto":  # refuse a model the trainers cannot run before reading the data
        resolve_backend(backend, source.task, "")
    data = load_data(job, source)
    backend = resolve_backend(backend, source.task, data.stats.kind)
    if backend == "trainfit":
        return train(job, opts, data)
    # the trainers' module imports transformers' Trainer machinery (and TRL): only when used
    from trainfit.run.hf_backend import run_hf

    return run_hf(job, opts, backend, data)
