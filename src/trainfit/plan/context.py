"""What a plan was computed under, and what its pick means for loading the model.

:class:`PlanAssumptions`: the job's fixed fields (method, quantisation, sequence length, effective
batch, ranks, sharding, optimizer, attention and the kernel the simulation chose for it) and the
library versions the simulation ran — the plan runs the installed torch / transformers / peft /
bitsandbytes on data-less tensors, so their versions are part of what is predicted.

:class:`OffloadCheck`: whether HF's ``device_map="auto"`` would put the pick's weights anywhere but
the GPU. transformers (integrations/accelerate.py, ``get_balanced_memory``, 5.23) gives one GPU
90 % of the memory free at load time for the weights, and offloads the modules beyond it to host
RAM (then disk) — at load time, from the weights' sizes alone; memory that runs out during training
is an out-of-memory error, not an offload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from trainfit.hardware.gpus import GpuSpec
from trainfit.job import JobSpec
from trainfit.memory.expandable import env_expandable_segments
from trainfit.model.experts import stacked_expert_params_of, stacked_when_stored_params_of
from trainfit.model.standins import linear_subclass_params_of

STACK = ("torch", "transformers", "peft", "bitsandbytes")
"""The libraries whose code the simulation runs (their versions change what is predicted)."""

AUTO_MAP_GPU_FRACTION = 0.9
"""transformers 5.23 ``get_balanced_memory``: with one GPU and no ``max_memory`` given, "90% is a
good compromise" of the free memory holds the weights; the rest is left for the buffers."""


def installed_versions() -> dict[str, str | None]:
    """The installed versions of :data:`STACK` (None: not installed), from package metadata."""
    out: dict[str, str | None] = {}
    for dist in STACK:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


@dataclass(frozen=True, kw_only=True)
class PlanAssumptions:
    """The fields every row of a plan shares, and the stack it was simulated with."""

    method: str
    quant: str | None
    """4-bit format of a qlora base (None otherwise)."""
    lora_r: int | None
    """LoRA rank (None for full fine-tuning)."""
    seq_len: int
    effective_batch: int | None
    """Samples per optimizer step; None: not given, so rows differ (micro-batch × 1 × ranks)."""
    ranks: int
    sharding: str
    optimizer: str
    attention: str
    """The job's attention setting (sdpa lets torch pick the kernel)."""
    attention_kernels: dict[str, int] = field(default_factory=dict)
    """The kernels the simulation of the pick (or the first row) dispatched, with call counts:
    flash, efficient, math (what torch's SDPA picks on this GPU for these shapes and dtype)."""
    experts_16bit_params: int = 0
    """QLoRA of a mixture-of-experts model: the routed experts' parameters kept in stacked tensors,
    which transformers 5's 4-bit conversion (``nn.Linear`` layers only) leaves in 16 bits, as the
    simulation does (:func:`trainfit.model.experts.stacked_expert_params`); 0 otherwise."""
    experts_4bit_if_stored: bool = False
    """Those experts would be 4-bit in a checkpoint published 4-bit (transformers unstacks
    Llama-4's into ``nn.Linear`` layers before it loads one): the note names the way out."""
    linear_subclasses_16bit_params: dict[str, int] = field(default_factory=dict)
    """QLoRA through transformers: the parameters of layers that subclass ``nn.Linear``
    (Falcon's ``FalconLinear``), by class name, which its 4-bit conversion leaves 16-bit, as the
    simulation does (:func:`trainfit.model.standins.linear_subclass_params`); empty otherwise."""
    attention_kernels_by_precision: dict[str, list[str]] = field(default_factory=dict)
    """Every row's kernels, by precision: SDPA picks by dtype (an fp32 row of a grouped-query model
    takes the math kernel where its 16-bit rows take flash), so one row's kernels need not be
    every row's."""
    versions: dict[str, str | None] = field(default_factory=dict)
    """torch, transformers, peft, bitsandbytes as installed where the plan ran."""
    assumed: list[str] = field(default_factory=list)
    """Job fields the job file marks as assumed (not stated by the user)."""
    optimizer_in_backward: bool = False
    """Each parameter's optimizer steps in the backward pass (no whole-model gradients)."""
    offload: str = "none"
    """CPU offload under sharding: none, optimizer, all (JobSpec.offload)."""
    expandable_segments: bool = False
    """The caching allocator planned for: expandable segments (True) or PyTorch's default."""
    shell_expandable_segments: bool = False
    """The environment the plan ran in sets expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF or
    PYTORCH_ALLOC_CONF): a run started from it uses that allocator, whatever was planned."""
    lora_modules: list[str] = field(default_factory=list)
    """LoRA / QLoRA: the layers adapted, by their names' last part (``q_proj``, ``v_proj``;
    ``all-linear``); empty for full fine-tuning."""
    lora_modules_from: str = ""
    """Where :attr:`lora_modules` came from: the job's ``lora_targets``, peft's default for the
    model type, or trainfit's q, v where peft has none (an audit: 13 of 32 architectures tried
    have none in peft 0.21, and the plan never said what it adapted)."""


