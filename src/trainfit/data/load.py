"""The job's training data, tokenized as the model reads it (tune, train and doctor)."""

from __future__ import annotations

from trainfit.data.dataset import DataError, TokenData, read_rows, tokenize_rows
from trainfit.data.tokenizer import load_tokenizer
from trainfit.job import JobSpec
from trainfit.model.source import ModelSource, max_positions


def with_data_packing(job: JobSpec, data: TokenData) -> JobSpec:
    """``job`` with the packing the data layer did when the job left it to be chosen: what tune
    writes, and what a run records and its resume compares (run/resume_fields.same_samples)."""
    return job if job.packing is not None else job.replace(packing=data.stats.packed)


def load_data(job: JobSpec, source: ModelSource) -> TokenData:
    if not job.data:
        # said for whichever command asked (train read "tune measures …"); in a job file the
        # caller names the key (in_file_words)
        raise DataError("--data is required: the job runs on real data",
                        "give a JSONL of text or chat rows, e.g. --data examples/data/tiny_text.jsonl")
    tok = load_tokenizer(job.tokenizer, source.name, source.origin, int(source.config.vocab_size),
                         job.trust_remote_code)
    rows = read_rows(job.data)
    return tokenize_rows(rows, tok, seq_len=job.seq_len, task=source.task,
                         text_field=job.text_field, packing=job.packing, path=job.data,
                         max_positions=max_positions(source))
