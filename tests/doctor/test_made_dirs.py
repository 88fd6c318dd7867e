"""doctor records the directories its command's processes make (os.mkdir, which os.makedirs and
Path.mkdir call), every call form, without ever raising on its own."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r'''
import json, os, sys, tempfile
from pathlib import Path
from trainfit.doctor.made_dirs import read_made_dirs, record_mkdir
out, work = tempfile.mkdtemp(), tempfile.mkdtemp()
os.chdir(work)
record_mkdir(out)
record_mkdir(out)  # armed twice: wrapped once
os.makedirs("a/b", exist_ok=True)
os.makedirs("a/b", exist_ok=True)  # exists: nothing new, no error
Path("c").mkdir()
os.mkdir(b"d", 0o755)
os.mkdir(path="e")
fd = os.open(work, os.O_RDONLY)
os.mkdir("f", dir_fd=fd)  # relative to a descriptor: made, not named
try:
    os.mkdir("c")
except FileExistsError:
    errors = "FileExistsError"
print(json.dumps({"made": sorted(os.path.relpath(p, os.path.realpath(work))
                                 for p in read_made_dirs(Path(out))),
                  "dir_fd": os.mkdir in os.supports_dir_fd, "errors": errors,
                  "f": os.path.isdir("f")}))
'''


def test_every_mkdir_form_is_recorded_and_errors_pass_through():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["made"] == ["a", "a/b", "c", "d", "e"]
    assert got["dir_fd"] and got["errors"] == "FileExistsError" and got["f"]
