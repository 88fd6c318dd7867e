"""One held-out published case (``data/heldout_memory.json``) → trainfit's job, GPU and peak.

Each source ran its own framework; what that framework does to memory is read from the case's
notes and expressed with ``JobSpec`` fields where they exist.  What ``JobSpec`` cannot express
is handled in one of two ways, and said in the case's ``mapping_notes``:

* mapped to the closest field (scored): DeepSpeed ZeRO-3 → ``sharding: fsdp`` (both shard
  parameters, gradients and optimizer states over the ranks), FSDP ``NO_SHARD`` → ``sharding:
  none`` (every rank holds everything), FSDP1 → trainfit's FSDP2 simulation, flex attention /
  flash-attn 2 → SDPA, torchtune's chunked cross-entropy → ``lm_head_chunk``, ``torch.compile``
  → ``compile`` (whether the memory model uses it is trainfit's business);
* unsupported (listed, not scored) while JobSpec has no field for them: CPU offload,
  optimizer-in-backward, activation offloading, selective activation checkpointing, frozen base
  weights kept in fp32 under amp (all have fields now); and sequence lengths the source does not
  pin (data padded per batch).

Fields that do not exist yet are looked up by name (:data:`FEATURE_FIELDS`, ``GRAD_CKPT``,
``SHARDINGS``), so the benchmark uses them as soon as they land in ``trainfit.job.spec``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from heldout_builder import (
    FEATURE_FIELDS,  # noqa: F401  (read through this module: its tests)
    Builder,
    Mapping,
    base_job,
    case_sharding,
)
from heldout_gpu_model import compare_for, gpu_for, model_for


# --- frameworks ---------------------------------------------------------------------------------
def _torchtune(b: Builder) -> None:
    c = b.case
    base_job(b, "foreach")
    case_sharding(b)
    b.grad_ckpt()
    b.job["max_grad_norm"] = None
    if c["framework"]["version"].startswith("0.1"):
        b.output_held("torchtune 0.1's recipe loop (`logits = logits[..., :-1, :].contiguous()` "
                      "kept until the step ends; `del logits` came in 0.2)")
        b.job["fp32_outputs"] = True
        b.note("torchtune 0.1's TransformerDecoder returns `self.output(h).float()`: the logits "
               "the loop holds are fp32 → fp32_outputs true")
    if b.job["method"] == "qlora":
        old = c["framework"]["version"].startswith("0.1")
        b.job["quant_lib"] = "torchao-0.1" if old else "torchao"
        b.note("torchtune's 4-bit weights are torchao NF4Tensors, made on the GPU"
               + (" (torchao 0.1, pinned by torchtune 0.1.x: its nearest-code search holds 64 B "
                  "per element of the weight at once)" if old else "")
               + " and dequantized through int64 codes in each matmul (linear_nf4: 14 B per "
               f"element at its peak) → quant_lib {b.job['quant_lib']}")
    version = tuple(int(v) for v in re.findall(r"\d+", c["framework"]["version"])[:2])
    if version >= (0, 3) and c["optimizer"].startswith("adamw") and "inferred" in c["optimizer"]:
        b.job["optimizer_impl"] = "fused"
        b.note("an AdamW the source does not pin, in torchtune ≥ 0.3: every torch.optim.AdamW "
               "block of its configs sets fused: True (read in the 0.5.0 wheel, "
               "llama3_2/3B_full.yaml among them) → optimizer_impl fused")
    # read in the wheels: the llama2 builders pass one layer to TransformerDecoder in 0.1.1 to
    # 0.5.0; llama3_1's build a list from 0.3.1 on (torchtune PR #1554), llama3_2's in 0.5.0
    llama2 = c["model"]["model_type"] == "llama" and "llama-2" in c["model"]["name"].lower()
    if (llama2 or (version and version <= (0, 2))) and b.job["sharding"] == "none":
        b.job["clone_layers"] = True
        b.note("torchtune's Llama-2 builder passes one decoder layer to TransformerDecoder, which "
               "deep-copies it num_layers times (_get_clones; read in the 0.1.1 to 0.5.0 "
               "wheels), on the GPU in the single-device recipe (`with self._device: "
               "config.instantiate(...)`): the template layer is freed into the cache, and each "
               "layer holds its own fp32 RoPE cache (2 MiB at 4,096 positions) → clone_layers "
               "true")
    if b.job.get("fsdp_init", "sharded") != "sharded":
        b.job["empty_cache_before_step"] = True
        b.note("torchtune's distributed recipes start train() with cleanup_before_training() "
               "(gc.collect, torch.cuda.empty_cache, reset_peak_memory_stats; read in 0.1.1's "
               "lora_/full_finetune_distributed.py): FSDP1's wrap reserve is given back → "
               "empty_cache_before_step true")
    if b.job["sharding"] == "fsdp" and b.job["grad_accum"] > 1:
        b.note("torchtune's distributed loop reduce-scatters every micro-step (no no_sync)")
    b.note("torchtune: bf16 weights/states, no gradient clipping, the loop frees the logits "
           "before backward (≥ 0.2); its own TransformerDecoder simulated as the transformers model of "
           "the same dimensions")
    heads = c["model"]["num_attention_heads"]
    if (c["model"].get("num_key_value_heads") or heads) < heads:
        b.job["expand_kv"] = True
        b.note("torchtune's MultiHeadAttention copies k and v to the query heads before SDPA or "
               "flex attention (k.unsqueeze(2).expand(...).flatten(1, 2); read in the 0.5.0 "
               "wheel, modules/attention.py), which keep the copies for the backward → "
               "expand_kv true")
    other = c["measured"].get("other_settings") or {}
    if "loss" in other:
        chunked = "chunked" in other["loss"].lower()
    else:
        chunked = "CEWithChunkedOutputLoss" in c["notes"] and "NOT chunked" not in c["notes"]
    if chunked:
        chunk = c["seq_len"] // 8
        fp32 = c["micro_batch"] * chunk * c["model"]["vocab_size"] * 4 * 2
        b.job["lm_head_chunk"] = chunk
        b.note(f"CEWithChunkedOutputLoss (8 chunks along the sequence) → lm_head_chunk {chunk}: "
               "every chunk's bf16 logits stay alive as in torchtune; its per-chunk fp32 upcast "
               f"and log-softmax (~{fp32 / 2**30:.2f} GiB transient) are not modelled")
    if other.get("enable_activation_offloading"):
        b.feature("activation-offload", "activation offloading to CPU")
        if "activation-offload" not in b.unsupported:
            b.note("torchtune's OffloadActivations (the code TRL took over) around the model's "
                   "forward only: its loss runs outside, so the loss's saved tensors stay on the "
                   "GPU, where trainfit (as TRL, whose manager wraps the whole training step) "
                   "offloads them")
    if "UNPACKED" in (c["seq_len_note"] or ""):
        b.unsupported.append("unpinned-seq-len")
        b.note("unpacked data padded per batch: the peak batch's length is data-dependent "
               f"(the {c['seq_len']} cap is far above it) → unsupported (unpinned-seq-len)")
    elif "packed" in (c["seq_len_note"] or "").lower() and "pack" in c["seq_len_note"]:
        b.note(f"packed samples of {c['seq_len']} tokens")
    else:
        b.note(f"padded per batch, capped at {c['seq_len']}: the peak batch is taken at the cap")
    if c["method"] == "qlora":
        b.job["quant_lm_head"] = False
        b.note("torchao NF4Tensor (block 64, double-quantized scales) → quant nf4-dq (bnb's "
               "layout of the same size; torchao's linear_nf4 saves no input); head and "
               "embeddings bf16")
        if b.job.get("sharding") == "fsdp":
            b.note("torchao NF4 weights are sharded by FSDP2 together with their scales")


def _torchtitan(b: Builder) -> None:
    base_job(b, "foreach")
    case_sharding(b)
    b.grad_ckpt(selective=True)
    if "fsdp_reduce_dtype" in b.fields:
        b.job["fsdp_reduce_dtype"] = "fp32"
    b.note("torchtitan: pretraining, FSDP2 MixedPrecisionPolicy(param bf16, reduce fp32) = "
           "amp-bf16 under sharding fsdp; gradient clipping 1.0; last block not resharded "
           "after forward (not modelled); its own Llama simulated as transformers' Llama")


def _fsdp_qlora(b: Builder) -> None:
    base_job(b, "foreach")
    case_sharding(b)
    b.grad_ckpt()
    if b.job.get("grad_ckpt") == "full":
        b.job["ckpt_reentrant"] = True
    b.note("Answer.AI fsdp_qlora train.py: HF model + PEFT, pure bf16 (no FSDP mixed precision),"
           " checkpoint_wrapper(CheckpointImpl.REENTRANT) per decoder layer → grad_ckpt full, "
           "ckpt_reentrant true; LoRA modules wrapped as their own FSDP units; "
           "peak reset after loading (training only)")
    b.output_held("its loop (`output = model(...); loss = output.loss; loss.backward()`)")
    b.job["fp32_outputs"] = True
    b.note("transformers < 4.46 (fsdp_qlora asks for !=4.38/4.39, spring 2024): "
           "LlamaForCausalLM / MistralForCausalLM return `logits.float()`, which the loop holds "
           "through the backward (transformers 5 returns 16-bit logits and upcasts inside its "
           "loss) → fp32_outputs true; its loss's contiguous fp32 copy of the shifted logits, a "
           "transient at the end of the forward, is not modelled")
    b.job["rope_cache"] = "fp32" if b.case["method"] == "qlora" else "bf16"
    b.note("transformers of Feb-Mar 2024 (4.37-4.39, before 4.40; which one is not stated): each "
           "attention layer's rotary embedding holds cos and sin tables of "
           "max_position_embeddings × head_dim (cos_cached/sin_cached; 4.38.2-4.39 keep them "
           "as buffers for compatibility), built in the default dtype: fp32 for the QLoRA model "
           "made from its config, bf16 under LoRA's from_pretrained(torch_dtype=bf16) → "
           f"rope_cache {b.job['rope_cache']} (buffers: whole on every rank; 4.38.0/4.38.1 "
           "had none)")
    if b.case["method"] == "qlora":
        b.job.update(quant_lm_head=False, bnb_legacy=True)
        b.note("bitsandbytes 0.43.0 (the first with quant_storage; < 0.43.2): its 4-bit matmul "
               "keeps each input with the graph (the bug the README's --reentrant_checkpointing "
               "avoids) → bnb_legacy true; under reentrant checkpointing the forward builds no "
               "graph, so a layer's inputs live only through its recomputation and backward")
        if b.job["sharding"] == "fsdp":
            b.note("quant_storage bf16: FSDP1 shards the packed 4-bit weights (bitsandbytes' "
                   "quantization state stays whole on every rank)")


def _peft(b: Builder) -> None:
    c = b.case
    base_job(b, "foreach")
    case_sharding(b)
    b.grad_ckpt()
    b.note("PEFT example (HF Trainer / accelerate): adamw_torch, clipping 1.0")
    if "custom loop" in c["framework"]["name"]:
        b.output_held("the custom accelerate loop")
    b.no_sync("accelerate (Trainer)")
    if c["precision"].startswith("amp") and "fsdp_reduce_dtype" in b.fields \
            and b.job["sharding"] == "fsdp":
        b.job["fsdp_reduce_dtype"] = "param"
        b.note("accelerate's FSDP bf16 policy reduces in bf16 (assumed in the case) → "
               "fsdp_reduce_dtype param")
    if c["method"] in ("lora", "qlora") and c["precision"].startswith("amp") \
            and "base_dtype" in b.fields and not (c["method"] == "lora" and c["sharding"]
                                                  .startswith("fsdp")):
        b.job["base_dtype"] = "bf16"
        b.note("frozen weights in bf16 (torch_dtype = the bf16 quant storage for QLoRA; "
               "zero.Init partitions in bf16 under ZeRO-3) → base_dtype bf16")
    if c["method"] == "lora" and "torch.float32" in c["notes"] and c["sharding"].startswith("fsdp"):
        b.feature("fp32-frozen-base", "frozen base weights loaded in fp32 (sharded fp32 "
                  "storage, gathered in bf16) while trainfit keeps them in bf16 under amp")
    if b.job.get("grad_ckpt") == "full" and "use_reentrant true" in json.dumps(c).lower():
        b.job["ckpt_reentrant"] = True
        b.note("gradient_checkpointing_kwargs use_reentrant true → ckpt_reentrant true")
    if c["method"] == "qlora":
        b.job["quant_lm_head"] = False
        b.note("transformers BitsAndBytesConfig (bitsandbytes ≥ 0.43.3): head in 16 bits; "
               "quant_storage bf16 lets FSDP/ZeRO-3 shard the packed weights")
    if "32008" in c["notes"]:
        b.note("vocabulary resized to 32008 by the script's chat template: 32000 used")


def _hf_blog(b: Builder) -> None:
    base_job(b, "forloop")
    case_sharding(b)
    b.grad_ckpt()
    b.job["grads_to_none"] = False
    b.output_held("run_clm_no_trainer (`outputs = model(**batch); accelerator.backward(loss)`)")
    b.note("2022 (torch 1.12, CUDA 11.x): AdamW for-loop, zero_grad keeps zeroed gradients "
           "(set_to_none False), no lazy CUDA module loading (+880 MiB context, as "
           "calibration.py's 2022 cases); run_clm_no_trainer: GPT-2 with dropout 0.1")
    if "12" in (b.case["seq_len_note"] or ""):
        b.note("block size printed as 12 in the post: 128 taken (the case's reading)")
    if (b.case.get("fsdp") or {}).get("auto_wrap_policy", "").startswith("default_auto_wrap"):
        b.note("size-based auto-wrap (min_num_params 2000) makes every Linear its own FSDP "
               "unit; trainfit wraps one unit per decoder block")


LITGPT_FUSES = ("llama", "phi", "mistral", "gemma", "gemma2", "qwen2")
"""Architectures whose transformers attention has separate q/k/v projections, which lit-gpt's
model code computes fused (GPT-NeoX, Falcon and Phi-3 are fused in transformers too)."""


def _litgpt(b: Builder) -> None:
    base_job(b, "foreach")
    case_sharding(b)
    b.grad_ckpt()
    b.job.update(max_grad_norm=None, lm_head_chunk=128, hold_outputs=True, fp32_outputs=True)
    b.no_sync("Fabric's no_backward_sync")
    b.note("lit-gpt Oct 2023 (quirks as calibration.py's litgpt cases): untied lm_head, head + "
           "cross-entropy in chunks of 128 tokens, the loop holds the logits until the next "
           "forward, no clipping, no dropout, tanh GELU, AdamW foreach")
    b.note("Fabric's _FabricModule.forward returns precision.convert_output(output): the "
           "16-bit logit chunks become fp32 copies (torch.get_default_dtype()) before the "
           "loop's loss → fp32_outputs true")
    if b.case["model"].get("model_type") in LITGPT_FUSES:
        b.job["fused_qkv"] = True
        b.note("lit-gpt's CausalSelfAttention computes q, k, v with one projection and splits it "
               "into views, its LoRAQKVLinear adapts it (one dropout, zero-padded update): "
               "fused_qkv true (litgpt_model_code.py compares it with lit-gpt's code)")
    elif b.case["method"] in ("lora", "qlora"):
        b.note("simulated as the transformers model + peft, whose fused query_key_value LoRA "
               "adapts all of q, k and v: lit-gpt's zero-padded LoRA on part of it is not "
               "modelled for this architecture")
    if b.case["method"] == "qlora":
        b.job.update(quant_lm_head=True, bnb_legacy=True, quant_from_fp16=True)
        b.note("Fabric BitsandbytesPrecision: every Linear quantized incl. the head, from fp16; "
               "bitsandbytes 0.41.1 < 0.43.2 → bnb_legacy true")
        b.note("held logits + bnb_legacy keep the previous step's 4-bit matmul inputs alive "
               "through the next forward, modelled at the longest batch; but the longest batch "
               "is iteration 1, which has no previous step, and the random batches after it are "
               "shorter: this over-states the peak (kept: never shrink on a guess)")
    b.note("max_memory_allocated is never reset (loading + validation + training): the "
           "training step's predicted peak is compared")
    if b.job["sharding"] == "fsdp" and b.case["method"] != "full" \
            and "fsdp_frozen_grads" in b.fields:
        b.job["fsdp_frozen_grads"] = True
    if b.job["sharding"] == "fsdp":
        b.note("Fabric FSDP1, one unit per Block with use_orig_params: frozen weights share "
               "flat parameters with the LoRA adapters (FSDP1 then keeps gradients for them) "
               "and the full checkpoint is loaded on every rank (loading peak)")


FRAMEWORKS = {"torchtune": _torchtune, "torchtitan": _torchtitan, "fsdp_qlora": _fsdp_qlora,
              "peft": _peft, "hf_blog": _hf_blog, "litgpt": _litgpt}


def framework_of(case: dict[str, Any]) -> str:
    return next(k for k in FRAMEWORKS if case["id"].startswith(k))


def map_case(case: dict[str, Any]) -> Mapping:
    """The case in trainfit's terms (pure: reads JobSpec's field names, builds nothing)."""
    b = Builder(case)
    fw = framework_of(case)
    gpu = gpu_for(b.case, b.note)
    compare = compare_for(b.case, b.note)
    FRAMEWORKS[fw](b)
    model = model_for(b.case, b.note, litgpt=fw == "litgpt")
    return b.build(gpu, compare, model, fw, eager=fw == "hf_blog")
