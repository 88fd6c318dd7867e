"""Instrumentation injected into someone else's training script (``trainfit doctor -- CMD``).

Armed by ``trainfit/doctor/_site/sitecustomize.py`` when ``TRAINFIT_DOCTOR_OUT`` is set; it waits
for ``import torch`` and then installs global hooks — nothing in the user's code changes:

* step boundary = ``optimizer.step()`` (torch's global optimizer step pre/post hooks);
* forward = the top-level module calls (found in the first step with the global module hooks,
  which are then replaced by hooks on those modules only: a hook on every submodule would cost
  more than the 3 % the doctor allows itself);
* backward = ``torch.autograd.backward`` (``loss.backward()`` goes through it);
* data wait = ``DataLoader`` iterator ``__next__``; host→device copy = ``Tensor.to/.cuda`` of a
  CPU tensor to a GPU outside the model (CUDA only);
* sync points = ``Tensor.item/.tolist/__float__``, ``.cpu()`` of a device tensor,
  ``torch.cuda.synchronize``; logging and checkpoint I/O = ``print``, ``logging``, ``torch.save``.

Steps ``[warmup, warmup + steps)`` are measured and kept in memory; then one step runs under the
PyTorch profiler (op counts, matmul share, device busy time), everything is written as JSON lines
to ``$TRAINFIT_DOCTOR_OUT/doctor.<pid>.jsonl`` and — with ``TRAINFIT_DOCTOR_STOP=1`` — the process
ends (a doctor needs a window of steps, not the whole run). Standard library + torch only.
"""

from __future__ import annotations

import atexit
import builtins
import functools
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

# relative: sitecustomize loads this package under a private name, whatever ``trainfit`` the
# user's interpreter has (another version, or none). Both import only the standard library here
# (opstats imports torch inside its functions), so a process that never trains pays nothing.
from .made_dirs import record_mkdir
from .opstats import start_profile, stop_profile
from .post_import import PostImport
from .split import PhaseClock, StepRecord, synced, timed

ENV_OUT = "TRAINFIT_DOCTOR_OUT"
ENV_WARMUP = "TRAINFIT_DOCTOR_WARMUP"
ENV_STEPS = "TRAINFIT_DOCTOR_STEPS"
ENV_STOP = "TRAINFIT_DOCTOR_STOP"
ENV_PROFILE = "TRAINFIT_DOCTOR_PROFILE"


class _State:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.out_dir = os.environ.get(ENV_OUT, "")
        self.warmup = max(1, int(os.environ.get(ENV_WARMUP, "2")))
        self.steps = max(1, int(os.environ.get(ENV_STEPS, "10")))
        self.stop = os.environ.get(ENV_STOP, "0") == "1"
        self.profile = os.environ.get(ENV_PROFILE, "1") == "1"
        self.clock = PhaseClock()
        self.window = "warmup"  # warmup → measure → profile → done
        self.steps_done = 0
        self.records: list[StepRecord] = []
        self.depth = 0
        self.in_backward = False
        self.roots: dict[int, Any] = {}
        self.recompute_modules: dict[int, Any] = {}
        self.main_root: Any = None
        self.global_handles: list[Any] = []
        self.prof: Any = None
        self.profile_stats: dict[str, Any] | None = None
        self.cuda = False
        self.orig: dict[str, Any] = {}
        self.finished = False
        self.progress_file: Any = None
        self.optimizer_info: dict[str, Any] | None = None
        self.autocast: str | None = None
        """The dtype the measured forwards ran under autocast in (None: not under autocast)."""

    def write(self, obj: dict[str, Any]) -> None:
        if not self.out_dir or os.getpid() != self.pid:
            return  # a forked DataLoader worker: the parent process reports
        try:
            with open(os.path.join(self.out_dir, f"doctor.{self.pid}.jsonl"), "a") as f:
                f.write(json.dumps(obj) + "\n")
        except OSError:
            pass

    def progress(self) -> None:
        """The step count, written as it happens: a command killed (SIGKILL: the OOM
        killer) or ended by ``os._exit`` writes no summary, and its steps were reported as
        "no optimizer.step() call seen" (an audit).  The file stays open (a write and a flush,
        microseconds, between two steps' records)."""
        if not self.out_dir or os.getpid() != self.pid:
            return
        try:
            if self.progress_file is None:
                self.progress_file = open(  # kept open for the run's steps
                    os.path.join(self.out_dir, f"doctor.{self.pid}.progress"), "w")
            # one number, rewritten in place: a --keep-running command's file does not grow
            self.progress_file.seek(0)
            self.progress_file.write(f"{self.steps_done}\n")
            self.progress_file.truncate()
            self.progress_file.flush()
        except OSError:
            pass


