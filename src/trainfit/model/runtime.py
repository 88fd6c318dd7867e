"""The job on a real device: device checks, the model with real weights, optimizer, autocast, scaler.

The model is built by :func:`trainfit.model.workload.build_model_on_meta` — the same code ``plan``
simulates — and then given storage on the device. Weights are random (N(0, 0.02)) for catalog
models and bare configs, or loaded from the model's safetensors when the source has them
(``init="pretrained"``): memory and speed do not depend on the values.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainfit.job import JobError, JobSpec
from trainfit.model.init import generic_init, hf_initialize, hf_model, materialize
from trainfit.model.offload import trl_offload, with_offload
from trainfit.model.source import ModelSource
from trainfit.model.workload import amp_dtype, build_model_on_meta, make_optimizer


def parse_device(spec: str, limit_hint: str = "--memory-limit") -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``, checked against what this machine has; ``limit_hint``:
    how the caller's command takes a CPU memory limit (doctor reads it from the job file)."""
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise JobError(f"--device {spec}: not a device", "use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise JobError(f"--device {spec}: this machine has no CUDA device "
                           "(torch.cuda.is_available() is False)",
                           f"use --device cpu (with {limit_hint} to stand in for a GPU)")
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


class SimulatedGradScaler(torch.amp.GradScaler):
    """torch's GradScaler as the simulated step runs it: every op it dispatches — the loss
    scaled, the gradients' inf check and unscale (``_amp_foreach_non_finite_check_and_unscale_``,
    a read and a write of every gradient: ``train_step`` calls ``unscale_`` before the clipping
    and any optimizer, so a fused one gets no scale), the scale's update — but the host's read of
    ``found_inf`` before the optimizer step (``_maybe_opt_step``: ``.item()``, a value fake
    tensors do not have): the step is taken, as in every step without an overflow. A review
    found amp-fp16 planned as amp-bf16, without the scaler ``tune`` and ``train`` run."""

    def _maybe_opt_step(self, optimizer: Any, optimizer_state: Any, *args: Any,
                        **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)


def scaler_for(job: JobSpec, device: torch.device, *, simulate: bool = False) -> Any | None:
    """fp16 autocast needs loss scaling (small gradients underflow fp16); bf16 does not.
    ``simulate``: the step's tensors are fake (:class:`SimulatedGradScaler`); none is simulated
    under DeepSpeed ZeRO, whose engine scales the loss itself (its ``DynamicLossScaler``: not
    modelled), nor with the optimizer stepped in the backward (no optimizer step to guard)."""
    if job.precision != "amp-fp16":
        return None
    if not simulate:
        return torch.amp.GradScaler(device.type)
    if job.optimizer_in_backward or job.sharding in ("zero2", "zero3"):
        return None
    return SimulatedGradScaler(device.type)


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


def _weight_dir(source: ModelSource) -> Path:
    """The folder of a local model (its name is the folder, or its config.json)."""
    p = Path(source.name)
    return p.parent if p.is_file() else p


