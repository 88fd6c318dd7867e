"""A trainer's record (:mod:`trainfit.script.read`) → the :class:`~trainfit.job.JobSpec` fields of
the same job, the sequence lengths to plan at, and what the mapping had to decide (notes).

Pure Python (no torch): tested on records alone. What trainfit cannot represent without
under-predicting memory is refused (JobError: a LoRA base in float32 under a bf16 flag, DoRA,
``modules_to_save``, 8-bit bases, optimizers the model does not know: :mod:`trainfit.script.optimizer`);
what it represents by the nearest knob is said in a note.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from trainfit.job import JobError, JobSpec
from trainfit.job.fields import refuse_dead_reentrant
from trainfit.script.optimizer import script_optimizer, weight_decay
from trainfit.script.sharding import sharding_fields

QUANTILE = 0.95
"""The high quantile of the batch lengths plan also shows (the pick is planned at the maximum)."""

ATTENTION = {"sdpa": "sdpa", "eager": "eager", "flash_attention_2": "flash-attention-2",
             "flash_attention_3": "flash-attention-2"}


@dataclass(frozen=True)
class ScriptNote:
    """What the mapping decided, by rule: ``kind`` names the rule (render/script.py has a sentence
    for each), ``data`` its values."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class LengthStats:
    """The sequence lengths of the script's own batches (token positions, padding included)."""

    dataset_samples: int | None
    samples_read: int
    sample_min: int | None
    sample_median: float | None
    sample_max: int | None
    label_max: int | None
    """Seq2seq: the longest target (decoder) sequence."""
    batches_read: int
    batches_total: int | None
    batch_quantile_length: int
    """The ``quantile`` of the batch lengths at the script's micro-batch, in its own order."""
    batch_max_length: int
    quantile: float
    padded: bool
    """Batches carry padding (an attention mask with zeros)."""
    padding_free: bool
    """One row of concatenated samples per micro-batch (position_ids), as TRL's padding_free."""
    longest: int
    """The longest batch any order of the data makes: the length the pick is planned at."""
    all_samples_read: bool


@dataclass(kw_only=True)
class ReadJob:
    fields: dict[str, Any]
    """JobSpec fields of the script's current configuration, at ``lengths.longest``."""
    lengths: LengthStats
    notes: list[ScriptNote]
    where: dict[str, str]
    """Where each read value came from (field → e.g. ``TrainingArguments``, ``train.py:31``)."""


