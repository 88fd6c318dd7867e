"""What a built ``Trainer`` / ``SFTTrainer`` holds, read inside the user's process at the moment it
would start training: the model as the script built it (class, configuration, dtypes, 4-bit
layers, the LoRA adapters peft put in, checkpointing, attention), the arguments (micro-batch,
accumulation, precision flags, optimizer, loader, sequence settings) and the batches the script's
own dataset and collator make (the sequence lengths: every sample alone, and the batches at the
script's micro-batch in the trainer's own order).

Returns plain JSON-able dicts (the record travels to the parent as a file); the mapping to a job
is :mod:`trainfit.script.mapping`.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import os
import weakref
from typing import Any

import torch

from trainfit.job import JobError
from trainfit.memory.expandable import env_expandable_segments
from trainfit.script.sharding import read_sharding

ARG_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size", "bf16",
              "fp16", "learning_rate", "max_grad_norm", "seed", "weight_decay",
              "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
              "dataloader_prefetch_factor", "torch_compile", "gradient_checkpointing_kwargs",
              "max_length", "max_seq_length", "packing", "padding_free", "packing_strategy",
              "label_smoothing_factor", "predict_with_generate", "optim_args")
"""TrainingArguments / SFTConfig / Seq2SeqTrainingArguments fields read (those absent: None)."""


def read_trainer(trainer: Any, *, loads: list[dict[str, Any]], ckpt_calls: list[str],
                 device_maps: list[dict[str, Any]], mode: str, max_samples: int,
                 max_batches: int, fsdp_plugin_args: dict[str, Any] | None = None,
                 fsdp_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The record of one trainer: ``trainer``, ``args`` (with its data-parallel engine,
    ``sharding``), ``model``, ``lora``, ``optimizer``, ``lengths``, and what the hooks saw
    (``loads``, ``ckpt_calls``, ``device_maps``; ``fsdp_plugin_args`` / ``fsdp_env``: the FSDP
    settings taken off a one-process trainer's arguments and environment)."""
    model = trainer.model
    if model is None:
        raise JobError("the Trainer has no model (model_init?)",
                       "pass model= to the Trainer; trainfit reads the model the trainer holds")
    base = _base_model(model)
    if mode == "tune":
        _check_no_offload(base)
    rec: dict[str, Any] = {
        "trainer": type(trainer).__name__,
        "args": {**trainer_args(trainer.args),
                 "sharding": read_sharding(trainer.args, fsdp_plugin_args, fsdp_env)},
        "model": {**_model(model, base), "loss_head": _loss_head(trainer, base)},
        "lora": _lora(model),
        "optimizer": given_optimizer(trainer),
        "loads": [{k: v for k, v in ld.items() if k != "model_id"} | {"this_model": ld.get(
            "model_id") == id(base)} for ld in loads],
        "ckpt_calls": list(ckpt_calls), "device_maps": list(device_maps), "mode": mode,
        "own_loss": _own_loss(trainer),
        # read once the script has built its trainer: after any os.environ it set itself
        "expandable_segments": env_expandable_segments(),
    }
    args = trainer.args
    workers = (args.dataloader_num_workers, args.dataloader_persistent_workers)
    args.dataloader_num_workers, args.dataloader_persistent_workers = 0, False  # read in-process
    try:
        rec["lengths"] = _lengths(trainer, rec["model"]["task"], max_samples, max_batches)
    finally:
        args.dataloader_num_workers, args.dataloader_persistent_workers = workers
    return rec


def _loss_head(trainer: Any, base: Any) -> str:
    """``trl-logprob`` when the trainer's loss runs TRL's chunked log-prob head: trl 1.16's
    SFTTrainer patches the base model's forward (``add_fused_lm_head``, found by its code, since
    ``functools.wraps`` gives it the model's name) and calls it with ``fused_lm_head=True``, unless
    a ``compute_loss_func`` or label smoothing takes the whole logits; else ``logits``."""
    fn = getattr(vars(base).get("forward"), "__func__", None)
    code = getattr(fn, "__code__", None)
    if code is None or code.co_name != "_fused_forward" or "trl" not in code.co_filename:
        return "logits"
    # a subclass's own compute_loss (trl's deprecation advice) may take the whole logits
    loss_code = getattr(type(trainer).compute_loss, "__code__", None)
    if loss_code is None or "trl" not in loss_code.co_filename:
        return "logits"
    # trl takes the logits path for a compute_loss_func, or label smoothing with the nll loss
    if getattr(trainer, "compute_loss_func", None) is not None or (
            getattr(trainer, "label_smoother", None) is not None
            and getattr(trainer.args, "loss_type", "nll") == "nll"):
        return "logits"
    return "trl-logprob"


