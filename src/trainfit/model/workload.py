"""Build what a job trains — model (+LoRA, +4-bit base), optimizer, a batch — the same way for the
data-less simulation and for real runs.

Dtype policy (written down because it changes the answer by GiBs):
* ``full``: weights fp32 for ``fp32`` and ``amp-*`` (fp32 master weights + autocast), bf16 for
  ``bf16-true``; gradients and optimizer states follow the weights (torch AdamW).
* ``lora``/``qlora``: the frozen base in the autocast dtype for ``amp-*`` (the usual
  ``torch_dtype=bfloat16`` + ``bf16=True`` recipe) and adapters in fp32 (PEFT's
  ``autocast_adapter_dtype``); everything bf16 for ``bf16-true``; fp32 for ``fp32``.
* ``qlora``: every frozen linear layer except the output head becomes 4-bit (transformers'
  ``BitsAndBytesConfig`` skips the output embedding), compute dtype bf16 (fp16 under amp-fp16).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from trainfit.job import JobError, JobSpec
from trainfit.job.combinations import FSDP_MIXED_DTYPES
from trainfit.model.attention_impl import (
    attention_to_build,
    auto_model_class,
    check_flash_attention_2_built,
)
from trainfit.model.checkpointing import enable_checkpointing
from trainfit.model.chunked_head import ChunkedHeadLM, TrlLogProbHeadLM
from trainfit.model.custom import CausalLMAdapter, build_module
from trainfit.model.in_backward import InBackwardOptimizer
from trainfit.model.loaded_dtypes import fsdp_full_fine_tuning, keep_fp32_as_loaded
from trainfit.model.lora_targets import import_peft, resolve_targets
from trainfit.model.source import ModelSource, build_config, no_cache
from trainfit.model.standins import Adam8bitSim, Linear4bitSim, quantize_linears_4bit
from trainfit.model.stored_quant import (
    check_job,
    hf_module_name,
    patched_expert_classes,
    unstack_experts,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def amp_dtype(precision: str) -> torch.dtype | None:
    return {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(precision)


def cpu_autocast(job: JobSpec) -> Any:
    """The autocast context factory ``train_step`` takes for runs on CPU tensors (real or fake):
    CPU autocast in the job's amp dtype, or none."""
    import contextlib

    dt = amp_dtype(job.precision or "fp32")
    if dt is None:
        return contextlib.nullcontext
    return lambda: torch.autocast("cpu", dtype=dt)


def weight_dtypes(job: JobSpec, config: Any = None) -> tuple[torch.dtype, torch.dtype]:
    """(frozen/base weight dtype, trainable weight dtype).  Under AMP the frozen base of a
    LoRA/QLoRA job is ``job.base_dtype``; ``auto`` is transformers 5's ``from_pretrained``
    default (``dtype="auto"``: the checkpoint's dtype, ``config.dtype``), and, for a config that
    names none, the autocast dtype (the usual ``dtype=bfloat16`` + ``bf16=True`` recipe)."""
    precision = job.precision or "fp32"
    if precision == "bf16-true":
        return torch.bfloat16, torch.bfloat16
    if precision == "fp32":
        return torch.float32, torch.float32
    if job.method == "full":
        return torch.float32, torch.float32
    return base_dtype(job, config), torch.float32


def base_dtype(job: JobSpec, config: Any = None) -> torch.dtype:
    """The frozen base's dtype under AMP (see :func:`weight_dtypes`)."""
    if job.base_dtype != "auto":
        return DTYPES[job.base_dtype]
    named = getattr(config, "dtype", None) if config is not None else None
    if isinstance(named, str):
        named = getattr(torch, named, None)
    if isinstance(named, torch.dtype) and named.is_floating_point:
        return named
    return amp_dtype(job.precision or "fp32") or torch.float32


@dataclass
class ModelInfo:
    total_params: int = 0
    trainable_params: int = 0
    matmul_params: int = 0
    """Weights a token's matmuls use (MFU's N, :func:`matmul_params`)."""
    packed_4bit_params: int = 0
    """Of ``total_params``, the values stored packed 4-bit (two a byte): what FSDP / ZeRO-3
    gather at half a byte each, the rest at its 16- or 32-bit width."""
    quantized_linears: int = 0
    lora_target_modules: list[str] | str = field(default_factory=list)
    attention_impl: str = "sdpa"


