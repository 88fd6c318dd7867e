"""Plan the five seed scenarios (examples/*.yaml) and write examples/README.md with the answers.

Run: ``python benchmarks/seed_plans.py`` (no GPU; ~4 min on 2 cores).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _fmt(speed: object, key: str, fmt: str) -> str:
    value = getattr(speed, key, None) if speed is not None else None
    return "unknown" if value is None else fmt.format(value)


def main() -> int:
    warnings.filterwarnings("ignore")
    from trainfit.cli.main import quiet_third_party

    quiet_third_party()  # as the CLI: bitsandbytes' kernels-community line out of the log
    from trainfit.cli.main import _file_checks
    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec, job_with_current, read_job_file
    from trainfit.model.source import resolve_model
    from trainfit.plan.checks import with_checks
    from trainfit.plan.grid import plan
    from trainfit.render.plan_words import (
        host_ram_words,
        observed_words,
        offload_words,
        plan_header,
        plan_words,
    )
    from trainfit.render.words import plan_json, plan_reason, plan_versus

    lines = ["# The seed scenarios, planned", "",
             "Regenerate: `python benchmarks/seed_plans.py`. Every number is a **prediction** "
             "(no GPU was used); tokens/s and MFU include the host's side of the step, measured "
             "on the machine that planned (plan runs the step's code at a tiny width on its "
             "CPU), so they move by a few % from one machine or load to another — the memory "
             "columns do not; GiB = 2^30 bytes; `device` = what nvidia-smi would show; "
             "tokens/s and MFU are unknown on a generic card (no known peak).", ""]
    for path in sorted(EXAMPLES.glob("seed*.yaml")):
        text = path.read_text()
        comment = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")]
        data, extra = read_job_file(path)  # the job fields, and the file-only keys
        scenario = extra["scenario"]
        job = JobSpec.from_dict(data, source=path.name)
        cur_job = None if "current" not in extra else \
            job_with_current(data, extra["current"], path.name)
        gpu = find_gpu(extra["gpu"])
        res = plan(job, resolve_model(job.model), gpu, current=cur_job)
        res = with_checks(res, **_file_checks(extra, path.name))  # as `trainfit plan FILE`
        (EXAMPLES / "results").mkdir(exist_ok=True)
        (EXAMPLES / "results" / f"{path.stem}.json").write_text(
            json.dumps({**plan_json(res), **plan_words(res)}, indent=1))
        lines += [f"## {scenario}", "", "> " + " ".join(comment), "",
                  f"`trainfit plan examples/{path.name}` — {res.model} on "
                  f"{gpu.display_name} ({gpu.memory_bytes / 2**30:.2f} GiB), "
                  f"{res.total_params / 1e6:,.0f} M parameters, {res.trainable_params / 1e6:,.2f} M "
                  "trainable.", "", f"`{plan_header(res)}`", "",
                  "| precision | ckpt | micro×accum | allocated GiB | reserved GiB | device GiB | fits "
                  "| tokens/s | MFU | how |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res.rows:
            j, m = r.job, r.memory
            mark = " ★" if r.recommended else (" ▲" if r.largest_fitting else "")
            lines.append(f"| {j.precision} | {j.grad_ckpt} | {j.micro_batch}×"
                         f"{j.grad_accum}{mark} | {m.peak_allocated_bytes / 2**30:.2f} | "
                         f"{m.peak_reserved_bytes / 2**30:.2f} | {m.peak_device_bytes / 2**30:.2f} | "
                         # as the terminal says it: "limit" for a row that runs only by the
                         # allocator releasing its cache at the card's limit (its speed unknown;
                         # an audit read "no" and "unknown" with no reason here)
                         f"{'yes' if m.fits else 'limit' if m.alloc_retries else 'no'} | "
                         f"{_fmt(r.speed, 'tokens_per_s', '{:,.0f}')} | "
                         f"{_fmt(r.speed, 'mfu', '{:.0%}')} | {r.how} |")
        lines += ["", f"**Pick:** {plan_reason(res)}. ★ recommended, ▲ largest micro-batch that fits."
                  + (" limit: runs only by the allocator releasing its cache at the card's limit "
                     "(each release synchronizes the GPU: its tokens/s is not predicted)."
                     if any(r.memory.alloc_retries for r in res.rows) else ""), ""]
        if res.current is not None:
            c, cm = res.current.job, res.current.memory
            lines += [f"**Against the seed's starting configuration** ({c.precision}, "
                      f"micro-batch {c.micro_batch} × accumulation {c.grad_accum}, "
                      f"checkpointing {c.grad_ckpt}: predicted "
                      f"{_fmt(res.current.speed, 'tokens_per_s', '{:,.0f}')} tokens/s, "
                      f"{cm.peak_device_bytes / 2**30:.2f} GiB device peak): {plan_versus(res)}.", ""]
        else:
            lines += ["The seed's notes give no starting batch configuration to compare with.", ""]
        said = [*observed_words(res), offload_words(res), host_ram_words(res)]
        lines += [f"- {w.strip()}" for w in said if w] + [""]
        print(f"{path.name}: {plan_reason(res)}", flush=True)
    (EXAMPLES / "README.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
