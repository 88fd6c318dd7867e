"""Query, key and value from one fused projection, as lit-gpt's model code computes them
(``JobSpec.fused_qkv``).

transformers' Llama-family attention runs three projections (``q_proj``, ``k_proj``, ``v_proj``).
lit-gpt's ``CausalSelfAttention`` runs one (``self.attn``, (n_head + 2·n_query_groups)·head_size
outputs) and splits its output into views (lit_gpt/model.py); nanoGPT-style code does the same.
Two things then differ in what a training step holds, and the stand-in reproduces both:

* The value heads are views of the fused output.  The attention kernel saves its value for the
  backward, so with multi-head attention every layer keeps all of q, k and v alive (3 d per token
  instead of d).  With grouped queries lit-gpt expands k and v to every query head and
  ``reshape`` copies them (3 d saved: q and the two copies; the fused output is freed); the
  stand-in does the same and tells transformers' attention not to repeat them again
  (``num_key_value_groups`` 1), where transformers 5 would hand the kernel the unrepeated value.
* LoRA on the fused projection is lit-gpt's ``LoRAQKVLinear``: one dropout and one ``lora_A``
  for every enabled target (peft has one of each per projection), ``lora_B`` applied as one grouped
  ``conv1d`` with multi-head attention (one per part, concatenated, with grouped queries), and the
  update zero-padded to the fused width (``new_zeros`` + ``index_copy``) and
  added to the frozen projection's output.

Mirrors ``LoRAQKVLinear.forward`` / ``zero_pad`` / ``conv1d`` of lit_gpt/lora.py (litgpt
0.1.0.dev1, Apache-2.0: the same code as the Oct 2023 commit of lit-gpt's published resource
tables).  The fused columns are laid out [q | k | v] where lit-gpt interleaves them per query
group: the same bytes, held as long.  ``benchmarks/litgpt_model_code.py`` runs lit-gpt's own code
on this CPU beside trainfit's simulation of it and compares what each step holds.

lit-gpt's models are decoder-only: a job of another kind, a cross-attention (its q and k/v read
different inputs) and projections that differ in having a bias are refused or left as they are.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainfit.job import JobError

PROJECTIONS = ("q_proj", "k_proj", "v_proj")
"""The separate projections transformers' attention classes call, in the order they call them."""


