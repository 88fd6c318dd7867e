"""What an older torch's autograd saved for the backward that torch 2.x no longer saves.

torch ≤ 1.10's ``softmax`` and ``log_softmax`` saved their *input* as well as their output
(``SoftmaxBackward0`` / ``LogSoftmaxBackward0`` hold ``SavedVariable self_`` and ``result_`` in
torch 1.10.0's generated ``torch/csrc/autograd/generated/Functions.h``; torch 1.11.0's hold only
``self_scalar_type`` and ``result_``: pytorch/pytorch#65242, "Avoid saving self for softmax and
log_softmax", fixing #64000/#49600). The backward kernels never read it. An eager attention layer
therefore kept its B×H×T×T scores alive beside their probabilities until its backward ran (fp32
under autocast, whose softmax policy casts the scores up first: the cast copy is what was
saved), and a loss kept the logits its log_softmax read.

Which input: the one ``_softmax`` / ``_log_softmax`` receives on this CPU under the imposed CUDA
autocast policy. For 16-bit scores that is autocast's fp32 copy, which torch 1.10 saved for bf16;
for fp16 its CUDA softmax read the fp16 scores itself (``half_to_float``) and saved those, half
as many bytes: held here as the fp32 copy, more, never less. Transformers of that time added an
fp32 extended mask to the scores first (BERT's ``get_extended_attention_mask`` in the model's
dtype), so they were fp32 there anyway.

The simulated stack runs torch 2.13, whose autograd saves the output only. This dispatch mode,
entered outside the live-bytes tracker (the tracker books every op first and recognises the
autograd engine's own gradient sums by the frames above it: a mode between them would hide the
engine), keeps each such input referenced from the op until the op's backward
(``_softmax_backward_data`` / ``_log_softmax_backward_data`` on the same output) has run, as the
old ``SoftmaxBackward0`` node did, or until the output itself is freed (the node released
unused). The input goes at the next op, after the backward's gradient was booked: the node's
saved variables are released after its backward returns. It is entered only for a job with
``JobSpec.softmax_saves_input``, which torch ≤ 1.10's own features bound (job/combinations.py
``check_legacy_torch``): eager attention (no SDPA before 2.0), reentrant checkpointing (the only
kind before 1.11), no torch.compile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

_aten = torch.ops.aten
_FORWARD = (_aten._softmax.default, _aten._log_softmax.default)
_BACKWARD = (_aten._softmax_backward_data.default, _aten._log_softmax_backward_data.default)


def _hooked() -> bool:
    """Saved-tensor hooks are active (non-reentrant checkpointing, activation offloading): what
    the node saves goes through them, not kept as is. torch ≤ 1.10 had no such checkpointing
    (``use_reentrant`` came in 1.11); its reentrant checkpoint runs the forward without grad."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


class SoftmaxInputSaves(TorchDispatchMode):
    """Holds each softmax / log_softmax input that needs a gradient until its backward runs."""

    def __init__(self) -> None:
        super().__init__()
        self._held: WeakIdKeyDictionary = WeakIdKeyDictionary()
        """output storage → the input its node saved (dropped with the output's storage)."""
        self._released: list[torch.Tensor] = []
        """Inputs whose backward ran, dropped at the next op (after its gradient was booked)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._released.clear()
        out = func(*args, **(kwargs or {}))
        if func in _FORWARD:
            x = args[0]
            if torch.is_grad_enabled() and getattr(x, "requires_grad", False) \
                    and not _hooked() and isinstance(out, torch.Tensor):
                self._held[out.untyped_storage()] = x
        elif func in _BACKWARD:
            # the node's saved variables are released after its backward returns, after the
            # gradient it made was allocated — which the tracker, inside this mode, books once
            # this returns: the input goes at the next op
            x = self._held.pop(args[1].untyped_storage(), None)
            if x is not None:
                self._released.append(x)
        return out

    def __exit__(self, *exc: object) -> object:
        self._released.clear()
        return super().__exit__(*exc)

    @property
    def held(self) -> int:
        """How many inputs are held now (for tests)."""
        return len(self._held)


@contextlib.contextmanager
def legacy_saves(enabled: bool) -> Iterator[SoftmaxInputSaves | None]:
    """The mode when ``enabled`` (enter it before the tracker: see the module's docstring)."""
    if not enabled:
        yield None
        return
    with SoftmaxInputSaves() as mode:
        yield mode
