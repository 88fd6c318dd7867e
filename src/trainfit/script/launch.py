"""Run the user's command with the script hooks (through the doctor's launcher: the same
``sitecustomize`` injection) and read back what its trainer held.

Every way the run can end without a record is a :class:`ScriptError` (``error:`` + ``hint:``, exit
2), with the command's last lines when they explain it: a command that never builds a Trainer, one
that builds it but never trains, a crash, a refusal of the hooks (remote code, an offloading
``device_map``, a loop of the script's own), a timeout.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import trainfit
from trainfit.doctor.inject import DoctorError, check_command, run_with_hooks
from trainfit.script import hooks
from trainfit.script.hooks import ENV_GPU, ENV_MODE, ENV_OPTIONS, ENV_OUT, ENV_TRUST

PKG_DIR = Path(trainfit.__file__).resolve().parent
"""The trainfit the child loads (sitecustomize: TRAINFIT_PKG_DIR), whatever its interpreter has."""


class ScriptError(DoctorError):
    """The script could not be read (exit 2); ``tail``: its last output lines."""


def run_script(cmd: list[str], *, mode: str, gpu: dict[str, Any] | None = None,
               trust_remote_code: bool = False, options: dict[str, Any] | None = None,
               timeout_s: float | None = 900.0) -> dict[str, Any]:
    """The record of the command's trainer (:func:`trainfit.script.read.read_trainer`)."""
    check_command(cmd, mode)
    out_dir = Path(tempfile.mkdtemp(prefix="trainfit-script-"))
    env = {ENV_OUT: str(out_dir), ENV_MODE: mode, "TRAINFIT_PKG_DIR": str(PKG_DIR),
           "TRAINFIT_SCRIPT_HOOKS": hooks.__name__,
           ENV_TRUST: "1" if trust_remote_code else "0", ENV_OPTIONS: json.dumps(options or {})}
    if gpu is not None:
        env[ENV_GPU] = json.dumps(gpu)
    try:
        ran = run_with_hooks(cmd, env, timeout_s=timeout_s)
        records = [json.loads(p.read_text()) for p in sorted(out_dir.glob("script.*.json"))]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return _interpret(cmd, records, ran.exit_code, ran.timed_out, timeout_s, ran.tail)


def _interpret(cmd: list[str], records: list[dict[str, Any]], code: int | None, timed_out: bool,
               timeout_s: float | None, tail: list[str]) -> dict[str, Any]:
    name = shlex.join(cmd)
    by_type: dict[str, dict[str, Any]] = {}
    for r in records:  # the process that read a trainer wins over its helpers (torchrun ranks …)
        by_type.setdefault(r.get("type", ""), r)
    if "read" in by_type:
        return by_type["read"]
    if "refused" in by_type:
        r = by_type["refused"]
        raise ScriptError(r["message"], r.get("hint", ""))
    if "error" in by_type:
        r = by_type["error"]
        trace = r.get("error", "").strip().splitlines()
        last = trace[-1][:300] if trace else "no message"
        doing = "tune probed its trainer" if r.get("where") == "tune" else "its trainer was read"
        if r.get("script_frame"):
            # the script's own code raised (its compute_loss, a collator …): its bug to fix, with
            # its traceback, not trainfit's to report
            raise ScriptError(f"{name}: the script's own code raised while {doing}, at "
                              f"{r['script_frame']} ({last})",
                              "fix it there (the traceback's last lines are below), then run "
                              "again", trace[-12:])
        raise ScriptError(f"{name}: trainfit failed while {doing} ({last})",
                          "report this with the script and the lines below", trace[-12:] or tail)
    if timed_out:
        raise ScriptError(f"{name}: no trainer started training within --timeout-s {timeout_s:g}",
                          "raise --timeout-s (loading and tokenizing come first)", tail)
    if code not in (0, None):
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if any("trust_remote_code" in line for line in tail):
            raise ScriptError(f"{name} {how}: the model needs its own code from the hub",
                              "pass trust_remote_code=True in the script and --trust-remote-code "
                              "to trainfit, if you trust its authors", tail)
        if any("deepspeed" in line.lower() and "not found" in line.lower() for line in tail):
            # TrainingArguments(deepspeed=...) requires the package as it is built (transformers
            # integrations/deepspeed.py: require_version("deepspeed>=0.9.3"))
            raise ScriptError(f"{name} {how}: its TrainingArguments(deepspeed=...) needs DeepSpeed "
                              "installed", "pip install deepspeed (its ops need not be built: "
                              "plan reads the config only)", tail)
        raise ScriptError(f"{name} {how} before its trainer started training",
                          "its last lines are below; fix the script, then run trainfit again", tail)
    done = by_type.get("no_trainer")
    if done is None:
        raise ScriptError(f"{name}: no Python process of this command could be read",
                          "plan and tune read a Python training script run by python "
                          "(PYTHONPATH must not be reset)", tail)
    if done.get("trainers_built"):
        raise ScriptError(f"{name}: it builds a Trainer but never calls trainer.train()",
                          "plan and tune read the trainer when train() is called", tail)
    raise ScriptError(f"{name}: the script ended without building a transformers Trainer or "
                      "TRL SFTTrainer", "for your own nn.Module: trainfit plan --model "
                      "path/to/model.py:factory; for any training loop: trainfit doctor -- "
                      + name, tail)
