"""A job file alone never runs code: a ``module:factory`` model runs only when the command line
names it (``--model``) or allows it (``--allow-code``); remote model code only with the command
line's ``--trust-remote-code``. The evil module writes a marker file at import and when called."""

from __future__ import annotations

import pytest

from trainfit.job import JobError, read_job_file

FACTORY = """import pathlib, torch
pathlib.Path({marker!r}).write_text("imported")

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 16)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(16, 16)])
        self.head = torch.nn.Linear(16, 64)

    def forward(self, ids):
        return self.head(self.blocks[0](self.emb(ids)))

def build():
    pathlib.Path({marker!r}).write_text("called")
    return Tiny()
"""

ONE_CONFIG = ["--gpu", "t4", "--micro-batch", "1", "--seq-len", "16", "--precision", "fp32",
              "--grad-ckpt", "off", "--no-verify"]


@pytest.fixture()
def evil(tmp_path, monkeypatch):
    """(a file module, a dotted module importable from the working directory, the marker)."""
    marker = tmp_path / "RAN"
    (tmp_path / "evil.py").write_text(FACTORY.format(marker=str(marker)))
    (tmp_path / "evilmod.py").write_text(FACTORY.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "evil.py", "evilmod", marker


@pytest.mark.parametrize("where", ["model", "job", "current"])
@pytest.mark.parametrize("kind", ["file", "dotted"])
@pytest.mark.parametrize("command", ["plan", "tune", "train", "doctor"])
def test_a_job_file_alone_never_runs_code(cli, evil, tmp_path, where, kind, command):
    path, dotted, marker = evil
    spec = f"{path}:build" if kind == "file" else f"{dotted}:build"
    text = {"model": f"model: {spec}\n", "job": f"job:\n  model: {spec}\n",
            "current": f"model: gpt2\ncurrent:\n  model: {spec}\n"}[where]
    job = tmp_path / "sent-to-you.yaml"
    job.write_text(text + "data: rows.jsonl\n")
    r = cli(command, job)
    assert r.clean_error(), r.stderr
    assert "Python code" in r.errors[0] and "--allow-code" in r.hints[0]
    assert not marker.exists()


def test_code_runs_when_the_command_line_names_it(cli, evil, tmp_path):
    path, _, marker = evil
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {path}:build\n")
    r = cli("plan", job, "--allow-code", *ONE_CONFIG)
    assert r.code == 0, r.stderr
    assert marker.read_text() == "called"
    marker.unlink()
    job.write_text("model: gpt2\n")  # --model names the code itself
    r = cli("plan", job, "--model", f"{path}:build", *ONE_CONFIG)
    assert r.code == 0, r.stderr
    assert marker.read_text() == "called"


@pytest.mark.parametrize("where", ["top", "current"])
def test_trust_remote_code_only_from_the_command_line(tmp_path, where):
    job = tmp_path / "job.yaml"
    job.write_text("model: someone/model\ntrust_remote_code: true\n" if where == "top" else
                   "model: someone/model\ncurrent:\n  trust_remote_code: true\n")
    with pytest.raises(JobError, match="command line only") as info:
        read_job_file(job)
    assert "--trust-remote-code" in info.value.hint
    fields, extra = read_job_file(job, trust_remote_code=True)  # the flag was given
    assert "trust_remote_code" not in fields and "trust_remote_code" not in extra.get("current", {})
    job.write_text("model: gpt2\ntrust_remote_code: false\n")
    assert read_job_file(job)[0] == {"model": "gpt2"}  # false is dropped: the flag decides


def test_trust_remote_code_in_yaml_never_reaches_the_hub(cli, tmp_path, monkeypatch):
    import transformers

    def fetch(*a, **k):
        pytest.fail("a hub config was fetched")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", fetch)
    job = tmp_path / "job.yaml"
    job.write_text("model: someone/remote-code-model\ntrust_remote_code: true\n")
    for command in ("plan", "tune", "train"):
        r = cli(command, job)
        assert r.clean_error() and "trust_remote_code" in r.errors[0], (command, r.stderr)
