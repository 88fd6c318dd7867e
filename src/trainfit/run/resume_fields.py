"""What a resume must keep of the checkpoint's job: the fields that make the samples and their
order, and those the optimizer's and scheduler's states carry (both backends compare them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainfit import json_text
from trainfit.job import JobError

SAMPLE_FIELDS = ("seq_len", "packing", "text_field", "tokenizer", "seed")
"""Job fields that make the samples and their order: the checkpoint's position counts samples of
its job's data, so a resume that changes one of them would continue another stream (a 128-token
packing read at a 64-token position).  The micro-batch may change (another GPU, an OOM); the data
path may too (the same file moved: its content is not compared)."""


CHOSEN_WHEN_NONE = ("packing", "tokenizer")
"""Sample fields whose None means "chosen from the data or the model": the model's own
tokenizer, or (a checkpoint written before runs recorded what the data layer did) packing as
the data made it. A checkpoint's None matches a value spelt out; the runs resolve packing
before they save and compare (run/loop.py)."""


OPTIMIZER_FIELDS = ("optimizer", "lr", "weight_decay", "sgd_momentum")
"""Job fields the checkpoint's optimizer and scheduler states carry: a resume loads them over
the job's, so another optimizer failed at its first step (SGD given AdamW's state: KeyError
'momentum', a traceback) and another learning rate was silently the checkpoint's while
train.json recorded the new one (a QA run: the same losses to every digit). The weight decay and
SGD's momentum are a parameter group's options too, restored with them."""


FIELDS_BEFORE_RECORDED = {"weight_decay": 0.0, "sgd_momentum": 0.9}
"""What a checkpoint written before these fields existed ran with (every optimizer without decay,
SGD with momentum 0.9): compared as such, not skipped — its optimizer state would put them back
under a job asking another (a review: an older checkpoint resumed at weight_decay 0.1 stepped
the checkpoint's 0.0, unsaid)."""


TRAINABLE_FIELDS = ("model", "method", "lora_r", "lora_targets", "quant")
"""Job fields that decide which tensors train (their names and shapes: the checkpoint's
fingerprint)."""


def other_trainables(ck: Path | str, saved: dict[str, Any] | None, job: dict[str, Any] | None
                     ) -> JobError:
    """The refusal of a checkpoint whose trainable tensors differ from the job's: the
    :data:`TRAINABLE_FIELDS` that changed, named where the job says them (an audit: lora on a
    full run's checkpoint read "another model"); another model, or none named, as such."""
    saved = saved or {}
    changed = [f"{k}: {saved[k]} → {job[k]}" for k in TRAINABLE_FIELDS
               if job is not None and k in saved and k in job and saved[k] != job[k]]
    other = not changed or changed[0].startswith("model:")
    return JobError(f"--resume {ck}: the checkpoint's trainable tensors differ in names or shapes "
                    "from this job's (" + ("another model" if other else ", ".join(changed)) + ")",
                    "resume with the job that wrote it" + (
                        "" if other else ", or train the new setting into a new --out"))


def same_samples(ck: Path | str, saved: dict[str, Any] | None, job: dict[str, Any] | None
                 ) -> None:
    """Refuse a resume whose job makes other samples than the checkpoint's (:data:`SAMPLE_FIELDS`)
    or steps another optimizer (:data:`OPTIMIZER_FIELDS`)."""
    import yaml

    if not saved or job is None:
        return  # an older checkpoint without its job: nothing to compare
    saved = {**FIELDS_BEFORE_RECORDED, **saved}
    for k in (*SAMPLE_FIELDS, *OPTIMIZER_FIELDS, "effective_batch"):
        a, b = saved.get(k), job.get(k)
        if k not in saved or a == b or (k in CHOSEN_WHEN_NONE and a is None) or \
                (k == "tokenizer" and b is None):
            continue
        why = ("the run's position counts that job's samples" if k in SAMPLE_FIELDS else
               # 20 steps at 8 and 2 at 16 were recorded as a run at 16 (an audit); the
               # micro-batch may change, the effective batch is kept by the split
               "its steps so far took that many samples each; another is another run"
               if k == "effective_batch" else
               "its optimizer and learning-rate schedule continue from the checkpoint's states")
        was = yaml.safe_dump(a, default_flow_style=True).strip().removesuffix("...").strip()
        raise JobError(f"--resume {ck}: {k} {b!r} differs from the checkpoint's {a!r}: {why}",
                       f"resume with {k}: {was}, or start a new run (no --resume)")


def same_data(ck: Path | str, history: dict[str, Any], data: Any) -> None:
    """Refuse a resume over other samples than the checkpoint's run had (``history``: its record;
    ``data``: a TokenData): the position counts that data's samples, and the sample order is a
    permutation of that many (a review: a data layer that left rows out resumed an older run's
    position over another stream, unsaid). A moved file of the same content resumes; a record
    without the count or digest (an older trainfit) is not compared."""
    saved = history.get("data_samples")
    if isinstance(saved, int) and not isinstance(saved, bool) and saved != len(data):
        # the run held out a fraction for evaluation: another evaluation set given now (or
        # none) changes what is left to train on, which is the likelier cause (an audit: the
        # data was blamed for an --eval-data given over an --eval-fraction run)
        fraction = (history.get("run_options") or {}).get("eval_fraction")
        held = (f"; its run held out --eval-fraction {fraction} of the data for evaluation, "
                "so an --eval-data given now (which replaces that hold-out) changes what is "
                "left to train on" if fraction else "")
        raise JobError(f"--resume {ck}: the data makes {len(data):,} training samples, the "
                       f"checkpoint's run had {saved:,}: its position counts those{held}",
                       ("resume without --eval-data (the run's --eval-fraction is kept), over "
                        "the same data" if fraction else "resume over the data it trained on "
                        "(the same file, seq_len and packing)")
                       + ", or start a new run (no --resume)")
    digest = history.get("data_sha256")
    if isinstance(digest, str) and digest != data.digest():
        raise JobError(f"--resume {ck}: the data's {len(data):,} samples are not the ones the "
                       "checkpoint's run trained on (their SHA-256 differs): its position counts "
                       "those", "resume over the data it trained on (the same content, seq_len "
                       "and packing), or start a new run (no --resume)")


NOTED_FIELDS = ("precision", "max_grad_norm", "grad_ckpt", "ranks", "attention")
"""Job fields a resume may change (another GPU, another clip: the run goes on with the new
value), each said and kept in the segment that ran with it (an audit: precision and clipping
changed silently, and train.json then gave the new values for the whole run)."""


def changed_settings(saved: dict[str, Any] | None, job: dict[str, Any]) -> list[str]:
    """A note for each :data:`NOTED_FIELDS` value the resuming job changes."""
    if not saved:
        return []
    was, now = settings_of(saved), settings_of(job)
    return [f"{k}: {now[k]!r} from this segment on (the checkpoint's run had {was[k]!r})"
            for k in NOTED_FIELDS if k in saved and was[k] != now[k]]


def settings_of(job: dict[str, Any]) -> dict[str, Any]:
    """:data:`NOTED_FIELDS` as they ran: a precision left out is fp32, checkpointing off (a
    review: None → 'fp32' was said as a change)."""
    d = {k: job.get(k) for k in NOTED_FIELDS}
    d["precision"] = d["precision"] or "fp32"
    d["grad_ckpt"] = d["grad_ckpt"] or "off"
    return d


VOLATILE_CONFIG_KEYS = ("_name_or_path", "name_or_path", "transformers_version", "torch_dtype",
                        "dtype", "architectures", "_attn_implementation",
                        "_attn_implementation_internal", "use_cache", "_commit_hash")
"""config.json keys that name, date or dtype the model rather than define its function."""


def config_values(config: Any) -> dict[str, Any] | None:
    """The model configuration a run trained (``to_dict()`` less :data:`VOLATILE_CONFIG_KEYS`);
    None for a model without one (a ``module:factory`` model)."""
    to_dict = getattr(config, "to_dict", None)
    if to_dict is None:
        return None
    out = {}
    for k, v in to_dict().items():
        if k in VOLATILE_CONFIG_KEYS:
            continue
        try:  # JSON-native values only: a str() of an object differs from process to process
            out[k] = json.loads(json.dumps(v))
        except (TypeError, ValueError):
            continue
    return out


def same_model_config(ck: Path | str, history: dict[str, Any], config: Any) -> None:
    """Refuse a resume whose model configuration differs from the checkpoint's run (its shapes
    match, or the weights would not load): another rope_theta or norm epsilon trained on
    silently, the losses jumping (an audit). A record without it (an older trainfit) is not
    compared."""
    saved = history.get("model_config")
    now = config_values(config)
    if not isinstance(saved, dict) or now is None:
        return
    # the keys both hold: another transformers version adds and drops defaults of its own
    # as strict JSON text on both sides: NaN is not equal to itself, and the record says a
    # non-finite value as null (Mamba2's time_step_limit (0.0, inf): a review found every such
    # run refused at its resume)
    diff = sorted(k for k in set(saved) & set(now)
                  if json_text.dumps(saved[k], sort_keys=True)
                  != json_text.dumps(now[k], sort_keys=True))
    if diff:
        shown = ", ".join(f"{k} {now.get(k)!r} (was {saved.get(k)!r})" for k in diff[:3])
        more = f" and {len(diff) - 3} more" if len(diff) > 3 else ""
        raise JobError(f"--resume {ck}: the model's configuration differs from the checkpoint's "
                       f"run: {shown}{more}", "resume with the model config it trained, or "
                       "start a new run (no --resume)")
