"""trainfit: predict (plan), measure and choose (tune), run and watch (train), explain (doctor) and
show (report) the training configuration that uses a GPU well."""

from typing import Any

__all__ = ["JobSpec", "StepHook", "TrainfitCallback", "watch"]


def __getattr__(name: str) -> Any:
    # lazy: `import trainfit` must not import torch/transformers (the CLI starts faster)
    if name in ("TrainfitCallback", "StepHook", "watch"):
        from trainfit.run import hooks

        return getattr(hooks, name)
    if name == "JobSpec":
        from trainfit.job import JobSpec

        return JobSpec
    raise AttributeError(name)