def _own_loss(trainer: Any) -> str | None:
    """Where the script computes the loss itself — a subclass's ``compute_loss`` or a
    ``compute_loss_func`` given to the trainer — or None (the trainer's own loss).  Its extra
    tensors are not simulated, so the plan says so (an audit: a label-smoothing loss on
    ``.float()`` logits read "whole logits (transformers' loss)")."""
    code = getattr(type(trainer).compute_loss, "__code__", None)
    if code is not None and not any(lib in code.co_filename.replace("\\", "/")
                                     for lib in ("/transformers/", "/trl/")):
        return f"{type(trainer).__name__}.compute_loss"
    func = getattr(trainer, "compute_loss_func", None)
    if func is not None:
        return f"compute_loss_func={getattr(func, '__name__', type(func).__name__)}"
    return None


def _base_model(model: Any) -> Any:
    if getattr(model, "peft_config", None) is not None and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def _check_no_offload(base: Any) -> None:
    dmap = getattr(base, "hf_device_map", None) or {}
    off = [n or "<all>" for n, d in dmap.items() if str(d) in ("cpu", "disk")]
    if off:
        raise JobError(f"the script's device_map put {len(off)} module(s) on the CPU: "
                       f"{', '.join(off[:6])}{' …' if len(off) > 6 else ''}; tune would measure an "
                       "offloaded model (10-100× slower)",
                       "load with device_map={'': 0}, then tune finds what fits on the GPU")


def trainer_args(args: Any) -> dict[str, Any]:
    """The record of a trainer's arguments (:data:`ARG_FIELDS`, optim, checkpointing)."""
    names = {f.name for f in dataclasses.fields(args)}
    out: dict[str, Any] = {"class": type(args).__name__,
                           "optim": getattr(args.optim, "value", str(args.optim)),
                           "has_activation_checkpointing": "activation_checkpointing" in names}
    for n in ARG_FIELDS:
        v = getattr(args, n, None)
        out[n] = v if isinstance(v, (int, float, str, bool, dict, type(None))) else str(v)
    # under torchrun / accelerate launch on a machine without CUDA transformers sets no DDP up
    # (world_size 1, NOT_PARALLEL) though the launcher started WORLD_SIZE processes: the GPU run
    # has that many ranks (an audit: a 2-process torchrun was planned as 1 rank, its effective
    # batch halved, unsaid)
    world = os.environ.get("WORLD_SIZE", "")
    launched = int(world) if world.isdigit() else 1  # a garbled one: the arguments' own
    if launched > int(out.get("world_size") or 1):
        out["world_size"] = launched
    ckpt = getattr(args, "activation_checkpointing", None)
    out["gradient_checkpointing"] = bool(ckpt if ckpt is not None else
                                         getattr(args, "gradient_checkpointing", False))
    return out


TASKS = {"ForCausalLM": "causal-lm", "ForSequenceClassification": "sequence-classification"}


def _task(base: Any) -> str | None:
    name = type(base).__name__
    for suffix, task in TASKS.items():
        if name.endswith(suffix):
            return task
    cfg = getattr(base, "config", None)
    if getattr(cfg, "is_encoder_decoder", False) and name.endswith("ForConditionalGeneration"):
        return "seq2seq-lm"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    # the class AutoModelForCausalLM builds for this config: Gemma-3 4B+'s
    # Gemma3ForConditionalGeneration (its language model beside its vision tower)
    if MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(cfg, "model_type", None)) == name:
        return "causal-lm"
    return None


