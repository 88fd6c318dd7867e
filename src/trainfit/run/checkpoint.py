"""Checkpoints that resume exactly: trainable weights (safetensors), optimizer, scheduler, GradScaler,
RNG states and the data position. Loading never unpickles code: ``torch.load(weights_only=True)``.

Layout: ``<out>/checkpoint-<step>/`` written as ``.tmp`` and renamed when complete (a crash while
saving leaves the previous checkpoint intact); ``<out>/latest`` names the newest.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainfit.job import JobError


@dataclass
class RunState:
    step: int
    """Optimizer steps completed."""
    position: int
    """Samples consumed (all ranks): the index into the deterministic sample order."""
    micro_batch: int
    grad_accum: int


def fingerprint(model: torch.nn.Module) -> str:
    """Names and shapes of the trainable tensors: a checkpoint of another model cannot load."""
    h = hashlib.sha256()
    for n, p in model.named_parameters():
        if p.requires_grad:
            h.update(f"{n}:{tuple(p.shape)}:{p.dtype};".encode())
    return h.hexdigest()[:16]


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad}


def save(out_dir: Path, state: RunState, model: torch.nn.Module, optimizer: Any, scheduler: Any,
         scaler: Any | None, job: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    final = out_dir / f"checkpoint-{state.step}"
    tmp = out_dir / f".checkpoint-{state.step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(_trainable(model), str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    if scaler is not None:
        torch.save(scaler.state_dict(), tmp / "scaler.pt")
    torch.save({"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
               tmp / "rng.pt")
    np_state = np.random.get_state()
    meta = {"step": state.step, "position": state.position, "micro_batch": state.micro_batch,
            "grad_accum": state.grad_accum, "fingerprint": fingerprint(model), "job": job,
            "python_rng": repr(random.getstate()),
            "numpy_rng": [np_state[0], np_state[1].tolist(), *np_state[2:]]}
    (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    (out_dir / "latest").write_text(final.name + "\n")
    return final


def find(resume: Path) -> Path:
    """A checkpoint dir, or a run dir whose ``latest`` names one."""
    if not resume.exists():
        raise JobError(f"--resume {resume}: does not exist", "give a run directory or a checkpoint")
    if (resume / "trainer_state.json").is_file():
        return resume
    latest = resume / "latest"
    if latest.is_file():
        ck = resume / latest.read_text().strip()
        if (ck / "trainer_state.json").is_file():
            return ck
    raise JobError(f"--resume {resume}: no checkpoint in it",
                   "give a directory that trainfit train wrote")


def load(ck: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any, scaler: Any | None,
         device: torch.device) -> RunState:
    from safetensors.torch import load_file

    try:
        meta = json.loads((ck / "trainer_state.json").read_text())
        if meta.get("fingerprint") != fingerprint(model):
            raise JobError(f"--resume {ck}: the checkpoint belongs to another model (its trainable "
                           "tensors differ in names or shapes)", "resume with the job that wrote it")
        weights = load_file(str(ck / "model.safetensors"))
        own = dict(model.named_parameters())
        with torch.no_grad():
            for n, t in weights.items():
                own[n].copy_(t.to(own[n].device))
        optimizer.load_state_dict(torch.load(ck / "optimizer.pt", weights_only=True,
                                             map_location=device))
        scheduler.load_state_dict(torch.load(ck / "scheduler.pt", weights_only=True))
        if scaler is not None and (ck / "scaler.pt").exists():
            scaler.load_state_dict(torch.load(ck / "scaler.pt", weights_only=True))
        rng = torch.load(ck / "rng.pt", weights_only=True)
    except JobError:
        raise
    except Exception as err:  # corrupt files raise many types (safetensors, pickle, json, KeyError)
        raise JobError(f"--resume {ck}: the checkpoint is corrupt ({type(err).__name__}: "
                       f"{str(err).splitlines()[0][:120] if str(err) else ''})",
                       "resume from an earlier checkpoint-N directory") from None
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    import ast

    random.setstate(ast.literal_eval(meta["python_rng"]))  # literals only: never evaluates code
    ns = meta["numpy_rng"]
    np.random.set_state((ns[0], np.array(ns[1], dtype=np.uint32), *ns[2:]))
    return RunState(step=meta["step"], position=meta["position"], micro_batch=meta["micro_batch"],
                    grad_accum=meta["grad_accum"])
