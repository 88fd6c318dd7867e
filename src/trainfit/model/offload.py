"""Activation offloading (``activation_offload``): the tensors autograd saves in the forward pass go
to host memory and come back in the backward pass.

On a GPU the step uses TRL's ``OffloadActivations`` (``trl/models/activation_offloading.py``, itself
torchtune's ``training/_activation_offloading.py``) through ``get_act_offloading_ctx_manager``: the
library's own implementation, with its copy stream and pinned host buffers.

``plan`` runs the step on fake *CPU* tensors, where TRL's manager cannot run: it needs an
accelerator (``torch.accelerator.current_accelerator()``, device streams, pinned memory) and only
offloads tensors on that accelerator. :class:`SimulatedOffload` is therefore a hand-written twin
that reproduces what TRL's manager does to *device memory*, rule for rule (streams mode, its
default), and moves no data (the tensors are fake; the host copy is kept as shape/stride only):

* pack (forward): a saved tensor stays on the device (saved as itself) when it is smaller than
  ``min_offload_size`` (1024 bytes), a ``Parameter`` / ``Buffer`` or the storage of a model
  parameter, or a storage already offloaded and still in the forward stash (TRL's dedup keeps the
  second reference on the device). Otherwise it is offloaded: a non-contiguous view or one at a
  storage offset is cloned first (the clone is what is copied), and the device tensor is kept in
  the forward stash until ``max_fwd_stash_size`` (5) later packs have happened — the copy stream
  must finish before its memory can be reused —, or until the context exits (TRL's ``__exit__``
  clears the stash);
* unpack (backward): a tensor still in the forward stash is handed back as it is; any other comes
  back as a new device tensor, held in the backward stash until a later autograd node that also
  unpacks has run (TRL frees the previous node's tensors in the next node's hook), at once when
  the node's use grew the storage's reference count (TRL's ``record_stream`` path: the other
  holder keeps it), and at the end of the backward pass at the latest;
* the output head runs under a no-op hook pair (TRL's ``NoOpManager`` on ``lm_head``): its input
  stays on the device (offloading what is needed again at once costs a round trip for nothing).
  The loss after the head is offloaded, as in TRL, where the manager wraps the whole
  ``training_step``.

Not reproduced: TRL keys its dedup on (data pointer + offset, dtype) of a storage it does not
keep alive, so on a GPU a later tensor that reuses a freed block's address can be taken for a
duplicate and kept on the device (allocator-dependent). The twin keys on the storage itself, held
by a weak reference (deterministic; a dead storage is no duplicate). With checkpointing the two
agree; without it the twin can offload a few tensors more than such a run. The copies' time is not
modelled (the plan's memory notes say so).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.multiprocessing.reductions import StorageWeakRef

from trainfit.model.chunked_head import ChunkedHeadLM

MIN_OFFLOAD_BYTES = 1024
"""TRL/torchtune ``min_offload_size`` default: smaller saved tensors stay on the device."""
FWD_STASH_SIZE = 5
"""TRL/torchtune ``max_fwd_stash_size`` default: the last packs whose device tensors stay alive."""


def _untyped(t: torch.Tensor) -> torch.UntypedStorage:
    return getattr(t, "_local_tensor", t).untyped_storage()  # a DTensor's local shard


def _storage(t: torch.Tensor) -> int:
    return _untyped(t)._cdata


def _dedup_key(t: torch.Tensor) -> tuple[int, int, torch.dtype]:
    """TRL's ``_get_unique_tensor_key``: (storage pointer + offset, dtype)."""
    return _storage(t), t.storage_offset(), t.dtype


def _use_count(t: torch.Tensor) -> int:
    try:
        return torch._C._storage_Use_Count(_storage(t))
    except (RuntimeError, AttributeError):  # a tensor without a countable storage
        return 0


class _Offloaded:
    """The host side of an offloaded tensor: what the device copy is rebuilt from."""

    __slots__ = ("dtype", "numel", "offset", "shape", "stride")

    def __init__(self, t: torch.Tensor, numel: int) -> None:
        self.shape, self.stride, self.offset = t.size(), t.stride(), t.storage_offset()
        self.dtype, self.numel = t.dtype, numel

    def to_device(self, device: torch.device) -> torch.Tensor:
        flat = torch.empty(self.numel, dtype=self.dtype, device=device)
        return torch.as_strided(flat, self.shape, self.stride, self.offset)


