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
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb])
    trainer.train()
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert max(r["step"] or 0 for r in rows) == 2
    assert any(r["tokens_per_s"] for r in rows)
    # the loss of the last step is the trainer's logged loss of that step, not the previous
    # window's (transformers calls on_step_end before on_log: a review)
    logged = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    last = [r for r in rows if r["step"] == 2 and r["loss"] is not None]
    assert last and last[-1]["loss"] == pytest.approx(logged[2])
    assert logged[2] != pytest.approx(logged[1])  # the two steps' losses tell the two apart


def test_trainfit_callback_samples_on_the_main_process_only(tmp_path):
    """Every rank runs the callbacks: a rank that is not the world's main process neither opens
    nor writes the log (each rank truncated and interleaved the one file: a review)."""
    from types import SimpleNamespace

    from trainfit import TrainfitCallback

    log = tmp_path / "m.jsonl"
    cb = TrainfitCallback(log_path=log, interval_s=0.05, seq_len=16)
    args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=1,
                           world_size=2)
    state = SimpleNamespace(is_world_process_zero=False, global_step=0)
    cb.on_train_begin(args, state, None)
    for step in (1, 2):
        cb.on_step_begin(args, state, None)
        state.global_step = step
        cb.on_step_end(args, state, None)
        cb.on_log(args, state, None, logs={"loss": 1.0})
    cb.on_train_end(args, state, None)
    assert not log.exists()
