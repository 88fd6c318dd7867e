"""The job specification every command shares: what to train and how (one typed object).

Read from YAML (``JobSpec.from_yaml``) or CLI flags with the same names (dashes for underscores).
Validation happens in ``__post_init__`` and raises ``JobError`` whose message names the field, what
is wrong, and how to fix it; the CLI prints it as one line and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfit.job.choices import (  # re-exported: the schema's vocabularies live there
    ATTENTIONS,
    BASE_DTYPES,
    ENGINE_OFFLOADS,  # noqa: F401  (re-exported; checked in job/combinations.py)
    FSDP_INITS,
    FSDP_VERSIONS,
    GRAD_CKPT,
    METHODS,
    OFFLOADS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PADDINGS,
    PRECISIONS,
    QUANT_LIBS,  # noqa: F401
    QUANTS,  # noqa: F401
    REDUCE_DTYPES,
    ROPE_CACHES,
    SGD_MOMENTUM,
    SHARDINGS,
    JobError,
    _choice,
)
from trainfit.job.combinations import (
    check_flash_attention,
    check_in_backward,
    check_legacy_torch,
    check_padding,
    check_quantization,
    check_sharding,
)
from trainfit.job.validate import check_numbers, check_positive, check_types, resolve_batch

SIZE_FIELDS = ("seq_len", "micro_batch", "grad_accum", "effective_batch", "ranks", "lora_r",
               "lora_alpha", "lm_head_chunk", "prefetch_factor", "zero_reduce_bucket",
               "zero_prefetch_bucket")  # sizes: an integer ≥ 1, or unset


MAX_WORKERS = 256
"""The most data-loader worker processes a job may ask for (a worker is a process)."""
MAX_RANKS = 4096
"""The most data-parallel ranks a job may ask for. trainfit models data parallelism alone (DDP,
FSDP, ZeRO); the largest published runs put tensor and pipeline parallelism under it (Llama 3
405B: 16,384 H100s as 128 data-parallel × 8 tensor × 16 pipeline, Dubey et al. 2024 §3.3.2).
Plan simulates FSDP's sharding with one shard per rank (torch's fully_shard), in time linear in
the ranks: 4,096 take ~20 s a simulation here, 100,000 took minutes with no word (a review)."""


def check_limits(job: Any) -> None:
    """The ranks and loader workers within what trainfit runs: in every job, and on a script's
    flags before the script runs (job.fields.check_given; a review: ``--ranks 5000`` before a
    script was said after it had run)."""
    if isinstance(job.ranks, int) and job.ranks > MAX_RANKS:
        raise JobError(f"--ranks {job.ranks}: more data-parallel ranks than trainfit "
                       f"plans ({MAX_RANKS})", "trainfit models data parallelism only; "
                       "beyond a few thousand GPUs runs add tensor / pipeline parallelism "
                       "(not modelled): e.g. --ranks 512")
    if isinstance(job.num_workers, int) and job.num_workers < 0:
        raise JobError(f"--num-workers {job.num_workers}: must be ≥ 0",
                       "0 loads batches in the training process; e.g. --num-workers 2")
    if isinstance(job.num_workers, int) and job.num_workers > MAX_WORKERS:
        # each worker is a process: a million of them hung train with no output (an audit)
        raise JobError(f"--num-workers {job.num_workers}: more loader processes than "
                       f"trainfit allows ({MAX_WORKERS})",
                       "a few per GPU are plenty: e.g. --num-workers 4")


@dataclass(kw_only=True)
class JobSpec:
    """One training job: the model, the method and every knob that changes memory or speed."""

    model: str = "llama-3.2-1b"
    """Built-in catalog name, HF model id, local model directory or path to a ``config.json``."""
    trust_remote_code: bool = False
    """Allow a model's own Python code from the hub (never implied)."""
    method: str = "full"
    """``full`` (all weights train), ``lora`` (adapters on frozen weights), ``qlora`` (4-bit base)."""
    lora_r: int = 16
    """LoRA rank: memory and trainable parameters grow linearly with it."""
    lora_alpha: int = 32
    """LoRA scale numerator (no memory effect)."""
    lora_dropout: float = 0.05
    """Dropout on the LoRA input: > 0 keeps a mask per adapted layer (1 byte/element on CUDA)."""
    lora_targets: list[str] = field(default_factory=lambda: ["default"])
    """Module names, or aliases q,k,v,o,mlp,lm_head,all-linear; ``default`` = peft's default
    for the model type, or q, v where peft has none (the plan names the layers)."""
    base_dtype: str = "auto"
    """dtype of the frozen base weights of a LoRA/QLoRA job under AMP: auto (transformers 5's
    from_pretrained default: the checkpoint's dtype from config.json; the autocast dtype when the
    config names none), fp32 (loaded without a dtype on transformers < 5: twice the bytes), bf16,
    fp16."""
    quant: str | None = None
    """4-bit format of the frozen base for ``qlora``: nf4, nf4-dq (double quantised), fp4."""
    quant_lib: str = "bnb"
    """The library that holds the 4-bit weights, which decides what loading them leaves in the
    allocator's cache, their quantization state and what each matmul dequantizes: bnb
    (bitsandbytes — transformers, peft, litgpt: a 16-bit copy per weight at load, 2 B per
    element), torchao (torchao ≥ 0.2's NF4Tensor, torchtune ≥ 0.2: the search in chunks of 2^20
    elements at load) or torchao-0.1 (torchtune 0.1.x: its nearest-code search holds 64 B per
    element of a weight at once — 2.9 GB for a Llama-2-7B MLP matrix — and the cache keeps it).
    torchao's matmul dequantizes through int64 codes: 14 B per element at its peak, bnb's 2.
    The loading is replayed where every rank loads the whole model (sharding none)."""
    clone_layers: bool = False
    """The model is built on the GPU from one decoder block deep-copied once per layer
    (torchtune's ``_get_clones`` in its single-device recipes: the Llama-2 builders of 0.1 to
    0.5, Llama-3.1's up to 0.3.0): the template block is freed into the allocator's cache before
    the step (Llama-2-7B in bf16: 0.4 GB), a copy of an NF4 weight dequantizes it and quantizes
    it again, and every layer holds its own fp32 RoPE cache (2 MiB a Llama-2 layer; 64 MiB a
    Llama-3.1 one).  Needs one rank (sharding none) and a decoder whose blocks are copies of
    one."""
    quant_lm_head: bool = False
    """Quantize the output head too (Lightning Fabric/litgpt do; transformers' BitsAndBytesConfig
    leaves it in 16 bits)."""
    kbit_prepared: bool = False
    """QLoRA after peft's prepare_model_for_kbit_training (most QLoRA scripts call it): the
    weights left unquantized — embeddings, norms, the output head — are held in float32."""
    seq_len: int = 512
    """Tokens per sample (padded/packed length)."""
    micro_batch: int | None = None
    """Samples per forward/backward; None lets plan/tune choose."""
    grad_accum: int | None = None
    """Micro-batches per optimizer step; derived from the effective batch when omitted."""
    effective_batch: int | None = None
    """Samples per optimizer step over all ranks = micro_batch × grad_accum × ranks."""
    precision: str | None = None
    """fp32, amp-fp16 (+GradScaler), amp-bf16 (fp32 master weights), bf16-true; None: choose
    (plan leaves amp-fp16 out on a card with bf16, where amp-bf16 holds the same and runs
    without the scaler's unscale)."""
    optimizer: str = "adamw"
    """adamw, adamw-8bit, paged-adamw, paged-adamw-8bit, adafactor, sgd (with momentum, one state
    a parameter in its dtype: :attr:`sgd_momentum`)."""
    sgd_momentum: float = SGD_MOMENTUM
    """SGD's momentum: > 0 keeps one state a parameter (trainfit's runs: 0.9; HF Trainer's
    optim="sgd" has 0 unless ``optim_args`` sets it, and the emitted settings pass the job's);
    0 keeps none. SGD only."""
    optimizer_impl: str = "fused"
    """AdamW kernel: fused (HF Trainer's default on torch ≥ 2.8), foreach (torch's CUDA default), forloop."""
    optimizer_in_backward: bool = False
    """Step each parameter's optimizer in the backward pass, as soon as its gradient exists, and
    free that gradient (torchtune's optimizer_in_bwd): the model's gradients never exist at once —
    saves about their size (a full fine-tune of an 8B model in bf16: ~15 GiB). Needs one micro-batch
    per step (grad_accum 1), no clipping (max_grad_norm none), one rank, no fp16 GradScaler."""
    grad_ckpt: str | None = None
    """Activation checkpointing: off, full (keep each block's input, recompute the block),
    selective (torchtitan's op-level policy: keep attention and every other matmul output,
    recompute the rest); None lets plan/tune choose between off and full."""
    ckpt_reentrant: bool = False
    """Full checkpointing through torch.utils.checkpoint's reentrant implementation
    (``use_reentrant=True``: transformers 4.35-4.5x's default for
    ``gradient_checkpointing_enable()``, ``checkpoint_wrapper(CheckpointImpl.REENTRANT)`` as
    Answer.AI's fsdp_qlora uses it): each block's forward is recomputed whole inside its
    backward, its output too, where the
    non-reentrant mode (torch's recommendation, transformers 5's default, False) stops once the
    saved tensors are back. No effect without checkpointing; selective needs non-reentrant."""
    activation_offload: bool = False
    """Move the tensors the forward pass saves to host memory and bring them back in the backward
    pass (TRL's / torchtune's activation offloading; the output head's stay): with checkpointing
    only the blocks' inputs are saved, so it saves those (Llama-3.2-3B at 2 × 4096 tokens: ~1.3
    GiB); costs host↔GPU copies, streamed beside compute, which plan does not time (its rows'
    speed is unknown); the host holds them in pinned memory, each rounded up to a power of two
    (plan predicts those bytes per rank). Needs a CUDA device to run (plan predicts its memory
    anywhere)."""
    attention: str = "sdpa"
    """sdpa (the kernel torch picks on the GPU), sdpa-flash, sdpa-efficient, sdpa-math (torch's
    SDPA preferring that kernel), eager, or flash-attention-2: transformers' flash_attention_2
    (and _3) — the flash-attn kernel, which takes fewer key/value heads than query heads and no
    T×T mask, in fp16/bf16 on compute capability 8.0+ (plan models it; train, tune and doctor
    run transformers' SDPA and refuse it)."""
    ranks: int = 1
    """Data-parallel processes (GPUs)."""
    sharding: str = "none"
    """none (DDP: every rank holds everything), fsdp (FSDP full shard: parameters, gradients,
    states sharded), zero2 / zero3 (DeepSpeed ZeRO stage 2 / 3 as accelerate runs it). Under
    fsdp and zero the amp precisions are mixed precision as those engines run it: fp32 master
    weights sharded, parameters gathered and computed in bf16/fp16."""
    offload: str = "none"
    """CPU offload: optimizer (ZeRO offload_optimizer: fp32 master, states and their gradients
    on the host) or all (also the parameters: FSDP CPUOffload, ZeRO-3 offload_param). Saves
    GPU memory, costs host RAM and host↔GPU copies."""
    zero_pin_memory: bool = True
    """DeepSpeed's ``pin_memory`` of ``offload_optimizer`` and ``offload_param`` (ZeRO-2/3 with
    --offload): the host partitions page-locked, through PyTorch's pinned cache, which rounds
    each block up to a power of two (more host RAM). DeepSpeed 0.19's default
    (``offload_config.py``), which accelerate's plugin gets (it writes no pin_memory key), and
    the HF docs' example configs' value; false for older DeepSpeed releases or a config that says
    so (--no-zero-pin-memory)."""
    zero_reduce_bucket: int | None = None
    """DeepSpeed's ``reduce_bucket_size`` (ZeRO-2/3), in elements of the gradient dtype: unset is
    "auto", hidden², which HF Trainer and accelerate fill in (the HF docs' configs); a config
    that leaves the key out — an accelerate config without a DeepSpeed config file — runs
    DeepSpeed's own default, 500000000 (``runtime/zero/config.py``: 0.93 GiB per bf16 bucket;
    ZeRO-3 keeps one from its start, ZeRO-2 makes one or two in each backward). A script's
    config is read."""
    zero_prefetch_bucket: int | None = None
    """DeepSpeed's ``stage3_prefetch_bucket_size`` (ZeRO-3), in elements: unset is "auto", 0.9 ×
    hidden²; DeepSpeed's own default where a config leaves it out: 50000000."""
    fsdp_frozen_grads: bool = False
    """FSDP1 with frozen and trainable weights in one flat parameter (use_orig_params=True
    without wrapping the adapters apart — Lightning Fabric / litgpt's FSDP with LoRA): gradients,
    their reduce-scatter and the sharded gradient cover the whole unit, frozen weights included
    (torch's docstring: "equivalent to not freezing those parameters")."""
    fsdp_no_sync: bool = False
    """FSDP gradient accumulation as HF Trainer / accelerate run it: micro-steps before the last
    keep every unit's unsharded gradient (no_sync) instead of reduce-scattering each time."""
    fsdp_reduce_dtype: str = "fp32"
    """FSDP mixed precision: the dtype gradients are reduce-scattered in — fp32 (torchtitan's and
    FSDP2's usual policy) or param (the low precision: half the reduce-scatter bytes)."""
    fsdp_init: str = "sharded"
    """How the weights reach the GPUs before the first step under data parallelism: sharded
    (they arrive as this rank's shards, nothing is left in the allocator's cache: FSDP2 on a
    meta model — trainfit train, torchtitan, torchtune ≥ 0.3), wrap (FSDP1 given a model on the
    host and a device_id: each unit is moved to the GPU, flattened and sharded there; the
    full-size blocks it frees stay reserved, the reserve a run's reserved peak starts from) or
    wrap-sync (also sync_module_states' broadcast from rank 0 in 250 MiB buckets: accelerate's
    fsdp_cpu_ram_efficient_loading, Answer.AI's fsdp_qlora). With sharding none: FSDP's
    NO_SHARD, whose flat parameter is the whole unit."""
    fsdp_version: str = "auto"
    """Which FSDP runs the step's copies around its collectives: 2 (torch's ``fully_shard``:
    trainfit train, torchtitan, torchtune ≥ 0.3, accelerate's fsdp_version 2), whose every
    all-gather is copied out into the unsharded parameters; 1 (``FullyShardedDataParallel``:
    llm-foundry/Composer, accelerate's default, Answer.AI's fsdp_qlora, Lightning), whose
    parameters are views of the gathered flat buffer, no copy; auto: 1 where fsdp_init is wrap
    or wrap-sync (FSDP1's wraps), else 2. Speed only: the memory model is FSDP2's with FSDP1's
    reserve (fsdp_init)."""
    empty_cache_before_step: bool = False
    """The run calls ``torch.cuda.empty_cache()`` and resets the peak between building the model
    and the first step (torchtune's ``cleanup_before_training``): the reserve FSDP1's wrap or a
    QLoRA loading left is given back, all but the segments live tensors split, and the reserved
    peak restarts there. No effect where nothing is recorded before the step."""
    bnb_legacy: bool = False
    """Model bitsandbytes < 0.43.2, whose 4-bit matmul kept every layer's input alive until the
    autograd graph was freed (litgpt ≤ 0.5 pins bitsandbytes 0.42)."""
    quant_from_fp16: bool = False
    """The 4-bit weights were quantized from fp16 (Lightning Fabric's BitsandbytesPrecision), so
    each dequantization makes an fp16 tensor and then the compute-dtype copy; Fabric also converts
    subclasses of nn.Linear, which transformers leaves 16-bit (Falcon's FalconLinear)."""
    rope_cache: str = "none"
    """The rotary embedding of transformers < 4.40 (Llama ≤ 4.37 and 4.38.2-4.39's buffers kept
    for compatibility; Mistral, Qwen2, Mixtral of that time): every attention layer builds cos
    and sin tables of max_position_embeddings × head_dim at construction (``_set_cos_sin_cache``),
    in the default dtype then — fp32 for a model built from its config, the 16-bit dtype given
    to ``from_pretrained(torch_dtype=...)`` — held on every rank whole (buffers: FSDP does not
    shard them). 1 GiB in fp32 for Mistral-7B v0.2's 32,768 positions. none: one small inv_freq
    per model (transformers ≥ 4.40). Plan models the user's stack with it; tune and train run
    the installed transformers, whose model holds none."""
    fused_qkv: bool = False
    """The model code computes query, key and value with one projection and splits its output
    into views (lit-gpt; nanoGPT-style code): with multi-head attention the attention's saved
    values keep the whole fused output alive, and LoRA on q/k/v runs as lit-gpt's LoRAQKVLinear
    (one dropout, a zero-padded update). Plan models the user's model code with it."""
    expand_kv: bool = False
    """The model code copies the key and value heads to the query heads before attention (GQA):
    torchtune's MultiHeadAttention (``k.unsqueeze(2).expand(...).flatten(1, 2)``, then SDPA or
    flex attention; read in the 0.5.0 wheel), so the attention keeps those copies for its
    backward — n_heads / n_kv times the key and value bytes of every layer (Llama-3.2-3B, 24 / 8
    heads, 2 × 4,096 tokens: 64 MiB more a layer). False: transformers' SDPA call
    (``enable_gqa``: no copy). No effect without GQA. Plan models the user's model code with it."""
    output_in_backward: bool = False
    """The training loop still references the model's output (its logits) during the backward
    pass, as a hand-written loop does (``out = model(**batch); out.loss.backward()``); False:
    released before the backward, as HF Trainer (``compute_loss`` returns the loss alone), TRL,
    torchtune, torchtitan and trainfit's own loop do. Plan models the user's loop with it."""
    hold_outputs: bool = False
    """The training loop keeps the last model output — and with it the autograd graph — alive
    until the next forward returns (litgpt's loop; HF Trainer releases it before the backward).
    Plan models the user's loop with it; trainfit's own loop never holds it."""
    fp32_outputs: bool = False
    """The model's output carries fp32 logits: Lightning Fabric's wrapper converts what the
    model returns (``convert_output`` → the default dtype), so litgpt's loss runs on fp32
    chunks; transformers < 4.46 returned Llama/Mistral logits upcast (``logits.float()``),
    where 5.x returns them 16-bit and upcasts inside its loss. A loop that holds the output
    (output_in_backward, hold_outputs) holds that fp32 copy. For plan to model the user's
    stack; tune and train run it as set."""
    lm_head_chunk: int | None = None
    """Compute the output head + cross-entropy in chunks of this many tokens (litgpt's
    lm_head_chunk_size); None: transformers' loss over fp32 logits of the whole sequence."""
    trl_logprob_head: bool = False
    """TRL's SFTTrainer loss (trl 1.16: ``add_fused_lm_head``): the head applied in tiles of
    4,096 tokens × 32,768 vocabulary entries with an online log-sum-exp, never the whole logits;
    the backward recomputes each tile. Read from an SFTTrainer script; needs trl to run on
    real tensors."""
    padding_free: bool = False
    """Each micro-batch is one row of its samples concatenated, position_ids restarting at each
    (TRL's ``padding_free``, and its ``packing`` with the default bfd strategy): N = micro-batch
    × seq_len positions.  Under sdpa / eager attention transformers 5 reads the packing from
    position_ids and hands SDPA a (1, 1, N, N) block-causal bool mask, of which SDPA keeps a
    float copy per layer for the backward, and attention then runs over N × N (a mask takes no
    flash kernel): memory and time grow with the micro-batch squared.  With flash-attention-2
    (transformers' ``flash_attention_2``, whose varlen kernel takes the packing from
    position_ids, no mask) it holds what separate rows hold; SDPA's own flash kernel takes no
    mask, so under SDPA (sdpa-flash too) a packed row always has the mask.  Causal LMs only;
    read from a script; train (its own loop) and
    tune run it as transformers' DataCollatorWithFlattening builds it."""
    padded: str = "none"
    """Padding in the batches, planned at ``seq_len``: none (packed rows, or samples of one
    length); longest (the collator pads each batch to its longest sample: transformers'
    DataCollatorWithPadding, TRL's SFT without packing — one row is its own longest, unpadded);
    always (every batch padded, one row too: ``padding="max_length"``, ``pad_to_multiple_of``).
    A padded batch's attention mask has zeros, which transformers cannot skip: SDPA is handed a
    B×1×S×S mask, of which each layer's kernel keeps a float copy for the backward, runs a kernel
    that takes a mask (not flash), and with grouped heads gets k and v repeated to the query
    heads (transformers passes no ``enable_gqa`` with a mask); eager builds its mask anyway (no
    change for a decoder-only model); a seq2seq decoder masks only the encoder's padding (its
    cross-attention). flash-attention-2 unpads the batch instead: q, k and v gathered to the
    valid tokens, which its kernel keeps, and its output padded back, which o_proj keeps where
    it saves its input (a trained weight; LoRA without dropout) — the attention output held
    twice there; elsewhere the padding's share of q, k, v and the output is not kept at all
    (the B×S×S bool mask the sdpa-built model makes, which it does not, is counted too: errs
    high). Read from a script's batches; train, tune and doctor take their mask from their own
    data."""
    grads_to_none: bool = True
    """Free gradients after each optimizer step (``zero_grad(set_to_none=True)``, torch ≥ 2.0's
    default); False keeps zeroed gradients alive between steps (torch < 2.0, many old scripts)."""
    softmax_saves_input: bool = False
    """Model torch ≤ 1.10, whose softmax and log_softmax saved their input beside their output
    for the backward (torch 1.11 stopped: pytorch#65242): each eager attention layer holds its
    B×H×T×T scores (fp32 under autocast) until its backward, and the loss its logits. With
    eager attention only, no compile, checkpointing reentrant (sets ``ckpt_reentrant``: what
    torch ≤ 1.10 had). For plan,
    to model the user's stack; train, tune and doctor run the installed torch and refuse it."""
    max_grad_norm: float | None = 1.0
    """Gradient clipping as HF Trainer does by default (None: off)."""
    compile: bool = False
    """``torch.compile`` the model: faster steps after a one-off compile time (measured by tune)."""
    compile_builds_mask: bool = True
    """Under ``compile``, the model builds a batch × 1 × seq × seq attention mask every step:
    transformers' masking does (its packed-sequence check cannot run while Dynamo traces, so the
    mask is never skipped; SDPA keeps a float copy of it per layer, and transformers' attention
    then expands k and v to the query heads). False: model code that calls SDPA with
    ``is_causal`` itself (torchtune, torchtitan, litgpt, nanoGPT). Plan models the user's model
    code with it; no effect without compile."""
    expandable_segments: bool = False
    """The run sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (torchtitan's and
    axolotl's launchers do): PyTorch's allocator grows one segment per stream by 20 MiB pages
    instead of a cudaMalloc per segment, and at the card's limit unmaps free pages that live
    tensors split: reserved memory closer to allocated, fewer fragmentation OOMs; train and tune
    on a GPU run with it.  False: PyTorch's default segments."""
    num_workers: int = 0
    """DataLoader worker processes; 0 loads batches in the training process."""
    prefetch_factor: int = 2
    """Batches each worker prepares ahead (with workers)."""
    pin_memory: bool = False
    """Page-locked host batches for asynchronous host→GPU copies (CUDA only)."""
    persistent_workers: bool = False
    """Keep data-loader workers alive across epochs."""
    data: str | None = None
    """Training data: a JSONL of text / chat ``messages`` / ``input_ids`` rows, or a file or
    directory HF datasets reads (tune, train, doctor)."""
    text_field: str = "text"
    """The field holding the text of text rows."""
    tokenizer: str | None = None
    """Tokenizer dir or hub id; None: the model's own, or the built-in byte tokenizer for catalog
    models (no download)."""
    packing: bool | None = None
    """Pack text rows into full sequences (None: yes for causal-LM text, no for chat)."""
    lr: float = 1e-4
    """Peak learning rate (AdamW / SGD / Adafactor)."""
    weight_decay: float = 0.0
    """The optimizer's weight decay (HF TrainingArguments' default, 0.0). AdamW's, Adafactor's and
    bitsandbytes' are decoupled and in place: no memory. SGD's is L2, added to the gradients:
    torch's foreach SGD makes a gradient-sized copy for the step (``_foreach_add``), the for-loop
    one parameter's at a time, the fused one none."""
    seed: int = 0
    """Seed of the weights' initialisation (random-init models) and of the sample order."""

    @staticmethod
    def example(name: str) -> str:
        """A valid value of the field, for hints."""
        return {"seq_len": "512", "micro_batch": "4", "grad_accum": "4", "effective_batch": "32",
                "ranks": "2", "lora_r": "16", "lora_alpha": "32", "lm_head_chunk": "1024",
                "prefetch_factor": "2", "num_workers": "2", "lr": "1e-4", "seed": "0",
                "weight_decay": "0.01", "sgd_momentum": "0.9", "lora_dropout": "0.05",
                "max_grad_norm": "1.0", "zero_reduce_bucket": "500000000",
                "zero_prefetch_bucket": "50000000"
                }.get(name, "(see docs/job-fields.md)")

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise JobError("--model is empty", "give a catalog name (trainfit models), an HF id "
                           "or a path to a config.json")
        if type(self.fsdp_version) is int:  # accelerate's YAML writes fsdp_version: 2, a number
            self.fsdp_version = str(self.fsdp_version)
        check_types(self)
        _choice("method", self.method, METHODS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _choice("attention", self.attention, ATTENTIONS)
        _choice("sharding", self.sharding, SHARDINGS)
        _choice("fsdp_reduce_dtype", self.fsdp_reduce_dtype, REDUCE_DTYPES)
        _choice("fsdp_init", self.fsdp_init, FSDP_INITS)
        _choice("fsdp_version", self.fsdp_version, FSDP_VERSIONS)
        _choice("offload", self.offload, OFFLOADS)
        _choice("base_dtype", self.base_dtype, BASE_DTYPES)
        _choice("rope_cache", self.rope_cache, ROPE_CACHES)
        check_sharding(self)
        if self.precision is not None:
            _choice("precision", self.precision, PRECISIONS)
        if self.grad_ckpt is not None:
            if isinstance(self.grad_ckpt, bool):
                self.grad_ckpt = "full" if self.grad_ckpt else "off"
            _choice("grad_ckpt", self.grad_ckpt, GRAD_CKPT)
        check_legacy_torch(self)
        check_flash_attention(self)
        _choice("padded", self.padded, PADDINGS)
        check_padding(self)
        if self.softmax_saves_input:
            self.ckpt_reentrant = True  # torch ≤ 1.10's only checkpointing
        if self.ckpt_reentrant and self.grad_ckpt == "selective":
            raise JobError("--ckpt-reentrant with --grad-ckpt selective: torch's selective policy "
                           "(context_fn) runs only in non-reentrant checkpointing",
                           "use --grad-ckpt full, or drop --ckpt-reentrant")
        for name in SIZE_FIELDS:
            check_positive(self, name)
        check_limits(self)
        check_numbers(self)
        if isinstance(self.lora_targets, str):
            self.lora_targets = [t.strip() for t in self.lora_targets.split(",") if t.strip()]
        if self.method == "full":
            defaults = JobSpec.__dataclass_fields__
            changed = [n for n in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")
                       if getattr(self, n) != (defaults[n].default if defaults[n].default
                                               is not dataclasses.MISSING
                                               else defaults[n].default_factory())]
            if changed:
                raise JobError(f"--{changed[0].replace('_', '-')} given with --method full",
                               "LoRA options need --method lora or qlora")
            if self.quant is not None:
                raise JobError("--quant given with --method full", "use --method qlora")
        check_quantization(self)
        if not self.lora_targets:
            raise JobError("--lora-targets is empty", "e.g. --lora-targets q,v or all-linear")
        self._resolve_batch()
        if self.optimizer_in_backward:
            check_in_backward(self)

    @property
    def masks_packing(self) -> bool:
        """:attr:`padding_free` without flash attention's varlen kernel: a row holding several
        sequences gets transformers' block-causal mask (whether the step's rows hold several:
        :attr:`packs_rows`)."""
        return self.padding_free and self.attention != "flash-attention-2"

    @property
    def packs_rows(self) -> bool:
        """The step runs one packed row with a mask (:attr:`padding_free` without flash
        attention's varlen kernel, which holds what separate rows hold) — at micro-batch 1 only
        when its one sample holds several documents (``packing``: TRL's bfd bins); one sequence
        alone builds no mask (transformers' packed-sequence check answers None for it)."""
        return self.masks_packing and ((self.micro_batch or 1) > 1 or self.packing is True)

    @property
    def fsdp_flat(self) -> bool:
        """FSDP1's flat parameters (:attr:`fsdp_version`): its gathered buffer is the parameters,
        no copy-out after an all-gather."""
        return self.sharding == "fsdp" and (self.fsdp_version == "1" or (
            self.fsdp_version == "auto" and self.fsdp_init != "sharded"))

    def _resolve_batch(self) -> None:
        self.micro_batch, self.grad_accum, self.effective_batch = resolve_batch(
            self.micro_batch, self.grad_accum, self.effective_batch, self.ranks)

    # --- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> JobSpec:
        d = self.to_dict()
        d.update(changes)
        if "micro_batch" in changes or "grad_accum" in changes or "ranks" in changes:
            # keep the effective batch unless both sides of the product are given anew
            if "grad_accum" in changes and "effective_batch" not in changes:
                d["effective_batch"] = None
            elif "grad_accum" not in changes and d.get("effective_batch") is not None:
                d["grad_accum"] = None
        return JobSpec(**d)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "job") -> JobSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k.replace("-", "_"): v for k, v in data.items()}
        for key in data:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                raise JobError(f"{source}: unknown key {key!r}",
                               f"did you mean {close[0]!r}?" if close else
                               f"known keys: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> JobSpec:
        from trainfit.job.files import read_job_file  # files builds on this module

        fields, _ = read_job_file(path)
        return cls.from_dict(fields, source=str(path))
