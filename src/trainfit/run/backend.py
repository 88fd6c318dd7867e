"""What ``trainfit train`` runs the job with: the own loop, transformers' Trainer or TRL's
SFTTrainer — the dispatcher and its rule (the trainers themselves are in hf_backend.py)."""

from __future__ import annotations

from trainfit.data.load import load_data
from trainfit.job import JobError, JobSpec
from trainfit.model.source import resolve_model
from trainfit.run.loop import RunOptions, TrainResult, train
from trainfit.run.options import BACKENDS, check_backend

__all__ = ["BACKENDS", "resolve_backend", "run_backend"]


def resolve_backend(name: str, task: str, data_kind: str) -> str:
    check_backend(name)
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
    check_backend(backend)
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
    import torch

    from trainfit.run.hf_backend import run_hf

    threads = torch.get_num_threads()  # lowered on a busy host (as the own loop): given back
    try:
        return run_hf(job, opts, backend, data)
    finally:
        torch.set_num_threads(threads)
