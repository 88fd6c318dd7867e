"""``trainfit tune -- python train.py``: the script's own trainer probed on the CPU stand-in — the
pick equal to ``trainfit tune`` of the equivalent job file, the effective batch exact, a forced
OOM survived, the trainer's weights restored between probes."""

from __future__ import annotations

import json

import pytest
import torch
from script_seeds import text_rows, write_jsonl
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.job import JobError, JobSpec

LIMIT = "2.8MiB"
"""Between the measured peaks of micro-batch 4 (1.7 MB) and 8 (3.2 MB) of these scripts' LoRA
Gemma at 64 tokens: 8 runs out of memory (the forced OOM), 4 fits under the 10 % margin."""
FLAGS = ["--json", "--memory-limit", LIMIT, "--grad-ckpt", "off", "--knobs", "grad_ckpt"]
"""Checkpointing fixed: the pick is then decided by memory (the largest micro-batch that fits) and
by interleaved speed rounds against smaller ones, not by a knob inside the CPU's noise."""


def _tune(args: list[str]) -> dict:
    res = CliRunner().invoke(app, ["tune", *FLAGS, *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _knobs(p: dict) -> tuple:
    return p["micro_batch"], p["grad_accum"], p["grad_ckpt"], p["precision"]


def _pick(t: dict) -> tuple:
    return _knobs(t["pick"])


def test_tune_on_the_script_equals_tune_of_the_job_file(seed000, tmp_path):
    rows = text_rows(n=32, lo=64, hi=64)  # one length: the job file's data is the same batches
    write_jsonl(seed000.data, rows)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(seed000.model))
    ids = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": tok(r["text"])["input_ids"]}
                                               for r in rows])
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "model": str(seed000.model), "method": "lora", "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_targets": ["q_proj", "v_proj"], "precision": "amp-bf16",
        "base_dtype": "bf16",  # the script's from_pretrained(dtype=torch.bfloat16)
        "seq_len": 64, "micro_batch": 4, "grad_accum": 2, "data": str(ids),
        "tokenizer": str(seed000.model)}))
    # both start from 4 × 2 (the script through its own arguments): the pick is then the start,
    # and no interleaved rounds against a slower start are needed (they cost minutes here)
    got = _tune(["--", *seed000.cmd("--args-json", json.dumps(
        {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}))])
    want = _tune([str(job)])
    t = got["tune"]
    assert got["job"]["seq_len"] == 64 and got["job"]["effective_batch"] == 8
    assert _pick(t) == _pick(want) == (4, 2, "off", "amp-bf16")
    for d in (t, want):
        assert all(p["micro_batch"] * p["grad_accum"] == 8 for p in d["probes"])  # exact
        oom = [p for p in d["probes"] if p["status"] == "oom"]
        assert [p["micro_batch"] for p in oom] == [8]  # the forced OOM, survived: the search went on
        assert d["pick"]["measured"]["peak_allocated_bytes"] <= 0.9 * d["memory_limit_bytes"]
    ours, theirs = (d["pick"]["measured"]["peak_allocated_bytes"] for d in (t, want))
    # the script's own step (HF Trainer) and trainfit's both release the logits before the
    # backward: measured within 5 % of each other (here +0.5 %: the Trainer's own small tensors)
    assert abs(ours / theirs - 1) <= 0.05
    assert t["probes"][0]["stage"] == "baseline" and _knobs(t["baseline"]) == (4, 2, "off", "amp-bf16")
    # the script's own batch is the pick; its checkpointing (on) differs from the command line's
    # --grad-ckpt off, so the change says to switch it off there (QA: a flag that set a knob was
    # said as 'no change', the script left as it was)
    assert got["change_lines"] == ["TrainingArguments: gradient_checkpointing=False"]
    # measured and predicted tokens/s count the same tokens: the script's per step, over each
    # one's step time (an audit: non-padding measured beside positions predicted)
    timed = [p for p in t["probes"] if p["status"] == "ok" and p["measured"]["tokens_per_s"]]
    per_step = {round(p["measured"]["tokens_per_s"] * p["measured"]["step_time_s"]) for p in timed}
    assert len(per_step) == 1
    (tokens,) = per_step
    for p in timed:
        pr = p["predicted"]
        assert pr["tokens_per_s"] * pr["step_time_s"] == pytest.approx(tokens, rel=1e-3)


