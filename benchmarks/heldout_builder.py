"""The pieces every held-out framework's mapping shares (:mod:`heldout_mapping`): the case's
mapping (:class:`Mapping`), the builder that fills a job from a case's notes and says each step
(:class:`Builder`), and the base job, optimizer, quantization, attention and sharding every
framework reads alike.  Fields that do not exist yet are looked up by name
(:data:`FEATURE_FIELDS`, ``GRAD_CKPT``, ``SHARDINGS``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainfit.job.combinations import ZERO_BUCKETS  # key → (field, DeepSpeed's default, stages)

FEATURE_FIELDS: dict[str, tuple[tuple[str, object], ...]] = {
    "cpu-offload": (("offload", "all"), ("cpu_offload", True)),
    "optimizer-in-backward": (("optimizer_in_bwd", True), ("optimizer_in_backward", True)),
    "activation-offload": (("activation_offload", True), ("offload_activations", True),
                           ("activation_offloading", True)),
    "fp32-frozen-base": (("base_dtype", "fp32"), ("frozen_dtype", "fp32")),
}
"""Candidate JobSpec (field, value) pairs of features trainfit may not model (first field present
wins); CPU offload here is always of parameters too (FSDP CPUOffload, ZeRO-3 offload_param)."""
SELECTIVE_AC = ("selective", "selective-op", "sac")
ZERO3 = ("zero3", "zero-3")
NO_SHARD = ("fsdp-no-shard", "no-shard")


@dataclass
class Mapping:
    """What one case becomes in trainfit's terms."""

    job: dict[str, Any]
    gpu: str
    """Catalog name of the GPU (or of the card a substitute is made from)."""
    gpu_overrides: dict[str, Any]
    """Fields replaced in the catalog entry for a card the catalog lacks (empty: as catalogued)."""
    compare: str
    """Which predicted peak the published one is: allocated, reserved or device."""
    model: dict[str, Any]
    """kind catalog (name) or config (model_type + config fields), plus tweaks (litgpt)."""
    framework: str
    notes: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    skip: str | None = None
    """Why no prediction can be made at all (e.g. no sequence length), else None."""
    eager_modules: bool = False
    """CUDA < 11.7 / torch < 1.13: no lazy module loading (+ context, as calibration.py)."""


def _spec_names() -> tuple[set[str], tuple[str, ...], tuple[str, ...]]:
    from trainfit.job import JobSpec, spec

    return (set(JobSpec.__dataclass_fields__), tuple(getattr(spec, "GRAD_CKPT", ())),
            tuple(getattr(spec, "SHARDINGS", ())))