_BARE: dict[tuple[str, str], torch.nn.Module | None] = {}
"""Bare models already built, by (task, the configuration's JSON): the last few only."""
BARE_MODELS_KEPT = 4


def bare_model_on_meta(source: ModelSource) -> torch.nn.Module | None:
    """The source's model as its configuration alone builds it (no adapters, no quantization),
    on the meta device: what counts of its modules read (the stacked experts, the ``nn.Linear``
    subclasses) — built once for them all. None for the user's own module, or a configuration
    transformers cannot build without its remote code. A multimodal model (Llama-4) is built
    from its whole configuration."""
    config = getattr(source, "composite", None) or source.config
    if source.task == "custom-lm" or not hasattr(config, "to_json_string"):
        return None
    key = (source.task, config.to_json_string(use_diff=False))
    if key not in _BARE:
        if len(_BARE) >= BARE_MODELS_KEPT:
            del _BARE[next(iter(_BARE))]
        try:
            with torch.device("meta"):
                _BARE[key] = auto_model_class(source.task).from_config(copy.deepcopy(config))
        except Exception:  # unbuildable: the counts are empty (the plan itself reports why)
            _BARE[key] = None
    return _BARE[key]


def build_model_on_meta(job: JobSpec, source: ModelSource, *, bf16: bool = True
                        ) -> tuple[torch.nn.Module, ModelInfo]:
    """The model exactly as it will train (LoRA, 4-bit, dtypes, checkpointing), without data.
    ``bf16``: the target GPU has bf16 (an fp32 QLoRA job's 4-bit layers compute in it there)."""
    import copy

    if source.task == "custom-lm":
        return _build_custom(job, source)
    cfg = copy.deepcopy(build_config(source))
    no_cache(cfg)
    if source.task == "seq2seq-lm" and getattr(cfg, "decoder_start_token_id", None) is None:
        # T5 shifts the labels right with this id; configs built from sizes alone lack it
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
        cfg.pad_token_id = cfg.decoder_start_token_id
    attn, switch = attention_to_build(job, source)
    cfg._attn_implementation = attn  # transformers 5 reads this at build time
    base_dtype, train_dtype = weight_dtypes(job, cfg)
    info = ModelInfo(attention_impl=switch or attn)
    # built in its weight dtype, as from_pretrained(dtype=...) builds it: a buffer transformers
    # computes in fp32 (rotary inv_freq) stays fp32 (model.to() made it bf16: an audit)
    wdtype = base_dtype if job.method != "full" else train_dtype
    with torch.device("meta"):
        try:
            model = auto_model_class(source.task).from_config(
                cfg, trust_remote_code=job.trust_remote_code, attn_implementation=attn,
                dtype=wdtype)
        except ValueError as err:
            if "attn_implementation" in str(err) or "sdpa" in str(err).lower():
                raise JobError(f"--attention {job.attention}: {source.name} has no SDPA "
                               "implementation in transformers", "use --attention eager") from None
            raise _unbuildable(source, err) from None
        except (AssertionError, AttributeError, IndexError, KeyError, TypeError) as err:
            # raised inside transformers' model classes by a configuration they cannot build
            # (a pad_token_id past the vocabulary asserts in nn.Embedding): the config's fault
            raise _unbuildable(source, err) from None
        except ImportError as err:
            # transformers' requires_backends: Gemma-3n's vision tower is a timm model
            why = " ".join(str(err).split())[:200]
            raise JobError(f"{source.name}: transformers needs a package it cannot import to "
                           f"build this model ({why})", "install the package it names (e.g. "
                           "pip install timm) and plan again") from None
    if switch:  # read at each forward, sub-configs too (attention_impl's module doc)
        model.config._attn_implementation = switch
    check_job(job, source)
    if job.attention == "flash-attention-2":  # its sub-models; remote code's class itself
        check_flash_attention_2_built(model)
    # a checkpoint stored 4-bit: Llama-4's stacked experts unstacked into nn.Linear layers before
    # the weights load, as transformers' quantizer does for it (then 4-bit below)
    unstack_experts(model, patched_expert_classes(source, job.method))
    for p in model.parameters():  # the unstacked experts' layers are built in the default dtype
        p.data = p.data.to(wdtype)
    kept = keep_fp32_as_loaded(model, wdtype)  # what from_pretrained(dtype=wdtype) keeps fp32
    if kept and fsdp_full_fine_tuning(job):
        raise JobError(f"--precision {job.precision} with --sharding fsdp: {source.name} keeps "
                       f"{len(kept)} trainable weights in fp32 as transformers loads it in "
                       f"{str(wdtype).removeprefix('torch.')} (e.g. {kept[0]}), and "
                       f"{FSDP_MIXED_DTYPES}", "use --precision amp-bf16 (fp32 master weights, "
                       "bf16 compute), or --method lora")
    if job.grad_ckpt in ("full", "selective"):
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise JobError(f"--grad-ckpt {job.grad_ckpt}: {source.name} does not support "
                           "gradient checkpointing in transformers", "use --grad-ckpt off")
        enable_checkpointing(model, job.grad_ckpt, job.ckpt_reentrant)
    model.train()

    return _finish_model(job, source, model, cfg, info, train_dtype, bf16)