class SimulatedOffload(saved_tensors_hooks):
    """TRL's ``OffloadActivations`` (streams mode) as it acts on device memory; see the module
    docstring for the rules and where they come from."""

    def __init__(self, model: torch.nn.Module, *, min_offload_size: int = MIN_OFFLOAD_BYTES,
                 max_fwd_stash_size: int = FWD_STASH_SIZE, use_streams: bool = True) -> None:
        self.streams = use_streams
        """TRL's ``use_streams`` (its default, True): the stashes and the dedup exist only then."""
        self.min_bytes = min_offload_size
        self.stash_size = max_fwd_stash_size
        # weights and buffers stay (trainfit's bitsandbytes stand-in saves its packed weight, a
        # buffer, through autograd; real bitsandbytes keeps it on its ctx, unseen by the hooks)
        self.param_storages = {_storage(p) for p in (*model.parameters(), *model.buffers())}
        self.tensor_id = 0
        self.saved: dict[int, Any] = {}
        self.fwd_stash: dict[int, torch.Tensor] = {}
        self.stash_keys: dict[tuple[int, int, torch.dtype], tuple[int, StorageWeakRef]] = {}
        """Dedup key → (id of the pack that tracks it, a weak reference to its storage) while that
        tensor is in the stash; the reference keeps the key's address from being reused while
        tracked, and tells a dead storage (no duplicate) from a live one."""
        self.stash_key_of: dict[int, tuple[int, int, torch.dtype]] = {}
        self.bwd_stash: dict[int, tuple[torch.Tensor, int]] = {}
        self.node: Any = None
        self.first_unpack = True
        self.offloaded_bytes = 0
        """Bytes copied to the host (and back) by the last forward (pinned host memory)."""
        self.offloaded_sizes: list[int] = []
        """The bytes of each tensor the last forward copied to the host, in the order packed
        (each its own pinned host tensor: :mod:`trainfit.memory.host_offload`)."""
        super().__init__(self._pack, self._unpack)

    # -- forward -----------------------------------------------------------------------------------
    def _keep(self, t: torch.Tensor, nbytes: int) -> bool:
        if nbytes < self.min_bytes or isinstance(t, torch.nn.Parameter):
            return True
        if hasattr(torch.nn, "Buffer") and isinstance(t, torch.nn.Buffer):
            return True
        return _storage(t) in self.param_storages

    def _pack(self, t: torch.Tensor) -> Any:
        self.tensor_id += 1
        tid = self.tensor_id
        key = _dedup_key(t)
        if self.streams and key in self.stash_keys and not self.stash_keys[key][1].expired():
            # offloaded and still stashed: this reference stays on the device
            self.saved[tid] = t
            self._track(key, tid, t)
            return tid
        if self._keep(t, t.element_size() * t.nelement()):
            self.saved[tid] = t
            return tid
        original = t
        broadcast = 0 in t.stride()
        if not broadcast and (not t.is_contiguous() or t.storage_offset() != 0):
            t = t.clone(memory_format=torch.contiguous_format)
        for old in [i for i in self.fwd_stash if i <= tid - self.stash_size]:
            del self.fwd_stash[old]
            self._untrack(old)
        numel = t.untyped_storage().nbytes() // t.element_size() if broadcast else t.nelement()
        self.saved[tid] = _Offloaded(t, numel)
        self.offloaded_bytes += numel * t.element_size()
        self.offloaded_sizes.append(numel * t.element_size())
        if self.streams:
            self.fwd_stash[tid] = t
            self._track(key, tid, original)
        return tid

    def _track(self, key: tuple[int, int, torch.dtype], tid: int, t: torch.Tensor) -> None:
        self.stash_keys[key] = (tid, StorageWeakRef(_untyped(t)))
        self.stash_key_of[tid] = key

    def _untrack(self, tid: int) -> None:
        key = self.stash_key_of.pop(tid, None)
        if key is not None and self.stash_keys.get(key, (None,))[0] == tid:
            del self.stash_keys[key]

    # -- backward ----------------------------------------------------------------------------------
    def _unpack(self, tid: int) -> torch.Tensor:
        held = self.saved.pop(tid)
        self._untrack(tid)
        if not isinstance(held, _Offloaded):
            return held
        if self.first_unpack and self.streams:
            self.first_unpack = False
            torch.autograd.Variable._execution_engine.queue_callback(self.bwd_stash.clear)
        if tid in self.fwd_stash:
            t = self.fwd_stash[tid]
            self._hook_node(None)
            return t
        t = held.to_device(torch.device("cpu"))
        if not self.streams:
            return t
        self.bwd_stash[tid] = (t, _use_count(t))
        self._hook_node(tid)
        return t

    def _hook_node(self, tid: int | None) -> None:
        node = torch._C._current_autograd_node()
        prev = []
        if node is not None and node != self.node:
            self.node = node
            prev = [i for i in self.bwd_stash if i != tid]

        def hook(outputs: Any, inputs: Any) -> Any:
            if tid is not None and tid in self.bwd_stash:
                t, count = self.bwd_stash[tid]
                if _use_count(t) > count:  # another holder: TRL's record_stream path
                    del self.bwd_stash[tid]
            for i in list(self.fwd_stash):  # in the backward now: the forward stash goes
                del self.fwd_stash[i]
                self._untrack(i)
            for i in prev:
                self.bwd_stash.pop(i, None)
            return outputs

        if node is not None:
            node.register_hook(hook)

    def __enter__(self) -> SimulatedOffload:
        self.saved.clear()
        self.bwd_stash.clear()
        self.stash_keys.clear()
        self.stash_key_of.clear()
        self.tensor_id = 0
        self.node = None
        self.first_unpack = True
        self.offloaded_bytes = 0
        self.offloaded_sizes = []
        return super().__enter__()

    def __exit__(self, *args: object) -> None:
        self.fwd_stash.clear()  # TRL's __exit__ syncs the streams and drops the stash
        super().__exit__(*args)