class FusedQKV(torch.nn.Module):
    """One frozen (or, fully fine-tuned, trainable) projection to q, k and v, with lit-gpt's LoRA
    on the enabled ones.  :class:`_Part` modules stand where the three projections were."""

    def __init__(self, parts: list[torch.nn.Linear], enable: tuple[bool, bool, bool], *, r: int,
                 alpha: int, dropout: float, lora_dtype: torch.dtype | None,
                 head_dim: int) -> None:
        super().__init__()
        first = parts[0]
        self.sizes = tuple(p.out_features for p in parts)
        w = first.weight
        self.linear = torch.nn.Linear(first.in_features, sum(self.sizes),
                                      bias=first.bias is not None, device=w.device, dtype=w.dtype)
        self.linear.weight.requires_grad_(w.requires_grad)
        if self.linear.bias is not None:
            self.linear.bias.requires_grad_(w.requires_grad)
        self.enable = enable
        self.head_dim = head_dim
        self.repeat = self.sizes[0] // self.sizes[1]
        """Query heads per key/value head (1: multi-head attention)."""
        self.scaling = alpha / r
        self.lora_dropout: Any = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        self.lora_widths: tuple[int, ...] = () if lora_dtype is None else tuple(
            s for s, on in zip(self.sizes, enable, strict=True) if on)
        """The adapted parts' widths (none: no LoRA on this projection)."""
        if self.lora_widths:
            self.lora_A = torch.nn.Parameter(torch.zeros(
                r * len(self.lora_widths), first.in_features, device=w.device, dtype=lora_dtype))
            self.lora_B = torch.nn.Parameter(torch.zeros(
                sum(self.lora_widths), r, device=w.device, dtype=lora_dtype))
        self._cache: tuple[torch.Tensor, torch.Tensor, set[int]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pretrained = self.linear(x)
        if not self.lora_widths:
            return pretrained
        after_a = F.linear(self.lora_dropout(x), self.lora_A)
        after_b = self._conv1d(after_a.transpose(-2, -1),
                               self.lora_B.unsqueeze(-1)).transpose(-2, -1)
        lora = self._zero_pad(after_b) * self.scaling
        return pretrained + lora

    def _conv1d(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """lit-gpt's ``conv1d``: one grouped convolution with multi-head attention (lit-gpt:
        n_head == n_query_groups), else one per adapted part, concatenated."""
        n = len(self.lora_widths)
        if self.repeat == 1:
            return F.conv1d(a, b, groups=n)
        return torch.cat([F.conv1d(x, w) for x, w in zip(a.chunk(n, dim=1),
                                                           b.split(self.lora_widths),
                                                           strict=True)], dim=1)

    def _zero_pad(self, x: torch.Tensor) -> torch.Tensor:
        """lit-gpt's ``zero_pad``: the update scattered into zeros of the fused width."""
        if all(self.enable):
            return x
        x = x.transpose(0, 1)
        out = sum(self.sizes)
        result = x.new_zeros((*x.shape[:-1], out)).view(-1, out)
        result = result.index_copy(1, self._index(result.device),
                                   x.reshape(-1, sum(self.lora_widths)))
        return result.view((*x.shape[:-1], out)).transpose(0, 1)

    def _index(self, device: torch.device) -> torch.Tensor:
        """The adapted columns as an int64 tensor made on the device at each call, as lit-gpt
        makes it (``torch.tensor(self.lora_ind, device=...)``); built from ranges, which
        torch.compile's tracing of the simulated block accepts where a Python list is not."""
        ranges, start = [], 0
        for size, on in zip(self.sizes, self.enable, strict=True):
            if on:
                ranges.append(torch.arange(start, start + size, device=device))
            start += size
        return torch.cat(ranges)

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Projection ``index``'s columns: a view of the fused output, computed once per input
        (the attention calls q, k and v on the same hidden states; a checkpointed block's
        recomputation brings a new one)."""
        if self._cache is None or self._cache[0] is not x:
            self._cache = (x, self(x), set())
        _, fused, taken = self._cache
        taken.add(index)
        if len(taken) == len(self.sizes):
            self._cache = None  # the three views hold the output from here on, as lit-gpt's do
        start = sum(self.sizes[:index])
        part = fused[..., start:start + self.sizes[index]]
        if index == 0 or self.repeat == 1:
            return part
        # lit-gpt: k and v expanded to every query head, and ``reshape`` copies them
        heads = self.sizes[index] // self.head_dim
        shape = (*part.shape[:-1], heads, 1, self.head_dim)
        return part.reshape(shape).expand(*shape[:-2], self.repeat, self.head_dim).reshape(
            *part.shape[:-1], self.sizes[0])


class _Part(torch.nn.Module):
    """Stands where ``q_proj`` / ``k_proj`` / ``v_proj`` was: returns its view of the fused
    output.  The fused module is not registered here (it is the attention's ``qkv_proj``), so the
    model's parameters and modules are counted once."""

    def __init__(self, fused: FusedQKV, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "_fused", fused)
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fused.part(self.index, x)


def _base(module: torch.nn.Module) -> torch.nn.Linear | None:
    """The plain linear layer of a projection (peft's LoRA layer wraps it as ``base_layer``)."""
    base = getattr(module, "base_layer", module)
    return base if type(base) is torch.nn.Linear else None


def _has_lora(module: torch.nn.Module) -> bool:
    return hasattr(module, "base_layer") and bool(getattr(module, "lora_A", None))


@torch.no_grad()
def _copy_weights(fused: FusedQKV, projections: list[torch.nn.Module],
                  bases: list[torch.nn.Linear]) -> None:
    """Outside the simulation (meta tensors) the fused module computes what the three did: their
    weights side by side, peft's A stacked and its B as the grouped convolution's blocks."""
    fused.linear.weight.copy_(torch.cat([b.weight for b in bases]))
    if fused.linear.bias is not None:
        fused.linear.bias.copy_(torch.cat([b.bias for b in bases]))
    adapted = [p for p in projections if _has_lora(p)]
    if fused.lora_widths:
        fused.lora_A.copy_(torch.cat([p.lora_A["default"].weight for p in adapted]))
        fused.lora_B.copy_(torch.cat([p.lora_B["default"].weight for p in adapted]))


def fuse_qkv(model: torch.nn.Module, *, name: str, r: int, alpha: int, dropout: float,
             lora_dtype: torch.dtype | None) -> int:
    """Replace every self-attention's separate q/k/v projections by one :class:`FusedQKV`;
    peft's LoRA on any of them becomes lit-gpt's fused LoRA.  Returns the number of attentions
    fused; a model without separate projections is a :class:`JobError`."""
    count = 0
    for mod in list(model.modules()):
        projections = [getattr(mod, p, None) for p in PROJECTIONS]
        if any(p is None for p in projections) or getattr(mod, "is_cross_attention", False):
            continue
        bases = [_base(p) for p in projections]
        if any(b is None for b in bases):
            continue
        if len({b.bias is None for b in bases}) > 1:  # type: ignore[union-attr]
            raise JobError(f"--fused-qkv: {name}'s q/k/v projections differ in having a bias; "
                           "one fused projection cannot", "drop --fused-qkv for this model")
        head_dim = getattr(mod, "head_dim", None)
        sizes = [b.out_features for b in bases]  # type: ignore[union-attr]
        if not head_dim or sizes[1] != sizes[2] or sizes[0] % sizes[1] or sizes[1] % head_dim:
            continue
        enable = tuple(_has_lora(p) for p in projections)
        fused = FusedQKV(bases, enable, r=r, alpha=alpha, dropout=dropout,  # type: ignore[arg-type]
                         lora_dtype=lora_dtype if any(enable) else None, head_dim=head_dim)
        if fused.linear.weight.device.type != "meta":
            _copy_weights(fused, projections, bases)  # type: ignore[arg-type]
        mod.qkv_proj = fused
        for index, p in enumerate(PROJECTIONS):
            setattr(mod, p, _Part(fused, index))
        if fused.repeat > 1:
            mod.num_key_value_groups = 1  # the parts return k and v repeated, as lit-gpt's do
        count += 1
    if count == 0:
        raise JobError(f"--fused-qkv: {name} has no attention with separate q_proj, k_proj and "
                       "v_proj linear layers to fuse (its model code may fuse them already: "
                       "GPT-2, GPT-NeoX, Falcon)", "drop --fused-qkv for this model")
    return count
