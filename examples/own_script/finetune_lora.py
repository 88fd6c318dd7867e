"""A LoRA fine-tune as people write it: transformers' Trainer + peft, a JSONL of text rows.

    python examples/own_script/finetune_lora.py --model /tmp/tiny-llama \
        --data examples/data/tiny_text.jsonl --out /tmp/lora-run

Nothing here knows about trainfit: give the same command after `trainfit plan --gpu t4 --`,
`trainfit tune --device cpu --` or `trainfit doctor --` (see examples/own_script/README.md).
"""

import argparse
import json

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, help="model directory or hub id")
p.add_argument("--data", required=True, help="JSONL with a 'text' field per row")
p.add_argument("--out", required=True)
p.add_argument("--max-length", type=int, default=256)
p.add_argument("--batch-size", type=int, default=2)
p.add_argument("--grad-accum", type=int, default=4)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--lora-r", type=int, default=8)
p.add_argument("--gradient-checkpointing", action="store_true")
a = p.parse_args()

bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
tokenizer = AutoTokenizer.from_pretrained(a.model)
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16 if bf16 else torch.float32)
model = get_peft_model(model, LoraConfig(r=a.lora_r, lora_alpha=2 * a.lora_r, lora_dropout=0.05,
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                         task_type="CAUSAL_LM"))
model.print_trainable_parameters()

with open(a.data) as f:
    rows = [json.loads(line) for line in f if line.strip()]
ds = Dataset.from_list([{"text": r["text"]} for r in rows]).map(
    lambda r: tokenizer(r["text"], truncation=True, max_length=a.max_length),
    remove_columns=["text"])

args = TrainingArguments(
    output_dir=a.out, per_device_train_batch_size=a.batch_size,
    gradient_accumulation_steps=a.grad_accum, gradient_checkpointing=a.gradient_checkpointing,
    bf16=bf16, learning_rate=2e-4, max_steps=a.steps, logging_steps=5, save_strategy="no",
    report_to=[])
trainer = Trainer(model=model, args=args, train_dataset=ds,
                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
trainer.train()