def _quantile(values: list[int], q: float) -> int:
    """Nearest-rank quantile: a length some batch really has."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def lengths(rec: dict[str, Any], quantile: float = QUANTILE) -> LengthStats:
    ln = rec["lengths"]
    samples = ln["sample_lengths"]
    labels = ln["sample_label_lengths"]
    batches = ln["batches"]
    padding_free = all(b["position_ids"] and b["rows"] == 1 for b in batches) and \
        bool(rec["args"].get("padding_free") or rec["args"].get("packing"))
    blen = [max(b["length"], b["label_length"] or 0) for b in batches]
    every = ln["dataset_samples"] is not None and ln["samples_read"] == ln["dataset_samples"]
    per_sample = [max(a, b) for a, b in zip(samples, labels, strict=True)] if labels else samples
    longest = max(per_sample, default=0) if every and not padding_free else max(
        blen + per_sample)
    if padding_free:
        longest = rec["args"].get("max_length") or max(per_sample, default=0) or longest
    return LengthStats(
        dataset_samples=ln["dataset_samples"], samples_read=ln["samples_read"],
        sample_min=min(samples, default=None), sample_max=max(samples, default=None),
        sample_median=statistics.median(samples) if samples else None,
        label_max=max(labels, default=None), batches_read=ln["batches_read"],
        batches_total=ln["batches_total"], batch_quantile_length=_quantile(blen, quantile),
        batch_max_length=max(blen), quantile=quantile, padded=any(b["padded"] for b in batches),
        padding_free=padding_free, longest=longest, all_samples_read=every)


def _method(rec: dict[str, Any], notes: list[ScriptNote]) -> dict[str, Any]:
    m, lora = rec["model"], rec["lora"]
    if m["loaded_in_8bit"]:
        raise JobError("the script loads the model in 8 bits (load_in_8bit): trainfit models "
                       "4-bit QLoRA bases only", "plan it as 4-bit (BitsAndBytesConfig("
                       "load_in_4bit=True)) or full precision LoRA to compare")
    out: dict[str, Any] = {}
    if lora is not None:
        if lora["type"] != "LoraConfig":
            raise JobError(f"the script's peft adapter is {lora['type']}: trainfit models LoRA",
                           "plan it with a LoraConfig of the same rank to compare")
        if lora["use_dora"]:
            raise JobError("LoraConfig(use_dora=True): DoRA's magnitude vectors and their "
                           "activations are not modeled", "plan the same LoRA without DoRA for a "
                           "lower bound, or measure with trainfit tune")
        if lora["modules_to_save"]:
            raise JobError(f"LoraConfig(modules_to_save={lora['modules_to_save']}): full trainable "
                           "copies of these modules are not modeled",
                           "trainfit would under-predict their weights, gradients and states")
        out.update(method="qlora" if m["loaded_in_4bit"] else "lora", lora_r=int(lora["r"]),
                   lora_alpha=int(lora["lora_alpha"]), lora_dropout=float(lora["lora_dropout"]),
                   lora_targets=_targets(lora))
        if lora["bias"] != "none":
            notes.append(ScriptNote("lora_bias", {"bias": lora["bias"]}))
    elif m["loaded_in_4bit"]:
        raise JobError("the model is 4-bit quantized but has no LoRA adapters: its 4-bit weights "
                       "cannot train", "add peft LoRA adapters (QLoRA), as transformers requires")
    else:
        out["method"] = "full"
        if m["trainable_params"] < m["total_params"]:
            notes.append(ScriptNote("frozen_by_script", {
                "trainable": m["trainable_params"], "total": m["total_params"]}))
    if out.get("method") == "qlora":
        out.update(_quant(m["quantization"] or {}, notes))
        if m["frozen_dtype"] == "float32":  # peft's prepare_model_for_kbit_training cast them
            out["kbit_prepared"] = True
    return out


def _targets(lora: dict[str, Any]) -> list[str]:
    tm = lora["target_modules"]
    if tm == "all-linear":
        return ["all-linear"]
    if isinstance(tm, list) and tm:
        return list(tm)
    return list(lora["adapted"])  # a regex, or peft's per-architecture default: the layers it hit


def _quant(q: dict[str, Any], notes: list[ScriptNote]) -> dict[str, Any]:
    kind = q.get("bnb_4bit_quant_type", "nf4")
    double = bool(q.get("bnb_4bit_use_double_quant"))
    if kind == "fp4" and double:
        notes.append(ScriptNote("fp4_double_quant"))
    skip = q.get("llm_int8_skip_modules") or []
    return {"quant": "fp4" if kind == "fp4" else ("nf4-dq" if double else "nf4"),
            "quant_lm_head": bool(skip) and "lm_head" not in skip}


def _precision(rec: dict[str, Any], method: str, notes: list[ScriptNote]) -> str:
    m, a = rec["model"], rec["args"]
    flag = "bf16" if a["bf16"] else ("fp16" if a["fp16"] else None)
    train_dt = m["trainable_dtype"]
    frozen_dt = m["frozen_dtype"]
    if method == "qlora":
        compute = str((m["quantization"] or {}).get("bnb_4bit_compute_dtype", "float32"))
        frozen_dt = {"bfloat16": "bfloat16", "float16": "float16"}.get(
            compute.removeprefix("torch."), "float32")
    lo = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    key = (method == "full", lo.get(frozen_dt or "", frozen_dt), lo.get(train_dt or "", train_dt),
           flag)
    table: dict[tuple[bool, Any, Any, Any], str] = {
        (True, None, "fp32", None): "fp32", (True, None, "fp32", "bf16"): "amp-bf16",
        (True, None, "fp32", "fp16"): "amp-fp16", (True, None, "bf16", None): "bf16-true",
        (True, None, "bf16", "bf16"): "bf16-true",
        (False, "fp32", "fp32", None): "fp32", (False, "bf16", "fp32", "bf16"): "amp-bf16",
        (False, "fp16", "fp32", "fp16"): "amp-fp16", (False, "bf16", "bf16", None): "bf16-true",
        (False, "bf16", "bf16", "bf16"): "bf16-true", (False, "bf16", "fp32", None): "amp-bf16",
        (False, "fp16", "fp32", None): "amp-fp16",
        # a base loaded in float32 under bf16/fp16 autocast: base_dtype fp32
        (False, "fp32", "fp32", "bf16"): "amp-bf16", (False, "fp32", "fp32", "fp16"): "amp-fp16",
    }
    if method == "full":
        key = (True, None, key[2], flag)
    if key not in table:
        raise JobError(f"weights in {frozen_dt if method != 'full' else train_dt} (trainable: "
                       f"{train_dt}) with {flag or 'no'} mixed-precision flag: a combination "
                       "trainfit does not model", "the usual recipes: full fine-tuning in float32 "
                       "with bf16=True or fp16=True; LoRA on a base loaded with dtype=torch.bfloat16 "
                       "(or float16) and the same flag")
    precision = table[key]
    if key[0] is False and key[2] == "fp32" and flag is None:
        notes.append(ScriptNote("no_autocast", {"base": frozen_dt, "precision": precision}))
    if key[2] == "bf16" and flag == "bf16":
        notes.append(ScriptNote("autocast_over_bf16", {"precision": precision}))
    return precision


def _deepspeed_optimizer(rec: dict[str, Any]) -> bool:
    """The script's DeepSpeed config builds the optimizer (HF's DummyOptim then stands for it):
    ``args.optim`` and the Trainer's own build do not run."""
    s = rec["args"].get("sharding") or {}
    return s.get("engine") == "deepspeed" and s.get("optimizer") is not None