class Builder:
    def __init__(self, case: dict[str, Any]) -> None:
        self.case = case
        self.fields, self.grad_ckpts, self.shardings = _spec_names()
        self.job: dict[str, Any] = {}
        self.notes: list[str] = []
        self.unsupported: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def feature(self, name: str, what: str) -> None:
        """Set the field expressing ``name`` if JobSpec has one, else mark the case unsupported."""
        present = next(((f, v) for f, v in FEATURE_FIELDS[name] if f in self.fields), None)
        if present:
            self.job[present[0]] = present[1]
            self.note(f"{what}: JobSpec.{present[0]} = {present[1]!r}")
        else:
            self.unsupported.append(name)
            names = " / ".join(f for f, _ in FEATURE_FIELDS[name])
            self.note(f"{what}: no JobSpec field ({names}) → unsupported ({name})")

    def output_held(self, loop: str) -> None:
        """The source's loop still references the model output during backward."""
        if "output_in_backward" in self.fields:
            self.job["output_in_backward"] = True
            self.note(f"{loop} keeps the model output (logits) referenced through the backward "
                      "pass → output_in_backward true")

    def sharding(self, kind: str, fsdp1: bool, sync: bool = False) -> None:
        """kind: fsdp, zero3, no-shard (DDP-like replication under FSDP); ``sync``: FSDP1's
        sync_module_states."""
        if kind == "zero3":
            hit = next((s for s in ZERO3 if s in self.shardings), None)
            self.job["sharding"] = hit or "fsdp"
            if hit:
                self.note(f"DeepSpeed ZeRO-3 → sharding {hit}")
            else:
                self.note("DeepSpeed ZeRO-3 → sharding fsdp (both shard parameters, gradients "
                          "and optimizer states; DeepSpeed's own buckets — reduce/prefetch/"
                          "all-gather, persistence threshold — are not FSDP's)")
        elif kind == "no-shard":
            hit = next((s for s in NO_SHARD if s in self.shardings), None)
            self.job["sharding"] = hit or "none"
            if not hit:
                self.note("FSDP NO_SHARD → sharding none (every rank holds all weights, "
                          "gradients, states; modelled with DDP's gradient buckets instead of "
                          "FSDP's flat-parameter gradients — tiny for LoRA adapters)")
        else:
            self.job["sharding"] = "fsdp"
        if fsdp1 and kind != "zero3" and "fsdp_init" in self.fields:
            self.job["fsdp_init"] = "wrap-sync" if sync else "wrap"
            self.note(f"FSDP1 builds each unit on the GPU (moved or materialised at full size, "
                      f"{'broadcast from rank 0, ' if sync else ''}flattened, sharded): "
                      f"fsdp_init {self.job['fsdp_init']}")
        if fsdp1 and kind != "zero3" and self.job["sharding"] == "fsdp":
            if "fsdp_version" in self.fields:
                self.job["fsdp_version"] = "1"
                self.note("FSDP1 (FullyShardedDataParallel): JobSpec.fsdp_version = '1'")
            else:
                self.note("FSDP1 (FullyShardedDataParallel) simulated as FSDP2 (fully_shard): "
                          "flat parameters, FSDP1's unsharded gradient of a whole unit when a "
                          "unit mixes frozen and trainable parameters, and its all-gather "
                          "limits are not modelled")

    def no_sync(self, who: str) -> None:
        """Gradient accumulation under FSDP's ``no_sync`` (unsharded gradients kept)."""
        if self.job.get("sharding") != "fsdp" or self.job.get("grad_accum", 1) <= 1:
            return
        if "fsdp_no_sync" in self.fields:
            self.job["fsdp_no_sync"] = True
            self.note(f"{who} accumulates under FSDP's no_sync (unsharded gradients kept "
                      "between micro-steps) → fsdp_no_sync true")
        else:
            self.note(f"{who} accumulates under FSDP's no_sync: not modelled (no fsdp_no_sync)")

    def grad_ckpt(self, selective: bool = False) -> None:
        value = self.case["grad_ckpt"]
        if selective:
            hit = next((g for g in SELECTIVE_AC if g in self.grad_ckpts), None)
            if hit:
                self.job["grad_ckpt"] = hit
                self.note(f"selective (per-op) activation checkpointing: grad_ckpt {hit}")
            else:
                self.job["grad_ckpt"] = "full"
                self.unsupported.append("selective-ac")
                self.note("selective per-op activation checkpointing (saves matmul/SDPA "
                          "outputs): between off and full; no grad_ckpt choice for it → "
                          "unsupported (predicted as full, informative only)")
            return
        if value is None:
            self.note("activation checkpointing not stated: off assumed (the case notes' "
                      "reading of the larger peak)")
        self.job["grad_ckpt"] = "full" if value else "off"

    def build(self, gpu: tuple[str, dict[str, Any]], compare: str, model: dict[str, Any],
              framework: str, eager: bool = False) -> Mapping:
        skip = None
        if self.job.get("seq_len") is None:
            skip = "no sequence length published (padded per batch)"
            self.unsupported.append("unpinned-seq-len")
        return Mapping(job=self.job, gpu=gpu[0], gpu_overrides=gpu[1], compare=compare,
                       model=model, framework=framework, notes=self.notes,
                       unsupported=sorted(set(self.unsupported)), skip=skip,
                       eager_modules=eager)


# --- shared pieces ----------------------------------------------------------------------------
def _optimizer(case: dict[str, Any], default_impl: str) -> tuple[str, str]:
    text = case["optimizer"]
    name = {"adamw": "adamw", "paged_adamw_32bit": "paged-adamw",
            "paged_adamw8bit": "paged-adamw-8bit"}[text.split()[0]]
    return name, "fused" if "fused=True" in text else default_impl


