"""benchmarks/lightning_finder.py: Lightning's BatchSizeFinder on a ~0.1M-parameter Llama under the
CPU memory limit (skipped where Lightning is not installed: it is a benchmark extra, `.[bench]`)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")

from trainfit.data import builtin_tokenizer, read_rows, tokenize_rows
from trainfit.job import JobSpec
from trainfit.model.source import resolve_model
from trainfit.tune.probe import Probe


@pytest.fixture(scope="module")
def lf(load_bench):
    return load_bench("lightning_finder")


def test_limit_error_needs_the_gpu_wording(lf) -> None:
    # Lightning's is_oom_error wants "CUDA" in the message: the tracker's own error is not an OOM to it
    assert lf.limit_error_recognised() == {"limit_tracker_error": False, "wrapped_error": True}


def test_binsearch_under_the_limit(lf, micro_model_json, text_jsonl, one_thread) -> None:
    src = resolve_model(str(micro_model_json))
    data = tokenize_rows(read_rows(text_jsonl), builtin_tokenizer(), seq_len=48, task=src.task)
    base = JobSpec(model=str(micro_model_json), seq_len=48, effective_batch=4, precision="fp32",
                   grad_ckpt="off", data="x")
    job6 = base.replace(micro_batch=6, grad_accum=1, effective_batch=6)
    limit = Probe(src, data, torch.device("cpu")).run(job6, timed_steps=0).measured.peak_allocated_bytes
    r = lf.find_batch_size(src, data, base, limit)
    ok = [t for t in r["trials"] if t["status"] == "ok"]
    oom = [t for t in r["trials"] if t["status"] == "oom"]
    assert ok and oom and r["tried"][:2] == [2, 4]
    assert all(t["peak_bytes"] <= limit for t in ok) and all(t["peak_bytes"] > limit for t in oom)
    largest = r["largest_batch_that_ran"]
    assert largest == max(t["batch_size"] for t in ok) and largest + 1 in [t["batch_size"] for t in oom]
    assert largest <= 6  # 6 fits trainfit's step exactly; Lightning's holds at least as much
    assert r["chosen_batch"] == max(1, int(largest * 0.95)) and r["probe_time_s"] > 0
