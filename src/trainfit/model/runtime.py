"""The job on a real device: device checks, the model with real weights, optimizer, autocast, scaler.

The model is built by :func:`trainfit.model.workload.build_model_on_meta` — the same code ``plan``
simulates — and then given storage on the device. Weights are random (N(0, 0.02)) for catalog
models and bare configs, or loaded from the model's safetensors when the source has them
(``init="pretrained"``): memory and speed do not depend on the values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainfit.job import JobError, JobSpec
from trainfit.model.offload import trl_offload, with_offload
from trainfit.model.source import ModelSource
from trainfit.model.workload import amp_dtype, build_model_on_meta, make_optimizer


def parse_device(spec: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``, checked against what this machine has."""
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise JobError(f"--device {spec}: not a device", "use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise JobError(f"--device {spec}: this machine has no CUDA device "
                           "(torch.cuda.is_available() is False)",
                           "use --device cpu (with --memory-limit to stand in for a GPU)")
        n = torch.cuda.device_count()
        idx = dev.index or 0
        if idx >= n:
            raise JobError(f"--device {spec}: only {n} CUDA device(s) visible",
                           f"use cuda:0 … cuda:{n - 1}")
        return torch.device("cuda", idx)
    if dev.type != "cpu":
        raise JobError(f"--device {spec}: unsupported device type", "use cpu or cuda:N")
    return dev


def use_job_allocator(job: JobSpec, device: torch.device) -> bool:
    """Run with the caching allocator the job was planned for: ``expandable_segments`` turns
    PyTorch's expandable segments on before the model reaches the GPU
    (``torch.cuda.memory._set_allocator_settings``, which applies PYTORCH_CUDA_ALLOC_CONF's
    syntax to a running process: torch/cuda/memory.py); a job without it leaves the
    environment's setting as it is.  Whether it was set."""
    if device.type != "cuda" or not job.expandable_segments:
        return False
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    # the setting shapes only segments made from now on: blocks cached in the default
    # allocator's segments would still serve requests that fit them (seen on an H200, where a
    # test's tensor landed in a segment an earlier test left), so the cache goes first
    torch.cuda.empty_cache()
    return True


def check_precision_on(job: JobSpec, device: torch.device) -> None:
    prec = job.precision or "fp32"
    if device.type == "cuda" and prec in ("amp-bf16", "bf16-true") \
            and not torch.cuda.is_bf16_supported():
        raise JobError(f"--precision {prec}: {torch.cuda.get_device_name(device)} has no bf16",
                       "use --precision amp-fp16 (with a GradScaler) or fp32")


def check_method_on(job: JobSpec, device: torch.device) -> None:
    """QLoRA's 4-bit layers (bitsandbytes) need a GPU: refused before anything loads (tune
    loaded the model and began a probe first, then refused it: a QA run)."""
    if job.method == "qlora" and device.type != "cuda":
        raise JobError("--method qlora: bitsandbytes 4-bit layers run on CUDA only",
                       "use --device cuda:N, or --method lora on CPU")


def check_offload_on(job: JobSpec, device: torch.device) -> None:
    """Activation offloading moves activations from GPU memory to host memory: a step on the CPU
    has nothing to move them from."""
    if job.activation_offload and device.type != "cuda":
        raise JobError(f"--activation-offload on {device}: it moves activations from GPU memory "
                       "to host memory, and this step has no GPU",
                       "drop --activation-offload for a CPU run, or use --device cuda:N "
                       "(trainfit plan predicts its memory on any machine)")


def autocast_for(job: JobSpec, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    dt = amp_dtype(job.precision or "fp32")
    if dt is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dt)


def scaler_for(job: JobSpec, device: torch.device) -> Any | None:
    """fp16 autocast needs loss scaling (small gradients underflow fp16); bf16 does not."""
    if job.precision == "amp-fp16":
        return torch.amp.GradScaler(device.type)
    return None


