"""The post-import hook (doctor/post_import.py): runs once the module is really executed, not
when its spec is only asked for; once; a failing hook goes to on_error, never to the import."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from trainfit.doctor.post_import import PostImport


def test_hook_runs_at_the_real_import_after_a_find_spec(tmp_path, monkeypatch):
    (tmp_path / "tf_probe_mod.py").write_text("VALUE = 7\n")
    (tmp_path / "tf_probe_bad.py").write_text("VALUE = 8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    errors: list[str] = []

    def bad(module):
        raise RuntimeError("hook broke")

    finder = PostImport({"tf_probe_mod": lambda m: seen.append(m.VALUE), "tf_probe_bad": bad},
                        lambda name, err: errors.append(f"{name}: {err}"))
    sys.meta_path.insert(0, finder)
    try:
        assert importlib.util.find_spec("tf_probe_mod") is not None  # a question, no import
        assert seen == [] and finder in sys.meta_path
        mod = importlib.import_module("tf_probe_mod")
        assert seen == [7]
        importlib.reload(mod)
        assert seen == [7]  # once
        assert importlib.import_module("tf_probe_bad").VALUE == 8  # the import still works
        assert errors == ["tf_probe_bad: hook broke"]
        assert not finder.pending  # nothing left to wait for: inert (left on sys.meta_path,
        # as leaving outside the import lock would make another thread skip the next finder)
        assert finder.find_spec("tf_probe_mod", None) is None
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for name in ("tf_probe_mod", "tf_probe_bad"):
            sys.modules.pop(name, None)


def test_a_loader_serving_many_modules_runs_the_hook_on_its_module_only(tmp_path, monkeypatch):
    """A zip's zipimporter is one loader for every module in it: the hook runs on the module it
    waits for, never on another one the same loader executes first."""
    import zipfile

    archive = tmp_path / "mods.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("tf_zip_other.py", "VALUE = 1\n")
        z.writestr("tf_zip_wanted.py", "VALUE = 2\n")
    monkeypatch.syspath_prepend(str(archive))
    seen: list[str] = []
    finder = PostImport({"tf_zip_wanted": lambda m: seen.append(m.__name__)},
                        lambda name, err: None)
    sys.meta_path.insert(0, finder)
    try:
        importlib.util.find_spec("tf_zip_wanted")  # wraps the shared loader
        importlib.import_module("tf_zip_other")
        assert seen == []
        importlib.import_module("tf_zip_wanted")
        assert seen == ["tf_zip_wanted"]
    finally:
        sys.meta_path.remove(finder)
        for name in ("tf_zip_other", "tf_zip_wanted"):
            sys.modules.pop(name, None)
