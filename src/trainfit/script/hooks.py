"""Inside the user's process (``trainfit plan|tune -- python train.py``): hooks that let the script
run unchanged until its trainer would start training, then read it (and, for tune, probe it).

Armed by ``trainfit/doctor/_site/sitecustomize.py`` when ``TRAINFIT_SCRIPT_OUT`` is set. Each hook
goes in the moment its transformers module has been imported (a post-import hook, as the doctor's
torch watcher), so the script's own import order and environment are kept:

* ``transformers.trainer``: ``Trainer.train`` (``SFTTrainer`` and ``Seq2SeqTrainer`` inherit it) is
  where the script would start training: the trainer is read there (:mod:`trainfit.script.read`),
  tune runs its probes there (:mod:`trainfit.script.tune`), and the process ends;
* ``torch``: an optimizer step before that means the script trains in a loop of its own: refused
  (plan/tune read Trainer scripts; ``doctor`` measures any loop);
* ``transformers.dynamic_module_utils``: a model's own code from the hub is refused without
  ``--trust-remote-code``;
* plan only — no weights: ``from_pretrained`` runs as transformers wrote it (its configuration from
  the local directory or the hub cache, the quantizer's 4-bit layers, ``dtype``, attention,
  ``device_map``) with the model left on the meta device, where transformers builds it before
  loading: the checkpoint files are neither resolved nor read. Moving a meta model to a device
  keeps it where it is (the script's ``model.to("cuda")``, the Trainer's placement); bf16 flags
  are accepted on a machine without a bf16 GPU (the GPU planned for is checked instead); a
  ``device_map="auto"`` is placed on the planned GPU by transformers' own code and refused when it
  would put modules on the CPU (those hooks: :mod:`trainfit.script.meta_load`).

The result is one JSON file, ``$TRAINFIT_SCRIPT_OUT/script.<pid>.json``: ``read`` (what the trainer
holds, with tune's result), ``refused`` (message and hint), ``no_trainer`` or ``error``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import sys
import traceback
from collections.abc import Callable
from typing import Any

from trainfit.doctor.post_import import PostImport

ENV_OUT = "TRAINFIT_SCRIPT_OUT"
ENV_MODE = "TRAINFIT_SCRIPT_MODE"
"""``plan`` (meta model, no weights) or ``tune`` (the real model, probed)."""
ENV_TRUST = "TRAINFIT_SCRIPT_TRUST_REMOTE_CODE"
ENV_GPU = "TRAINFIT_SCRIPT_GPU"
"""JSON ``{"name", "free_bytes"}`` of the GPU planned for (device_map placement), or unset."""
ENV_OPTIONS = "TRAINFIT_SCRIPT_OPTIONS"
"""JSON of the reader's and tune's options (max_samples, the tune options)."""


class _State:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.out = os.environ.get(ENV_OUT, "")
        self.mode = os.environ.get(ENV_MODE, "plan")
        self.trust = os.environ.get(ENV_TRUST) == "1"
        gpu = os.environ.get(ENV_GPU)
        self.gpu: dict[str, Any] | None = json.loads(gpu) if gpu else None
        self.options: dict[str, Any] = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
        self.loads: list[dict[str, Any]] = []
        """One record per ``from_pretrained`` the script called (what it asked for)."""
        self.ckpt_calls: list[str] = []
        """Where activation checkpointing was switched on before the trainer (file:line)."""
        self.device_maps: list[dict[str, Any]] = []
        """Placements transformers computed for a ``device_map`` string, on the planned GPU."""
        self.trainers = 0
        self.optimizers: list[tuple[str, str]] = []
        """Optimizers the script built itself before any Trainer existed: (class name,
        ``file:line``) — a loop of its own, when no Trainer follows."""
        self.argparse: list[dict[str, Any]] = []
        """The options the script's argparse parsed (its flags and their values, defaults too)."""
        self.made_dirs: list[str] = []
        """Output directories the script's Trainer created (``os.makedirs(output_dir)`` in its
        ``__init__``, with the parents it made): trainfit stops the script before it writes
        anything there, so an empty one is removed when the process leaves, the leaf first — a
        plan or a refusal leaves nothing on disk."""
        self.in_trainer_init = 0
        """Inside a trainer's ``__init__`` (its own calls are not the script's)."""
        self.cuda_asked: list[str] = []
        """Where the script asked ``torch.cuda.is_available()`` before its trainer and was told
        False (plan reads it on a machine without the GPU planned for)."""
        self.fsdp_env: dict[str, str] | None = None
        """accelerate's ``FSDP_*`` environment as the script had it (:func:`_one_process_fsdp`)."""
        self.fsdp_plugin_args: dict[str, Any] | None = None
        """The FSDP settings of a trainer built in one process (``args.fsdp_plugin_args``), taken
        off its arguments so that transformers builds it (:func:`_one_process_fsdp`)."""
        self.at_train = False
        """The trainer's train() was reached: the optimizer steps from here are tune's probes."""
        self.finished = False

    def write(self, obj: dict[str, Any]) -> None:
        if not self.out or os.getpid() != self.pid:
            return  # a forked DataLoader worker: the parent process reports
        path = os.path.join(self.out, f"script.{self.pid}.json")
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(obj, default=str))
        os.replace(path + ".tmp", path)

    def remove_empty_dirs(self) -> None:
        if os.getpid() != self.pid:
            return
        for d in self.made_dirs:
            with contextlib.suppress(OSError):  # not empty (the script wrote there), or gone
                os.rmdir(d)

    def leave(self, obj: dict[str, Any]) -> None:
        """Write the result and end the process: the script's training never starts."""
        self.finished = True
        self.write(obj)
        self.remove_empty_dirs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


