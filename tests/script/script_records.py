"""A trainer's record as the script front door reads it (:mod:`trainfit.script.read`), for the
mapping's tests."""

from __future__ import annotations

import copy


def record(**over) -> dict:
    """seed 000's record (Trainer, LoRA on a bf16 Gemma, bf16=True, 2 × 4, checkpointing on)."""
    r = {
        "trainer": "Trainer", "mode": "plan", "ckpt_calls": [], "device_maps": [], "optimizer": None,
        "args": {"class": "TrainingArguments", "optim": "adamw_torch_fused",
                 "has_activation_checkpointing": True, "per_device_train_batch_size": 2,
                 "gradient_accumulation_steps": 4, "world_size": 1, "bf16": True, "fp16": False,
                 "learning_rate": 2e-4, "max_grad_norm": 1.0, "seed": 42, "weight_decay": 0.0,
                 "dataloader_num_workers": 0, "dataloader_pin_memory": True,
                 "dataloader_persistent_workers": False, "dataloader_prefetch_factor": None,
                 "torch_compile": False, "gradient_checkpointing_kwargs": None, "max_length": None,
                 "max_seq_length": None, "packing": None, "padding_free": None,
                 "packing_strategy": None, "gradient_checkpointing": True},
        "model": {"class": "GemmaForCausalLM", "task": "causal-lm", "name_or_path": "/m/gemma",
                  "config": {"dtype": "bfloat16"}, "device": "meta", "attn_implementation": "sdpa",
                  "total_params": 81472, "trainable_params": 3328, "quantized_params": 0,
                  "params_by_dtype": [], "frozen_dtype": "bfloat16", "trainable_dtype": "float32",
                  "gradient_checkpointing": False, "quantization": None, "loaded_in_4bit": False,
                  "loaded_in_8bit": False},
        "lora": {"type": "LoraConfig", "r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
                 "target_modules": ["q_proj", "v_proj"], "modules_to_save": [], "use_dora": False,
                 "bias": "none", "use_rslora": False, "adapted": ["a", "b", "c", "d"]},
        "loads": [{"this_model": True, "dtype": "torch.bfloat16", "at": "train.py:19"}],
        "lengths": {"dataset_samples": 6, "samples_read": 6, "sample_lengths": [10, 20, 30, 40, 50, 90],
                    "sample_label_lengths": [],
                    "batches": [{"rows": 2, "length": n, "label_length": n, "tokens": n,
                                 "padded": True, "position_ids": False} for n in (20, 40, 90)],
                    "batches_read": 3, "batches_total": 3, "keys": ["input_ids"]},
    }
    for path, value in over.items():
        *head, last = path.split("__")
        d = r
        for k in head:
            d = d[k]
        d[last] = value
    return copy.deepcopy(r)
