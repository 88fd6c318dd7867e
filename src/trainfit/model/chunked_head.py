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

        # a plain zip, as litgpt's chunked_cross_entropy: at a length one past a multiple of the
        # chunk, the last chunk's logits are empty after the shift and the targets have one
        # chunk fewer (a review: strict=True ended in a ValueError)
        losses = [chunk_loss(lg.reshape(-1, vocab), t.reshape(-1))
                  for lg, t in zip(logits, targets.split(self.chunk, dim=1), strict=False)]
        n = (targets != -100).sum().clamp(min=1)
        return ChunkedOutput(torch.stack(losses).sum() / n, logits)


TRL_TOKEN_TILE = 4096
"""trl 1.16.0 kernels/chunked_logprob.py ``TOKEN_CHUNK_SIZE``: tokens per projection tile."""
TRL_VOCAB_TILE = 32768
"""trl 1.16.0 trainer/utils.py ``_CHUNKED_LOGPROB_CHUNK_SIZE``: vocabulary entries per tile (the
tile buffer is this wide whatever the vocabulary: a 64-entry toy vocabulary still allocates it)."""


class _TrlLogProbTiles(torch.autograd.Function):
    """The memory of trl 1.16.0's ``ChunkedLogProbFunction`` as it runs on a GPU with Triton
    (kernels/chunked_logprob.py): forward, seven fp32 per-token statistics, one tile buffer
    ``[min(N, 4096), 32768]`` in the compute dtype that each tile's ``torch.mm`` writes into, the
    hidden chunk and the weight's vocabulary slice cast to the compute dtype (copies when their
    dtype differs), the Triton fold working in registers; it saves ``hidden, weight, bias,
    targets, log_z, entropy``. Backward: fp32 ``grad_hidden [N, H]`` and, when the head trains,
    fp32 ``grad_weight [V, H]`` (zeros), the tile buffer again, each tile recomputed and turned
    into its gradient in place, accumulated with ``addmm(out_dtype=float32)``; the gradients
    returned cast to the inputs' dtypes. A stand-in for the simulation (values are not computed:
    the simulation has none); on a device without Triton trl folds each tile in torch, with
    fp32 temporaries of the tile's size — the simulation of a CPU step runs trl's own function."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor,
                targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dev, n = hidden.device, hidden.shape[0]
        vocab = weight.shape[0]
        dtype = torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) \
            else hidden.dtype
        stats = [torch.zeros(n, device=dev, dtype=torch.float32) for _ in range(7)]
        buf = torch.empty((min(n, TRL_TOKEN_TILE), TRL_VOCAB_TILE), device=dev, dtype=dtype)
        for t0 in range(0, n, TRL_TOKEN_TILE):
            h = hidden[t0:t0 + TRL_TOKEN_TILE].to(dtype)
            for v0 in range(0, vocab, TRL_VOCAB_TILE):
                w = weight[v0:v0 + TRL_VOCAB_TILE].to(dtype)
                tile = buf[:h.shape[0], :w.shape[0]]
                torch.mm(h, w.t(), out=tile)
                del w, tile
            del h
        del buf
        log_z = stats[0] + stats[1]  # running_max + log(sum_exp): a new [N] vector
        logprobs = stats[6] - log_z
        entropy = log_z - stats[2] / stats[1]
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy)
        ctx.dtype = dtype
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, g_logprobs: torch.Tensor | None,
                 g_entropy: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, weight, _, _, _ = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        n, vocab = hidden.shape[0], weight.shape[0]
        gh = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if need_h else None
        gw = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if need_w else None
        buf = torch.empty((min(n, TRL_TOKEN_TILE), TRL_VOCAB_TILE), device=hidden.device,
                          dtype=ctx.dtype)
        g = [x.float().contiguous() for x in (g_logprobs, g_entropy) if x is not None]
        for t0 in range(0, n, TRL_TOKEN_TILE):
            h = hidden[t0:t0 + TRL_TOKEN_TILE].to(ctx.dtype)
            for v0 in range(0, vocab, TRL_VOCAB_TILE):
                w = weight[v0:v0 + TRL_VOCAB_TILE].to(ctx.dtype)
                tile = buf[:h.shape[0], :w.shape[0]]
                torch.mm(h, w.t(), out=tile)
                if gh is not None:
                    _addmm_fp32(gh[t0:t0 + h.shape[0]], tile, w)
                if gw is not None:
                    _addmm_fp32(gw[v0:v0 + w.shape[0]], tile.t(), h)
                del w, tile
            del h
        del buf, g
        return (gh.to(hidden.dtype) if gh is not None else None,
                gw.to(weight.dtype) if gw is not None else None, None)


def _addmm_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """trl's ``_addmm_fp32`` on CUDA (torch ≥ 2.8): 16-bit products accumulated into the fp32
    ``acc`` without a copy; fp32 inputs need none either."""
    if a.dtype in (torch.float16, torch.bfloat16):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a, b)


class TrlLogProbHeadLM(ChunkedHeadLM):
    """TRL's SFTTrainer loss (trl 1.16.0: ``add_fused_lm_head(outputs=("log_probs", "entropy",
    "is_top1"))`` and ``compute_loss``'s ``model(**inputs, fused_lm_head=True)``): the decoder's
    last hidden state without its last position, the head applied in tiles by
    :class:`_TrlLogProbTiles` on a CUDA target, or by trl's own function on a CPU one, and the
    loss ``-sum(log p) / valid tokens``. Every position is scored (trl scores only the labelled
    ones on a GPU with Triton: an upper bound for masked prompts). Real tensors (tune's and
    train's steps) always run trl's own function; a simulated CUDA step (fake tensors) runs the
    stand-in, whose memory is the Triton path's."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, chunk=TRL_TOKEN_TILE)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                **kwargs: Any) -> ChunkedOutput:
        kwargs.pop("num_items_in_batch", None)
        out = self._decoder(input_ids=input_ids, use_cache=False, **kwargs)
        hidden = out.last_hidden_state[:, :-1]
        targets = (labels if labels is not None else input_ids)[:, 1:]
        mask = targets != -100
        flat = hidden.reshape(-1, hidden.size(-1))
        weight = self._head.weight
        from torch._subclasses.fake_tensor import is_fake

        if flat.device.type == "cuda" and is_fake(flat):
            logprobs, _ = _TrlLogProbTiles.apply(flat, weight, targets.reshape(-1))
        else:
            from trl.kernels import ChunkedLogProbFunction

            logprobs = ChunkedLogProbFunction.apply(
                flat, weight, self._head.bias, targets.clamp(min=0).reshape(-1), 1.0,
                TRL_VOCAB_TILE, None, 1.0, ("log_probs", "entropy", "is_top1"))[0]
        logprobs = logprobs.view(mask.shape).masked_fill(~mask, 0)
        loss = -logprobs.sum() / mask.sum().clamp(min=1)
        return ChunkedOutput(loss, [])
