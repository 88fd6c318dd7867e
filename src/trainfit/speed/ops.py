"""What each operation of the simulated step costs: FLOPs, bytes moved, GEMM shape.

Recorded from the same data-less run that predicts memory (a hook of
:class:`trainfit.memory.tracker.LiveBytesTracker`), so the step that is timed is the step that is
simulated.  FLOPs come from ``torch.utils.flop_counter``'s registry (matmuls, attention kernels);
bytes are the sizes of the tensors an op reads and writes (the lower bound of its memory traffic);
ops whose output is a view of an input launch no kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from trainfit.speed.cpu_kernels import replay_key

_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addmm_", "baddbmm_"}
"""GEMM ops (the in-place ``addmm_`` is trl's fp32 accumulation of its chunked head's
gradients, ``model/chunked_head.py``)."""
_CPU_FLASH = "_scaled_dot_product_flash_attention_for_cpu"


def _conv_backward_flops(args: Any) -> float:
    """``convolution_backward``'s FLOPs: each gradient asked for (input, weight) costs what the
    forward does, 2 × output elements × the weight's elements per output channel. torch's
    flop_registry counts the weight gradient as a convolution of the whole input against the
    whole output gradient, ignoring ``groups``: a depthwise conv (Mamba's, 3,328 channels) came
    out 3,328× too costly, and granite-4.0-h at 25 tokens/s (an audit). 0 when the arguments
    are not the expected ones (the registry's count stands)."""
    try:
        grad_out, weight, output_mask = args[0], args[2], args[10]
        per_output = math.prod(weight.shape[1:])
        return 2.0 * grad_out.numel() * per_output * sum(bool(m) for m in output_mask[:2])
    except (IndexError, TypeError, AttributeError):
        return 0.0
RNG_OPS = {"bernoulli_", "bernoulli", "normal_", "uniform_", "native_dropout", "rand", "randn",
           "rand_like", "randn_like", "random_"}
SOFTMAX_OPS = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"}
TRANSCENDENTAL_OPS = {"exp", "log", "tanh", "tanh_backward", "sigmoid",
                      "sigmoid_backward", "silu", "silu_backward", "gelu", "gelu_backward", "erf",
                      "pow", "rsqrt", "sqrt", "sin", "cos", "exp_", "log1p", "expm1"}


def op_class(name: str) -> str:
    """rng / softmax / transcendental / simple: what bounds an elementwise op on a CPU."""
    if name in RNG_OPS:
        return "rng"
    if name in SOFTMAX_OPS:
        return "softmax"
    if name in TRANSCENDENTAL_OPS:
        return "transcendental"
    return "simple"


@dataclass(frozen=True, slots=True)
class OpRecord:
    name: str
    phase: str
    """forward / backward / optimizer (first micro-step only is kept by the recorder)."""
    flops: float
    bytes: float
    dtype: str
    """Floating dtype the op computes in (fp32 / bf16 / fp16 / other)."""
    gemm: tuple[int, int, int, int] | None
    """(batch, M, N, K) for matmuls, to model tile/wave quantization."""
    kernel: bool
    """False for views and metadata ops (no GPU kernel, still eager dispatch cost)."""
    elements: float = 0.0
    """Elements of the largest tensor the op touches (per-element compute on a CPU)."""
    replay: tuple[Any, ...] | None = None
    """For heavy kernels: the op's argument metadata, to time it on this CPU by replay
    (:mod:`trainfit.speed.cpu_kernels`)."""
    seq: int = 0
    """Attention kernels: the key/value sequence length (their efficiency rises with it)."""
    causal: bool = False
    """Attention kernels: causal (a flash kernel skips the masked half; the flop counter does
    not: :func:`trainfit.speed.roofline.op_device_time` halves it)."""
    aligned: bool = True
    """GEMMs: every matrix's rows start on a 16-byte boundary (:func:`gemm_aligned`).  False
    (a 16-bit GEMM with an odd leading dimension, e.g. GPT-2's 50,257-column logits): cuBLAS
    cannot use its vectorized tensor-core kernels (:mod:`trainfit.speed.kernels`)."""
    head_dim: int = 0
    """Attention kernels: the query's head dimension (a kernel with half the work per tile runs
    further below its peak: :class:`trainfit.speed.kernels.Attention`)."""


try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # a torch built without torch.distributed: no FSDP2, no DTensor
    _DTensor = None


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel runs on: a DTensor (an FSDP2 parameter, its gradient and optimizer
    state, sharded over the ranks) reaches the dispatch with its global shape, while each rank's
    kernel reads its local shard — the optimizer step and gradient clipping of 8-rank FSDP were
    timed on the whole model (a 7B model's fused AdamW: 112 GB read instead of 14)."""
    return t._local_tensor if _DTensor is not None and isinstance(t, _DTensor) else t


def _tensors(items: Any) -> list[torch.Tensor]:
    """Tensors among the arguments (DTensors as their local shard, :func:`_local`), one level of
    lists deep (aten ops nest no further); a flat loop instead of a pytree walk: this runs for
    every op of every simulation."""
    out: list[torch.Tensor] = []
    for a in items:
        if isinstance(a, torch.Tensor):
            out.append(_local(a))
        elif isinstance(a, (list, tuple)):
            out.extend(_local(t) for t in a if isinstance(t, torch.Tensor))
    return out


_HALF = (torch.bfloat16, torch.float16)

KERNEL_NAMESPACES = ("aten", "fsdp", "trainfit")
"""Dispatched ops that are kernels: aten's, trainfit's stand-ins for a library's kernel
(``trainfit::dequantize_4bit``, bitsandbytes' dequantization: model/standins.py), and FSDP2's
custom copies around its collectives (``fsdp::split_with_sizes_copy``: the gathered buffer into
each unsharded parameter, after every all-gather; ``fsdp::chunk_cat``: the unsharded gradients
into the reduce-scatter buffer; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) —
opaque to the dispatcher beneath, so they were not timed at all."""

_FUSED_ADAM = {"_fused_adam_", "_fused_adamw_"}


def written_in_place(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     outs: list[torch.Tensor]) -> tuple[list[torch.Tensor], set[int]]:
    """The tensors an op writes in place and does not return — the arguments its schema marks
    written (``Tensor(a!)``) — and the ids of those it only writes (keyword-only, as ``out=``:
    not read; such an op also looked like a view of its inputs).  ``add_`` returns ``self``,
    already an output; the ``_foreach_*_`` ops, the fused optimizers and FSDP2's copies
    (``fsdp::split_with_sizes_copy`` after each all-gather, ``fsdp::chunk_cat`` before each
    reduce-scatter) return nothing, so their writes were not counted — a fused AdamW was read
    4 × the parameter bytes (parameter, gradient, two states) and written 0, where it writes 3
    of them back.  The fused Adam kernels write the gradient back only when unscaling it
    (``grad_scale`` given; aten/src/ATen/native/cuda/fused_adam_utils.cuh stores every operand
    but the gradient otherwise), though the schema marks it written."""
    if not func._schema.is_mutable:
        return [], set()
    name = func._overloadpacket.__name__
    returned = {id(t) for t in outs}
    written: list[torch.Tensor] = []
    write_only: set[int] = set()
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        if name in _FUSED_ADAM and a.name == "grads" and kwargs.get(
                "grad_scale", args[13] if len(args) > 13 else None) is None:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        ts = _tensors([v])
        written.extend(t for t in ts if id(t) not in returned)
        if a.kwarg_only:  # out=, values=, ...: written, not read
            write_only.update(id(t) for t in ts)
    return written, write_only


def _dtype_name(dt: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dt, "other")


def _gemm_operands(name: str, args: tuple[Any, ...]) -> tuple[Any, Any]:
    """The two matrices a GEMM op multiplies: ``addmm``/``baddbmm`` (and their in-place forms)
    take the added term first."""
    return (args[1], args[2]) if name.rstrip("_") in ("addmm", "baddbmm") else (args[0], args[1])


def _gemm_shape(name: str, args: tuple[Any, ...]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a GEMM op."""
    a, b = _gemm_operands(name, args)
    if name.rstrip("_") in ("mm", "addmm"):
        return 1, a.shape[0], b.shape[1], a.shape[1]
    if name.rstrip("_") in ("bmm", "baddbmm"):
        return a.shape[0], a.shape[1], b.shape[2], a.shape[2]
    return None


ALIGN_BYTES = 16
"""cuBLAS/CUTLASS tensor-core kernels load 16 bytes (8 fp16/bf16 elements) per access
(``..._align8`` kernels); a matrix whose leading dimension or start is not a multiple of 16
bytes gets an ``_align1``/``_align2`` kernel (NVIDIA "Matrix Multiplication Background User's
Guide", tensor core requirements; the kernel names in pytorch/pytorch#181718)."""


def _rows_aligned(t: torch.Tensor) -> bool:
    """Whether a matrix (the last two dims) as cuBLAS receives it has 16-byte aligned rows.

    The leading dimension is the stride of the dimension that is not unit-stride (ATen's
    ``prepare_matrix_for_cublas``: a row- or column-major matrix is passed as it is, any other
    layout is first copied contiguous); a batched matrix's batch stride and the storage offset
    must be aligned too."""
    if t.dim() < 2:
        return True
    size = t.element_size()
    (rows, cols), (s_rows, s_cols) = t.shape[-2:], t.stride()[-2:]
    if s_cols == 1 or cols == 1:
        ld = s_rows if rows > 1 else cols
    elif s_rows == 1 or rows == 1:
        ld = s_cols
    else:
        ld = cols  # copied contiguous first
    batch_ok = t.dim() < 3 or t.shape[-3] == 1 or (t.stride()[-3] * size) % ALIGN_BYTES == 0
    return (ld * size) % ALIGN_BYTES == 0 and batch_ok and \
        (t.storage_offset() * size) % ALIGN_BYTES == 0


def gemm_aligned(name: str, args: tuple[Any, ...], out: Any) -> bool:
    """A 16-bit GEMM's operands and result all have 16-byte aligned rows (other dtypes: True,
    their kernels do not use the 16-byte tensor-core loads this is about)."""
    mats = [t for t in (*_gemm_operands(name, args), out) if isinstance(t, torch.Tensor)]
    if not mats or mats[0].dtype not in (torch.float16, torch.bfloat16):
        return True
    try:
        return all(_rows_aligned(t) for t in mats)
    except (RuntimeError, NotImplementedError):  # a layout without strides (sparse, nested)
        return True


def _attention_shape(func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> tuple[int, bool, int]:
    """(key sequence length, is_causal, head_dim) of a scaled-dot-product attention kernel,
    read by argument name from the op's schema (positions differ between forward and backward)."""
    if "attention" not in name:
        return 0, False, 0
    names = [a.name for a in func._schema.arguments]

    def arg(n: str) -> Any:
        if n in kwargs:
            return kwargs[n]
        i = names.index(n) if n in names else -1
        return args[i] if 0 <= i < len(args) else None

    key, query, rows = arg("key"), arg("query"), arg("rows")
    seq = int(key.shape[-2]) if isinstance(key, torch.Tensor) and key.dim() >= 2 else 0
    if rows:
        # a variable-length kernel over ``rows`` (trainfit::flash_varlen_attention, its tokens
        # one row of Σ rows): the rows' length, weighted by their work (Σ rows³ / Σ rows²)
        seq = round(sum(r ** 3 for r in rows) / sum(r * r for r in rows))
    head_dim = int(query.shape[-1]) if isinstance(query, torch.Tensor) and query.dim() >= 1 else 0
    return seq, bool(arg("is_causal")), head_dim


ALLOCATING_ONLY = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                             "new_empty_strided", "empty_permuted"})
"""Ops that take new storage and write nothing: the caching allocator's work, no kernel
(FSDP2's all-gather and reduce-scatter buffers are ``torch.empty``: timed as a write of their
bytes they added 1.4 ms to a 2-layer step's backward)."""


def launches_kernel(name: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> bool:
    """In-place ops and ops with an output in new storage launch a kernel; an output sharing an
    input's storage (views, and _unsafe_view, which is not marked as one) and an uninitialised
    allocation (:data:`ALLOCATING_ONLY`) launch none."""
    if name in ALLOCATING_ONLY:
        return False
    if name.endswith("_") or name.startswith("_foreach") or "fused" in name:
        return True
    in_storages = {id(t.untyped_storage()) for t in ins}
    return any(id(o.untyped_storage()) not in in_storages for o in outs)


FALLBACK_NAMESPACE = "transformers"
"""transformers 5's custom ops for routed experts whose weights ``torch._grouped_mm`` does not
take (not bf16): ``grouped_mm_fallback`` and its backward, opaque to the dispatcher (their Python
loops of ``torch.mm`` never reach it), so their matmuls are recorded from their arguments."""


def grouped_gemms(namespace: str, name: str, args: tuple[Any, ...], out: Any
                  ) -> list[tuple[int, int, int, int]] | None:
    """The (batch, M, N, K) matmuls a grouped matmul runs, None for any other op.

    ``aten::_grouped_mm`` (mat_a, mat_b, offs): one grouped kernel over E experts, rows split
    unevenly between them, modelled as E equal groups (the tile model then sees E × the
    tiles of one expert's share).  Layouts (torch's ``_grouped_mm`` docs): 2-D × 3-D (tokens
    through their expert), 3-D × 2-D, 2-D × 2-D (the weight gradient: a 3-D output, K split
    by offs) and 3-D × 3-D.  The flop counter registers none of them.
    ``transformers::grouped_mm_fallback`` (input [S, K], weight [E, K, N], offs): E separate
    ``torch.mm`` kernels of S/E rows; its backward 2E (grad input and grad weight per expert)."""
    if namespace == FALLBACK_NAMESPACE and name in ("grouped_mm_fallback",
                                                    "grouped_mm_fallback_backward"):
        x, w = args[0], args[1]
        n_exp, k, n = (int(d) for d in w.shape)
        rows = max(1, math.ceil(int(x.shape[0]) / n_exp))
        if name == "grouped_mm_fallback":
            return [(1, rows, n, k)] * n_exp
        return [(1, rows, k, n), (1, k, n, rows)] * n_exp  # grad input, grad weight
    if namespace != "aten" or name != "_grouped_mm" or not isinstance(out, torch.Tensor):
        return None
    a, b = args[0], args[1]
    if a.dim() == 2 and b.dim() == 3:
        n_exp = int(b.shape[0])
        return [(n_exp, max(1, math.ceil(int(a.shape[0]) / n_exp)), int(b.shape[2]),
                 int(a.shape[1]))]
    if a.dim() == 3 and b.dim() == 2:
        n_exp = int(a.shape[0])
        return [(n_exp, int(a.shape[1]), max(1, math.ceil(int(b.shape[1]) / n_exp)),
                 int(a.shape[2]))]
    if a.dim() == 2 and b.dim() == 2:
        n_exp = int(out.shape[0])
        return [(n_exp, int(a.shape[0]), int(b.shape[1]),
                 max(1, math.ceil(int(a.shape[1]) / n_exp)))]
    return [(int(a.shape[0]), int(a.shape[1]), int(b.shape[2]), int(a.shape[2]))]


class KernelCounter(TorchDispatchMode):
    """Counts the aten ops run under it as kernels or views (:func:`launches_kernel`, the rule
    :class:`OpRecorder` records by), while ``active``.  The host measurement
    (:mod:`trainfit.speed.host`) and the CPU's per-op cost (:mod:`trainfit.speed.cpu`) both count
    with it, so their kernel counts and the simulation's are the same kind of number."""

    def __init__(self, active: bool = True) -> None:
        super().__init__()
        self.kernels = 0
        self.views = 0
        self.active = active

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if self.active and func.namespace in KERNEL_NAMESPACES:
            ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if ins or outs:
                if launches_kernel(func._overloadpacket.__name__, ins, outs):
                    self.kernels += 1
                else:
                    self.views += 1
        return out


class OpRecorder:
    """Collects :class:`OpRecord` for the first micro-step's forward/backward and the optimizer."""

    def __init__(self, replay: bool = False) -> None:
        self.ops: list[OpRecord] = []
        self.active = True
        self.replay = replay
        """Keep each kernel's argument metadata so that a CPU prediction can time it by replay
        (off for GPU plans: it costs simulation time and a GPU is not replayed here)."""
        self.dtype_alias: dict[str, str] = {}
        """Dtype names recorded as another: DeepSpeed's fp16 mode is simulated by its bf16 twin
        (the same bytes), whose ops run in fp16 on the GPU (:func:`trainfit.memory.simulate
        .simulate_step`)."""
        self.fsdp_copy_out = True
        """FSDP2's copy of each all-gather into the unsharded parameters
        (``fsdp::split_with_sizes_copy``) is a kernel; off for FSDP1 (``JobSpec.fsdp_flat``),
        whose parameters are views of the gathered flat buffer.  FSDP1's gradient flatten
        (autograd's ``cat`` over those views) stands where FSDP2's ``fsdp::chunk_cat`` is; its
        cast of that flat gradient to a wider reduce dtype, a further pass, is not counted."""
        self.optimizer_partition: tuple[int, bool] | None = None
        """(ranks, fp32 master): DeepSpeed's ZeRO steps the optimizer on this rank's flat
        partition, 1/ranks of every trainable parameter, in fp32 (its master weights), where the
        one-process twin it is simulated by (:func:`trainfit.memory.simulate.simulate_step`)
        steps every parameter in the module's dtype: the optimizer phase's ops are recorded at
        the partition's size, their 16-bit tensors read as fp32 when a master is kept (not in
        fp32 mode, where the module is the master).  Without it a 2-rank ZeRO-3 step's optimizer
        read as much as 8 ranks'."""

    def __call__(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                 phase: str, micro_step: int) -> None:
        if not self.active or phase not in ("forward", "backward", "optimizer") or micro_step:
            return
        packet = func._overloadpacket
        name = packet.__name__
        grouped = grouped_gemms(func.namespace, name, args, out)
        if grouped is not None:
            self._grouped(name, phase, grouped, args)
            return
        if func.namespace not in KERNEL_NAMESPACES:
            return  # prim.device & co. are not dispatched ops in eager mode
        if name == "lift_fresh":
            # FakeTensorMode's lift of a constant made inside it (``torch.tensor(...)``): no op
            # in eager mode.  A process's first simulation lifts constants later ones find
            # cached (TRL's fused head: 4 at the first small simulation only), which made the op
            # lists of two micro-batches differ — an audit's plan ended in a traceback
            return
        if func.namespace == "fsdp" and name == "split_with_sizes_copy" and not self.fsdp_copy_out:
            return
        ins = _tensors(args) + _tensors(kwargs.values())
        outs = [out] if isinstance(out, torch.Tensor) else _tensors(
            out if isinstance(out, (list, tuple)) else ())
        if not ins and not outs:
            return
        written, write_only = written_in_place(func, args, kwargs, outs)
        if write_only:
            ins = [t for t in ins if id(t) not in write_only]
        outs = outs + written
        kernel = launches_kernel(name, ins, outs)
        flops = 0.0
        if packet in flop_registry:
            try:
                flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
            except (TypeError, ValueError, IndexError, RuntimeError):
                flops = 0.0
        if name == "convolution_backward":
            flops = _conv_backward_flops(args) or flops
        elif name in (_CPU_FLASH, _CPU_FLASH + "_backward"):
            q = args[0] if name == _CPU_FLASH else args[1]
            k = args[1] if name == _CPU_FLASH else args[2]
            b, h, s, d = q.shape
            # forward: QK^T and PV (2 matmuls); backward: 5 matmuls (FlashAttention-2, Dao 2023)
            flops = 4.0 * b * h * s * k.shape[-2] * d * (1.0 if name == _CPU_FLASH else 2.5)
        gemm = name in _GEMMS
        shape = _gemm_shape(name, args) if gemm else None
        if gemm and not flops and shape is not None:
            # 2·M·N·K where flop_registry has no entry (the in-place ``addmm_``) or raises
            # (``addmm(out_dtype=float32)``, trl's fp32 accumulation: its registry entry takes
            # no ``out_dtype``): counted 0 before (a review: a full fine-tune's MFU 9 % low)
            flops = 2.0 * math.prod(shape)
        nbytes = float(sum(t.numel() * t.element_size() for t in ins + outs)) if kernel else 0.0
        # a GEMM runs at its operands' rate (an fp32 accumulator of 16-bit products is not an
        # fp32 GEMM); any other op at its first floating tensor's
        floating = [t for t in (_gemm_operands(name, args) if gemm else ins + outs)
                    if isinstance(t, torch.Tensor) and t.is_floating_point()] \
            or [t for t in ins + outs if t.is_floating_point()]
        dtype = _dtype_name(floating[0].dtype) if floating else "other"
        dtype = self.dtype_alias.get(dtype, dtype)
        elements = float(max((t.numel() for t in ins + outs), default=0))
        if phase == "optimizer" and self.optimizer_partition is not None:
            ranks, master = self.optimizer_partition
            if kernel and master:
                # the twin's 16-bit tensors are fp32 on the partition; an 8-bit optimizer's
                # uint8 states and fp32 statistics are what they are
                nbytes = float(sum(t.numel() * (4 if t.dtype in _HALF else t.element_size())
                                   for t in ins + outs))
                if dtype in ("bf16", "fp16"):
                    dtype = "fp32"
            flops, nbytes, elements = flops / ranks, nbytes / ranks, elements / ranks
        seq, causal, head_dim = _attention_shape(func, name, args, kwargs) if flops else (0, False, 0)
        # no replay key for trainfit's stand-ins: the replay runs aten ops only, and built each
        # one's full-size tensors before failing, every prediction (a review: 2.4 s and 0.6 GB
        # for one 32000 × 2048 parameter's bitsandbytes update)
        self.ops.append(OpRecord(name, phase, flops, nbytes, dtype, shape, kernel,
                                 elements, replay_key(f"{name}.{func._overloadname}", args, kwargs)
                                 if kernel and self.replay and func.namespace != "trainfit"
                                 else None, seq, causal,
                                 gemm_aligned(name, args, out) if gemm else True, head_dim))

    def add_partition_copies(self, params: int) -> None:
        """The two dtype conversions DeepSpeed's ZeRO adds to each step of a 16-bit module, over
        this rank's partition of ``params`` trainable parameters (:attr:`optimizer_partition`):
        the reduced 16-bit gradients into the fp32 master's, and the updated fp32 master weights
        back into the module's 16-bit ones (stage 1/2: ``single_partition_of_fp32_groups`` and
        ``bit16_groups_flat``; stage 3: ``fp32_partitioned_groups_flat`` and
        ``fp16_partitioned_groups_flat``) — 2 + 4 bytes per element each."""
        if self.optimizer_partition is None or not self.optimizer_partition[1]:
            return
        elements = params / self.optimizer_partition[0]
        for _ in range(2):
            self.ops.append(OpRecord("_to_copy", "optimizer", 0.0, 6.0 * elements, "fp32", None,
                                     True, elements))

    def _grouped(self, name: str, phase: str, gemms: list[tuple[int, int, int, int]],
                 args: tuple[Any, ...]) -> None:
        """A grouped matmul's GEMMs (:func:`grouped_gemms`), each a kernel with its operands'
        bytes: the dispatcher sees one op for them all, or none of the fallback's loop."""
        size = args[1].element_size()
        dtype = _dtype_name(args[1].dtype)
        dtype = self.dtype_alias.get(dtype, dtype)
        for b, m, n, k in gemms:
            self.ops.append(OpRecord(name, phase,
                                     2.0 * b * m * n * k, float(size * b * (m * k + k * n + m * n)),
                                     dtype, (b, m, n, k), True, float(b * max(m * k, k * n, m * n))))
