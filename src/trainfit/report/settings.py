"""What makes a setting of the report: the job fields one family of rows shares (micro-batch and
accumulation vary inside one), and its label. Shared by the plan/tune sections (build.py) and the
train summaries (runs.py)."""

from __future__ import annotations

from typing import Any

FAMILY_KEYS = ("method", "precision", "grad_ckpt", "seq_len", "effective_batch", "ranks",
               "sharding", "optimizer", "attention", "lora_r", "quant", "lm_head_chunk",
               "optimizer_impl")
"""Job fields that make a setting; micro-batch and accumulation vary inside one.  The optimizer's
kernel, a knob tune tries, is one: a probe of foreach AdamW measured at 231 tokens/s was merged
into the fused pick's row (a QA run), whose median it then set.  ``compile`` and the loader's
settings are not (plan's rows do not state them: a row is its step's, whatever feeds it); a
probe that ran them otherwise than tune's pick gets a row of its own (report/variants.py)."""

ANY = object()
"""A family key's value for a field its first job did not state: any value matches it."""


def norm(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def family_key(job: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(norm(job[k]) if k in job else ANY for k in FAMILY_KEYS)


def matches(key: tuple[Any, ...], job: dict[str, Any]) -> bool:
    """Fields the job does not state do not count against a match."""
    return all(v is ANY or k not in job or norm(job[k]) == v
               for k, v in zip(FAMILY_KEYS, key, strict=True))


def setting_label(job: dict[str, Any], varying: set[str] | None = None) -> str:
    # a field present but null (a job that left it to be chosen) is unknown, not "None"
    parts = [str(job.get("precision") or "precision unknown"),
             f"checkpointing {job.get('grad_ckpt') or 'unknown'}"]
    for k in FAMILY_KEYS:
        if varying and k in varying and k not in ("precision", "grad_ckpt"):
            parts.append(f"{k} {job.get(k)}")
    return ", ".join(parts)
