"""tune's probe of the user's own trainer: their model (with their weights, LoRA, dtypes), their
optimizer as their Trainer builds it (``create_optimizer``, ``args.optim``), their loss
(``compute_loss``: label smoothing, SFT's metrics …), their dataset and collator through their
Trainer's own data loader — measured by trainfit's :class:`~trainfit.tune.probe.Probe` (the same
meter, OOM handling and timing), a few steps per configuration.

A configuration is realised on the live trainer: the micro-batch and the loader settings through
its data loader, checkpointing switched on or off on the model, the attention implementation
swapped, the autocast dtype, the optimizer implementation (``args.optim``). Between probes the
trainable weights are restored from a host copy taken once and the optimizer is rebuilt, so no
probe trains the next one's starting point.

The metered step (the memory probe) runs the longest samples of the dataset (each micro-batch
padded as the collator pads it): a configuration that fits them fits every batch of the run; the
timed steps run batches of the trainer's own order, the same samples for every configuration
(the sampler seeded alike), so their tokens per step are equal and their times comparable.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import time
from collections.abc import Iterator
from typing import Any

import torch

from trainfit.data.loader import LoaderKnobs
from trainfit.engine.step import train_step
from trainfit.job import JobError, JobSpec
from trainfit.job.choices import TRANSFORMERS_ATTENTION
from trainfit.job.emit import hf_training_args
from trainfit.memory.limit import LimitTracker
from trainfit.model.checkpointing import disable_checkpointing, enable_checkpointing
from trainfit.model.runtime import RealWorkload, autocast_for, scaler_for
from trainfit.model.source import ModelSource
from trainfit.model.workload import make_optimizer
from trainfit.script.optimizer import script_optimizer
from trainfit.script.read import built_optimizer, read_optimizer, takes_kernel, trainer_args
from trainfit.tune.probe import Probe


class _TrainerLoss(torch.nn.Module):
    """What the step calls: the trainer's own ``compute_loss`` on its model (the trainer is not
    registered as a submodule: the weights are the model's, counted once)."""

    def __init__(self, trainer: Any) -> None:
        super().__init__()
        object.__setattr__(self, "trainer", trainer)

    def forward(self, **batch: torch.Tensor) -> torch.Tensor:
        return self.trainer.compute_loss(self.trainer.model, batch)


OwnOptimizer = tuple[type, dict[str, Any], dict[str, Any], list[dict[str, Any]]]


def own_optimizer(opt: torch.optim.Optimizer | None) -> OwnOptimizer | None:
    """The optimizer the script decides (its own, ``Trainer(optimizers=(opt, ...))``, or what its
    Trainer builds from ``optimizer_cls_and_kwargs`` / a ``create_optimizer`` of its own:
    :func:`trainfit.script.read.built_optimizer`) as (class, defaults, the
    settings bitsandbytes' optimizers keep in ``args`` — 8-bit states, the 8-bit size threshold
    —, groups), rebuilt for each probe: the Trainer's ``args.optim`` build is not it (a review:
    an own SGD with momentum and weight decay was measured as HF's plain SGD)."""
    if not isinstance(opt, torch.optim.Optimizer):
        # none, or a wrapper of several (a factory's, a subclass's): nothing to rebuild (its
        # job is trainfit's build; a review: an AttributeError traceback)
        return None
    extra = dict(vars(opt.args)) if hasattr(getattr(opt, "args", None), "__dict__") else {}
    return (type(opt), dict(opt.defaults), extra,
            [{k: v for k, v in g.items() if k != "params"} | {"params": list(g["params"])}
             for g in opt.param_groups])


