"""Real training data: read rows, tokenize them, cut them to ``seq_len``, number every sample.

Row kinds (detected per file from the first row):
* text — ``{"text": ...}`` (field name: ``text_field``);
* chat — ``{"messages": [{"role", "content"}, ...]}``, rendered by the tokenizer's chat template;
* pre-tokenized — ``{"input_ids": [...]}`` (optionally ``labels``).

Text rows are **packed**: documents joined with EOS and cut into ``seq_len`` chunks (no padding,
no attention mask; attention crosses document boundaries inside a chunk — the usual pre-training
trade-off, stated in ``DataStats.notes``). Chat and pre-tokenized rows are one sample each,
**truncated** to ``seq_len`` (counted) and padded to ``seq_len`` with a mask and ``-100`` labels.
Every sample has a stable ``sample_id`` so a run can prove each one was consumed exactly once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainfit.job import JobError

_HF_FORMATS = {".csv": "csv", ".parquet": "parquet", ".arrow": "arrow", ".txt": "text"}


class DataError(JobError):
    """Bad dataset: says what is wrong and how to fix it (exit 2)."""


@dataclass(kw_only=True)
class DataStats:
    rows: int
    """Rows read from the file."""
    kind: str
    """text | chat | pretokenized"""
    samples: int
    """Training samples after packing/truncation."""
    tokens: int
    """Non-padding tokens over all samples."""
    truncated_rows: int = 0
    """Rows longer than seq_len, cut to it."""
    dropped_tokens: int = 0
    """Tokens lost: truncation, and the last partial packed chunk."""
    packed: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class TokenData:
    """Samples as token arrays (int64 numpy), each with a stable id (its index)."""

    input_ids: list[np.ndarray]
    labels: list[np.ndarray] | None
    """Seq2seq targets, or causal labels that differ from the inputs (else None)."""
    seq_len: int
    pad_id: int
    stats: DataStats
    padded: bool
    """True when some sample is shorter than seq_len (batches then carry an attention mask)."""

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.input_ids], dtype=np.int64)

    def digest(self) -> str:
        """SHA-256 of the samples in order (each one's length and tokens, and its target's): what
        a resume compares, so the same data moved to another path resumes and other data of the
        same size does not (a run's position counts these samples). Computed once: a large
        dataset's tokens take seconds to hash."""
        import hashlib

        if "_digest" in self.__dict__:
            return str(self.__dict__["_digest"])
        h = hashlib.sha256()
        for i, x in enumerate(self.input_ids):
            h.update(np.int64(len(x)).tobytes())
            h.update(np.ascontiguousarray(x, dtype=np.int64).tobytes())
            if self.labels is not None:
                y = self.labels[i]
                h.update(np.int64(len(y)).tobytes())
                h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
        self.__dict__["_digest"] = h.hexdigest()
        return str(self.__dict__["_digest"])


NEXT_TOKEN_TASKS = ("causal-lm", "custom-lm")
"""Tasks whose loss predicts token t+1 from tokens ≤ t: transformers' causal LMs, and a
``module:factory`` model, trained with the same shifted cross-entropy
(:mod:`trainfit.model.custom`). Their text is packed, and a sample's first token has no label."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """JSON lines read here (exact line numbers in errors); other formats through HF datasets."""
    p = Path(path)
    if not p.exists():
        # where a relative path was looked for (an audit: "check the path" named no folder)
        raise DataError(f"--data {path}: no such file or directory",
                        "check the path" + ("" if p.is_absolute() else
                                            f": a relative path is read from the working "
                                            f"directory ({Path.cwd()}) and, in a job file, from "
                                            "the file's folder"))
    if p.is_dir() or p.suffix.lower() in _HF_FORMATS:
        return _read_with_datasets(p)
    try:
        # utf-8-sig: a byte-order mark (Windows editors write one) is not part of row 1 (an
        # audit: the file was refused as "line 1 is not valid JSON")
        text = p.read_text(encoding="utf-8-sig")
    except (UnicodeDecodeError, OSError) as err:
        raise DataError(f"--data {path}: cannot read it as UTF-8 text ({err})",
                        "give a .jsonl file of rows, or a format HF datasets reads") from None
    if p.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"--data {path}: invalid JSON ({err})",
                            "give JSON lines (one object per line, .jsonl) or one JSON array") from None
    else:
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataError(f"--data {path}: line {i} is not valid JSON ({err.msg})",
                                "one JSON object per line (JSONL)") from None
    if not rows:
        raise DataError(f"--data {path}: the dataset is empty", "give a file with at least one row")
    for i, r in enumerate(rows, 1):
        if not isinstance(r, dict):
            raise DataError(f"--data {path}: row {i} is not a JSON object",
                            'rows look like {"text": ...} or {"messages": [...]}')
    return rows


def _read_with_datasets(p: Path) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"--data {p}: reading this format needs HF datasets",
                        "pip install datasets, or convert the data to JSONL") from None
    try:
        if p.is_dir():
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(_HF_FORMATS[p.suffix.lower()], data_files=str(p),
                                       split="train")
    except Exception as err:  # datasets raises many types for unreadable files
        raise DataError(f"--data {p}: HF datasets cannot read it ({type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''})",
                        "convert the data to JSONL (text, messages or input_ids rows)") from None
    if isinstance(ds, dict):
        ds = ds["train"]
    rows = [dict(r) for r in ds]
    if not rows:
        raise DataError(f"--data {p}: the dataset is empty", "give a file with at least one row")
    return rows


def _kind(rows: list[dict[str, Any]], text_field: str, path: str) -> str:
    first = rows[0]
    if "input_ids" in first:
        return "pretokenized"
    if "messages" in first:
        return "chat"
    if text_field in first:
        return "text"
    raise DataError(f"--data {path}: row 1 has no {text_field!r}, 'messages' or 'input_ids' field "
                    f"(fields: {', '.join(sorted(first)) or 'none'})",
                    "name the text field with --text-field")


def _field(row: dict[str, Any], name: str, i: int, path: str) -> Any:
    if name not in row:
        raise DataError(f"--data {path}: row {i} has no {name!r} field",
                        "every row needs the same fields as the first one")
    return row[name]


def _content_ok(m: dict[str, Any]) -> bool:
    c = m.get("content")
    return (isinstance(c, str) or (isinstance(c, list) and all(isinstance(p, dict) for p in c))
            or (c is None and bool(m.get("tool_calls"))))


def _chat_ids(tok: Any, messages: Any, i: int, path: str) -> list[int]:
    # each message a {"role": str, "content": ...}: a list of strings ended in an
    # AttributeError, a missing or numeric content was trained on as the template rendered it
    # (an audit). Content is text, a list of parts ([{"type": "text", "text": ...}]), or null
    # beside an assistant's tool_calls — what chat templates render (a review)
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and _content_ok(m)
            for m in messages):
        raise DataError(f"--data {path}: row {i}: 'messages' must be a non-empty list of "
                        '{"role": str, "content": text or a list of parts}',
                        'e.g. {"messages": [{"role": "user", "content": "hi"}, '
                        '{"role": "assistant", "content": "hello"}]}')
    out = tok.apply_chat_template(messages, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def _seq2seq_pair(tok: Any, row: dict[str, Any], kind: str, text_field: str, i: int, path: str
                  ) -> tuple[list[int], list[int]]:
    """Encoder input and decoder target: chat → the last assistant turn is the target; text → the
    text is both (a reconstruction objective, stated in the notes)."""
    if kind == "chat":
        msgs = _field(row, "messages", i, path)
        last = max((j for j, m in enumerate(msgs) if m.get("role") == "assistant"), default=None)
        if last is None:
            raise DataError(f"--data {path}: row {i} has no assistant turn to learn",
                            "seq2seq models learn the last assistant message of each row")
        prompt = "\n".join(f"{m['role']}: {m['content']}" for m in msgs[:last])
        return tok(prompt)["input_ids"], tok(msgs[last]["content"])["input_ids"]
    text = str(_field(row, text_field, i, path))
    ids = tok(text)["input_ids"]
    return ids, list(ids)


def _row_ids(row: dict[str, Any], tok: Any, kind: str, text_field: str, eos: int | None, i: int,
             path: str) -> list[int]:
    """One causal row's token ids: pre-tokenized, a chat rendered by its template, or text + EOS."""
    if kind == "pretokenized":
        ids = _field(row, "input_ids", i, path)
        # a bool is an int to Python; a negative id indexed the embedding from its end, or
        # failed in the step with an IndexError (an audit)
        if not isinstance(ids, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ids):
            raise DataError(f"--data {path}: row {i}: input_ids must be a list of token ids "
                            "(integers ≥ 0)",
                            'e.g. {"input_ids": [1, 2, 3]} (token ids of the model\'s tokenizer)')
        return ids
    if kind == "chat":
        return _chat_ids(tok, _field(row, "messages", i, path), i, path)
    text = _field(row, text_field, i, path)
    if not isinstance(text, str):
        raise DataError(f"--data {path}: row {i}: {text_field!r} must be a string",
                        f'e.g. {{"{text_field}": "some text"}}, or --text-field NAME')
    return list(tok(text)["input_ids"]) + ([eos] if eos is not None else [])


def _sequences(rows: list[dict[str, Any]], tok: Any, *, kind: str, task: str, text_field: str,
               eos: int | None, path: str) -> tuple[list[list[int]], list[list[int]] | None]:
    """Every row's input ids, and its target ids where the task has targets (seq2seq)."""
    seqs: list[list[int]] = []
    targets: list[list[int]] | None = [] if task == "seq2seq-lm" else None
    for i, row in enumerate(rows, 1):
        if targets is not None and kind != "pretokenized":
            src, tgt = _seq2seq_pair(tok, row, kind, text_field, i, path)
            seqs.append(src)
            targets.append(tgt)
            continue
        ids = _row_ids(row, tok, kind, text_field, eos, i, path)
        seqs.append(ids)
        if targets is not None:
            targets.append(list(row.get("labels", ids)))
    return seqs, targets


def tokenize_rows(rows: list[dict[str, Any]], tok: Any, *, seq_len: int, task: str,
                  text_field: str = "text", packing: bool | None = None, path: str = "data",
                  max_positions: int | None = None) -> TokenData:
    """Tokenize every row (eagerly: the training loop then never waits for the tokenizer)."""
    if seq_len <= 0:
        raise DataError(f"--seq-len {seq_len}: must be ≥ 1", "e.g. --seq-len 512")
    if max_positions is not None and seq_len > max_positions:
        raise DataError(f"--seq-len {seq_len}: longer than the model's limit of {max_positions} "
                        "positions", f"use --seq-len ≤ {max_positions}")
    kind = _kind(rows, text_field, path)
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    seqs, targets = _sequences(rows, tok, kind=kind, task=task, text_field=text_field, eos=eos,
                               path=path)
    if not any(seqs):
        raise DataError(f"--data {path}: every row is empty after tokenization",
                        "check that the rows hold text (--text-field names its field)")
    vocab_hi = max((max(s) for s in seqs if s), default=0)
    if vocab_hi >= len(tok) and kind == "pretokenized":
        raise DataError(f"--data {path}: token id {vocab_hi} is outside the tokenizer's "
                        f"vocabulary ({len(tok)})", "re-tokenize with the model's tokenizer")
    if packing and task not in NEXT_TOKEN_TASKS:
        raise DataError(f"packing: true: a {task} model's samples are not one token stream "
                        "(packing joins documents for next-token prediction)",
                        "drop packing (or set packing: false)")
    pack = (kind == "text" and task in NEXT_TOKEN_TASKS) if packing is None else packing
    if pack:
        return _packed(seqs, rows=len(rows), kind=kind, seq_len=seq_len, pad=int(pad), path=path)
    return _unpacked(seqs, targets, rows=len(rows), kind=kind, task=task, seq_len=seq_len,
                     pad=int(pad), path=path)


def _packed(seqs: list[list[int]], *, rows: int, kind: str, seq_len: int, pad: int, path: str
            ) -> TokenData:
    """Documents joined (each already ends in EOS) and cut into full chunks of seq_len."""
    total_in = sum(len(s) for s in seqs)
    flat = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=total_in)
    n_chunks = len(flat) // seq_len
    if n_chunks == 0:
        raise DataError(f"--data {path}: {len(flat)} tokens in all, fewer than one "
                        f"sequence of {seq_len}", "add data or lower --seq-len")
    ids = [flat[k * seq_len:(k + 1) * seq_len] for k in range(n_chunks)]
    notes = [f"packed: {rows} documents joined with EOS into {n_chunks} sequences of "
             f"{seq_len} tokens; attention crosses document boundaries inside a sequence"]
    stats = DataStats(rows=rows, kind=kind, samples=n_chunks, tokens=n_chunks * seq_len,
                      dropped_tokens=len(flat) - n_chunks * seq_len, packed=True, notes=notes)
    return TokenData(ids, None, seq_len, pad, stats, padded=False)


