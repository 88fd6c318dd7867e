"""Data-less stand-ins for bitsandbytes parts that cannot hold fake tensors.

``bnb.nn.Params4bit`` refuses fake tensors and bnb optimizers launch CUDA kernels, so for the
simulation we replace them by modules/optimizers that allocate exactly what bitsandbytes allocates
(layouts from bitsandbytes 0.4x/0.5x ``functional.quantize_4bit``, ``autograd.MatMul4Bit``,
``optim.optimizer.Optimizer8bit``) and do the same transient work:

* 4-bit weight: packed uint8 ``(n/2, 1)``; absmax fp32 per block of 64, or with double
  quantisation uint8 per block + fp32 per 256 blocks + a 256-entry fp32 code; the 16-entry code.
* ``MatMul4Bit``: forward dequantises the whole weight to the compute dtype (a transient
  ``out×in`` tensor), multiplies and frees it; it saves only the quantised weight; backward
  dequantises again to compute the input gradient.
* torchao's NF4 (torchtune, ``lib`` torchao / torchao-0.1): the same packed bytes and double
  quantised scalers (torchao 0.1 also keeps its bf16 per-block factor); ``linear_nf4``
  dequantises through int64 codes (``get_original_weight``: 14 B per element at its peak;
  under torch.compile one fused kernel writes the weight, as bitsandbytes' does).
* 8-bit Adam: two uint8 states + fp32 absmax per block of 256 for tensors of ≥ 4096 elements
  (``min_8bit_size``), fp32 states below; paged optimizers put states of tensors with ≥ 1e5
  elements in CUDA managed memory (``cget_managed_ptr``), invisible to torch's allocator stats.
"""

from __future__ import annotations

import math
from typing import Any

import torch

BNB_4BIT_BLOCK = 64
BNB_NESTED_BLOCK = 256
BNB_8BIT_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096
BNB_PAGED_MIN_NUMEL = 100_000