def _unbuildable(source: ModelSource, err: Exception) -> JobError:
    import transformers

    why = (str(err).splitlines() or [""])[0][:200] or type(err).__name__
    if "Unrecognized configuration class" in why:
        # not a size problem: an architecture with no causal / seq2seq LM head (wav2vec2, ViT;
        # a QA run got the pad_token_id hint for it)
        kind = getattr(source.config, "model_type", None) or type(source.config).__name__
        return JobError(f"{source.name}: transformers {transformers.__version__} has no causal- "
                        f"or seq2seq-LM class for model_type {kind} "
                        f"({type(err).__name__}: {why})",
                        "trainfit plans text language models (decoders and encoder-decoders) "
                        "as AutoModelForCausalLM / AutoModelForSeq2SeqLM build them: an "
                        "encoder-only or vision/audio model has neither (trainfit models lists "
                        "the catalog); for a multimodal model give its whole config.json, whose "
                        "language model trainfit plans where transformers builds it")
    return JobError(f"{source.name}: transformers {transformers.__version__} cannot build this "
                    f"model from its configuration ({type(err).__name__}: {why})",
                    "check the config.json's sizes and token ids (pad_token_id must be below "
                    "vocab_size), or plan a catalog model (trainfit models)")


def _finish_model(job: JobSpec, source: ModelSource, model: torch.nn.Module, cfg: Any,
                  info: ModelInfo, train_dtype: torch.dtype, bf16: bool = True
                  ) -> tuple[torch.nn.Module, ModelInfo]:
    """LoRA / 4-bit / trainable flags / chunked head, and the parameter counts."""
    if job.method in ("lora", "qlora"):
        import_peft()
        from peft import LoraConfig, get_peft_model

        # peft's default targets by the language model's type (a multimodal config's own,
        # gemma3, has none in peft's table: peft asks for target_modules)
        targets = resolve_targets(model, job.lora_targets, source.config.model_type)
        info.lora_target_modules = targets
        # GPT-2's projections are transformers' Conv1D (weight stored in × out): peft sets
        # fan_in_fan_out itself and warns on every build; said up front, as its docs ask
        conv1d = any(type(m).__name__ == "Conv1D" for m in model.modules())
        lcfg = LoraConfig(r=job.lora_r, lora_alpha=job.lora_alpha, lora_dropout=job.lora_dropout,
                          target_modules=targets, bias="none", fan_in_fan_out=conv1d)
        try:
            with warnings.catch_warnings():
                # peft 0.21 fills rank/alpha patterns for an MoE's fused expert parameters itself
                # and then warns that they match no module: its bookkeeping, not the job's (an
                # audit: two raw RuntimeWarnings with a site-packages path on Mixtral/Qwen3-MoE)
                warnings.filterwarnings("ignore", category=RuntimeWarning,
                                        message=r"The following (rank|alpha)_pattern keys did not")
                model = get_peft_model(model, lcfg, autocast_adapter_dtype=False)
        except ValueError as err:
            # peft refuses some targets with its own reason: an MoE's expert parameters with
            # dropout, Mamba's out_proj and conv1d — a traceback before (an audit)
            raise JobError(f"--lora-targets {','.join(job.lora_targets)}: peft refuses them for "
                           f"{source.config.model_type} ({str(err).splitlines()[0]})",
                           "--lora-dropout 0" if "dropout" in str(err) else
                           "name the layers to adapt with --lora-targets (module names)") from None
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.to(train_dtype)
        if job.fused_qkv:
            _fuse(job, source, model, train_dtype)
        if job.method == "qlora":
            info.quantized_linears = _quantize_base(job, source, model, bf16)
    else:
        for p in model.parameters():
            p.requires_grad_(True)
        if job.fused_qkv:
            _fuse(job, source, model, None)
    if job.lm_head_chunk is not None:
        if source.task != "causal-lm":
            raise JobError("--lm-head-chunk applies to causal language models only",
                           "leave --lm-head-chunk out for this model")
        model = ChunkedHeadLM(model, job.lm_head_chunk, fp32_outputs=job.fp32_outputs)
    elif job.trl_logprob_head:
        if source.task != "causal-lm":
            raise JobError("--trl-logprob-head applies to causal language models only",
                           "leave --trl-logprob-head out for this model")
        model = TrlLogProbHeadLM(model)
    elif job.fp32_outputs:
        _upcast_logits(model, source)
    seen: set[int] = set()
    for n, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        # a packed 4-bit weight holds two values per byte, whatever dtype stores it
        packed = p.numel() * p.element_size() * 2 if n.endswith("weight_packed") else 0
        info.total_params += packed or p.numel()
        info.packed_4bit_params += packed
        info.trainable_params += p.numel() if p.requires_grad else 0
    for n, b in model.named_buffers():
        if n.endswith("weight_packed"):
            info.total_params += b.numel() * 2
            info.packed_4bit_params += b.numel() * 2
    info.matmul_params = matmul_params(model)
    return model, info


