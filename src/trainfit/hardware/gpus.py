"""Catalog of GPUs: memory as CUDA reports it, dense peak throughput, bandwidth.

* ``memory_bytes``: the total CUDA gives a process (torch ``total_memory`` ==
  ``cudaMemGetInfo`` total == deviceQuery), i.e. PyTorch's OOM "total capacity".
  nvidia-smi/NVML often show more (T4 15360 vs 15102 MiB, H100 81559 vs ~81090
  MiB: they count driver-reserved memory); that figure is only quoted in
  ``memory_source``.  The CUDA total moves by up to ~0.5 % between drivers.
* ``peak_tflops``: DENSE (no 2:4 sparsity) vendor peaks, TFLOP/s (TOPS for
  int8).  fp32 = non-tensor; tf32 = TF32 tensor; fp16/bf16 = tensor with FP32
  accumulate, the mode mixed-precision training uses (GeForce cards and the A10G
  run it at half the FP16-accumulate rate: RTX 4090 165.2, not 330.3); int8 =
  INT8 TOPS.  None = unsupported.
* ``memory_bandwidth_gbs``/``interconnect_gbs``: GB/s (1e9).  The interconnect
  figure is theoretical, per GPU and per direction: PCIe gen3/4/5 x16 =
  15.75/31.5/63, NVLink2/3/4 = 150/300/450 (half the bidirectional datasheet).
* ``cuda_context_bytes``: what nvidia-smi shows for the process beyond PyTorch's
  caching allocator after a training step, with CUDA lazy module loading (the
  default since PyTorch 1.13 + CUDA 11.7): ``CUDA_CONTEXT_BASE_BYTES`` (515 MiB:
  driver/runtime plus lazily loaded PyTorch/cuBLAS/cuDNN kernels, measured on an
  H100 with torch 2.11 + CUDA 13.0) + the stack the driver reserves for every
  resident thread (1 KiB x max threads/SM x SMs; 216 MiB on an A100, 264 on an
  H100).  The H100 measured 751-779 MiB over 25 configurations (model 779).
  Older stacks' PyTorch OOM reports (in use - allocated - reserved-unallocated)
  were lower: ~500 MiB on A100 40/80GB (model now 731), 460-500 MiB on RTX 4090
  (model now 707); PyTorch issues #107667/#109888 quote 300-400 MiB for a bare
  context.  nvidia-smi's header counts more than the process: NVML's total and
  used include what the driver keeps for itself (H100: 85,520,809,984 vs CUDA's
  85,017,493,504 bytes, measured).  Without lazy loading (CUDA < 11.7, CUDA_MODULE_LOADING=EAGER)
  add ``EAGER_MODULE_LOADING_EXTRA_BYTES``: 460 + 880 MiB reproduces the 1343 MiB
  the Hugging Face docs measured on a V100 with CUDA 11.2.
"""

from __future__ import annotations

import dataclasses
import re

from trainfit.hardware.gpu_catalog import CATALOG as _CATALOG
from trainfit.hardware.spec import (  # noqa: F401  (re-exported)
    CUDA_CONTEXT_BASE_BYTES,
    CUDA_STACK_BYTES_PER_THREAD,
    DTYPES,
    EAGER_MODULE_LOADING_EXTRA_BYTES,
    GENERIC_CUDA_CONTEXT_BYTES,
    GIB,
    MIB,
    PCIE3_X16_GBS,
    PCIE4_X16_GBS,
    PCIE5_X16_GBS,
    GpuSpec,
)

GPUS: dict[str, GpuSpec] = {spec.name: spec for spec in _CATALOG}


def _norm(text: str) -> str:
    """Lower-case key with brand words, separators and GB/GiB/G spelling removed."""
    s = text.lower().replace("_", " ")
    s = re.sub(r"(?<![a-z0-9])(\d+)\s*(?:gib|gb|g)\b", r"\1gb", s)
    s = re.sub(r"\b(?:nvidia|geforce|tesla)\b", " ", s)
    return re.sub(r"[^a-z0-9]+", "", s)


