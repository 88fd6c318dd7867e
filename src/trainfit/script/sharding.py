"""The data-parallel engine a script's Trainer runs — FSDP or DeepSpeed ZeRO — read from its
``TrainingArguments`` (``fsdp`` / ``fsdp_config``, ``deepspeed``) or from ``accelerate launch``'s
environment (``ACCELERATE_USE_FSDP`` + ``FSDP_*``, ``ACCELERATE_USE_DEEPSPEED``) into the record
(:func:`read_sharding`), and mapped to the job's sharding fields (:func:`sharding_fields`).

Before this was read, a script that shards was planned as plain DDP (every rank holding the whole
model, its gradients and states), told it does not fit where it does. What the engine does that
plan cannot represent without under-predicting is refused (FSDP's SHARD_GRAD_OP / hybrid
sharding, NVMe offload, a DeepSpeed optimizer plan does not model); what it represents by the
nearest knob (ZeRO-1 as DDP, explicit bucket sizes past what plan models) is said in a note.

:func:`sharding_fields` is pure Python (no torch): tested on records alone.
"""

from __future__ import annotations

import os
from typing import Any

from trainfit.job import JobError
from trainfit.job.combinations import ZERO_BUCKETS  # key → (field, DeepSpeed's default, stages)

FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                   "_HYBRID_SHARD_ZERO2")
"""FSDP1's sharding strategies, in torch's ``ShardingStrategy`` order (accelerate's
``FSDP_SHARDING_STRATEGY``: a number 1-5 names one too)."""

ZERO_KNOBS = ("stage3_param_persistence_threshold", "stage3_max_live_parameters",
              "stage3_max_reuse_distance")
"""``zero_optimization`` sizes (elements) plan models at the values accelerate's and the HF docs'
configs give ("auto", filled from the hidden size h by transformers ``integrations/deepspeed.py``,
or DeepSpeed's defaults): a script's explicit number is compared with them (a note)."""


def _flag(value: Any) -> bool:
    """accelerate's ``str_to_bool`` over a config or environment value."""
    return str(value).strip().lower() in ("1", "true", "yes", "y", "t", "on")