def _unpacked(seqs: list[list[int]], targets: list[list[int]] | None, *, rows: int, kind: str,
              task: str, seq_len: int, pad: int, path: str) -> TokenData:
    """One sample per row, cut to seq_len (counted); padded per batch when shorter."""
    notes: list[str] = []
    if targets is not None and kind == "text":
        # said, as _seq2seq_pair's docstring promised (an audit: T5 on text rows learned to
        # copy its input, unsaid)
        notes.append("text rows for a seq2seq model: each row is both the encoder's input and "
                     "the decoder's target (it learns to reproduce its input); chat rows "
                     "(messages) give it a prompt and a response to learn")
    total_in = sum(len(s) for s in seqs)
    if targets is None and task in NEXT_TOKEN_TASKS:
        # a sample of one token predicts nothing: a micro-batch of such samples has no label
        # token, its loss is 0/0, and the run stopped as "diverged — lower the lr" (an audit)
        short = sum(len(s) < 2 for s in seqs)
        if short == len(seqs):
            raise DataError(f"--data {path}: every row has fewer than 2 tokens after "
                            "tokenization: nothing to predict",
                            "check that the rows hold text (--text-field names its field)")
        if short:
            seqs = [s for s in seqs if len(s) >= 2]
            notes.append(f"{short} of {rows} rows have fewer than 2 tokens (nothing to "
                         "predict): left out")
    # a row counts once, whether its input, its target or both are cut
    long_in = [len(s) > seq_len for s in seqs]
    long_tgt = [len(t) > seq_len for t in targets] if targets is not None else [False] * len(seqs)
    truncated = sum(a or b for a, b in zip(long_in, long_tgt, strict=True))
    ids = [np.asarray(s[:seq_len], dtype=np.int64) for s in seqs]
    labels = [np.asarray(t[:seq_len], dtype=np.int64) for t in targets] if targets is not None \
        else None
    kept = sum(len(x) for x in ids)
    if truncated:
        where = (f" ({sum(long_in)} inputs, {sum(long_tgt)} targets)" if targets is not None
                 else "")
        notes.append(f"{truncated} of {rows} rows longer than seq_len {seq_len}{where}: "
                     "truncated (their tail is not learned)")
    stats = DataStats(rows=rows, kind=kind, samples=len(ids), tokens=kept,
                      truncated_rows=truncated, dropped_tokens=total_in - kept, notes=notes)
    padded = any(len(x) < seq_len for x in ids) or (
        labels is not None and any(len(x) < seq_len for x in labels))
    return TokenData(ids, labels, seq_len, pad, stats, padded=padded)
