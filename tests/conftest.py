"""Shared fixtures: tiny models built from configurations (no download, no GPU)."""

from __future__ import annotations

import warnings

import pytest

warnings.filterwarnings("ignore", category=FutureWarning)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (scripts/test.sh): the cores shared among the workers, so that N workers
    do not each start as many torch threads as there are cores.  plan's host-time measurement
    (trainfit.speed.host) is off: a speed a test asserts must not depend on this machine's
    timing; tests/speed/test_host.py switches it on where it is the subject.  plan's simulation
    pool is off: a test process has built models before it plans, and a process forked after
    that can deadlock (plan/workers.py: SimulationWorkers); tests/plan/test_workers.py runs the
    pool on work that builds nothing.  The cache (trainfit.cache) is this run's own, shared by its
    workers: what a test reads cannot come from an earlier run or the user's ~/.cache."""
    import os
    import tempfile

    os.environ["TRAINFIT_HOST_MEASURE"] = "0"
    os.environ["TRAINFIT_WORKERS"] = "1"
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    os.environ["TRAINFIT_CACHE"] = os.path.join(tempfile.gettempdir(), f"trainfit-tests-{run}")

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


@pytest.fixture()
def fresh_cli():
    """``run(argv, cwd=None) -> (exit code, stderr, {"torch": imported?, "transformers": …})``:
    trainfit's entry point in a fresh interpreter, and which heavy modules it had imported when it
    ended — an error is to be said before they load."""
    import subprocess
    import sys

    def run(argv: list[str], cwd: object = None) -> tuple[object, str, dict[str, bool]]:
        code = ("import sys\n"
                f"sys.argv = ['trainfit', *{argv!r}]\n"
                "from trainfit.cli.main import main\n"
                "code = 0\n"
                "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
                "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300, cwd=cwd)
        words = out.stdout.split()
        if len(words) != 3:
            return None, out.stderr, {}
        return int(words[0]), out.stderr, {"torch": words[1] == "True",
                                           "transformers": words[2] == "True"}

    return run


@pytest.fixture(scope="session")
def tiny_llama():
    from transformers import LlamaConfig

    from trainfit.model.source import ModelSource

    cfg = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=2000,
                      max_position_embeddings=256)
    return ModelSource("tiny-llama", cfg, "causal-lm", "local")


@pytest.fixture(scope="session")
def tiny_gpt2():
    from transformers import GPT2Config

    from trainfit.model.source import ModelSource

    cfg = GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=2000, n_positions=256)
    return ModelSource("tiny-gpt2", cfg, "causal-lm", "local")


@pytest.fixture(scope="session")
def tiny_t5():
    from transformers import T5Config

    from trainfit.model.source import ModelSource

    cfg = T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=512)
    return ModelSource("tiny-t5", cfg, "seq2seq-lm", "local")


@pytest.fixture()
def tiny_config_json(tmp_path):
    import json

    p = tmp_path / "config.json"
    p.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 128, "intermediate_size": 344,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 2000, "max_position_embeddings": 256}))
    return p


def write_micro_model(d):
    """A Llama of ~0.1M parameters (``d/micro/config.json``): real CPU steps in milliseconds."""
    import json

    p = d / "micro" / "config.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 300, "max_position_embeddings": 128}))
    return p


def write_chat_jsonl(d):
    """24 chat rows of different lengths (``d/chat.jsonl``): padded, so token weighting matters."""
    import json

    p = d / "chat.jsonl"
    with p.open("w") as f:
        for i in range(24):
            f.write(json.dumps({"messages": [{"role": "user", "content": "q" * (3 + i % 5)},
                                             {"role": "assistant", "content": "a" * (4 + i)}]})
                    + "\n")
    return p


@pytest.fixture()
def micro_model_json(tmp_path):
    """A Llama of ~0.1M parameters: real CPU steps in milliseconds (tune/train tests)."""
    return write_micro_model(tmp_path)


@pytest.fixture(scope="module")
def micro_chat_files(tmp_path_factory):
    """(micro model config, chat rows) for module-scoped fixtures."""
    d = tmp_path_factory.mktemp("micro_chat")
    return write_micro_model(d), write_chat_jsonl(d)


@pytest.fixture()
def text_jsonl(tmp_path):
    import json

    p = tmp_path / "text.jsonl"
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    with p.open("w") as f:
        for i in range(60):
            f.write(json.dumps({"text": " ".join(words[(i + k) % 8] for k in range(5 + i % 7))})
                    + "\n")
    return p


@pytest.fixture()
def chat_jsonl(tmp_path):
    return write_chat_jsonl(tmp_path)


@pytest.fixture()
def one_thread():
    """One intra-op thread for the test: two threads on a shared 2-core host stall on every op
    (OpenMP oversubscription), which makes real CPU steps slow and unsteady."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture()
def one_rank_group(tmp_path):
    """A real gloo process group of one rank, in this process (DDP's hooks then really run)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _launch_two_gloo_ranks(script: str, *args: str, env: dict[str, str] | None = None,
                           path: tuple[str, ...] = ()) -> None:
    """Run ``script`` (a test file run as a script) as 2 ranks under torchrun on this CPU, with
    trainfit's source (and ``path``) importable; fails the test with the ranks' output tails."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import trainfit

    pythonpath = [str(Path(trainfit.__file__).parents[1]), *path, os.environ.get("PYTHONPATH", "")]
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(pythonpath)}
    # --standalone: a free port of its own (no clash with another torchrun on 29500)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", script, *args],
                          capture_output=True, text=True, timeout=600, env=full_env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.fixture(scope="session")
def two_gloo_ranks():
    """``launch(script, *args, env=None, path=())``: the script as 2 gloo ranks (torchrun)."""
    return _launch_two_gloo_ranks
