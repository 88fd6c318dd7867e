"""A loop that pulls values to the host every micro-step: the loss with ``.item()`` and printed,
and a per-token loss table kept in Python (``for tok, l in zip(...): table[tok.item()] += l.item()``),
the pattern of scripts that track which tokens are hard. On a GPU every ``.item()`` waits for the
device and empties the kernel queue.

``--fixed``: the doctor's fix applied by hand — the table and the running loss stay on the device
(``index_add_``), one ``.item()`` and one print every 10 optimizer steps."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from common import StepTimes, args, model_and_optimizer


def main() -> None:
    a = args(__doc__ or "", micro_batch=32, accum=2, seq_len=64, steps=20)
    torch.set_num_threads(a.threads)
    model, opt = model_and_optimizer(a.model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    data = torch.randint(3, 300, (512, a.seq_len), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=a.micro_batch,
                                         shuffle=True)
    table = [0.0] * vocab
    table_dev = torch.zeros(vocab)
    running = torch.zeros(())
    clock, step, it = StepTimes(), 0, iter(loader)
    while step < a.steps:
        for micro in range(a.accum):
            try:
                (x,) = next(it)
            except StopIteration:
                it = iter(loader)
                (x,) = next(it)
            logits = model(input_ids=x).logits
            per_tok = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1),
                                      reduction="none")
            loss = per_tok.mean() / a.accum
            loss.backward()
            if a.fixed:
                table_dev.index_add_(0, x[:, 1:].reshape(-1), per_tok.detach())
                running += loss.detach()
            else:
                for tok, val in zip(x[:, 1:].reshape(-1), per_tok.detach(), strict=True):
                    table[tok.item()] += val.item()
                print(f"step {step} micro {micro} loss {loss.item() * a.accum:.4f}")
        opt.step()
        opt.zero_grad()
        step += 1
        clock.tick()
        if a.fixed and step % 10 == 0:
            print(f"step {step} loss {running.item() / 10:.4f}")
            running.zero_()
    clock.write(a.times_out)


if __name__ == "__main__":
    main()
