"""Lightning's ``BatchSizeFinder`` (mode "binsearch") on the job, step and capacity that
``tune_targets.py`` gives trainfit's ``tune`` and accelerate's ``find_executable_batch_size``.

The job's model (``trainfit.model.runtime.build_real``: same weights, same optimizer) is wrapped in a
``LightningModule`` whose ``training_step`` runs the same forward and loss as trainfit's
``train_step`` (``model(**batch).loss``, autocast of the job's precision); Lightning does the rest
as it would in a user's script: its loop, ``zero_grad``, ``backward``, gradient clipping
(``gradient_clip_val`` = the job's ``max_grad_norm``), ``optimizer.step``. ``train_dataloader``
is rebuilt from the ``batch_size`` attribute the finder changes, with trainfit's sample order and
collation (``make_loader``), one micro-batch per optimizer step (no accumulation, as accelerate's).

Capacity: the same ``trainfit.memory.limit.LimitTracker`` the accelerate comparison faces (through
``Probe.run``): live tensor bytes (parameters, buffers, gradients, optimizer states, the batch,
activations, temporaries) above the limit raise ``torch.OutOfMemoryError``. A fresh tracker per
optimizer step registers what is alive when the step starts, then counts what the step allocates.

Lightning's own order matters for the peak: its closure runs ``training_step`` *before*
``zero_grad`` (``lightning/pytorch/loops/optimization/automatic.py``, ``Closure.closure``), so the
previous step's gradients are still alive during the forward; trainfit's step sets them to None at
the end of the step. The finder therefore meets the same capacity with more bytes alive.
"""

from __future__ import annotations

import logging
import tempfile
import time
from typing import Any

import torch

from trainfit.data.dataset import TokenData
from trainfit.data.loader import LoaderKnobs, SampleOrder, make_loader
from trainfit.job import JobSpec
from trainfit.memory.limit import LimitTracker
from trainfit.model.runtime import build_real
from trainfit.model.source import ModelSource

# Lightning's defaults for the finder (Tuner.scale_batch_size in 2.6): stated in the results
SETTINGS = {"mode": "binsearch", "init_val": 2, "max_trials": 25, "steps_per_trial": 3, "margin": 0.05}


def lightning_version() -> str | None:
    """The installed Lightning version, or None when Lightning is not installed."""
    try:
        import lightning
    except ImportError:
        return None
    return lightning.__version__


def as_gpu_oom(err: BaseException) -> torch.OutOfMemoryError:
    """The LimitTracker's error worded so that Lightning recognises it as an OOM.

    Lightning's ``is_oom_error`` (``lightning/pytorch/utilities/memory.py``) accepts a RuntimeError
    whose single argument contains both "CUDA" and "out of memory" (or the CPU allocator's "can't
    allocate memory"); the LimitTracker says "out of memory." but not "CUDA", so without this the
    finder would re-raise it as "some other error" and stop. Prefixing the GPU's wording makes it
    take the path it takes on a GPU; where and at how many bytes the step failed is unchanged.
    """
    return torch.OutOfMemoryError(f"CUDA out of memory. {err}")


def limit_error_recognised() -> dict[str, bool]:
    """Does Lightning's OOM test accept the LimitTracker's own error, and the wrapped one? (checked)"""
    from lightning.pytorch.utilities.memory import is_oom_error

    tracker = LimitTracker(1)
    try:
        with tracker:
            torch.zeros(16)
    except torch.OutOfMemoryError as err:
        return {"limit_tracker_error": is_oom_error(err), "wrapped_error": is_oom_error(as_gpu_oom(err))}
    raise AssertionError("LimitTracker(1) did not raise")


