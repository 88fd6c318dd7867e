"""A post-import hook: run ``hooks[name](module)`` right after the module ``name`` has been
executed, once each — for code injected into someone else's process (doctor's torch watcher,
``trainfit.script.hooks``), which must keep the script's own import order.  Standard library only.

The standard library has no post-import hook (PEP 369 was withdrawn), so this is a meta-path
finder that asks the other finders for the spec and wraps its loader's ``exec_module``.  A spec
is often asked for without any import following: ``importlib.util.find_spec("torch")`` is how
transformers, datasets and accelerate check that torch is installed, before they import it.  So
the finder stays on ``sys.meta_path`` and wraps every spec it hands out until one of them is
really executed (a finder that left at the first question never saw the real import: a review
found doctor failing so on every HF Trainer and TRL script — "never imported torch").
"""

from __future__ import annotations

import importlib.abc
import importlib.util
from collections.abc import Callable
from typing import Any


class PostImport(importlib.abc.MetaPathFinder):
    """``hooks``: module name → what to run on the module once it is executed; ``on_error``: what
    to do with a hook's exception (never raised into the user's import)."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]],
                 on_error: Callable[[str, Exception], None]) -> None:
        self.pending = dict(hooks)
        self.on_error = on_error
        self._asking: set[str] = set()
        """Names this finder is asking the other finders about (its own question comes back to
        it through ``importlib.util.find_spec``)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.pending or name in self._asking:
            return None
        self._asking.add(name)
        try:
            spec = importlib.util.find_spec(name)  # the other finders
        finally:
            self._asking.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module
        if getattr(orig_exec, "post_import_of", None) == name:
            return spec  # this loader already carries the hook (asked again)

        def exec_module(module: Any) -> None:
            orig_exec(module)
            # one loader may serve many modules (a zip's zipimporter): the hook is this name's
            if getattr(module, "__name__", None) != name:
                return
            hook = self.pending.pop(name, None)
            if hook is None:  # already run (a module executed twice: importlib.reload)
                return
            try:
                hook(module)
            except Exception as err:  # a measurement never breaks the user's script
                self.on_error(name, err)

        # the finder stays on sys.meta_path, inert once nothing is pending: taking it out here
        # would run outside the import lock, and another thread walking the list would skip the
        # finder after it (a review reproduced a ModuleNotFoundError so)
        exec_module.post_import_of = name  # type: ignore[attr-defined]
        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
