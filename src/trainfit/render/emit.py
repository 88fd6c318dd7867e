"""``trainfit emit``'s messages (stderr): where the payload came from, what the file says it was
tuned under, and what the script must set itself. The payload itself goes to stdout alone."""

from __future__ import annotations

from typing import Any

from trainfit.job.emit import Emitted
from trainfit.job.files import file_memory_limit, size_text

GIB = 2**30

_TARGET_WORDS = {"hf": "transformers.TrainingArguments keyword arguments (JSON)",
                 "trl": "trl.SFTConfig keyword arguments (JSON)",
                 "accelerate": "accelerate config (YAML)"}
_USE = {"hf": "TrainingArguments(output_dir=..., **json.load(open(FILE)))",
        "trl": "SFTConfig(output_dir=..., **json.load(open(FILE)))",
        "accelerate": "accelerate launch --config_file FILE train.py"}


_RECIPE_KEYWORDS = {"lr": "learning_rate", "seed": "seed", "weight_decay": "weight_decay"}


def emit_messages(e: Emitted, source: str, extra: dict[str, Any], *, searched: bool,
                  edited: list[tuple[str, Any, Any]] | None = None) -> list[str]:
    """The lines printed on stderr around an emitted payload (``extra``: the file-only keys of
    the job file: device, memory_limit, measured; ``edited``: knobs the file changed since tune
    measured them — its numbers are then not shown as the file's)."""
    version = e.transformers_version
    names = "" if e.target == "accelerate" else (
        f", names of transformers {version}" if version else
        ", names of transformers 5.23 (not installed here)")
    if e.target == "trl":  # SFTConfig's own fields are TRL's (an audit)
        names += f" and TRL {e.trl_version}" if e.trl_version else " and TRL (not installed here)"
    how = "tuned now" if searched else "read from the file, no probe run"
    lines = [f"emit: {source} → {_TARGET_WORDS[e.target]} for {e.device}{names}; {how}"]
    limit = file_memory_limit(extra)  # bytes, or a size such as 2GiB
    measured = extra.get("measured") or {}
    # "tuned" and "fit" only of what tune measured (an audit: a hand-written 64 × 4096 job in
    # 1 GiB read "tuned on cpu … the knobs fit in it as tuned")
    was_tuned = searched or bool(measured)
    peak = measured.get("peak_allocated_bytes")
    holds = f"no {'TrainingArguments' if e.target != 'accelerate' else 'accelerate'} field holds it"
    if was_tuned:
        tuned = [f"tuned on {extra['device']}" if extra.get("device") else
                 "no tuning device stated"]
        fit = ("the knobs fit in it as tuned" if not isinstance(peak, int | float) or
               limit is None or peak <= limit else
               "the measured peak below is above it: this file does not fit in it as written")
        tuned.append("memory limit none" if limit is None else
                     f"memory limit {size_text(limit)} ({fit}; {holds})")
    else:
        tuned = [f"not tuned: {source} has no measured block (tune writes one), so nothing in "
                 "it was measured or checked to fit"
                 + (f"; device {extra['device']}" if extra.get("device") else "")
                 + ("" if limit is None else f", memory limit {size_text(limit)} ({holds})")]
    tuned_on = str(extra.get("device") or "")
    if was_tuned and tuned_on and tuned_on.split(":")[0] != str(e.device).split(":")[0]:
        # an audit: a CPU-tuned file emitted for cuda said only "tuned on cpu"
        tuned.append(f"tuned on {tuned_on}, emitted for {e.device}: its choices (precision for "
                     f"{tuned_on}'s speed, a micro-batch fitted to its memory) were not measured "
                     f"on {e.device} — tune there to choose for it")
    if edited:
        # an audit: the measured block was printed as the file's after its knobs were edited
        tuned.append("its measured numbers are not this configuration's: "
                     + ", ".join(f"{k} {now} in the file, measured at {then}"
                                 for k, then, now in edited)
                     + " (tune it again to measure it)")
    else:
        if measured.get("peak_allocated_bytes") is not None:
            tuned.append(f"peak allocated {measured['peak_allocated_bytes'] / GIB:.2f} GiB "
                         "(measured)")
        if measured.get("tokens_per_s") is not None:
            spread = measured.get("timing_spread")
            tuned.append(f"{measured['tokens_per_s']:,.0f} tokens/s (measured" + (
                f"; an unsteady run: one configuration's probes lay {spread:.1f}× apart)"
                if isinstance(spread, int | float) else ")"))
    lines.append("  " + ", ".join(tuned))
    for s in e.script:
        lines.append(f"  set in your script: {s.knob} {s.value} → {s.where}")
    for k in e.unstated:
        lines.append(f"  {k}: not stated in {source} (tune writes it): the library's default "
                     "stands")
    if e.target != "accelerate":
        said = "; ".join(f"{k} {v} in {source}: set {_RECIPE_KEYWORDS[k]}= in your script if you "
                         "want it" for k, v in e.recipe.items())
        lines.append("  learning rate, seed and weight decay: your script's (not knobs trainfit "
                     "measures or chooses; not in the payload)" + (f" — {said}" if said else ""))
    lines.append(f"  use: {_USE[e.target]}")
    return lines