def qlora_compute_dtype(job: JobSpec, bf16: bool = True) -> torch.dtype:
    """The 4-bit layers' compute dtype (bnb_4bit_compute_dtype): the autocast dtype, bf16 for an
    fp32 job on a card that has it (what QLoRA recipes pair with it), else bitsandbytes' own
    default, fp32 — an fp32 QLoRA plan for a T4 computed in bf16, which the T4 has not (an
    audit: its speed then read unknown for a dtype the card cannot run)."""
    if job.precision == "amp-fp16":
        return torch.float16
    if job.precision in ("amp-bf16", "bf16-true") or bf16:
        return torch.bfloat16
    return torch.float32


def _quantize_base(job: JobSpec, source: ModelSource, model: torch.nn.Module,
                   bf16: bool = True) -> int:
    """The frozen base made 4-bit as the job's stack loads it (what transformers' quantizer
    converts, or a checkpoint stored 4-bit keeps); returns how many layers."""
    out_emb = model.get_output_embeddings()
    skip = set() if job.quant_lm_head else {
        n for n, m in model.named_modules() if m is out_emb}
    # transformers leaves a model's keep-in-fp32 modules unquantized: its bnb quantizer passes
    # `model._keep_in_fp32_modules` to get_modules_to_not_convert (quantizers/quantizer_bnb_4bit.py,
    # T5's feed-forward output `wo`), and not the `_strict` list, whose linear layers it converts
    base = model.get_base_model()
    keep32 = set(getattr(base, "_keep_in_fp32_modules", None) or [])
    skip |= keep32
    stored = source.stored_quant
    # a checkpoint that states its 16-bit modules: those (transformers' matcher) and the
    # keep-in-fp32 ones, no default skips (get_modules_to_not_convert)
    patterns = None if stored is None or stored.skip_modules is None else \
        [*stored.skip_modules, *sorted(keep32)]
    inp = model.get_input_embeddings()
    if patterns is not None and out_emb is not None and inp is not None \
            and out_emb.weight is inp.weight:
        # a tied head: tie_weights() after loading puts the 16-bit embedding back into
        # it, whatever the skip list says
        patterns += [hf_module_name(n) for n, m in model.named_modules() if m is out_emb]
    compute = qlora_compute_dtype(job, bf16)
    # sharded QLoRA stores the packed weights in bf16 (bnb_4bit_quant_storage), as
    # FSDP and ZeRO-3 need to flatten them with the other parameters
    storage = torch.bfloat16 if job.sharding != "none" and job.ranks > 1 else torch.uint8
    count = quantize_linears_4bit(
        model, compute, job.quant == "nf4-dq", skip, legacy=job.bnb_legacy,
        from_fp16=job.quant_from_fp16, quant_storage=storage, lib=job.quant_lib,
        compiled=job.compile, patterns=patterns, stored=stored is not None)
    if count and getattr(base, "config", None) is not None:
        # what transformers' quantizer sets on a 4-bit model's config (quantizers/base.py,
        # preprocess_model): Jamba, FalconMamba and gpt_neo then call the 4-bit module instead
        # of using its packed weight in a matmul (an audit: Jamba QLoRA ended in a traceback)
        base.config._is_quantized = True
    if job.kbit_prepared:
        # peft.prepare_model_for_kbit_training: every fp16/bf16 parameter that is not a
        # 4-bit one to float32 (peft/utils/other.py); the packed 4-bit weights (buffers,
        # or bf16-stored parameters when sharded) stay as they are
        for n, p in model.named_parameters():
            if not p.requires_grad and p.dtype in (torch.float16, torch.bfloat16) \
                    and not n.endswith("weight_packed"):
                p.data = p.data.to(torch.float32)
    return count


