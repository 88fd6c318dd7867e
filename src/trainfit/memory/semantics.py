"""Make a step run on data-less CPU tensors allocate what the same step allocates on the target device.

We simulate on fake tensors of device ``cpu`` rather than fake ``cuda`` tensors: a CPU-only torch
build aborts the process at the first autograd op on a fake ``cuda`` tensor (no CUDA device guard is
registered, see docs/notes/memory-simulation.md), and working around it needs native code.  The
price is that everything the CPU does differently from the GPU must be imposed here, in Python:

* autocast: CUDA's op lists (aten/src/ATen/autocast_mode.h, ``AT_FORALL_*``) replace the CPU's for
  the duration of the simulation, by overriding the ``AutocastCPU`` kernels through
  ``torch.library`` — the same dispatcher level real autocast works at, so casts of ops inside
  composite functions (``einsum`` → ``bmm``) are caught, and casts are recorded by autograd exactly
  as real autocast's are;
* SDPA: the kernel the GPU would pick (cuDNN / flash / memory-efficient / math: chosen in
  :mod:`trainfit.memory.sdpa_choice`) is called explicitly; on a
  fake tensor the composite would fall back to the math kernel, which stores the S×S matrix;
* dropout: CUDA's fused kernel keeps a bool mask (1 byte/element), the CPU path a mask in the input
  dtype (``is_fused_kernel_acceptable`` in aten/src/ATen/native/Dropout.cpp);
* transformers: its packed-sequence check reads position ids, which fake tensors do not have;
  the simulated batch is unpacked, so the check's real answer is returned: ``None`` eager, the
  sequence ids (all zeros) under ``torch.compile``, where transformers cannot skip the mask;
* grouped GEMMs of mixture-of-experts layers (transformers' ``grouped_mm`` experts): torch's
  fake kernel of ``_grouped_mm`` accepts bf16 only, while the CUDA and CPU kernels run any other
  dtype through ``_grouped_mm_fallback`` (aten/src/ATen/native/cuda/GroupedBlas.cpp,
  GroupedMMUtils.h: one output tensor, a GEMM per expert into its rows); a non-bf16 call is
  routed to transformers' own fallback op, which allocates the same output and saves the same
  two inputs for its backward, and has a fake kernel.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch._C import DispatchKey, DispatchKeySet
from torch.utils._pytree import tree_map

from trainfit.memory.flash_attention_2 import (
    interface_as_flash_attention_2,
    unpads,
)
from trainfit.memory.flash_varlen import unpadded_attention
from trainfit.memory.sdpa_choice import AttentionTarget, choose_sdpa_kernel

# --- CUDA autocast policy (torch 2.13 aten/src/ATen/autocast_mode.h) ---------------------------
CUDA_LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
CUDA_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
    "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
    "cdist", "renorm", "logsumexp",
)
CUDA_FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)
CUDA_PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "tensordot", "scatter_add", "stack", "cat", "index_copy",
)
# Ops that only the CPU autocasts: on CUDA they run in the dtype they are given.
CPU_ONLY_AUTOCAST = (
    "_addmm_activation", "_native_multi_head_attention", "conv1d.padding", "conv2d.padding",
    "conv3d.padding", "avg_pool3d", "polar", "quantile", "nanquantile", "trace", "max_pool3d",
    "adaptive_avg_pool3d", "cross_entropy_loss", "ctc_loss.IntList", "ctc_loss.Tensor",
    "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d",
)

_AUTOCAST_CPU = DispatchKeySet(DispatchKey.AutocastCPU)


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class _CudaAutocastPolicy:
    """Python ``AutocastCPU`` kernels that apply CUDA's policy, with CUDA's weight-cast cache."""

    def __init__(self) -> None:
        self._lib: torch.library.Library | None = None
        self._cache: dict[int, tuple[Any, torch.Tensor]] = {}

    def clear_cache(self) -> None:
        self._cache.clear()

    def _cast_lower(self, t: Any, dtype: torch.dtype) -> Any:
        if not _eligible(t) or t.dtype == dtype:
            return t
        # autocast_mode.cpp cached_cast: cache casts of fp32 leaf weights that require grad
        if t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view():
            hit = self._cache.get(id(t))
            if hit is not None and hit[0]() is t:
                return hit[1]
            out = t.to(dtype)
            self._cache[id(t)] = (torch.utils.weak.weakref.ref(t), out)
            return out
        return t.to(dtype)

    def _kernel(self, op: Any, policy: str) -> Any:
        dtype_idx = next(
            (i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None
        )

        composite = torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd")

        def kernel(*args: Any, **kwargs: Any) -> Any:
            if policy == "none" and composite:
                # CUDA has no autocast kernel for it: the dispatcher falls through to its
                # decomposition, whose inner ops are autocast (cross_entropy_loss → log_softmax
                # in the logits' dtype, then nll_loss on fp32: the fp32 copy of the log-probs and
                # its fp32 gradient that a bf16 T5/BERT loss allocates — measured on an H100)
                return op.decompose(*args, **kwargs)
            with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
                if policy == "lower":
                    dt = torch.get_autocast_dtype("cpu")
                    args, kwargs = tree_map(lambda t: self._cast_lower(t, dt), (args, kwargs))
                elif policy == "fp32":
                    args, kwargs = tree_map(
                        lambda t: t.float() if _eligible(t) else t, (args, kwargs)
                    )
                elif policy == "fp32_set_opt_dtype":
                    given = kwargs.get("dtype") if dtype_idx is None or len(args) <= dtype_idx \
                        else args[dtype_idx]
                    if given is None and args and _eligible(args[0]):
                        if dtype_idx is not None and len(args) > dtype_idx:
                            args = (*args[:dtype_idx], torch.float32, *args[dtype_idx + 1:])
                        else:
                            kwargs = {**kwargs, "dtype": torch.float32}
                elif policy == "promote":
                    dts = [t.dtype for t in torch.utils._pytree.tree_leaves((args, kwargs))
                           if _eligible(t)]
                    if dts:
                        widest = torch.float32 if torch.float32 in dts else dts[0]
                        args, kwargs = tree_map(
                            lambda t: t.to(widest) if _eligible(t) else t, (args, kwargs)
                        )
                return op(*args, **kwargs)

        return kernel

    def install(self) -> None:
        lib = torch.library.Library("aten", "IMPL")
        table = (
            [(n, "lower") for n in CUDA_LOWER_PRECISION]
            + [(n, "fp32") for n in CUDA_FP32]
            + [(n, "fp32_set_opt_dtype") for n in CUDA_FP32_SET_OPT_DTYPE]
            + [(n, "promote") for n in CUDA_PROMOTE]
            + [(n, "none") for n in CPU_ONLY_AUTOCAST]
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for name, policy in table:
                base, _, overload = name.partition(".")
                packet = getattr(torch.ops.aten, base, None)
                op = getattr(packet, overload or "default", None) if packet is not None else None
                if op is None:
                    continue
                lib.impl(name, self._kernel(op, policy), "AutocastCPU")
        self._lib = lib

    def uninstall(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        self.clear_cache()


class _DeviceOps:
    """Routes SDPA and dropout to the kernels the target device runs.

    Installed by patching ``torch.nn.functional`` attributes (transformers and ``nn.Dropout`` look
    them up at call time) rather than a ``TorchFunctionMode``: a mode is popped while it handles
    ``Tensor.backward``, so checkpoint recomputation inside backward would escape it and recompute
    different kernels than the forward used.
    """

    def __init__(self, target: AttentionTarget) -> None:
        self.target = target
        self.kernels_used: dict[str, int] = {}
        self._orig_dropout = torch.nn.functional.dropout
        self._orig_sdpa = torch.nn.functional.scaled_dot_product_attention
        self._orig_grouped_mm = getattr(torch.nn.functional, "grouped_mm", None)
        self.compiled_region = False
        """Inside a block traced as ``torch.compile`` traces it (memory/compiled.py): there,
        transformers calls its fallback op itself for non-bf16 experts (``_can_use_grouped_mm``
        is False while Dynamo compiles), with that op's own autograd."""

    def dropout(self, x: torch.Tensor, p: float = 0.5, training: bool = True,
                inplace: bool = False) -> torch.Tensor:
        if self.target.device == "cuda" and training and 0.0 < p < 1.0 and x.numel() > 0:
            return torch.ops.aten.native_dropout(x, p, True)[0]
        return self._orig_dropout(x, p, training, inplace)

    def sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):
            dt = torch.get_autocast_dtype("cpu")
            q, k, v = (t.to(dt) if _eligible(t) else t for t in (q, k, v))
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.to(dt)
        if self.target.expand_kv and q.dim() == k.dim() == v.dim() == 4 \
                and k.size(1) == v.size(1) < q.size(1) and q.size(1) % k.size(1) == 0:
            # torchtune (modules/attention.py, MultiHeadAttention.forward, 0.5.0): k and v
            # [b, n_kv, s, d] → unsqueeze(2).expand(b, n_kv, n_h // n_kv, s, d).flatten(1, 2), a
            # copy at the query heads that SDPA or flex attention keeps for the backward (flex
            # runs outside the compiled layer's graph, behind torch.compiler.disable; in one graph
            # the partitioner keeps the copies too, traced)
            k, v = (t.unsqueeze(2).expand(t.size(0), t.size(1), q.size(1) // t.size(1),
                                          *t.shape[2:]).flatten(1, 2) for t in (k, v))
            enable_gqa = False
        if self.target.flash_attention_2:
            if self.target.device == "cuda" and q.dtype == torch.float32:
                # a model's own flash class casts fp32 inputs to its 16-bit dtype as
                # transformers' function does (FalconFlashAttention2: the autocast dtype —
                # already applied above — else the quantized model's config dtype): bf16 here
                q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
            if unpads(self.target, q, k, attn_mask, self.target.decoder_only):
                # a model's own flash class (Falcon's) calls transformers'
                # _flash_attention_forward with the 2-D padding mask: unpadded as the
                # interface's calls are
                self.kernels_used["flash"] = self.kernels_used.get("flash", 0) + 1
                return unpadded_attention(q, k, v, self.target.padded_rows, dropout_p, True,
                                          scale).transpose(1, 2)
            attn_mask, is_causal, enable_gqa = self._as_flash_attention_2(
                q, k, v, attn_mask, is_causal, enable_gqa)
        kernel = choose_sdpa_kernel(self.target, q, k, attn_mask, dropout_p, enable_gqa, v)
        self.kernels_used[kernel] = self.kernels_used.get(kernel, 0) + 1
        if attn_mask is not None and attn_mask.dtype == torch.bool and \
                (kernel != "math" or self.target.device == "cuda"):
            # what torch's scaled_dot_product_attention does before any kernel
            # (convert_boolean_attn_mask, aten/src/ATen/native/transformers/attention.cpp; cuDNN's
            # variant fills -65504, the same bytes): a float copy in q's dtype, which the kernel
            # keeps for its backward. Handed the bool mask, a sliding-window, chunked or Falcon
            # model's masked layers were each B×L×S×2-4 bytes under (-1.6 … -5.0 % on small CPU
            # steps, ~4 GiB estimated for Mistral-7B v0.1 at 8,192 tokens: an audit). The CPU
            # target's math kernel is the composite itself, which converts it
            attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(
                attn_mask.logical_not(), float("-inf"))
        if kernel == "cudnn":
            need_lse = q.requires_grad or k.requires_grad or v.requires_grad
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                q, k, v, attn_mask, need_lse, dropout_p, is_causal, False, scale=scale)[0]
        if kernel == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale)[0]
        if kernel == "efficient":
            need_lse = q.requires_grad or k.requires_grad or v.requires_grad
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]
        if kernel == "flash_cpu":
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        if self.target.device == "cuda":
            # math on the GPU: torch's math kernel itself (a composite of bmm, softmax, and
            # 16-bit inputs upcast to fp32), whose S×S scores the backward keeps.  Not the
            # public composite: on this machine's fake CPU tensors it takes the CPU flash
            # kernel, which keeps no scores (an fp32 GQA Llama planned for an A100 recorded
            # `_scaled_dot_product_flash_attention_for_cpu`, 2026-11-30).  Its dropout is the
            # CPU's (a mask in the scores' dtype, not CUDA's bool mask: more, never less).
            # Autocast off inside, as CUDA's SDPA wrapper runs it (the inputs cast above, then
            # the kernel with the autocast key excluded): its bmm's stay fp32
            with torch.autocast("cpu", enabled=False):
                return torch.ops.aten._scaled_dot_product_attention_math(
                    q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale,
                    enable_gqa=enable_gqa)[0]
        # math on the CPU target: the composite, as the real CPU step calls it
        return self._orig_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                               is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    def _as_flash_attention_2(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              attn_mask: Any, is_causal: bool, enable_gqa: bool
                              ) -> tuple[Any, bool, bool]:
        """A call that comes straight to SDPA (a model calling it itself, as Falcon does) under
        transformers' ``flash_attention_2`` (``AttentionTarget.flash_attention_2``; calls through
        transformers' attention interface are answered earlier:
        :func:`trainfit.memory.flash_attention_2.interface_as_flash_attention_2`):
        FlashAttention-2 takes fewer key/value heads than query heads itself (multi-query, grouped:
        no repeat, no enable_gqa needed) and is never handed a T×T mask — causality and sliding
        windows are its arguments, padding it unpads by. Falcon-7B's SDPA path passes one key
        head without enable_gqa (torch then runs its math kernel, fp32 probabilities per layer:
        +71 MiB a layer at 512 tokens) and its always-built mask (FalconModel:
        allow_is_causal_skip False). Only a boolean mask is dropped: a float one carries values
        FlashAttention-2 cannot take (ALiBi, a position bias: models transformers refuses
        flash_attention_2 for). Compiled alike: FlashAttention-2 reads a packing from
        position_ids, not from a mask."""
        if self.target.device != "cuda" or self.target.packed or q.dim() != 4 or k.dim() != 4:
            return attn_mask, is_causal, enable_gqa
        q_heads, k_heads = q.shape[-3], k.shape[-3]
        if k_heads != q_heads and q_heads % k_heads == 0 and v.shape[-3] == k_heads:
            enable_gqa = True
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = None
            is_causal = is_causal or (self.target.decoder_only and q.shape[-2] == k.shape[-2])
        return attn_mask, is_causal, enable_gqa

    def grouped_mm(self, mat_a: torch.Tensor, mat_b: torch.Tensor, *,
                   offs: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``torch.nn.functional.grouped_mm`` as the device runs it (see the module doc)."""
        fallback = _grouped_mm_fallback()
        if (fallback is not None and offs is not None and bias is None and out_dtype is None
                and mat_a.dim() == 2 and mat_b.dim() == 3 and mat_a.dtype == mat_b.dtype
                and mat_a.dtype != torch.bfloat16):
            if self.compiled_region:
                return fallback(mat_a, mat_b, offs)
            return _GroupedMmGrads.apply(mat_a, mat_b, offs)
        assert self._orig_grouped_mm is not None  # only installed where torch has it
        return self._orig_grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)


class _GroupedMmGrads(torch.autograd.Function):
    """A non-bf16 grouped matmul with torch's autograd of ``_grouped_mm``: transformers'
    fallback op allocates the output the device's fallback kernel allocates. What is saved and
    made is what torch's generated ``GroupedMmBackward0`` saves and makes: the input only where
    the weight's gradient is wanted, and only the gradients autograd asks for
    (``should_compute_output`` per input, torch/csrc/autograd/generated/VariableType). The
    fallback op's own autograd saves the input always and makes both gradients always — for
    frozen experts (LoRA) an input of tokens × top-k rows kept per grouped matmul and a
    weight-sized gradient per layer that the real step never holds (Mixtral / Qwen3-MoE LoRA
    in fp32: +4.2 … +6.9 % over the same step run on this CPU, where ``F.grouped_mm`` runs
    torch's autograd too: an audit)."""

    @staticmethod
    def forward(ctx: Any, mat_a: torch.Tensor, mat_b: torch.Tensor,
                offs: torch.Tensor) -> torch.Tensor:
        # the input is kept for the weight's gradient alone; the weight (a parameter: keeping it
        # costs nothing) for the input's, and for the fallback's backward op below
        ctx.save_for_backward(mat_a if ctx.needs_input_grad[1] else None, mat_b)
        ctx.offs = offs
        return _grouped_mm_fallback()(mat_a, mat_b, offs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        mat_a, mat_b = ctx.saved_tensors
        fallback = _grouped_mm_fallback()
        if ctx.needs_input_grad[1]:
            # the weight's gradient is wanted (a full fine-tune): transformers' backward op makes
            # both, as the device's kernels do (the input's a [S, K] buffer, the weight's [E, K, N])
            grad_a, grad_b = torch.ops.transformers.grouped_mm_fallback_backward(
                mat_a, mat_b, ctx.offs, grad)
            return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None
        # frozen experts: the input's gradient alone, grad @ Wᵀ per expert ([S, K])
        return fallback(grad, mat_b.transpose(-2, -1), ctx.offs), None, None


def _grouped_mm_fallback() -> Any:
    """transformers' ``grouped_mm_fallback`` op (registered when its MoE integration is
    imported, which every grouped-experts model does), or None."""
    try:
        return torch.ops.transformers.grouped_mm_fallback
    except (AttributeError, RuntimeError):
        return None


def _ones_if_fake(check: Any) -> Any:
    """transformers' mask-skip check ``check(padding_mask, ...)`` answering for a padding mask
    of fake tensors as for no padding mask (all ones: see :func:`device_semantics`)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def skip(padding_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(padding_mask, FakeTensor):
            padding_mask = None
        return check(padding_mask, *args, **kwargs)

    return skip


def _count_flash() -> None:
    """One more flash kernel in the :func:`device_semantics` in force."""
    ops = active_device_ops()
    if ops is not None:
        ops.kernels_used["flash"] = ops.kernels_used.get("flash", 0) + 1


def active_device_ops() -> _DeviceOps | None:
    """The ``_DeviceOps`` of the :func:`device_semantics` in force (None outside one): the
    patched ``scaled_dot_product_attention`` is its method.  Its ``target`` decides the kernels
    a traced graph contains; its ``kernels_used`` counts them."""
    ops = getattr(torch.nn.functional.scaled_dot_product_attention, "__self__", None)
    return ops if isinstance(ops, _DeviceOps) else None


@contextlib.contextmanager
def device_semantics(target: AttentionTarget) -> Iterator[_DeviceOps]:
    """Everything inside runs with the target device's allocation behaviour (see module doc)."""
    from transformers import masking_utils

    policy = _CudaAutocastPolicy() if target.device == "cuda" else None
    ops = _DeviceOps(target)
    orig_clear = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        orig_clear()
        if policy is not None:
            policy.clear_cache()

    with contextlib.ExitStack() as stack:
        if policy is not None:
            policy.install()
            stack.callback(policy.uninstall)
            stack.enter_context(mock.patch.object(torch, "clear_autocast_cache",
                                                  clear_autocast_cache))
        # the simulated batch is unpacked: eager, the check's answer is None (no mask, SDPA's
        # causal kernel); under Dynamo it is the ids themselves, one sequence per row — a
        # B×1×S×S mask per step, a float copy of it per layer and, with a mask, k and v expanded
        # to the query heads (transformers' repeat_kv): up to 3.8 % of a small compiled step on
        # this CPU that the simulation did not hold (an audit)
        # a padding-free batch (target.packed) of several sequences: the check runs (a cumsum of
        # position_ids' restarts; its one-sequence exit reads values, skipped on fake tensors)
        packed = (lambda position_ids: torch.zeros_like(position_ids)) if target.compiled \
            else (lambda position_ids: None)
        if target.compiled or not target.packed:
            stack.enter_context(mock.patch.object(
                masking_utils, "find_packed_sequence_indices", packed))
        # a batch with a mask (padded): that mask is materialised (the bidirectional one, and
        # the causal one where it is the decoder's: AttentionTarget.batch_mask_causal)
        keep = {"_ignore_causal_mask_sdpa": target.batch_mask_causal,
                "_ignore_bidirectional_mask_sdpa": target.batch_mask}
        if not target.compiled:
            # a padding mask of fake tensors: transformers cannot read it (``is_tracing`` is
            # true for a fake tensor) and materialises the mask SDPA would not have been handed.
            # Unpadded data, it is a mask of ones the model made itself — BART's decoder builds
            # ``torch.ones(B, T)`` when no decoder mask is given, and with real values the check
            # (``fast_all``) skips it: SDPA's causal kernel, no B×1×T×T mask, nor its float copy
            # each decoder layer's kernel keeps for the backward (+1.07 % on a small BART fp32
            # step against the same step run on this CPU: an audit). Answered as for no mask.
            # Under torch.compile (torch < 2.14) transformers never skips a given padding mask
            for name in ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa"):
                orig = getattr(masking_utils, name, None)
                if orig is not None and not keep[name]:
                    stack.enter_context(mock.patch.object(
                        masking_utils, name, _ones_if_fake(orig)))
        if target.flash_attention_2 and target.device == "cuda":
            from transformers.integrations.sdpa_attention import sdpa_attention_forward
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            # the instance's own mapping, which get_interface reads before the global one
            stack.enter_context(mock.patch.dict(
                ALL_ATTENTION_FUNCTIONS._local_mapping,
                {"sdpa": interface_as_flash_attention_2(sdpa_attention_forward, target,
                                                         _count_flash)}))
        stack.enter_context(mock.patch.object(torch.nn.functional, "scaled_dot_product_attention",
                                              ops.sdpa))
        stack.enter_context(mock.patch.object(torch.nn.functional, "dropout", ops.dropout))
        if ops._orig_grouped_mm is not None:
            stack.enter_context(mock.patch.object(torch.nn.functional, "grouped_mm",
                                                  ops.grouped_mm))
        yield ops