def init_weights(model: torch.nn.Module, device: torch.device | str, seed: int,
                 zero_lora_b: bool = True, transformers_init: bool = True) -> torch.nn.Module:
    """Real storage for a model built on ``meta``.  A transformers model is initialised by
    transformers itself (``initialize_weights``: each architecture's ``_init_weights`` — T5's
    factor-scaled weights, Mamba's ``A_log``/``D``/``dt_proj``, Gemma's (1 + w) norms at 0 —
    and the buffers its config computes: rotary frequencies with their ``rope_theta`` and
    scaling, Gemma's ``embed_scale``), drawn from torch's generator seeded with ``seed``; its
    LoRA adapters by peft's own ``reset_lora_parameters``.  An audit: a generic N(0, 0.02) of
    every floating tensor, buffers included, gave Gemma an embed_scale of −0.01 and Mixtral /
    Llama-3 rotary frequencies at base 10,000 — buffers no checkpoint stores, so a pretrained
    model loaded over them computed something else — and T5 barely learned.  Any other module
    (a custom ``module:factory`` model): N(0, 0.02) weights, ones for norm scales, the usual
    rotary frequencies, drawn on CPU.  ``zero_lora_b``: PEFT's init (the adapter starts as a
    no-op); the memory ground truth keeps them random, as it always has (values do not change
    its bytes)."""
    gen = torch.Generator().manual_seed(seed)
    # to_empty gives each module its own new Parameter, untying shared ones (a custom GPT's head
    # tied to its embedding; transformers models re-tie with tie_weights): remember who shares
    shared: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for mod in model.modules():
        for pname, prm in mod._parameters.items():
            if prm is not None:
                shared.setdefault(id(prm), []).append((mod, pname))
    model.to_empty(device=device)
    for users in shared.values():
        first_mod, first_name = users[0]
        for mod, pname in users[1:]:
            mod._parameters[pname] = first_mod._parameters[first_name]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "tie_weights"):  # to_empty unties shared storage; from_pretrained keeps it
        try:
            base.tie_weights()
        except KeyError:
            # a tied head wrapped by LoRA (--lora-targets ...,lm_head): transformers cannot set
            # the wrapper's weight ("attribute 'weight' already exists", a traceback in tune:
            # an audit); its base_layer.weight shares the embedding's Parameter, re-tied above
            pass
    norm_params = {f"{n}.{pn}": pn for n, m in model.named_modules()
                   if type(m).__name__.endswith("Norm") for pn in ("weight", "bias")}
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if t.is_floating_point():
                if name.endswith(("norm.weight", "ln_f.weight", "layernorm.weight")) \
                        or "LayerNorm.weight" in name or ".ln_" in name:
                    t.fill_(1.0)
                elif name in norm_params:  # norms the names above miss (a custom model's ln1)
                    t.fill_(1.0 if norm_params[name] == "weight" else 0.0)
                elif "inv_freq" in name:
                    dim = t.numel() * 2
                    t.copy_(1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)))
                elif zero_lora_b and "lora_B" in name:
                    t.zero_()  # PEFT's init: the adapter starts as a no-op
                else:
                    assign(t, torch.randn(t.shape, generator=gen, dtype=torch.float32) * 0.02)
            else:
                t.zero_()
    if transformers_init:
        _hf_initialize(base, seed, zero_lora_b)
    return model


TWIN_SUBTREE_ELEMENTS = 1 << 26
"""A module whose whole subtree holds at most this many values (256 MiB in fp32) is initialised
on a host twin of the whole subtree (its ``_init_weights`` may set its children: T5's attention
scales q/k/v by the model's width); a larger one (a decoder layer of a 7B model, the model
itself) on a twin of its own tensors only, its children left on ``meta`` (writes to them are
no-ops): each child gets its own turn."""