def _module_class() -> type:
    import lightning.pytorch as pl

    class FinderModule(pl.LightningModule):
        """The job's model in Lightning: forward + loss in ``training_step``, Lightning's loop around."""

        def __init__(self, wl: Any, data: TokenData, task: str, limit_bytes: int, batch_size: int,
                     knobs: LoaderKnobs, seed: int) -> None:
            super().__init__()
            self.model = wl.model
            self._optimizer = wl.optimizer
            self._autocast = wl.autocast
            self._data, self._task, self._knobs, self._seed = data, task, knobs, seed
            self.limit_bytes = limit_bytes
            self.batch_size = batch_size
            self.steps: list[dict[str, Any]] = []
            self._tracker: LimitTracker | None = None

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            bs = self.batch_size
            n = len(self._data) // bs * bs
            ids = SampleOrder(len(self._data), seed=self._seed).ids(0, n)
            return make_loader(self._data, self._task, [ids[k:k + bs] for k in range(0, n, bs)],
                               self._knobs)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return self._optimizer

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            batch.pop("sample_ids", None)
            self._phase("forward")
            if self._tracker is not None:
                for v in batch.values():
                    self._tracker.track(v, "buffers")
            with self._autocast():
                out = self.model(**batch)
            return out.loss

        def _phase(self, phase: str) -> None:
            if self._tracker is not None:
                self._tracker.set_phase(phase)

        # Lightning's hooks name the phases, so a peak and an OOM say where they happened
        def on_before_zero_grad(self, optimizer: Any) -> None:
            self._phase("zero_grad")

        def on_before_backward(self, loss: torch.Tensor) -> None:
            self._phase("backward")

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            self._phase("optimizer")

        def _start_tracker(self) -> LimitTracker:
            """A tracker holding what is alive as the step starts (the previous step's gradients
            included: Lightning zeroes them only after the next forward)."""
            tr = LimitTracker(self.limit_bytes)
            for t in [*self.model.parameters(), *self.model.buffers()]:
                tr.track(t, "parameters")
            for p in self.model.parameters():
                if p.grad is not None:
                    tr.track(p.grad, "gradients")
            for state in self._optimizer.state.values():
                for v in state.values():
                    if torch.is_tensor(v):
                        tr.track(v, "optimizer")
            return tr

        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                           optimizer_closure: Any = None) -> None:
            # the whole automatic-optimization step (training_step, zero_grad, backward, clipping,
            # optimizer.step) runs inside optimizer.step(closure): one tracker around it
            tr = self._start_tracker()
            self._tracker = tr
            rec = {"batch_size": self.batch_size, "status": "ok", "threads": torch.get_num_threads()}
            try:
                with tr:
                    optimizer.step(closure=optimizer_closure)
            except torch.OutOfMemoryError as err:
                rec.update(status="oom", phase=tr.phase)
                raise as_gpu_oom(err) from None
            finally:
                rec.update(peak_bytes=tr.peak.peak_bytes, peak_phase=tr.peak.phase,
                           peak_breakdown=tr.peak.breakdown())
                self.steps.append(rec)
                self._tracker = None

    return FinderModule


def _trials(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive steps at one batch size = one trial of the finder. An OOM trial's ``peak_bytes``
    is where the failing allocation would have taken the live bytes (above the limit)."""
    out: list[dict[str, Any]] = []
    for s in steps:
        if not out or out[-1]["batch_size"] != s["batch_size"] or out[-1]["status"] == "oom":
            out.append({"batch_size": s["batch_size"], "status": "ok", "steps": 0, "peak_bytes": 0})
        t = out[-1]
        t["steps"] += 1
        if s["peak_bytes"] >= t["peak_bytes"]:
            t.update(peak_bytes=s["peak_bytes"], peak_phase=s["peak_phase"],
                     peak_breakdown=s["peak_breakdown"])
        if s["status"] == "oom":
            t.update(status="oom", oom_phase=s["phase"])
    return out


def find_batch_size(source: ModelSource, data: TokenData, base: JobSpec, limit_bytes: int, *,
                    seed: int = 0, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``Tuner(trainer).scale_batch_size(mode="binsearch")`` on the job; what it chose, what it
    tried (each trial's peak live bytes) and the wall time of the search (measured)."""
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    s = {**SETTINGS, **(settings or {})}
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    threads = torch.get_num_threads()
    job = base.replace(micro_batch=s["init_val"], grad_accum=1, effective_batch=s["init_val"])
    device = torch.device("cpu")
    wl = build_real(job, source, device, seed=seed)
    knobs = LoaderKnobs(num_workers=job.num_workers, prefetch_factor=job.prefetch_factor,
                        persistent_workers=job.persistent_workers)
    module = _module_class()(wl, data, source.task, limit_bytes, s["init_val"], knobs, seed)
    with tempfile.TemporaryDirectory() as root:  # the finder's checkpoint of the initial weights
        trainer = pl.Trainer(accelerator="cpu", devices=1, precision="32-true", logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=root,
                             gradient_clip_val=job.max_grad_norm, accumulate_grad_batches=1,
                             max_epochs=-1)  # the finder's trials stop at steps_per_trial
        t0 = time.perf_counter()
        chosen = Tuner(trainer).scale_batch_size(
            module, mode=s["mode"], init_val=s["init_val"], max_trials=s["max_trials"],
            steps_per_trial=s["steps_per_trial"], margin=s["margin"])
        wall = time.perf_counter() - t0
    torch.set_num_threads(threads)  # in case Lightning changed it: the re-measurement runs as before
    trials = _trials(module.steps)
    ok = [t["batch_size"] for t in trials if t["status"] == "ok"]
    return {
        "lightning_version": lightning_version(), "settings": s, "chosen_batch": chosen,
        "largest_batch_that_ran": max(ok) if ok else None,
        "tried": [t["batch_size"] for t in trials], "trials": trials,
        "probe_time_s": wall, "oom_error_recognised": limit_error_recognised(),
        "compute_threads_during_search": sorted({st["threads"] for st in module.steps}),
    }
