"""The change to make, in the script's own terms: the keywords of ``TrainingArguments`` /
``SFTConfig`` (and of ``from_pretrained`` where the pick changes how the model is loaded) that turn
the script's current configuration into the pick, the effective batch kept.

The values come from :func:`trainfit.job.emit.hf_training_args` — the same translation ``tune
--emit hf`` prints — so the diff and the emitted arguments cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainfit.job import JobSpec
from trainfit.job.choices import TRANSFORMERS_ATTENTION
from trainfit.job.emit import hf_training_args
from trainfit.job.script_settings import optimizer_call


@dataclass(frozen=True)
class KeywordChange:
    where: str
    """``TrainingArguments``, ``SFTConfig``, ``from_pretrained`` (with its call site), or the call
    that switched checkpointing on before the trainer."""
    keyword: str
    before: Any
    after: Any


ARG_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "optim",
            "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
            "torch_compile")
"""The TrainingArguments keywords a pick can change (checkpointing apart: see below)."""


_KERNEL_KEYWORDS = {"fused": {"fused": True, "foreach": False},
                    "foreach": {"fused": False, "foreach": True},
                    "forloop": {"fused": False, "foreach": False}}
"""torch's optimizer keywords for each implementation, both said (torch refuses both True)."""


def load_dtype(job: JobSpec) -> str:
    """The dtype the model is loaded in for ``job`` (trainfit.model.workload's policy): the
    frozen base for LoRA, every weight for full fine-tuning, the 4-bit layers' compute dtype for
    QLoRA (``BitsAndBytesConfig(bnb_4bit_compute_dtype=…)``)."""
    p = job.precision or "fp32"
    if job.method == "qlora":
        return "float16" if p == "amp-fp16" else "bfloat16"
    if p == "bf16-true":
        return "bfloat16"
    if job.method == "full" or p == "fp32":
        return "float32"
    if job.base_dtype == "bf16" and p == "amp-fp16":
        # a bf16 base kept under an fp16 pick (--precision amp-fp16 on a T4, which has no
        # bf16) was the change's silence, where the refusal without the flag said
        # dtype=torch.float16 (an audit)
        return "float16"
    if job.base_dtype != "auto":
        # the base as the script loaded it (script.mapping reads it): a float32 base under bf16
        # autocast is loaded in float32, and the change to a bf16 pick must say so (a QA run's
        # advice was bf16=False alone, i.e. fp32 training)
        return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[job.base_dtype]
    return "float16" if p == "amp-fp16" else "bfloat16"


def keyword_diff(rec: dict[str, Any], current: JobSpec, pick: JobSpec) -> list[KeywordChange]:
    """The keywords that differ between ``current`` and ``pick``; both batch keywords whenever one
    changes (their product with the ranks is the effective batch, kept)."""
    args_cls = rec["args"]["class"]
    cur, new = hf_training_args(current), hf_training_args(pick)
    out: list[KeywordChange] = []
    batch = ("per_device_train_batch_size", "gradient_accumulation_steps")
    batch_changed = any(cur[k] != new[k] for k in batch)
    own = rec.get("optimizer")
    for k in ARG_KEYS:
        if k == "optim" and own is not None:
            continue  # the Trainer ignores optim when it is handed an optimizer: said below
        if cur.get(k) != new.get(k) or (k in batch and batch_changed):
            out.append(KeywordChange(args_cls, k, cur.get(k), new.get(k)))
    if own is not None and current.optimizer != pick.optimizer:
        # another optimizer (--optimizer over the script's own): the one to hand the Trainer
        # (a review: nothing was said once optim was left out)
        out.append(KeywordChange(_own_site(own), "optimizer", own["class"],
                                 optimizer_call(pick)))
    elif own is not None and current.optimizer_impl != pick.optimizer_impl and \
            own.get("kernels", True):
        # the kernel of the script's own optimizer is its constructor's (a review: the change
        # said "optim: adamw_torch → adamw_torch_fused", which the Trainer ignores)
        where = _own_site(own, kernel=True)
        before = _KERNEL_KEYWORDS[current.optimizer_impl]
        after = _KERNEL_KEYWORDS[pick.optimizer_impl]
        out += [KeywordChange(where, k, before[k], after[k]) for k in after]
    if current.method != pick.method:  # a --method given over the script's
        out.append(KeywordChange("the model's adapters (LoraConfig / BitsAndBytesConfig / "
                                 "get_peft_model)", "method", current.method, pick.method))
    if current.grad_ckpt != pick.grad_ckpt:
        out.extend(_checkpointing(rec, args_cls, pick.grad_ckpt == "full"))
    site = next((ld for ld in rec["loads"] if ld["this_model"]), None)
    # a model the script builds otherwise (from_config, its own module): no from_pretrained
    # call to change, the build is where its dtype and attention are set
    where = f"from_pretrained ({site['at']})" if site else \
        "the model's build (no from_pretrained call was read: pass it to from_config(...), or " \
        "set it on the model the script makes)"
    before_dt, after_dt = load_dtype(current), load_dtype(pick)
    if before_dt != after_dt:
        kw = "BitsAndBytesConfig(bnb_4bit_compute_dtype)" if pick.method == "qlora" else "dtype"
        out.append(KeywordChange(where, kw, f"torch.{before_dt}", f"torch.{after_dt}"))
    to_bf16 = pick.precision == "bf16-true"
    if pick.method != "full" and to_bf16 != (current.precision == "bf16-true"):
        # trainfit's bf16-true LoRA keeps the adapters in bf16 (model.workload); peft's
        # get_peft_model makes bf16 adapters float32 unless told otherwise, and bf16=False
        # would then train them in float32 without autocast — and back for a mixed-precision
        # pick. SFTTrainer(peft_config=...) calls get_peft_model itself, without the keyword
        out.append(KeywordChange(
            "get_peft_model (the adapters' dtype: False keeps them bf16, peft's default True "
            "makes them float32; with SFTTrainer(peft_config=...) call get_peft_model yourself "
            "and pass the model)", "autocast_adapter_dtype", to_bf16, not to_bf16))
    if current.attention != pick.attention:
        out.append(KeywordChange(where, "attn_implementation",
                                 TRANSFORMERS_ATTENTION[current.attention],
                                 TRANSFORMERS_ATTENTION[pick.attention]))
    return out


