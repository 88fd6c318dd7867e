"""The job's fields as data: name, flag, type, allowed values, default and the sentence that says
what each does — read from ``JobSpec`` itself (its dataclass fields and the docstring under each),
so every command's flags, the YAML keys and docs/job-fields.md come from one place.

And the registry of tune's knobs: what tune may change, which job fields each sets, its effect
(the comment on that knob in the YAML tune writes), and whether it is searched by default.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import types
import typing
from dataclasses import dataclass
from typing import Any

from trainfit.job import spec
from trainfit.job.spec import JobError, JobSpec

CHOICES: dict[str, tuple[str, ...]] = {
    "method": spec.METHODS, "quant": spec.QUANTS, "quant_lib": spec.QUANT_LIBS,
    "precision": spec.PRECISIONS,
    "optimizer": spec.OPTIMIZERS, "optimizer_impl": spec.OPTIMIZER_IMPLS,
    "grad_ckpt": spec.GRAD_CKPT, "attention": spec.ATTENTIONS, "sharding": spec.SHARDINGS,
    "offload": spec.OFFLOADS, "base_dtype": spec.BASE_DTYPES,
    "fsdp_reduce_dtype": spec.REDUCE_DTYPES, "fsdp_init": spec.FSDP_INITS,
    "fsdp_version": spec.FSDP_VERSIONS,
    "rope_cache": spec.ROPE_CACHES,
}
"""The fields whose value is one of a fixed set (validated in JobSpec.__post_init__)."""

COMMAND_LINE_ONLY = ("trust_remote_code",)
"""Fields never taken from a job file's flags table: remote code runs only with the explicit
``--trust-remote-code`` every command declares itself."""


@dataclass(frozen=True)
class FieldInfo:
    name: str
    """The YAML key (and JobSpec attribute)."""
    kind: type
    """int, float, str, bool or list (a comma-separated list on the command line)."""
    optional: bool
    """None is a value: the command chooses (plan/tune), or the field is off."""
    default: Any
    choices: tuple[str, ...] | None
    help: str
    """The field's docstring in JobSpec."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def clearable(self) -> bool:
        """``--FLAG none`` sets the field back to None (to clear what a YAML set, or to turn
        off what None turns off: ``--max-grad-norm none``)."""
        return self.optional and self.kind in (str, int, float) and \
            "none" not in (self.choices or ())

    def cleared(self, value: Any) -> bool:
        """Whether ``value`` is ``none`` given for this field (a flag's or a job file's): None."""
        return self.clearable and isinstance(value, str) and value.strip().lower() == "none"


def _docstrings() -> dict[str, str]:
    """Each field's attribute docstring (the string literal under it in JobSpec's body)."""
    tree = ast.parse(inspect.getsource(JobSpec))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in itertools.pairwise(body):
        if isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name) and \
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def _kind(annotation: Any) -> tuple[type, bool]:
    hint = typing.get_type_hints(JobSpec)[annotation] if isinstance(annotation, str) else annotation
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if typing.get_origin(hint) is list or typing.get_origin(base) is list:
        return list, optional
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return base, optional
    return hint, optional


