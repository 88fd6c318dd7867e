"""A script's optimizer → the job's optimizer fields: the one the script decides — its own
(``Trainer(optimizers=(opt, ...))``), or what its Trainer builds from ``optimizer_cls_and_kwargs``
or a subclass's ``create_optimizer``, as :mod:`trainfit.script.read` records it — else its
Trainer's ``args.optim``; the kernel torch runs
for it, its weight decay, SGD's momentum, and the options trainfit refuses rather than
under-predict. Pure Python (no torch): tested on records alone, through
:func:`trainfit.script.mapping.map_record`."""

from __future__ import annotations

from typing import Any

from trainfit.job import JobError

HF_OPTIM = {"adamw_torch_fused": ("adamw", "fused"), "adamw_torch": ("adamw", "foreach"),
            "adamw_bnb_8bit": ("adamw-8bit", "fused"), "adamw_8bit": ("adamw-8bit", "fused"),
            "paged_adamw_32bit": ("paged-adamw", "fused"), "paged_adamw_8bit": ("paged-adamw-8bit", "fused"),
            "adafactor": ("adafactor", "fused"), "sgd": ("sgd", "foreach")}
"""``TrainingArguments.optim`` → (optimizer, optimizer_impl) (the inverse of trainfit.job.emit's
table; ``adamw_torch`` passes no implementation, and torch then takes foreach on a GPU)."""

BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes' default ``min_8bit_size``: smaller tensors keep 32-bit states (the threshold
plan's 8-bit optimizers model)."""

OWN_OPTIMIZERS = {"AdamW": "adamw", "SGD": "sgd", "AdamW8bit": "adamw-8bit",
                  "PagedAdamW": "paged-adamw", "PagedAdamW8bit": "paged-adamw-8bit",
                  "Adafactor": "adafactor"}
"""The class of the optimizer a script decides (its own, or its Trainer's build from
``optimizer_cls_and_kwargs`` / a ``create_optimizer`` of its own) → the job's optimizer."""

def _optimizer(rec: dict[str, Any], impl_given: bool = False) -> tuple[str, str, str]:
    """(optimizer, implementation, where); ``impl_given``: --optimizer-impl replaces the script's
    kernel (a refusal of its kernel does not apply)."""
    given = rec["optimizer"]
    if given is not None and "error" in given:  # its build raised (read.given_optimizer)
        raise JobError(given["error"], given["hint"])
    if given is not None:
        cls = given["class"]
        where = built_where(given)
        impl = _implementation(given)
        if given.get("maximize"):
            # foreach negates a copy of every gradient first (torch/optim: _foreach_neg)
            raise JobError(f"the script's own {cls}(maximize=True) is not modeled (it copies "
                           "the gradients)", "drop maximize=True (minimize the negated loss), "
                           "or pass --optimizer to plan another")
        more = {"amsgrad=True": given.get("amsgrad"),
                "beta1 (a first moment)": cls == "Adafactor" and given.get("beta1") is not None,
                f"min_8bit_size={given.get('min_8bit_size')} (more tensors with 32-bit states)":
                    (given.get("min_8bit_size") or 0) > BNB_MIN_8BIT_SIZE}
        for what, has in more.items():
            if has:
                # more optimizer state than the job's optimizer keeps (a review: amsgrad +50 %
                # of the states, Adafactor's beta1 a full first moment): planned, it would be under
                raise JobError(f"the script's own {cls} with {what} is not modeled (it keeps more "
                               "optimizer state than plan's)", "drop it, or pass --optimizer to "
                               "plan another")
        if cls == "SGD" and given.get("nesterov") and impl == "forloop" and not impl_given:
            # the for-loop's grad.add(buf) is a new tensor beside the decayed copy
            raise JobError("the script's own SGD(nesterov=True, foreach=False) is not modeled",
                           "drop foreach=False (torch's foreach SGD adds the momentum in place)")
        if cls not in OWN_OPTIMIZERS:
            raise JobError(f"the script's own optimizer {cls} is not modeled",
                           "pass --optimizer adamw (or sgd, adafactor …) to plan it as one of those")
        name = OWN_OPTIMIZERS[cls]
        bnb = str(given.get("module", "")).startswith("bitsandbytes")
        dtype = (rec.get("model") or {}).get("trainable_dtype")
        if bnb and cls in ("AdamW", "SGD") and given.get("optim_bits") != 8 and \
                dtype in ("bfloat16", "float16"):
            # bitsandbytes' 32-bit states are fp32 whatever the weights' dtype, where plan's
            # torch optimizer keeps them in the weights' (a review: half the states of a bf16
            # full fine-tune missed); its SGD has no 16-bit kernel at all
            raise JobError(f"the script's own bitsandbytes {cls} with 32-bit states on {dtype} "
                           "weights is not modeled (its states are fp32)", "pass --optimizer adamw (torch's, "
                           "states in the weights' dtype) or adamw-8bit to plan one of those")
        if cls == "AdamW" and bnb:
            # bitsandbytes' generic AdamW: 8-bit states at optim_bits=8, else 32-bit ones in its
            # own kernel (no temporaries: torch's fused AdamW holds the same); the name alone
            # planned torch's AdamW (a review)
            return ("adamw-8bit" if given.get("optim_bits") == 8 else "adamw", "fused", where)
        if cls == "SGD" and bnb:
            # bitsandbytes' SGD: a momentum state always (betas[0]; it refuses 0), stepped in its
            # own kernel, in place (torch's fused SGD holds the same); read by name it was
            # planned as torch's foreach SGD without momentum (a review)
            if given.get("optim_bits") == 8:
                raise JobError("the script's own bitsandbytes SGD with 8-bit states is not "
                               "modeled", "use torch.optim.SGD, or pass --optimizer to plan "
                               "another")
            return "sgd", "fused", where
        return name, impl if name in ("adamw", "sgd") else "fused", where
    optim = rec["args"]["optim"]
    if optim not in HF_OPTIM:
        raise JobError(f"optim={optim!r}: an optimizer trainfit does not model",
                       "pass --optimizer adamw (or adamw-8bit, adafactor, sgd …) to plan it as one "
                       "of those; known: " + ", ".join(HF_OPTIM))
    return (*HF_OPTIM[optim], f"{rec['args']['class']}(optim={optim!r})")