_ST: _State | None = None


def arm() -> None:
    """Called from sitecustomize: install now if torch is loaded, else right after its import."""
    global _ST
    if _ST is not None:
        return
    _ST = _State()
    if _ST.out_dir and os.environ.get(ENV_STOP) == "1":
        record_mkdir(_ST.out_dir)  # the stop's empty directories: removed, the command's alone
    _ST.write({"type": "armed", "pid": _ST.pid, "argv": sys.argv[:8],
               "rank": os.environ.get("RANK"), "time": time.time()})
    if "torch" in sys.modules:
        install(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, PostImport({"torch": install}, _install_failed))


def _install_failed(name: str, err: Exception) -> None:
    if _ST is not None:
        _ST.write({"type": "error", "where": "install", "error": repr(err)})


def install(torch: Any) -> None:
    """Hook each part of the step the moment torch is imported (each ``_hook_*`` below is one
    part); outside the measured window every hook returns at once."""
    st = _ST
    assert st is not None
    st.cuda = bool(torch.cuda.is_available())
    st.write({"type": "torch", "version": torch.__version__, "cuda": st.cuda})
    _hook_step_boundary(torch, st)
    _hook_forward_discovery(st)
    _hook_backward(torch, st)
    _hook_data_wait(st.clock)
    _hook_sync_points(torch, st)
    _hook_logging_io(torch, st.clock)
    _hook_clipping(st.clock)
    atexit.register(_finish, torch, "exit")


def _hook_step_boundary(torch: Any, st: _State) -> None:
    """A step ends at ``optimizer.step()``, whose own time is the optimizer phase."""
    # torch's submodules, here and in each _hook_* below: this module is loaded by sitecustomize
    # before the user's script imports torch (or in a process that never does)
    import torch.optim.optimizer as optim_mod

    clock = st.clock

    def opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
        if st.optimizer_info is None:
            d = getattr(opt, "defaults", {})
            st.optimizer_info = {"name": type(opt).__name__, "fused": bool(d.get("fused")),
                                 "foreach": d.get("foreach")}
        if clock.active:
            clock.push("optimizer")

    def opt_post(opt: Any, args: Any, kwargs: Any) -> None:
        if clock.active:
            clock.pop()
            rec = clock.end_step()
        else:
            rec = None
        _step_done(torch, rec)

    optim_mod.register_optimizer_step_pre_hook(opt_pre)
    optim_mod.register_optimizer_step_post_hook(opt_post)


def _hook_forward_discovery(st: _State) -> None:
    """Global module hooks for the first step only: they find the top-level modules (and those
    run again inside backward), which _end_discovery then hooks alone."""
    from torch.nn.modules import module as module_mod  # lazy: see _hook_step_boundary

    def g_pre(mod: Any, args: Any) -> None:
        st.depth += 1
        if st.depth == 1:
            (st.recompute_modules if st.in_backward else st.roots)[id(mod)] = mod

    def g_post(mod: Any, args: Any, out: Any) -> None:
        st.depth -= 1

    # always_call: non-reentrant checkpointing ends a recomputation by raising out of the
    # forward; the depth then stayed one too deep and only the first recomputed layer was found
    # (an audit: recompute measured ~4x low on a 4-layer model)
    st.global_handles = [module_mod.register_module_forward_pre_hook(g_pre),
                         module_mod.register_module_forward_hook(g_post, always_call=True)]


