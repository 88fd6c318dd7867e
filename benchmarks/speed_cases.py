"""Published throughput cases → what ``trainfit plan`` is asked: job fields, model, GPU, interconnect.

Reads ``throughput_published.json`` and ``data/throughput_heldout.json`` (same schema; the held-out
file adds interconnect / nodes / kernels / parallelism / activation_checkpointing).  Pure mapping
from the cases' own fields and notes (no torch, no model built here: the parent process of
speed_published.py must not build a model before it forks its workers).

Each case is either
* ``unsupported``: a feature whose speed trainfit does not model and that a substitute would only
  hide (tensor / pipeline / context parallelism, float8 / fp8, HSDP, CPU parameter or activation
  offload — plan's speed is unknown for offload —, TF32 matmuls, data of unknown step shape) or a
  GPU missing from the catalog — listed with the reasons, not scored; or
* scored, in the bucket ``plain`` or ``fused/compiled`` — the latter when the step uses a speed
  feature beyond the plain eager step: ``torch.compile`` (the job's ``compile``: trainfit's
  Inductor-fusion model where the speed model has one, else planned eager), Liger / fused kernels
  (planned as stock HF modules), selective activation checkpointing (op policy: the job's
  ``grad_ckpt: selective`` where it exists; every-N-th-layer: planned as full, an upper bound on
  recomputation, so the prediction is a lower bound), the optimizer step fused into the backward
  (planned as a separate step).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
FILES = {"published": ROOT / "throughput_published.json",
         "heldout": ROOT / "data" / "throughput_heldout.json"}

# (pattern on the case's GPU text, catalog name or None = not in the catalog, note); first match
GPU_RULES: tuple[tuple[str, str | None, str], ...] = (
    (r"MI300X|Iluvatar", None, "not an NVIDIA GPU: no catalog entry"),
    (r"A800", None, "A800 80GB PCIe: not in the catalog"),
    (r"RTX PRO 6000", None, "RTX PRO 6000 Blackwell: not in the catalog"),
    (r"H100 96GB", None, "H100 96GB HBM2e at 500 W (Meta Grand Teton): not in the catalog "
     "(h100-sxm is the 80GB 700 W part)"),
    (r"V100-SXM2-16GB", "v100-16gb", ""),
    (r"A100-SXM4-40GB|A100 40GB SXM", "a100-40gb-sxm", ""),
    (r"A100 40GB PCIe", "a100-40gb-pcie", ""),
    (r"A100-SXM4-80GB|A100 80GB \(SXM form", "a100-80gb-sxm", ""),
    (r"A100", "a100-80gb-sxm", "A100 variant not stated: a100-80gb-sxm"),
    (r"H100 80GB", "h100-sxm", ""),
    (r"H100", "h100-sxm", "H100 variant not stated: h100-sxm"),
    (r"H200", "h200", ""),
    (r"RTX 4090", "rtx-4090", ""),
    (r"RTX 3090", "rtx-3090", ""),
    (r"RTX A6000", "rtx-a6000", ""),
    (r"RTX A5000", "rtx-a5000", ""),
    (r"RTX 6000 Ada", "rtx-6000-ada", ""),
    (r"L40S", "l40s", ""),
    (r"\bA40\b", "a40", ""),
)

FAMILIES: tuple[tuple[str, str], ...] = (
    (r"V100", "V100"), (r"A100|A800", "A100"), (r"H100|H200", "H100/H200"),
    (r"RTX 30|RTX A\d000|\bA40\b", "consumer/workstation Ampere"),
    (r"RTX 40|Ada|L40S", "Ada"), (r"Blackwell|RTX PRO 6000|B200|RTX 50", "Blackwell"),
)

OPTIMIZERS: tuple[tuple[str, str, str], ...] = (
    (r"PagedAdamW8bit", "paged-adamw-8bit", "fused"), (r"8-bit AdamW|Adam8bit", "adamw-8bit", "fused"),
    (r"[Aa]dafactor", "adafactor", "fused"), (r"adamw_hf", "adamw", "forloop"),
)


@dataclass
class Mapped:
    """One case as trainfit is asked it, with everything substituted said in ``notes``."""

    id: str
    group: str
    file: str
    gpu_text: str
    gpu: str | None
    family: str
    gpus: int
    measured_tokens_per_s: float
    measured_mfu: float | None
    n_params: int | None = None
    job: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    """``{"catalog": name}`` or ``{"build": config class, **dims}`` (built in the worker)."""
    model_note: str = ""
    interconnect: str | None = None
    """A key of trainfit.speed.comm.INTERCONNECTS_GBS (plan's --interconnect), None: catalog's."""
    unsupported: list[str] = field(default_factory=list)
    approximated: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cc: str = ""
    """The GPU's compute capability (the simulation's target: attention kernels, autocast)."""
    timed_interval: tuple[int, int] | None = None
    """(training steps, eval forwards) inside one timed interval of the source's harness, when
    its tokens/s divides the training tokens by a time that includes evaluation forwards."""
    confidence: str = "medium"
    """The source's confidence (high / medium / low): the targets, like the memory ones, are
    read on high/medium cases; low ones (derived timings, harness overheads) are shown too."""

    @property
    def bucket(self) -> str:
        return "unsupported" if self.unsupported else (
            "fused/compiled" if self.approximated else "plain")

    @property
    def scale(self) -> str:
        return "1 GPU" if self.gpus == 1 else ("2-7 GPUs" if self.gpus < 8 else "≥ 8 GPUs")

    def group_key(self) -> str:
        """Cases with equal keys share one fitted simulation (they differ in micro-batch,
        accumulation, GPU of the same compute capability, interconnect only)."""
        j = {k: v for k, v in self.job.items() if k not in ("micro_batch", "grad_accum")}
        return json.dumps([self.model, j, self.cc], sort_keys=True)


def load_cases() -> list[tuple[str, dict[str, Any]]]:
    return [(name, c) for name, path in FILES.items() for c in json.loads(path.read_text())["cases"]]


def _first(rules: tuple[tuple[str, Any, Any], ...] | tuple[tuple[str, str], ...], text: str) -> Any:
    return next((r for r in rules if re.search(r[0], text)), None)


def _interconnect(case: dict[str, Any], m: Mapped) -> None:
    """plan's --interconnect for the case: a stated PCIe generation, and for jobs over several
    8-GPU hosts the option whose modelled ring bus bandwidth is nearest the hosts' aggregate NIC
    bandwidth; otherwise the catalog's default (NVLink of SXM parts, PCIe of the others).

    Across hosts with one NIC per GPU (rail-optimised, as these clusters are) NCCL runs one ring
    per NIC, so a collective's bus bandwidth approaches the host's aggregate NIC bandwidth, not one
    NIC's: 8 × 200 Gb/s HDR hosts reach ~190 GB/s all-reduce bus bandwidth in nccl-tests
    (NVIDIA DGX A100 user guide / nccl-tests PERFORMANCE.md: busbw is bound by the host's
    injection bandwidth).  plan has no multi-node option, so the nearest one stands in."""
    from trainfit.speed.comm import INTERCONNECTS_GBS, RING_BUS_EFFICIENCY

    text = case.get("interconnect") or ""
    if m.gpus == 1:
        return
    if m.gpus > 8:
        if "400 Gb/s per GPU" in text:
            gbit, how = 3200, "400 Gb/s per GPU stated"
        elif "not stated" in text.lower() and ("H100" in case["gpu"] or "H200" in case["gpu"]):
            gbit, how = 3200, "inter-host fabric not stated: 8 × 400 Gb/s per H100 host assumed"
        elif "not stated" in text.lower() or "1600 Gbps" not in text:
            gbit, how = 1600, "inter-host fabric not stated: 8 × 200 Gb/s per A100 host assumed"
        else:
            gbit, how = 1600, "1600 Gbps RoCE per 8-GPU host stated"
        bus = gbit / 8  # GB/s of the host's NICs together
        m.interconnect = min(INTERCONNECTS_GBS, key=lambda k: abs(math.log(
            INTERCONNECTS_GBS[k] * RING_BUS_EFFICIENCY / bus)))
        m.notes.append(f"{m.gpus} GPUs over {m.gpus // 8} hosts: {how}, ring bus bandwidth ≈ "
                       f"{bus:g} GB/s → --interconnect {m.interconnect}")
    elif "PCIe 4.0" in text:
        m.interconnect = "pcie4"
    elif "slow PCI" in text:
        m.interconnect = "pcie3"
        m.notes.append("'slow PCI lanes', generation not stated: --interconnect pcie3 assumed")
    elif text.startswith("not stated"):
        m.notes.append("interconnect not stated: catalog default")


def _row_notes(case: dict[str, Any]) -> str:
    """The case's notes without a reproduction command quoted for another row (torchtune's
    optimisation table quotes its last row's flags in every row)."""
    return case.get("notes", "").split("Reproduction command")[0]