def matmul_params(model: torch.nn.Module, only: set[int] | None = None) -> int:
    """The weights a token's matmuls use: every parameter of two or more dimensions (linear,
    Conv1D, stacked experts, LoRA A/B) and every 4-bit weight (in × out), but not a lookup table
    (an ``nn.Embedding``'s weight, unless a head also multiplies by it: tied) nor a norm's or
    bias's vector — PaLM's N as MFU counts it (:func:`trainfit.speed.predict
    .model_flops_per_token`), so HFU, which counts the executed matmuls, is never below MFU.
    ``only``: count just these parameters (by id; a 4-bit twin by its packed weight's), e.g. a
    tower's (:func:`trainfit.model.towers.tower_params`)."""
    count, seen = 0, set[int]()
    for module in model.modules():
        if isinstance(module, Linear4bitSim):
            # in × out once: sharded QLoRA stores the packed bytes as a bf16 parameter, which
            # is this weight again (its bias is a vector)
            if only is None or id(module.weight_packed) in only:
                count += module.in_features * module.out_features
            continue
        lookup = isinstance(module, torch.nn.Embedding)
        for p in module.parameters(recurse=False):
            if lookup or p.dim() < 2 or id(p) in seen or (only is not None and id(p) not in only):
                continue
            seen.add(id(p))
            # bitsandbytes' Params4bit (a real run's 4-bit weight) packs two values per byte of
            # whatever dtype stores them
            count += p.numel() * p.element_size() * 2 if type(p).__name__ == "Params4bit" \
                else p.numel()
    return count


def _fuse(job: JobSpec, source: ModelSource, model: torch.nn.Module,
          lora_dtype: torch.dtype | None) -> None:
    """lit-gpt's fused q/k/v projection and its LoRA (``JobSpec.fused_qkv``)."""
    from trainfit.model.fused_qkv import fuse_qkv

    if source.task != "causal-lm":
        raise JobError(f"--fused-qkv: {source.name} is a {source.task} model; lit-gpt's fused "
                       "attention is a decoder-only language model's",
                       "drop --fused-qkv for this model")
    fuse_qkv(model, name=source.name, r=job.lora_r, alpha=job.lora_alpha,
             dropout=job.lora_dropout, lora_dtype=lora_dtype)