def _weight_files(source: ModelSource) -> list[Path]:
    """The checkpoint's weight files: safetensors, else PyTorch ``.bin`` (read with
    ``weights_only=True``: never unpickled as code); a sharded one's files from its
    ``*.index.json`` ``weight_map``, a missing shard refused (an audit: loaded in part,
    silently; and a ``.bin`` checkpoint was ignored, its model trained from random values).
    A peft adapter's file beside the model (``adapter_model.*``) is not the model's."""
    if source.origin != "local":
        return []
    d = _weight_dir(source)
    for ext in ("safetensors", "bin"):
        index = next(iter(sorted(d.glob(f"*.{ext}.index.json"))), None)
        if index is not None:
            try:
                wmap = json.loads(index.read_text())["weight_map"]
                names = sorted(set(wmap.values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                raise JobError(f"{index}: not a readable weight index ({type(err).__name__})",
                               "re-save the model (save_pretrained) or remove the index") from None
            gone = [n for n in names if not (d / n).is_file()]
            if gone:
                raise JobError(f"{index} lists {len(gone)} shard(s) that are not there "
                               f"({', '.join(gone[:3])})", "copy the missing shard files into "
                               f"{d}, or download the model again")
            return [d / n for n in names]
        # transformers' own names (WEIGHTS_NAME / SAFE_WEIGHTS_NAME and their shards): a .bin
        # beside them is a Trainer's or accelerate's state (training_args.bin, sampler.bin)
        files = sorted(d.glob("model*.safetensors" if ext == "safetensors" else
                              "pytorch_model*.bin"))
        if files:
            return files
    return []


def _read_weights(f: Path) -> dict[str, torch.Tensor]:
    try:
        if f.suffix == ".bin":
            d = torch.load(str(f), map_location="cpu", weights_only=True)
        else:
            from safetensors.torch import load_file

            d = load_file(str(f))
    except Exception as err:  # each reader raises its own error type for a corrupt file
        raise JobError(f"{f}: cannot read the weights ({str(err).splitlines()[0][:160]})",
                       "the file is corrupt, or not safetensors / a PyTorch state dict"
                       ) from None
    if not isinstance(d, dict) or not all(isinstance(v, torch.Tensor) for v in d.values()):
        raise JobError(f"{f}: not a state dict (names → tensors) but a {type(d).__name__}",
                       "save the weights with model.save_pretrained()")
    return d


def _copy_in(tensors: dict[str, torch.Tensor], own: dict[str, torch.Tensor],
             by_suffix: dict[str, str], loaded_ids: set[int], prefix: str = "") -> list[str]:
    """Each of ``tensors`` whose name and shape match one of the model's (``own``, found by
    ``by_suffix``: the name without peft's ``.base_layer``; a checkpoint of the bare model —
    GPT-2's ``h.0…`` — under ``prefix``, the model's ``base_model_prefix``, as transformers
    matches it) and that is not loaded yet, copied in (:func:`assign`) and its id added to
    ``loaded_ids``; returns the names that match none."""
    unmatched = []
    cut = f"{prefix}." if prefix else None
    with torch.no_grad():
        for k, v in tensors.items():
            name = by_suffix.get(k)
            if name is None and cut:
                name = by_suffix.get(cut + k) or (
                    by_suffix.get(k[len(cut):]) if k.startswith(cut) else None)
            if name is None or own[name].shape != v.shape:
                unmatched.append(k)
            elif id(own[name]) not in loaded_ids:
                assign(own[name], v.to(own[name].dtype))
                loaded_ids.add(id(own[name]))
    return unmatched


def _own_tensors(base: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint of ``base`` can hold: its parameters (tied names too) and persistent
    buffers — not a non-persistent one (rotary frequencies), which the config computes and an
    old checkpoint's stray copy must not overwrite."""
    own = dict(base.named_parameters(remove_duplicate=False))
    for mn, mod in base.named_modules(remove_duplicate=False):
        for bn, b in mod._buffers.items():
            if b is not None and bn not in mod._non_persistent_buffers_set:
                own[f"{mn}.{bn}" if mn else bn] = b
    return own


def load_pretrained_into(model: torch.nn.Module, source: ModelSource,
                         loaded_ids: set[int] | None = None,
                         trust_remote_code: bool = False,
                         files: list[Path] | None = None) -> int:
    """Copy the source's weights into the built model (names relative to the transformers model
    inside trainfit's and peft's wrappers); returns how many of the model's tensors were loaded
    (``loaded_ids``: their ids, filled). ``files``: :func:`_weight_files`, when the caller has
    them (their index read and checked once)."""
    loaded_ids = set() if loaded_ids is None else loaded_ids
    base = hf_model(model)
    own = _own_tensors(base)
    by_suffix = {n.replace(".base_layer", ""): n for n in own}
    prefix = getattr(base, "base_model_prefix", "") or ""
    # a tied head's own copy in the file (a target of all_tied_weights_keys) only where its
    # source was not in it: from_pretrained keeps the embedding's value (a review: the head's,
    # first in the file's order, was copied into the shared tensor)
    tied = set(getattr(base, "all_tied_weights_keys", None) or {})
    unmatched: list[str] = []
    deferred: dict[str, torch.Tensor] = {}
    for f in _weight_files(source) if files is None else files:
        tensors = _read_weights(f)
        deferred.update({k: tensors.pop(k) for k in [k for k in tensors if k in tied]})
        unmatched += _copy_in(tensors, own, by_suffix, loaded_ids, prefix)
    unmatched += _copy_in(deferred, own, by_suffix, loaded_ids, prefix)
    # weights the model still lacks while the checkpoint holds names it does not know: a layout
    # transformers converts on load (not a stray key beside complete weights: an old
    # checkpoint's inv_freq, a duplicated tied head — a review)
    missing = missing_weights(model, loaded_ids)
    if unmatched and loaded_ids and missing:
        _load_converted(own, by_suffix, source, unmatched, loaded_ids, trust_remote_code)
    return len(loaded_ids)


def missing_weights(model: torch.nn.Module, loaded_ids: set[int]) -> list[str]:
    """The model's own parameters (not a LoRA adapter's) that no checkpoint tensor gave."""
    return [n for n, p in hf_model(model).named_parameters()
            if id(p) not in loaded_ids and "lora_" not in n]


def _load_converted(own: dict[str, torch.Tensor], by_suffix: dict[str, str],
                    source: ModelSource, unmatched: list[str], loaded_ids: set[int],
                    trust_remote_code: bool) -> None:
    """The weights whose names the checkpoint keeps in a layout transformers converts on load
    (Mixtral's per-expert ``w1``/``w2``/``w3`` under ``block_sparse_moe``, fused into
    ``mlp.experts.gate_up_proj`` / ``down_proj``: transformers' ``conversion_mapping.py``),
    loaded by transformers itself on the host and copied by the converted names.  An audit: they
    stayed at their random init, silently (a Mixtral checkpoint's logits agreed with
    ``from_pretrained``'s at 62 % of positions).  Costs the checkpoint's size in host RAM once
    (on every rank of a sharded run: each copies its own rows)."""
    from trainfit.model.attention_impl import auto_model_class

    try:
        ref = auto_model_class(source.task).from_pretrained(
            str(_weight_dir(source)), dtype="auto", device_map="cpu", trust_remote_code=trust_remote_code)
    except Exception as err:  # the library's own refusal, said in one line
        raise JobError(f"{source.name}: {len(unmatched)} weight(s) in its safetensors (e.g. "
                       f"{unmatched[0]}) match no parameter, and transformers could not load "
                       f"the checkpoint to convert them ({str(err).splitlines()[0][:160]})",
                       "check that the weights belong to this config") from None
    _copy_in(ref.state_dict(), own, by_suffix, loaded_ids)


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
    load_note: str | None = None
    """What the checkpoint gave when it did not give every weight (``None``: all, or none read)."""

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
    files = _weight_files(source) if init in ("auto", "pretrained") else []
    if init == "pretrained" and not files:
        raise JobError(f"{source.name}: no weights to load",
                       "use --init random, or a model dir with *.safetensors (or *.bin)")
    # the checkpoint's values first, then transformers' own init of what it did not give (its
    # buffers: rotary frequencies, Gemma's embed_scale), then the generic values of the rest:
    # each tensor made once (model/init.py)
    base = materialize(model, device)
    loaded: set[int] = set()
    note = None
    if files:
        load_pretrained_into(model, source, loaded, job.trust_remote_code, files)
        missing = missing_weights(model, loaded)
        total = len(missing) + len({id(p) for p in hf_model(model).parameters()} & loaded)
        if not loaded:  # the model would train from random values, silently (an audit)
            raise JobError(f"{source.name}: no tensor in {files[0].name}"
                           f"{f' (+{len(files) - 1} more)' if len(files) > 1 else ''} matches "
                           "the model's parameters", "check that the weights belong to this "
                           "config.json (to train from random values, keep only the config)")
        if missing:
            note = (f"weights: {total - len(missing)} of {total} parameter tensors loaded from "
                    f"{_weight_dir(source)}; {len(missing)} not in the checkpoint or of another "
                    f"shape there (e.g. {missing[0]}) start from their initial values")
    written = hf_initialize(base, seed, True, loaded)
    generic_init(model, seed, True, skip=loaded | written)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(job, trainable, simulate=False, lr=lr)
    # activation offloading: TRL's manager around the forward (plan simulates its twin)
    forward = with_offload(autocast_for(job, device),
                           trl_offload(model, device) if job.activation_offload else None)
    return RealWorkload(model, opt, forward, scaler_for(job, device), device,
                        info.total_params, info.trainable_params, load_note=note)


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