def plan_assumptions(job: JobSpec, kernels: dict[str, int],
                     assumed: list[str] | None = None,
                     kernels_by_precision: dict[str, list[str]] | None = None,
                     source: Any = None) -> PlanAssumptions:
    """``job``: the planned job (its effective batch as asked); ``kernels``: the pick's SDPA
    kernels; ``kernels_by_precision``: every row's, by precision; ``source``: the model (its
    stacked experts, for QLoRA's 16-bit-experts note)."""
    lora = job.method in ("lora", "qlora")
    stacked = stacked_expert_params_of(source) if source is not None else 0
    # Lightning's fp16-quantizing stack converts every isinstance(nn.Linear): nothing kept
    kept = linear_subclass_params_of(source) if source is not None and \
        job.method == "qlora" and not job.quant_from_fp16 else {}
    return PlanAssumptions(method=job.method, quant=job.quant, lora_r=job.lora_r if lora else None,
                           seq_len=job.seq_len, effective_batch=job.effective_batch,
                           ranks=job.ranks, sharding=job.sharding, optimizer=job.optimizer,
                           attention=job.attention, attention_kernels=dict(kernels),
                           attention_kernels_by_precision=dict(kernels_by_precision or {}),
                           experts_16bit_params=stacked if job.method == "qlora" else 0,
                           linear_subclasses_16bit_params=kept,
                           experts_4bit_if_stored=source is not None and
                           stacked_when_stored_params_of(source) < stacked,
                           versions=installed_versions(), assumed=list(assumed or []),
                           optimizer_in_backward=job.optimizer_in_backward,
                           offload=job.offload, expandable_segments=job.expandable_segments,
                           shell_expandable_segments=env_expandable_segments(),
                           **(dict(zip(("lora_modules", "lora_modules_from"),
                                       lora_modules_of(job, source), strict=True))
                              if lora and source is not None else {}))


def lora_modules_of(job: JobSpec, source: Any) -> tuple[list[str], str]:
    """(the adapted layers' last name parts, where they came from) for a LoRA ``job`` on
    ``source``: resolved on the bare meta model as the simulation resolves them
    (:func:`trainfit.model.lora_targets.resolve_targets`)."""
    from trainfit.job import JobError
    from trainfit.model.lora_targets import peft_default_targets, resolve_targets
    from trainfit.model.workload import bare_model_on_meta

    model_type = str(getattr(source.config, "model_type", ""))
    if job.lora_targets != ["default"]:
        origin = "lora_targets " + ",".join(job.lora_targets)  # a flag, a file or a script
    elif peft_default_targets(model_type) is not None:
        origin = f"peft's default for {model_type}"
    else:
        origin = f"peft has no default for {model_type}: trainfit's q, v"
    model = bare_model_on_meta(source)
    try:
        targets = resolve_targets(model, job.lora_targets, model_type) if model is not None \
            else list(job.lora_targets)
    except JobError:
        targets = list(job.lora_targets)
    if isinstance(targets, str):
        return [targets], origin
    return sorted({t.rsplit(".", 1)[-1] for t in targets}), origin


@dataclass(frozen=True, kw_only=True)
class OffloadCheck:
    """Would ``device_map="auto"`` offload the pick's weights, and does the pick stay on the GPU."""

    weights_bytes: int
    """The weights as loaded on the GPU (predicted: the ``parameters`` term at the peak; 4-bit
    layers counted at their packed size)."""
    auto_map_budget_bytes: int
    """What ``device_map="auto"`` gives the GPU for weights: 90 % of the card's memory less the
    CUDA context (free memory on an otherwise idle card)."""
    weights_offloaded: bool
    """``weights_bytes`` > the budget: auto would put modules on the host."""
    device_peak_bytes: int
    """The pick's device peak (predicted)."""
    capacity_bytes: int
    runs_on_gpu: bool
    """Weights not offloaded, the device peak within the card and nothing of the step kept in
    host RAM (no CPU offload, no activation offload): the whole step runs on the GPU."""
    offload: str = "none"
    """The pick's own CPU offload (``offload``: optimizer / all), as its job sets it."""
    host_offload_bytes: int = 0
    """Host RAM that offload holds per rank (predicted; 0 without one)."""
    ranks: int = 1
    activation_offload: bool = False
    """The pick's saved activations wait in host RAM (TRL's manager)."""
    host_activation_bytes: int | None = 0
    """Pinned host RAM those activations hold per rank (predicted; 0 without activation
    offload, None: not known — ``MemoryPrediction.host_activation_bytes``)."""
    host_activation_exact: bool = True
    """Each offloaded tensor's power-of-two block was predicted; False: the bound, twice the bytes
    copied."""


def offload_check(pick: Any, gpu: GpuSpec | None) -> OffloadCheck | None:
    """``pick``: the recommended PlanRow (None → None); None without a GPU."""
    if pick is None or gpu is None:
        return None
    weights = int(pick.memory.breakdown.get("parameters", 0))
    budget = int(AUTO_MAP_GPU_FRACTION * (gpu.memory_bytes - gpu.cuda_context_bytes))
    dev = pick.memory.peak_device_bytes
    offloaded = weights > budget
    job = pick.job
    return OffloadCheck(weights_bytes=weights, auto_map_budget_bytes=budget,
                        weights_offloaded=offloaded, device_peak_bytes=dev,
                        capacity_bytes=gpu.memory_bytes,
                        runs_on_gpu=(not offloaded and dev <= gpu.memory_bytes
                                     and job.offload == "none" and not job.activation_offload),
                        offload=job.offload, host_offload_bytes=pick.memory.host_offload_bytes,
                        ranks=job.ranks, activation_offload=job.activation_offload,
                        host_activation_bytes=pick.memory.host_activation_bytes,
                        host_activation_exact=pick.memory.host_activation_exact)