@torch.library.custom_op("trainfit::dequantize_4bit", mutates_args=())
def dequantize_4bit(packed: torch.Tensor, step: torch.Tensor, out_features: int, in_features: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """bitsandbytes' ``dequantize_4bit`` kernel (``kDequantizeBlockwise``) as one dispatched op of
    the simulation: it reads the packed bytes (half a byte per element) and writes the weight
    (``out×in`` in ``dtype``) — the op the speed model times as a memory-bound kernel
    (:mod:`trainfit.speed.ops`: a QLoRA row had LoRA's step time to the last digit, its
    dequantizations, ~2.5 B per element twice a step, untimed: an audit). The per-block absmax
    it also reads (1/64 of the elements; double-quantized: 1/64 B + 1/16384 × 4 B) is not
    counted: a lower bound of its traffic, as every op's is. Allocates what the kernel does."""
    return torch.empty((out_features, in_features), dtype=dtype, device=packed.device)


@dequantize_4bit.register_fake
def _dequantize_4bit_fake(packed: torch.Tensor, step: torch.Tensor, out_features: int,
                          in_features: int, dtype: torch.dtype) -> torch.Tensor:
    return packed.new_empty((out_features, in_features), dtype=dtype)


@torch.library.custom_op("trainfit::bnb_optimizer_update_", mutates_args=("param", "states"))
def bnb_optimizer_update_(param: torch.Tensor, grad: torch.Tensor,
                         states: list[torch.Tensor]) -> None:
    """bitsandbytes' fused optimizer kernel for one parameter (``optimizer_update_32bit`` /
    ``optimizer_update_8bit_blockwise``: ``kOptimizer32bit2State``,
    ``kOptimizerStatic8bit2StateBlockwise``) as one dispatched op of the simulation: it reads
    the gradient, the weight and the two states (8-bit: with their per-block absmax) and writes
    the weight and the states back in place — the traffic the speed model times as one
    memory-bound kernel (:mod:`trainfit.speed.ops` reads the schema's written arguments). Before
    it the step recorded no op: AdamW8bit and PagedAdamW32bit were timed at 0 s, faster than
    torch's fused AdamW moving the same fp32 states (a review). Allocates nothing, as the
    kernel; the 256-entry quantization maps it reads are not counted (a lower bound)."""


@bnb_optimizer_update_.register_fake
def _bnb_optimizer_update_fake(param: torch.Tensor, grad: torch.Tensor,
                               states: list[torch.Tensor]) -> None:
    return None


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (an FSDP2 parameter, its gradient and states): the kernel runs on
    it, and a library op has no sharding rule for DTensors."""
    return getattr(t, "_local_tensor", t)


def _dequantize(shape: tuple[int, int], like: torch.Tensor, from_fp16: bool,
                packed: torch.Tensor) -> torch.Tensor:
    """``F.dequantize_4bit(B, state).to(A.dtype)``: the dequantized weight in the quant state's
    dtype, then (if different) its copy in the compute dtype; the first dies after the copy."""
    if from_fp16 and like.dtype != torch.float16:
        w16 = dequantize_4bit(packed, like.new_empty(0), shape[0], shape[1], torch.float16)
        w = w16.to(like.dtype)
        del w16
        return w
    # ``like.new_empty(0)``: the pass's own (empty) tensor, so that torch.compile's partitioner
    # does not take the backward's dequantization for the forward's and save the 16-bit weight
    # (a review: compiled QLoRA 7B read 17.07 → 29.04 GiB); bitsandbytes dequantizes twice
    return dequantize_4bit(packed, like.new_empty(0), shape[0], shape[1], like.dtype)


def torchao_dequant_events(n: int) -> list[tuple[str, int]]:
    """torchao's ``NF4Tensor.get_original_weight`` (what ``linear_nf4``'s ``weight.to(dtype)``
    runs, and torchtune's NF4 ``clone``; torchao 0.1 to 0.18) on a weight of ``n`` elements, as
    ``(name, bytes)`` allocations and ``(name, 0)`` frees: the packed bytes' two halves as int64
    codes, looked up in bf16, scaled by the block scalers expanded, stacked — 14 B per element at
    its peak; ``weight``, the bf16 weight (2 B per element), is left.  Checked against torchao
    run on this CPU (tests/memory/test_loading.py)."""
    half = n // 2
    events: list[tuple[str, int]] = []
    for i in range(2):  # (quantized_data >> 4).to(long), (quantized_data & 0b1111).to(long)
        events += [("nibble", half), (f"codes{i}", 8 * half), ("nibble", 0)]
    events += [("looked_up0", 2 * half), ("looked_up1", 2 * half)]  # nf4[codes]
    for i in range(2):  # dequantized * repeated.flatten(): the expanded scalers materialised
        events += [("repeated", 2 * half), (f"scaled{i}", 2 * half), ("repeated", 0)]
    events.append(("weight", 2 * n))  # torch.stack(..., dim=-1).reshape(shape)
    return events + [(k, 0) for k in ("codes0", "codes1", "looked_up0", "looked_up1",
                                      "scaled0", "scaled1")]


def _dequantize_torchao(shape: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    """:func:`torchao_dequant_events` made on ``like``'s device; returns the weight in
    ``like``'s dtype (a copy when that is not bf16)."""
    live: dict[str, torch.Tensor] = {}
    w = None
    for name, nbytes in torchao_dequant_events(shape[0] * shape[1]):
        if name == "weight":
            w = torch.empty(shape, dtype=torch.bfloat16, device=like.device)
        elif nbytes:
            live[name] = torch.empty(nbytes, dtype=torch.uint8, device=like.device)
        else:
            del live[name]
    assert w is not None
    if like.dtype != torch.bfloat16:
        w = w.to(like.dtype)
    return w


class _MatMul4BitSim(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                out_features: int, in_features: int, legacy: bool, from_fp16: bool,
                codes_dequant: bool) -> torch.Tensor:
        shape = (out_features, in_features)
        w = _dequantize_torchao(shape, x) if codes_dequant else \
            _dequantize(shape, x, from_fp16, packed)
        y = torch.nn.functional.linear(x, w, bias)
        del w
        ctx.shape = shape
        ctx.from_fp16 = from_fp16
        ctx.codes_dequant = codes_dequant
        ctx.save_for_backward(packed)
        if legacy and x.requires_grad:
            # bnb < 0.43.2: ``ctx.tensors = (A, B)`` — a plain attribute, never used in backward
            # and not released by it: the input lives as long as the graph does
            ctx.legacy_input = x
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        w = _dequantize_torchao(ctx.shape, grad) if ctx.codes_dequant else \
            _dequantize(ctx.shape, grad, ctx.from_fp16, ctx.saved_tensors[0])
        return grad @ w, None, None, None, None, None, None, None


QUANT_STATE_BUFFERS = ("absmax", "absmax2", "code", "code2", "quantization_factor")
"""The twin's buffers that are the quantization state (bitsandbytes: attributes of the weight)."""


def is_quant_state(name: str) -> bool:
    """Whether the buffer named ``name`` (dotted, as ``named_buffers`` gives it) is a 4-bit
    twin's quantization state."""
    return name.rsplit(".", 1)[-1] in QUANT_STATE_BUFFERS


class Linear4bitSim(torch.nn.Module):
    """Memory twin of ``bnb.nn.Linear4bit`` (frozen, packed 4-bit weight)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, compute_dtype: torch.dtype,
                 double_quant: bool, device: torch.device | str = "meta",
                 legacy: bool = False, from_fp16: bool = False,
                 quant_storage: torch.dtype = torch.uint8, lib: str = "bnb",
                 compiled: bool = False, stored: bool = False) -> None:
        super().__init__()
        self.legacy, self.from_fp16 = legacy, from_fp16
        # loaded packed from a checkpoint stored 4-bit: its loading quantizes nothing
        self.stored = stored
        # torch.compile fuses torchao's dequantization into one kernel writing the weight: the
        # int64 codes of the eager one are never made
        self.codes_dequant = lib != "bnb" and not compiled
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = compute_dtype
        n = in_features * out_features
        blocks = math.ceil(n / BNB_4BIT_BLOCK)
        kw = {"device": device}
        if quant_storage == torch.uint8:
            self.register_buffer("weight_packed",
                                 torch.empty((n + 1) // 2, 1, dtype=torch.uint8, **kw))
        else:
            # ``bnb_4bit_quant_storage=bfloat16`` (what FSDP/ZeRO-3 QLoRA needs): the packed bytes
            # viewed as a frozen parameter of that dtype, which FSDP flattens and shards like
            # any other; the quantization state below stays whole on every rank (bitsandbytes
            # keeps it as a Python attribute, not a parameter)
            per = torch.empty((), dtype=quant_storage).element_size()
            self.weight_packed = torch.nn.Parameter(
                torch.empty(-(-((n + 1) // 2) // per), 1, dtype=quant_storage, **kw),
                requires_grad=False)
        self.register_buffer("code", torch.empty(16, dtype=torch.float32, **kw))
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, **kw))
            nested = math.ceil(blocks / BNB_NESTED_BLOCK)
            self.register_buffer("absmax2", torch.empty(nested, dtype=torch.float32, **kw))
            self.register_buffer("code2", torch.empty(256, dtype=torch.float32, **kw))
        else:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32, **kw))
        if lib == "torchao-0.1":
            # torchao 0.1's double_quantize_scalers keeps ``quantization_factor[:, 0]``, a view
            # of the factor expanded to every block: bf16 per block of 64 stays allocated
            self.register_buffer("quantization_factor",
                                 torch.empty(blocks, dtype=torch.bfloat16, **kw))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=compute_dtype, **kw),
                                       requires_grad=False) if bias else None

    @property
    def weight(self) -> torch.Tensor:  # PEFT reads .weight.dtype/.shape of the base layer
        return self.weight_packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)  # bnb Linear4bit.forward casts to compute_dtype
        y = _MatMul4BitSim.apply(x, self.weight_packed, self.bias, self.out_features,
                                 self.in_features, self.legacy, self.from_fp16,
                                 self.codes_dequant)
        return y.to(inp_dtype)


def quantize_linears_4bit(model: torch.nn.Module, compute_dtype: torch.dtype, double_quant: bool,
                          skip: set[str], legacy: bool = False, from_fp16: bool = False,
                          quant_storage: torch.dtype = torch.uint8, lib: str = "bnb",
                          compiled: bool = False, patterns: list[str] | None = None,
                          stored: bool = False) -> int:
    """Replace every frozen ``nn.Linear`` (also PEFT base layers) except ``skip`` by the twin;
    with ``patterns`` (a checkpoint's ``llm_int8_skip_modules``) those decide what stays 16-bit,
    matched as transformers matches them, instead of ``skip``."""
    from transformers.pytorch_utils import Conv1D

    from trainfit.model.stored_quant import keeps_16bit

    count = 0
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            # transformers 5 converts exactly nn.Linear (integrations/bitsandbytes.py
            # replace_with_bnb_linear: ``type(module) is nn.Linear``): a subclass stays as it is
            # — Falcon's FalconLinear layers stay 16-bit, Llama-4's router (a Linear returning
            # scores and logits) keeps its own forward.  Lightning Fabric's BitsandbytesPrecision
            # (the fp16-quantizing stack, ``from_fp16``) converts every isinstance(nn.Linear)
            linear = isinstance(child, torch.nn.Linear) if from_fp16 else \
                type(child) is torch.nn.Linear
            # and GPT-2's Conv1D (``isinstance(module, Conv1D)``, weight (in, out)): converted to
            # a Linear4bit of the same features by transformers 5, not by Lightning (an audit:
            # GPT-2 QLoRA planned exactly as its LoRA, every weight 16-bit)
            conv1d = lib == "bnb" and not from_fp16 and isinstance(child, Conv1D)
            # matched by the name transformers' quantizer sees: peft's wrapper adds
            # ``.base_layer`` (a review: T5's keep-in-fp32 ``wo`` under LoRA became
            # ``…wo.base_layer``, was made 4-bit, and T5 cast its hidden state to uint8)
            named = {full, full.replace(".base_layer", "")}
            if patterns is not None:
                kept = any(keeps_16bit(n, patterns) for n in named)
            else:
                kept = any(n in skip or any(n.endswith("." + s) for s in skip) for n in named)
            if (linear or conv1d) and not kept and not child.weight.requires_grad:
                features = tuple(child.weight.shape) if conv1d else (child.in_features,
                                                                      child.out_features)
                setattr(mod, child_name, Linear4bitSim(
                    *features, child.bias is not None,
                    compute_dtype, double_quant, device=child.weight.device, legacy=legacy,
                    from_fp16=from_fp16, quant_storage=quant_storage, lib=lib,
                    compiled=compiled, stored=stored))
                count += 1
    return count


class Adam8bitSim(torch.optim.Optimizer):
    """Allocates what bnb's (Paged)AdamW8bit / PagedAdamW32bit allocate; updates in place."""

    def __init__(self, params: Any, *, bits: int, paged: bool, lr: float = 1e-4) -> None:
        super().__init__(params, {"lr": lr})
        self.bits, self.paged = bits, paged
        self.managed_ctx: Any = None
        self._qmaps: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    with self.managed_memory(p):
                        self._init_state(p, st)
                # the fused bnb kernel updates states and weight in place: no temporaries, one
                # kernel a parameter, timed from the bytes it moves
                states = [st[k] for k in ("state1", "state2", "absmax1", "absmax2") if k in st]
                bnb_optimizer_update_(_local(p), _local(p.grad), [_local(t) for t in states])

    def managed_memory(self, p: torch.Tensor) -> Any:
        """Paged states live in CUDA managed memory: the simulator swaps in a context that
        books them apart from the allocator's bytes."""
        import contextlib

        if self.paged and p.numel() >= BNB_PAGED_MIN_NUMEL and self.managed_ctx is not None:
            return self.managed_ctx()
        return contextlib.nullcontext()

    def _init_state(self, p: torch.Tensor, st: dict[str, Any]) -> None:
        n = p.numel()
        eight = self.bits == 8 and n >= BNB_MIN_8BIT_SIZE
        dtype = torch.uint8 if eight else torch.float32
        st["state1"] = torch.zeros_like(p, dtype=dtype)
        st["state2"] = torch.zeros_like(p, dtype=dtype)
        if eight:
            blocks = math.ceil(n / BNB_8BIT_BLOCK)
            st["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
            st["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
            if not self._qmaps:
                self._qmaps = [torch.zeros(256, dtype=torch.float32, device=p.device)
                               for _ in range(2)]


def linear_subclass_params(model: torch.nn.Module) -> dict[str, int]:
    """Parameters of the layers that subclass ``nn.Linear`` (Falcon's ``FalconLinear``), by class
    name: transformers 5's 4-bit conversion replaces ``type(module) is nn.Linear`` only
    (integrations/bitsandbytes.py ``replace_with_bnb_linear``), so under QLoRA these load, and
    are planned, in 16 bits (:func:`quantize_linears_4bit`)."""
    out: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear:
            name = type(m).__name__
            out[name] = out.get(name, 0) + sum(p.numel() for p in m.parameters(recurse=False))
    return out


def linear_subclass_params_of(source: Any) -> dict[str, int]:
    """:func:`linear_subclass_params` of the source's model as its configuration builds it
    (:func:`trainfit.model.workload.bare_model_on_meta`); empty for the user's own module or a
    configuration transformers cannot build."""
    from trainfit.model.workload import bare_model_on_meta

    model = bare_model_on_meta(source)
    return {} if model is None else linear_subclass_params(model)