def read_sharding(args: Any, fsdp_plugin_args: dict[str, Any] | None = None,
                  fsdp_env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The record of the script's data-parallel engine, or None (DDP or one process).
    ``fsdp_plugin_args`` / ``fsdp_env``: ``args.fsdp_plugin_args`` and accelerate's ``FSDP_*``
    environment as the script had them, where the hooks took them away so that a one-process
    Trainer could be built (transformers refuses FSDP outside a distributed run; accelerate's
    plugin looks for a GPU): read in their place."""
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is not None:
        where = ("TrainingArguments(deepspeed=...)" if getattr(args, "deepspeed", None)
                 else "accelerate launch (ACCELERATE_USE_DEEPSPEED)")
        return _deepspeed(dict(plugin.deepspeed_config or {}), where)
    env = dict(os.environ if fsdp_env is None else fsdp_env)
    given = fsdp_plugin_args or getattr(args, "fsdp_plugin_args", None)
    if given:
        return _fsdp(dict(given), env, "TrainingArguments(fsdp=..., fsdp_config=...)")
    if _flag(env.get("ACCELERATE_USE_FSDP", "false")):
        return _fsdp({}, env, "accelerate launch (ACCELERATE_USE_FSDP)")
    return None


def _fsdp(given: dict[str, Any], env: dict[str, str], where: str) -> dict[str, Any]:
    """FSDP's settings as accelerate's ``FullyShardedDataParallelPlugin.__post_init__`` resolves
    them (accelerate 1.x ``utils/dataclasses.py``): the plugin's arguments (transformers
    ``TrainingArguments._process_fsdp_args``), else the ``FSDP_*`` environment ``accelerate
    launch`` writes, else its defaults. Read here rather than by building the plugin, which
    looks for a GPU when it syncs module states (it raises on a machine without one)."""

    def get(key: str, env_key: str, default: Any) -> Any:
        return given[key] if given.get(key) is not None else env.get("FSDP_" + env_key, default)

    version = int(get("fsdp_version", "VERSION", "1"))  # the plugin's default version: 1
    if version == 2:
        strategy = "FULL_SHARD" if _flag(get("reshard_after_forward", "RESHARD_AFTER_FORWARD",
                                             "true")) else "SHARD_GRAD_OP"
    else:
        # FSDP1: the plugin always sets sharding_strategy (given, else FSDP_SHARDING_STRATEGY,
        # else FULL_SHARD), and accelerator.prepare takes it over reshard_after_forward (which
        # transformers' fsdp="shard_grad_op" writes: that run shards fully)
        raw = given.get("sharding_strategy") or env.get("FSDP_SHARDING_STRATEGY") or "FULL_SHARD"
        raw = str(getattr(raw, "name", raw)).upper()
        strategy = FSDP_STRATEGIES[int(raw) - 1] if raw.isdigit() and 1 <= int(raw) <= 5 else raw
    policy = get("auto_wrap_policy", "AUTO_WRAP_POLICY", "NO_WRAP")  # accelerate's default
    return {"engine": "fsdp", "where": where, "version": version, "strategy": strategy,
            "auto_wrap_policy": str(getattr(policy, "__name__", policy)).upper(),
            "cpu_offload": _flag(get("cpu_offload", "OFFLOAD_PARAMS", "false")),
            "activation_checkpointing": _flag(get("activation_checkpointing",
                                                  "ACTIVATION_CHECKPOINTING", "false")),
            "sync_module_states": _flag(get("sync_module_states", "SYNC_MODULE_STATES", "false")),
            "cpu_ram_efficient_loading": _flag(get("cpu_ram_efficient_loading",
                                                   "CPU_RAM_EFFICIENT_LOADING", "false"))}


def _device(block: Any) -> str:
    return str((block or {}).get("device") or "none").lower() if isinstance(block, dict) \
        else "none"


def _deepspeed(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The ZeRO settings of a DeepSpeed config (HF's ``HfTrainerDeepSpeedConfig`` after its
    "auto" values were filled from the arguments, or accelerate's from its environment)."""
    zero = cfg.get("zero_optimization") or {}
    opt_block, param_block = zero.get("offload_optimizer"), zero.get("offload_param")
    pins = [b.get("pin_memory") for b in (opt_block, param_block)
            if isinstance(b, dict) and _device(b) != "none"]
    optimizer = cfg.get("optimizer")
    knobs = {k: zero[k] for k in ZERO_KNOBS if k in zero and not isinstance(zero[k], str)}
    # absent (None: DeepSpeed's default runs), "auto" (filled from the hidden size), or a number
    buckets = {k: zero.get(k) for k in ZERO_BUCKETS}
    return {"engine": "deepspeed", "where": where, "stage": int(zero.get("stage", 0) or 0),
            "offload_optimizer": _device(opt_block), "offload_param": _device(param_block),
            # DeepSpeed 0.19's default pin_memory (offload_config.py) where the block says none
            "pin_memory": all(p is None or _flag(p) for p in pins),
            "optimizer": None if not isinstance(optimizer, dict) else {
                "type": str(optimizer.get("type", "")),
                "params": {k: v for k, v in (optimizer.get("params") or {}).items()
                           if isinstance(v, (int, float, str, bool, list, type(None)))}},
            "knobs": knobs, "buckets": buckets,
            # settings that hold more than plan's ZeRO: refused by the mapping
            # DeepSpeed's partial offload (stage 3; a missing ratio is 1: all on the host)
            "offload_ratio": 1.0 if _device(opt_block) != "cpu" or opt_block.get("ratio") is None
            else float(opt_block["ratio"]),
            "hpz_partition_size": int(zero.get("zero_hpz_partition_size", 1) or 1),
            "mics_shard_size": int(zero.get("mics_shard_size", -1) or -1),
            "grad_accum_dtype": str((cfg.get("data_types") or {}).get("grad_accum_dtype")
                                    or "")}


# --- the record → the job's fields (pure) ---------------------------------------------------
Notes = list[tuple[str, dict[str, Any]]]


