"""Shared by the doctor's benchmark scripts: someone else's code, so it uses torch and transformers
only (never trainfit). Each script can write its own step times (``--times-out``) so the benchmark
can compare a run under the doctor with a run without it, timed by the script's own clock."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "examples" / "data" / "tiny_text.jsonl"


def args(description: str, **defaults: object) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=defaults.get("steps", 30))
    p.add_argument("--micro-batch", type=int, default=defaults.get("micro_batch", 8))
    p.add_argument("--accum", type=int, default=defaults.get("accum", 1))
    p.add_argument("--seq-len", type=int, default=defaults.get("seq_len", 64))
    p.add_argument("--model", default=str(HERE / str(defaults.get("model", "tiny_llama")) / "config.json"))
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: the other core stays free; 2 threads on a shared 2-core host "
                        "make every op wait for a descheduled thread)")
    p.add_argument("--fixed", action="store_true", help="the doctor's fix, applied by hand")
    p.add_argument("--times-out", default=None, help="write the script's own step times (JSON)")
    return p.parse_args()


def model_and_optimizer(config_path: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**json.loads(Path(config_path).read_text()))
    model = AutoModelForCausalLM.from_config(cfg)
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


class StepTimes:
    """The script's own clock: one entry per optimizer step."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._t = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        self.times.append(now - self._t)
        self._t = now

    def write(self, path: str | None) -> None:
        if path:
            Path(path).write_text(json.dumps(self.times))
