"""Real data for ``tune``, ``train`` and ``doctor``: rows → tokens → fixed-shape micro-batches."""

from trainfit.data.dataset import DataError, DataStats, TokenData, read_rows, tokenize_rows
from trainfit.data.loader import (
    Collate,
    LoaderKnobs,
    SampleOrder,
    label_count,
    label_tokens,
    make_loader,
    micro_batch_ids,
    step_weights,
)
from trainfit.data.tokenizer import BUILTIN, builtin_tokenizer, load_tokenizer

__all__ = ["BUILTIN", "Collate", "DataError", "DataStats", "LoaderKnobs", "SampleOrder", "TokenData",
           "builtin_tokenizer", "label_count", "label_tokens", "load_tokenizer", "make_loader",
           "micro_batch_ids", "read_rows", "step_weights", "tokenize_rows"]