def _engine(rec: dict[str, Any], given: frozenset[str], f: dict[str, Any], where: dict[str, str],
            notes: list[ScriptNote], flags_sharding: str | None = None) -> None:
    """The script's FSDP or DeepSpeed ZeRO (:mod:`trainfit.script.sharding`) into ``f``: its
    engine's fields unless ``--sharding`` names another engine (its own, given, keeps them), and
    a DeepSpeed config's optimizer unless ``--optimizer`` is given."""
    fields, engine_notes, said = sharding_fields(rec, flags_sharding)
    if said is None:
        return
    opt_keys = ("optimizer", "optimizer_impl", "weight_decay")
    take = {k: v for k, v in fields.items() if k not in given and
            not ("optimizer" in given and k in opt_keys)}
    f.update(take)
    if "sharding" not in given:
        where["sharding"] = said
    if "optimizer" in take:
        where["optimizer"] = f"the DeepSpeed config's optimizer ({said})"
    notes += [ScriptNote(kind, data) for kind, data in engine_notes
              if kind != "deepspeed_optimizer" or "optimizer" not in given]


def _checkpointing(rec: dict[str, Any]) -> tuple[str, bool, str]:
    """(grad_ckpt, reentrant, where it is switched on): the Trainer's
    ``gradient_checkpointing_kwargs`` (None: transformers 5's non-reentrant default), FSDP's own
    ``activation_checkpointing`` (accelerate's checkpoint_wrapper, non-reentrant), or the mode
    the model's layers were given when the script enabled it itself."""
    a, m = rec["args"], rec["model"]
    fsdp = a.get("sharding") or {}
    if fsdp.get("activation_checkpointing"):
        return "full", False, f"FSDP's activation_checkpointing ({fsdp['where']})"
    calls = list(dict.fromkeys(rec["ckpt_calls"]))  # enable() and its alias: one call site
    if a["gradient_checkpointing"]:
        kw = a.get("gradient_checkpointing_kwargs") or {}
        # the script's own call too, where it has one: switching it off takes both (an audit)
        also = f", and the model before the trainer ({', '.join(calls)})" if calls else ""
        return "full", bool(kw.get("use_reentrant", False)), \
            f"{a['class']}(gradient_checkpointing=True){also}"
    if m["gradient_checkpointing"]:
        return "full", bool(m.get("checkpoint_reentrant")), \
            f"the model, before the trainer ({', '.join(calls) or 'the script'})"
    return "off", False, f"{a['class']} (off)"