def _ac(case: dict[str, Any]) -> str:
    """The activation-checkpointing kind: the held-out file states it, the published file's
    torchtitan notes say SELECTIVE (op policy)."""
    return case.get("activation_checkpointing") or (
        "selective op" if "SELECTIVE" in case.get("notes", "") else "")


def _features(case: dict[str, Any], m: Mapped) -> None:
    import trainfit.speed.predict as speed
    from trainfit.job.spec import GRAD_CKPT

    prec, par = case["precision"], case.get("parallelism") or ""
    notes, kernels, ac = _row_notes(case), case.get("kernels") or "", _ac(case)
    checks = [
        ("fp8" in prec or "float8" in prec, "float8/fp8 matmuls"),
        (bool(re.search(r"\bTP \d", par)), "tensor parallel"),
        (bool(re.search(r"\bPP \d", par)), "pipeline parallel"),
        (bool(re.search(r"context parallel [2-9]", par)), "context parallel"),
        ("HSDP" in par, "HSDP"),
        ("offload" in par.lower().replace("no cpu offload", "")
         or "enable_activation_offloading=True" in notes, "CPU offload"),
        ("TF32" in prec and "no TF32" not in prec, "TF32 matmuls (trainfit's fp32 is IEEE fp32)"),
        ("UNPACKED" in notes, "unpacked padded batches: step shape data-dependent"),
    ]
    m.unsupported += [what for hit, what in checks if hit]
    if case.get("compile"):  # scored apart either way: the fused/compiled split
        m.approximated.append("torch.compile (trainfit's Inductor-fusion model)"
                              if hasattr(speed, "fuse_elementwise") else "torch.compile (planned eager)")
    if "Liger" in kernels:
        m.approximated.append("Liger fused kernels (planned as stock HF modules)")
    if ac.startswith("selective op") and "selective" in GRAD_CKPT:
        m.approximated.append("selective op AC (trainfit's selective: torchtitan's op policy)")
    elif ac.startswith("selective"):
        m.approximated.append(f"{ac.split('(')[0].strip()} AC (planned as full: lower bound)")
    if "optimizer_in_bwd=True" in notes:
        m.approximated.append("optimizer step in backward (planned as a separate step)")


