"""The pre-tokenized memory-mapped token file (cached, reused), length grouping, worker choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainfit.data import builtin_tokenizer
from trainfit.doctor import fixes
from trainfit.doctor.fixes import (
    MemmapTokens,
    WorkerTrial,
    choose_workers,
    length_grouped_batches,
    padded_positions,
    pretokenize,
)

TEXT = Path(__file__).resolve().parents[2] / "examples" / "data" / "tiny_text.jsonl"


def test_token_file_is_built_once_and_reused(tmp_path):
    tok = builtin_tokenizer()
    before = fixes.TOKENIZE_CALLS
    a = pretokenize(tok, TEXT, seq_len=64, task="causal-lm")
    assert not a.reused and fixes.TOKENIZE_CALLS == before + 1
    assert a.path.parent == tmp_path / "cache" / "tokens"
    mtime = a.path.stat().st_mtime_ns
    b = pretokenize(tok, TEXT, seq_len=64, task="causal-lm")
    assert b.reused and b.key == a.key
    assert fixes.TOKENIZE_CALLS == before + 1  # the second call did not tokenize
    assert b.path.stat().st_mtime_ns == mtime
    # another seq_len or other data is another file
    c = pretokenize(tok, TEXT, seq_len=32, task="causal-lm")
    assert c.key != a.key and fixes.TOKENIZE_CALLS == before + 2
    other = tmp_path / "other.jsonl"
    other.write_text(TEXT.read_text().replace("data", "date"))
    assert pretokenize(tok, other, seq_len=64, task="causal-lm").key != a.key


def test_an_unreadable_cache_entry_is_built_again():
    """An audit: a truncated .json or .npy crashed doctor with a traceback, an empty lengths file
    with a bare "Aborted." (np.load's EOFError). The README says the cache is measured again,
    never an error: each damage is a miss, rebuilt, and the rebuilt file reads back whole."""
    tok = builtin_tokenizer()
    good = pretokenize(tok, TEXT, seq_len=64, task="causal-lm")
    whole = np.load(good.path).copy()
    damage = {
        "json cut": lambda: good.path.with_suffix("").with_suffix(".json").write_text('{"sampl'),
        "npy cut": lambda: good.path.write_bytes(good.path.read_bytes()[:200]),
        "lengths empty": lambda: good.lengths_path.write_bytes(b""),
        "lengths too long": lambda: np.save(good.lengths_path, np.full(3, 999, np.int32)),
    }
    for what, harm in damage.items():
        harm()
        before = fixes.TOKENIZE_CALLS
        tf = pretokenize(tok, TEXT, seq_len=64, task="causal-lm")
        assert not tf.reused and fixes.TOKENIZE_CALLS == before + 1, what
        assert (np.load(tf.path) == whole).all() and len(MemmapTokens(tf)) == good.samples, what
        assert pretokenize(tok, TEXT, seq_len=64, task="causal-lm").reused, what


def test_token_file_holds_the_packed_stream():
    tok = builtin_tokenizer()
    tf = pretokenize(tok, TEXT, seq_len=64, task="causal-lm")
    ds = MemmapTokens(tf)
    assert tf.packed and len(ds) == tf.samples
    i, ids, labels = ds[3]
    assert i == 3 and ids.dtype == np.int64 and len(ids) == 64 and labels is None
    text = "".join(tok.decode(ds[k][1]) for k in range(2))
    first = TEXT.read_text().split('"text": "')[1]
    assert text[:40] == first[:40]


def test_length_grouping_cuts_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 200, size=400)
    ids = [int(i) for i in rng.permutation(400)]
    plain = [ids[k:k + 8] for k in range(0, 400, 8)]
    grouped = length_grouped_batches(lengths, ids, 8)
    assert sorted(i for b in grouped for i in b) == list(range(400))
    assert padded_positions(lengths, grouped, None) < 0.75 * padded_positions(lengths, plain, None)
    assert padded_positions(lengths, plain, 256) == 400 * 256


def test_workers_stop_when_the_wait_is_gone():
    seen = []

    def measure_fast(n: int) -> WorkerTrial:
        seen.append(n)
        return WorkerTrial(num_workers=n, step_time_s={0: 0.25, 1: 0.1, 2: 0.1}[n], step_time_spread_s=0.01,
                           data_wait_fraction={0: 0.6, 1: 0.02, 2: 0.01}[n], rss_bytes=2**30 * (1 + n))

    c = choose_workers(measure_fast, cuda=False, cpu_count=4, ram_budget_bytes=2**34)
    assert seen == [0, 1] and c.num_workers == 1 and c.persistent_workers and not c.pin_memory
    seen.clear()
    c0 = choose_workers(lambda n: WorkerTrial(num_workers=n, step_time_s=0.1, step_time_spread_s=0.0,
                                              data_wait_fraction=0.01, rss_bytes=2**30),
                        cuda=True, cpu_count=4, ram_budget_bytes=2**34)
    assert c0.num_workers == 0 and "0 workers" in c0.reason
    # a second worker that would not fit the RAM budget is not tried
    seen.clear()
    c2 = choose_workers(lambda n: (seen.append(n), WorkerTrial(
        num_workers=n, step_time_s=0.2, step_time_spread_s=0.0, data_wait_fraction=0.5,
        rss_bytes=2**30 * (1 + 2 * n)))[1], cuda=False, cpu_count=4, ram_budget_bytes=4 * 2**30)
    assert seen == [0, 1] and "RAM budget" in c2.reason