def _hook_backward(torch: Any, st: _State) -> None:
    """``torch.autograd.backward`` (``loss.backward()`` goes through it): the backward phase, one
    micro-step each; ``in_backward`` tells recomputation from a forward."""
    orig_backward = torch.autograd.backward
    timed_backward = timed(st.clock, "backward", orig_backward, "micro_steps")

    @functools.wraps(orig_backward)
    def backward(*a: Any, **k: Any) -> Any:
        st.in_backward = True
        try:
            return timed_backward(*a, **k)
        finally:
            st.in_backward = False

    torch.autograd.backward = backward


def _hook_data_wait(clock: PhaseClock) -> None:
    """The DataLoader iterator's ``__next__``: the data wait, and the loader's worker count."""
    import torch.utils.data.dataloader as dl_mod  # lazy: see _hook_step_boundary

    base_iter = dl_mod._BaseDataLoaderIter
    orig_next = base_iter.__next__
    timed_next = timed(clock, "data_wait", orig_next)

    @functools.wraps(orig_next)
    def next_(self: Any) -> Any:
        if clock.active:
            clock.counters["num_workers"] = self._num_workers  # the loader's setting, for the fix
        return timed_next(self)

    base_iter.__next__ = next_


def _hook_sync_points(torch: Any, st: _State) -> None:
    """Values pulled to the host (``.item()``, ``.tolist()``, ``float(t)``, ``.cpu()`` of a device
    tensor, ``torch.cuda.synchronize``) and, on CUDA, host→device copies."""
    clock = st.clock
    tensor = torch.Tensor
    st.orig["item"] = tensor.item
    for name in ("item", "tolist", "__float__"):
        setattr(tensor, name, synced(clock, getattr(tensor, name)))
    tensor.cpu = synced(clock, tensor.cpu, cond=lambda a: a[0].device.type != "cpu")
    if st.cuda:
        torch.cuda.synchronize = synced(clock, torch.cuda.synchronize, cond=lambda a: True)
        _install_h2d(torch, clock)


def _hook_logging_io(torch: Any, clock: PhaseClock) -> None:
    """``print``, ``logging`` and ``torch.save``: logging and checkpoint I/O."""
    import logging  # lazy: a process that never imports torch is never charged for it

    builtins.print = timed(clock, "logging_io", builtins.print, "log_calls")
    torch.save = timed(clock, "logging_io", torch.save, "save_calls")
    # Logger._log, not handle: findCaller and makeRecord run before handle, over half a
    # log.info's cost, which was left in "other" (an audit: 45 % of it inside handle)
    logging.Logger._log = timed(clock, "logging_io", logging.Logger._log, "log_calls")


def _hook_clipping(clock: PhaseClock) -> None:
    """The optimizer phase includes gradient clipping, as trainfit's own step does."""
    import torch.nn.utils as nn_utils  # lazy: see _hook_step_boundary
    import torch.nn.utils.clip_grad as clip_mod

    clip = timed(clock, "optimizer", clip_mod.clip_grad_norm_)
    clip_mod.clip_grad_norm_ = clip
    nn_utils.clip_grad_norm_ = clip