def _gpu(case: dict[str, Any], m: Mapped) -> None:
    rule = _first(GPU_RULES, case["gpu"])
    fam = _first(FAMILIES, case["gpu"])
    m.family = fam[1] if fam else "other"
    if rule is None or rule[1] is None:
        m.unsupported.append("GPU not in the catalog" + (f" ({rule[2]})" if rule else ""))
        return
    m.gpu = rule[1]
    if rule[2]:
        m.notes.append(rule[2])


def _lora(case: dict[str, Any], job: dict[str, Any]) -> None:
    lora = case.get("lora")
    if case["method"] == "full" or not lora:
        return
    targets = sorted({"mlp" if t in ("gate", "up", "down", "mlp") else t for t in lora["targets"]})
    job.update(lora_r=lora["r"], lora_targets=targets, lora_dropout=lora.get("dropout") or 0.0)
    if lora.get("alpha"):
        job["lora_alpha"] = lora["alpha"]
    if case["method"] == "qlora":
        job["quant"] = "nf4"


def _raschka_harness(case: dict[str, Any], m: Mapped) -> None:
    """LLMs-from-scratch ch05/10: what its numbers are, from its own files.

    The card: "A100" only, but row 10 raised the batch "to the largest power of 2 supported by
    the GPU" and reserved 22.5 GB at 32 (README), so 64 (≈ 2 × 21 GB of activations + 1.3 GB of
    weights, gradients and states) did not fit: a 40 GB A100 (both 40 GB forms have 1555 GB/s
    and the same peaks). The interval: train_model_simple_with_timing divides the interval's
    training tokens by a CUDA-event time that also holds evaluate_model's forwards of
    ``eval_iter`` = 1 train and 1 val batch every ``eval_freq`` steps (15 in 00_orig.py, 10 in
    01_opt_single_gpu.py, 5 in 02_opt_multi_gpu_ddp.py)."""
    m.gpu = "a100-40gb-sxm"
    m.notes = [n for n in m.notes if not n.startswith("A100 variant not stated")]
    m.notes.append("A100 40 GB: the README's batch 64 did not fit (22.5 GB reserved at 32)")
    every = 15 if "_00_" in case["id"] else 5 if case["gpus"] > 1 else 10
    m.timed_interval = (every, 2)
    m.notes.append(f"timed interval = {every} steps + 2 eval forwards (each ⅓ of a step: "
                   "2N of the 6N FLOPs per token)")