def built_where(given: dict[str, Any]) -> str:
    """Where the script's optimizer is built, said (``built_by``: read.builder's)."""
    how = given.get("built_by", "optimizers")
    if how == "optimizers":
        return "the optimizer the script built (Trainer(optimizers=...))"
    if how == "optimizer_cls_and_kwargs":
        return "the optimizer its Trainer builds from optimizer_cls_and_kwargs"
    return f"the optimizer {how} builds"


def script_optimizer(rec: dict[str, Any], impl_given: bool = False
                     ) -> tuple[dict[str, Any], str]:
    """The job fields of the optimizer the script steps — its own, else its Trainer's
    ``args.optim`` — (optimizer, optimizer_impl, weight_decay and, for SGD, sgd_momentum), and
    where it was read. Script tune measures that optimizer only where the job's are these."""
    name, impl, where = _optimizer(rec, impl_given)
    fields: dict[str, Any] = {"optimizer": name, "optimizer_impl": impl,
                              "weight_decay": weight_decay(rec)}
    if name == "sgd":
        fields["sgd_momentum"] = _sgd_momentum(rec)
    return fields, where


def weight_decay(rec: dict[str, Any]) -> float:
    """The script's own optimizer's largest group decay, else the Trainer's (it gives the decay to
    every weight but the biases and norms: planned on all of them, over by their share)."""
    own = rec["optimizer"]
    return float((own or {}).get("weight_decay", rec["args"].get("weight_decay")) or 0.0)


def _implementation(given: dict[str, Any]) -> str:
    """The kernel torch runs for the script's own AdamW / SGD (torch/optim/adam.py, sgd.py): fused
    or foreach as asked; both None is torch's default, foreach for CUDA tensors
    (optimizer.py ``_default_to_fused_or_foreach``; read as the for-loop, a default AdamW's Ψ·4
    temporary list was missed); any other (fused=False or foreach=False): the for-loop."""
    if given["fused"]:
        return "fused"
    if given["foreach"]:
        return "foreach"
    return "foreach" if given["foreach"] is None and given["fused"] is None else "forloop"


def _sgd_momentum(rec: dict[str, Any]) -> float:
    """The script's SGD momentum: its own optimizer's, else the Trainer's ``optim_args``
    (transformers trainer_optimizer.py ``_get_sgd``: "momentum=0.9,..."; none: 0, no state)."""
    own = rec["optimizer"]
    if own is not None:
        return float(own.get("momentum", 0.0) or 0.0)
    for pair in (rec["args"].get("optim_args") or "").replace(" ", "").split(","):
        key, _, value = pair.partition("=")
        if key == "momentum":
            try:
                return float(value)
            except ValueError:
                raise JobError(f"optim_args momentum={value!r}: not a number",
                               "e.g. optim_args=\"momentum=0.9\"") from None
    return 0.0