def _model(model: Any, base: Any) -> dict[str, Any]:
    """Counts and dtypes of the parameters as built (shared ones once; a 4-bit layer's weight by
    its element count before packing, as transformers counts it)."""
    numel: collections.Counter[tuple[str, bool, bool]] = collections.Counter()
    seen: set[int] = set()
    device = None
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        device = device or p.device.type
        quant = type(p).__name__ == "Params4bit"
        numel[(str(p.dtype).removeprefix("torch."), p.requires_grad, quant)] += p.numel()
    cfg = base.config

    def top(pred: Any) -> str | None:
        cands = [(n, k[0]) for k, n in numel.items() if pred(k)]
        return max(cands)[1] if cands else None

    ckpt = getattr(base, "is_activation_checkpointing", None)
    if ckpt is None:
        ckpt = getattr(base, "is_gradient_checkpointing", False)
    # the layers' checkpoint function: functools.partial(checkpoint, use_reentrant=...)
    fn = next((getattr(m, "_gradient_checkpointing_func", None) for m in base.modules()
               if getattr(m, "_gradient_checkpointing_func", None) is not None), None)
    q = getattr(cfg, "quantization_config", None)
    return {
        "class": type(base).__name__, "task": _task(base),
        "name_or_path": str(getattr(cfg, "_name_or_path", "") or ""),
        "config": cfg.to_dict(), "device": device,
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "total_params": sum(numel.values()),
        "trainable_params": sum(n for k, n in numel.items() if k[1]),
        "quantized_params": sum(n for k, n in numel.items() if k[2]),
        "params_by_dtype": [{"dtype": k[0], "trainable": k[1], "quantized": k[2], "count": n}
                            for k, n in sorted(numel.items())],
        "frozen_dtype": top(lambda k: not k[1] and not k[2] and k[0] not in ("uint8", "int8")),
        "trainable_dtype": top(lambda k: k[1]),
        "gradient_checkpointing": bool(ckpt),
        "checkpoint_reentrant": bool(getattr(fn, "keywords", {}).get("use_reentrant", False)),
        "quantization": q.to_dict() if hasattr(q, "to_dict") else q,
        "loaded_in_4bit": bool(getattr(base, "is_loaded_in_4bit", False)),
        "loaded_in_8bit": bool(getattr(base, "is_loaded_in_8bit", False)),
    }


def _lora(model: Any) -> dict[str, Any] | None:
    cfgs = getattr(model, "peft_config", None)
    if not cfgs:
        return None
    name = getattr(model, "active_adapter", None)
    name = name[0] if isinstance(name, list) else name
    lc = cfgs.get(name) or next(iter(cfgs.values()))
    from peft.tuners.lora import LoraLayer  # lazy: only a peft model gets here

    adapted = sorted(n.removeprefix("base_model.model.") for n, m in model.named_modules()
                     if isinstance(m, LoraLayer))
    tm = getattr(lc, "target_modules", None)
    return {"type": type(lc).__name__, "r": getattr(lc, "r", None),
            "lora_alpha": getattr(lc, "lora_alpha", None),
            "lora_dropout": getattr(lc, "lora_dropout", None),
            "target_modules": sorted(tm) if isinstance(tm, (set, list, tuple)) else tm,
            "modules_to_save": sorted(getattr(lc, "modules_to_save", None) or []),
            "use_dora": bool(getattr(lc, "use_dora", False)), "bias": getattr(lc, "bias", "none"),
            "use_rslora": bool(getattr(lc, "use_rslora", False)), "adapted": adapted}


_BUILT: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""Trainer → the optimizer :func:`built_optimizer` had it build (or the JobError it raised):
built once per trainer, for the record and tune's probe alike (a review: three builds, and any
side effect of a subclass's create_optimizer with them)."""


def builder(trainer: Any) -> str | None:
    """Who builds the optimizer the script steps, where the script decides it: ``optimizers``
    (its own, handed to the Trainer), ``optimizer_cls_and_kwargs``, or a subclass's own
    ``<Class>.create_optimizer``; None: the Trainer builds ``args.optim``'s."""
    if getattr(trainer, "optimizer", None) is not None:
        return "optimizers"
    from transformers import Trainer  # lazy: a Trainer was built, so transformers is loaded

    # a subclass's own create_optimizer first: it decides whatever optimizer_cls_and_kwargs says
    # (a review: said as optimizer_cls_and_kwargs, the change pointed there)
    create = getattr(type(trainer), "create_optimizer", None)
    if create is not None and create is not Trainer.create_optimizer:
        return f"{type(trainer).__name__}.create_optimizer"
    if getattr(trainer, "optimizer_cls_and_kwargs", None) is not None:
        return "optimizer_cls_and_kwargs"
    return None