def rebuild_own(own: OwnOptimizer, job: JobSpec) -> torch.optim.Optimizer:
    """The script's own optimizer anew, with the job's implementation (fused / foreach / the
    for-loop) where the class has one: in each group too, whose own ``fused`` / ``foreach`` torch
    reads over the constructor's (a review: the groups kept the script's kernel, so tune's
    fused-vs-foreach measured one kernel twice, and a fused flag over foreach groups failed the
    fp16 scaler's step).  The options its constructor names are passed (a group's own values win
    over them in the step); bitsandbytes' ``args`` settings too (but ``optim_bits`` for an 8-bit
    class, which takes only 32 there: its bits are the class's), or without them where the class
    refuses them.  A class that cannot be rebuilt is one clear line."""
    cls, defaults, extra, groups = own
    takes = inspect.signature(cls.__init__).parameters
    kernel = {}
    if takes_kernel(cls):
        kernel = {"fused": job.optimizer_impl == "fused" or None,
                  "foreach": job.optimizer_impl == "foreach"}
    if cls.__name__.endswith("8bit"):  # its bits are the class's: it refuses optim_bits ≠ 32
        extra = {k: v for k, v in extra.items() if k != "optim_bits"}
    if cls.__module__.startswith("bitsandbytes") and "momentum" in takes and \
            "momentum" not in defaults:
        # bitsandbytes' SGD keeps its momentum as betas = (momentum, dampening) and refuses 0
        # (a review: never rebuilt, tune measured torch's SGD)
        betas = tuple(defaults.get("betas") or (0.0, 0.0))
        defaults = {**defaults, "momentum": betas[0], "dampening": betas[1]}
    rebuilt = [dict(g) | {k: v for k, v in kernel.items() if k in g} for g in groups]
    err: Exception | None = None
    for options in ({**extra, **defaults}, defaults):
        kw = {k: v for k, v in options.items() if k in takes} | kernel
        try:
            return cls(rebuilt, **kw)
        except (TypeError, ValueError, RuntimeError) as e:
            err = e
    raise JobError(f"the script's own optimizer {cls.__name__} cannot be rebuilt for tune's "
                   f"probes ({type(err).__name__}: {err})",
                   f"tune it as the optimizer trainfit builds: --optimizer {job.optimizer}")


def _script_optimizer(trainer: Any, built: torch.optim.Optimizer | None
                      ) -> dict[str, Any] | None:
    """The job fields of the optimizer the script steps (:func:`script_optimizer`; ``built``:
    :func:`built_optimizer`'s), read before any probe changes the trainer's arguments; None
    where plan refuses it (the job's optimizer is then the command line's)."""
    rec = {"optimizer": read_optimizer(built), "args": trainer_args(trainer.args)}
    try:
        return script_optimizer(rec)[0]
    except JobError:
        return None