def _build_index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for spec in _CATALOG:
        for key in {_norm(k) for k in (spec.name, spec.display_name, *spec.aliases)}:
            if index.get(key, spec) is not spec:
                other = index[key].name
                raise RuntimeError(f"alias {key!r} names {other} and {spec.name}")
            index[key] = spec
    return index


_INDEX = _build_index()

_GENERIC_RE = re.compile(
    r"^(?:generic[\s:_-]?(?P<a>\d+(?:\.\d+)?)\s*(?P<ua>gib|gb|g)?"
    r"|(?P<b>\d+(?:\.\d+)?)\s*(?P<ub>gib|gb|g))$"
)


GENERIC_CUDA_SHARE = 0.915
"""What CUDA reports of a card sold as "N GB", at the least, as a share of N GiB: the catalog's
smallest, datacenter cards with ECC on (A10G, A10 and L4 24 GB: 21.99 GiB, 0.916; T4 and A2 16
GB: 14.75 GiB, 0.922; GTX 1650 4 GB: 3.81 GiB, 0.952; most others 0.975-0.99; a test recomputes
it from the catalog). A generic card is taken at it, so its capacity is never over-stated (an
over-stated card is the user's OOM; an audit: 0.952 put generic-16gb above a T4)."""


def generic_gpu(gigabytes: float, as_gib: bool = False) -> GpuSpec:
    """A card known only by its advertised size: ``gigabytes`` GB sold, taken as
    :data:`GENERIC_CUDA_SHARE` of that many GiB (a card sold as "N GB" reports less than N GiB to
    CUDA: 3.81-4.00 GiB for 4 GB cards).  Peaks, bandwidth, SMs and compute capability are
    unknown (None); bf16 is assumed supported so a dtype choice is not blocked. ``as_gib``:
    the size was given in GiB (``generic-8GiB``), a capacity taken as it is.
    """
    if not 0 < gigabytes <= 4096:
        raise ValueError(f"generic GPU size must be in (0, 4096] GB, got {gigabytes}")
    size = f"{gigabytes:g}"
    share = 1.0 if as_gib else GENERIC_CUDA_SHARE
    return GpuSpec(
        name=f"generic-{size}gb", display_name=f"Generic {size} GB GPU", aliases=(),
        memory_bytes=int(gigabytes * share * GIB),
        memory_source=f"given: {size} GiB" if as_gib else
        f"ESTIMATE: generic card sold as {size} GB, taken as {gigabytes * share:.2f} GiB as "
        "CUDA would report it (the least share of the sold size the catalog's cards report)",
        peak_tflops=dict.fromkeys(DTYPES),
        memory_bandwidth_gbs=None, bf16_supported=True, compute_capability=None,
        sm_count=None, cuda_context_bytes=GENERIC_CUDA_CONTEXT_BYTES,
        interconnect="unknown", interconnect_gbs=None,
        source="generic: only the memory size is known",
    )


def find_gpu(name: str) -> GpuSpec | None:
    """Look a GPU up by canonical name, alias or display/device name.

    Case-insensitive; spaces, underscores and dashes are equivalent, as are
    "80GB"/"80G"/"80GiB".  "generic-8gb", "8gb", "generic:8GiB" build a generic
    card of 8 GiB.  Bare family names pick the usual variant: "a100" -> A100
    80GB SXM, "v100" -> V100 16GB, "rtx-3080" -> 10GB, "h100" -> SXM.
    Returns None for unknown names.
    """
    text = name.strip().lower()
    if not text:
        return None
    match = _GENERIC_RE.match(text)
    if match:
        size = float(match.group("a") or match.group("b"))
        gib = (match.group("ua") or match.group("ub")) == "gib"  # a capacity given in GiB: as is
        return generic_gpu(size, as_gib=gib) if 0 < size <= 4096 else None
    spec = _INDEX.get(_norm(text))
    if spec is not None:
        return spec
    found = find_gpu_by_device_name(name)
    sized = re.search(r"(\d+)\s*gi?b\b", text)
    if found is not None and sized is not None:
        # a size the card does not have is another card, not this one: "a100-99gb" and
        # "l40s-24gb" were planned as the 79.25 and 44.5 GiB cards in a QA run
        said = int(sized.group(1))
        named = {int(x) for k in (found.name, found.display_name, *found.aliases)
                 for x in re.findall(r"(\d+)\s*gi?b", k.lower())}
        gib, gb = found.memory_bytes / 2**30, found.memory_bytes / 1e9
        if said not in named if named else \
                not any(0.92 * said <= x <= 1.08 * said for x in (gib, gb)):
            return None
    return found


