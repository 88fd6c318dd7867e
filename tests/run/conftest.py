"""Fixtures of the train tests."""

from __future__ import annotations

import pytest


@pytest.fixture()
def limit_between():
    """``f(job, fits, ooms)``: a CPU memory limit halfway between the simulated peaks of the job at
    micro-batch ``fits`` and at ``ooms`` (the same step the trainer runs, so the OOM is real)."""
    from trainfit.data import builtin_tokenizer, read_rows, tokenize_rows
    from trainfit.model.source import resolve_model
    from trainfit.tune.tuner import CpuPredictor

    def f(job, fits: int, ooms: int) -> int:
        src = resolve_model(job.model)
        data = tokenize_rows(read_rows(job.data), builtin_tokenizer(), seq_len=job.seq_len,
                             task=src.task)
        pred = CpuPredictor(src, data)
        need_fits = pred(job.replace(micro_batch=fits)).peak_allocated_bytes
        need_ooms = pred(job.replace(micro_batch=ooms)).peak_allocated_bytes
        assert need_ooms > need_fits
        return (need_fits + need_ooms) // 2

    return f


@pytest.fixture()
def job(micro_model_json, chat_jsonl):
    """The loop's job (test_loop, test_resume): fp32 on the CPU, 8 = 2 × 4. Chat rows: padded,
    of different lengths — the token weighting matters."""
    from trainfit.job import JobSpec

    return JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                   precision="fp32", data=str(chat_jsonl))
