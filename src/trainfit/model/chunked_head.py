"""Output head and cross-entropy in chunks of tokens (``lm_head_chunk``).

transformers' causal-LM loss upcasts the whole ``(B, S, V)`` logits to fp32 and keeps an fp32
log-softmax for backward — for a 256k vocabulary (Gemma) that is several GiB.  litgpt
(``lm_head_chunk_size=128`` + ``chunked_cross_entropy``) and torchtune compute the head per chunk
of tokens and the loss per chunk in the logits' dtype.  This wrapper does the same with the model's
own decoder and head (PEFT adapters included), so the knob's memory effect is the real one.
Mirrors litgpt ``GPT.forward(lm_head_chunk_size)`` + ``utils.chunked_cross_entropy`` (the chunk
logits stay referenced until backward, as in litgpt's training loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ChunkedOutput:
    loss: torch.Tensor
    logits: list[torch.Tensor]


class _PartitionedCrossEntropy(torch.autograd.Function):
    """The memory of ``cross_entropy(x.float(), t, reduction="sum")`` compiled (what a
    ``torch.compile``d loss runs — torchtune compiles its chunked loss with the model): with
    Inductor's decompositions, AOTAutograd's min-cut partitioner saves the 16-bit chunk it is
    given, the targets and two fp32 values per row (the max and the log-sum), and recomputes the
    softmax in the backward, whose fused kernel writes the gradient in the chunk's dtype (checked
    with ``functorch.compile.aot_function``, ``min_cut_rematerialization_partition`` and
    ``torch._inductor.decomposition.select_decomp_table``: tests/model/test_chunked_head.py).
    Eager keeps an fp32 log-softmax of every chunk instead.  A memory stand-in for the
    simulation only (the per-row statistics in the chunk's dtype; a real compiled run traces the
    real loss)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, t: torch.Tensor, ignore_index: int) -> torch.Tensor:
        lse = torch.logsumexp(x, dim=-1, keepdim=True)
        valid = t != ignore_index
        picked = x.gather(-1, t.clamp(min=0).unsqueeze(-1))
        ctx.save_for_backward(x, t, lse)
        ctx.ignore_index = ignore_index
        return ((lse - picked).squeeze(-1) * valid).float().sum()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, t, _ = ctx.saved_tensors
        grad = torch.softmax(x, dim=-1)  # the gradient's own storage, in the chunk's dtype
        valid = (t != ctx.ignore_index).unsqueeze(-1).to(grad.dtype)
        grad.scatter_add_(-1, t.clamp(min=0).unsqueeze(-1), -valid)
        grad.mul_(valid * g.to(grad.dtype))
        return grad, None, None


class ChunkedHeadLM(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, chunk: int, fp32_outputs: bool = False) -> None:
        super().__init__()
        self.model = model
        self.chunk = chunk
        self.fp32_outputs = fp32_outputs
        self.partitioned_loss = False
        """The simulation of a compiled step sets it: each chunk's loss keeps what the compiled
        loss keeps (:class:`_PartitionedCrossEntropy`)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._decoder = base.get_decoder()
        self._head = base.get_output_embeddings()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                **kwargs: object) -> ChunkedOutput:
        hidden = self._decoder(input_ids=input_ids, use_cache=False).last_hidden_state
        logits = [self._head(h) for h in hidden.split(self.chunk, dim=1)]
        if self.fp32_outputs:
            # Lightning Fabric's convert_output on the returned list (JobSpec.fp32_outputs): a new
            # list of fp32 copies while the 16-bit chunks are alive, then those are dropped; the
            # loop's shift and loss then run on the fp32 chunks
            logits = [lg.float() for lg in logits]
        logits[-1] = logits[-1][..., :-1, :]
        targets = (labels if labels is not None else input_ids)[..., 1:]
        vocab = logits[0].size(-1)
        def chunk_loss(lg: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            if self.partitioned_loss:
                return _PartitionedCrossEntropy.apply(lg, t, -100)
            return torch.nn.functional.cross_entropy(lg, t, ignore_index=-100, reduction="sum")

        losses = [chunk_loss(lg.reshape(-1, vocab), t.reshape(-1))
                  for lg, t in zip(logits, targets.split(self.chunk, dim=1), strict=True)]
        n = (targets != -100).sum().clamp(min=1)
        return ChunkedOutput(torch.stack(losses).sum() / n, logits)
