"""Tokenizers: the model's own (a model dir or hub id), or a built-in byte-level one.

The built-in tokenizer lets catalog models train on real text with no download: one token per
UTF-8 byte (256 ids) plus pad/bos/eos, so any model with a vocabulary ≥ 259 accepts its ids.
Sequences come out ~4× longer in tokens than with a trained BPE; memory and speed depend only on
the token count, which is what ``seq_len`` fixes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainfit.job import JobError

BUILTIN = "builtin-bytes"
_CHAT_TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}<|eos|>"
                  "{% endfor %}{% if add_generation_prompt %}<|bos|>assistant: {% endif %}")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def builtin_tokenizer() -> Any:
    """Byte-level tokenizer built from ``tokenizers`` parts (no files, no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for special in ("<|pad|>", "<|bos|>", "<|eos|>"):
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>",
                                   eos_token="<|eos|>")
    fast.chat_template = _CHAT_TEMPLATE
    fast.name_or_path = BUILTIN
    return fast


def load_tokenizer(spec: str | None, model: str, origin: str, vocab_size: int,
                   trust_remote_code: bool = False) -> Any:
    """``spec``: a tokenizer dir / hub id, ``builtin-bytes``, or None = the model's own when it has
    one (model dir with tokenizer files, or a hub id), else the built-in one."""
    if spec is None:
        p = Path(model)
        d = p.parent if p.is_file() else p
        if origin == "local" and any((d / f).exists() for f in _TOKENIZER_FILES):
            spec = str(d)
        elif origin == "hub":
            spec = model
        else:
            spec = BUILTIN
    if spec == BUILTIN:
        tok = builtin_tokenizer()
    else:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as err:
            raise JobError(f"--tokenizer {spec}: cannot load it ({str(err).splitlines()[0]})",
                           f"give a local tokenizer dir, or --tokenizer {BUILTIN}") from None
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token or tok.unk_token
    if len(tok) > vocab_size:
        # pre-tokenized rows need it too: its pad and end-of-text ids are embedded
        raise JobError(f"tokenizer {spec} has {len(tok):,} tokens but the model's vocabulary is "
                       f"{vocab_size:,}",
                       f"use the model's own tokenizer, or --tokenizer {BUILTIN}"
                       if spec != BUILTIN else
                       f"the built-in byte tokenizer needs a vocabulary of at least {len(tok):,} "
                       "(its pad and end-of-text ids are embedded, pre-tokenized rows too): give "
                       "the model's own tokenizer (--tokenizer DIR, or tokenizer: in the job "
                       "file), or a model with a larger vocab_size")
    return tok