def sharding_fields(rec: dict[str, Any], given_sharding: str | None = None
                    ) -> tuple[dict[str, Any], Notes, str | None]:
    """(job fields, notes as (kind, data), where it was read) of the script's engine; empty
    fields where it runs none (DDP). ``given_sharding``: the command line's ``--sharding``; where
    it names another engine than the script's, only what a DeepSpeed config's optimizer block
    decides is read (the script's own engine given keeps its settings: its no_sync, offload,
    buckets). Raises JobError for a setting plan cannot represent without under-predicting."""
    s = rec["args"].get("sharding")
    if not s:
        return {}, [], None
    if s["engine"] == "deepspeed":
        fields, notes = _optimizer_block(s)
        own = given_sharding is None or given_sharding == f"zero{min(int(s['stage']), 3)}"
        if own:
            # given on the command line, the engine is planned as asked: nothing refused
            more, more_notes = _zero_fields(s, rec, strict=given_sharding is None)
            fields, notes = {**more, **fields}, more_notes + notes
        return fields, notes, s["where"]
    if given_sharding not in (None, "fsdp"):
        return {}, [], s["where"]
    return (*_fsdp_fields(s, rec, strict=given_sharding is None), s["where"])


def _fsdp_fields(s: dict[str, Any], rec: dict[str, Any], strict: bool = True
                 ) -> tuple[dict[str, Any], Notes]:
    """``strict`` False (``--sharding fsdp`` given): planned as FULL_SHARD whatever the script's
    strategy and wrap (the refusals' hint), its other settings kept."""
    strategy, version = s["strategy"], int(s["version"])
    notes: Notes = []
    if not strict:
        # --sharding fsdp given: FULL_SHARD, per layer, whatever the script's strategy and wrap
        for what, on in ((f"strategy {strategy}", strategy != "FULL_SHARD"),
                         (f"wrap {s.get('auto_wrap_policy')}",
                          s.get("auto_wrap_policy") not in (None, "TRANSFORMER_BASED_WRAP"))):
            if on:
                notes.append(("engine_ignored", {"what": what, "engine": "FSDP"}))
        strategy = "FULL_SHARD"
    if strict and s["activation_checkpointing"] and rec["args"].get("gradient_checkpointing"):
        # transformers raises on the GPU run (Trainer.__init__: FSDP's activation_checkpointing
        # with the arguments' activation_checkpointing), a check plan's one process skips
        raise JobError(f"the script asks for FSDP's activation_checkpointing ({s['where']}) and "
                       "gradient_checkpointing=True: transformers refuses the two together when "
                       "the Trainer is built with FSDP", "keep FSDP's (fsdp_config's "
                       "activation_checkpointing) and drop gradient_checkpointing=True")
    policy = str(s.get("auto_wrap_policy") or "TRANSFORMER_BASED_WRAP")
    if strict and policy != "TRANSFORMER_BASED_WRAP" and not (rec.get("lora") and version == 1):
        # accelerate's default NO_WRAP leaves every layer in the root's one unit (all gathered
        # together); SIZE_BASED_WRAP makes other units than the decoder layers plan shards. A
        # peft model's policy is replaced by peft's, per layer (update_fsdp_plugin_peft), under
        # FSDP1 only: transformers calls it where it delays the optimizer's creation, which it
        # does not for FSDP2 (trainer.py), whose NO_WRAP then wraps the root alone (a review)
        raise JobError(f"the script's FSDP wraps with {policy} ({s['where']}): plan models "
                       "units of one decoder layer (TRANSFORMER_BASED_WRAP)",
                       "set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP (accelerate config) or "
                       "fsdp_config={'auto_wrap_policy': 'TRANSFORMER_BASED_WRAP'}")
    if strategy not in ("FULL_SHARD", "NO_SHARD"):
        # SHARD_GRAD_OP keeps every unit's gathered parameters from its forward to its backward
        # (FSDP2: reshard_after_forward=False); hybrid sharding shards within a node and
        # replicates across: plan's full shard would miss the gathered or replicated weights
        raise JobError(f"the script's FSDP shards with {strategy} ({s['where']}): not modeled "
                       "(plan models FULL_SHARD: parameters resharded after each forward)",
                       "plan it with --sharding fsdp for FULL_SHARD (it then under-predicts: the "
                       "gathered parameters are missing), or --sharding none for an upper bound")
    fields: dict[str, Any] = {}
    if strategy == "NO_SHARD":
        if s["cpu_offload"]:
            raise JobError(f"the script's FSDP NO_SHARD with CPU offload ({s['where']}): not "
                           "modeled (plan's NO_SHARD keeps every weight on the GPU)",
                           "plan it with --sharding fsdp --offload all (FULL_SHARD), or drop "
                           "the offload for NO_SHARD")
        # FSDP's NO_SHARD: every rank holds the whole unit (JobSpec.fsdp_init's sharding none)
        fields.update(sharding="none", fsdp_init="wrap-sync" if s["sync_module_states"] or
                      s["cpu_ram_efficient_loading"] else "wrap")
    else:
        fields["sharding"] = "fsdp"
        fields["fsdp_version"] = str(version)
        if version == 1:
            # FSDP1 wraps a model on the host with a device_id (accelerate's fsdp_version 1):
            # each unit moved to the GPU, flattened and sharded there; sync_module_states (or
            # cpu_ram_efficient_loading, which turns it on) broadcasts from rank 0
            fields["fsdp_init"] = "wrap-sync" if s["sync_module_states"] or \
                s["cpu_ram_efficient_loading"] else "wrap"
        # HF Trainer accumulates under accelerator.no_sync (FSDP2: set_requires_gradient_sync(
        # False)): every unit's unsharded gradient is kept between micro-steps (transformers
        # trainer.py, accelerate accelerator.no_sync); nothing where grad_accum is 1
        fields["fsdp_no_sync"] = True
    if s["cpu_offload"]:
        fields["offload"] = "all"
    # accelerate's FSDP mixed precision (set_mixed_precision): param_dtype and reduce_dtype are
    # both the run's 16-bit dtype, so gradients are reduce-scattered in it
    fields["fsdp_reduce_dtype"] = "param"
    notes.append(("fsdp", {"where": s["where"], "version": version, "strategy": strategy}))
    return fields, notes