@functools.cache
def job_fields() -> tuple[FieldInfo, ...]:
    docs = _docstrings()
    out = []
    for f in dataclasses.fields(JobSpec):
        kind, optional = _kind(f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append(FieldInfo(name=f.name, kind=kind, optional=optional, default=default,
                             choices=CHOICES.get(f.name), help=docs.get(f.name, "")))
    return tuple(out)


def check_given(flags: dict[str, Any]) -> None:
    """JobSpec's checks of single fields — type, a size ≥ 1, an allowed value — on fields given
    alone, before the job they join exists: a script's flags, checked before the script runs
    (an audit: ``--micro-batch 0`` with a script ran it, then ended in a ZeroDivisionError;
    ``--effective-batch 0`` was taken as not given). Checks between fields wait for the job."""
    from trainfit.job.choices import _choice
    from trainfit.job.validate import check_positive, check_types

    job = JobSpec(model="flags")
    for name, value in flags.items():
        setattr(job, name, value)
    check_types(job)
    for name in spec.SIZE_FIELDS:
        if name in flags:
            check_positive(job, name)
    for name, value in flags.items():
        allowed = CHOICES.get(name)
        if allowed and value is not None and not isinstance(value, bool):  # grad_ckpt: true
            _choice(name, value, allowed)
    spec.check_limits(job)


def check_timeout(timeout_s: float, stops: str) -> None:
    """--timeout-s of a command that runs the user's own code (doctor's, a script's): a finite
    number of seconds > 0, said before the code runs (an audit: ``-1`` was said after the
    script, ``nan`` ran with no timeout). ``stops`` says what the timeout stops, for the hint."""
    if not 0 < timeout_s < float("inf"):
        raise JobError(f"--timeout-s {timeout_s:g}: must be a finite number of seconds > 0",
                       f"e.g. --timeout-s 900 (stop {stops} by then)")


def field_info(name: str) -> FieldInfo:
    return next(f for f in job_fields() if f.name == name)


@dataclass(frozen=True)
class Knob:
    """Something tune may change about the job to make it faster."""

    name: str
    fields: tuple[str, ...]
    """The job fields it sets; giving any of them on the command line fixes the knob."""
    effect: str
    """What it does to memory and speed (the YAML comment on the fields it sets)."""
    default_on: bool
    """Searched unless --knobs says otherwise (opt-in knobs change numerics or cost compile time)."""


KNOBS: tuple[Knob, ...] = (
    Knob("grad_ckpt", ("grad_ckpt",), "full reduces activation memory (larger micro-batches fit), "
         "~30 % slower per sample: recomputes the forward in backward", True),
    Knob("precision", ("precision",), "amp-bf16/amp-fp16: faster matrix multiplies, half-size "
         "activations; bf16-true also halves weights, gradients and optimizer states", True),
    Knob("attention", ("attention",), "the attention kernel: sdpa (flash / memory-efficient on a "
         "GPU) or eager (stores the S×S attention matrix)", True),
    Knob("optimizer_impl", ("optimizer_impl",), "AdamW/SGD kernel: fused (one kernel), foreach "
         "(grouped; temporaries of a parameter group), forloop", True),
    Knob("optimizer_8bit", ("optimizer",), "AdamW with 8-bit states (bitsandbytes): 2 B per weight "
         "instead of 8; opt-in — block-wise quantized states change the numerics slightly", False),
    Knob("num_workers", ("num_workers",), "DataLoader worker processes: load batches beside the "
         "step (host RAM per worker); 0 loads in the training process", True),
    Knob("loader", ("prefetch_factor", "pin_memory", "persistent_workers"), "with workers: "
         "batches prepared ahead, page-locked host memory for asynchronous copies (CUDA)", True),
    Knob("compile", ("compile",), "torch.compile: fused kernels, faster steps after a one-off "
         "compile time; opt-in", False),
)

KNOB_NAMES = tuple(k.name for k in KNOBS)
DEFAULT_KNOBS = tuple(k.name for k in KNOBS if k.default_on)
SCRIPT_KNOBS = ("grad_ckpt", "attention", "optimizer_impl", "num_workers", "loader")
"""What a probe can change on a script's loaded trainer (trainfit.script.tune); ``precision`` too
where it is an autocast flag (full fine-tuning of float32 weights), which only reading the script
tells. Not ``compile`` nor ``optimizer_8bit``: the trainer's model and optimizer are the script's."""


def refuse_dead_reentrant(flags: dict[str, Any], grad_ckpt: str | None) -> None:
    """``--ckpt-reentrant`` given where checkpointing is off: a flag that can have no effect is
    refused, as --fsdp-no-sync without fsdp is (a QA run saw it accepted in silence).  ``flags``:
    the command line's fields only; a file's value, which tune writes for every pick, is not."""
    if flags.get("ckpt_reentrant") and grad_ckpt == "off":
        raise JobError("--ckpt-reentrant with grad-ckpt off: there is no checkpointing to make "
                       "reentrant", "drop --ckpt-reentrant, or use --grad-ckpt full (or leave "
                       "--grad-ckpt out to plan both)")


def fixed_knobs(flags: dict[str, Any] | set[str]) -> frozenset[str]:
    """The knobs a user fixed by giving one of their fields a value: tune does not search them.
    A flag given ``none`` (a dict's None) clears the file's value and leaves its knob to the
    search (an audit: ``--grad-ckpt none`` kept checkpointing off, neither the file's value nor
    a searched one)."""
    given = {k for k, v in flags.items() if v is not None} if isinstance(flags, dict) \
        else set(flags)
    return frozenset(k.name for k in KNOBS if set(k.fields) & given)


FILE_KEYS_HELP = {
    "gpu": "the GPU `plan` plans for (a catalog name; `--gpu` overrides)",
    "device": "the device `tune` measured on, and `train` runs on (`cpu`, `cuda:0`; `--device` "
              "overrides)",
    "memory_limit": "the capacity the pick was fit in (a size: `2GiB`; bytes without a unit), "
                    "kept when tuned again and trained (`--memory-limit` overrides)",
    "backend": "what `trainfit train` runs the job with: `trainfit` (its own loop), `hf`, `trl`, "
               "`auto` (`--backend` overrides)",
    "current": "the configuration you run now (job fields over the file's): `plan` simulates it "
               "too and states its pick against it",
    "observed": "a device number seen at the current configuration (`{device: 2667MiB, source: "
                "nvidia-smi}`): `plan` states the gap to its prediction",
    "assumed": "the job fields the file's author guessed (a list): marked `(assumed)` in "
               "`plan`'s header",
    "host_ram_free": "the host RAM free for the run (a size): `plan` checks the pick's host "
                     "memory against it",
    "measured": "what `tune` measured (written by tune; `emit` and `train` say it)",
    "doctor": "`doctor`'s options: `{tokenize: lazy | eager}`",
    "scenario": "a description (not read)",
    "train": "refused: the run's settings are `train`'s options (`--max-steps`, `--save-every`, "
             "…)",
}
"""The file-only keys (``trainfit.job.files.FILE_ONLY_KEYS``) as docs/job-fields.md states them
(an audit: the README's "the full table" left them out); a test checks both name the same keys."""


def fields_markdown() -> str:
    """docs/job-fields.md: every job field as a YAML key and a flag (regenerate with
    ``python -m trainfit.job.fields > docs/job-fields.md``; a test checks it is current)."""
    lines = ["# Job fields", "",
             "Generated from `JobSpec` (`python -m trainfit.job.fields > docs/job-fields.md`): the "
             "YAML key, the flag every job-taking command (`plan`, `tune`) accepts, and what it "
             "does. A flag overrides the job file's value; `none` clears an optional text field. "
             f"Command line only: {', '.join('--' + n.replace('_', '-') for n in COMMAND_LINE_ONLY)}.",
             "", "| YAML key | flag | type | default | what it does |", "|---|---|---|---|---|"]
    for f in job_fields():
        kind = " \\| ".join(f.choices) if f.choices else f.kind.__name__
        if f.optional:
            kind += " or none"
        lines.append(f"| `{f.name}` | `{f.flag}` | {kind} | `{f.default!r}` | "
                     f"{f.help.replace('|', '/')} |")
    lines += ["", "## Keys a job file may carry beside the job fields", "",
              "Read from the file only (no flag unless named); `trainfit plan|tune|train|doctor "
              "FILE` each read the ones they use and leave the others.", "",
              "| key | what it is |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in FILE_KEYS_HELP.items()]
    lines += ["", "## tune's knobs", "", "| knob | fields it sets | searched by default | effect |",
              "|---|---|---|---|"]
    for k in KNOBS:
        lines.append(f"| `{k.name}` | {', '.join(f'`{x}`' for x in k.fields)} | "
                     f"{'yes' if k.default_on else 'no (opt-in)'} | {k.effect} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(fields_markdown(), end="")


def in_file_words(err: JobError, path: str, keep: tuple[str, ...] = (),
                  hint_too: bool = True) -> JobError:
    """``err`` as a command that takes its job from a file alone says it (train, doctor): a
    job field named by its flag (``--lr -1: must be …``, hint ``e.g. --lr 1e-4``) is named by
    its YAML key (``lr: -1: …``, ``e.g. lr: 1e-4``), as the user has no such flag to pass;
    ``keep``: fields the command also takes as flags (train's ``--micro-batch``), left as
    they are. ``hint_too=False`` (plan, tune: their flags can fix a file's value, ``--quant
    none`` clears it): the message says where the value came from; an example hint gives the
    file's key first, then the flag (``e.g. seq_len: 512 in job.yaml, or --seq-len 512 on the
    command line``), any other hint keeps its flags.
    The same class, so callers catching DataError still do."""
    import re

    names = {f.flag: f.name for f in job_fields() if f.name not in keep}

    def words(text: str) -> str:
        return re.sub(r"--[a-z][a-z0-9-]*",
                      lambda m: f"{names[m.group(0)]}:" if m.group(0) in names else m.group(0),
                      text)
    msg, hint = words(str(err)), words(err.hint) if hint_too else err.hint
    if not hint_too and hint.startswith("e.g. --") and words(hint) != hint:
        # an example value: the file's key first (where the value came from), then the flag
        hint = f"{words(hint)} in {path}, or {hint[len('e.g. '):]} on the command line"
    if msg == str(err) and hint == err.hint:
        return err
    if not hint_too and path not in msg and path not in hint:
        msg = f"{path}: {msg}"  # which file, as its other errors say (a QA run missed it)
    # a hint that still names a flag (one ``keep`` left: train's --micro-batch) is about the
    # command line: not "(in job.yaml)" (an audit: the micro-batch came from the flag)
    kept = [f.flag for f in job_fields() if f.name in keep]
    flagged = any(re.search(rf"{re.escape(flag)}\b", hint) for flag in kept)
    out = type(err)(msg, (hint if flagged else f"{hint} (in {path})" if hint else f"see {path}")
                    if hint_too else hint)
    out.__cause__ = err.__cause__
    return out