def _hf_initialize(base: torch.nn.Module, seed: int, zero_lora_b: bool,
                   loaded: set[int] | frozenset[int] = frozenset()) -> None:
    """transformers' own initialisation (``_init_weights``, module by module, children before
    parents as ``initialize_weights`` goes) of a model whose storage ``to_empty`` just made,
    over the generic values already drawn: each module is initialised on a host twin (values
    NaN until written) from torch's generator seeded with ``seed``, and only the tensors it
    wrote whole are copied in (:func:`assign`: a sharded rank takes its rows) — so the values
    are the same on every device and under every sharding, and anything ``_init_weights``
    leaves alone keeps the generic value.  ``loaded``: the ids of tensors a checkpoint gave,
    never overwritten; a module whose tensors it gave all, and that holds no floating buffer,
    is skipped (a 7B model loaded from its checkpoint draws only what the checkpoint lacks).
    Nothing for a model that is not transformers'."""
    init_module = getattr(base, "_init_weights", None)
    if init_module is None or not hasattr(base, "initialize_weights"):
        return
    torch.manual_seed(seed)

    def storage(x: torch.Tensor, host: bool) -> torch.Tensor:
        # NaN until written (a float on the host), else shape and dtype only (meta)
        return torch.full(x.shape, float("nan")) if host and x.is_floating_point() else \
            torch.empty(x.shape, dtype=x.dtype, device="meta")

    def twin(m: torch.nn.Module, own_host: bool, children_host: bool) -> torch.nn.Module:
        # the module's attributes (config, sizes) shared, its tensors new; not copy.copy, which
        # FSDP2's module class (its __new__ rebuilds the original) cannot take
        t = object.__new__(type(m))
        t.__dict__.update(m.__dict__)
        t._parameters = {k: None if p is None else torch.nn.Parameter(
            storage(p, own_host), requires_grad=False) for k, p in m._parameters.items()}
        t._buffers = {k: None if b is None else storage(b, own_host)
                      for k, b in m._buffers.items()}
        t._modules = {k: None if c is None else twin(c, children_host, children_host)
                      for k, c in m._modules.items()}
        return t

    def post_order(m: torch.nn.Module) -> list[torch.nn.Module]:
        return [*(x for c in m.children() for x in post_order(c)), m]

    with torch.no_grad():
        for m in post_order(base):
            size = sum(t.numel() for t in [*m.parameters(), *m.buffers()])
            whole = size <= TWIN_SUBTREE_ELEMENTS
            mine = [*m.parameters(recurse=whole), *m.buffers(recurse=whole)]
            if not mine or all(id(x) in loaded for x in mine if x.is_floating_point()):
                continue
            t = twin(m, True, whole)
            init_module(t)
            real = dict([*m.named_parameters(recurse=whole), *m.named_buffers(recurse=whole)])
            for name, v in [*t.named_parameters(recurse=whole), *t.named_buffers(recurse=whole)]:
                r = real.get(name)
                if r is None or id(r) in loaded or v.device.type == "meta" \
                        or not r.is_floating_point() or torch.isnan(v).any():
                    continue
                if "lora_B" in name and zero_lora_b:
                    continue  # PEFT's no-op start, set above
                assign(r, v.to(torch.float32))


def assign(t: torch.Tensor, value: torch.Tensor) -> None:
    """``t.copy_(value)`` for a whole tensor ``value`` (drawn or read on the host), also when ``t``
    is a sharded parameter (a DTensor of FSDP2's ``fully_shard``): each rank then copies its own
    chunk, the rows ``torch.chunk(value, world, dim)[rank]`` that FSDP2's ``Shard(dim)`` gives it
    (a rank past the last chunk holds none) — no collective, and no full copy on the GPU."""
    to_local = getattr(t, "to_local", None)
    if to_local is None:
        t.copy_(value)
        return
    (placement,) = t.placements
    mesh = t.device_mesh
    chunks = torch.chunk(value, mesh.size(), dim=placement.dim)
    rank = mesh.get_local_rank()
    if rank < len(chunks):
        to_local().copy_(chunks[rank])


