"""The data fixes the doctor applies to trainfit jobs (and prints for other scripts).

* :func:`pretokenize` — tokenize once into a memory-mapped token file under ``tokens/`` of the
  cache directory (trainfit.cache; default ``~/.cache/trainfit/tokens``), named by the SHA-256 of the
  tokenizer's full serialisation, the data file's bytes, ``seq_len``, the text field, packing and
  the task: a second run (or a second job on the same data) maps the file instead of tokenizing.
* :func:`length_grouped_batches` + :class:`DynamicPadCollate` — for padded data (chat rows):
  micro-batches of similar lengths, padded to their own longest sample.
* :func:`choose_workers` — the DataLoader worker count measured, not guessed, within a host-RAM
  budget (each worker's RSS measured).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainfit.cache import cache_root
from trainfit.data.dataset import TokenData, read_rows, tokenize_rows
from trainfit.doctor.inject import DoctorError

CACHE_FORMAT = 1
TOKENIZE_CALLS = 0
"""How many times :func:`pretokenize` actually tokenized (a cache hit does not): tests read it."""


def cache_dir() -> Path:
    return cache_root() / "tokens"


def tokenizer_identity(tok: Any) -> str:
    """Everything that decides the ids a text gets: the fast tokenizer's full JSON (vocabulary,
    merges, normalizer, special tokens), or for a Python tokenizer its class, vocabulary and
    special tokens; plus the chat template."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        core = backend.to_str()
    else:
        core = json.dumps({"class": type(tok).__name__, "vocab": tok.get_vocab(),
                           "special": {k: str(v) for k, v in tok.special_tokens_map.items()}},
                          sort_keys=True)
    return json.dumps({"tokenizer": core, "chat_template": getattr(tok, "chat_template", None),
                       "eos": tok.eos_token_id, "pad": tok.pad_token_id})


@dataclass(kw_only=True)
class TokenFile:
    path: Path
    """``<key>.npy``: int array [samples, seq_len], padded with ``pad_id``."""
    lengths_path: Path
    key: str
    samples: int
    seq_len: int
    tokens: int
    pad_id: int
    packed: bool
    kind: str
    reused: bool
    """True when the file was already there (no tokenization this time)."""
    build_time_s: float
    notes: list[str]