_ST: _State | None = None


def _st() -> _State:
    assert _ST is not None
    return _ST


def refuse(message: str, hint: str = "") -> None:
    """What trainfit cannot read or will not do: said by the parent as ``error:`` + ``hint:``."""
    _st().leave({"type": "refused", "message": message, "hint": hint})


def arm() -> None:
    """Called from sitecustomize: the hooks wait for their modules."""
    global _ST
    if _ST is not None:
        return
    _ST = _State()
    hooks: dict[str, Callable[[Any], None]] = {
        "torch": _hook_torch,
        "transformers.trainer": _hook_trainer,
        "transformers.dynamic_module_utils": _hook_remote_code,
        "transformers.modeling_utils": _hook_loading,
        "transformers.training_args": _hook_training_args,
    }
    if _ST.mode == "plan":
        from trainfit.script.meta_load import hook_max_memory  # lazy: plan only

        hooks["transformers.integrations.accelerate"] = hook_max_memory
    _record_argparse(_ST)
    sys.meta_path.insert(0, PostImport(hooks, _hook_failed))
    atexit.register(_at_exit)
    prev_hook = sys.excepthook

    def excepthook(kind: type[BaseException], err: BaseException, tb: Any) -> None:
        _why_it_stopped(err, tb)  # ends the process when it can say why (refused)
        prev_hook(kind, err, tb)

    sys.excepthook = excepthook


def _record_argparse(st: _State) -> None:
    """What the script's argparse parsed, defaults included: the change is then said in the
    flags a script sets its trainer from (an audit: "--bs 8" was said as TrainingArguments'
    per_device_train_batch_size=8 where --bs kept its default). Only scalar values; read-only."""
    import argparse

    orig = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self: Any, *a: Any, **k: Any) -> Any:
        ns, rest = orig(self, *a, **k)
        # HfArgumentParser's flags are its dataclasses' fields, TrainingArguments' own keywords
        # (said by the change itself: its 78 neighbours were named, a review)
        if any(c.__name__ == "HfArgumentParser" for c in type(self).__mro__):
            return ns, rest
        try:
            got = [{"flags": [f for f in act.option_strings if f.startswith("--")],
                    "value": getattr(ns, act.dest)}
                   for act in self._actions if act.option_strings
                   and isinstance(getattr(ns, act.dest, None), (bool, int, float, str))
                   and any(f.startswith("--") for f in act.option_strings)]
            # merged by flag: a subparser's call comes first, its parent's after (a review)
            mine = {tuple(o["flags"]) for o in got}
            st.argparse = [*(o for o in st.argparse if tuple(o["flags"]) not in mine), *got]
        except Exception:  # never in the script's way
            pass
        return ns, rest

    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def _about_meta(message: str) -> bool:
    """Torch's errors for computing with meta tensors: "Cannot copy out of meta tensor", "Tensor
    on device meta is not on the expected device cpu!" (an audit: a ``generate`` check before
    training was blamed on the script), "... on the meta device"."""
    return any(s in message for s in ("meta tensor", "device meta", "meta device"))


