"""Loading a model on the GPU: what quantizing its base weights, or building its layers as copies
of one, leaves behind.

The 4-bit weights are made on the GPU one checkpoint tensor at a time: the tensor arrives in 16
bits and the quantizer packs it there.  Its working tensors are freed into the caching
allocator, which keeps their segments reserved.  The stacks modelled here do not empty the cache
between loading and the first step (transformers' ``from_pretrained`` and Trainer; torchtune
0.1's single-device recipe — its distributed recipes call ``cleanup_before_training``), so the
step's reserved peak starts from that reserve, and the loading can be the run's reserved peak.

The simulation records the loading as history before the step
(:meth:`trainfit.memory.tracker.LiveBytesTracker.history`: it takes and leaves segments in the
allocator replay and never counts in the step's allocated bytes): the base weights in module
order, each one's transients around its packed bytes.  The blocks of one weight of n elements,
per quantizer (the job's ``quant_lib``):

* ``bnb`` — bitsandbytes' ``quantize_4bit`` (bitsandbytes 0.50, backends/cuda/ops.py): one
  kernel writes the packed bytes (n/2) and the fp32 absmax (4 B per block of 64); double
  quantization (functional.quantize_4bit, ``compress_statistics``) subtracts its mean (a second
  fp32 copy) and quantizes that, then drops both.  transformers 5 hands it the checkpoint tensor
  already on the GPU (integrations/bitsandbytes.py ``Bnb4bitQuantize``:
  ``Params4bit(value).to(value.device)``): a 16-bit copy (2n), freed once packed.
* ``torchao`` — torchao ≥ 0.2's ``NF4Tensor.from_tensor`` (torchtune ≥ 0.2): the 16-bit weight;
  ``get_block_absmax`` twice (``blocks.abs()``: 2n, then ``max(dim=1)``'s values and int64
  indices); the scaled blocks (2n); the uint8 codes (n); per chunk of 2^20 elements the
  nearest-code search ``(value - nf4).abs()`` — two (chunk × 16) 16-bit tensors — and
  ``min(dim=-1)``'s values and indices; the packing's two n/2 halves.
* ``torchao-0.1`` — torchao 0.1 (torchtune 0.1.x pins it): the same search without chunks, over
  the whole weight: two (n × 16) 16-bit tensors, 64 B per element (2.9 GB for a Llama-2-7B MLP
  matrix), then ``min``'s values (2n) and int64 indices (8n), and the packing in int64 (4n each).

torchtune's builders (Llama-2's in the 0.1 to 0.5 wheels, Llama-3.1's up to 0.3.0) build the
layers as deep copies of one (``_get_clones``): with ``clone_layers`` the template block is
booked first and freed once the copies exist (its blocks stay cached, in 16 bits as well), and
each copy of an NF4 weight dequantizes it (14 B per element at the peak) and quantizes it again.

Each copied layer also holds its own RoPE cache (:func:`add_rope_caches`).

Not modelled: a 16-bit checkpoint in another dtype than the model's (an fp16 Llama-2 into
bf16) is converted on the GPU (2 B per element more); transformers loads in checkpoint order (the
output head first) and may warm its allocator with one segment the model's size
(``caching_allocator_warmup``, with a ``device_map``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from trainfit.engine.dist import transformer_blocks
from trainfit.hardware.gpus import GpuSpec
from trainfit.job import JobError, JobSpec
from trainfit.memory.allocator import reserve_after_history
from trainfit.memory.depth_trace import Trace
from trainfit.model.source import ModelSource, hidden_size
from trainfit.model.standins import BNB_4BIT_BLOCK, Linear4bitSim, torchao_dequant_events

TORCHAO_CHUNK = 1 << 20
"""torchao ≥ 0.2 ``CHUNK_SIZE``: elements per nearest-code search ("Note: Quantize in Chunks")."""
NF4_CODES = 16
PACKED = ("packed", 0)
"""Where the weight's own packed bytes and quantization state are booked (as parameters)."""