def cache_key(tok: Any, data_path: str | Path, *, seq_len: int, text_field: str, packing: bool | None,
              task: str) -> str:
    h = hashlib.sha256()
    h.update(f"trainfit-tokens-v{CACHE_FORMAT}\0".encode())
    h.update(tokenizer_identity(tok).encode())
    h.update(json.dumps({"seq_len": seq_len, "text_field": text_field, "packing": packing,
                         "task": task}, sort_keys=True).encode())
    with open(data_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pretokenize(tok: Any, data_path: str | Path, *, seq_len: int, task: str, text_field: str = "text",
                packing: bool | None = None, max_positions: int | None = None,
                directory: Path | None = None) -> TokenFile:
    """The job's samples as a memory-mapped token file, tokenized now only if not cached."""
    global TOKENIZE_CALLS
    d = directory or cache_dir()
    key = cache_key(tok, data_path, seq_len=seq_len, text_field=text_field, packing=packing, task=task)
    npy, lens, meta = d / f"{key}.npy", d / f"{key}.lengths.npy", d / f"{key}.json"
    if npy.is_file() and lens.is_file() and meta.is_file():
        cached = _cached(npy, lens, meta, key=key, seq_len=seq_len)
        if cached is not None:
            return cached
        # unreadable (cut off by a full disk or a kill, edited): built again, as the README says
        # of the cache (an audit: a truncated entry crashed doctor with a traceback, an empty
        # lengths file with a bare "Aborted.")
    if task != "causal-lm":
        raise DoctorError(f"pre-tokenizing for {task} models is not supported by the doctor",
                          "it writes causal-LM token files")
    t0 = time.perf_counter()
    TOKENIZE_CALLS += 1
    data: TokenData = tokenize_rows(read_rows(data_path), tok, seq_len=seq_len, task=task,
                                    text_field=text_field, packing=packing, path=str(data_path),
                                    max_positions=max_positions)
    d.mkdir(parents=True, exist_ok=True)
    vocab = len(tok)
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.int32
    lengths = data.lengths().astype(np.int32)
    tmp = d / f"{key}.{os.getpid()}.tmp.npy"
    arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(len(data), seq_len))
    arr[:] = data.pad_id
    for i, ids in enumerate(data.input_ids):
        arr[i, :len(ids)] = ids
    arr.flush()
    del arr
    tmp_l = d / f"{key}.{os.getpid()}.tmp.lengths.npy"
    np.save(tmp_l, lengths)
    # files appear whole or not at all: another run may be reading the cache at the same time
    os.replace(tmp, npy)
    os.replace(tmp_l, lens)
    build = time.perf_counter() - t0
    meta_d = {"samples": len(data), "seq_len": seq_len, "tokens": int(lengths.sum()), "pad_id": data.pad_id,
              "packed": data.stats.packed, "kind": data.stats.kind, "notes": data.stats.notes,
              "data": str(data_path), "tokenizer": getattr(tok, "name_or_path", type(tok).__name__),
              "dtype": np.dtype(dtype).name, "build_time_s": build,
              "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp_m = d / f"{key}.{os.getpid()}.tmp.json"
    tmp_m.write_text(json.dumps(meta_d, indent=1))
    os.replace(tmp_m, meta)
    return TokenFile(path=npy, lengths_path=lens, key=key, samples=len(data), seq_len=seq_len,
                     tokens=int(lengths.sum()), pad_id=data.pad_id, packed=data.stats.packed,
                     kind=data.stats.kind, reused=False, build_time_s=build, notes=data.stats.notes)


def _cached(npy: Path, lens: Path, meta: Path, *, key: str, seq_len: int) -> TokenFile | None:
    """The cached token file, or None when any of its three files is unreadable or they
    disagree (rows × seq_len, one length a row, each ≤ seq_len)."""
    try:
        m = json.loads(meta.read_text())
        lengths = np.load(lens)
        arr = np.load(npy, mmap_mode="r")
        tf = TokenFile(path=npy, lengths_path=lens, key=key, samples=int(m["samples"]),
                       seq_len=seq_len, tokens=int(m["tokens"]), pad_id=int(m["pad_id"]),
                       packed=bool(m["packed"]), kind=str(m["kind"]), reused=True,
                       build_time_s=0.0, notes=list(m["notes"]))
    except (OSError, ValueError, EOFError, KeyError, TypeError):
        return None  # json.JSONDecodeError is a ValueError; np.load raises all but KeyError
    if arr.shape != (tf.samples, seq_len) or lengths.shape != (tf.samples,) or \
            (lengths.size and (lengths.max() > seq_len or lengths.min() < 0)):
        return None
    return tf


class MemmapTokens(torch.utils.data.Dataset):
    """Samples read from a token file: a slice of a memory map (no tokenizer, no copy of the file
    per worker: the pages are the OS's page cache, shared)."""

    def __init__(self, tf: TokenFile) -> None:
        self.path = str(tf.path)
        self.lengths = np.load(tf.lengths_path)
        self.seq_len = tf.seq_len
        self.pad_id = tf.pad_id
        self.padded = bool((self.lengths < tf.seq_len).any())
        self._arr: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.lengths)

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_arr"] = None  # each worker maps the file itself
        return d

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, None]:
        if self._arr is None or self._pid != os.getpid():
            self._arr = np.load(self.path, mmap_mode="r")
            self._pid = os.getpid()
        n = int(self.lengths[i])
        return i, np.asarray(self._arr[i, :n], dtype=np.int64), None


# --- length-grouped batching -------------------------------------------------------------------

def length_grouped_batches(lengths: np.ndarray, ids: list[int], micro: int, group: int = 50
                           ) -> list[list[int]]:
    """``ids`` (already in the run's order) cut into micro-batches of similar lengths: sorted by
    length within windows of ``group`` micro-batches (HF's LengthGroupedSampler does the same), so
    the order stays random at the scale of an epoch."""
    out: list[list[int]] = []
    win = micro * group
    for k in range(0, len(ids), win):
        chunk = sorted(ids[k:k + win], key=lambda i: -int(lengths[i]))
        out += [chunk[j:j + micro] for j in range(0, len(chunk), micro)]
    return out