def _why_it_stopped(err: BaseException, tb: Any) -> None:
    """In plan, the script died computing with the weightless meta model before any trainer
    trained — its own loop's first forward (which fails before the step hook could say so), or a
    check before training: refused with that reason rather than "fix the script" (a QA run).
    Anything else — KeyboardInterrupt, a missing file, an error in tune with real weights — is
    the script's own error, its traceback shown by the parent."""
    st = _ST
    if st is None or st.finished or st.at_train or os.getpid() != st.pid:
        return
    if not isinstance(err, Exception) or st.mode != "plan" or not _about_meta(str(err)):
        return
    where = _frame_of(tb)
    what = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
    built = ""
    if st.trainers == 0 and st.optimizers:
        name, built_at = st.optimizers[0]
        built = (f"; it had built {_a(name)} optimizer (at {built_at}) and no transformers "
                 "Trainer — a loop of its own?")
    # a loop of its own over a transformers model: the model it loaded, planned as a job (an
    # audit: the hint offered a module:factory file for a from_pretrained model)
    model = shlex.quote(st.loads[0]["name"]) if st.loads else None
    own = (f"trainfit plan {model} --micro-batch N --grad-accum K --seq-len L --precision P "
           "(your loop's settings)" if model else
           "trainfit plan --model path/to/model.py:factory (your nn.Module)")
    refuse(f"the script computes with the model before its trainer trains (at {where}: {what})"
           f"{built}; plan loads no weights (the model is on the meta device), so nothing can be "
           "computed with it before trainer.train()",
           "a check before training: move it after trainer.train(), or run trainfit tune -- … "
           f"(it loads the weights); a loop of your own: {own}, or trainfit doctor -- python "
           "train.py")


def _frame_of(tb: Any) -> str:
    """``file:line`` of the innermost traceback frame in the script's own code."""
    where = "unknown"
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if not _is_library(fn):
            where = f"{os.path.basename(fn)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _a(name: str) -> str:
    """The indefinite article before an optimizer's name (an AdamW, a SGD)."""
    return ("an " if name[:1].upper() in "AEIOU" else "a ") + name


def _hook_failed(name: str, err: Exception) -> None:
    """A hook that failed to go in: the parent says so."""
    _st().leave({"type": "error", "where": f"hook {name}", "error": repr(err)[:500]})


def _at_exit() -> None:
    st = _ST
    if st is None or st.finished or os.getpid() != st.pid:
        return
    st.write({"type": "no_trainer", "trainers_built": st.trainers, "loads": st.loads})
    st.remove_empty_dirs()


_LIBRARIES = ("/torch/", "/transformers/", "/peft/", "/trl/", "/accelerate/", "/trainfit/",
              "/bitsandbytes/", "/site-packages/", "/dist-packages/", "/lib/python3.")
"""Paths of library code: a ``file:line`` said to the user is the first frame outside them."""


def _is_library(filename: str) -> bool:
    """Library code (:data:`_LIBRARIES`) or code with no file (``<string>``, ``<frozen ...>``)."""
    return filename.startswith("<") or any(s in filename for s in _LIBRARIES)


def _ancestors(path: str) -> list[str]:
    """``path``'s parent directories, nearest first."""
    out, parent = [], os.path.dirname(path)
    while parent and parent != path:
        out.append(parent)
        path, parent = parent, os.path.dirname(parent)
    return out


def _caller() -> str:
    """``file:line`` of the first frame outside the libraries (:func:`_is_library`)."""
    frame = sys._getframe(2)
    while frame is not None:
        fn = frame.f_code.co_filename
        if not _is_library(fn):
            return f"{os.path.basename(fn)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown"


# --- the trainer ---------------------------------------------------------------------------------
def _hook_trainer(mod: Any) -> None:
    trainer_cls = mod.Trainer
    orig_init = trainer_cls.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        st = _st()
        st.trainers += 1
        args = k.get("args", a[1] if len(a) > 1 else None)
        # no args: transformers makes TrainingArguments(output_dir="tmp_trainer") itself
        out = getattr(args, "output_dir", None) if args is not None else "tmp_trainer"
        existed = out is None or os.path.exists(out)
        # the directories above it that do not exist yet either (an audit: --output_dir a/b
        # left a/ behind when only the leaf was removed)
        missing = [] if out is None else [d for d in _ancestors(os.path.abspath(out))
                                          if not os.path.exists(d)]
        _one_process_fsdp(st, args)
        st.in_trainer_init += 1
        try:
            orig_init(self, *a, **k)
        finally:
            st.in_trainer_init -= 1
        out = getattr(self.args, "output_dir", None)
        if not existed and out and os.path.isdir(out):
            # the Trainer made them (should_save): removed if left empty, the leaf first
            st.made_dirs.extend(dict.fromkeys([os.path.abspath(out), *missing]))

    def train(self: Any, *a: Any, **k: Any) -> Any:
        _at_train(self)

    init.__wrapped__ = orig_init  # type: ignore[attr-defined]
    trainer_cls.__init__ = init
    trainer_cls.train = train


