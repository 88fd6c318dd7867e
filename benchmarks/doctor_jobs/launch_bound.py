"""Seed 000's pattern, on a CPU: one sample per forward/backward (micro-batch 1) and 16 micro-steps
per optimizer step, as a script that kept the smallest batch "to be safe".

``--fixed``: the doctor's fix applied by hand, micro-batch 16 × 1 (same effective batch)."""

from __future__ import annotations

import torch
from common import StepTimes, args, model_and_optimizer


def main() -> None:
    a = args(__doc__ or "", micro_batch=1, accum=16, seq_len=64, steps=20)
    torch.set_num_threads(a.threads)
    micro, accum = (a.micro_batch * a.accum, 1) if a.fixed else (a.micro_batch, a.accum)
    model, opt = model_and_optimizer(a.model)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(3, 300, (512, a.seq_len), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=micro, shuffle=True)
    clock, step, it = StepTimes(), 0, iter(loader)
    while step < a.steps:
        for _ in range(accum):
            try:
                (x,) = next(it)
            except StopIteration:
                it = iter(loader)
                (x,) = next(it)
            (model(input_ids=x, labels=x).loss / accum).backward()
        opt.step()
        opt.zero_grad()
        step += 1
        clock.tick()
    clock.write(a.times_out)


if __name__ == "__main__":
    main()
