"""The HF Trainer's checkpoints as trainfit resumes them: the one to resume from (verified
against its digests, written by an HF Trainer), the run length it saved, and the run's record
kept beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainfit.job import JobError

HISTORY = "trainfit_history.json"
"""The run's record at a trainer checkpoint (the own loop keeps it in trainer_state.json)."""


def hf_max_steps(ck: str) -> int | None:
    """The length of the run that wrote an HF checkpoint (TrainerState's ``max_steps``)."""
    from trainfit.run.checkpoint import state_count

    return state_count(Path(ck), "max_steps")


def last_checkpoint(resume: Path) -> tuple[str, str | None]:
    """(the trainer checkpoint to resume from, a note when a newer one is incomplete). A
    checkpoint's files are verified against the digests written at its save: a damaged file is a
    JobError naming it, with the newest intact checkpoint offered."""
    from trainfit.run.checkpoint import DIGESTS, checkpoints, damage, offer_intact

    if (resume / "trainer_state.json").exists():
        check_hf_written(resume)
        wrong = damage(resume)
        if wrong is not None:
            raise JobError(f"--resume: {wrong}", offer_intact(resume.parent, resume))
        return str(resume), None
    # newest first: one whose save did not finish (no manifest) is passed over, said; the first
    # finished one is verified, and a damaged file in it is the own loop's error (an audit: a
    # flipped bit fell back a step, exit 0)
    skipped: list[str] = []
    for ck in checkpoints(resume) if resume.is_dir() else []:
        if not (ck / DIGESTS).exists():
            skipped.append(ck.name)
            continue
        wrong = damage(ck)
        if wrong is not None:
            raise JobError(f"--resume: {wrong}", offer_intact(resume, ck))
        check_hf_written(ck)
        return str(ck), None if not skipped else (
            f"{', '.join(skipped)} {'is' if len(skipped) == 1 else 'are'} incomplete (its save "
            f"did not finish): resuming from {ck.name}, the newest intact checkpoint")
    raise JobError(f"--resume {resume}: no complete HF checkpoint (checkpoint-N with "
                   "trainer_state.json and digests.json) there",
                   "give the run directory of an earlier trainfit train --backend hf|trl")


def check_hf_written(ck: Path) -> None:
    """A checkpoint of trainfit's own loop handed to the HF Trainer ended in a TypeError from
    ``TrainerState`` (an audit): its ``trainer_state.json`` holds trainfit's fields
    (``fingerprint``, ``step``), not HF's ``global_step``."""
    try:
        meta = json.loads((ck / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return  # damage() and the trainer say what is wrong with an unreadable one
    if isinstance(meta, dict) and "fingerprint" in meta and "global_step" not in meta:
        raise JobError(f"--resume {ck}: written by trainfit's own loop (train without --backend), "
                       "not by an HF Trainer", "resume it without --backend, as it was run")


def read_history(ck: Path) -> dict[str, Any]:
    try:
        h = json.loads((ck / HISTORY).read_text())
    except (OSError, ValueError):
        return {}
    return h if isinstance(h, dict) else {}
