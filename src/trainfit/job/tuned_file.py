"""The tuned file ``trainfit.yaml`` that ``tune`` writes and ``train`` reads: the job, a comment
on each knob's effect, and the measured numbers with the knobs they were measured at."""

from __future__ import annotations

import json
from typing import Any

import yaml

from trainfit.job.files import size_text
from trainfit.job.spec import JobSpec

UNDECIDED_NOTE_KINDS = ("undecided", "not_compared", "contradicted")
"""tune's search notes of a change it could not decide (it kept the current best): said in the
tuned file's header (cli/tune.py) and marked on that change's row by ``report``."""

KNOB_COMMENTS = {
    "micro_batch": "samples per forward/backward; larger = faster kernels, more activation memory",
    "grad_accum": "micro-batches per optimizer step (effective batch = micro × accum × ranks)",
    "effective_batch": "samples per optimizer step over all ranks: what the optimizer sees",
    "precision": "amp-bf16/amp-fp16 halve activation memory and run a GPU's matmuls on its tensor "
                 "cores (fp32 is slowest there; a CPU without bf16 instructions is faster in fp32)",
    "grad_ckpt": "full reduces activation memory ~L×, ~30 % slower (forward recomputed)",
    "attention": "sdpa picks flash/memory-efficient kernels; eager materialises T×T scores",
    "optimizer": "adamw keeps 2 fp32 states per weight (8 B); 8-bit variants keep 2 B "
                 "(tensors under 4096 elements keep fp32 states)",
    "optimizer_impl": "fused = one kernel for all weights (fastest); foreach = grouped; forloop",
    "num_workers": "data-loader processes; 0 loads in the training process (GPU waits)",
    "prefetch_factor": "batches each worker prepares ahead",
    "pin_memory": "True: page-locked batches, asynchronous host→GPU copies (more host RAM)",
    "persistent_workers": "True keeps workers between epochs (no restart cost, RAM held)",
    "compile": "True: torch.compile — faster steps after a one-off compile",
    "expandable_segments": "True: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True — less "
                           "memory reserved beyond the live tensors, fewer fragmentation OOMs",
    "seq_len": "tokens per sample; activation memory grows with it (attention: quadratically "
               "without flash)",
    "max_grad_norm": "gradient clipping threshold (None: off)",
    "packing": "text rows joined with EOS and cut into full seq_len sequences (as tune measured)",
}

NOT_MEASURED_AT = ("lr", "seed", "persistent_workers", "trust_remote_code")
"""Job fields a tuned file's measured numbers do not depend on: the learning rate and seed (the
same kernels), persistent_workers (tune sets it on the pick by rule after the probes, which ran
without it; it saves a restart per epoch, which short probes never reach), remote code's
permission. Every other field is written beside the numbers (``measured.at``), so a file edited
since says they are not its own (a review: the model or LoRA rank changed went unnoticed)."""


def measured_at(job: JobSpec) -> dict[str, Any]:
    return {k: v for k, v in job.to_dict().items() if k not in NOT_MEASURED_AT}


def edited_since(job: JobSpec, measured: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, measured at, the file's now) for each field the file changed after tune measured
    it; empty when none did, or when the file does not say (written before ``at``)."""
    at = measured.get("at")
    if not isinstance(at, dict):
        return []
    now = measured_at(job)
    return [(k, at[k], now[k]) for k in now if k in at and at[k] != now[k]]


def _field_comment(key: str) -> str | None:
    """A knob's effect (KNOB_COMMENTS), else the first clause of the field's own docstring
    (JobSpec: one per field), so every line tune writes says what it is (an audit found 40 of
    them bare)."""
    if key in KNOB_COMMENTS:
        return KNOB_COMMENTS[key]
    from trainfit.job.fields import job_fields

    text = next((f.help for f in job_fields() if f.name == key), "").replace("``", "")
    if len(text) > 100:
        # at a sentence's end; not at a parenthesis, which cut "optimizer (…) or all (…)" to
        # "optimizer"
        cut = min((i for i in (text.find(". "), text.find("; ")) if 20 < i < 100), default=-1)
        short = text[:cut] if cut > 0 else ""
        # a sentence cut inside a parenthesis would leave it open: cut at a word, said cut
        text = short if short and short.count("(") == short.count(")") else \
            text[:97].rsplit(" ", 1)[0] + " …"
    return text.rstrip(".") or None


def _measured_comment(key: str) -> str:
    """The unit of a measured number, from its name (peak_allocated_bytes, step_time_s …)."""
    if key.endswith("_bytes"):
        return "bytes, measured"
    if key.endswith("_per_s"):  # a rate, before the seconds of a *_s (a review)
        return f"{key[:-len('_per_s')].replace('_', ' ')} per second, measured"
    if key.endswith("_s"):
        return "seconds, measured"
    if key.endswith("_fraction"):
        return "fraction of the step (0-1), measured"
    if key == "timing_spread":
        return ("fastest ÷ slowest probe of one configuration in this tune run: the timings "
                "were unsteady, the speeds above carry that spread")
    return "the probe's outcome" if key == "status" else "measured"


def job_yaml(job: JobSpec, *, measured: dict[str, Any] | None = None, device: str | None = None,
             memory_limit_bytes: int | None = None, header: list[str] | None = None) -> str:
    """The job as YAML, one comment per knob, and what tune measured (a file-only section)."""
    lines = [f"# {h}" for h in (header or [])]
    from trainfit.job.files import YAML12_FLOAT

    for key, value in job.to_dict().items():
        text = yaml.safe_dump({key: value}, default_flow_style=True, width=1000).strip()
        text = text[1:-1] if text.startswith("{") else text
        if isinstance(value, str) and YAML12_FLOAT.match(value):
            # PyYAML writes "1e5" bare, which the job loader reads back as a float (a review)
            text = f"{key}: {json.dumps(value)}"
        comment = _field_comment(key)
        lines.append(f"{text}  # {comment}" if comment else text)
    if device is not None:
        lines.append(f"device: {device}  # where tune measured")
    if memory_limit_bytes is not None:
        # the unit in the value (a bare number read as no unit: F6), exact to the byte
        lines.append(f"memory_limit: {memory_limit_bytes}B  # {size_text(memory_limit_bytes)}: "
                     "the capacity the pick had to fit in (GiB = 2^30 bytes)")
    if measured:
        lines.append("measured:  # by trainfit tune on the device above (bytes, seconds)")
        for k, v in {**measured, "at": measured_at(job)}.items():
            if k != "step_times_s":
                lines.append(f"  {k}: {yaml.safe_dump(v, default_flow_style=True, width=10**6).strip()}"
                             .replace("\n...", "")
                             + ("  # the knobs these were measured at" if k == "at" else
                                f"  # {_measured_comment(k)}"))
    return "\n".join(lines) + "\n"
