"""DeepSpeed ZeRO's own Python in a micro-step: the host time of its hooks, predicted from counts.

Why.  A ZeRO-3 rank runs DeepSpeed's code around every module: a forward pre-hook that fetches
(all-gathers) the module's partitioned parameters and records the trace, a post-hook that
releases them, the same pair in the backward (``runtime/zero/parameter_offload.py``:
``_register_hooks_recursively`` hooks every module), and a gradient hook per trainable parameter
that copies its gradient into the reduce bucket and reduce-scatters full buckets
(``stage3.py``: ``reduce_partition_and_remove_grads``).  ZeRO-2 has the gradient hook alone
(``stage_1_and_2.py``: ``reduce_ready_partitions_and_remove_grads``).  That Python runs on the
host, between the step's kernel launches: a plan row timed as a plain step's ops was an upper
bound on its tokens/s (a 4-layer Mixtral read 36 % faster under ZeRO-3 than under FSDP).  Users
see it: "per-parameter Python hooks installed on every backward pass dominate step time" of a
model with many small parameters under ZeRO-2, 2.9× slower than DDP on 8 A100s
(TensorAuto/OpenTau#177); ZeRO-3's hooks are what DeepSpeed's ``module_granularity_threshold``
(deepspeedai/DeepSpeed#6649) coalesces to cut "host overhead".

How.  DeepSpeed 0.19.8 run on one gloo rank on a CPU (its CPU accelerator), tiny Llama models
whose widths keep the real ratio to the persistence threshold (HF Trainer's and accelerate's
"auto" ``stage3_param_persistence_threshold`` = 10 × hidden: norms and rank-8 LoRA matrices
persist, projections are partitioned, at any width), the micro-step (forward + backward) under
the engine against the same step of an identical plain model, interleaved, in reference ops
(:func:`trainfit.speed.host_timing.reference_op_s`) — ``benchmarks/zero_hooks.py``, results in
``benchmarks/results/zero_hooks.{json,md}``.  The extra cost was fitted there as a sum over
counts of the model as it trains (:class:`HookCounts`): per module hook call, per partitioned
parameter fetched, per trainable parameter's gradient hook.  ``stage3_max_reuse_distance`` was
0 there, so every fetch gathers again, as at scale, where a layer's parameters are released
before the backward reaches them (a model within the default 1e9-element reuse distance keeps
them gathered: its fetches cost less than charged).

What it does not count: CUDA's side of the same code (stream waits, event records, the NCCL
launches of each gather: a few µs each on a GPU host, nothing on the CPU accelerator) — so the
time is a floor, and a ZeRO row's tokens/s still leans high; the device's copies into and out
of the flat buckets (memory traffic, not host time).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# fitted (least squares, every cost ≥ 0) to 12 cases of DeepSpeed 0.19.8 on this CPU
# (benchmarks/results/zero_hooks.md): residuals within FIT_RESIDUALS; ``python
# benchmarks/zero_hooks.py`` measures them again
ZERO3_OPS_PER_MICRO_STEP = 0.0
"""Reference ops per micro-step whatever the model (the engine's forward and backward)."""
ZERO3_OPS_PER_MODULE_CALL = 7.6
"""Reference ops per running module and pass (forward, backward, a checkpointed layer's
recompute): DeepSpeed's pre/post hook pair."""
ZERO3_OPS_PER_FETCH = 23.0
"""Reference ops per partitioned parameter fetched and released (each pass)."""
ZERO3_OPS_PER_TRAINABLE = 62.9
"""Reference ops per trainable parameter's gradient hook (once per micro-step)."""
ZERO2_OPS_PER_MICRO_STEP = 184.5
ZERO2_OPS_PER_TRAINABLE = 19.7
"""ZeRO-2's gradient hook, per trainable parameter and micro-step."""
FIT_RESIDUALS = {"zero3": "−7 … +11 %", "zero2": "−18 … +48 %"}
"""How far the fit lies from the 12 measured cases (tiny models on a CPU, in-sample): not an
error band on a GPU host, where nothing here was checked."""
DEEPSPEED_MEASURED = "0.19.8"
PERSISTENCE_PER_HIDDEN = 10
"""``stage3_param_persistence_threshold`` = 10 × hidden size: what HF Trainer
(``integrations/deepspeed.py``, ``trainer_config_process``) and accelerate
(``_prepare_deepspeed``) write for "auto"; a parameter of at most that many elements is never
partitioned (``partition_parameters.py``: ``ds_numel <= param_persistence_threshold``)."""


@dataclass(frozen=True, kw_only=True)
class HookCounts:
    """What DeepSpeed's hooks run over in one micro-step (counted on the model as it trains)."""

    modules: int
    """Modules that run (each fires DeepSpeed's hook pairs), the root included; containers
    (:data:`CONTAINERS`) never run."""
    recomputed_modules: int
    """Of those, the ones inside checkpointed layers: their forward hooks run again in the
    backward."""
    partitioned: int
    """Parameters above the persistence threshold (fetched and released in each pass)."""
    recomputed_partitioned: int
    """Of those, the ones inside checkpointed layers (fetched a third time)."""
    trainable: int
    """Trainable parameters (a gradient hook each)."""

    @property
    def module_calls(self) -> int:
        return 2 * self.modules + self.recomputed_modules

    @property
    def fetches(self) -> int:
        return 2 * self.partitioned + self.recomputed_partitioned


def _layer_stack(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The repeated layers (the largest ``ModuleList``): what checkpointing recomputes."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=lambda m: sum(1 for _ in m.modules()), default=None)


CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList,
              torch.nn.ParameterDict)
"""Modules that hold others and never run (no ``forward`` is called): DeepSpeed hooks them, but
their hooks never fire (a review, with DeepSpeed's own hook wrapped: a 4-layer LoRA model fired
171 pre-forward hooks for its 341 modules, PEFT's ``lora_A`` / ``lora_B`` / ``lora_dropout``
dicts among them)."""


def _running(module: torch.nn.Module) -> int:
    """Modules whose forward a pass calls: not the containers, nor PEFT's tuner wrapper
    (``LoraModel``), which ``PeftModel.forward`` steps over to the base model (one module,
    where ``PeftModelForCausalLM`` does call it: the count is then one short)."""
    try:
        from peft.tuners.tuners_utils import BaseTuner
        skipped: tuple[type, ...] = (*CONTAINERS, BaseTuner)
    except ImportError:  # no peft: no tuner
        skipped = CONTAINERS
    return sum(1 for m in module.modules() if not isinstance(m, skipped))


def hook_counts(model: torch.nn.Module, hidden: int, checkpointed: bool) -> HookCounts:
    """:class:`HookCounts` of ``model`` (on any device, the meta one included) with the "auto"
    persistence threshold of a model of width ``hidden``."""
    threshold = PERSISTENCE_PER_HIDDEN * hidden
    stack = _layer_stack(model) if checkpointed else None
    inner_modules = 0 if stack is None else _running(stack)
    inner = set() if stack is None else {id(p) for p in stack.parameters()}
    params = list(model.parameters())
    partitioned = [p for p in params if p.numel() > threshold]
    return HookCounts(modules=_running(model), recomputed_modules=inner_modules,
                      partitioned=len(partitioned),
                      recomputed_partitioned=sum(1 for p in partitioned if id(p) in inner),
                      trainable=sum(1 for p in params if p.requires_grad))


def hook_ops(counts: HookCounts, stage: int) -> float:
    """Predicted reference ops of DeepSpeed's hooks in one micro-step at ZeRO ``stage``."""
    if stage == 3:
        return (ZERO3_OPS_PER_MICRO_STEP + ZERO3_OPS_PER_MODULE_CALL * counts.module_calls
                + ZERO3_OPS_PER_FETCH * counts.fetches
                + ZERO3_OPS_PER_TRAINABLE * counts.trainable)
    if stage == 2:
        return ZERO2_OPS_PER_MICRO_STEP + ZERO2_OPS_PER_TRAINABLE * counts.trainable
    return 0.0
