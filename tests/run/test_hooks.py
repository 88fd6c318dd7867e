"""Library use: the HF Trainer callback and the plain-loop hook log real step metrics."""

import json

import pytest
import torch


def test_watch_hook_logs_and_splits_on_oom(tmp_path):
    from trainfit import watch

    calls = []

    def step_fn(chunk, weight):
        calls.append(chunk["x"].shape[0])
        if chunk["x"].shape[0] > 2:
            raise torch.OutOfMemoryError("fake OOM (as accelerate's tests fake it)")
        return float(chunk["x"].sum()) * weight

    log = tmp_path / "m.jsonl"
    with watch(log, interval_s=0.05, live=False) as hook:
        batch = {"x": torch.arange(8.0).reshape(8, 1)}
        loss = hook.split_on_oom(step_fn, batch)
        hook.step(loss=loss, tokens=80, samples=8)
    assert calls == [8, 4, 2, 2, 2, 2]  # 8 → OOM; the first half (4) → OOM; quarters fit
    assert hook.oom_splits == 2
    assert loss == pytest.approx(sum(range(8)) * 2 / 8)
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert rows and any(r["step"] == 1 for r in rows)


def test_trainfit_callback_in_hf_trainer(tmp_path, tiny_gpt2):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from trainfit import TrainfitCallback

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_gpt2.config)
    ids = torch.randint(0, 2000, (8, 16))
    ds = [{"input_ids": r, "labels": r} for r in ids]
    log = tmp_path / "m.jsonl"
    cb = TrainfitCallback(log_path=log, interval_s=0.05, seq_len=16)
    args = TrainingArguments(output_dir=str(tmp_path / "o"), per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, max_steps=2, logging_steps=1,
                             report_to=[], use_cpu=True, save_strategy="no")
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert max(r["step"] or 0 for r in rows) == 2
    assert any(r["tokens_per_s"] for r in rows)
