"""What a run leaves behind: ``train.json`` (the record of every step of every segment), how a
resumed run continues that record, and the exit codes a scheduler reads.

A run is one or more *segments*: the first from step 0, each resume a new one from the checkpoint's
step. The record (losses, OOM events, evaluations, checkpoints, samples and tokens seen) is saved
inside every checkpoint; a resume from checkpoint N takes the record as it was at step N and
appends to it — so ``train.json`` holds one loss per step from step 1 (the trajectory the weights
followed, whatever was killed and redone), ``segments`` says which run did which steps, and the
counts are the whole run's. ``train.json`` is rewritten (atomically) at every checkpoint and at the
end, so a killed run leaves the record of its newest checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainfit.run.oom import OomEvent
from trainfit.run.rundir import write_atomic

EXIT_DONE = 0
"""The requested steps ran (and were saved)."""
EXIT_BAD_INPUT = 2
"""Bad input, or the run directory / a checkpoint cannot be used: one ``error:`` line (and a hint)."""
EXIT_DIVERGED = 3
"""The loss became NaN or infinite: stopped, nothing saved after the last good checkpoint."""
EXIT_SIGINT = 130
"""Interrupted by SIGINT (Ctrl-C): a checkpoint was saved; ``--resume`` continues it (128 + 2)."""
EXIT_SIGTERM = 143
"""Interrupted by SIGTERM (a scheduler's stop): a checkpoint was saved; resumable (128 + 15)."""

STOPPED = ("running", "finished", "interrupted", "diverged", "failed")


@dataclass
class TrainResult:
    job: dict[str, Any]
    steps: int
    """Optimizer steps of the whole run (all segments)."""
    samples_seen: int
    """Samples trained on by the whole run (all segments)."""
    tokens_seen: int
    wall_time_s: float
    """Measured time of all segments together."""
    final_loss: float | None
    losses: list[float | None]
    """One per step of the run, from step 1 (None: a step the GradScaler skipped with a
    non-finite loss)."""
    oom_events: list[OomEvent] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    resumed_from: str | None = None
    interrupted: bool = False
    monitor_log: str | None = "monitor.jsonl"
    samples: list[list[int]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    """One per evaluation: step, eval_loss (token mean), eval_perplexity, eval_batch, samples,
    tokens (label tokens), eval_time_s."""
    data_samples: int | None = None
    """Training samples the data made (after packing and truncation): the run's position counts
    them, so a resume over data that makes another number is refused (None: an older record)."""
    data_sha256: str | None = None
    """The samples' digest (TokenData.digest): a resume over other samples of the same number is
    refused too (None: an older record)."""
    model_config: dict[str, Any] | None = None
    """The model configuration trained (resume_fields.config_values): a resume over another is
    refused (None: an older record, or a module:factory model)."""
    segments: list[dict[str, Any]] = field(default_factory=list)
    """One per run that added steps (the first, then each resume): segment, start_step,
    end_step, steps, samples, tokens, wall_time_s, resumed_from, stopped, notes."""
    stopped: str = "finished"
    """finished, interrupted (a signal: checkpoint saved), diverged (non-finite loss), failed;
    running in the train.json written at a checkpoint while the run goes on."""
    signal: str | None = None
    """SIGINT or SIGTERM when interrupted by one."""
    scaler_skipped_steps: int = 0
    """Steps whose update the fp16 GradScaler skipped (gradients overflowed, the scale lowered):
    normal in fp16 training, not divergence."""
    diverged_at_step: int | None = None
    run_options: dict[str, Any] = field(default_factory=dict)
    """The options a resume keeps unless given again: --save-every, --keep-last and the
    evaluation's (:data:`trainfit.run.options.KEPT_ON_RESUME`); an audit: a resume dropped the
    run's --eval-fraction, which then read as "the data makes 305 samples, the checkpoint's
    run had 274", and its --eval-every and --save-every, silently."""
    notes: list[str] = field(default_factory=list)
    """This segment's notes (also in its entry of ``segments``)."""

    def to_dict(self, open_wall_time_s: float | None = None) -> dict[str, Any]:
        """The record as train.json holds it. ``open_wall_time_s``: the open segment's time so
        far, written into it and the total — the train.json written at a checkpoint while the
        run goes on (a review: it held the steps and tokens of the open segment with 0 s of its
        time, so a killed run's report read its tokens/s as unknown, or 1.4× too high)."""
        d = asdict(self)
        d.pop("samples")
        d["oom_events"] = [e.to_dict() for e in self.oom_events]
        seg = dict(d["segments"][-1]) if d["segments"] else None
        if open_wall_time_s is not None and seg is not None and seg["stopped"] is None:
            d["wall_time_s"] = self.wall_time_s + open_wall_time_s - seg["wall_time_s"]
            seg["wall_time_s"] = open_wall_time_s
            d["segments"] = [*d["segments"][:-1], seg]
        return {"kind": "train", **d}

    @property
    def exit_code(self) -> int:
        if self.stopped == "diverged":
            return EXIT_DIVERGED
        if self.stopped == "interrupted":
            return EXIT_SIGTERM if self.signal == "SIGTERM" else EXIT_SIGINT
        return EXIT_DONE

    # --- segments ---------------------------------------------------------------------------------
    def begin_segment(self, start_step: int, resumed_from: str | None, notes: list[str], *,
                      device: str | None = None, memory_limit_bytes: int | None = None,
                      settings: dict[str, Any] | None = None) -> None:
        """``device`` (cpu, cuda:N) and ``memory_limit_bytes`` (CPU's stand-in capacity): where
        this segment ran, which report reads to label its monitor log (an audit: a CPU run's
        tensor count was drawn as a GPU's torch peak, beside GPUs the run never used)."""
        self.segments.append({"segment": len(self.segments) + 1, "start_step": start_step,
                              "end_step": start_step, "steps": 0, "samples": 0, "tokens": 0,
                              "wall_time_s": 0.0, "resumed_from": resumed_from,
                              "stopped": None, "notes": list(notes), "device": device,
                              "memory_limit_bytes": memory_limit_bytes, **(settings or {})})
        self.notes = list(notes)
        self.stopped = "running"

    def add_step(self, loss: float | None, samples: int, tokens: int,
                 micro_batch: int | None = None, grad_accum: int | None = None) -> None:
        """One optimizer step done; ``micro_batch`` × ``grad_accum``: what it ran at (an OOM
        split or a resume at another micro-batch leaves the job's own figures behind), kept
        in the segment as its last step's."""
        self.losses.append(loss)
        self.steps += 1
        self.samples_seen += samples
        self.tokens_seen += tokens
        seg = self.segments[-1]
        seg["end_step"] = self.steps
        seg["steps"] += 1
        seg["samples"] += samples
        seg["tokens"] += tokens
        if micro_batch is not None:
            seg["micro_batch"], seg["grad_accum"] = micro_batch, grad_accum
        if loss is not None:
            self.final_loss = loss

    def monitor_notes(self, sampler: Any) -> None:
        """What the run's monitor said (a lost GPU, a failed sample), kept in the record (they
        were printed by ``monitor`` only), and the CPU time its sampler thread took (measured:
        its own overhead, which an audit found collected and never shown)."""
        if sampler is None:
            return
        for text in sampler.notes:
            if text not in self.notes:
                self.note(text)
        if self.segments:
            self.segments[-1]["monitor_cpu_s"] = round(sampler.sample_cpu_s, 4)

    def note(self, text: str) -> None:
        self.notes.append(text)
        if self.segments:
            self.segments[-1]["notes"].append(text)

    def close_segment(self, wall_time_s: float, stopped: str) -> None:
        seg = self.segments[-1]
        self.wall_time_s += wall_time_s - seg["wall_time_s"]
        seg["wall_time_s"] = wall_time_s
        seg["stopped"] = stopped
        self.stopped = stopped

    def snapshot(self, wall_time_s: float) -> dict[str, Any]:
        """The record as of now, saved inside a checkpoint (the current segment open)."""
        d = self.to_dict(open_wall_time_s=wall_time_s)
        for k in ("kind", "job", "resumed_from", "monitor_log", "notes", "interrupted", "stopped",
                  "signal", "diverged_at_step"):
            d.pop(k, None)
        return d


def new_result(job: dict[str, Any], *, main: bool) -> TrainResult:
    # a job that leaves checkpointing to be chosen runs without it (model/workload.py turns it
    # on for full and selective only): the record says what ran
    job = {**job, "grad_ckpt": job.get("grad_ckpt") or "off"}
    return TrainResult(job=job, steps=0, samples_seen=0, tokens_seen=0, wall_time_s=0.0,
                       final_loss=None, losses=[], monitor_log="monitor.jsonl" if main else None)


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """``<run_dir>/train.json`` as written (None when missing, unreadable or not a mapping)."""
    import json

    try:
        d = json.loads((run_dir / "train.json").read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def closed_record(d: dict[str, Any] | None, step: int, checkpoint: Path | str
                  ) -> dict[str, Any] | None:
    """``d`` (the run's ``train.json``, :func:`read_record`) when it ends at the checkpoint of
    ``step`` with its last segment closed (finished, interrupted, stopped): the record written
    after that checkpoint, which the checkpoint's own snapshot (taken while the segment ran)
    predates — resumed from it, the segment keeps how it stopped and its whole wall time.  None
    otherwise (steps ran after the checkpoint, the record does not list ``checkpoint`` — another
    run's file beside a copied one —, or there is no record): the snapshot is the record."""
    segs = d.get("segments") if d is not None else None
    if not segs or d.get("steps") != step or not segs[-1].get("stopped") \
            or segs[-1].get("end_step") != step:
        return None
    if not any(Path(str(c)).name == Path(checkpoint).name for c in d.get("checkpoints") or []):
        return None
    return d


def continue_from(res: TrainResult, history: dict[str, Any], step: int, samples: int,
                  tokens_per_sample: int) -> None:
    """Take the record a checkpoint of ``step`` saved (its losses, segments, events and counts);
    a checkpoint without one (an older trainfit) starts the record at its step, said in a note."""
    losses = list(history.get("losses") or [])[:step]
    res.steps = step
    res.samples_seen = samples
    if len(losses) == step:
        res.losses = losses
        res.segments = [dict(s) for s in history.get("segments") or []]
        for seg in res.segments:
            if seg.get("stopped") is None:  # the snapshot was taken while it ran
                seg["stopped"] = "after its checkpoint"
                seg["notes"] = [*seg.get("notes", []), f"ended after its checkpoint at step "
                                f"{seg['end_step']} (killed, failed or interrupted: the steps "
                                "after it, if any, were redone by the next segment)"]
        # a training step's split at step N redid step N+1, after checkpoint-N: not in it; an
        # evaluation's split at step N ran before checkpoint-N was saved (evaluate, then save,
        # as HF's order) and is kept with that evaluation (a review: it was dropped)
        res.oom_events = [OomEvent.from_dict(e) for e in history.get("oom_events") or []
                          if e.get("step", 0) < step
                          or (e.get("phase") == "eval" and e.get("step", 0) == step)]
        res.evals = [e for e in history.get("evals") or [] if e.get("step", 0) <= step]
        res.checkpoints = list(history.get("checkpoints") or [])
        res.tokens_seen = int(history.get("tokens_seen", samples * tokens_per_sample))
        res.wall_time_s = float(history.get("wall_time_s", 0.0))
        res.scaler_skipped_steps = int(history.get("scaler_skipped_steps", 0))
        res.final_loss = next((x for x in reversed(losses) if x is not None), None)
    else:
        res.losses = [None] * step
        res.tokens_seen = samples * tokens_per_sample
        res.segments = [{"segment": 1, "start_step": 0, "end_step": step, "steps": step,
                         "samples": samples, "tokens": res.tokens_seen, "wall_time_s": None,
                         "resumed_from": None, "stopped": None,
                         "notes": ["not recorded: the checkpoint carries no history"]}]


def finite(x: float) -> bool:
    return math.isfinite(x)


def write_train_json(out: Path, res: TrainResult, open_wall_time_s: float | None = None) -> None:
    """``<out>/train.json``, replaced atomically (a reader never sees half of it);
    ``open_wall_time_s``: the open segment's time so far (a write at a checkpoint)."""
    from trainfit import json_text

    write_atomic(out / "train.json", json_text.dumps(res.to_dict(open_wall_time_s), indent=1))
