"""plan's loading without weights, inside the user's process (armed by :mod:`trainfit.script.hooks`
when the mode is ``plan``): ``from_pretrained`` runs as transformers wrote it with the model left
on the meta device, a ``device_map`` string is placed by transformers' own code on the planned
GPU, and moving a meta model to a device keeps it where it is."""

from __future__ import annotations

from typing import Any

from trainfit.script.hooks import _st, refuse


def meta_loading(mu: Any) -> None:
    """from_pretrained without weights: the checkpoint is neither resolved nor read, the model stays
    on the meta device where transformers builds it (its weights would be loaded into it next)."""
    import torch  # lazy: transformers has imported it
    from transformers.utils.loading_report import LoadStateDictInfo

    mu._get_resolved_checkpoint_files = lambda *a, **k: (None, None)

    def load(model: Any, state_dict: Any, checkpoint_files: Any, load_config: Any,
             expected_keys: Any = None) -> Any:
        return LoadStateDictInfo(missing_keys=set(), unexpected_keys=set(), mismatched_keys=set(),
                                 error_msgs=[], conversion_errors={}, skipped_pp_keys=set()), None

    def finalize(model: Any, load_config: Any, loading_info: Any) -> Any:
        model.tie_weights()  # what loading does last: shared embeddings stay one parameter
        return loading_info

    mu.PreTrainedModel._load_pretrained_model = staticmethod(load)
    mu.PreTrainedModel._finalize_model_loading = staticmethod(finalize)
    orig_dtype = mu._get_dtype

    def get_dtype(dtype: Any, checkpoint_files: Any, config: Any, *a: Any, **k: Any) -> Any:
        if dtype == "auto" and checkpoint_files is None and getattr(config, "dtype", None) is None:
            # transformers would read the weights' dtype from the checkpoint's header; without
            # it, float32 (transformers' default before 5.0), stated by the reader
            dtype = torch.float32
        return orig_dtype(dtype, checkpoint_files, config, *a, **k)

    mu._get_dtype = get_dtype
    _place_on_planned_gpu(mu)
    _keep_meta_models(torch)


def _place_on_planned_gpu(mu: Any) -> None:
    """A ``device_map`` string ("auto", "balanced", "sequential") is placed by transformers' own
    code on the planned GPU (its free memory: hook_max_memory); modules it puts on the CPU or
    disk are refused — a silent offload trains 10-100× slower (seed 001)."""
    orig = mu._get_device_map

    def get_device_map(model: Any, device_map: Any, max_memory: Any, hf_quantizer: Any) -> Any:
        st = _st()
        if not isinstance(device_map, str):
            return orig(model, device_map, max_memory, hf_quantizer)
        if st.gpu is None:
            st.device_maps.append({"asked": device_map, "checked": False})
            return {"": 0}
        if hf_quantizer is not None:  # bitsandbytes raises on an offload: the names are said here
            hf_quantizer.validate_environment = lambda *a, **k: None
        try:
            placed = orig(model, device_map, max_memory, hf_quantizer)
        finally:
            if hf_quantizer is not None:
                del hf_quantizer.validate_environment
        off = [n for n, d in placed.items() if str(d) in ("cpu", "disk")]
        st.device_maps.append({"asked": device_map, "checked": True, "gpu": st.gpu["name"],
                               "offloaded": off, "max_memory": max_memory})
        if off:
            names = ", ".join(n or "<all>" for n in off[:6]) + (f" (+{len(off) - 6} more)"
                                                                  if len(off) > 6 else "")
            cap = "" if not max_memory else f", capped by the script's max_memory={max_memory}"
            refuse(f"device_map={device_map!r} would put {len(off)} module(s) on the CPU of "
                   f"{st.gpu['name']} (transformers' own placement, with "
                   f"{st.gpu['free_bytes'] / 2**30:.2f} GiB free for the weights{cap}): {names}; "
                   "the script would then train 10-100× slower, silently",
                   "load with device_map={'': 0} (everything on the GPU, as trainfit plans it): "
                   "the plan's pick then fits without offload, or it says that nothing fits "
                   "and what would (QLoRA, checkpointing, a smaller batch)")
        return {n: 0 for n in placed}

    mu._get_device_map = get_device_map


def hook_max_memory(acc: Any) -> None:
    """What transformers' placement sees as free memory: the planned GPU (device 0), the host's
    available RAM for the CPU; a ``max_memory`` the script gave caps it, as on the real machine."""
    orig = acc.accelerate_max_memory

    def max_memory(asked: dict[Any, Any] | None = None) -> dict[Any, Any]:
        st = _st()
        if st.gpu is None:
            return orig(asked)
        import psutil  # lazy: only a device_map needs it
        from accelerate.utils import convert_file_size_to_int

        free = int(st.gpu["free_bytes"])
        out: dict[Any, Any] = {0: free, "cpu": psutil.virtual_memory().available}
        for k, v in (asked or {}).items():
            key = 0 if k in (0, "0", "cuda", "cuda:0") else k
            if isinstance(v, str) and v.strip().endswith("%"):
                v = int(free * float(v.strip()[:-1]) / 100)
            elif isinstance(v, str):
                v = convert_file_size_to_int(v)
            out[key] = min(int(v), free) if key == 0 else int(v)
        return out

    acc.accelerate_max_memory = max_memory


def _keep_meta_models(torch: Any) -> None:
    """``model.to(device)`` / ``.cuda()`` of a model on the meta device keeps it there (a dtype
    change still applies): the script's own placement and the Trainer's, on a machine without the
    GPU the plan is for."""
    module = torch.nn.Module
    orig_to, orig_cuda = module.to, module.cuda

    def on_meta(m: Any) -> bool:
        p = next(m.parameters(), None)
        return p is not None and p.device.type == "meta"

    def to(self: Any, *a: Any, **k: Any) -> Any:
        device, dtype, _nb, _fmt = torch._C._nn._parse_to(*a, **k)
        if device is not None and device.type != "meta" and on_meta(self):
            return self if dtype is None else orig_to(self, dtype)
        return orig_to(self, *a, **k)

    def cuda(self: Any, *a: Any, **k: Any) -> Any:
        return self if on_meta(self) else orig_cuda(self, *a, **k)

    module.to = to
    module.cuda = cuda