def memory_variants(name: str, spec: GpuSpec) -> list[GpuSpec]:
    """Other catalog cards a bare family name also names, with another memory size: "a100" is
    planned as the A100 80GB SXM, and an A100-40GB owner must be told so (a QA run read "fits"
    for the 80 GB card); "rtx-3080" has 12 and 20 GB variants. Empty for an exact name."""
    typed = re.sub(r"[\s_]+", "-", name.strip().lower())
    # a size given ("a100-40gb", "a100-40g", "rtx-3080-12g") names one card (a review: "40g"
    # listed the 80 GB ones)
    if typed == spec.name or re.search(r"\d[\s-]*g(?:i?b)?\b", typed):
        return []
    # the family as typed ("a100") and as the card it resolved to names it ("3080", "rtx3080" →
    # rtx-3080-10gb: rtx-3080; an audit: those two planned the 10 GB card with no word of the
    # 12 and 20 GB ones)
    found: dict[str, GpuSpec] = {}
    for family in {typed, re.sub(r"-\d+gb(?:-.*)?$", "", spec.name)}:
        pattern = re.compile(re.escape(family) + r"-(\d+)gb(?:-.*)?")
        own = pattern.fullmatch(spec.name)
        # by the size in the name: the 80 GB PCIe card reports a few MiB less than the SXM one
        found.update((g.name, g) for g in GPUS.values()
                     if g is not spec and (m := pattern.fullmatch(g.name))
                     and (own is None or m.group(1) != own.group(1)))
    return list(found.values())


FORM_FACTORS = ("sxm", "pcie", "nvl")
"""The board forms a catalog name ends with: the same chip and memory, another link between GPUs."""