def _weight_files(source: ModelSource) -> list[Path]:
    if source.origin != "local":
        return []
    p = Path(source.name)
    d = p.parent if p.is_file() else p
    return sorted(d.glob("*.safetensors"))


def load_pretrained_into(model: torch.nn.Module, source: ModelSource,
                         loaded_ids: set[int] | None = None) -> int:
    """Copy the source's safetensors weights into the built model (names matched with and without
    PEFT's prefixes); returns how many tensors were loaded. Never unpickles (safetensors only)."""
    from safetensors.torch import load_file

    own = dict(model.named_parameters())
    own.update(dict(model.named_buffers()))
    by_suffix = {}
    for n in own:
        key = n.replace("base_model.model.", "").replace(".base_layer", "")
        by_suffix[key] = n
    loaded, unmatched = 0, []
    for f in _weight_files(source):
        try:
            tensors = load_file(str(f))
        except Exception as err:  # safetensors raises its own error type for corrupt files
            raise JobError(f"{f}: cannot read the weights ({err})",
                           "the file is corrupt or not safetensors") from None
        with torch.no_grad():
            for k, v in tensors.items():
                name = by_suffix.get(k)
                if name is not None and own[name].shape == v.shape:
                    assign(own[name], v.to(own[name].dtype))
                    loaded += 1
                    if loaded_ids is not None:
                        loaded_ids.add(id(own[name]))
                else:
                    unmatched.append(k)
    if unmatched and loaded:
        loaded += _load_converted(own, by_suffix, source, unmatched, loaded_ids)
    return loaded


def _load_converted(own: dict[str, torch.Tensor], by_suffix: dict[str, str],
                    source: ModelSource, unmatched: list[str],
                    loaded_ids: set[int] | None = None) -> int:
    """The weights whose names the checkpoint keeps in a layout transformers converts on load
    (Mixtral's per-expert ``w1``/``w2``/``w3`` under ``block_sparse_moe``, fused into
    ``mlp.experts.gate_up_proj`` / ``down_proj``: transformers' ``conversion_mapping.py``),
    loaded by transformers itself on the host and copied by the converted names.  An audit: they
    stayed at their random init, silently (a Mixtral checkpoint's logits agreed with
    ``from_pretrained``'s at 62 % of positions).  Costs the model's size in host RAM once."""
    from trainfit.model.workload import auto_model_class

    p = Path(source.name)
    where = p.parent if p.is_file() else p
    dtype = next(iter(own.values())).dtype
    try:
        ref = auto_model_class(source.task).from_pretrained(str(where), dtype=dtype,
                                                            device_map="cpu")
    except Exception as err:  # the library's own refusal, said in one line
        raise JobError(f"{source.name}: {len(unmatched)} weight(s) in its safetensors (e.g. "
                       f"{unmatched[0]}) match no parameter, and transformers could not load "
                       f"the checkpoint to convert them ({str(err).splitlines()[0][:160]})",
                       "check that the weights belong to this config") from None
    n = 0
    with torch.no_grad():
        for k, v in ref.state_dict().items():
            name = by_suffix.get(k)
            if name is not None and own[name].shape == v.shape:
                assign(own[name], v.to(own[name].dtype))
                n += 1
                if loaded_ids is not None:
                    loaded_ids.add(id(own[name]))
    return n


@dataclass
class RealWorkload:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    autocast: Callable[[], contextlib.AbstractContextManager]
    scaler: Any | None
    device: torch.device
    total_params: int
    trainable_params: int
    step_model: Any = None
    """What the step calls: the model, or its ``torch.compile`` wrapper."""

    def __post_init__(self) -> None:
        if self.step_model is None:
            self.step_model = self.model


