"""The GPT of LLMs-from-scratch's training-speed ladder (ch05/10_llm-training-speed), as each
row of the ladder runs it: the benchmark plans these modules through trainfit's own-model front
door (``--model file.py:factory``, seed 003's path), so the step that is timed has the ladder's
own ops, not a transformers stand-in's.

Written here from the architecture its README and files describe (GPT-2 124M dims, untied
bias-free output head, dropout 0.1 everywhere, pre-LayerNorm blocks):

* rows 00-05: the book's hand-written LayerNorm (mean, biased variance, normalise, scale, shift)
  and tanh-GELU (composed of elementwise ops), and its multi-head attention with separate query,
  key and value projections, the causal mask ``masked_fill_`` on the scores, softmax of the
  scores / √head_dim and dropout on the weights; row 00 slices a registered mask buffer, rows
  01+ build the boolean mask on the fly (README step 1);
* row 06: ``nn.LayerNorm`` and ``nn.GELU(approximate="tanh")``;
* rows 07+: one fused qkv projection and ``scaled_dot_product_attention(is_causal=True)`` with
  dropout (01_opt_single_gpu.py's PyTorchMultiHeadAttention); row 09 on pads the vocabulary to
  50,304.
"""

from __future__ import annotations

import math

import torch
from torch import nn

CONTEXT = 1024
EMB = 768
HEADS = 12
LAYERS = 12
DROP = 0.1
VOCAB = 50257
VOCAB_PADDED = 50304


class BookLayerNorm(nn.Module):
    def __init__(self, emb: int) -> None:
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb))
        self.shift = nn.Parameter(torch.zeros(emb))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * ((x - mean) / torch.sqrt(var + self.eps)) + self.shift


class BookGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3))))


class BookAttention(nn.Module):
    """Separate q/k/v projections, explicit scores, masked_fill_, softmax, dropout."""

    def __init__(self, mask_buffer: bool) -> None:
        super().__init__()
        self.head_dim = EMB // HEADS
        self.W_query = nn.Linear(EMB, EMB, bias=False)
        self.W_key = nn.Linear(EMB, EMB, bias=False)
        self.W_value = nn.Linear(EMB, EMB, bias=False)
        self.out_proj = nn.Linear(EMB, EMB)
        self.dropout = nn.Dropout(DROP)
        self.mask_buffer = mask_buffer
        if mask_buffer:
            self.register_buffer("mask", torch.triu(torch.ones(CONTEXT, CONTEXT), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(p: nn.Linear) -> torch.Tensor:
            return p(x).view(b, t, HEADS, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.W_query), heads(self.W_key), heads(self.W_value)
        scores = q @ k.transpose(2, 3)
        if self.mask_buffer:
            mask = self.mask.bool()[:t, :t]
        else:
            mask = torch.triu(torch.ones(t, t, device=x.device, dtype=torch.bool), diagonal=1)
        scores.masked_fill_(mask, -torch.inf)
        weights = self.dropout(torch.softmax(scores / k.shape[-1] ** 0.5, dim=-1))
        ctx = (weights @ v).transpose(1, 2).contiguous().view(b, t, EMB)
        return self.out_proj(ctx)


class SdpaAttention(nn.Module):
    """One qkv projection and scaled_dot_product_attention (flash on an A100)."""

    def __init__(self) -> None:
        super().__init__()
        self.head_dim = EMB // HEADS
        self.qkv = nn.Linear(EMB, 3 * EMB, bias=False)
        self.proj = nn.Linear(EMB, EMB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, self.head_dim).permute(2, 0, 3, 1, 4)
        ctx = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=DROP if self.training else 0.0, is_causal=True)
        return self.proj(ctx.transpose(1, 2).contiguous().view(b, t, EMB))


class Block(nn.Module):
    def __init__(self, row: int) -> None:
        super().__init__()
        book_norms = row <= 5
        self.att = SdpaAttention() if row >= 7 else BookAttention(mask_buffer=row == 0)
        gelu: nn.Module = BookGELU() if book_norms else nn.GELU(approximate="tanh")
        self.ff = nn.Sequential(nn.Linear(EMB, 4 * EMB), gelu, nn.Linear(4 * EMB, EMB))
        self.norm1 = BookLayerNorm(EMB) if book_norms else nn.LayerNorm(EMB)
        self.norm2 = BookLayerNorm(EMB) if book_norms else nn.LayerNorm(EMB)
        self.drop_shortcut = nn.Dropout(DROP)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_shortcut(self.att(self.norm1(x)))
        return x + self.drop_shortcut(self.ff(self.norm2(x)))


class GPTModel(nn.Module):
    def __init__(self, row: int) -> None:
        super().__init__()
        vocab = VOCAB_PADDED if row >= 9 else VOCAB
        self.tok_emb = nn.Embedding(vocab, EMB)
        self.pos_emb = nn.Embedding(CONTEXT, EMB)
        self.drop_emb = nn.Dropout(DROP)
        self.trf_blocks = nn.ModuleList(Block(row) for _ in range(LAYERS))
        self.final_norm = BookLayerNorm(EMB) if row <= 5 else nn.LayerNorm(EMB)
        self.out_head = nn.Linear(EMB, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        x = self.drop_emb(x)
        for block in self.trf_blocks:
            x = block(x)
        return self.out_head(self.final_norm(x))


def ladder_00() -> GPTModel:
    return GPTModel(0)


def ladder_01() -> GPTModel:
    """Rows 01-05 (TF32, fused AdamW, pinned memory and bf16 change no model code)."""
    return GPTModel(1)


def ladder_06() -> GPTModel:
    return GPTModel(6)


def ladder_07() -> GPTModel:
    """Rows 07 and 08 (torch.compile changes no model code)."""
    return GPTModel(7)


def ladder_09() -> GPTModel:
    """Rows 09-10 and the DDP rows (02_opt_multi_gpu_ddp.py: the optimised model)."""
    return GPTModel(9)