def quantizer_events(quant_lib: str, n: int, double_quant: bool) -> list[tuple[str, int]]:
    """One weight of ``n`` elements quantized from 16 bits: ``(name, bytes)`` allocates a
    transient, ``(name, 0)`` frees it, :data:`PACKED` books the weight's own bytes."""
    scalers = math.ceil(n / BNB_4BIT_BLOCK)
    if quant_lib == "bnb":
        absmax = [("absmax_fp32", scalers * 4)] if double_quant else []
        centred = [("absmax_centred", scalers * 4)] if double_quant else []
        return [("copy16", 2 * n), *absmax, *centred, PACKED,
                *[(k, 0) for k, _ in centred + absmax], ("copy16", 0)]
    # NF4Tensor.from_tensor: double_quantize_scalers, then convert_to_norm_float_weight
    absmax = [("abs", 2 * n), ("max_values", scalers * 2), ("max_indices", scalers * 8),
              ("abs", 0), ("max_indices", 0)]
    head = [("copy16", 2 * n), *absmax, ("max_values", 0),
            *[(k.replace("max", "scaler"), b) for k, b in absmax], ("scaled", 2 * n)]
    tail = [("scaled", 0), ("scaler_values", 0), ("copy16", 0)]
    if quant_lib == "torchao-0.1":
        return [*head, *_search(n), ("high", 4 * n), ("packed64", 4 * n), ("high", 0), PACKED,
                ("scaled", 0), ("indices", 0), ("packed64", 0), ("scaler_values", 0),
                ("copy16", 0)]
    c = min(n, TORCHAO_CHUNK)
    return [*head, ("codes", n), *_search(c), ("chunk_u8", c), ("indices", 0), ("chunk_u8", 0),
            ("high", (n + 1) // 2), PACKED, ("high", 0), ("codes", 0), *tail]


def _search(n: int) -> list[tuple[str, int]]:
    """``quantize_tensor_nearest``: ``(value - nf4).abs()`` then ``.min(dim=-1).indices``; the
    int64 indices are left allocated (the caller frees them)."""
    wide = n * NF4_CODES * 2
    return [("difference", wide), ("absolute", wide), ("difference", 0), ("min_values", 2 * n),
            ("indices", 8 * n), ("min_values", 0), ("absolute", 0)]


def records_loading(job: JobSpec, wrapped: bool) -> bool:
    """The simulation books this job's loading history: QLoRA, or a model built from copies of
    one block (``clone_layers``), on every rank whole (no FSDP or ZeRO, whose loading
    :func:`loading_peak_bytes` states apart, and no FSDP1 wrap, whose own history
    :mod:`trainfit.memory.wrap` records)."""
    return (job.method == "qlora" or job.clone_layers) and job.sharding == "none" and not wrapped


def book_loaded(job: JobSpec, model: torch.nn.Module, tracker: Any,
                book: Callable[[torch.nn.Module], None]) -> None:
    """Book every module's own tensors (``book``) in module order, each 4-bit weight inside its
    quantizer's history.  torchtune (``torchao*``) quantizes twice: the model is built on the
    GPU, each weight quantized from a random 16-bit one, then ``load_state_dict`` quantizes the
    checkpoint's tensor (``.to(device)`` first) into it.  With torchao 0.1, torchtune's
    ``inplace_copy`` makes the new packed tensors the weight's (the first ones are freed: the
    first pass books history stand-ins); torchao ≥ 0.2's own ``copy_`` copies the new pieces into
    the first ones and drops them (the second pass's pieces are history).

    ``clone_layers`` (torchtune's ``TransformerDecoder(layer, num_layers)``):
    one block is built first (the template, as history), then the embeddings, head and norm, then
    ``_get_clones`` deep-copies the template once per layer — a 16-bit tensor is copied, an NF4
    weight is dequantized and quantized again (torchtune's ``clone`` dispatch:
    ``to_nf4(get_original_weight())``) — and the template is freed when the builder returns.
    Checked against torchtune 0.1.1's builder run on this CPU (tests/memory/test_loading.py)."""
    lib = job.quant_lib if job.method == "qlora" else None
    # torchao's second pass: (module, the first pass's stand-ins to free: torchao 0.1 only)
    second: list[tuple[Linear4bitSim, list[tuple[int, int]]]] = []
    layers = copies_of_one(model) if job.clone_layers else []
    in_layers = {id(m) for b in layers for m in b.modules()}
    template: list[tuple[int, int]] = []

    def history_of(module: torch.nn.Module, ids: list[tuple[int, int]], params: bool = False,
                   buffers: bool = True) -> Callable[[], None]:
        """Books the module's own buffers (a 4-bit weight's packed bytes and state) and, with
        ``params``, its parameters, as history blocks whose ids go into ``ids``."""
        own = [t.numel() * t.element_size() for t in
               [*(module.parameters(recurse=False) if params else ()),
                *(module.buffers(recurse=False) if buffers else ())]]
        return lambda: ids.extend((tracker.history(n), n) for n in own)

    def load(module: torch.nn.Module, cloned: bool) -> None:
        if not isinstance(module, Linear4bitSim):
            book(module)
            return
        stand_ins: list[tuple[int, int]] = []
        _quantize(job, module, tracker, history_of(module, stand_ins) if lib == "torchao-0.1"
                  else lambda m=module: book(m), cloned)
        if lib is not None and lib.startswith("torchao"):
            second.append((module, stand_ins))

    for module in layers[0].modules() if layers else ():  # the template
        if isinstance(module, Linear4bitSim):
            _quantize(job, module, tracker, history_of(module, template))
            history_of(module, template, params=True, buffers=False)()  # its bias
        else:
            history_of(module, template, params=True)()
    for module in model.modules():
        if id(module) not in in_layers:
            load(module, False)
    for layer in layers:
        for module in layer.modules():
            load(module, True)
    for uid, n in template:
        tracker.history(n, uid)
    for module, dropped in second:
        # torchao 0.1: the new tensors are the weight's; ≥ 0.2: copied in, then dropped
        _quantize(job, module, tracker, (lambda m=module: book(m)) if lib == "torchao-0.1"
                  else history_of(module, dropped))
        for uid, n in dropped:
            tracker.history(n, uid)


def copies_of_one(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks (:func:`transformer_blocks`) when they are copies of one —
    one class, the same tensors' shapes and dtypes, as torchtune's ``_get_clones`` makes them;
    a :class:`JobError` otherwise (an encoder-decoder's two stacks, BERT's embeddings block, a
    hybrid's two kinds of layer)."""
    blocks = transformer_blocks(model)

    def layout(b: torch.nn.Module) -> tuple[Any, ...]:
        return (type(b), tuple((n, tuple(t.shape), t.dtype) for n, t in
                               [*b.named_parameters(), *b.named_buffers()]))

    kinds = {layout(b) for b in blocks}
    if not blocks or len(kinds) != 1:
        names = sorted({type(b).__name__ for b in blocks}) or ["none found"]
        raise JobError(f"--clone-layers: the model's transformer blocks are not copies of one "
                       f"layer ({len(kinds)} kinds: {', '.join(names)}); "
                       "torchtune builds decoders of identical layers",
                       "drop --clone-layers for this model")
    return blocks


ROPE_CACHE = "torchtune_rope_cache"
"""The buffer :func:`add_rope_caches` gives each block."""


def _rope_shape(source: ModelSource) -> tuple[int, int] | None:
    """(max_position_embeddings, head_dim) of the config, None where either is unknown."""
    cfg = source.config
    positions = getattr(cfg, "max_position_embeddings", None)
    heads = getattr(cfg, "num_attention_heads", None)
    head_dim = getattr(cfg, "head_dim", None) or (hidden_size(source) // heads if heads else None)
    if not (isinstance(positions, int) and positions > 0 and head_dim):
        return None
    return positions, head_dim


LEGACY_ROPE = ("legacy_rope_cos", "legacy_rope_sin")
"""The buffers :func:`add_legacy_rope_caches` gives each block."""
LEGACY_ROPE_MODELS = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "gpt_neox", "phi",
                      "falcon", "stablelm", "starcoder2", "persimmon")
"""Model types whose transformers < 4.40 rotary embedding built the tables (Llama's class or a
copy of it); Gemma, added in 4.38, computed them per forward."""


def add_legacy_rope_caches(model: torch.nn.Module, source: ModelSource, dtype: torch.dtype
                           ) -> None:
    """transformers < 4.40 (``JobSpec.rope_cache``): each attention layer's rotary embedding
    registers ``cos_cached`` and ``sin_cached`` (4.38.2-4.39: ``_cos_cached``/``_sin_cached``) of
    ``(max_position_embeddings, head_dim)`` in ``__init__`` (``_set_cos_sin_cache``), in the
    default dtype of that moment (llama/modeling_llama.py v4.37.2 ``LlamaRotaryEmbedding``;
    Mistral's is a copy).  transformers 5, which the simulation runs, computes cos and sin per
    forward from one ``inv_freq``: each block gets the two tables here (on meta; booked with the
    block's own tensors).  Not modelled: the forward's ``cos_cached[:seq_len].to(x.dtype)`` copy
    per layer (seq_len × head_dim, transient)."""
    rope = getattr(source.config, "rope_parameters", None)
    shape = _rope_shape(source)
    if not isinstance(rope, dict) or getattr(source.config, "alibi", False) or shape is None:
        raise JobError(f"--rope-cache: {source.name} has no rotary position embedding (or its "
                       "config lacks max_position_embeddings / head_dim), so no tables to model",
                       "drop --rope-cache (--rope-cache none)")
    kind = getattr(source.config, "model_type", "")
    if kind not in LEGACY_ROPE_MODELS:
        raise JobError(f"--rope-cache: {kind or source.name}'s rotary embedding kept no tables "
                       "in transformers < 4.40 (or is not known to have)",
                       f"drop --rope-cache; it models {', '.join(LEGACY_ROPE_MODELS)}")
    positions, head_dim = shape
    # partial rotary (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor): tables that wide
    width = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    for block in transformer_blocks(model):
        for name in LEGACY_ROPE:
            block.register_buffer(name, torch.empty(positions, width, dtype=dtype,
                                                     device="meta"), persistent=False)


def add_rope_caches(model: torch.nn.Module, source: ModelSource) -> None:
    """torchtune's RoPE module lives in each layer's attention, and its cache is a buffer of
    ``(max_seq_len, head_dim // 2, 2)`` fp32 values (cos and sin, built in ``rope_init`` whatever
    the default dtype): copied with the layer (``clone_layers``), every layer holds one — 2 MiB a
    layer for Llama-2 (4,096 positions), 64 MiB for Llama-3.1 (131,072: torchtune 0.3.1 shared
    one across layers to save those 2 GiB, PR #1554).  transformers computes cos and sin per
    forward from one small ``inv_freq``, so the model simulated has no such buffer: each block
    gets it here (on meta; booked with the block's own tensors)."""
    shape = _rope_shape(source)
    if shape is None:
        return
    positions, head_dim = shape
    for block in copies_of_one(model):
        block.register_buffer(ROPE_CACHE, torch.empty(positions, head_dim // 2, 2,
                                                      dtype=torch.float32, device="meta"),
                              persistent=False)


def _quantize(job: JobSpec, module: Linear4bitSim, tracker: Any,
              packed: Callable[[], None], cloned: bool = False) -> None:
    """One weight's quantizer history, ``packed`` booking its packed tensors where they are
    made; ``cloned``: quantized from the template's weight dequantized (its 16-bit copy)."""
    n = module.in_features * module.out_features
    # a checkpoint stored 4-bit arrives packed: bitsandbytes' Params4bit.from_prequantized moves
    # the packed bytes and builds the quantization state, no 16-bit copy is ever made
    events = [PACKED] if module.stored else \
        quantizer_events(job.quant_lib, n, hasattr(module, "absmax2"))
    if cloned:  # the dequantized weight is the 16-bit copy the quantizer frees at its end
        events = [("copy16" if k == "weight" else k, b) for k, b in torchao_dequant_events(n)
                  ] + events[1:]
    live: dict[str, tuple[int, int]] = {}
    for name, nbytes in events:
        if (name, nbytes) == PACKED:
            packed()
        elif nbytes:
            live[name] = (tracker.history(nbytes), nbytes)
        else:
            uid, size = live.pop(name)
            tracker.history(size, uid)


def load_reserve(job: JobSpec, trace: Trace | Callable[[], Trace | None] | None,
                 setup_events: int | None, stored: bool = False) -> tuple[int | None, list[str]]:
    """(reserved bytes when the model is loaded, its note) of a job whose loading history is in
    its full trace (events, streams), the first ``setup_events`` of which come before the step;
    (None, []) otherwise. ``stored``: the checkpoint's weights are 4-bit as published."""
    after = reserve_after_history(trace[0], trace[1], setup_events,
                                  expandable=job.expandable_segments) if (
        records_loading(job, False) and isinstance(trace, tuple) and setup_events) else None
    if after is None:
        return None, []
    what = ("the 4-bit weights loaded as stored, packed" if stored else
            f"{job.quant_lib} quantizes each base weight on the GPU" if job.method == "qlora"
            else "built on the GPU")
    if job.clone_layers:
        what += ", the layers deep-copied from one block that is then freed"
    kept = ("the cache is emptied before the first step (empty_cache_before_step): only the "
            "segments live tensors split stay" if job.empty_cache_before_step else
            "no quantizer transient is left cached" if stored else
            f"the {'loading' if job.clone_layers else 'quantizer'}'s freed working memory stays "
            "cached")
    return after[0], [
        f"loading ({what}): "
        f"{after[0] / 2**30:.2f} GiB reserved when the model is loaded, "
        f"{after[1] / 2**30:.2f} GiB of it in use, predicted; {kept} and the step's reserved "
        "peak starts from it"]


def packed_4bit_model_bytes(source: ModelSource, quant_head: bool = False) -> int | None:
    """The whole model as bitsandbytes' 4-bit load holds it: every ``nn.Linear`` weight but the
    output head packed (½ B an element; the head too with ``quant_head``, ``--quant-lm-head``),
    the rest 16-bit (2 B) — counted on the configuration's own model on the meta device; None
    where it cannot be built (the user's own module)."""
    from trainfit.model.workload import bare_model_on_meta  # lazy: builds a model

    model = bare_model_on_meta(source)
    if model is None:
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    # a head tied to the embedding is the embedding's weight: 16-bit whatever is asked (a review;
    # as test_a_tied_head_stays_16bit… and zero.end_parameter_bytes)
    tied = head is not None and embed is not None and head.weight is embed.weight
    packed = sum(m.weight.numel() for m in model.modules()
                 if isinstance(m, torch.nn.Linear) and (m is not head or (quant_head and not tied)))
    return packed // 2 + (sum(p.numel() for p in model.parameters()) - packed) * 2


def loading_peak_bytes(job: JobSpec, source: ModelSource, terms: dict[str, int],
                       quant_state_bytes: int) -> int | None:
    """Sharded QLoRA's loading as transformers 5.23 does it (modeling_utils: a quantized model
    is materialised on every rank, `not is_quantized` excludes it from the meta path): the whole
    packed 4-bit model, its quantization state and the unquantized weights on each rank, plus the
    bf16 weight being quantized (its largest: an MLP matrix; none for a checkpoint stored 4-bit,
    which arrives packed).  The whole model is counted from its configuration: the rank's
    ``terms`` hold a shard (none under --offload all, gathered layers under ZeRO-3 — a review
    found 1.45 GiB said for a 70B's 32 GiB); they are the fallback where the model cannot be
    built.  None for other jobs."""
    if job.method != "qlora" or job.ranks <= 1:
        return None
    cfg = source.config
    h = hidden_size(source)
    inter = next((v for a in ("intermediate_size", "ffn_dim", "n_inner")
                  if isinstance(v := getattr(cfg, a, None), int) and v > 0), 4 * h)
    whole = packed_4bit_model_bytes(source, job.quant_lm_head)
    if whole is None:
        whole = max(0, terms.get("parameters", 0) - quant_state_bytes) * job.ranks
    copy16 = 0 if getattr(source, "stored_quant", None) is not None else h * inter * 2
    return whole + quant_state_bytes + copy16


def loading_notes(job: JobSpec, source: ModelSource, gpu: GpuSpec | None,
                  terms: dict[str, int], quant_state_bytes: int) -> list[str]:
    """Sharded QLoRA's loading, stated as its own peak (not the step's)."""
    load = loading_peak_bytes(job, source, terms, quant_state_bytes)
    if load is None:
        return []
    return [f"loading (its own peak, not in the step's): transformers 5's from_pretrained "
            f"materialises the whole 4-bit model on every rank before the sharding: "
            f"{load / 2**30:.2f} GiB per rank (predicted)"
            + (" — more than the GPU: load rank 0 only (accelerate's "
               "fsdp_cpu_ram_efficient_loading, Answer.AI's fsdp_qlora loader)"
               if gpu is not None and load + (gpu.cuda_context_bytes or 0) > gpu.memory_bytes
               else "")]