DEEPSPEED_ADAM = ("adam", "adamw")
"""DeepSpeed config optimizer types plan models (``runtime/engine.py`` ``_configure_basic_
optimizer``: FusedAdam on the GPU, DeepSpeedCPUAdam under offload_optimizer; both step the flat
fp32 partition in one kernel, no temporaries: AdamW fused)."""


def _optimizer_block(s: dict[str, Any]) -> tuple[dict[str, Any], Notes]:
    """The optimizer a DeepSpeed config's ``optimizer`` block builds (HF then hands DeepSpeed a
    ``DummyOptim``: ``args.optim`` and the Trainer's own build do not run)."""
    opt = s["optimizer"]
    if opt is None:
        return {}, []
    if opt["type"].lower() not in DEEPSPEED_ADAM:
        raise JobError(f"the script's DeepSpeed config builds the optimizer {opt['type']} "
                       f"({s['where']}): not modeled", "pass --optimizer adamw to plan "
                       "DeepSpeed's Adam in its place (or remove the config's optimizer "
                       "block: the Trainer then builds args.optim's)")
    params = opt["params"]
    impl = "fused"
    if _flag(params.get("torch_adam", False)):
        # torch_adam: true builds torch.optim.AdamW / Adam (engine.py) with its default kernel
        # (foreach on a GPU: temporaries the size of the partition), or the one its params ask
        impl = "fused" if params.get("fused") else (
            "forloop" if params.get("foreach") is False else "foreach")
    fields: dict[str, Any] = {"optimizer": "adamw", "optimizer_impl": impl}
    decay = params.get("weight_decay")
    if isinstance(decay, (int, float)) and not isinstance(decay, bool):
        fields["weight_decay"] = float(decay)
    return fields, [("deepspeed_optimizer", {"type": opt["type"], "where": s["where"]})]