def _to_fp32(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output.float()


def _upcast_logits(model: torch.nn.Module, source: ModelSource) -> None:
    """``fp32_outputs`` without a chunked head: the output head's logits become fp32 before the
    loss, as transformers < 4.46's ``logits = self.lm_head(...); logits = logits.float()`` did
    (the 16-bit logits die at once: nothing saves a frozen head's output) and torchtune 0.1's
    ``self.output(h).float()``; the loss's own ``.float()`` is then a no-op. A soft-capping
    or logit scale that follows the head (Gemma 2/3, Cohere) then runs in fp32 too, where
    transformers < 4.46 upcast after it: more bytes per logit, never fewer."""
    if isinstance(model, CausalLMAdapter):  # a user's own module: the adapter holds its logits
        model.fp32_outputs = True
        return
    getter = getattr(model, "get_output_embeddings", None)  # a PeftModel answers for its base
    head = getter() if callable(getter) else None
    if head is None:
        raise JobError(f"--fp32-outputs: {source.name} has no output head trainfit can find",
                       "leave --fp32-outputs out for this model")
    head.register_forward_hook(_to_fp32)


def _build_custom(job: JobSpec, source: ModelSource) -> tuple[torch.nn.Module, ModelInfo]:
    """The user's own module (``module:factory``), wrapped to be called like a transformers LM."""

    base_dtype, train_dtype = weight_dtypes(job)
    info = ModelInfo(attention_impl="custom")
    with torch.device("meta"):
        model = CausalLMAdapter(build_module(source.config.factory))
    model.to(base_dtype if job.method != "full" else train_dtype)
    if job.grad_ckpt == "selective":
        raise JobError(f"--grad-ckpt selective: {source.name} is your own module",
                       "use --grad-ckpt full (its gradient_checkpointing_enable) or off")
    if job.grad_ckpt == "full":
        enable = getattr(model.inner, "gradient_checkpointing_enable", None)
        if job.ckpt_reentrant:
            raise JobError(f"--ckpt-reentrant: {source.name}'s own gradient_checkpointing_enable()"
                           " picks its checkpointing mode", "drop --ckpt-reentrant")
        if enable is None:
            raise JobError(f"--grad-ckpt full: {source.name} has no gradient_checkpointing_enable()",
                           "use --grad-ckpt off, or add the method to your module")
        enable()
    model.train()
    return _finish_model(job, source, model, source.config, info, train_dtype)


def make_optimizer(job: JobSpec, params: list[torch.nn.Parameter], *, simulate: bool,
                   lr: float = 1e-4) -> torch.optim.Optimizer:
    """The optimizer the job names, with its implementation explicit (never torch's default,
    which depends on the tensor type: fake tensors would get the for-loop AdamW). With
    ``optimizer_in_backward``: one of them per parameter, stepped from the backward pass."""
    if job.optimizer_in_backward:
        return InBackwardOptimizer(params, lambda ps: _one_optimizer(job, ps, simulate=simulate,
                                                                     lr=lr))
    return _one_optimizer(job, params, simulate=simulate, lr=lr)


def _one_optimizer(job: JobSpec, params: list[torch.nn.Parameter], *, simulate: bool,
                   lr: float) -> torch.optim.Optimizer:
    if job.optimizer == "adamw":
        impl = job.optimizer_impl
        return torch.optim.AdamW(params, lr=lr, weight_decay=job.weight_decay,
                                 foreach=impl == "foreach", fused=True if impl == "fused" else None)
    if job.optimizer == "sgd":
        # fused as the job says (an audit: "fused" built the for-loop SGD, so tune's and
        # doctor's fused-vs-foreach compared foreach with the slowest kernel under its name)
        impl = job.optimizer_impl
        # L2 weight decay: foreach adds the parameters into a copy of the gradients
        # (torch/optim/sgd.py _multi_tensor_sgd: torch._foreach_add), alive through the step
        return torch.optim.SGD(params, lr=lr, momentum=job.sgd_momentum,
                               weight_decay=job.weight_decay,
                               foreach=impl == "foreach", fused=True if impl == "fused" else None)
    if job.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        # HF Trainer's optim="adafactor": scale_parameter=False, relative_step=False
        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False,
                         warmup_init=False, weight_decay=job.weight_decay)
    bits = 8 if job.optimizer.endswith("8bit") else 32
    paged = job.optimizer.startswith("paged")
    if simulate:
        return Adam8bitSim(params, bits=bits, paged=paged, lr=lr)
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise JobError(f"--optimizer {job.optimizer} needs bitsandbytes",
                       "pip install bitsandbytes") from None
    cls = {(8, False): bnb.optim.AdamW8bit, (8, True): bnb.optim.PagedAdamW8bit,
           (32, True): bnb.optim.PagedAdamW}[(bits, paged)]
    # the job's weight decay, as for torch's AdamW above (bitsandbytes defaults to 0.01; HF's
    # optim "adamw_bnb_8bit", which --emit writes, to the Trainer's 0.0): decoupled, in the kernel
    return cls(params, lr=lr, weight_decay=job.weight_decay)
