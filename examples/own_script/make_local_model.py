"""Write a small model to a local directory, as `save_pretrained` would have: config.json, random
weights (safetensors) and a tokenizer — so the own-script examples run with no download.

    python examples/own_script/make_local_model.py /tmp/tiny-llama

A Llama-shaped causal LM (hidden 256, 4 layers, 8 heads, 2 key/value heads: 2.8 M parameters)
and a character-level tokenizer (one token per printable ASCII character, with <pad>, <s>, </s>,
<unk>). Your own model directory, or a hub id, takes its place in the scripts' --model.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def write_tokenizer(out: Path) -> None:
    # tokenizers' WordLevel model over single characters: a real fast tokenizer, saved as
    # transformers saves one, with no vocabulary file to download
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({chr(c): c - 28 for c in range(32, 127)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    t = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                eos_token="</s>", unk_token="<unk>")
    t.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    t.save_pretrained(str(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="directory to write (created; must not hold a model)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if (a.out / "config.json").exists():
        p.error(f"{a.out} already holds a model (config.json); choose another directory")

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, vocab_size=128,
                      max_position_embeddings=1024, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(a.out))
    write_tokenizer(a.out)
    n = sum(t.numel() for t in model.parameters())
    print(f"wrote {a.out}: {cfg.model_type}, {n / 1e6:.1f} M parameters, tokenizer")


if __name__ == "__main__":
    main()