def _one_process_fsdp(st: _State, args: Any) -> None:
    """transformers refuses FSDP outside a distributed run ("Using fsdp only works in distributed
    training", Trainer.__init__), which plan's one process is, and accelerate's FSDP plugin built
    from ``accelerate launch``'s environment looks for a GPU when it syncs module states: the
    FSDP settings are recorded (the arguments' and the ``FSDP_*`` environment), then taken away,
    so the trainer is built as one rank would build it before accelerate wraps the model at
    train() (the wrap is what plan simulates)."""
    env_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").strip().lower() in ("1", "true", "yes")
    if not env_fsdp and (args is None or not getattr(args, "fsdp", False)
                         or (args.fsdp_config or {}).get("xla")):
        return
    if args is not None and str(getattr(args.parallel_mode, "value", "")) == "distributed":
        return  # a real distributed run: the Trainer takes them, the record reads them there
    st.fsdp_env = {k: v for k, v in os.environ.items()
                   if k.startswith("FSDP_") or k == "ACCELERATE_USE_FSDP"}
    os.environ.pop("ACCELERATE_USE_FSDP", None)
    if args is not None and getattr(args, "fsdp", False):
        st.fsdp_plugin_args = dict(getattr(args, "fsdp_plugin_args", None) or {})
        args.fsdp, args.fsdp_plugin_args = False, None


def _at_train(trainer: Any) -> None:
    """The trainer is built and would start training: read it (tune: probe it) and leave."""
    st = _st()
    st.at_train = True
    from trainfit.job import JobError  # lazy: the whole trainfit only once a trainer exists

    where = "read"
    try:
        from trainfit.script.read import read_trainer

        rec = read_trainer(trainer, loads=st.loads, ckpt_calls=st.ckpt_calls,
                           device_maps=st.device_maps, mode=st.mode,
                           fsdp_plugin_args=st.fsdp_plugin_args, fsdp_env=st.fsdp_env,
                           max_samples=int(st.options.get("max_samples", 20000)),
                           max_batches=int(st.options.get("max_batches", 2000)))
        rec["cuda_asked"] = list(dict.fromkeys(st.cuda_asked))
        rec["argparse"] = list(st.argparse)
        if st.mode == "tune":
            from trainfit.script.tune import tune_trainer

            where = "tune"
            rec["tune"] = tune_trainer(trainer, rec, st.options.get("tune", {}))
    except JobError as err:
        refuse(str(err), err.hint)
    except Exception as err:
        st.leave({"type": "error", "where": where, "error": traceback.format_exc()[-3000:],
                  "script_frame": _script_frame(err)})
    st.leave({"type": "read", **rec})


def _script_frame(err: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame of the error in the user's own code (not
    the standard library, an installed package or trainfit): a Trainer subclass's compute_loss
    that raised while tune probed it was reported as trainfit's failure (an audit). None when
    the error arose in library code alone."""
    import sysconfig

    libs = tuple(p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "purelib",
                                                                   "platlib")} if p)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the trainfit package
    frames = traceback.extract_tb(err.__traceback__)

    def users(f: traceback.FrameSummary) -> bool:
        return not f.filename.startswith(("<", here, *libs)) \
            and "site-packages" not in f.filename and "dist-packages" not in f.filename

    # from the innermost frame out, past library code and trainfit's pass-through frames (a
    # probe's tracker is a TorchDispatchMode: every op of the script's compute_loss runs through
    # it), the first frame left says whose code raised: the script's, or trainfit's own (a
    # review: a trainfit function the script called, raising, was blamed on the script)
    for f in reversed(frames):
        if users(f):
            return f"{f.filename}:{f.lineno} in {f.name}"
        if f.filename.startswith(here) and f.name not in ("__torch_dispatch__",
                                                           "__torch_function__"):
            return None
    return None


def _hook_torch(torch: Any) -> None:
    """An optimizer step before any Trainer.train: the script trains in a loop of its own."""
    import torch.optim.optimizer as optim_mod  # lazy: torch has just finished importing

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        st = _st()
        if st.finished or st.at_train or os.getpid() != st.pid:
            return
        refuse(f"the script steps {_a(type(opt).__name__)} optimizer itself (at {_caller()}) before "
               "any transformers Trainer trains: plan and tune read Trainer / SFTTrainer scripts",
               "for your own loop: trainfit plan --model path/to/model.py:factory (your "
               "nn.Module), or trainfit doctor -- python train.py (measures any loop)")

    optim_mod.register_optimizer_step_pre_hook(pre)
    orig_init = optim_mod.Optimizer.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        st = _st()
        if not (st.finished or st.at_train or st.trainers) and os.getpid() == st.pid:
            st.optimizers.append((type(self).__name__, _caller()))
        orig_init(self, *a, **k)

    optim_mod.Optimizer.__init__ = init  # every torch optimizer's __init__ calls it
    orig_available = torch.cuda.is_available

    def is_available() -> bool:  # what the script decides from it differs on the GPU (a note)
        got = orig_available()
        st = _st()
        asker = sys._getframe(1).f_code.co_filename  # the script's own call, not a library's
        if not got and st.mode == "plan" and not _is_library(asker):
            st.cuda_asked.append(_caller())
        return got

    torch.cuda.is_available = is_available


def _hook_remote_code(mod: Any) -> None:
    """Remote model code only with ``--trust-remote-code``: every class transformers loads from a
    repository's own files comes through ``get_class_from_dynamic_module``."""
    orig = mod.get_class_from_dynamic_module

    def guarded(class_reference: Any, pretrained_model_name_or_path: Any, *a: Any, **k: Any) -> Any:
        if not _st().trust:
            origin = "from its directory" if os.path.isdir(str(pretrained_model_name_or_path)) \
                else "from the hub"
            refuse(f"{pretrained_model_name_or_path} needs its own Python code ({class_reference}, "
                   f"{origin}); trainfit does not run it unless asked",
                   "add --trust-remote-code to the trainfit command if you trust its authors")
        return orig(class_reference, pretrained_model_name_or_path, *a, **k)

    mod.get_class_from_dynamic_module = guarded