def _ladder_factory(case_id: str) -> str:
    """The factory in benchmarks/raschka_gpt.py of a ladder row (``..._05_bf16`` → rows 01-05's
    model): the model code changes at rows 01 (mask on the fly), 06 (torch LayerNorm/GELU), 07
    (fused qkv + SDPA) and 09 (vocabulary 50,304; the DDP rows run the final model)."""
    if "_ddp" in case_id:
        return "ladder_09"
    row = int(case_id.rsplit("a100_", 1)[1][:2])
    return "ladder_" + next(f"{r:02d}" for r in (9, 7, 6, 1, 0) if row >= r)


def _attention(text: str, framework: str = "") -> str:
    """The job's attention from the case's: a flash kernel named (FlashAttention-2, MPT's
    flash/triton, "sdpa (flash kernel)"), or SDPA under a torch older than 2.9, is
    ``sdpa-flash``: on Hopper torch ≥ 2.9 left to itself runs cuDNN's kernel
    (trainfit.memory.sdpa_choice.CUDNN_SDPA_CC), which those runs did not."""
    if text.startswith(("eager", "from-scratch")):
        return "eager"
    version = re.search(r"torch (\d+)\.(\d+)", framework or "")
    old_torch = version is not None and (int(version[1]), int(version[2])) < (2, 9)
    return "sdpa-flash" if "flash" in text.lower() or old_torch else "sdpa"


