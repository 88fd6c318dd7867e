"""Job files: a job YAML read into job fields and the keys a file carries beside them, a model
named as Python code (``module:factory``) refused unless the command line allows it, and the
user's ``current`` configuration laid over the job."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trainfit.job.spec import JobError, JobSpec

FILE_ONLY_KEYS = ("gpu", "scenario", "measured", "train", "device", "memory_limit", "doctor",
                  "current", "backend", "assumed", "observed", "host_ram_free")
"""Keys a job file may carry beside the job fields: the target GPU, a description, what tune
measured, ``train`` (refused, as never read: the run's settings are train's options), the
``doctor`` options, the device it was tuned on, and ``current``: the
configuration the user runs now (job fields overriding the file's), which ``plan`` compares with,
and ``backend``: what ``trainfit train`` runs the job with (trainfit, hf, trl, auto). For ``plan``:
``assumed`` (job fields the file guessed, not stated by the user), ``observed`` (a device number
the user saw at the current configuration: ``{device: 2667MiB, source: nvidia-smi}``) and
``host_ram_free`` (the host RAM the user has free, e.g. 7GB)."""


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | None, flag: str) -> int | None:
    """``1.5GiB`` → 1610612736; GB = 10^9, GiB = 2^30 (the unit is required to be explicit
    above 1 KiB so the two are never confused)."""
    if text is None:
        return None
    examples = "e.g. 1.5GiB, 512MiB, 8GB (GB = 10^9, GiB = 2^30 bytes)"
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise JobError(f"{flag} {text}: not a size", examples)
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise JobError(f"{flag} {text}: must be > 0", examples)
    if not m.group(2) and (value < 2**20 or not value.is_integer()):
        # a bare number is bytes: "--memory-limit 1.2", meant as GiB, read as one byte and was
        # refused as "smaller than the model's weights" (an audit)
        raise JobError(f"{flag} {text}: a number without a unit is bytes ({value:g} B here)",
                       f"give the unit: {examples}")
    if value < 1:  # int() would make it 0 bytes, which reads as "no limit"
        raise JobError(f"{flag} {text}: less than one byte", examples)
    return int(value)


def size_text(n_bytes: int) -> str:
    """A size as ``parse_bytes`` reads it back: GiB to 2 decimals, or MiB under a GiB's tenth
    (an audit: a 3 MiB --memory-limit read "0.00 GiB", a 12 MiB one "0.01 GiB")."""
    if n_bytes >= 0.1 * 2**30:
        return f"{n_bytes / 2**30:.2f} GiB"
    # under a MiB: KiB, then bytes (a review: 1000 bytes read "0.000954 MiB", 7 "6.68e-06 MiB")
    return f"{n_bytes / 2**20:.3g} MiB" if n_bytes >= 2**20 else \
        f"{n_bytes / 2**10:.3g} KiB" if n_bytes >= 2**10 else f"{n_bytes} B"


def file_memory_limit(extra: dict[str, Any]) -> int | None:
    """A job file's ``memory_limit`` (bytes, or a size such as 2GiB): the capacity it was tuned
    for, kept when it is tuned again and when it is trained (``--memory-limit`` overrides)."""
    v = extra.get("memory_limit")
    if v is None:
        return None
    if isinstance(v, int | float) and not isinstance(v, bool):
        if not 1 <= v < float("inf"):  # 0 would read as "no limit" (a YAML typo kept
            # silently); NaN and inf ended in a traceback (an audit)
            raise JobError(f"memory_limit: {v}: must be a finite number ≥ 1 byte",
                           "e.g. memory_limit: 2GiB, or "
                           "drop the key for no limit")
        # a number is bytes: a small or fractional one was meant with a unit, as the flag's
        # (parse_bytes; a review: memory_limit: 1.2 read as 1 byte)
        return parse_bytes(str(int(v)) if float(v).is_integer() else str(v), "memory_limit")
    return parse_bytes(str(v), "memory_limit")


FACTORY_SPEC = re.compile(r"^(?P<module>[A-Za-z_][\w.]*|[^:]+\.py):(?P<factory>[A-Za-z_]\w*)$")
"""``module:factory`` (or ``path/to/file.py:factory``): a model that is the user's own Python code."""


def is_code_spec(name: Any) -> bool:
    """True when ``name`` names Python code to import and call (``module:factory``) rather than a
    catalog model, a config.json, a directory or a hub id."""
    if not isinstance(name, str) or not FACTORY_SPEC.match(name):
        return False
    try:
        return not Path(name).exists()
    except OSError:  # a name too long for a path is no file either
        return True


def _read_text(path: str | Path) -> str:
    """The file's text; every way a read fails (missing, a directory, no permission, a path too
    long, not UTF-8) is one JobError naming the file."""
    p = Path(path)
    try:
        if p.is_dir():
            raise JobError(f"{path}: is a directory, not a job file",
                           "give the job YAML file (e.g. trainfit.yaml) inside it")
        if not p.is_file():
            raise JobError(f"{path}: no such file",
                           "check the path; the seed job files are in examples/ (trainfit quickstart)")
        return p.read_text(encoding="utf-8")
    except OSError as err:
        raise JobError(f"{path}: cannot read it ({err.strerror or type(err).__name__})",
                       "check the path and its permissions (ls -l)") from None
    except UnicodeDecodeError:
        raise JobError(f"{path}: not a text file (not UTF-8)",
                       "give a job YAML (what trainfit tune --out writes)") from None


def _refuse_code(path: str | Path, data: dict[str, Any], allow_code: bool,
                 trust_remote_code: bool) -> None:
    """A job file alone never runs code: a ``module:factory`` model in it (or in its ``current``
    block) needs the command line's ``--allow-code`` (or the model named with ``--model``), and
    ``trust_remote_code: true`` needs the command line's ``--trust-remote-code``. The key is
    dropped either way: the caller sets it from its flag."""
    blocks = [data]
    for k in ("job", "current"):
        if isinstance(data.get(k), dict):
            blocks.append(data[k])
    for block in blocks:
        model = block.get("model")
        if is_code_spec(model) and not allow_code:
            raise JobError(f"{path}: model {model!r} is Python code (module:factory); a job file "
                           "alone never runs code",
                           f"add --allow-code if you trust {path} (plan and tune also run it "
                           "when their command line names it as the model)")
        if block.pop("trust_remote_code", False) and not trust_remote_code:
            raise JobError(f"{path}: trust_remote_code: true is taken from the command line "
                           "only (a job file alone never runs a model's remote code)",
                           "add --trust-remote-code to the command if you trust the model's "
                           "authors")


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(key)
        self.key, self.line = key, line


def _unique_key_loader() -> Any:
    """PyYAML's SafeLoader refusing a key given twice in one mapping: ``safe_load`` keeps the
    last, so a second ``seq_len:`` appended to a tuned file would change the job unseen."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[str] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                # seq_len and seq-len are one field (JobSpec.from_dict reads both)
                norm = str(key).replace("-", "_")
                if norm in seen:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(norm)
            return super().construct_mapping(node, deep=deep)

    # YAML 1.2's floats: PyYAML (YAML 1.1) reads ``2e-5`` and ``1e-4`` — no dot — as strings, so
    # the usual way to write a learning rate was refused, and the hint's own example with it
    # (an audit). A plain scalar of this form is a float, as in YAML 1.2's core schema; a quoted
    # one stays a string. Resolvers are per class: SafeLoader itself is untouched.
    UniqueKeyLoader.yaml_implicit_resolvers = {
        k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT,
                                          list("-+0123456789"))
    return UniqueKeyLoader


YAML12_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
"""A float in YAML 1.2 that YAML 1.1 (PyYAML) reads as a string: ``2e-5``. The job loader reads
it as a float, so a string of this form is written quoted (job/emit.job_yaml)."""


def read_job_file(path: str | Path, *, allow_code: bool = False,
                  trust_remote_code: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """A job YAML → (job fields, file-only keys such as ``gpu``); JobError names what is wrong.

    ``allow_code``: the command line allows a ``module:factory`` model from the file
    (``--allow-code``, or ``--model`` naming the model itself); ``trust_remote_code``: the command
    line's ``--trust-remote-code``. The fields returned never hold ``trust_remote_code``."""
    import yaml

    if str(path).endswith(".py"):
        # `trainfit train train.py`: said as what it is, not as a YAML error at its line 25
        # (an audit); the script form is tune's and plan's, after --
        raise JobError(f"{path}: a Python script, not a job file (YAML)",
                       f"this command takes a job file (trainfit.yaml); for your own script, "
                       f"trainfit tune -- python {path} prints the keywords to change in it")
    text = _read_text(path)
    try:
        # a SafeLoader subclass: plain data only, never a Python object
        data = yaml.load(text, Loader=_unique_key_loader())
    except _DuplicateKey as dup:
        raise JobError(f"{path}: line {dup.line}: {dup.key!r} is given twice (YAML keeps the last "
                       "silently)", f"keep one `{dup.key}:` line") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise JobError(f"{path}: not valid YAML ({at}{what})",
                       "check the indentation and the `key: value` lines near it") from None
    if not isinstance(data, dict):
        raise JobError(f"{path}: expected a mapping of job fields",
                       "write one `field: value` per line, e.g. model: gpt2 (docs/job-fields.md)")
    _refuse_code(path, data, allow_code, trust_remote_code)
    kind = data.get("kind")
    if isinstance(kind, str):
        # a command's --json result (plan.json, tune.json, train.json — its job: nested), not
        # a job file: said so (an audit: "unknown key 'kind'" and a hint listing 60 job fields;
        # a review: train.json's nested job was read as the job)
        raise JobError(f"{path}: a `trainfit {kind}` result (kind: {kind}), not a job file",
                       "give the job YAML: a tuned file (trainfit tune --out trainfit.yaml) or "
                       "one written by hand (docs/job-fields.md)")
    extra = {k: data.pop(k) for k in FILE_ONLY_KEYS if k in data}
    if "train" in extra:
        # nothing reads it: max_steps: 1 under train: ran the whole epoch, unremarked (an audit)
        raise JobError(f"{path}: a `train:` block is not read — the run's settings are train's "
                       "options", "drop it and give them on the command line, e.g. trainfit "
                       f"train {path} --max-steps 200 --save-every 50")
    _check_file_keys(path, extra)
    data = data.get("job", data)
    if not isinstance(data, dict):
        raise JobError(f"{path}: `job:` must be a mapping of job fields",
                       "e.g. job: {model: gpt2, seq_len: 512}")
    _known_keys(path, data)
    data = _nones(data)
    measured = extra.get("measured")
    if isinstance(measured, dict) and isinstance(measured.get("at"), dict):
        # the job the numbers were measured at names its paths as the file does: read alike, a
        # relative data path is not an edit (a committed example's relative path read as one)
        measured["at"] = beside_the_file(dict(measured["at"]), path)
    return beside_the_file(dict(data), path), extra


def _nones(data: dict[str, Any]) -> dict[str, Any]:
    """``none`` written for a field that may be unset is null, as the flags read it
    (``--max-grad-norm none``; docs/job-fields.md's "or none"): an audit found
    ``max_grad_norm: none`` refused as "must be a number" and ``tokenizer: none`` looked up on
    the hub as a repository named "none"."""
    from trainfit.job.fields import job_fields  # fields builds on the JobSpec this module reads

    fields = {f.name: f for f in job_fields()}
    return {k: None if k in fields and fields[k].cleared(v) else v for k, v in data.items()}


def _check_file_keys(path: str | Path, extra: dict[str, Any]) -> None:
    """``memory_limit`` a size and ``measured`` tune's mapping of numbers, when the file is read:
    emit printed them with ``int()`` and format codes, so a size string or a hand-edited block
    ended in a traceback (an audit)."""
    file_memory_limit(extra)
    measured = extra.get("measured")
    if measured is None:
        return
    hint = "it is written by trainfit tune; re-run tune, or drop the measured: block"
    if not isinstance(measured, dict):
        raise JobError(f"{path}: measured: must be tune's mapping of measured numbers", hint)
    for key, value in measured.items():
        if key == "at":
            if not isinstance(value, dict):
                raise JobError(f"{path}: measured.at must be a mapping of job fields", hint)
        elif not (key == "status" and isinstance(value, str)) and not all(
                _measured_number(v) for v in (value if isinstance(value, list) else [value])):
            raise JobError(f"{path}: measured.{key}: {value!r} is not a measured number "
                           "(≥ 0)", hint)


def _measured_number(value: Any) -> bool:
    """A measured value tune writes: a number ≥ 0, or unknown (null)."""
    return value is None or (
        isinstance(value, int | float) and not isinstance(value, bool) and value >= 0)


def _known_keys(path: str | Path, data: dict[str, Any]) -> None:
    """A key that is neither a job field nor a file key: the closest of either suggested (a
    tuned file's ``memory_limt`` is a misspelt file key, not a job field)."""
    import dataclasses
    import difflib

    fields = sorted(f.name for f in dataclasses.fields(JobSpec))
    for key in data:
        k = str(key).replace("-", "_")
        if k in fields:
            continue
        if k in FILE_ONLY_KEYS:
            raise JobError(f"{path}: {key!r} is a file key, not a job field, so it cannot be "
                           "inside `job:`", f"move `{key}:` to the top level of {path}")
        read = [k for k in FILE_ONLY_KEYS if k != "train"]  # train: is refused (never read)
        close = difflib.get_close_matches(k, [*fields, *read], n=1)
        raise JobError(f"{path}: unknown key {key!r}",
                       f"did you mean {close[0]!r}?" if close else
                       f"job fields: {', '.join(fields)}; file keys: {', '.join(read)} "
                       "(docs/job-fields.md)")


PATH_FIELDS = ("data", "model")
"""Job fields that may name a local file or directory."""


def _relative(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and not is_code_spec(value) \
        and not Path(value).is_absolute()


def _model_path(value: str, p: Path) -> bool:
    """A ``model`` written as a path (``./m``, ``runs/m``, ``config.json``: a bare ``gpt2`` is the
    catalog's even where a folder of that name exists) to a model dir or config file."""
    written = value.startswith(".") or value.endswith(".json") or "/" in value
    return written and (p.is_file() or (p / "config.json").is_file())


def beside_the_file(fields: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A relative ``data``/``model`` path that does not exist from the working directory but
    does beside the job file is taken from there (a job file kept next to its data works from
    any directory); one that exists from here is kept as written."""
    folder = Path(path).parent
    model = fields.get("model")
    if is_code_spec(model):
        # a factory's file, as its data, beside the job file when it is not found from here
        # (an audit: tiny_gpt.py:build_model resolved from the working directory only)
        m = FACTORY_SPEC.match(model)
        file = m.group("module") if m else ""
        if file.endswith(".py") and not Path(file).is_absolute() and not Path(file).exists() \
                and (folder / file).is_file():
            fields["model"] = f"{folder / file}:{m.group('factory')}"  # type: ignore[union-attr]
    for key in PATH_FIELDS:
        value = fields.get(key)
        if not _relative(value):
            continue
        beside = folder / value
        there = beside.exists() if key == "data" else _model_path(value, beside)
        if Path(value).exists():
            if there and beside.resolve() != Path(value).resolve():
                # two files of one name: the working directory's was taken, unsaid, and a
                # resume from elsewhere read the other (an audit)
                raise JobError(f"{path}: {key}: {value} names two files — {Path(value).resolve()} "
                               f"(from the working directory) and {beside.resolve()} (beside the "
                               "job file)", f"write the one meant as an absolute path, e.g. "
                               f"{key}: {beside.resolve()}")
            continue
        if there:
            fields[key] = str(beside)
    return fields


def absolute_paths(fields: dict[str, Any]) -> dict[str, Any]:
    """The ``data``/``model`` paths that exist from the working directory made absolute, for a
    job file written here and read from anywhere (tune --out)."""
    for key in PATH_FIELDS:
        value = fields.get(key)
        if _relative(value) and (Path(value).exists() if key == "data"
                                 else _model_path(value, Path(value))):
            fields[key] = str(Path(value).resolve())
    return fields


def job_with_current(fields: dict[str, Any], current: Any, source: str) -> JobSpec:
    """The user's current configuration: the job's fields with ``current``'s on top (a micro-batch
    and accumulation given there set the effective batch)."""
    if not isinstance(current, dict):
        raise JobError(f"{source}: `current` must be a mapping of job fields",
                       "e.g. current: {micro_batch: 2, grad_accum: 4, grad_ckpt: full}")
    cur = {**fields, **current}
    cur.setdefault("grad_ckpt", "off")  # what a training script runs unless it turns it on
    if "micro_batch" in current and "grad_accum" in current and "effective_batch" not in current:
        cur.pop("effective_batch", None)
    try:
        return JobSpec.from_dict(cur, source=f"{source} (current)")
    except JobError as err:
        # the file's `current:` block, named as such by its keys: an audit read "--micro-batch 0"
        # about a flag never given
        from trainfit.job.fields import in_file_words

        said = in_file_words(err, source)
        text = str(err)
        named = any(f"--{k.replace('_', '-')}" in text or k in text for k in current)
        if str(said).startswith(f"{source} (current)") or not named:
            # not about a key of the block: the merged fields' (a flag's value may be among
            # them), said as it was (a review: a flag's value was blamed on the block)
            raise err
        raise JobError(f"{source}: in its current: block, {said}", said.hint) from err