def _install_h2d(torch: Any, clock: PhaseClock) -> None:
    def to_cuda(a: tuple[Any, ...], k: dict[str, Any]) -> bool:
        for v in (*a[1:], k.get("device")):
            if isinstance(v, torch.device) and v.type == "cuda":
                return True
            if isinstance(v, str) and v.startswith("cuda"):
                return True
            if isinstance(v, torch.Tensor) and v.is_cuda:
                return True
        return False

    for name in ("to", "cuda"):
        fn = getattr(torch.Tensor, name)

        def wrapper(*a: Any, _fn: Any = fn, _timed_fn: Any = timed(clock, "h2d_copy", fn), _name: str = name,
                    **k: Any) -> Any:
            if (not clock.active or clock.phase in ("forward", "backward") or a[0].is_cuda
                    or (_name == "to" and not to_cuda(a, k))):
                return _fn(*a, **k)
            return _timed_fn(*a, **k)

        setattr(torch.Tensor, name, functools.wraps(fn)(wrapper))


def _end_discovery(torch: Any) -> None:
    """After the first step: hooks on the top-level modules only (and on the modules that ran
    again inside backward: activation checkpointing's recomputation)."""
    st = _ST
    assert st is not None
    for h in st.global_handles:
        h.remove()
    st.global_handles = []
    clock = st.clock
    item = st.orig["item"]

    def n_params(m: Any) -> int:
        return sum(p.numel() for p in m.parameters())

    roots = list(st.roots.values())
    st.main_root = max(roots, key=n_params) if roots else None

    def root_pre(mod: Any, args: Any, kwargs: Any) -> None:
        if not clock.active or st.in_backward:
            return
        clock.push("forward")
        clock.count("forwards")
        if mod is not st.main_root:
            return
        ids = kwargs.get("input_ids")
        if ids is None:
            ids = next((a for a in args if isinstance(a, torch.Tensor)
                        and not a.is_floating_point()), None)
        if ids is None:
            return
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and not mask.is_cuda and mask.shape == ids.shape:
            clock.count("tokens", item(mask.sum()))  # non-padding tokens; free on a host tensor
        else:
            clock.count("tokens", ids.numel())

    def root_post(mod: Any, args: Any, kwargs: Any, out: Any) -> None:
        if clock.active and not st.in_backward and clock.phase == "forward":
            clock.pop()

    def dtype_probe(mod: Any, args: Any) -> None:
        # inside the root's forward: accelerate (the HF Trainer's bf16) wraps model.forward in
        # autocast after the root's own pre-hooks ran (a review: read there, it was missed)
        if not clock.active or st.in_backward:
            return
        for dev in ("cuda", "cpu"):  # what the step computes in: doctor's bf16 advice reads it
            if torch.is_autocast_enabled(dev):
                st.autocast = str(torch.get_autocast_dtype(dev)).removeprefix("torch.")
                return

    inner = None if st.main_root is None else next(
        (m for m in st.main_root.modules() if m is not st.main_root
         and any(True for _ in m.parameters(recurse=False))), None)
    if inner is not None:
        inner.register_forward_pre_hook(dtype_probe)
    for m in roots:
        m.register_forward_pre_hook(root_pre, with_kwargs=True)
        m.register_forward_hook(root_post, with_kwargs=True, always_call=True)

    # each module's own start: non-reentrant checkpointing stops a recomputation early by
    # raising out of the forward (torch.utils.checkpoint's _StopRecomputationError), whose
    # post-hook then never ran without always_call, and a shared stack paired later ends with
    # stale starts (an audit: recompute measured ~4x low)
    starts: dict[int, float] = {}

    def re_pre(mod: Any, args: Any) -> None:
        if clock.active and st.in_backward:
            starts[id(mod)] = time.perf_counter()

    def re_post(mod: Any, args: Any, out: Any) -> None:
        t = starts.pop(id(mod), None)
        if t is not None and clock.active and st.in_backward:
            clock.count("recompute_s", time.perf_counter() - t)

    for m in st.recompute_modules.values():
        m.register_forward_pre_hook(re_pre)
        m.register_forward_hook(re_post, always_call=True)