def _hook_training_args(mod: Any) -> None:
    """plan (and tune on the CPU stand-in): ``bf16=True`` is the script's choice for its GPU;
    transformers refuses it on a machine without one. The planned GPU's bf16 support is checked by
    plan itself (trainfit.plan.inputs.check_precision)."""
    st = _st()
    cpu_tune = st.mode == "tune" and str(st.options.get("tune", {}).get("device", "cpu")) == "cpu"
    if st.mode == "plan" or cpu_tune:
        mod.is_torch_bf16_gpu_available = lambda *a, **k: True


# --- loading ---------------------------------------------------------------------------------------
def _hook_loading(mu: Any) -> None:
    st = _st()
    _record_loads(mu)
    _record_checkpointing(mu)
    # a DeepSpeed ZeRO-3 config made before from_pretrained (as the HF docs tell) has transformers
    # build the model under deepspeed.zero.Init, partitioned across the ranks of a distributed
    # run this one process is not (it raises: no process group); the ZeRO settings are read
    # from the arguments (trainfit.script.sharding) and plan simulates the partitioning itself
    mu.is_deepspeed_zero3_enabled = lambda: False
    if st.mode == "plan":
        from trainfit.script.meta_load import meta_loading  # lazy: plan only

        meta_loading(mu)


def _record_loads(mu: Any) -> None:
    pretrained = mu.PreTrainedModel
    orig = pretrained.from_pretrained.__func__

    def from_pretrained(cls: Any, name: Any, *a: Any, **k: Any) -> Any:
        q = k.get("quantization_config")
        rec = {"class": cls.__name__, "name": str(name),
               "dtype": str(k.get("dtype", k.get("torch_dtype"))),
               "quantization": q.to_dict() if hasattr(q, "to_dict") else q,
               "device_map": k.get("device_map"), "max_memory": k.get("max_memory"),
               "attn_implementation": k.get("attn_implementation"),
               "trust_remote_code": k.get("trust_remote_code"), "at": _caller()}
        _st().loads.append(rec)
        model = orig(cls, name, *a, **k)
        rec["model_id"] = id(model)
        return model

    pretrained.from_pretrained = classmethod(from_pretrained)


def _record_checkpointing(mu: Any) -> None:
    """Where the script (or peft's prepare_model_for_kbit_training) switches checkpointing on."""
    pretrained = mu.PreTrainedModel
    for name in ("gradient_checkpointing_enable", "activation_checkpointing_enable"):
        orig = getattr(pretrained, name, None)
        if orig is None:
            continue

        def enable(self: Any, *a: Any, _orig: Any = orig, **k: Any) -> Any:
            # the trainer's own call (TRL's, in its __init__, from the arguments) is not the
            # script's: named as one, it would be a call to remove that is not there
            if not _st().in_trainer_init:
                _st().ckpt_calls.append(_caller())
            return _orig(self, *a, **k)

        setattr(pretrained, name, enable)