def form_variants(name: str, spec: GpuSpec) -> list[GpuSpec]:
    """Other catalog cards a name without its board form also names: "h100" is planned as the
    H100 SXM (NVLink 4, 450 GB/s) and "a100-80gb" as the A100 80GB SXM, while the PCIe boards
    link their GPUs ~10× slower — every multi-GPU speed rests on it (a review).  Empty for a name
    that gives the form, or a card with one form."""
    family = re.sub(r"[\s_]+", "-", name.strip().lower())
    # a name that gives the board anywhere (a100-pcie-80gb, h100-sxm5, "H100 80GB HBM3": the
    # SXM's device name) names it (a review: the last word alone was read)
    if re.search(r"sxm|pcie|nvl|hbm", family) or spec.name == family:
        return []
    own = spec.name.rsplit("-", 1)
    if len(own) != 2 or own[1] not in FORM_FACTORS:
        return []
    return [g for g in GPUS.values() if g is not spec and g.name.rsplit("-", 1)[0] == own[0]
            and g.name.rsplit("-", 1)[-1] in FORM_FACTORS
            and g.memory_bytes // 2**30 == spec.memory_bytes // 2**30]


# (pattern on the space-separated lower-case device name, candidates); an empty
# candidate tuple marks a known card that is deliberately not in the catalog.
_DEVICE_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # laptop parts run other clocks and often other memory than the desktop card of the same
    # number: only the one laptop card the catalog holds matches, the rest are unknown
    (r"\b3050 laptop\b", ("rtx-3050-laptop-4gb",)),
    (r"\b(?:laptop|mobile|max q)\b", ()),
    (r"\bgh200\b", ("gh200-96gb",)),
    (r"\bb200\b", ("b200",)),
    (r"\bh200 nvl\b", ()),
    (r"\bh200\b", ("h200",)),
    (r"\bh100 nvl\b", ("h100-nvl",)),
    (r"\bh100 pcie\b", ("h100-pcie",)),
    (r"\bh100\b", ("h100-sxm",)),
    (r"\ba100\b.*\bpcie\b|\bpcie\b.*\ba100\b", ("a100-80gb-pcie", "a100-40gb-pcie")),
    (r"\ba100\b", ("a100-80gb-sxm", "a100-40gb-sxm")),
    (r"\bv100s\b", ()),
    (r"\bv100\b.*\bpcie\b|\bpcie\b.*\bv100\b", ("v100-pcie-16gb", "v100-pcie-32gb")),
    (r"\bv100\b", ("v100-16gb", "v100-32gb")),
    (r"\bp100\b", ("p100-16gb",)),
    (r"\bt4\b", ("t4",)),
    (r"\ba10g\b", ("a10g",)),
    (r"\ba10\b", ("a10",)),
    (r"\ba40\b", ("a40",)),
    (r"\ba2\b", ("a2",)),
    (r"\bl40s\b", ("l40s",)),
    (r"\bl40\b", ("l40",)),
    (r"\bl4\b", ("l4",)),
    (r"\brtx 6000 ada\b", ("rtx-6000-ada",)),
    (r"\brtx a6000\b", ("rtx-a6000",)),
    (r"\brtx a5000\b", ("rtx-a5000",)),
    (r"\brtx a4500\b", ("rtx-a4500",)),
    (r"\brtx a4000\b", ("rtx-a4000",)),
    (r"\b3060 ti\b", ("rtx-3060-ti",)),
    (r"\b3060\b", ("rtx-3060-12gb",)),
    (r"\b3070 ti\b", ("rtx-3070-ti",)),
    (r"\b3070\b", ("rtx-3070",)),
    (r"\b3080 ti\b", ("rtx-3080-ti",)),
    (r"\b3080\b", ("rtx-3080-10gb", "rtx-3080-12gb", "rtx-3080-20gb")),
    (r"\b3090 ti\b", ("rtx-3090-ti",)),
    (r"\b3090\b", ("rtx-3090",)),
    (r"\b4060 ti\b", ("rtx-4060-ti-8gb", "rtx-4060-ti-16gb")),
    (r"\b4070 ti super\b", ("rtx-4070-ti-super",)),
    (r"\b4070 ti\b", ("rtx-4070-ti",)),
    (r"\b4070 super\b", ("rtx-4070-super",)),
    (r"\b4070\b", ("rtx-4070",)),
    (r"\b4080 super\b", ("rtx-4080-super",)),
    (r"\b4080\b", ("rtx-4080",)),
    (r"\b4090 d\b", ()),
    (r"\b4090\b", ("rtx-4090",)),
    (r"\b5080\b", ("rtx-5080",)),
    (r"\b5090\b", ("rtx-5090",)),
    (r"\b2080 ti\b", ("rtx-2080-ti",)),
    (r"\b1080 ti\b", ("gtx-1080-ti",)),
    (r"\b1650\b(?! (?:ti|super))", ("gtx-1650-4gb",)),
)

_MEMORY_MISMATCH = 0.10