class ScriptProbe(Probe):
    def __init__(self, trainer: Any, source: ModelSource, sample_lengths: list[int],
                 device: torch.device, *, memory_limit_bytes: int | None = None,
                 max_host_ram_bytes: int | None = None, seed: int = 0) -> None:
        super().__init__(source, None, device, memory_limit_bytes=memory_limit_bytes,  # type: ignore[arg-type]
                         max_host_ram_bytes=max_host_ram_bytes, seed=seed)
        if self.dist.world > 1:
            raise JobError("tune -- CMD runs the script in one process",
                           "tune it on one GPU; the pick's micro-batch holds per rank")
        self.trainer = trainer
        self.lengths = sample_lengths
        model = trainer.model
        self.base = model.get_base_model() if hasattr(model, "get_base_model") else model
        # the starting point of every probe, on the host (a device copy would be counted)
        self._snapshot = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()
                          if p.requires_grad}
        self._input_grads0 = bool(getattr(self.base, "_require_grads_hooks", None))
        """The script's model made its inputs require grad itself (peft's kbit preparation)."""
        self._args0 = copy.copy(trainer.args)
        self._train_batch_size0 = trainer._train_batch_size
        self._key = None
        try:  # the script's own, or what its Trainer builds (once: read_trainer's)
            built = built_optimizer(trainer)
        except JobError:  # its build raised: the job's optimizer is the command line's
            built = False
        self._own = own_optimizer(built or None)
        self._script_optimizer = None if built is False else _script_optimizer(trainer, built)
        """The job fields of the optimizer the script steps (None: one plan refuses)."""

    # --- the configuration on the live trainer ------------------------------------------------
    def _workload(self, job: JobSpec) -> RealWorkload:
        tr, base = self.trainer, self.base
        ckpt_on = bool(getattr(base, "is_activation_checkpointing", None)
                       or getattr(base, "is_gradient_checkpointing", False))
        if job.grad_ckpt == "full" and not ckpt_on:
            args = self._args0  # the kwargs under either transformers' name
            enable_checkpointing(base, "full", kwargs=getattr(
                args, "activation_checkpointing_kwargs", None) or getattr(
                args, "gradient_checkpointing_kwargs", None))
        elif job.grad_ckpt != "full" and ckpt_on:
            disable_checkpointing(base)
            if not self._input_grads0 and getattr(base, "_require_grads_hooks", None):
                # reentrant checkpointing made the embeddings' output require grad; left on,
                # every later probe would keep that gradient too (measured: +6 % of this peak)
                base.disable_input_require_grads()
        want = TRANSFORMERS_ATTENTION[job.attention]
        if getattr(base.config, "_attn_implementation", want) != want:
            base.set_attn_implementation(want)
        tr.model.train()
        optimizer = self._optimizer(job)
        trainable = sum(p.numel() for p in tr.model.parameters() if p.requires_grad)
        self._wl = RealWorkload(tr.model, optimizer, autocast_for(job, self.device),
                                scaler_for(job, self.device), self.device,
                                sum(p.numel() for p in tr.model.parameters()), trainable,
                                step_model=_TrainerLoss(tr))
        return self._wl

    def _optimizer(self, job: JobSpec) -> torch.optim.Optimizer:
        """The optimizer the script steps, with the job's implementation, where the job's
        optimizer fields are the script's: its own rebuilt (:func:`rebuild_own`), else the one its
        trainer builds (its parameter groups, weight decay, ``args.optim``). Where the command line
        changed them (``--optimizer``, ``--weight-decay``, ``--sgd-momentum``), the job's, as
        trainfit builds it: the trainer's build of another optimizer is not the job tune writes (a
        review: ``--optimizer sgd`` measured HF's SGD without momentum, the job 0.9)."""
        from transformers.training_args import OptimizerNames

        tr = self.trainer
        script = self._script_optimizer
        same = script is not None and all(getattr(job, k) == v for k, v in script.items()
                                          if k != "optimizer_impl")
        own = None
        if same and self._own is not None:
            # a class that cannot be rebuilt with this kernel (an __init__ argument its defaults
            # do not hold): the job as trainfit builds it — the one plan predicted — rather than
            # the whole tune lost (a review)
            with contextlib.suppress(JobError):
                own = rebuild_own(self._own, job)
        if own is not None:
            tr.optimizer = own
        elif same and self._own is None:
            tr.args.optim = OptimizerNames(hf_training_args(job)["optim"])
            tr.optimizer = None
            tr.optimizer = tr.create_optimizer()
        else:
            tr.optimizer = make_optimizer(job, [p for p in tr.model.parameters()
                                                if p.requires_grad],
                                          simulate=False, lr=float(self._args0.learning_rate))
        return tr.optimizer

    def _steps(self, job: JobSpec, wl: RealWorkload, knobs: LoaderKnobs, count: int,
               tracker: LimitTracker | None) -> _ScriptSteps:
        return _ScriptSteps(self, job, wl, knobs, count, tracker)

    def restore_trainer(self) -> None:
        """The trainer's arguments as the script set them (the process ends after tune, but the
        record is read from them)."""
        self.trainer.args = self._args0
        self.trainer._train_batch_size = self._train_batch_size0


