"""``trainfit plan --gpu GPU -- python train.py ARGS``: the script's trainer read without weights,
mapped to a job, planned as ``plan`` plans a job file (the same grid, the same simulations), and
the pick said as the keywords to change in the script.

The pick is planned at the longest batch the script's data makes (every epoch reaches it: a pick
that fits shorter batches would run out of memory there); the grid is also planned at a high
quantile of the batch lengths, for comparison, and said to be that.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfit.hardware.gpus import GpuSpec
from trainfit.job import DEFAULT_MARGIN, JobError, JobSpec
from trainfit.model.config_file import config_from_dict
from trainfit.model.source import (
    ModelSource,
    build_config,
    check_seq_len,
    resolve_model,
    source_of,
)
from trainfit.plan.grid import plan
from trainfit.plan.result import PlanResult
from trainfit.script.diff import KeywordChange, keyword_diff
from trainfit.script.launch import run_script
from trainfit.script.mapping import (
    QUANTILE,
    ReadJob,
    ScriptNote,
    map_record,
    script_as_read,
    with_flags,
)

QUANTILE_PLAN_BELOW = 0.9
"""The grid is planned again at the quantile's batch length when that is at most this fraction of
the longest (closer, the two plans differ by a few positions per sample: said, not planned)."""
CONFIG_NOISE = {"_name_or_path", "transformers_version", "dtype", "torch_dtype",
                "quantization_config", "_attn_implementation_autoset", "use_cache",
                "architectures", "_commit_hash", "attn_implementation", "output_attentions"}
"""Config keys that do not change the architecture (left out when the script's config is compared
with the one its name resolves to)."""


@dataclass
class ModelCheck:
    """The model as the script built it against the model trainfit plans (both on meta)."""

    script_total_params: int
    planned_total_params: int
    script_trainable_params: int
    planned_trainable_params: int
    script_lora_layers: int
    planned_lora_layers: int
    script_frozen_bytes: int
    """Bytes of the frozen weights outside 4-bit layers, in the dtypes the script holds them."""
    planned_frozen_bytes: int

    @property
    def equal(self) -> bool:
        return (self.script_total_params, self.script_trainable_params, self.script_lora_layers,
                self.script_frozen_bytes) == (self.planned_total_params,
                                              self.planned_trainable_params,
                                              self.planned_lora_layers, self.planned_frozen_bytes)


@dataclass
class ScriptPlan:
    command: list[str]
    record: dict[str, Any]
    """What the trainer held (trainfit.script.read), as read."""
    read: ReadJob
    current: JobSpec
    """The script's configuration, as planned (at the longest batch)."""
    plan: PlanResult
    """The grid at the longest batch: the pick."""
    plan_quantile: PlanResult | None
    """The grid at the ``QUANTILE`` batch length (None: the same length as the longest)."""
    changes: list[KeywordChange]
    check: ModelCheck | None
    notes: list[ScriptNote] = field(default_factory=list)
    as_read: JobSpec | None = None
    """The script's own configuration (the command line's setting flags over it: seq_len,
    ranks, …), the one the pick is compared with and the keyword change is said from; ``current``
    is it with every flag over it (the grid's base)."""
    given: frozenset[str] = frozenset()
    """The fields the command line set."""


def gpu_for_hooks(gpu: GpuSpec | None) -> dict[str, Any] | None:
    """What ``device_map`` placement sees in the script: the card's memory less its CUDA context
    (the free memory accelerate reads before any weight is loaded)."""
    if gpu is None:
        return None
    return {"name": gpu.display_name, "free_bytes": max(gpu.memory_bytes - gpu.cuda_context_bytes, 0)}