def built_optimizer(trainer: Any) -> Any:
    """The optimizer the script decides: its own (``optimizers=(opt, sched)``), or the one its
    Trainer builds from other than ``args.optim`` — ``optimizer_cls_and_kwargs``, or a subclass's
    own ``create_optimizer`` — built here by the trainer, once (a constructor makes no state: the
    meta model's parameters take it), and the trainer left as it was.  None: the Trainer builds
    ``args.optim``'s (read from the arguments; before, these two were read so too, so a foreach
    AdamW from ``optimizer_cls_and_kwargs`` over the default adamw_torch_fused was planned
    without its Ψ·4 temporaries).  What the build raises is one line (a JobError)."""
    how = builder(trainer)
    if how in (None, "optimizers"):
        return getattr(trainer, "optimizer", None)
    if trainer in _BUILT:
        done = _BUILT[trainer]
        if isinstance(done, tuple):  # its error, kept as text: an exception's traceback would
            raise JobError(done[0], done[1])  # hold the trainer, the weak key (a review)
        return done
    given = trainer.optimizer_cls_and_kwargs
    try:
        if given is not None:
            # HF pops params / model / optimizer_dict out of the kwargs it is handed (trainer.py
            # create_optimizer): a copy, or the script's own groups were gone after this build
            trainer.optimizer_cls_and_kwargs = (given[0], dict(given[1]))
        built = trainer.create_optimizer() or trainer.optimizer
    except Exception as err:  # the script's own code: whatever it raises is said, on one line
        said = " ".join(str(err).split())
        _BUILT[trainer] = (
            f"the optimizer the Trainer builds ({how}) could not be read: "
            f"{type(err).__name__}: {said}",
            "pass --optimizer (adamw, sgd, adafactor …) to plan it as one of trainfit's")
        raise JobError(_BUILT[trainer][0], _BUILT[trainer][1]) from None
    finally:
        trainer.optimizer = None
        if given is not None:
            trainer.optimizer_cls_and_kwargs = given
    _BUILT[trainer] = built
    return built


def given_optimizer(trainer: Any) -> dict[str, Any] | None:
    """The optimizer the script decides (:func:`built_optimizer`), read; None: ``args.optim``'s.
    One whose build raised is recorded as its error (``error``, ``hint``), raised where the
    plan takes the script's optimizer (:func:`trainfit.script.optimizer.script_optimizer`):
    ``--optimizer`` plans another (a review: it was refused whatever the command line said)."""
    how = builder(trainer)
    try:
        return read_optimizer(built_optimizer(trainer), how)
    except JobError as err:
        return {"error": str(err), "hint": err.hint, "built_by": how, "class": None,
                "kernels": False}


def read_optimizer(opt: Any, built_by: str | None = "optimizers") -> dict[str, Any] | None:
    """The record of an optimizer the script decides (None: none); ``built_by``: :func:`builder`'s."""
    if opt is None:
        return None
    d = getattr(opt, "defaults", {})
    # the largest group's decay: SGD's L2 decay copies the gradients of the groups that have one
    decay = _largest(opt, d, "weight_decay")
    # fused and foreach as given (None: torch's default, foreach on CUDA; False: not that one),
    # the largest group's: torch steps each group with its own (``group["foreach"]``, which a
    # group given its own overrides the defaults with), and the temporaries of a group's step
    # are freed before the next's, so the largest group's kernel makes the step's peak (a group
    # of norms with another kernel differs by its few elements)
    kernel = max(getattr(opt, "param_groups", None) or [d],
                 key=lambda g: sum(p.numel() for p in g.get("params", []) if p.requires_grad))
    bnb_args = getattr(opt, "args", None)  # bitsandbytes' settings
    bits = getattr(bnb_args, "optim_bits", None)
    return {"class": type(opt).__name__, "module": type(opt).__module__, "built_by": built_by,
            "optim_bits": bits, "fused": kernel.get("fused", d.get("fused")),
            "foreach": kernel.get("foreach", d.get("foreach")),
            # the largest group's momentum, and nesterov / maximize in any group
            "weight_decay": decay, "momentum": _momentum(opt, d),
            "nesterov": _any(opt, d, "nesterov"), "maximize": _any(opt, d, "maximize"),
            # options that keep more state than the job's optimizer: AdamW's amsgrad (a third
            # state), Adafactor's beta1 (a full first moment), bitsandbytes' 8-bit threshold
            "amsgrad": _any(opt, d, "amsgrad"),
            "beta1": next((g.get("beta1") for g in getattr(opt, "param_groups", [])
                           if g.get("beta1") is not None), d.get("beta1")),
            "min_8bit_size": getattr(bnb_args, "min_8bit_size", None),
            # whether another kernel can be asked of it (tune's fused-vs-foreach): a constructor
            # with fused= and foreach=, and no tensor learning rate (foreach refuses one)
            "kernels": takes_kernel(type(opt)) and not any(isinstance(g.get("lr"), torch.Tensor)
                        for g in getattr(opt, "param_groups", []))}


