"""Seed 003's training loop, shrunk for a CPU: its own GPT pretraining with a Dataset that reads,
parses and tokenizes each row in ``__getitem__`` (ByT5's tokenizer: pure Python), num_workers=0.

``--fixed`` is the doctor's printed fix applied by hand: tokenize once into a memory-mapped token
file (keyed by a hash of tokenizer + data + seq_len, reused across runs), packed into full sequences.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from common import DATA, StepTimes, args, model_and_optimizer
from transformers import ByT5Tokenizer


class TokenizeOnTheFly(torch.utils.data.Dataset):
    def __init__(self, path: Path, tok: ByT5Tokenizer, seq_len: int) -> None:
        self.lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        self.tok, self.seq_len = tok, seq_len

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.tok(json.loads(self.lines[i])["text"])["input_ids"][:self.seq_len]
        x = torch.full((self.seq_len,), self.tok.pad_token_id)
        x[:len(ids)] = torch.tensor(ids)
        mask = (torch.arange(self.seq_len) < len(ids)).long()
        return {"input_ids": x, "attention_mask": mask, "labels": x.masked_fill(mask == 0, -100)}


class TokenFile(torch.utils.data.Dataset):
    def __init__(self, path: Path, tok: ByT5Tokenizer, seq_len: int) -> None:
        key = hashlib.sha256(path.read_bytes() + f"{type(tok).__name__}/{len(tok)}/{seq_len}".encode())
        cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"seed003-tokens-{key.hexdigest()[:16]}.npy"
        if not cache.is_file():
            flat = [t for ln in path.read_text().splitlines() if ln.strip()
                    for t in tok(json.loads(ln)["text"])["input_ids"]]
            n = len(flat) // seq_len
            np.save(cache, np.asarray(flat[:n * seq_len], dtype=np.uint16).reshape(n, seq_len))
        self.arr = np.load(cache, mmap_mode="r")

    def __len__(self) -> int:
        return len(self.arr)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.from_numpy(self.arr[i].astype(np.int64))
        return {"input_ids": x, "labels": x}


def main() -> None:
    a = args(__doc__ or "", micro_batch=32, seq_len=32, steps=30, model="micro_llama")
    torch.set_num_threads(a.threads)
    tok = ByT5Tokenizer()
    model, opt = model_and_optimizer(a.model)
    ds = (TokenFile if a.fixed else TokenizeOnTheFly)(DATA, tok, a.seq_len)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.micro_batch, shuffle=True, num_workers=0)
    clock, step = StepTimes(), 0
    while step < a.steps:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            step += 1
            clock.tick()
            if step % 10 == 0:
                print(f"step {step} loss {loss.item():.4f}")
            if step >= a.steps:
                break
    clock.write(a.times_out)


if __name__ == "__main__":
    main()
