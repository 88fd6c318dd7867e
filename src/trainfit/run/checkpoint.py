"""Checkpoints that resume exactly: trainable weights (safetensors), optimizer, scheduler, GradScaler,
RNG states, the data position and the run's history. Loading never unpickles code:
``torch.load(weights_only=True)``.

Layout: ``<out>/checkpoint-<step>/`` written as ``.checkpoint-<step>.tmp`` — every file fsync-ed,
then ``digests.json`` (the SHA-256 of every file, and of itself), the directory fsync-ed — and
renamed when complete, the run directory fsync-ed; ``<out>/latest`` names the newest, replaced
atomically (:func:`trainfit.run.rundir.write_atomic`). A crash or a full disk while saving leaves the
previous checkpoint and ``latest`` intact (the partial ``.tmp`` is removed, or by the next run).

Loading verifies every file against ``digests.json`` before reading any: a flipped bit is one error
naming the file, with the newest intact checkpoint offered. A ``latest`` that is empty, unreadable or
names a checkpoint that is not there falls back to the newest complete checkpoint, said in a note.

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

from trainfit import json_text
from trainfit.job import JobError
from trainfit.run.resume_fields import other_trainables, same_samples
from trainfit.run.rundir import fsync_dir, fsync_file, os_reason, space_hint, write_atomic

DIGESTS = "digests.json"
"""SHA-256 of every file of a checkpoint, written last (a checkpoint without it is incomplete)."""


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


class CheckpointWriteError(JobError):
    """A checkpoint could not be written (disk full, read-only, removed directory ...)."""


def save(out_dir: Path, state: RunState, model: torch.nn.Module, optimizer: Any, scheduler: Any,
         scaler: Any | None, job: dict[str, Any], *, write: bool = True,
         history: dict[str, Any] | None = None, schedule_steps: int | None = None) -> Path:
    """Write the checkpoint (``write``: this rank writes; under FSDP every rank must call this, as
    gathering the shards is collective, and only one writes). ``history``: the run so far (losses,
    segments …), kept so a resume from this checkpoint continues the same record.
    Raises CheckpointWriteError (a JobError) when the files cannot be written: the partial
    directory is removed, the previous checkpoint and ``latest`` are untouched."""
    final = out_dir / f"checkpoint-{state.step}"
    if is_sharded(model):
        weights, optim = _full_state(model, optimizer)
    elif write:
        weights, optim = _trainable(model), optimizer.state_dict()
    if not write:
        return final
    tmp = out_dir / f".checkpoint-{state.step}.tmp"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        _write_files(tmp, state, model, weights, optim, scheduler, scaler, job, history,
                     schedule_steps)
        _publish(tmp, final)
        write_atomic(out_dir / "latest", final.name + "\n")
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(err, Exception):  # KeyboardInterrupt, SystemExit: cleaned, passed on
            raise
        good = newest_intact(out_dir)
        keep = (f"the last good checkpoint, {good}, is intact" if good is not None
                else "no checkpoint was written before this one")
        raise CheckpointWriteError(
            f"could not write {final} ({os_reason(err)}); {keep}",
            "free space on that disk" + space_hint(out_dir) + f" or make {out_dir} writable, "
            f"then continue with --resume {out_dir}" if good is not None else
            "free space on that disk" + space_hint(out_dir) + " or choose a writable --out, then "
            "run again") from None
    return final


def _write_files(tmp: Path, state: RunState, model: torch.nn.Module, weights: dict[str, Any],
                 optim: dict[str, Any], scheduler: Any, scaler: Any | None, job: dict[str, Any],
                 history: dict[str, Any] | None, run_steps: int | None) -> None:
    from safetensors.torch import save_file

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
            "schedule_steps": run_steps,
            "python_rng": repr(random.getstate()),
            "numpy_rng": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "history": history or {}}
    (tmp / "trainer_state.json").write_text(json_text.dumps(meta, indent=1))
    # safetensors' writer makes its file 0600; every other file here has the umask's mode (an
    # audit: model.safetensors alone unreadable to the group that reads the run)
    (tmp / "model.safetensors").chmod((tmp / "trainer_state.json").stat().st_mode & 0o777)
    write_digests(tmp)


def write_digests(ck: Path) -> None:
    """Fsync every file of the checkpoint directory and record its SHA-256 in ``digests.json``
    (with the manifest's own digest), written atomically. The HF/TRL backends call it on the
    trainers' checkpoints too."""
    files = {}
    for p in sorted(x for x in ck.rglob("*") if x.is_file() and x.name != DIGESTS):
        fsync_file(p)
        files[str(p.relative_to(ck))] = _sha256(p)
    write_atomic(ck / DIGESTS, json.dumps({"algorithm": "sha256", "files": files,
                                           "self": _manifest_digest(files)}, indent=1))


def _publish(tmp: Path, final: Path) -> None:
    """Rename the complete ``tmp`` to ``final``; a checkpoint of the same step (a resume that saves
    its start again) is moved aside first and removed only after the new one is in place."""
    fsync_dir(tmp)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
    tmp.rename(final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest_digest(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def damage(ck: Path) -> str | None:
    """None when every file of the checkpoint matches the digest recorded when it was written;
    else what is wrong, naming the first file that does not (or the missing manifest)."""
    manifest = ck / DIGESTS
    try:
        d = json.loads(manifest.read_text())
        files = d["files"]
        ok = isinstance(files, dict) and d.get("self") == _manifest_digest(files)
    except FileNotFoundError:
        return (f"{ck}: incomplete checkpoint (no {DIGESTS}: its save did not finish, or an "
                "older trainfit wrote it)")
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        return f"{manifest}: damaged (it does not match its own digest)"
    for name, digest in files.items():
        p = ck / name
        try:
            actual = _sha256(p)
        except OSError as err:
            return f"{p}: cannot be read ({os_reason(err)})"
        if actual != digest:
            return f"{p}: damaged (its SHA-256 differs from the one recorded when it was written)"
    return None


def step_of(ck: Path) -> int | None:
    """N of a ``checkpoint-N`` directory (the update step it was saved after); None for any
    other name."""
    digits = ck.name[len("checkpoint-"):]
    ok = ck.name.startswith("checkpoint-") and digits.isascii() and digits.isdecimal()
    return int(digits) if ok else None  # isdigit() alone takes "²", which int() refuses


def checkpoints(out: Path) -> list[Path]:
    """``checkpoint-N`` directories of a run, newest (largest N) first."""
    try:
        found = [p for p in out.iterdir() if p.is_dir() and step_of(p) is not None]
    except OSError:
        return []
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def prune(out: Path, keep: int, upto_step: int | None = None) -> list[Path]:
    """Remove ``out``'s checkpoints older than its ``keep`` newest (never the one ``latest``
    names); returns those removed. ``upto_step``: the run's step; checkpoints after it, of the run
    this one resumed before (replaced as it saves those steps), are neither kept nor removed — a
    review: they counted among the newest and this run's own went. Each goes whole or stays:
    renamed aside first, then deleted, so an interrupted prune leaves no half checkpoint under a
    ``checkpoint-N`` name."""
    latest = (out / "latest").read_text().strip() if (out / "latest").is_file() else None
    gone = []
    mine = [ck for ck in checkpoints(out) if upto_step is None or (step_of(ck) or 0) <= upto_step]
    for ck in mine[keep:]:
        if ck.name == latest:
            continue
        aside = out / f".{ck.name}.removing"
        try:
            ck.rename(aside)
        except OSError:
            continue  # left as it is: a checkpoint kept is never an error
        shutil.rmtree(aside, ignore_errors=True)
        gone.append(ck)
    return gone


def newest_intact(out: Path, *, skip: Path | None = None) -> Path | None:
    """The newest checkpoint of ``out`` whose files all match their digests."""
    for ck in checkpoints(out):
        if skip is not None and ck.resolve() == skip.resolve():
            continue
        if damage(ck) is None:
            return ck
    return None


def offer_intact(run: Path | None, bad: Path) -> str:
    good = newest_intact(run, skip=bad) if run is not None else None
    if good is not None:
        return f"resume from the newest intact checkpoint: --resume {good}"
    return "no intact checkpoint is left: start the run again (a new --out)"


def is_checkpoint_dir(path: Path) -> bool:
    """A checkpoint's own directory (its state or its digests), whatever its name — not a run
    directory holding checkpoints."""
    return (path / "trainer_state.json").exists() or (path / DIGESTS).exists()


def find(resume: Path) -> tuple[Path, str | None]:
    """(the checkpoint to resume from, a note when it is not the one ``latest`` names).

    ``resume``: a checkpoint directory, or a run directory whose ``latest`` names one. Every file
    is verified against its digest; a damaged file is a JobError naming it, with the newest intact
    checkpoint offered."""
    try:
        exists = resume.exists()
    except OSError as err:
        raise JobError(f"--resume {resume}: not a usable path ({os_reason(err)})",
                       "give the run directory of an earlier trainfit train") from None
    if not exists:
        raise JobError(f"--resume {resume}: does not exist", "give a run directory or a checkpoint")
    if not resume.is_dir():  # a checkpoint's file: the hint was to remove it (an audit)
        raise JobError(f"--resume {resume}: a file, not a directory",
                       f"--resume takes a run directory or a checkpoint-N directory, e.g. "
                       f"--resume {resume.parent}")
    if is_checkpoint_dir(resume):
        _verified(resume, resume.parent)
        return resume, None
    named, why = _latest(resume)
    if named is not None:
        _verified(named, resume)
        return named, None
    skipped: list[str] = []
    for ck in checkpoints(resume):
        wrong = damage(ck)
        if wrong is None:
            # the newer ones passed over are named: their steps are trained again (QA)
            past = (f" ({'; '.join(skipped)}: its steps are trained again)" if skipped else "")
            return ck, f"{why}: resuming from {ck.name}, the newest complete checkpoint{past}"
        skipped.append(wrong)
    partial = sorted(p.name for p in resume.glob(".checkpoint-*.tmp"))
    raise JobError(f"--resume {resume}: no complete checkpoint in it"
                   + (f" ({', '.join(partial)} is a save that was interrupted)" if partial else ""),
                   # a run killed before it wrote its record is set aside by a new run there
                   # (an audit); one that recorded steps (diverged, failed) is not: refused
                   ("run again without --resume into a new --out (or remove "
                    f"{resume} first: it holds no complete checkpoint)"
                    if (resume / "train.json").exists() else
                    f"run again without --resume, into the same --out {resume} (what a run "
                    "killed before its first checkpoint left is set aside) or a new one")
                   + ", or give a directory that trainfit train wrote")


def _latest(run: Path) -> tuple[Path | None, str]:
    """The checkpoint ``latest`` names when it is there, else (None, why not)."""
    latest = run / "latest"
    try:
        name = latest.read_text().strip()
    except FileNotFoundError:
        return None, f"{latest} is missing"
    except (OSError, UnicodeDecodeError):
        return None, f"{latest} cannot be read"
    if not name:
        return None, f"{latest} is empty"
    ck = run / name
    if "/" in name or not ck.is_dir():
        return None, f"{latest} names {name!r}, which is not there"
    return ck, ""


def _verified(ck: Path, run: Path | None) -> None:
    wrong = damage(ck)
    if wrong is not None:
        raise JobError(f"--resume: {wrong}", offer_intact(run, ck))


def load(ck: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any, scaler: Any | None,
         device: torch.device, job: dict[str, Any] | None = None) -> RunState:
    """``job``: the resuming job, whose sample fields (:data:`SAMPLE_FIELDS`) must be the
    checkpoint's."""
    from safetensors.torch import load_file

    try:
        meta = json.loads((ck / "trainer_state.json").read_text())
        if "global_step" in meta and "fingerprint" not in meta:
            # HF's TrainerState: read as "another model" before (an audit)
            raise JobError(f"--resume {ck}: written by train --backend hf|trl (an HF Trainer "
                           "checkpoint), not by trainfit's own loop",
                           "resume it with the backend that wrote it: --backend hf (or trl)")
        for key, least in (("step", 0), ("position", 0), ("micro_batch", 1), ("grad_accum", 1)):
            v = meta.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                # an edited file whose digests were redone: a TypeError deep in the loader, or a
                # run "from step -3" (an audit)
                raise JobError(f"--resume {ck}: the checkpoint is corrupt (trainer_state.json: "
                               f"{key} {v!r}, expected an integer ≥ {least})",
                               "resume from an earlier checkpoint-N directory")
        if meta.get("fingerprint") != fingerprint(model):
            raise other_trainables(ck, meta.get("job"), job)
        same_samples(ck, meta.get("job"), job)
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
        # the random states too: a garbage numpy_rng whose digest matched raised ValueError out
        # of here, a traceback (an audit)
        import ast

        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        random.setstate(ast.literal_eval(meta["python_rng"]))  # literals only: never runs code
        ns = meta["numpy_rng"]
        np.random.set_state((ns[0], np.array(ns[1], dtype=np.uint32), *ns[2:]))
        return RunState(step=meta["step"], position=meta["position"],
                        micro_batch=meta["micro_batch"], grad_accum=meta["grad_accum"])
    except JobError:
        raise
    except Exception as err:  # corrupt files raise many types (safetensors, pickle, json, KeyError)
        raise JobError(f"--resume {ck}: the checkpoint is corrupt ({type(err).__name__}: "
                       f"{str(err).splitlines()[0][:120] if str(err) else ''})",
                       "resume from an earlier checkpoint-N directory") from None


def state_count(ck: Path, key: str) -> int | None:
    """A positive integer field of ``ck``'s ``trainer_state.json`` (trainfit's and HF
    TrainerState's file alike); None where the file, the field or a count ≥ 1 is missing."""
    try:
        n = json.loads((ck / "trainer_state.json").read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def schedule_steps(ck: Path) -> int | None:
    """The length of the run that wrote ``ck`` (its linear decay reaches 0 there); None for a
    checkpoint written before trainfit recorded it."""
    return state_count(ck, "schedule_steps")


def saved_job(ck: Path) -> dict[str, Any] | None:
    """The job that wrote the checkpoint (None for one written without it)."""
    try:
        j = json.loads((ck / "trainer_state.json").read_text()).get("job")
    except (OSError, ValueError):
        return None
    return j if isinstance(j, dict) else None


def history(ck: Path) -> dict[str, Any]:
    """The run's record saved with the checkpoint (empty for checkpoints written without it)."""
    try:
        h = json.loads((ck / "trainer_state.json").read_text()).get("history")
    except (OSError, ValueError):
        return {}
    return h if isinstance(h, dict) else {}


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