def _model(case: dict[str, Any], m: Mapped) -> None:
    from trainfit.model.catalog.models import find_model

    d = case["model"]
    seq = m.job["seq_len"]
    if case["group"].startswith("llmfoundry"):
        m.model = {"build": "mpt", "hidden": d["hidden_size"], "layers": d["num_hidden_layers"],
                   "heads": d["num_attention_heads"], "ffn": d["intermediate_size"],
                   "vocab": d["vocab_size"], "positions": seq, "tied": True}
        m.model_note = ("MPT stand-in: GPT2LMHeadModel with the benchmark's dims (biases, learned "
                       "positions, tied head, GELU-tanh)")
        return
    if case["group"].startswith("raschka"):
        _raschka_harness(case, m)
        fn = _ladder_factory(case["id"])
        m.model = {"factory": f"{Path(__file__).parent / 'raschka_gpt.py'}:{fn}",
                   "positions": 1024}
        m.model_note = (f"the ladder's own GPTModel (benchmarks/raschka_gpt.py:{fn}) through "
                        "trainfit's --model file.py:factory")
        return
    hf_id = (d.get("hf_id") or "").split(" ")[0].replace("-128k-", "-4k-")
    entry = find_model(hf_id) if hf_id else None
    if entry is not None:
        m.model = {"catalog": entry.name, "positions": seq}
        if "128k" in (d.get("hf_id") or ""):
            # the 128k config's own window (microsoft/Phi-3-mini-128k-instruct config.json,
            # transformers 4.46.3: sliding_window 262144): the 4k's 2047 would build a mask past
            # 2,047 tokens and send SDPA to the memory-efficient kernel
            m.model["config"] = {"sliding_window": 262144}
            m.model_note = ("Phi-3-mini-128k planned as the catalog's phi-3-mini-4k (same dims) "
                            "with the 128k config's sliding_window 262144 (no window below it)")
        return
    kind = "qwen2" if "qwen" in hf_id.lower() else "llama"
    m.model = {"build": kind, "hidden": d["hidden_size"], "layers": d["num_hidden_layers"],
               "heads": d["num_attention_heads"], "kv_heads": d.get("num_key_value_heads"),
               "ffn": d["intermediate_size"], "vocab": d["vocab_size"], "positions": seq,
               "tied": bool(d.get("tie_word_embeddings"))}
    m.model_note = (f"{d['name'].split('(')[0].strip()}: not in the catalog, "
                   f"{'Qwen2' if kind == 'qwen2' else 'Llama'}Config with its dims")


def _job(case: dict[str, Any], m: Mapped, reduce_dtype_field: bool) -> None:
    from trainfit.job.spec import GRAD_CKPT

    prec = case["precision"]
    precision = next((p for p in ("bf16-true", "amp-bf16", "amp-fp16", "fp32") if prec.startswith(p)),
                     "amp-bf16")
    if prec.startswith("bf16 ("):
        m.notes.append("'bf16' (mixed or true not stated): amp-bf16, Lightning's reading")
    seq = case["model"]["seq_len"]
    if seq != int(seq):
        m.notes.append(f"mean padded length {seq} → seq_len {round(seq)} (tokens/s counts padding)")
    opt_text = case.get("optimizer") or ""
    opt = _first(OPTIMIZERS, opt_text)
    fused = "(fused" in opt_text or ("fused=True" in opt_text
                                     and "unfused" not in (case.get("kernels") or ""))
    if case["group"].startswith("torchtune_optflags") and opt_text.startswith("torch.optim.AdamW"):
        # torchtune 0.5: every torch.optim.AdamW block of its configs sets fused: True (read in
        # the 0.5.0 wheel, llama3_2/3B_full.yaml and 3B_lora_single_device.yaml among them)
        fused = True
        m.notes.append("AdamW not pinned by the table: torchtune 0.5's configs' fused: True")
    optimizer, impl = (opt[1], opt[2]) if opt else ("adamw", "fused" if fused else "foreach")
    sharding = "fsdp" if str(case["sharding"]).startswith("fsdp") else "none"
    mb, ga = case["micro_batch"], case["grad_accum"]
    if ga is None:  # fsdp_qlora's cloud table: "effective batch 32 (or the closest we could get)"
        ga = max(1, round(32 / (mb * m.gpus)))
        m.notes.append(f"accumulation not stated: {ga} (effective batch ≈ 32, the post's target)")
    att = case["attention"]
    m.job = {"method": case["method"], "precision": precision, "seq_len": round(seq),
             "micro_batch": mb, "grad_accum": ga, "optimizer": optimizer, "optimizer_impl": impl,
             "grad_ckpt": ("selective" if _ac(case).startswith("selective op") and "selective"
                           in GRAD_CKPT else "full") if case["grad_ckpt"] else "off",
             "attention": _attention(att, case.get("framework") or ""),
             "ranks": m.gpus, "sharding": sharding, "compile": bool(case.get("compile"))}
    if m.job["compile"]:
        # every compiled case is torchtune's, torchtitan's or plain PyTorch model code: SDPA with
        # is_causal, never transformers' mask built under Dynamo
        m.job["compile_builds_mask"] = False
    if "Trainer default then" in opt_text or "CUDA 11.2" in case["gpu"]:
        m.job["grads_to_none"] = False  # torch < 2.0 Trainer kept zeroed gradients (calibration.py)
        if case["grad_ckpt"]:  # transformers < 4.35 checkpointed with torch's reentrant default
            m.job["ckpt_reentrant"] = True  # (the page is of Jan 2022: transformers ~4.16)
    if "loss=CEWithChunkedOutputLoss" in _row_notes(case):
        m.job["lm_head_chunk"] = round(seq) // 8  # torchtune: 8 chunks of the sequence
    if sharding == "fsdp":
        # torchtitan's / torchao's runs name FSDP2 (fully_shard); llm-foundry (Composer),
        # fsdp_qlora and HF Trainer + accelerate ran FullyShardedDataParallel: flat parameters
        m.job["fsdp_version"] = "2" if "FSDP2" in str(case["sharding"]) else "1"
    if reduce_dtype_field and sharding == "fsdp" and "PURE" in case.get("notes", ""):
        m.job["fsdp_reduce_dtype"] = "param"  # Composer FSDP 'PURE': bf16 gradient reduce
    _lora(case, m.job)


