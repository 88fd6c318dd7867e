"""Tiny training scripts written like the seeds' (000: transformers Trainer + peft LoRA on a Gemma;
001: TRL SFTTrainer QLoRA with device_map="auto" on chat data; 002: a T5 Seq2SeqTrainer SFT), and
the local models and data they train (configurations and tokenizers written to a directory, data
generated: no hub). ``--args-json`` / ``--load-json`` change keywords the way a user edits the
script (the diff trainfit prints is applied through them)."""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED000 = '''
"""fine_tune_gemma.py (seed 000's shape): Trainer + peft LoRA, bf16, 2 x 4, checkpointing on;
--qlora: a 4-bit base and prepare_model_for_kbit_training(use_gradient_checkpointing=True)."""
import argparse, json
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import (AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig,
                          DataCollatorForLanguageModeling, Trainer, TrainingArguments)

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--data", required=True)
p.add_argument("--out", required=True)
p.add_argument("--args-json", default="{}")
p.add_argument("--load-json", default="{}")
p.add_argument("--qlora", action="store_true")
a = p.parse_args()
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(a.model)
load = {"dtype": torch.bfloat16}
if a.qlora:
    load["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
load.update({k: getattr(torch, v.removeprefix("torch.")) if k == "dtype" else v
             for k, v in json.loads(a.load_json).items()})
model = AutoModelForCausalLM.from_pretrained(a.model, **load)
if a.qlora:
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05,
                                         target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
rows = [json.loads(line) for line in open(a.data)]
ds = Dataset.from_list(rows).map(lambda r: tokenizer(r["text"], truncation=True, max_length=96),
                                 remove_columns=["text"])
args = dict(output_dir=a.out, per_device_train_batch_size=2, gradient_accumulation_steps=4,
            gradient_checkpointing=True, bf16=True, optim="adamw_torch_fused", max_steps=10,
            learning_rate=2e-4, logging_steps=1, save_strategy="no", report_to=[])
args.update(json.loads(a.args_json))
trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=ds,
                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
trainer.train()
'''

SEED001 = '''
"""sft_granite.py (seed 001's shape): TRL SFTTrainer, QLoRA nf4, device_map="auto", chat rows."""
import argparse, json
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from trl import SFTConfig, SFTTrainer

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--data", required=True)
p.add_argument("--out", required=True)
p.add_argument("--no-4bit", action="store_true")
p.add_argument("--max-memory", type=int, default=None, help="bytes for GPU 0")
p.add_argument("--args-json", default="{}")
a = p.parse_args()
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(a.model)
load = dict(device_map="auto", dtype=torch.bfloat16)
if not a.no_4bit:
    load["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16)
if a.max_memory:
    load["max_memory"] = {0: a.max_memory, "cpu": 8 * 2**30}
model = AutoModelForCausalLM.from_pretrained(a.model, **load)
rows = [json.loads(line) for line in open(a.data)]
cfg = dict(output_dir=a.out, per_device_train_batch_size=1, gradient_accumulation_steps=8,
           gradient_checkpointing=True, max_length=128, packing=False, bf16=True,
           dataloader_pin_memory=False, max_steps=10, logging_steps=1, save_strategy="no",
           report_to=[])
cfg.update(json.loads(a.args_json))
trainer = SFTTrainer(model=model, args=SFTConfig(**cfg), train_dataset=Dataset.from_list(rows),
                     processing_class=tokenizer,
                     peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                            task_type="CAUSAL_LM"))
trainer.train()
'''

SEED002 = '''
"""train_sft.py (seed 002's shape: ChatLM-mini-Chinese is a T5): Seq2SeqTrainer, fp32, 4 x 2."""
import argparse, json
import torch
from datasets import Dataset
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq,
                          Seq2SeqTrainer, Seq2SeqTrainingArguments)

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--data", required=True)
p.add_argument("--out", required=True)
p.add_argument("--args-json", default="{}")
a = p.parse_args()
torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(a.model)
model = AutoModelForSeq2SeqLM.from_pretrained(a.model)

def tok(r):
    x = tokenizer(r["prompt"], truncation=True, max_length=64)
    x["labels"] = tokenizer(text_target=r["response"], truncation=True, max_length=32)["input_ids"]
    return x

rows = [json.loads(line) for line in open(a.data)]
ds = Dataset.from_list(rows).map(tok, remove_columns=["prompt", "response"])
cfg = dict(output_dir=a.out, per_device_train_batch_size=4, gradient_accumulation_steps=2,
           learning_rate=5e-4, max_steps=10, logging_steps=1, save_strategy="no", report_to=[])
cfg.update(json.loads(a.args_json))
trainer = Seq2SeqTrainer(model=model, args=Seq2SeqTrainingArguments(**cfg), train_dataset=ds,
                         data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
trainer.train()
'''

CONFIGS = {
    "gemma": dict(model_type="gemma", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=128,
                  max_position_embeddings=256),
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                  max_position_embeddings=256),
    # Gemma-3 4B+'s shape: the language model in text_config beside a SigLIP vision tower
    "gemma3": dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"],
                   text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                    vocab_size=128, max_position_embeddings=256,
                                    sliding_window=32),
                   vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, image_size=28, patch_size=14,
                                      vision_use_head=False),
                   mm_tokens_per_image=4, image_token_index=127, boi_token_index=125,
                   eoi_token_index=126),
    "t5": dict(model_type="t5", d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2,
               num_heads=4, d_kv=16, vocab_size=128, decoder_start_token_id=0),
}


def write_tokenizer(d: Path) -> None:
    """A character-level tokenizer (one token per printable ASCII character, no special tokens
    added): a text's token count is its length."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({chr(c): c - 28 for c in range(32, 127)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    t = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                eos_token="</s>", unk_token="<unk>")
    t.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    t.save_pretrained(str(d))


def write_model(root: Path, name: str) -> Path:
    """``root/tiny-<name>``: config, random weights (safetensors) and the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    d = root / f"tiny-{name}"
    cfg = AutoConfig.for_model(**CONFIGS[name], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    cls = AutoModelForSeq2SeqLM if name == "t5" else AutoModelForCausalLM
    cls.from_config(cfg).save_pretrained(str(d))
    write_tokenizer(d)
    return d


def text_rows(n: int = 48, lo: int = 20, hi: int = 90, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"text": "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(lo, hi)))}
            for _ in range(n)]


def chat_rows(n: int = 40, seed: int = 1) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [{"messages": [{"role": "user", "content": "q" * rng.randint(5, 40)},
                          {"role": "assistant", "content": "a" * rng.randint(10, 120)}]}
            for _ in range(n)]


def pair_rows(n: int = 32, seed: int = 2) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"prompt": "p" * rng.randint(10, 70), "response": "r" * rng.randint(5, 30)}
            for _ in range(n)]


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