SWITCH_OFF = ("checkpointing off: drop model.gradient_checkpointing_enable() there, or pass "
              "prepare_model_for_kbit_training(..., use_gradient_checkpointing=False)")
"""The change where the script switched checkpointing on itself: an instruction, not a keyword
(printed without ``=value``)."""


def _checkpointing(rec: dict[str, Any], args_cls: str, on: bool) -> list[KeywordChange]:
    """Checkpointing switched on by the arguments is switched off there; switched on by the script
    before the trainer (``prepare_model_for_kbit_training(use_gradient_checkpointing=True)``,
    ``model.gradient_checkpointing_enable()``) it must be switched off at that call — at both
    where both switch it on (an audit: only the arguments' keyword was said, and the script
    with it applied still checkpointed, the pick's speed-up not there)."""
    args_on = bool(rec["args"]["gradient_checkpointing"])
    by_call = bool(rec["ckpt_calls"]) or (rec["model"]["gradient_checkpointing"] and not args_on)
    fsdp = rec["args"].get("sharding") or {}
    fsdp_site = None
    if fsdp.get("engine") == "fsdp":
        # FSDP's own checkpointing: transformers warns that gradient_checkpointing under FSDP
        # adds an all-gather in the backward (training_args.py, issue 30404)
        fsdp_site = f"{args_cls}(fsdp_config=...)" if fsdp["where"].startswith(
            "TrainingArguments") else "the accelerate config (fsdp_activation_checkpointing)"
    if on:
        if fsdp_site is not None:
            return [KeywordChange(fsdp_site, "activation_checkpointing", False, True)]
        # the keyword scripts write (transformers 5 also reads it as activation_checkpointing)
        return [KeywordChange(args_cls, "gradient_checkpointing", False, True)]
    out = [KeywordChange(args_cls, "gradient_checkpointing", True, False)] if args_on else []
    if fsdp_site is not None and fsdp.get("activation_checkpointing"):
        out.append(KeywordChange(fsdp_site, "activation_checkpointing", True, False))
    if by_call:
        calls = ", ".join(dict.fromkeys(rec["ckpt_calls"])) or "the script"
        out.append(KeywordChange(f"the call that enables it before the trainer ({calls})",
                                 SWITCH_OFF, True, False))
    return out


def _own_site(own: dict[str, Any], kernel: bool = False) -> str:
    """Where the script's optimizer is made, to change it there: its own handed to the Trainer,
    the Trainer's ``optimizer_cls_and_kwargs``, or a subclass's ``create_optimizer``;
    ``kernel``: its constructor's keywords."""
    cls = own.get("class") or "optimizer"
    how = own.get("built_by", "optimizers")
    if how == "optimizer_cls_and_kwargs":
        return f"Trainer(optimizer_cls_and_kwargs=({cls}, {{...}}))" + (
            ": its keywords" if kernel else "")
    if how not in (None, "optimizers"):
        return f"{how}: its {cls}" + ("(...)" if kernel else "")
    return (f"the script's own {cls}(...) (Trainer(optimizers=...))" if kernel else
            f"Trainer(optimizers=(…, scheduler)): the script's own {cls}")
