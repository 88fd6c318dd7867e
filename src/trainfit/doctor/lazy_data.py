"""Seed 003's data path, for measuring it: every ``__getitem__`` reads its row from the file,
parses it and tokenizes it, in whichever process iterates the loader (``num_workers=0``: the
training process, between steps). A trainfit job takes it with ``doctor: {tokenize: lazy}`` in its
YAML; trainfit's own pipeline tokenizes once up front (``trainfit.data.tokenize_rows``).

One row = one sample, truncated to ``seq_len`` and padded (with an attention mask), as such loaders
do; the doctor's fix (pre-tokenize + pack, :mod:`trainfit.doctor.fixes`) keeps every token instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainfit.data.dataset import DataError


class LazyRows(torch.utils.data.Dataset):
    def __init__(self, path: str | Path, tokenizer: Any, seq_len: int, text_field: str = "text") -> None:
        self.path = str(path)
        self.tok = tokenizer
        self.seq_len = seq_len
        self.text_field = text_field
        self._fh: Any = None
        self._fh_pid = -1
        p = Path(path)
        if not p.is_file() or p.suffix.lower() not in (".jsonl", ".json"):
            raise DataError(f"--data {path}: lazy tokenization reads JSON lines files",
                            "give a .jsonl of text or chat rows, or drop doctor.tokenize: lazy")
        # byte offsets of the non-empty lines: the only pass over the file before training
        self.offsets: list[int] = []
        pos = 0
        with open(p, "rb") as f:
            for line in f:
                if line.strip():
                    self.offsets.append(pos)
                pos += len(line)
        if not self.offsets:
            raise DataError(f"--data {path}: the dataset is empty", "give a JSONL with rows")
        first = json.loads(self._line(0))
        self.kind = "chat" if "messages" in first else "text"
        if self.kind == "text" and text_field not in first:
            raise DataError(f"--data {path}: row 1 has no {text_field!r} field",
                            "name the text field with text_field")
        self.eos = tokenizer.eos_token_id
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos or 0)
        self.padded = True  # rows shorter than seq_len are padded: batches carry a mask

    def __len__(self) -> int:
        return len(self.offsets)

    def _line(self, i: int) -> bytes:
        if self._fh is None or self._fh_pid != os.getpid():  # one handle per worker process
            self._fh = open(self.path, "rb")  # kept open across items
            self._fh_pid = os.getpid()
        self._fh.seek(self.offsets[i])
        return self._fh.readline()

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_fh"] = None
        return d

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, None]:
        row = json.loads(self._line(i))
        if self.kind == "chat":
            out = self.tok.apply_chat_template(row["messages"], tokenize=True)
            ids = list(out["input_ids"] if hasattr(out, "keys") else out)
        else:
            ids = list(self.tok(str(row[self.text_field]))["input_ids"])
            if self.eos is not None:
                ids.append(self.eos)
        return i, np.asarray(ids[:self.seq_len], dtype=np.int64), None