def test_a_scripts_predicted_tokens_per_s_counts_what_its_probes_count():
    """The predictor counts positions at the longest sample; the probes the script's non-padding
    tokens: each prediction is put in the probes' count (the same factor for every probe), and a
    prediction the predictor caches for two probes is not changed twice."""
    from types import SimpleNamespace

    from trainfit.script.tune import predicted_as_measured
    from trainfit.tune.trial import Predicted

    shared = Predicted(step_time_s=0.5, tokens_per_s=4096.0)  # 2,048 positions a step
    measured = [SimpleNamespace(tokens_per_s=1933.0 / 0.6, step_time_s=0.6),
                SimpleNamespace(tokens_per_s=1933.0 / 0.4, step_time_s=0.4), None]
    trials = [SimpleNamespace(result=SimpleNamespace(measured=m), predicted=p) for m, p in
              zip(measured, [shared, shared, Predicted(step_time_s=0.25, tokens_per_s=8192.0)],
                  strict=True)]
    predicted_as_measured(trials)
    assert [t.predicted.tokens_per_s for t in trials] == pytest.approx([3866.0, 3866.0, 7732.0])
    assert shared.tokens_per_s == 4096.0  # the cached object is left as it was


def _trainer(tmp_path, model_dir):
    """seed 000's trainer built here, in this process (the probe's unit)."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    ds = Dataset.from_list(text_rows(n=16)).map(lambda r: tok(r["text"]), remove_columns=["text"])
    args = TrainingArguments(output_dir=str(tmp_path / "o"), per_device_train_batch_size=2,
                             gradient_accumulation_steps=4, bf16=True, use_cpu=True, report_to=[])
    return Trainer(model=model, args=args, train_dataset=ds,
                   data_collator=DataCollatorForLanguageModeling(tok, mlm=False)), ds


def test_probes_restore_the_trainers_weights_and_survive_an_oom(tmp_path, tiny_models, one_thread):
    from trainfit.model.source import ModelSource
    from trainfit.script.probe import ScriptProbe

    tr, ds = _trainer(tmp_path, tiny_models["gemma"])
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    lengths = [len(r["input_ids"]) for r in ds]
    src = ModelSource("gemma", tr.model.get_base_model().config, "causal-lm", "script")
    job = JobSpec(model="gemma", method="lora", lora_r=8, lora_alpha=16, lora_targets=["q_proj", "v_proj"],
                  precision="amp-bf16", seq_len=max(lengths), micro_batch=2, grad_accum=2,
                  grad_ckpt="off")
    probe = ScriptProbe(tr, src, lengths, torch.device("cpu"), memory_limit_bytes=2**30)
    ok = probe.run(job, timed_steps=2)
    assert ok.status == "ok" and ok.measured.step_time_s > 0 and ok.measured.peak_allocated_bytes > 0
    oom = ScriptProbe(tr, src, lengths, torch.device("cpu"), memory_limit_bytes=200_000).run(
        job.replace(micro_batch=4, grad_ckpt="full"), timed_steps=2)
    assert oom.status == "oom"
    again = probe.run(job, timed_steps=0)  # after the OOM: the same memory, measured again
    assert again.status == "ok"
    assert again.measured.peak_allocated_bytes == ok.measured.peak_allocated_bytes
    for n, p in tr.model.named_parameters():  # every probe trained from the same weights
        if p.requires_grad:
            assert torch.equal(p.detach(), before[n]), n
    probe.restore_trainer()
    assert tr.args.per_device_train_batch_size == 2 and tr._train_batch_size == 2


def _probe_over(model, own, tmp_path):
    """A ScriptProbe over a Trainer handed ``own`` (only its optimizer is exercised)."""
    from transformers import Trainer, TrainingArguments

    from trainfit.script.probe import ScriptProbe, _script_optimizer, own_optimizer

    tr = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                     report_to=[]), optimizers=(own, None))
    probe = object.__new__(ScriptProbe)
    probe.trainer, probe._args0 = tr, tr.args
    probe._own = own_optimizer(tr.optimizer)
    probe._script_optimizer = _script_optimizer(tr, tr.optimizer)
    return probe


@pytest.mark.parametrize("impl", ["foreach", "forloop", "fused"])
def test_the_probe_rebuilds_the_scripts_own_optimizer(tmp_path, impl):
    """Trainer(optimizers=(SGD(momentum=0.9, weight_decay=0.05), None)): the probe measured HF's
    plain SGD (args.optim: no momentum, the Trainer's decay) where plan planned the script's (a
    review). Now it rebuilds the script's own — its class, groups and options — stepping the job's
    kernel in every group (torch reads a group's fused / foreach over the constructor's: kept,
    fused-vs-foreach measured one kernel twice and a fused flag over for-loop groups failed the
    fp16 scaler's step, a review). A job whose optimizer fields the command line changed gets
    trainfit's build of the job (the trainer's build of another optimizer is not the job tune
    writes: --optimizer sgd had measured HF's SGD without momentum, a review)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainfit.script.probe import ScriptProbe, own_optimizer, rebuild_own

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, vocab_size=256,
                                         num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2))
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    own = torch.optim.SGD([{"params": decay, "weight_decay": 0.05},
                           {"params": rest, "weight_decay": 0.0}], lr=1e-3, momentum=0.9)
    probe = _probe_over(model, own, tmp_path)
    job = JobSpec(model="x", optimizer="sgd", optimizer_impl=impl, weight_decay=0.05)
    opt = ScriptProbe._optimizer(probe, job)
    assert type(opt) is torch.optim.SGD and opt is probe.trainer.optimizer and opt is not own
    kernel = (impl == "fused", impl == "foreach")
    assert [(g["momentum"], g["weight_decay"], len(g["params"]), bool(g["fused"]), g["foreach"])
            for g in opt.param_groups] == [(0.9, 0.05, len(decay), *kernel),
                                           (0.9, 0.0, len(rest), *kernel)]
    # the command line's: --sgd-momentum 0, --optimizer adamw
    plain = ScriptProbe._optimizer(probe, job.replace(sgd_momentum=0.0))
    assert [g["momentum"] for g in plain.param_groups] == [0.0]
    other = ScriptProbe._optimizer(probe, JobSpec(model="x", optimizer_impl=impl))
    assert type(other) is torch.optim.AdamW and other.param_groups[0]["weight_decay"] == 0.0
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    probe = _probe_over(model, adamw, tmp_path)  # AdamW's defaults hold more than __init__ takes
    opt = ScriptProbe._optimizer(probe, JobSpec(model="x", optimizer_impl=impl, weight_decay=0.1))
    assert type(opt) is torch.optim.AdamW and opt.param_groups[0]["weight_decay"] == 0.1
    assert (bool(opt.param_groups[0]["fused"]), opt.param_groups[0]["foreach"]) == kernel

    class Scheduled(torch.optim.SGD):  # an __init__ argument its defaults do not hold
        def __init__(self, params, schedule, lr=1e-3):
            super().__init__(params, lr=lr)

    with pytest.raises(JobError, match="own optimizer Scheduled cannot be rebuilt") as err:
        rebuild_own(own_optimizer(Scheduled(model.parameters(), None)),
                    JobSpec(model="x", optimizer="sgd"))
    assert "--optimizer sgd" in err.value.hint
    # a rebuild the kernel refuses (a tensor lr under foreach): the job as trainfit builds it,
    # not the whole tune lost (a review)
    tensor_lr = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3), fused=True)
    probe = _probe_over(model, tensor_lr, tmp_path)
    opt = ScriptProbe._optimizer(probe, JobSpec(model="x", optimizer_impl="foreach",
                                                weight_decay=0.01))
    assert type(opt) is torch.optim.AdamW and opt.param_groups[0]["foreach"] is True