def _step_done(torch: Any, rec: StepRecord | None) -> None:
    st = _ST
    assert st is not None
    st.steps_done += 1
    st.progress()
    if st.steps_done == 1:
        _end_discovery(torch)
    if st.window == "warmup":
        if st.steps_done >= st.warmup:
            st.window = "measure"
            st.clock.start()
    elif st.window == "measure":
        if rec is not None:
            st.records.append(rec)
        if len(st.records) >= st.steps:
            st.clock.active = False
            if st.profile:
                st.window = "profile"
                st.prof = start_profile(st.cuda)
            else:
                st.window = "done"
                _finish(torch, "window")
    elif st.window == "profile":
        st.profile_stats = stop_profile(st.prof, st.cuda)
        st.prof = None
        st.window = "done"
        _finish(torch, "window")


def _calibrate(torch: Any) -> dict[str, float]:
    """Seconds one hook costs, timed here with the real wrappers (see split.calibrate_hook_cost_s)."""
    st = _ST
    assert st is not None
    clock = st.clock
    x = torch.ones(())
    orig_item = st.orig["item"]
    was = clock.active
    clock.start()
    n = 500

    def per_call(fn: Any) -> float:
        vals = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            vals.append((time.perf_counter() - t0) / n)
        return statistics.median(vals)

    sync_s = max(per_call(x.item) - per_call(lambda: orig_item(x)), 0.0)

    def noop() -> None:
        return None

    timed_noop = timed(clock, "logging_io", noop)
    wrapper_s = max(per_call(timed_noop) - per_call(noop), 0.0)
    lin = torch.nn.Identity()
    bare = per_call(lambda: lin(x))
    lin.register_forward_pre_hook(lambda m, a, k: None, with_kwargs=True)
    lin.register_forward_hook(lambda m, a, k, o: None, with_kwargs=True, always_call=True)
    module_s = max(per_call(lambda: lin(x)) - bare, 0.0) + wrapper_s
    clock.active = was
    return {"wrapper_call_s": wrapper_s, "module_call_s": module_s, "sync_call_s": sync_s}


def _finish(torch: Any, why: str) -> None:
    st = _ST
    if st is None or st.finished or os.getpid() != st.pid:
        return
    st.finished = True
    st.clock.active = False
    if st.prof is not None:  # the run ended inside the profiled step: drop it
        try:
            st.prof.__exit__(None, None, None)
        except Exception:
            pass
    for i, r in enumerate(st.records):
        st.write({"type": "step", "index": i, **r.to_dict()})
    root = st.main_root
    params = trainable = weights = None
    cpu_params = None
    if root is not None:
        ps = list(root.parameters())
        params = sum(p.numel() for p in ps)
        trainable = sum(p.numel() for p in ps if p.requires_grad)
        by_dtype: dict[str, int] = {}
        for p in ps:
            k = str(p.dtype).removeprefix("torch.")
            by_dtype[k] = by_dtype.get(k, 0) + p.numel()
        weights = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else None
        cpu_params = sum(p.numel() for p in ps if p.device.type == "cpu")
    peak = total = None
    if st.cuda and torch.cuda.is_initialized():
        peak = torch.cuda.max_memory_allocated()
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    st.write({"type": "summary", "why": why, "steps_seen": st.steps_done,
              "warmup": st.warmup, "steps": st.steps, "measured": len(st.records),
              "calibration": _calibrate(torch) if st.records else None,
              "profile": st.profile_stats, "params": params, "params_on_cpu": cpu_params,
              "trainable_params": trainable, "weights_dtype": weights,
              "autocast_dtype": st.autocast,
              "roots": len(st.roots), "recompute_modules": len(st.recompute_modules),
              "cuda": st.cuda, "cuda_used": bool(st.cuda and torch.cuda.is_initialized()),
              "peak_allocated_bytes": peak, "device_total_bytes": total,
              "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "torch_threads": torch.get_num_threads(), "optimizer": st.optimizer_info})
    if why == "window" and st.stop:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the window is measured; the rest of the run would teach nothing more