def _without_noise(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` without :data:`CONFIG_NOISE`, also in its sub-configurations (a multimodal model's
    ``text_config``: ``from_pretrained(dtype=...)`` sets the dtype in each)."""
    return {k: _without_noise(v) if isinstance(v, dict) and "model_type" in v else v
            for k, v in d.items() if k not in CONFIG_NOISE}


def script_source(rec: dict[str, Any], trust_remote_code: bool) -> tuple[ModelSource, str]:
    """(the model source, the job's ``model`` string): what the script's model name resolves to
    when its configuration is the script's, else the script's configuration itself."""
    m = rec["model"]
    cfg_dict = _without_noise(m["config"])
    name = m["name_or_path"]
    if name and (Path(name).exists() or ("/" in name and not name.startswith((".", "/")))):
        try:
            src = resolve_model(name, trust_remote_code)
        except JobError:
            src = None
        if src is not None:
            # as the record travelled: through JSON (integer keys of id2label become strings)
            theirs = json.loads(json.dumps(_without_noise(build_config(src).to_dict()),
                                           default=str))
            if theirs == cfg_dict:
                return dataclasses.replace(src, task=m["task"]), name
    cfg = config_from_dict(cfg_dict, name or "the script's config")
    return source_of(name or "the script's config", cfg, m["task"], "script",
                     "the configuration the script built (it differs from what its name "
                     "resolves to, or it has no name)"), name or "<the script's config>"


def _grid_job(current: JobSpec, given: set[str]) -> JobSpec:
    """The grid around the script's configuration: micro-batch (accumulation keeping the effective
    batch), checkpointing and precision vary unless the command line fixes them."""
    changes: dict[str, Any] = {k: None for k in ("grad_ckpt", "precision") if k not in given}
    # --grad-accum alone fixes the split as --micro-batch does (with_flags derived the other from
    # the effective batch): the model form's rule (JobSpec), which the grid here dropped (a review)
    if not {"micro_batch", "grad_accum"} & given:
        changes.update(micro_batch=None, grad_accum=None, effective_batch=current.effective_batch)
    return JobSpec.from_dict({**current.to_dict(), **changes}, source="the script")


def check_flag_precision(flags: dict[str, Any], gpu: GpuSpec | None) -> None:
    """A bf16 ``--precision`` on a card without bf16: the flag's error, said before the script
    runs (an audit: it was blamed on a script that sets bf16=False)."""
    p = flags.get("precision")
    if gpu is not None and isinstance(p, str) and "bf16" in p and not gpu.bf16_supported:
        raise JobError(f"--precision {p}: {gpu.display_name} has no bf16 support",
                       "use --precision amp-fp16 (or drop the flag to plan the script's own "
                       "precision), or plan for a GPU with bf16 (--gpu)")


def check_script_precision(current: JobSpec, gpu: GpuSpec | None, args_class: str = "") -> None:
    """``args_class``: the script's arguments' class (SFTConfig turns bf16 on by itself)."""
    if gpu is not None and current.precision and "bf16" in current.precision \
            and not gpu.bf16_supported:
        # TRL's configs (SFTConfig, DPOConfig, ...) turn bf16 on unless told otherwise: a script
        # that never set it meets this too (a QA run); the flag plans fp16 without editing it
        whence = (f" (TRL's {args_class} sets bf16=True unless told otherwise)"
                  if args_class.endswith("Config") else "")
        raise JobError(f"the script trains in bf16 ({current.precision}) but {gpu.display_name} "
                       f"has no bf16 support{whence}", "plan it in fp16 as is with --precision "
                       "amp-fp16, and set "
                       "bf16=False, fp16=True in the script (dtype=torch.float16 for a LoRA "
                       "base) to run it; or plan for a GPU with bf16 (--gpu)")


def plan_script(cmd: list[str], *, gpu: GpuSpec | None, flags: dict[str, Any] | None = None,
                margin: float = DEFAULT_MARGIN, verify: bool = True,
                trust_remote_code: bool = False, timeout_s: float | None = 900.0,
                quantile: float = QUANTILE, dataset_tokens: int | None = None,
                epochs: float | None = None) -> ScriptPlan:
    flags = dict(flags or {})
    check_flag_precision(flags, gpu)
    rec = run_script(cmd, mode="plan", gpu=gpu_for_hooks(gpu), trust_remote_code=trust_remote_code,
                     timeout_s=timeout_s)
    read = map_record(rec, frozenset(flags), quantile, flags.get("sharding"))
    source, model = script_source(rec, trust_remote_code)
    base = {**read.fields, "model": model, "trust_remote_code": trust_remote_code}
    current = JobSpec.from_dict(with_flags(base, flags), source="the script")
    from trainfit.speed.comm import check_link_reach, given_link

    if gpu is not None and given_link(gpu):
        # the script's world size (torchrun, WORLD_SIZE) against the link named (a review: 4
        # ranks were timed on a bridge that joins 2)
        check_link_reach(gpu, gpu.interconnect.removesuffix(" (given)"), current.ranks)
    if "seq_len" in flags:  # the data's own length runs as the script runs it (a note if long)
        check_seq_len(current.seq_len, source)
    check_script_precision(current, gpu, str(rec.get("args", {}).get("class", "")))
    as_read = script_as_read(rec, base, flags, quantile, read) or current
    grid = _grid_job(current, set(flags))
    result = plan(grid, source, gpu, margin=margin, verify=verify, current=as_read,
                  dataset_tokens=dataset_tokens, epochs=epochs)
    q_len = read.lengths.batch_quantile_length
    plan_q = None
    if q_len <= QUANTILE_PLAN_BELOW * current.seq_len and "seq_len" not in flags:
        plan_q = plan(grid.replace(seq_len=q_len), source, gpu, margin=margin, verify=verify,
                      ladder=False, current=current.replace(seq_len=q_len))
    pick = result.pick
    changes = keyword_diff(rec, as_read, pick.job) if pick is not None and gpu is not None else []
    notes = [] if gpu is not None else [ScriptNote("no_gpu")]
    # built after the plans: the plan's workers are forked, and a parent that has built a model
    # first deadlocked its children (trainfit.plan.workers.SimulationWorkers)
    return ScriptPlan(command=cmd, record=rec, read=read, current=current, plan=result,
                      plan_quantile=plan_q, changes=changes, check=model_check(rec, current, source),
                      notes=notes, as_read=as_read, given=frozenset(flags))


def model_check(rec: dict[str, Any], job: JobSpec, source: ModelSource) -> ModelCheck:
    """Counts of the planned model (built on meta, as plan simulates it) beside the script's."""
    from peft.tuners.lora import LoraLayer

    from trainfit.model.workload import build_model_on_meta

    model, info = build_model_on_meta(job, source)
    frozen = 0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) not in seen and not p.requires_grad:
            seen.add(id(p))
            frozen += p.numel() * p.element_size()
    lora_layers = sum(isinstance(m, LoraLayer) for m in model.modules())
    m = rec["model"]
    sizes = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
    script_frozen = sum(d["count"] * sizes.get(d["dtype"], 1) for d in m["params_by_dtype"]
                        if not d["trainable"] and not d["quantized"])
    del model
    return ModelCheck(script_total_params=m["total_params"], planned_total_params=info.total_params,
                      script_trainable_params=m["trainable_params"],
                      planned_trainable_params=info.trainable_params,
                      script_lora_layers=len((rec["lora"] or {}).get("adapted", [])),
                      planned_lora_layers=lora_layers, script_frozen_bytes=script_frozen,
                      planned_frozen_bytes=frozen)