def map_case(file: str, case: dict[str, Any]) -> Mapped:
    from trainfit.hardware.gpus import find_gpu
    from trainfit.job import JobSpec

    meas = case["measured"]
    m = Mapped(id=case["id"], group=case["group"], file=file, gpu_text=case["gpu"], gpu=None,
               family="other", gpus=int(case["gpus"]),
               measured_tokens_per_s=float(meas["tokens_per_s_per_gpu"]), measured_mfu=meas.get("mfu"),
               n_params=case["model"].get("n_params"), confidence=case.get("confidence") or "medium")
    if case.get("confidence") == "low":
        m.notes.append("source confidence: low")
    _gpu(case, m)
    _features(case, m)
    _job(case, m, "fsdp_reduce_dtype" in JobSpec.__dataclass_fields__)
    _model(case, m)
    _interconnect(case, m)
    if m.gpu is not None:
        m.cc = find_gpu(m.gpu).compute_capability or ""
    return m


def build_source(spec: dict[str, Any]) -> Any:
    """The ModelSource of ``Mapped.model`` (in a worker: builds transformers configs)."""
    import copy

    from transformers import AutoConfig, GPT2Config, LlamaConfig, Qwen2Config

    from trainfit.model.catalog.models import find_model
    from trainfit.model.source import ModelSource

    seq = spec["positions"]
    if "factory" in spec:  # the benchmark's own module (an own-model job: model/custom.py)
        from trainfit.model.source import resolve_model

        return resolve_model(spec["factory"])
    if "catalog" in spec:
        entry = find_model(spec["catalog"])
        cfg = AutoConfig.for_model(**{**copy.deepcopy(entry.config), **spec.get("config", {})})
        if (getattr(cfg, "max_position_embeddings", None) or seq) < seq:
            cfg.max_position_embeddings = seq  # RoPE models: the table only bounds the data
        return ModelSource(entry.name, cfg, entry.task, "catalog", entry.note)
    if spec["build"] in ("mpt", "gpt2"):
        p = spec.get("dropout", 0.0)
        cfg = GPT2Config(n_embd=spec["hidden"], n_layer=spec["layers"], n_head=spec["heads"],
                         n_inner=spec["ffn"], vocab_size=spec["vocab"], n_positions=seq,
                         resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
                         activation_function="gelu_pytorch_tanh",
                         tie_word_embeddings=spec["tied"])
    else:
        cls = Qwen2Config if spec["build"] == "qwen2" else LlamaConfig
        cfg = cls(hidden_size=spec["hidden"], num_hidden_layers=spec["layers"],
                  num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
                  intermediate_size=spec["ffn"], vocab_size=spec["vocab"],
                  max_position_embeddings=seq, tie_word_embeddings=spec["tied"])
    return ModelSource(f"{spec['build']}-{spec['hidden']}x{spec['layers']}", cfg, "causal-lm", "local")