def _attention(attn: str, precision: str | None, notes: list[ScriptNote]) -> str:
    """The job's attention for the script's ``attn_implementation``."""
    # a hub flash kernel (kernels-community/flash-attn3, …) runs as flash attention does
    planned = ATTENTION.get(attn, "flash-attention-2" if "flash" in str(attn) else "sdpa")
    if attn not in ("sdpa", "eager", None):
        notes.append(ScriptNote("attention", {"script": attn, "planned": planned}))
    if planned == "flash-attention-2" and precision == "fp32":
        # plan refuses flash-attention-2 in fp32 (flash-attn takes 16-bit q, k and v); a
        # QLoRA script with bitsandbytes' default fp32 compute dtype over a bf16-loaded model
        # still runs (its hidden states stay bf16): planned fp32 with SDPA, which errs high (a
        # review: such a script was refused)
        notes.append(ScriptNote("flash_fp32", {"script": attn}))
        return "sdpa"
    return planned


def _length_notes(ln: LengthStats, attn: str, attention: str, micro_batch: int
                  ) -> list[ScriptNote]:
    """What the batches' lengths mean for the step: a padding-free packing (its mask, or none
    under flash attention) and a seq2seq batch's label lengths."""
    notes = []
    if ln.padding_free and attention == "flash-attention-2":
        # flash attention takes the packing from position_ids itself, no mask (a review); the
        # note follows what is simulated (JobSpec.packs_rows), not the raw name (a review:
        # flex_attention read "no mask" while its row was simulated with one)
        notes.append(ScriptNote("padding_free", {"seq_len": ln.longest}))
    elif ln.padding_free:
        # for SDPA and eager, transformers 5 reads the packing from position_ids and hands
        # SDPA a (1, 1, N, N) bool mask for the one row of N = micro-batch × length positions
        # (masking_utils; an audit, on this CPU): simulated as that row (JobSpec.padding_free)
        positions = micro_batch * ln.longest
        notes.append(ScriptNote("padding_free_mask", {"seq_len": ln.longest,
                                                      "positions": positions,
                                                      "mask_mib": positions**2 / 2**20,
                                                      "flex": attn == "flex_attention"}))
    if ln.label_max is not None:
        notes.append(ScriptNote("seq2seq_lengths", {"label_max": ln.label_max,
                                                    "input_max": ln.sample_max}))
    return notes