class _ScriptSteps:
    """Step 0: the longest samples; steps 1…: the trainer's own loader at the job's micro-batch."""

    def __init__(self, probe: ScriptProbe, job: JobSpec, wl: RealWorkload, knobs: LoaderKnobs,
                 count: int, tracker: LimitTracker | None) -> None:
        self.probe, self.job, self.wl, self.count, self.tracker = probe, job, wl, count, tracker
        self.micro = job.micro_batch or 1
        self.accum = job.grad_accum or 1
        self.per_step = self.micro * self.accum
        self.waits: list[float] = []
        self.tokens: list[int] = []
        tr = probe.trainer
        tr.args.dataloader_num_workers = knobs.num_workers
        tr.args.dataloader_pin_memory = knobs.pin_memory and probe.device.type == "cuda"
        tr.args.dataloader_persistent_workers = knobs.persistent_workers and knobs.num_workers > 0
        tr.args.dataloader_prefetch_factor = knobs.prefetch_factor if knobs.num_workers else None
        tr._train_batch_size = self.micro
        torch.manual_seed(probe.seed)  # the sampler's order: the same samples for every probe
        self.loader = tr.get_train_dataloader()
        self._it: Iterator[Any] | None = None
        self.cuda = probe.device.type == "cuda"

    def _longest(self) -> list[dict[str, torch.Tensor]]:
        """The metered step's micro-batches: the dataset's longest samples, collated as the
        trainer's loader collates them."""
        order = sorted(range(len(self.probe.lengths)), key=lambda i: -self.probe.lengths[i])
        ids = (order * (self.per_step // max(len(order), 1) + 1))[: self.per_step]
        ds, collate = self.loader.dataset, self.loader.collate_fn
        return [collate([ds[i] for i in ids[k:k + self.micro]])
                for k in range(0, self.per_step, self.micro)]

    def _next(self) -> dict[str, torch.Tensor]:
        t = time.perf_counter()
        if self._it is None:
            self._it = iter(self.loader)
        try:
            b = next(self._it)
        except StopIteration:  # a short dataset: the next epoch
            self._it = iter(self.loader)
            b = next(self._it)
        self.waits.append(time.perf_counter() - t)
        return b

    def _batches(self, s: int) -> list[dict[str, torch.Tensor]]:
        raw = self._longest() if s == 0 and self.probe.lengths else [
            self._next() for _ in range(self.accum)]
        out = []
        for b in raw:
            b = {k: v.to(self.probe.device, non_blocking=self.cuda) if isinstance(v, torch.Tensor)
                 else v for k, v in b.items()}
            if s == 0 and self.tracker is not None:
                for v in b.values():
                    if isinstance(v, torch.Tensor):
                        self.tracker.track(v, "buffers")
            out.append(b)
        if s > 0:
            mask = [b.get("attention_mask") for b in out]
            self.tokens.append(sum(int(m.sum()) if isinstance(m, torch.Tensor) else
                                   int(b["input_ids"].numel()) for m, b in zip(mask, out, strict=True)))
        return out

    def step(self, s: int, model: Any, observer: LimitTracker | None) -> float:
        """Step ``s``; its wall time with the data wait (fetch and copy) in it, as Probe's."""
        t = time.perf_counter()
        batches = self._batches(s)
        train_step(model, self.wl.optimizer, iter(batches), grad_accum=self.accum,
                   autocast=self.wl.autocast, max_grad_norm=self.job.max_grad_norm,
                   scaler=self.wl.scaler, observer=observer, grads_to_none=self.job.grads_to_none)
        if self.cuda:
            torch.cuda.synchronize(self.probe.device)
        return time.perf_counter() - t

    def tokens_per_step(self) -> float:
        """Non-padding tokens per step of the timed steps (measured: the same samples for every
        configuration, so equal across probes of one tune)."""
        return sum(self.tokens) / len(self.tokens) if self.tokens else float(self.per_step)

    def close(self) -> None:
        self._it = None