def find_gpu_by_device_name(
    device_name: str, total_memory_bytes: int | None = None
) -> GpuSpec | None:
    """Map a torch/NVML device name to the catalog.

    ``total_memory_bytes`` (torch ``total_memory`` or NVML total) picks among
    variants sharing a name (V100 16/32GB, A100 40/80GB, RTX 3080 10/12/20GB);
    a size written in the name ("A100-SXM4-80GB") wins over it.  When the
    reported memory is more than 10 % away from the matched entry (e.g. a modded
    48 GB RTX 4090) the entry is returned with the reported memory substituted
    and its name suffixed ``-<N>gb-reported``.
    """
    text = " ".join(re.sub(r"[^a-z0-9]+", " ", device_name.lower()).split())
    text = re.sub(r"\b(\d+) (gb|gib)\b", r"\1\2", text)
    candidates: tuple[str, ...] | None = None
    for pattern, names in _DEVICE_RULES:
        if re.search(pattern, text):
            candidates = names
            break
    if not candidates:
        return None
    specs = [GPUS[n] for n in candidates]
    size = re.search(r"\b(\d+)gi?b\b", text)
    if size and len(specs) > 1:
        sized = [s for s in specs if f"-{size.group(1)}gb" in s.name]
        specs = sized or specs
    if total_memory_bytes is not None and total_memory_bytes > 0:
        spec = min(specs, key=lambda s: abs(s.memory_bytes - total_memory_bytes))
        gap = abs(spec.memory_bytes - total_memory_bytes)
        if gap > _MEMORY_MISMATCH * spec.memory_bytes:
            gib = round(total_memory_bytes / GIB)
            return dataclasses.replace(
                spec,
                name=f"{spec.name}-{gib}gb-reported",
                aliases=(),
                memory_bytes=total_memory_bytes,
                memory_source=f"as reported by the device ({device_name!r}); catalog "
                f"entry {spec.name} has {spec.memory_bytes} B",
            )
        return spec
    return specs[0]


def gpu_names() -> list[str]:
    """Canonical names of the catalog entries (generic cards not included)."""
    return list(GPUS)


def close_gpu_names(name: str, n: int = 3) -> list[str]:
    """Canonical names of the catalog entries whose name or alias is closest to ``name``,
    compared as :func:`find_gpu` reads names (case, separators and GB spelling ignored)."""
    import difflib

    out: list[str] = []
    # the card's model number first ("3090ti": the RTX 3090, not the 3080/3070/3060 Ti that
    # spelling alone ranks closer; an audit), then spelling
    numbers = re.findall(r"\d{3,}", name)
    same = [k for k in _INDEX if numbers and all(x in k for x in numbers)]
    typed = _norm(name)
    same.sort(key=lambda k: -difflib.SequenceMatcher(None, typed, k).ratio())
    for key in [*same, *difflib.get_close_matches(typed, list(_INDEX), n=4 * n,
                                                                cutoff=0.6)]:
        canonical = _INDEX[key].name
        if canonical not in out:
            out.append(canonical)
    return out[:n]


def known_gpu(name: str, said: str, example: str = "--gpu generic-24gb") -> GpuSpec:
    """The catalog card (or generic card) ``name`` reads as, else a JobError naming ``said``
    (``--gpu X`` or ``gpu: X (in job.yaml)``) with the close names or the catalog: the one
    check plan, tune, train and doctor make (a re-read: doctor had its own words for it).
    ``example``: a generic card as the caller takes one (a job file's ``gpu:`` where a command
    has no --gpu: a review)."""
    from trainfit.job import JobError

    spec = find_gpu(name)
    if spec is not None:
        return spec
    if name.strip().lower().startswith("generic"):
        raise JobError(f"{said}: a generic card is generic-<N>gb with N its memory, "
                       "more than 0 and at most 4096", f"e.g. {example}")
    close = close_gpu_names(name)
    # the close names alone where there are some (a review: the whole 50-card catalog after
    # "did you mean" buried the answer)
    raise JobError(f"{said}: unknown GPU",
                   (f"did you mean {', '.join(close)}? " if close else
                    "known: " + ", ".join(gpu_names()) + "; ")
                   + "or generic-<N>gb for a card not listed (`trainfit gpus` lists them "
                   "with their memory)")