def _zero_fields(s: dict[str, Any], rec: dict[str, Any], strict: bool = True
                 ) -> tuple[dict[str, Any], Notes]:
    """``strict`` False (the script's own stage given as ``--sharding``): planned as that stage,
    nothing refused."""
    stage = int(s["stage"])
    notes: Notes = []
    fields: dict[str, Any] = {}
    if strict and "nvme" in (s["offload_optimizer"], s["offload_param"]):
        raise JobError(f"the script's DeepSpeed config offloads to NVMe ({s['where']}): not "
                       "modeled", f"plan it with --sharding zero{min(stage, 3)} --offload "
                       "optimizer (all where parameters go too) for CPU offload: the GPU holds "
                       "the same, the host less")
    refused = {
        f"offload_optimizer ratio {s.get('offload_ratio', 1.0):g} (part of the optimizer kept "
        "on the GPU)": s.get("offload_ratio", 1.0) < 1.0,
        f"ZeRO++ zero_hpz_partition_size {s.get('hpz_partition_size', 1)} (a second copy of "
        "the parameters)": s.get("hpz_partition_size", 1) > 1,
        f"MiCS mics_shard_size {s.get('mics_shard_size', -1)} (parameters replicated across "
        "groups)": s.get("mics_shard_size", -1) > 0,
        "data_types.grad_accum_dtype fp32 (an fp32 gradient accumulator beside the 16-bit "
        "one)": s.get("grad_accum_dtype", "").removeprefix("torch.") in ("fp32", "float32",
                                                                         "float")
        and bool(rec["args"].get("bf16") or rec["args"].get("fp16"))}
    if stage <= 1 and strict:
        # stage 0 runs DeepSpeed's own fp32 master beside the 16-bit weights and flattens its
        # all-reduce in buckets of 5e8 elements (engine.py); ZeRO-1 shards the states only,
        # beside the same buckets: neither DDP nor ZeRO-2 is a bound of either
        raise JobError(f"the script's DeepSpeed config runs ZeRO stage {stage} ({s['where']}): "
                       "not modeled", "plan it with --sharding none (DDP: every rank holds the "
                       "optimizer states; DeepSpeed's fp32 master and reduce buckets, up to "
                       "0.93 GiB each in bf16, come on top) or --sharding zero2 (gradients "
                       "sharded too: lower)")
    for what, on in refused.items():
        if on and strict:
            raise JobError(f"the script's DeepSpeed config runs {what} ({s['where']}): not "
                           "modeled", f"plan it with --sharding zero{min(stage, 3)} (planned "
                           "without it, said: the plan may be under), or remove that setting "
                           "from the config")
        if on:
            notes.append(("engine_ignored", {"what": what, "engine": "DeepSpeed"}))
    # stages 0 and 1 were refused above (a --sharding given names another engine there)
    fields["sharding"] = f"zero{min(stage, 3)}"
    if s["offload_param"] == "cpu" and stage >= 3:
        fields["offload"] = "all" if s["offload_optimizer"] == "cpu" else "none"
        if s["offload_optimizer"] != "cpu":
            notes.append(("zero_param_offload_alone", {}))
    elif s["offload_optimizer"] == "cpu":
        fields["offload"] = "optimizer"
    if fields.get("offload", "none") != "none":
        fields["zero_pin_memory"] = bool(s["pin_memory"])
    # accelerate fills only "auto" keys (accelerator.py ``_prepare_deepspeed``): a key left
    # out runs DeepSpeed's default
    for key, (field, default, stages) in ZERO_BUCKETS.items():
        if f"zero{min(stage, 3)}" not in stages:
            continue
        value = (s.get("buckets") or {}).get(key)
        # left out: DeepSpeed's default; "auto": hidden², as HF / accelerate fill it (unset)
        if isinstance(value, str) and value.strip().lower() != "auto":
            try:
                value = float(value)  # "500000000", "5e8": DeepSpeed reads a number
            except ValueError:
                value = "auto"
        fields[field] = default if value is None else (
            None if isinstance(value, str) else max(1, int(value)))  # 0: no prefetch
    hidden = int((rec["model"].get("config") or {}).get("hidden_size") or 0)
    modeled = {"stage3_param_persistence_threshold": 10 * hidden,
               "stage3_max_live_parameters": 1_000_000_000,
               "stage3_max_reuse_distance": 1_000_000_000}
    for key, value in s["knobs"].items():
        plan_value = modeled.get(key)
        if plan_value is None or not hidden or int(value) == plan_value:
            continue
        notes.append(("zero_knob", {"key": key, "value": int(value), "planned": plan_value,
                                    "more": int(value) > plan_value}))
    return fields, notes
