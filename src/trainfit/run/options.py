"""What the caller asks of a run (:class:`RunOptions`: steps, checkpoints, resume, device, the
CPU's memory limit, evaluation, fault injection) and the signals that end it early
(:class:`Interrupt`) — shared by the own loop (loop.py) and the HF/TRL trainers (hf_backend.py)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.job import JobError

KEPT_ON_RESUME = ("save_every_steps", "keep_last", "eval_data", "eval_fraction",
                  "eval_every_steps", "eval_batch")
"""RunOptions a resume takes from the run's record when the command line does not give them
(the run's length is kept by its schedule: :func:`trainfit.run.checks.total_steps`)."""

FLAG_OF = {"save_every_steps": "--save-every", "keep_last": "--keep-last",
           "eval_data": "--eval-data", "eval_fraction": "--eval-fraction",
           "eval_every_steps": "--eval-every", "eval_batch": "--eval-batch"}


def options_kept(opts: RunOptions, saved: dict[str, Any]) -> tuple[RunOptions, list[str]]:
    """``opts`` with each option of :data:`KEPT_ON_RESUME` it leaves unset taken from the run's
    record (``saved``: its ``run_options``), and a note for each one taken."""
    import dataclasses

    taken: dict[str, Any] = {}
    for k in KEPT_ON_RESUME:
        v = saved.get(k)
        if getattr(opts, k) is None and v is not None and not (
                k in ("eval_data", "eval_fraction") and (opts.eval_data or opts.eval_fraction)):
            taken[k] = Path(v) if k == "eval_data" else v
    notes = [f"{FLAG_OF[k]} {v} kept from the run being resumed (give {FLAG_OF[k]} to change "
             "it)" for k, v in taken.items()]
    return dataclasses.replace(opts, **taken, kept_notes=tuple(notes)), notes


def say_kept(opts: RunOptions, main: bool) -> None:
    """The options a resume took from the run's record, said on stderr by rank 0 once the resume
    passed its checks (said before them, they read as accepted ahead of a refusal: a review)."""
    import sys

    for n in opts.kept_notes if main else ():
        print(n, file=sys.stderr, flush=True)


@dataclass(kw_only=True)
class RunOptions:
    out_dir: Path
    """Checkpoints, train.json and monitor.jsonl go here."""
    max_steps: int | None = None
    """Optimizer steps to run (default: ``epochs`` over the data)."""
    epochs: float | None = None
    """Passes over the training set when ``max_steps`` is not given (fractions allowed); None:
    one, or on a resume the length of the run that wrote the checkpoint (its schedule)."""
    save_every_steps: int | None = None
    """Checkpoint every N steps (and always at the end and on SIGINT/SIGTERM)."""
    keep_last: int | None = None
    """Checkpoints kept in the run directory: after each save, the older ones beyond the newest N
    are removed (HF's ``save_total_limit``); None keeps every one. A full fine-tune's checkpoint
    holds the trainable weights and AdamW's two states: 12 B a parameter in fp32, 84 GB for 7B."""
    resume: Path | None = None
    """A run directory or checkpoint to continue from (the same samples, the same order)."""
    device: str = "cpu"
    """Where the step runs: ``cpu``, ``cuda``, ``cuda:N`` (one rank; torchrun sets it per rank)."""
    memory_limit_bytes: int | None = None
    """CPU stand-in for a GPU's capacity (live tensor bytes, as tune): crossing it is an OOM."""
    monitor_interval_s: float = 1.0
    """Seconds between telemetry samples written to monitor.jsonl."""
    live: bool | None = False
    """Draw the live progress bar (None: only on a terminal)."""
    inject_oom_at_steps: tuple[int, ...] = ()
    """Fault injection (tests, drills): raise an OOM in the forward of these steps, once each."""
    inject_interrupt_at_step: int | None = None
    """Fault injection: act as if SIGINT arrived during this step."""
    record_samples: bool = False
    """Keep the sample ids of every completed step in the result (tests)."""
    allow_offload: bool = False
    """Accept modules a device map put on cpu/disk (otherwise: a clear error)."""
    eval_data: Path | None = None
    """Evaluation set: a file read and tokenized exactly as the training data (same tokenizer,
    seq_len, task, packing)."""
    eval_fraction: float | None = None
    """Instead of ``eval_data``: hold out this fraction of the training samples (ceil, drawn by the
    job's seed) as the evaluation set. Those samples are NOT trained on; a resume must use the same
    fraction (it defines the training set the saved position counts in)."""
    eval_every_steps: int | None = None
    """Evaluate every N optimizer steps; with an evaluation set there is always one at the end
    (not after an interrupt). HF Trainer's ``eval_strategy="steps"``, ``eval_steps=N``."""
    eval_batch: int | None = None
    """Evaluation batch per rank (default: the job's micro-batch). An OOM in evaluation halves it
    and leaves the training micro-batch and accumulation as they are."""
    inject_eval_oom_at_steps: tuple[int, ...] = ()
    """Fault injection: raise an OOM in the last batch of the evaluation after these steps, once
    each."""
    kept_notes: tuple[str, ...] = ()
    """A resume's notes of the options it took from the run's record (:func:`options_kept`),
    said by :func:`say_kept` and kept in the segment's notes once the run's checks passed."""

    def kept_options(self) -> dict[str, Any]:
        """The options a resume keeps unless given again (:data:`KEPT_ON_RESUME`), as the record
        holds them (``run_options`` in train.json)."""
        # a path absolute: a resume from another directory finds the same file (a review)
        return {k: (str(v.resolve()) if isinstance(v, Path) else v)
                for k in KEPT_ON_RESUME if (v := getattr(self, k)) is not None}

    def __post_init__(self) -> None:
        if self.max_steps is not None and self.max_steps < 1:
            raise JobError(f"--max-steps {self.max_steps}: must be ≥ 1",
                           "leave it out to train --epochs over the data")
        if self.save_every_steps is not None and self.save_every_steps < 1:
            raise JobError(f"--save-every {self.save_every_steps}: must be ≥ 1",
                           "e.g. --save-every 100 (a checkpoint is always saved at the end)")
        if self.keep_last is not None and self.keep_last < 1:
            raise JobError(f"--keep-last {self.keep_last}: must be ≥ 1",
                           "e.g. --keep-last 2 (the newest two checkpoints stay); leave it out "
                           "to keep every one")
        if self.epochs is not None and not 0 < self.epochs < float("inf"):  # inf: a traceback
            raise JobError(f"--epochs {self.epochs}: must be a finite number > 0",
                           "e.g. --epochs 1")
        if self.epochs is not None and self.max_steps is not None:
            # each sets the run's length: --epochs was dropped unsaid (an audit)
            raise JobError(f"--max-steps {self.max_steps} and --epochs {self.epochs:g}: each "
                           "sets the run's length", "give one of them")
        if self.eval_data is not None and self.eval_fraction is not None:
            raise JobError("--eval-data and --eval-fraction both given: one evaluation set only",
                           "keep --eval-data (a separate file) or --eval-fraction (held-out samples)")
        if self.eval_fraction is not None and not 0 < self.eval_fraction < 1:
            raise JobError(f"--eval-fraction {self.eval_fraction:g}: must be between 0 and 1 "
                           "(exclusive)", "e.g. --eval-fraction 0.05 holds out 5 % of the samples")
        if self.eval_data is not None and not Path(self.eval_data).exists():
            raise JobError(f"--eval-data {self.eval_data}: no such file or directory",
                           "check the path")
        if self.eval_every_steps is not None and self.eval_every_steps < 1:
            raise JobError(f"--eval-every {self.eval_every_steps}: must be ≥ 1",
                           "evaluate every N optimizer steps, e.g. --eval-every 100")
        if self.eval_batch is not None and self.eval_batch < 1:
            raise JobError(f"--eval-batch {self.eval_batch}: must be ≥ 1",
                           "leave it out to evaluate at the training micro-batch")
        has_set = self.eval_data is not None or self.eval_fraction is not None
        if not has_set and (self.eval_every_steps is not None or self.eval_batch is not None
                            or self.inject_eval_oom_at_steps):
            raise JobError("evaluation options without an evaluation set",
                           "add --eval-data FILE or --eval-fraction F")


BACKENDS = ("trainfit", "hf", "trl", "auto")
"""trainfit: the own loop (every guarantee, any model); hf: transformers.Trainer; trl:
trl.SFTTrainer; auto: trainfit for a ``module:factory`` model, trl for chat data, hf for text."""


def check_backend(name: str) -> None:
    """A backend ``trainfit train`` has (JobError otherwise): checked before the model loads."""
    if name not in BACKENDS:
        raise JobError(f"--backend {name}: unknown", f"choose one of {', '.join(BACKENDS)}")


class Interrupt:
    """SIGINT/SIGTERM ask the loop to stop after the step (a checkpoint is saved); which one came
    decides the exit code (130 / 143)."""

    def __init__(self) -> None:
        self.requested = False
        self.signal: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals stay with the caller
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signal = self.signal or signal.Signals(signum).name

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
