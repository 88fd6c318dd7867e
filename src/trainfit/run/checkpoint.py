"""Checkpoints that resume exactly: trainable weights (safetensors), optimizer, scheduler, GradScaler,
RNG states and the data position. Loading never unpickles code: ``torch.load(weights_only=True)``.

Layout: ``<out>/checkpoint-<step>/`` written as ``.tmp`` and renamed when complete (a crash while
saving leaves the previous checkpoint intact); ``<out>/latest`` names the newest.

Under FSDP (parameters sharded as DTensors over the ranks) the files are the same: every rank takes
part in gathering the full trainable weights and optimizer state (``torch.distributed.checkpoint``'s
state-dict API), rank 0 writes them; loading reads them on rank 0 and broadcasts each tensor into
the shards. So a checkpoint moves between 1 rank, DDP and FSDP at any number of ranks.
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


def is_sharded(model: torch.nn.Module) -> bool:
    """FSDP2 made the parameters DTensors: a full state is then gathered by all ranks together."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _opt_names(model: torch.nn.Module, optimizer: Any) -> list[str]:
    """Parameter names in the optimizer's order. ``optimizer.state_dict()`` (what optimizer.pt holds)
    numbers the parameters 0, 1, … in this order; the distributed state-dict API names them: this
    list converts either way, so the file is the same whichever wrote it."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _full_state(model: torch.nn.Module, optimizer: Any
                ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Collective (every rank must call it, in the same order): the full trainable weights and the
    optimizer state in ``optimizer.state_dict()``'s layout, on CPU, on rank 0 (``{}`` elsewhere:
    ``cpu_offload`` keeps the full copies off the other ranks)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts)
    if not osd:  # not rank 0
        return {}, {}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    weights = {n: t.contiguous() for n, t in msd.items() if n in trainable}
    idx = {n: i for i, n in enumerate(_opt_names(model, optimizer))}
    optim = {"state": {idx[n]: v for n, v in osd["state"].items()},
             "param_groups": [{**g, "params": [idx[n] for n in g["params"]]}
                              for g in osd["param_groups"]]}
    return weights, optim


def save(out_dir: Path, state: RunState, model: torch.nn.Module, optimizer: Any, scheduler: Any,
         scaler: Any | None, job: dict[str, Any], *, write: bool = True) -> Path:
    """Write the checkpoint (``write``: this rank writes; under FSDP every rank must call this, as
    gathering the shards is collective, and only one writes)."""
    from safetensors.torch import save_file

    final = out_dir / f"checkpoint-{state.step}"
    if is_sharded(model):
        weights, optim = _full_state(model, optimizer)
    elif write:
        weights, optim = _trainable(model), optimizer.state_dict()
    if not write:
        return final
    tmp = out_dir / f".checkpoint-{state.step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(weights, str(tmp / "model.safetensors"))
    torch.save(optim, tmp / "optimizer.pt")
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
        if is_sharded(model):
            _load_sharded(ck, model, optimizer)
        else:
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


def _load_sharded(ck: Path, model: torch.nn.Module, optimizer: Any) -> None:
    """Collective: rank 0 reads the full weights and optimizer state, each tensor is broadcast and
    cut into every rank's shard (``broadcast_from_rank0``: one full copy in host memory, not one
    per rank). Rank 0's read errors reach every rank before any broadcast, so a corrupt file is
    the same clean error on all of them instead of ranks waiting forever for rank 0."""
    import torch.distributed as dist
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights: dict[str, torch.Tensor] = {}
    optim: dict[str, Any] = {}
    err: Exception | None = None
    if dist.get_rank() == 0:
        try:
            weights = load_file(str(ck / "model.safetensors"))
            sd = torch.load(ck / "optimizer.pt", weights_only=True, map_location="cpu")
            names = _opt_names(model, optimizer)
            optim = {"state": {names[int(i)]: v for i, v in sd["state"].items()},
                     "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                                      for g in sd["param_groups"]]}
        except Exception as e:  # any read error: reported below on every rank
            err = e
    # on the parameters' device: NCCL reduces CUDA tensors only
    failed = torch.tensor([0.0 if err is None else 1.0], device=next(model.parameters()).device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item() > 0:
        raise err if err is not None else RuntimeError("rank 0 could not read the checkpoint")
    # strict=False: the file holds the trainable tensors only (LoRA: the adapters, not the base)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=opts)
    set_optimizer_state_dict(model, optimizer, optim, options=opts)