def map_record(rec: dict[str, Any], given: frozenset[str] = frozenset(),
               quantile: float = QUANTILE, sharding_flag: str | None = None) -> ReadJob:
    """The job of the script's current configuration. ``given``: fields the command line sets
    (not read, and not refused when the script's value would be); ``sharding_flag``: its
    ``--sharding`` (the script's own engine given keeps the engine's other settings)."""
    m, a = rec["model"], rec["args"]
    if m["task"] is None:
        raise JobError(f"the trainer's model is a {m['class']}: trainfit plans causal LMs, "
                       "seq2seq LMs (T5) and sequence classifiers",
                       "for another nn.Module: trainfit plan --model path/to/model.py:factory")
    notes: list[ScriptNote] = []
    where: dict[str, str] = {}
    f: dict[str, Any] = {"model": m["name_or_path"] or "<the script's config>"}
    f.update(_method(rec, notes))
    if "precision" not in given:
        f["precision"] = _precision(rec, f["method"], notes)
    if f["method"] != "full" and "base_dtype" not in given:
        # the frozen weights as the script loaded them (from_pretrained(dtype=...)), not the
        # checkpoint's dtype that base_dtype: auto would read from config.json; after peft's
        # prepare_model_for_kbit_training they read float32, which kbit_prepared models: the
        # load's own dtype then
        frozen = m["frozen_dtype"] or ""
        if f.get("kbit_prepared"):
            frozen = next((ld["dtype"].removeprefix("torch.") for ld in rec.get("loads", [])
                           if ld.get("this_model")), "")
        f["base_dtype"] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(
            frozen, "auto")
    if "optimizer" not in given and not _deepspeed_optimizer(rec):
        # the script's optimizer, its kernel too unless --optimizer-impl is given (given alone it
        # had replaced the script's SGD with AdamW, a review)
        fields, where["optimizer"] = script_optimizer(rec, "optimizer_impl" in given)
        f.update({k: v for k, v in fields.items() if k not in given and k != "weight_decay"})
    f["grad_ckpt"], reentrant, where["grad_ckpt"] = _checkpointing(rec)
    if reentrant:
        f["ckpt_reentrant"] = True
    # --sharding given without its value (script_as_read's reading): another engine than the
    # script's, for all this reading knows
    _engine(rec, given, f, where, notes,
            sharding_flag if sharding_flag is not None or "sharding" not in given else "?")
    if m.get("loss_head") == "trl-logprob":
        f["trl_logprob_head"] = True
        where["loss"] = f"{rec['trainer']} (trl's chunked log-prob head: never the whole logits)"
    if rec.get("own_loss"):
        notes.append(ScriptNote("own_loss", {"where": rec["own_loss"]}))
    attn = m["attn_implementation"] or "sdpa"
    f["attention"] = _attention(attn, f.get("precision"), notes)
    ln = lengths(rec, quantile)
    f["seq_len"] = ln.longest
    if ln.padding_free:
        f["padding_free"] = True
    notes += _length_notes(ln, attn, f["attention"], int(a["per_device_train_batch_size"]))
    f.update(micro_batch=int(a["per_device_train_batch_size"]),
             grad_accum=int(a["gradient_accumulation_steps"]), ranks=int(a["world_size"] or 1))
    where["micro_batch"] = where["grad_accum"] = a["class"]
    clip = a["max_grad_norm"]
    if "weight_decay" not in given:
        f.setdefault("weight_decay", weight_decay(rec))
    f.update(max_grad_norm=float(clip) if clip else None, lr=float(a["learning_rate"]),
             seed=int(a["seed"]), num_workers=int(a["dataloader_num_workers"] or 0),
             pin_memory=bool(a["dataloader_pin_memory"]),
             persistent_workers=bool(a["dataloader_persistent_workers"]),
             prefetch_factor=int(a["dataloader_prefetch_factor"] or 2),
             compile=bool(a["torch_compile"]))
    if a.get("packing") is not None:
        f["packing"] = bool(a["packing"])
    if "expandable_segments" not in given:
        f["expandable_segments"] = bool(rec.get("expandable_segments"))
        where["expandable_segments"] = "the script's environment (PYTORCH_CUDA_ALLOC_CONF)"
    if ln.padded and not ln.padding_free and not {"padded", "padding_free"} & given:
        # the collator's padding mask, which transformers cannot skip; a padded one-row batch
        # (padding="max_length", pad_to_multiple_of): every batch padded, one row too
        one_row = any(b["padded"] and int(b["rows"]) == 1
                      for b in rec["lengths"]["batches"])
        f["padded"] = "always" if one_row else "longest"
    if ln.padded:
        notes.append(ScriptNote("padded", {"seq_len": ln.longest,
                                           "attention": f.get("attention", "sdpa")}))
    if rec.get("cuda_asked"):
        notes.append(ScriptNote("cuda_asked", {"where": ", ".join(rec["cuda_asked"])}))
    for ld in rec["loads"]:
        if ld["this_model"] and ld["dtype"] == "None" and m["config"].get("dtype") is None:
            notes.append(ScriptNote("dtype_assumed", {"dtype": m["frozen_dtype"]}))
    return ReadJob(fields=f, lengths=ln, notes=notes, where=where)


LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")
QUANT_FIELDS = ("quant", "quant_lm_head", "kbit_prepared")
SETTING_FLAGS = frozenset({"seq_len", "ranks", "sharding", "model",
                           "trust_remote_code", "expandable_segments", "fsdp_init",
                           "fsdp_no_sync", "fsdp_frozen_grads", "offload"})
"""Command-line fields that describe where and on what the script runs rather than a keyword of
the script to change: applied to the script's configuration as read too (the baseline the pick
is compared with and the keyword change is said from)."""