def build_real(job: JobSpec, source: ModelSource, device: torch.device, *, seed: int = 0,
               init: str = "auto", lr: float = 1e-4,
               shard: Callable[[torch.nn.Module], Any] | None = None) -> RealWorkload:
    """The job's model and optimizer with real storage on ``device``.

    ``shard``: applied to the model while it is still on ``meta`` (FSDP2's ``fully_shard``, as
    torchtitan does), so each rank's device only ever holds its shards: the weights are drawn or
    read on the host and each rank copies its own rows (:func:`assign`).  Materialising the
    whole model first and sharding it after would put the full model on every GPU at load — the
    size FSDP is there to split — and leave its freed blocks in the allocator's cache
    (``fsdp_init sharded`` is what plan predicts)."""
    stored = getattr(source, "stored_quant", None)
    if stored is not None:
        raise JobError(f"{source.name}: its weights are stored 4-bit ({stored.describe()}), and "
                       "real 4-bit runs are not wired in this version",
                       "tune/train the 16-bit original with --method lora, or plan this "
                       "checkpoint (trainfit plan) for its memory")
    check_method_on(job, device)
    if job.method == "qlora" or job.optimizer not in ("adamw", "sgd", "adafactor"):
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            raise JobError(f"--method {job.method} --optimizer {job.optimizer} needs "
                           "bitsandbytes", "pip install bitsandbytes") from None
    check_precision_on(job, device)
    check_offload_on(job, device)
    torch.manual_seed(seed)
    model, info = build_model_on_meta(job, source)
    if job.method == "qlora":
        raise JobError("--method qlora: real 4-bit runs are not wired in this version",
                       "tune/train it as --method lora with --precision bf16-true, "
                       "or use trainfit plan for its memory")
    if shard is not None:
        shard(model)
    if init == "pretrained" and not _weight_files(source):
        raise JobError(f"{source.name}: no safetensors weights to load",
                       "use --init random, or a model dir with *.safetensors")
    # the generic values first, the checkpoint's over them, then transformers' own init of what
    # the checkpoint did not give (its buffers: rotary frequencies, Gemma's embed_scale)
    init_weights(model, device, seed, transformers_init=False)
    loaded: set[int] = set()
    if init in ("auto", "pretrained") and _weight_files(source):
        n = load_pretrained_into(model, source, loaded)
        if init == "pretrained" and n == 0:
            raise JobError(f"{source.name}: no weight in its safetensors matches the model",
                           "check that the weights belong to this config")
    _hf_initialize(model.get_base_model() if hasattr(model, "get_base_model") else model, seed,
                   True, loaded)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(job, trainable, simulate=False, lr=lr)
    # activation offloading: TRL's manager around the forward (plan simulates its twin)
    forward = with_offload(autocast_for(job, device),
                           trl_offload(model, device) if job.activation_offload else None)
    return RealWorkload(model, opt, forward, scaler_for(job, device), device,
                        info.total_params, info.trainable_params)


def check_no_offload(model: torch.nn.Module, allow_offload: bool = False) -> None:
    """Seed 001 lost days to a silent CPU offload: a ``device_map`` that put modules on ``cpu`` or
    ``disk`` trains 10–100× slower. Stop unless the user asked for it."""
    dmap = getattr(model, "hf_device_map", None) or {}
    off = {name: dev for name, dev in dmap.items() if str(dev) in ("cpu", "disk")}
    if not off or allow_offload:
        return
    missing = 0
    for name in off:
        try:
            mod = model.get_submodule(name) if name else model
        except AttributeError:
            continue
        missing += sum(p.numel() * p.element_size() for p in mod.parameters())
    names = ", ".join(f"{n or '<root>'}→{d}" for n, d in list(off.items())[:5])
    more = f" (+{len(off) - 5} more)" if len(off) > 5 else ""
    raise JobError(f"{len(off)} module(s) were offloaded by the device map: {names}{more}; "
                   f"{missing / 2**30:.2f} GiB of weights would not fit on the GPU",
                   "use QLoRA / a smaller micro-batch (trainfit plan), or pass --allow-offload "
                   "to train that slowly on purpose")
