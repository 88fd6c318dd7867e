"""The installed package works without the repository: build the wheel, install it into a fresh
venv, and plan the quickstart's seed from a directory outside the repository.

The wheel must carry the seed job files (setup.py maps the repository's examples/ to
``trainfit.examples``); ``trainfit quickstart`` and ``trainfit plan <seed name>`` find them through
``importlib.resources``, not by walking up to a source checkout. Offline: the build uses the
installed setuptools (``--no-build-isolation``) and the venv takes torch, transformers, … from the
system (``--system-site-packages``; the wheel is installed with ``--no-deps``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the build reads; copied, so that the build's own build/ and *.egg-info never land in the
# working tree (nor race another build there)
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "src", "examples")
SEED = "seed000_t4_gemma_lora.yaml"  # the quickstart's default (trainfit.cli.main.DEFAULT_EXAMPLE)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_installs_and_plans_the_quickstart_seed_outside_the_repository(tmp_path: Path) -> None:
    src = tmp_path / "src_tree"
    src.mkdir()
    for name in BUILD_INPUTS:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(p, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", HF_HUB_OFFLINE="1",
               TRAINFIT_CACHE=str(tmp_path / "cache"), NO_COLOR="1", COLUMNS="200")

    wheels = tmp_path / "wheels"
    res = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                str(wheels), "."], cwd=src, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    (whl,) = wheels.glob("trainfit-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    seeds = sorted(n for n in names if n.startswith("trainfit/examples/"))
    assert f"trainfit/examples/{SEED}" in seeds and len(seeds) == 5, seeds
    # the error bands plan prints beside its peaks and its tokens/s
    assert {"trainfit/memory/bands.json", "trainfit/speed/bands.json"} <= set(names)

    venv = tmp_path / "venv"
    res = _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    py, exe = venv / "bin" / "python", venv / "bin" / "trainfit"
    res = _run([str(py), "-m", "pip", "install", "--no-deps", str(whl)], cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr

    work = tmp_path / "elsewhere"  # no examples/ here, and not inside the repository
    work.mkdir()
    # the venv's trainfit is the wheel's (the system's editable install of the repository is also on
    # its path), and the quickstart's file is found inside the installed package
    probe = ("import json, trainfit; from trainfit.cli.main import DEFAULT_EXAMPLE, examples_dir; "
             "print(json.dumps([trainfit.__file__, str(examples_dir() / DEFAULT_EXAMPLE)]))")
    res = _run([str(py), "-c", probe], cwd=work, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    module, seed_file = (Path(p) for p in json.loads(res.stdout.strip().splitlines()[-1]))
    assert module.resolve().is_relative_to(venv.resolve()), module
    assert seed_file.is_file() and seed_file.resolve().is_relative_to(venv.resolve()), seed_file
    assert not module.resolve().is_relative_to(ROOT)

    # `trainfit quickstart` plans SEED; while it has no --json, plan the same file by its bare name
    # (the lookup quickstart uses) through the venv's console script
    quick_help = _run([str(exe), "quickstart", "--help"], cwd=work, env=env)
    assert quick_help.returncode == 0, quick_help.stdout + quick_help.stderr
    cmd = ([str(exe), "quickstart", "--json"] if "--json" in quick_help.stdout
           else [str(exe), "plan", SEED, "--json"])
    res = _run(cmd, cwd=work, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads(res.stdout)
    assert plan["model"] == "gemma-2b" and plan["gpu"] == "t4"
    rows = plan["configs"]
    assert rows and all(isinstance(r["peak_device_bytes"], int | float) and r["peak_device_bytes"] > 0
                        for r in rows)
