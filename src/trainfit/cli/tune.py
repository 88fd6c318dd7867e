"""``trainfit tune``: parse → :func:`trainfit.tune.tuner.tune` → table / --json / trainfit.yaml / --emit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from trainfit.cli.jobargs import fail, parse_bytes, write_atomic
from trainfit.job import DEFAULT_MARGIN, JobError, JobSpec, read_job_file


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune_cmd(
        target: Annotated[str | None, typer.Argument(help="Model or a job YAML.")] = None,
        model: Annotated[str | None, typer.Option()] = None,
        data: Annotated[str | None, typer.Option(
            help="JSONL of text / chat messages / input_ids rows, or a file HF datasets reads.")] = None,
        text_field: Annotated[str | None, typer.Option()] = None,
        tokenizer: Annotated[str | None, typer.Option(
            help="Tokenizer dir/id, or builtin-bytes (default for catalog models).")] = None,
        method: Annotated[str | None, typer.Option(help="full | lora | qlora")] = None,
        lora_r: Annotated[int | None, typer.Option()] = None,
        lora_alpha: Annotated[int | None, typer.Option()] = None,
        lora_targets: Annotated[str | None, typer.Option()] = None,
        precision: Annotated[str | None, typer.Option(
            help="Fix the precision (default: tried among what the device supports).")] = None,
        optimizer: Annotated[str | None, typer.Option()] = None,
        optimizer_impl: Annotated[str | None, typer.Option()] = None,
        micro_batch: Annotated[int | None, typer.Option(
            help="Your current micro-batch: measured as the baseline.")] = None,
        grad_accum: Annotated[int | None, typer.Option()] = None,
        effective_batch: Annotated[int | None, typer.Option()] = None,
        seq_len: Annotated[int | None, typer.Option()] = None,
        grad_ckpt: Annotated[str | None, typer.Option(help="Fix checkpointing (off | full).")] = None,
        attention: Annotated[str | None, typer.Option()] = None,
        ranks: Annotated[int | None, typer.Option()] = None,
        device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N")] = "cpu",
        memory_limit: Annotated[str | None, typer.Option(
            help="Capacity to fit in, e.g. 2GiB (CPU: live tensor bytes stand in for a GPU).")] = None,
        max_host_ram: Annotated[str | None, typer.Option(
            help="Host RAM the job may use (process + loader workers), e.g. 7GiB.")] = None,
        margin: Annotated[float, typer.Option(
            help="Fraction of the capacity left free by the pick.")] = DEFAULT_MARGIN,
        budget_s: Annotated[float | None, typer.Option(help="Cap on the search time (s).")] = None,
        knobs: Annotated[str | None, typer.Option(
            help="Knobs to search, comma-separated: grad_ckpt,precision,attention,"
                 "optimizer_impl,optimizer_8bit,num_workers,loader,compile")] = None,
        try_compile: Annotated[bool, typer.Option(help="Also try torch.compile.")] = False,
        try_8bit_optimizer: Annotated[bool, typer.Option(
            help="Also try AdamW with 8-bit states (bitsandbytes; changes the optimizer's "
                 "numerics slightly).")] = False,
        run_steps: Annotated[int | None, typer.Option(
            help="Planned optimizer steps of the run (amortises compile time).")] = None,
        isolate: Annotated[bool, typer.Option(help="Each probe in its own process.")] = False,
        out: Annotated[str | None, typer.Option(help="Write the tuned job here (YAML).")] = None,
        emit: Annotated[str | None, typer.Option(help="hf | trl | accelerate")] = None,
        trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code")] = False,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Measure the real job on the real device and choose the fastest configuration that fits."""
        from trainfit.job.emit import accelerate_config, hf_training_args, job_yaml, trl_sft_config
        from trainfit.tune.search import KNOBS
        from trainfit.tune.tuner import TuneOptions, tune

        try:
            fields: dict[str, Any] = {}
            if target is not None and target.endswith((".yaml", ".yml")):
                fields, _extra = read_job_file(target)
            elif target is not None:
                fields["model"] = target
            flags = {"model": model, "data": data, "text_field": text_field,
                     "tokenizer": tokenizer, "method": method, "lora_r": lora_r,
                     "lora_alpha": lora_alpha, "lora_targets": lora_targets,
                     "precision": precision, "optimizer": optimizer,
                     "optimizer_impl": optimizer_impl, "micro_batch": micro_batch,
                     "grad_accum": grad_accum, "effective_batch": effective_batch,
                     "seq_len": seq_len, "grad_ckpt": grad_ckpt, "attention": attention,
                     "ranks": ranks}
            given = {k: v for k, v in flags.items() if v is not None}
            fields.update(given)
            if trust_remote_code:
                fields["trust_remote_code"] = True
            if "model" not in fields:
                raise JobError("no model given", "trainfit tune MODEL --data FILE ...")
            if emit is not None and emit not in ("hf", "trl", "accelerate"):
                raise JobError(f"--emit {emit}: unknown", "use hf, trl or accelerate")
            job = JobSpec.from_dict(fields, source=target or "flags")
            knob_list = tuple(k.strip() for k in knobs.split(",")) if knobs else TuneOptions().knobs
            knob_list += tuple(k for k, on in (("compile", try_compile),
                                               ("optimizer_8bit", try_8bit_optimizer))
                               if on and k not in knob_list)
            fixed = frozenset(k for k in KNOBS if k in given) | (
                {"loader"} if {"prefetch_factor", "pin_memory"} & set(given) else set()) | (
                {"optimizer_8bit"} if "optimizer" in given else set())
            opts = TuneOptions(device=device, memory_limit_bytes=parse_bytes(memory_limit,
                                                                              "--memory-limit"),
                               margin=margin, budget_s=budget_s,
                               max_host_ram_bytes=parse_bytes(max_host_ram, "--max-host-ram"),
                               knobs=knob_list, fixed=fixed, run_steps=run_steps, isolate=isolate)
            if out is not None and not Path(out).resolve().parent.exists():
                raise JobError(f"--out {out}: directory does not exist", "create it first")
            if as_json:
                result = tune(job, opts)
            else:
                from rich.console import Console

                with Console(stderr=True).status("probing…") as status:
                    result = tune(job, opts, progress=lambda s: status.update(f"probing {s}"))
        except JobError as err:
            fail(err)
            return
        import os

        if os.environ.get("RANK", "0") != "0":
            return  # under torchrun: every rank probed and agreed; rank 0 reports
        from trainfit.render.words import tune_json

        d = tune_json(result)
        if out is not None and result.pick is not None:
            pick = result.pick
            write_atomic(out, job_yaml(
                pick.job, measured=d["pick"]["measured"], device=d["device"],
                memory_limit_bytes=d["memory_limit_bytes"],
                header=["written by trainfit tune; read by trainfit train", d["reason"]]))
        if as_json:
            typer.echo(json.dumps(d, indent=1))
        else:
            from trainfit.render.tune import render_tune

            render_tune(result)
        if emit is not None and result.pick is not None:
            j = result.pick.job
            payload = {"hf": hf_training_args, "trl": trl_sft_config,
                       "accelerate": accelerate_config}[emit](j)
            if emit == "accelerate":
                import yaml

                typer.echo(yaml.safe_dump(payload, sort_keys=False))
            else:
                typer.echo(json.dumps(payload, indent=1))
        if result.pick is None:
            raise typer.Exit(1)