def takes_kernel(cls: type) -> bool:
    """Whether an optimizer class's constructor takes torch's kernel keywords (fused=, foreach=)."""
    return {"fused", "foreach"} <= set(inspect.signature(cls.__init__).parameters)


def _momentum(opt: Any, defaults: dict[str, Any]) -> float:
    """The largest group's momentum (a state for every group that has one).  bitsandbytes' SGD
    keeps it as ``betas[0]`` and refuses 0: its groups have no "momentum" (read as 0 until a
    review)."""
    if type(opt).__module__.startswith("bitsandbytes") and type(opt).__name__ == "SGD":
        return max((float((g.get("betas") or (0.0,))[0])
                    for g in getattr(opt, "param_groups", [])), default=0.0)
    return _largest(opt, defaults, "momentum")


def _largest(opt: Any, defaults: dict[str, Any], key: str) -> float:
    return max((float(g.get(key) or 0.0) for g in getattr(opt, "param_groups", [])),
               default=float(defaults.get(key) or 0.0))


def _any(opt: Any, defaults: dict[str, Any], key: str) -> bool:
    return any(bool(g.get(key)) for g in getattr(opt, "param_groups", [])) or bool(
        defaults.get(key))


def _shape_of(batch: dict[str, Any]) -> dict[str, Any]:
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        raise JobError(f"the script's batches have no input_ids tensor (keys: {sorted(batch)})",
                       "plan reads token batches of language models")
    labels = batch.get("labels")
    mask = batch.get("attention_mask")
    tokens = int(mask.sum()) if isinstance(mask, torch.Tensor) else int(ids.numel())
    return {"rows": int(ids.shape[0]), "length": int(ids.shape[-1]),
            "label_length": int(labels.shape[-1]) if isinstance(labels, torch.Tensor)
            and labels.dim() > 1 else None, "tokens": tokens,
            "padded": isinstance(mask, torch.Tensor) and bool((mask == 0).any()),
            "position_ids": "position_ids" in batch}


def _lengths(trainer: Any, task: str | None, max_samples: int, max_batches: int) -> dict[str, Any]:
    """Every sample collated alone (its length after the collator's truncation and rounding: the
    longest is the longest batch any order makes), and the batches of the trainer's own loader."""
    loader = trainer.get_train_dataloader()
    ds, collate = loader.dataset, loader.collate_fn
    n = len(ds) if hasattr(ds, "__len__") else None
    samples: list[int] = []
    label_samples: list[int] = []
    if n is not None:
        for i in range(min(n, max_samples)):
            s = _shape_of(collate([ds[i]]))
            samples.append(s["length"])
            if s["label_length"] is not None:
                label_samples.append(s["label_length"])
    batches = []
    keys: set[str] = set()
    for k, b in enumerate(loader):
        if k >= max_batches:
            break
        keys |= set(b)
        batches.append(_shape_of(b))
    if not batches:
        raise JobError("the script's training data gives no batch", "check train_dataset")
    try:
        total = len(loader)
    except TypeError:
        total = None
    return {"dataset_samples": n, "samples_read": len(samples), "sample_lengths": samples,
            "sample_label_lengths": label_samples if task == "seq2seq-lm" else [],
            "batches": batches, "batches_read": len(batches), "batches_total": total,
            "keys": sorted(keys)}