class _NoOp(saved_tensors_hooks):
    """TRL's ``NoOpManager``: saved tensors stay as they are (the innermost hooks win)."""

    def __init__(self) -> None:
        super().__init__(lambda t: t, lambda t: t)


def _hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF (or PEFT) model the step runs: trainfit's chunked head wraps it."""
    return model.model if isinstance(model, ChunkedHeadLM) else model


def _head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module TRL's manager excludes in an HF model: ``lm_head`` (BERT's MLM head has none:
    TRL excludes nothing there, nor does the twin)."""
    inner = _hf_model(model)
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    head = getattr(base, "lm_head", None)
    return head if isinstance(head, torch.nn.Module) else None


def simulated_offload(model: torch.nn.Module) -> SimulatedOffload:
    """The simulation's offload context for ``model``, the head excluded as TRL does."""
    ctx = SimulatedOffload(model)
    head = _head(model)
    if head is not None:
        noop = _NoOp()
        head.register_forward_pre_hook(lambda *a: noop.__enter__())
        head.register_forward_hook(lambda *a: noop.__exit__(), always_call=True)
    return ctx


class _TrlOffload:
    """TRL's manager, built on the first step and told the model's parameters at every entry:
    it keeps on the device any saved tensor whose address is a parameter's, and FSDP's
    ``fully_shard`` (after the workload is built) frees the full parameters — an activation in a
    reused block would be kept on the device for nothing (TRL's own ``update_model_params``)."""

    def __init__(self, model: torch.nn.Module, make: Callable[..., Any]) -> None:
        self.model = model
        self.make = make
        """TRL's ``get_act_offloading_ctx_manager``."""
        self.ctx: Any = None

    def __enter__(self) -> Any:
        if self.ctx is None:
            self.ctx = self.make(self.model, warn_if_no_head=False)
        self.ctx.update_model_params(self.model)
        return self.ctx.__enter__()

    def __exit__(self, *args: object) -> Any:
        return self.ctx.__exit__(*args)


def trl_offload(model: torch.nn.Module, device: torch.device) -> _TrlOffload:
    """TRL's activation-offloading manager for a model on a GPU (the head excluded by TRL)."""
    from trainfit.job import JobError

    try:
        from trl.models.activation_offloading import get_act_offloading_ctx_manager
    except ImportError:
        raise JobError("--activation-offload needs TRL's OffloadActivations",
                       "pip install 'trainfit[hf]' (trl)") from None
    if (device.index or 0) != torch.cuda.current_device():
        # its copy stream and the tensors it brings back are on the current device
        raise JobError(f"--activation-offload on {device}: TRL's offloading works on the current "
                       "CUDA device only", f"run with CUDA_VISIBLE_DEVICES={device.index} and "
                       "--device cuda")
    # on the HF model under trainfit's chunked head: TRL finds lm_head there
    return _TrlOffload(_hf_model(model), get_act_offloading_ctx_manager)


def with_offload(forward: Callable[[], contextlib.AbstractContextManager[Any]],
                 offload: contextlib.AbstractContextManager[Any] | None
                 ) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """``train_step``'s forward context (autocast) with the offload hooks around it."""
    if offload is None:
        return forward

    @contextlib.contextmanager
    def both() -> Any:
        with offload, forward():
            yield

    return both
