"""``trainfit train``'s summary: what ran, measured, in a few lines."""

from __future__ import annotations

from typing import Any

import typer


def render_train(d: dict[str, Any], out: str, said: tuple[str, ...] = ()) -> None:
    """The run in a few lines: steps, samples, tokens, the final loss, each OOM survived, the
    evaluations, and how to resume an interrupted run (``d``: train.json's content)."""
    segs = d.get("segments") or []
    seg = segs[-1] if segs else None
    if seg is not None and len(segs) > 1:
        prev = segs[-2]
        # a resume at another micro-batch (allowed: same samples, same losses) said here too,
        # not only in train.json's segments (an audit)
        split = (f", at {seg['micro_batch']} × {seg['grad_accum']} (the run before: "
                 f"{prev['micro_batch']} × {prev['grad_accum']})"
                 if (prev.get("micro_batch"), prev.get("grad_accum")) !=
                 (seg.get("micro_batch"), seg.get("grad_accum")) and prev.get("micro_batch")
                 else "")
        typer.echo(f"this run: steps {seg['start_step'] + 1}–{seg['end_step']} ({seg['steps']} steps, "
                   f"{seg['samples']} samples, {seg['tokens']:,} token positions) in "
                   f"{seg['wall_time_s']:.1f} s measured, resumed from {seg['resumed_from']}"
                   f"{split}")
    whole = f" over {len(segs)} segments" if len(segs) > 1 else ""
    typer.echo(f"trained {d['steps']} step{'' if d['steps'] == 1 else 's'} ({d['samples_seen']} samples, "
               # samples × seq_len, as train.json's tokens_seen and the tokens/s count them: a
               # padded row's pad positions are in (an audit read them as trained tokens)
               f"{d['tokens_seen']:,} token positions, padding included){whole} in "
               f"{d['wall_time_s']:.1f} s measured; final loss {d['final_loss']:.4f}"
               if d["final_loss"] is not None else "no step ran")
    for note in d.get("notes") or []:
        if note not in said:  # said on stderr as the run began (train.json keeps them)
            typer.echo(f"note: {note}")
    if d.get("scaler_skipped_steps"):
        typer.echo(f"the fp16 GradScaler skipped {d['scaler_skipped_steps']} step(s): gradients "
                   "overflowed and the loss scale was lowered (normal in fp16, not divergence)")
    for e in d["oom_events"]:
        if e.get("phase") == "eval":
            typer.echo(f"OOM in the evaluation at step {e['step']}: eval batch "
                       f"{e['eval_batch_before']} → {e['eval_batch_after']} (training "
                       "micro-batch unchanged), redone from the batch that failed")
            continue
        # train.json counts the steps done before it (0-based); the progress line numbers the
        # step being run from 1
        typer.echo(f"OOM in step {e['step'] + 1}: micro-batch {e['micro_batch_before']} → "
                   f"{e['micro_batch_after']} (accumulation {e['grad_accum_after']}), same samples "
                   "redone")
    for e in d.get("evals", []):
        # null: no label token to average over, or a sum that is not finite (an fp16 overflow)
        loss = (("unknown (no label tokens)" if not e["tokens"] else "not finite")
                if e["eval_loss"] is None else f"{e['eval_loss']:.4f}")
        ppl = ("unknown" if e["eval_loss"] is None else "overflows") if e["eval_perplexity"] is None \
            else f"{e['eval_perplexity']:.2f}"
        typer.echo(f"eval at step {e['step']}: loss {loss} (measured), perplexity "
                   f"{ppl} ({e['samples']} samples, {e['tokens']:,} label "
                   f"tokens, eval batch {e['eval_batch']}, {e['eval_time_s']:.1f} s measured)")
    if d["interrupted"]:
        by = f" by {d['signal']}" if d.get("signal") else ""
        typer.echo(f"interrupted{by}: checkpoint {d['checkpoints'][-1]}; resume with --resume {out}")
    typer.echo(f"run directory: {out} (train.json, monitor.jsonl, checkpoints)")