def padded_positions(lengths: np.ndarray, batches: list[list[int]], seq_len: int | None,
                     multiple: int = 8) -> int:
    """Positions computed: every sample padded to ``seq_len`` (None: to its batch's longest,
    rounded up to ``multiple``)."""
    total = 0
    for b in batches:
        if seq_len is not None:
            total += len(b) * seq_len
        else:
            longest = max(int(lengths[i]) for i in b)
            total += len(b) * (-(-longest // multiple) * multiple)
    return total


class DynamicPadCollate:
    """Pads a micro-batch to its longest sample (rounded up to 8: fewer distinct shapes)."""

    def __init__(self, pad_id: int, seq_len: int, multiple: int = 8) -> None:
        self.pad_id = pad_id
        self.seq_len = seq_len
        self.multiple = multiple

    def __call__(self, items: list[tuple[int, np.ndarray, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(x[1]) for x in items)
        width = min(-(-longest // self.multiple) * self.multiple, self.seq_len)
        ids = np.full((len(items), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        for k, (_, a, _) in enumerate(items):
            ids[k, :len(a)] = a
            mask[k, :len(a)] = 1
        labels = np.where(mask == 1, ids, -100)
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                "labels": torch.from_numpy(labels),
                "sample_ids": torch.tensor([x[0] for x in items], dtype=torch.int64)}


# --- worker count by measurement ---------------------------------------------------------------

@dataclass(kw_only=True)
class WorkerTrial:
    num_workers: int
    step_time_s: float
    step_time_spread_s: float
    data_wait_fraction: float
    rss_bytes: int


@dataclass(kw_only=True)
class WorkerChoice:
    num_workers: int
    prefetch_factor: int
    persistent_workers: bool
    pin_memory: bool
    trials: list[WorkerTrial]
    ram_budget_bytes: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_workers(measure: Callable[[int], WorkerTrial], *, cuda: bool, cpu_count: int,
                   ram_budget_bytes: int, max_workers: int = 4, enough_fraction: float = 0.05
                   ) -> WorkerChoice:
    """Measure 0, 1, 2 … workers (each a few real steps, ``measure(n)``) until the data wait is
    below ``enough_fraction`` or another worker would not fit the RAM budget; pick the fastest
    median step, preferring fewer workers unless more are faster by more than the spread."""
    trials = [measure(0)]
    reason = ""
    if trials[0].data_wait_fraction < enough_fraction:
        reason = (f"0 workers: the data wait is {trials[0].data_wait_fraction:.1%} of the step "
                  f"(measured) — a worker would only take a core from the compute")
    else:
        base_rss = trials[0].rss_bytes
        for n in range(1, max(1, min(max_workers, cpu_count)) + 1):
            prev = trials[-1]
            per_worker = (prev.rss_bytes - base_rss) / prev.num_workers if prev.num_workers else 0
            if per_worker and base_rss + per_worker * n > ram_budget_bytes:
                reason = f"stopped at {n - 1} workers: {n} would exceed the host RAM budget"
                break
            trials.append(measure(n))
            if trials[-1].data_wait_fraction < enough_fraction:
                break
    best = trials[0]
    for t in trials[1:]:
        if t.step_time_s < best.step_time_s - max(best.step_time_spread_s, t.step_time_spread_s) / 2:
            best = t
    if not reason:
        reason = (f"{best.num_workers} workers: fastest median step of {len(trials)} measured "
                  f"({', '.join(f'{t.num_workers}: {t.step_time_s * 1e3:.1f} ms' for t in trials)})")
    return WorkerChoice(num_workers=best.num_workers, prefetch_factor=2,
                        persistent_workers=best.num_workers > 0, pin_memory=cuda, trials=trials,
                        ram_budget_bytes=ram_budget_bytes, reason=reason)
