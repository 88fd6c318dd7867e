"""Put first on PYTHONPATH by ``trainfit doctor -- CMD`` (and ``trainfit plan|tune -- CMD``): arms
the doctor's hooks (or the script reader's, trainfit.script.hooks) in every Python process of the
command, then runs the sitecustomize this one shadows (if any)."""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_package(name: str, pkg_dir: str) -> None:
    """Import the package in ``pkg_dir`` as ``name`` (from its files, whatever ``sys.path`` holds)."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir])
    assert spec is not None and spec.loader is not None
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)


def _arm() -> None:
    if not os.environ.get("TRAINFIT_DOCTOR_OUT"):
        return
    try:
        # the doctor package of the trainfit that started this command, loaded under a private
        # name: the user's interpreter may have another trainfit, or none, and its own modules
        # must not be shadowed
        _load_package("_trainfit_doctor", os.environ.get("TRAINFIT_DOCTOR_DIR") or os.path.dirname(_HERE))
        # lazy: the package exists under this name only from the line above, and a failure to
        # load it must land in the except below, never in the user's script
        from _trainfit_doctor.hooks import arm

        arm()
    except Exception as err:  # a measurement must never break the user's script
        try:
            with open(os.path.join(os.environ["TRAINFIT_DOCTOR_OUT"],
                                   f"doctor.{os.getpid()}.jsonl"), "a") as f:
                import json  # lazy: only a failure to report needs it

                f.write(json.dumps({"type": "error", "where": "arm", "error": repr(err)[:300]}) + "\n")
        except OSError:
            pass


def _arm_script() -> None:
    """``plan|tune -- CMD``: the reader needs the whole trainfit (plan's mapping, tune's probes), so
    the trainfit that started this command is loaded under its own name from where it lives
    (TRAINFIT_PKG_DIR), whatever the user's interpreter would import as ``trainfit``; then the
    hooks module TRAINFIT_SCRIPT_HOOKS names is armed."""
    out = os.environ["TRAINFIT_SCRIPT_OUT"]
    try:
        pkg_dir = os.environ["TRAINFIT_PKG_DIR"]
        if "trainfit" not in sys.modules:
            _load_package("trainfit", pkg_dir)
        # the hooks module the parent names (trainfit.script.hooks): this file knows no room of
        # trainfit but the doctor's
        importlib.import_module(os.environ["TRAINFIT_SCRIPT_HOOKS"]).arm()
    except Exception as err:  # the parent reports it: never a traceback inside the user's script
        try:
            with open(os.path.join(out, f"script.{os.getpid()}.json"), "w") as f:
                import json  # lazy: only a failure to report needs it

                f.write(json.dumps({"type": "error", "where": "arm", "error": repr(err)[:300]}))
        except OSError:
            pass


def _chain() -> None:
    """The sitecustomize this file shadows (a distribution's own), run as it would have been."""
    for p in sys.path:
        if not p or os.path.abspath(p) == _HERE:
            continue
        cand = os.path.join(p, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location("_trainfit_shadowed_sitecustomize", cand)
            if spec is not None and spec.loader is not None:
                try:
                    spec.loader.exec_module(importlib.util.module_from_spec(spec))
                except Exception:
                    pass
            return


sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if os.environ.get("TRAINFIT_SCRIPT_OUT"):
    _arm_script()
else:
    _arm()
_chain()