def with_flags(read: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The script's fields with the command line's over them, the effective batch the script
    trains with kept unless the command line sets it (``--effective-batch``, or both
    ``--micro-batch`` and ``--grad-accum``): ``--micro-batch 2`` on a 2 × 4 script plans 2 × 4,
    not 2 × 1. A ``--method`` other than the script's drops the script's LoRA / 4-bit fields
    (they describe a method not planned)."""
    refuse_dead_reentrant(flags, flags.get("grad_ckpt"))  # as the model form does
    f = dict(read)
    method = flags.get("method")
    if method is not None and method != read.get("method"):
        drop = (*LORA_FIELDS, *QUANT_FIELDS, "base_dtype") if method == "full" else \
            QUANT_FIELDS if method == "lora" else ()
        for k in drop:
            f.pop(k, None)
    if flags.get("optimizer") not in (None, "sgd"):
        f.pop("sgd_momentum", None)  # the script's SGD's, not the optimizer planned
    f.update(flags)
    mb, ga = flags.get("micro_batch"), flags.get("grad_accum")
    if mb is not None and ga is not None:
        return f  # the product is the command line's (JobSpec checks --effective-batch with it)
    ranks, script_ranks = int(f.get("ranks") or 1), int(read.get("ranks") or 1)
    script_eff = read["micro_batch"] * read["grad_accum"] * script_ranks
    eff = flags.get("effective_batch") or script_eff
    said = f"--effective-batch {eff}" if "effective_batch" in flags else \
        f"the script's effective batch {eff} ({read['micro_batch']} × {read['grad_accum']} × " \
        f"{script_ranks})"
    if eff % ranks:
        raise JobError(f"{said} is not divisible by --ranks {ranks}",
                       "give --effective-batch N, a multiple of the ranks")
    per_rank = eff // ranks
    if mb is not None:
        if per_rank % mb:
            raise JobError(f"--micro-batch {mb} does not divide {said} over {ranks} rank(s)",
                           f"give a micro-batch dividing {per_rank}, or --grad-accum too (the "
                           "effective batch then follows from the two)")
        f.update(grad_accum=per_rank // mb, effective_batch=eff)
    elif ga is not None:
        if per_rank % ga:
            raise JobError(f"--grad-accum {ga} does not divide {said} over {ranks} rank(s)",
                           f"give an accumulation dividing {per_rank}, or --micro-batch too")
        f.update(micro_batch=per_rank // ga, effective_batch=eff)
    else:
        # the script's micro-batch where it divides the batch per rank, else the largest one
        # below it that does (the grid varies the micro-batch around it anyway)
        mb0 = next(m for m in range(min(read["micro_batch"], per_rank), 0, -1)
                   if per_rank % m == 0)
        f.update(micro_batch=mb0, grad_accum=per_rank // mb0, effective_batch=eff)
    return f


ENGINE_PREFIXES = ("fsdp_", "zero_", "offload")
"""Job fields of one data-parallel engine (FSDP's, DeepSpeed's)."""

READ_WHEN_NOT_GIVEN = frozenset({"precision", "base_dtype", "optimizer", "optimizer_impl",
                                 "expandable_segments"})
"""The fields :func:`map_record` leaves unread when the command line gives them (reading them
may refuse the script: an optimizer or a precision trainfit does not model)."""


def script_as_read(rec: dict[str, Any], base: dict[str, Any], flags: dict[str, Any],
                   quantile: float = QUANTILE, read: ReadJob | None = None) -> JobSpec | None:
    """The script's configuration as it runs — its own micro-batch and accumulation, with only
    the command line's setting flags over it (:data:`SETTING_FLAGS`: on 2 ranks the script's
    2 × 4 is 2 × 4 × 2) — what the keyword change is said from. A field the script has that
    trainfit cannot read is the flag's (its change is then not said); None only when the script
    cannot be read even so. ``read``: :func:`map_record` of ``flags`` already computed (reused
    when no flag is in :data:`READ_WHEN_NOT_GIVEN`: it then read every field)."""
    own = None
    if read is not None and not set(flags) & READ_WHEN_NOT_GIVEN:
        own = read.fields
    for given in (() if own is not None else (frozenset(), frozenset(flags) & READ_WHEN_NOT_GIVEN)):
        try:
            own = map_record(rec, given, quantile).fields
            break
        except JobError:
            continue
    if own is None:
        return None
    over = {k: v for k, v in flags.items() if k in SETTING_FLAGS or
            (k in READ_WHEN_NOT_GIVEN and k not in own)}
    if over.get("sharding", own.get("sharding")) != own.get("sharding"):
        # another engine given: the script's engine settings describe one not planned
        own = {k: v for k, v in own.items() if not k.startswith(ENGINE_PREFIXES)}
    try:
        return JobSpec.from_dict({**base, **own, "model": base["model"], **over,
                                  "effective_batch": None}, source="the script")
    except JobError:
        return None