def _quant(case: dict[str, Any]) -> str:
    text = (case["quant"] or "").lower()
    if "not double" in text:
        return "nf4"
    return "nf4-dq" if ("double" in text or "nf4-dq" in text or "torchao" in text) else "nf4"


def _attention(b: Builder) -> str:
    text = b.case["attention"].lower()
    if text.startswith("eager"):
        return "eager"
    if "flash_attention_2" in text:
        b.note("transformers' flash_attention_2 → attention flash-attention-2")
        return "flash-attention-2"
    if "flash" in text:  # SDPA said to have run its flash kernel (on Hopper torch ≥ 2.9 picks cuDNN)
        b.note("SDPA's flash kernel → attention sdpa-flash")
        return "sdpa-flash"
    if "flex" in text:
        b.note("flex attention with a block-causal mask (packed samples) → sdpa (flash-like: "
               "no S×S score matrix; flex's block mask is small)")
    return "sdpa"


def base_job(b: Builder, impl: str) -> None:
    c = b.case
    opt, opt_impl = _optimizer(c, impl)
    b.job.update(method=c["method"], seq_len=c["seq_len"], micro_batch=c["micro_batch"],
                 grad_accum=c["grad_accum"] or 1, precision=c["precision"].split()[0],
                 optimizer=opt, optimizer_impl=opt_impl, attention=_attention(b),
                 ranks=c["ranks"])
    if opt.startswith("paged"):
        b.note("paged bitsandbytes optimizer: states in CUDA managed memory (outside "
               "torch's allocator: not in allocated/reserved; device counts them while they fit)")
    if c.get("lora"):
        lora = c["lora"]
        b.job.update(lora_r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                     lora_targets=["mlp" if t.startswith("mlp") else t for t in lora["targets"]])
    if c["method"] == "qlora":
        b.job["quant"] = _quant(c)
    if c["compile"]:
        b.job["compile"] = True
        b.note("torch.compile → compile true (the eager step is what is simulated unless "
               "trainfit's memory model reads it; compile's fusions usually lower the peak)")
        # every compiled case here is torchtune's or torchtitan's own model code: SDPA with
        # is_causal, never transformers' mask built under Dynamo
        b.job["compile_builds_mask"] = False
    if c["optimizer_in_bwd"]:
        b.feature("optimizer-in-backward", "optimizer step fused into backward (gradients "
                  "freed per parameter)")
    if "cpu-offload" in c["sharding"] or "offload" in c["sharding"]:
        b.feature("cpu-offload", "CPU offload of parameters, gradients and the optimizer step")


def case_sharding(b: Builder) -> None:
    s, fsdp = b.case["sharding"], b.case.get("fsdp") or {}
    fsdp1 = "FSDP1" in str(fsdp.get("version", ""))
    sync = fsdp.get("sync_module_states") is True
    if s.startswith("zero3"):
        b.sharding("zero3", False)
        zero_buckets(b)
    elif s.startswith("fsdp-no-shard"):
        b.sharding("no-shard", fsdp1, sync)
    elif s.startswith("fsdp"):
        b.sharding("fsdp", fsdp1, sync)
    else:
        b.job["sharding"] = "none"


def zero_buckets(b: Builder) -> None:
    """The case's DeepSpeed bucket sizes: "auto" (hidden², as HF / accelerate fill it: the job's
    unset), a number, or — an accelerate config with no DeepSpeed config file, whose generated
    config has no bucket keys (accelerate fills only "auto" ones) — DeepSpeed's own defaults."""
    ds = b.case.get("deepspeed") or {}
    for key, (name, default, _) in ZERO_BUCKETS.items():
        if name not in b.fields:
            continue
        value = ds.get(key)
        if value is None:
            b.job[name] = default
            b.note(f"{key} not in the DeepSpeed config (accelerate's own, no config file): "
                   f"DeepSpeed's default {default:.0e} elements → {name} {default}")
        elif not isinstance(value, str):
            b.job[name] = int(value)
            b.note(f"{key} {value:.0e} → {name} {int(value)}")
