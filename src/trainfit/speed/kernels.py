"""How fast each kind of kernel runs on each GPU family, from published kernel benchmarks.

One ceiling for every GPU (the first speed model: GEMMs at 80 % of peak, flash attention at
55 %) was right on A100 and over-predicted H100 training throughput by ~30 %, growing with the
sequence length: Hopper runs FlashAttention-2 (what eager PyTorch's SDPA calls) at ~30 % of its
peak against ~55 % on A100, and its large GEMMs at 80 % of peak against 87 %.  So the rates are
per family and per kernel, each from a published measurement of that kernel alone (not fitted
to training runs):

* ``gemm_mamf``: S. Bekman's "Maximum Achievable Matmul FLOPS" (stas00/ml-engineering,
  compute/accelerator/README.md; mamf-finder.py): the best dense bf16 GEMM over shapes, as a
  fraction of the datasheet peak.  A training step's GEMMs reach ``GEMM_SHAPE_FACTOR`` of it;
  IEEE fp32 ones (CUDA cores) their own measured fraction (``gemm_mamf_fp32``), without it.
* ``attention``: FlashAttention-2 forward+backward, as a fraction of peak, in FlashAttention's
  FLOP convention (causal attention counted as half the S² work — the flop counter trainfit
  records ops with counts all of it, so causal ops are halved before timing), rising with the
  sequence length S as ``eff_inf · S / (S + S0)`` (fitted to each source's S = 512…16k sweep).
* ``bandwidth_stream``: a streaming copy/scale kernel's fraction of peak DRAM bandwidth
  (te42kyfo/gpu-benches gpu-stream, xytpai/nvbench); elementwise kernels in a training step reach
  ``BANDWIDTH_SHAPE_FACTOR`` of it.
Sources per family in ``KERNELS``; the research notes are in docs/notes/kernel-efficiency.md.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

GEMM_SHAPE_FACTOR = 0.92
"""A training step's GEMMs (skinny K, tails, epilogues) against the best shape MAMF finds:
"real training shapes get about 80-90 % of MAMF" (Bekman).  0.92 × A100's 0.87 = 0.80, the
rate that predicts llm-foundry's A100 runs (125M-30B, seq 512-8k) within ±2 %."""
ATTENTION_STEP_FACTOR = 0.5
"""A training step's attention against the kernel benchmark: half.  Whole-step measurements put
in-step FlashAttention at about half its stand-alone fwd+bwd rate on both families where it can
be read off — llm-foundry's sequence sweeps (MFU falling from 0.62 to 0.47 on A100 and from 0.46
to 0.27 on H100 as the sequence grows from 1k to 64k, 93 runs) and torchtitan's Llama-3.1-8B at
8k on H100 — around the kernel: layout copies (q/k/v transposes), the fp32 dq accumulation and
its conversion, the logsumexp/softmax statistics, GQA expansion.  One factor across families and
harnesses (a calibration, stated), not per case."""
GEMM_UNALIGNED_HALF = 0.5
"""A 16-bit GEMM whose rows are not 16-byte aligned (:func:`trainfit.speed.ops.gemm_aligned`)
against the aligned one: at most half.  H. He, "Solutions: What Shapes Do Matrix
Multiplications Like?" (thonking.ai, question 1): bf16 torch.mm at 2048³ with the innermost
dimension K or N = 2047 takes over 2× the time of M = 2047 (rows still aligned); the GPU is not
named there, so it stands for every family without its own measurement.  The vocabulary
padding folklore is the same mechanism seen from a training step (nanoGPT and
LLMs-from-scratch pad GPT-2's 50,257 to 50,304)."""
GEMM_UNALIGNED_ADA = 0.71
"""RTX 4090 (pytorch/pytorch#181718): bf16 N = 2055/2057/2071/2073 run cuBLAS's
``cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1`` at 106.8-115.6 TF against
155.9 TF for the aligned N = 2040 (mean 0.71)."""
GEMM_UNALIGNED_HOPPER = 0.20
"""H100 SXM, measured here (benchmarks/results/gpu_kernels.md): torch 2.11's bf16 GEMM of GPT-2's
head, 8192 × 50,257 × 768, ran at 121 TFLOP/s against 626 for the aligned 50,304 (0.19; a
repeat: 121 against 583, 0.21). Hopper's aligned kernels use TMA and wgmma, which need 16-byte
aligned rows; the unaligned ones fall back much further than Ampere's or Ada's."""
BANDWIDTH_SHAPE_FACTOR = 0.91
"""Elementwise kernels of a step (short tensors, launch tails, strided reads) against a STREAM
copy at full occupancy: 0.91 × A100's 0.88 = 0.80, the previous single value (which predicted
A100 runs right)."""


@dataclass(frozen=True)
class Attention:
    eff_inf: float
    """Forward+backward fraction of peak at long sequences (FlashAttention's FLOP convention),
    at head_dim 128 (or the source's only head_dim)."""
    s0: float
    """Sequence length at which half of ``eff_inf`` is reached."""
    source: str
    step_factor: float = ATTENTION_STEP_FACTOR
    """The kernel's rate in a training step against its benchmark (see
    :data:`ATTENTION_STEP_FACTOR`; 1.0 where the step itself was measured to run it at the
    benchmark's rate)."""
    head64: tuple[float, float] | None = None
    """(eff_inf, s0) at head_dim 64 where measured: with half the work per loaded tile the
    kernel runs further below its peak; head dims between 64 and 128 are interpolated, smaller
    ones take the 64 curve. None: one curve for every head_dim."""

    def efficiency(self, seq: int, head_dim: int = 128) -> float:
        """In a training step (``step_factor`` × the kernel benchmark's rate)."""
        s = max(seq, 1)
        rate = self.eff_inf * s / (s + self.s0)
        if self.head64 is not None and head_dim < 128:
            e64, s64 = self.head64
            small = e64 * s / (s + s64)
            w = max(0.0, (head_dim - 64) / 64)
            rate = small + w * (rate - small)
        return self.step_factor * rate


@dataclass(frozen=True)
class FamilyKernels:
    family: str
    gemm_mamf: float
    flash: Attention | None
    """None: no flash kernel on this family (torch SDPA falls back to memory-efficient)."""
    efficient: Attention
    """xformers/cutlass memory-efficient attention (SDPA's fallback, and what a padded batch
    with a mask takes)."""
    bandwidth_stream: float
    source: str
    gemm_mamf_fp32: float | None = None
    """IEEE fp32 GEMMs run on the CUDA cores, not the tensor cores: their own fraction of the
    fp32 peak where a source measured it (None: ``gemm_mamf`` × ``GEMM_SHAPE_FACTOR``, see
    :attr:`gemm_efficiency_fp32`)."""
    cudnn: Attention | None = None
    """cuDNN's attention, where SDPA picks it by itself (SM 9.0 and 10.0:
    :data:`trainfit.memory.sdpa_choice.CUDNN_SDPA_CC`); None: the flash entry stands for it."""
    gemm_unaligned: float = GEMM_UNALIGNED_HALF
    """A 16-bit GEMM with unaligned rows, as a fraction of the aligned rate."""

    @property
    def gemm_efficiency(self) -> float:
        return self.gemm_mamf * GEMM_SHAPE_FACTOR

    @property
    def gemm_efficiency_fp32(self) -> float:
        """IEEE fp32 at the family's measured CUDA-core fraction, without ``GEMM_SHAPE_FACTOR``
        (a family with no such measurement takes its tensor-core rate, factor included).

        The factor's costs (operand loads at a skinny K, tails, epilogue writes) are memory
        traffic, mostly hidden behind CUDA-core math that runs at 1/8-1/16 of the tensor cores'
        rate: the H100 measured here (benchmarks/results/gpu_kernels.md) kept 0.955 of its fp32
        8192³ rate at 8192×4096×4096 where bf16 kept 0.865 (both shapes fill 0.97 of their last
        wave, so neither drop is waves).  Those two rows alone do not decide (2 % fast now, 3 %
        slow at the tensor-core rate × factor used before); the published GEMM-bound fp32
        steps do: with the factor V100 BERT-large ran −8 to −13 % and A100 GPT-2 −6 / −8 %,
        without it −2 to −7 % and −0.2 / −2.3 %, all still slow; with the V100 SXM2 boards'
        own measured fp32 rate (0.91, ``CARD_GEMM``) the V100 rows read −2.3 to +2.9 %
        (benchmarks/results/speed_published.md)."""
        if self.gemm_mamf_fp32 is None:
            return self.gemm_mamf * GEMM_SHAPE_FACTOR
        return self.gemm_mamf_fp32

    @property
    def bandwidth_efficiency(self) -> float:
        return self.bandwidth_stream * BANDWIDTH_SHAPE_FACTOR


_FA2_PAPER = "FA2 (Dao 2023, arXiv 2307.08691) Fig. 4(c), A100 causal hd64 fwd+bwd, S=512-16k"
_A5000 = ("gpu-mode/ring-attention notebooks/flash_attn_benchmark_results.txt @3d13c240 (RTX A5000, "
          "FA2 causal hd128 fwd+bwd, S=512-16k)")
_HOPPER_FA2 = ("Dao-AILab/flash-attention PR #2688 benchmark output (Hopper, FA2 fwd+bwd, S=512-16k); "
               "PR #1791: 0.29-0.31 at 8k; FA3 paper: 'FA2 ~35 % on H100'")
_MAMF = "stas00/ml-engineering compute/accelerator/README.md, MAMF table"
_H100_CUDNN = ("measured here: torch 2.11 SDPA on an H100 SXM (cuDNN's kernel, SDPA's own choice), "
               "causal fwd+bwd, 16k tokens per call, S = 512-16k, head_dim 128: 0.19 / 0.32 / 0.41 "
               "/ 0.47 / 0.51 / 0.54 of peak; head_dim 64 (S ≤ 8k): 0.10 / 0.16 / 0.22 / 0.32 / 0.39 "
               "(benchmarks/results/gpu_kernels.md). In HF steps on the same GPU it ran at that rate: "
               "Llama-3.2-1B at 8k positions took 206 ms against 202 predicted with it, 242 at half")
_B200_CUDNN = ("NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts/"
               "sdpa_bf16_benchmark_results_NVIDIA_B200.csv (torch 2.8 SDPA's cuDNN backend, cuDNN "
               "9.10, on a B200; causal fwd+bwd, batch 1, 128 q / 8 kv heads, head_dim 128), S = "
               "512-131k: 0.05 / 0.13 / 0.18 / 0.33 / 0.44 / 0.51 / 0.53 / 0.51 / 0.50 of the "
               "2,250 TF peak. The curve is the minimax fit over 4k-131k (within 6.3 %): a batch-1 "
               "call of 512-2k tokens does not fill the B200 as a training step's micro-batch does "
               "(Hopper's rates were measured at 16k tokens a call), and a newer cuDNN runs faster "
               "there (9.19 on a GB200, same repository, gb200_919_only_cudnn: 0.35 of its 2,500 TF "
               "at 2k, 0.55 at 8k, against the fit's 0.26 and 0.42). In a step at the benchmark's "
               "rate, as Hopper's cuDNN was measured to run (_H100_CUDNN)")
_AMPERE_SGEMM = ("Yinghan-Li/YHs_Sample#4: IEEE fp32 cuBLAS SGEMM 18.88 of 19.49 TF on an A100 "
                 "80GB PCIe at 5120x4096x4096 (0.97; the CUDA cores, not the tensor cores)")
_HOPPER_SGEMM = ("measured here: torch 2.11 IEEE fp32 GEMM 8192^3 on an H100 SXM, 51.6 TF, 0.771 of "
                 "its datasheet peak (benchmarks/results/gpu_kernels.md)")
_VOLTA_GEMM = ("Markidis et al., 'NVIDIA Tensor Core Programmability, Performance & Precision' "
               "(IPDPSW 2018, arXiv 1803.04014): cuBLAS mixed-precision GEMM 83 of 112 TF on a "
               "V100 PCIe (0.74), 7x its single-precision SGEMM (~11.9 of 14 TF: 0.85)")

KERNELS: dict[str, FamilyKernels] = {
    "volta": FamilyKernels(
        "volta", 0.74, None,
        Attention(0.30, 500, "no published fwd+bwd figure: Turing's memory-efficient ~0.3 taken"),
        0.89, f"{_VOLTA_GEMM}; gpu-benches v100 stream 0.89", gemm_mamf_fp32=0.85),
    "turing": FamilyKernels(
        "turing", 0.87, None,
        Attention(0.30, 500, "ssiu/flash-attention-turing README: SDPA ~0.3 of peak (derived)"),
        0.80, "no published MAMF for Turing: A100's taken (an RTX 2080 reads 0.97 of its "
              "datasheet in zzc0721/torch-performance-test-data); bandwidthTest 0.75"),
    "ampere_dc": FamilyKernels(
        "ampere_dc", 0.87, Attention(0.56, 500, _FA2_PAPER),
        Attention(0.26, 500, _FA2_PAPER + " (xformers baseline: 0.26 at 16k)"),
        0.88, f"{_MAMF} (A100 SXM 271/312 TF); gpu-benches a100 stream 0.88; {_AMPERE_SGEMM}",
        gemm_mamf_fp32=0.97),
    "ampere_consumer": FamilyKernels(
        "ampere_consumer", 0.84, Attention(0.63, 410, _A5000),
        Attention(0.30, 410, "memory-efficient ~half of flash (FA2 paper's A100 ratio)"),
        0.94, "cuBLAS GemmEx RTX 3090 0.84 (one point); gpu-benches A40 stream 0.94"),
    "ada": FamilyKernels(
        "ada", 0.94, Attention(0.81, 450, "apache/tvm tl_doc/flash_perf.md (RTX 4090 FA2 causal "
                               "hd128 0.67 at 2k) with the A5000 ramp (eff_inf derived)"),
        Attention(0.38, 450, "memory-efficient ~half of flash (FA2 paper's A100 ratio)"),
        0.91, "pytorch/pytorch#181718 (RTX 4090 aligned bf16 GEMM 0.94); nvbench 4090 copy 0.91",
        gemm_unaligned=GEMM_UNALIGNED_ADA),
    "hopper": FamilyKernels(
        "hopper", 0.80, Attention(0.31, 260, _HOPPER_FA2),
        Attention(0.16, 260, "memory-efficient ~half of flash (FA2 paper's A100 ratio)"),
        0.85, f"{_MAMF} (H100 SXM 794/989 TF); gpu-benches H100 PCIe stream 0.85; "
              f"{_HOPPER_SGEMM}",
        gemm_mamf_fp32=0.771,
        cudnn=Attention(0.568, 822, _H100_CUDNN, step_factor=1.0, head64=(0.489, 2048)),
        gemm_unaligned=GEMM_UNALIGNED_HOPPER),
    "blackwell": FamilyKernels(
        "blackwell", 0.78, Attention(0.15, 180, "Dao-AILab/flash-attention#1589: FA2 on B200"),
        Attention(0.08, 180, "memory-efficient ~half of flash (FA2 paper's A100 ratio)"),
        0.85, f"{_MAMF} (B200 1745/2250 TF); no published stream figure: Hopper's taken",
        cudnn=Attention(0.538, 2210, _B200_CUDNN, step_factor=1.0)),
    # GeForce / workstation Blackwell (sm_120: RTX 50xx) is not the B200's sm_100: no tcgen05 or
    # TMEM, FA2 runs through the same mma.sync path as on Ada, and the peaks it is a fraction of
    # are the GeForce ones (FP32 accumulation at half rate) — Ada's attention and stream rates
    # until one is measured on it (a review: the 5090 took the B200's FA2 0.15, 14 TF at 2k
    # tokens against a 4090's 55)
    "blackwell_geforce": FamilyKernels(
        "blackwell_geforce", 0.97,
        Attention(0.81, 450, "no published FA2 fwd+bwd on sm_120: Ada's (same mma.sync kernels)"),
        Attention(0.38, 450, "memory-efficient ~half of flash (FA2 paper's A100 ratio)"),
        0.91, "zzc0721/torch-performance-test-data: every GeForce desktop card 0.97-1.16 of its "
              "datasheet (the 5090 1.13-1.16; its own entry); stream: Ada's (no published "
              "sm_120 figure)"),
}


def family(compute_capability: str | None, name: str = "") -> str | None:
    """The kernel family of a GPU from its compute capability (the catalog's)."""
    if not compute_capability:
        return None
    major, _, minor = compute_capability.partition(".")
    cc = (int(major), int(minor or 0))
    if cc < (7, 0):
        return None
    if cc < (7, 5):
        return "volta"
    if cc < (8, 0):
        return "turing"
    if cc == (8, 0):
        return "ampere_dc"
    if cc < (8, 9):
        return "ampere_consumer"
    if cc < (9, 0):
        return "ada"
    if cc < (10, 0):
        return "hopper"
    if cc >= (12, 0):  # RTX 50xx, RTX PRO Blackwell: sm_120, not the B200's sm_100
        return "blackwell_geforce"
    return "blackwell"


A100_PCIE_MAMF = 0.81
"""A100 PCIe (250-300 W): 253 of 312 TF in the same MAMF table (power-limited)."""
T4_MAMF = 0.66
"""Tesla T4 (70 W): the best torch.matmul of five squares (1024-10240) reached 41.91 TF fp16 on
Colab (PyTorch 2.8) and 42.71 on Kaggle (PyTorch 2.6) of the datasheet's 65 — 0.64-0.66
(zzc0721/torch-performance-test-data database.md, two independent entries).  The card's power
cap holds its clock far below the 1590 MHz boost the datasheet's figure assumes: the same table
has a 250 W Turing card (RTX 2080) at 0.97 of its datasheet, and A100 / H100 / V100 at 0.79-0.85
/ 0.77 / 0.68-0.78 (near MAMF's 0.87 / 0.80 / 0.74), so the table reads MAMF-like figures."""
T4_MAMF_FP32 = 0.55
"""Tesla T4 IEEE fp32 (CUDA cores): 4.17 and 4.43 of 8.1 TF in the same two entries (0.51-0.55)."""


@dataclass(frozen=True)
class CardGemm:
    """One card's own measured GEMM rates, in place of its family's."""

    gemm_mamf: float
    """Dense 16-bit tensor-core GEMMs: fraction of the datasheet peak."""
    source: str
    gemm_mamf_fp32: float | None = None
    """IEEE fp32 GEMMs where measured on this card; None: the family's fp32 rate (a review: the
    fp32 rate must not follow the 16-bit one, A10 0.77 → 0.41, with no fp32 measurement)."""


_ZZC = "zzc0721/torch-performance-test-data"
_A100_PCIE = CardGemm(A100_PCIE_MAMF, "A100 PCIe 253/312 TF")
_RTX_4060_TI = CardGemm(0.97, f"{_ZZC} database.md: RTX 4060 Ti 16GB bf16 42.65 TF of 44.1 (one "
                              "entry); the 8 GB board is the same AD106 at the same power")
_GA102_WORKSTATION = CardGemm(0.70, "no published rate: GA102 at the RTX A6000's power per core "
                                    "(A5000 230 W / 8192 cores, A4500 200 W / 7168: 28.1 / 27.9 "
                                    "mW, the A6000 27.9): the A6000's 0.70")
_H100_PCIE = CardGemm(0.66, f"{_ZZC} issue #95: H100 PCIe bf16 torch.mm 495.93 TF at 4096² "
                             "(492.84 at 8192²) of 756.5 (0.656); issue #112: the H800 PCIe, the "
                             "same 350 W GH100 board, 503.83 (0.666): their mean. fp32 36.95 / "
                             "37.77 TF of 51.2 (0.72 / 0.74)", gemm_mamf_fp32=0.73)
_V100_SXM2 = CardGemm(0.77, f"{_ZZC} issues #140 / #52: V100-SXM2-16GB fp16 torch.mm 97.36 TF at "
                            "8192² / 94.84 of 125 (0.78 / 0.76); fp32 14.51 / 14.06 of 15.7 "
                            "(0.92 / 0.90). The catalog's V100s are the SXM2 boards (the PCIe "
                            "figure behind Volta's 0.74 is Markidis et al.'s)",
                      gemm_mamf_fp32=0.91)
CARD_GEMM: dict[str, CardGemm] = {
    "a100-40gb-pcie": _A100_PCIE,
    "a100-80gb-pcie": _A100_PCIE,
    "t4": CardGemm(T4_MAMF, "T4 (70 W): torch.matmul 42.7 of 65 TF fp16, 4.4 of 8.1 TF fp32 "
                            f"({_ZZC}); bandwidthTest 0.75", gemm_mamf_fp32=T4_MAMF_FP32),
    # GeForce cards boost above the clock their datasheet figure assumes: measured above 1.0,
    # taken at 1.0 (a figure over the datasheet would put a predicted MFU above its peak)
    "rtx-3090": CardGemm(1.0, f"{_ZZC} database.md: bf16 torch.mm 76.34 / 76.68 / 76.58 TF of "
                              "71.0 (three contributors, 1.07-1.08; taken at 1.0)"),
    "rtx-3080-10gb": CardGemm(1.0, f"{_ZZC} issue #114: bf16 64.68 TF at 10240² of 59.5 (1.09; "
                                   "1.0)"),
    "rtx-3080-20gb": CardGemm(1.0, f"{_ZZC} issue #80: bf16 64.71 TF at 8192² of 59.5 (1.09; "
                                   "1.0)"),
    "rtx-4090": CardGemm(1.0, f"{_ZZC} database.md and issues #41/#50/#78: bf16 torch.mm "
                              "162.4-173.3 TF of 165.2 (seven entries, 0.98-1.05; taken at 1.0); "
                              "chsasank/device-benchmarks 168"),
    # power-capped cards: well below their datasheet, as the T4 and A100 PCIe
    "rtx-a6000": CardGemm(0.70, f"{_ZZC} issue #46: bf16 123.3 TF (0.80); mli/transformers-"
                                "benchmarks README: fp16 95 TF (0.61); two independent entries, "
                                "their mean (300 W; Lambda's fp16 training throughput A6000 ÷ "
                                "3090: bert_large 1.31, transformerxl-large 1.42, "
                                "lambdal/deeplearning-benchmark)"),
    "a40": CardGemm(0.82, f"{_ZZC} issue #185: bf16 122.3 TF at 10240² of 149.7 (one entry; "
                          "300 W)"),
    "l40s": CardGemm(0.735, f"{_ZZC} database.md / issue #43: bf16 269.2 TF of 366 (one entry; "
                            "350 W)"),
    "l4": CardGemm(0.49, f"{_ZZC} issue #120: bf16 59.4 TF at 8192² of 121 (70.9 at 2048²: the "
                         "72 W card holds its clock at small shapes only; a training step's "
                         "GEMMs are large)"),
    "a10": CardGemm(0.45, "chsasank/device-benchmarks README: A10 24GB bf16 56 TF of 125 (one "
                          "entry; 150 W)"),
    "a10g": CardGemm(0.99, f"{_ZZC} issue #126: bf16 69.47 TF at 10240² of 70.0 (one entry)"),
    "rtx-3080-12gb": CardGemm(1.0, "no published rate: the 3080 10GB's GA102 with more power a "
                                   "core (350 W / 8960 against 320 W / 8704), whose GeForce GA102 "
                                   "siblings all read 1.07-1.12 (3080 10/20GB, 3080 Ti, 3090): 1.0"),
    "rtx-3080-ti": CardGemm(1.0, f"{_ZZC} database.md: bf16 76.47 TF of 68.2 (1.12; 1.0)"),
    "rtx-3090-ti": CardGemm(1.0, "no published rate: GA102 with more power a core than the "
                                 "3090 (450 W / 10752 against 350 W / 10496), whose GeForce GA102 "
                                 "siblings all read 1.07-1.12 (3080 10/20GB, 3080 Ti, 3090): 1.0"),
    "rtx-4070-super": CardGemm(1.0, f"{_ZZC} database.md: bf16 76.76 / 73.63 TF of 71.0 (two "
                                    "contributors, 1.08 / 1.04; 1.0)"),
    "rtx-4060-ti-16gb": _RTX_4060_TI,
    "rtx-4060-ti-8gb": _RTX_4060_TI,
    "rtx-5090": CardGemm(1.0, f"{_ZZC} database.md: bf16 236.03 / 242.18 TF of 209.5 (two "
                              "contributors, 1.13 / 1.16; 1.0); a GeForce Blackwell (sm_120) card, "
                              "not the B200 (sm_100): its family is blackwell_geforce"),
    # workstation cards without their own figure take a measured sibling's: the same chip at the
    # same or a lower power per core cannot hold a higher clock under a GEMM (the power cap, not
    # the datasheet's boost clock, sets it on these boards)
    "rtx-a5000": _GA102_WORKSTATION,
    "rtx-a4500": _GA102_WORKSTATION,
    "rtx-a4000": CardGemm(0.70, "no published rate: GA104 at 140 W for 6144 cores (22.8 mW a "
                                "core, below the A6000's 27.9): the A6000's 0.70 taken as its "
                                "upper bound"),
    "rtx-6000-ada": CardGemm(0.735, "no published rate: the L40S's AD102 (18176 cores) at 300 W "
                                    "against its 350 W: the L40S's 0.735 taken as its upper "
                                    "bound"),
    # the 350 W PCIe Hopper runs well below the 700 W SXM board's 0.80 (its clock is held by
    # the power cap, as the A100 PCIe's is): Hopper's family rate made it 21 % too fast
    "h100-pcie": _H100_PCIE,
    "h100-nvl": CardGemm(_H100_PCIE.gemm_mamf, "no square-sweep rate: GH100 at 400 W for 132 SMs "
                                               "(3.03 W an SM, the H100 PCIe's 3.07): the PCIe "
                                               "board's 0.66 as its upper bound (one cublasGemmEx "
                                               "fp16 8192³ point, VibeHPC/VibeGEMM "
                                               "benchmark_results/perf_h100.txt @1e4d3d7, reads "
                                               "451.3 TF of 835.5: 0.54)",
                         gemm_mamf_fp32=_H100_PCIE.gemm_mamf_fp32),
    "v100-16gb": _V100_SXM2,
    "v100-32gb": _V100_SXM2,
}
"""Cards whose own measured dense bf16 GEMM rate (the best torch.mm over square shapes, MAMF's
convention) is published: their fraction of the datasheet peak replaces the family's (the
power-capped A100 PCIe and T4 first; then the cards below, the family's having come from one
card each (an RTX 3090 at 0.84 for all of GA10x — the 3090 itself measures
1.07-1.08, the 300 W A6000 0.61-0.80; an RTX 4090 for all of Ada — the 350 W L40S measures
0.735). The research notes: docs/notes/kernel-efficiency.md."""


GEFORCE_DESKTOP = CardGemm(0.97, f"no published rate of its own: every GeForce desktop card in "
                                 f"{_ZZC} reads 0.97-1.16 of its datasheet in bf16 (RTX 2080 fp16 "
                                 "0.97, 3080 Ti 1.12, 3090 1.07-1.08, 4060 Ti 0.97, 4070 SUPER "
                                 "1.04-1.08, 4090 0.98-1.05, 5090 1.13-1.16): the lowest taken")
"""GeForce desktop boards run their boost clock above the one behind their datasheet figure
(a power budget per core the workstation and datacenter boards of the same chips do not
have), so a GeForce desktop card without its own measurement takes the lowest fraction measured
on one — not its family's, which for Ampere comes from an RTX 3090 point (0.84, contradicted by
three newer entries on the 3090 itself).  Laptop GPUs are not included: their power limit sets
their clock (a GeForce Blackwell laptop card, none in the catalog yet, would take its family's
0.97, set from desktop cards: give it its own entry when one is added)."""


def _geforce_desktop(name: str) -> bool:
    """A GeForce desktop card of the catalog (``rtx-2080-ti``, ``rtx-4060-ti-8gb``), not a
    laptop GPU nor a workstation RTX (``rtx-a6000``, ``rtx-6000-ada``)."""
    name = name.lower()
    series, _, _ = name.removeprefix("rtx-").partition("-")
    return name.startswith("rtx-") and "laptop" not in name \
        and len(series) == 4 and series.isdigit() and series[1:] in {"060", "070", "080", "090"}


def kernels_for(compute_capability: str | None, name: str = "") -> FamilyKernels | None:
    fam = family(compute_capability, name)
    if fam is None:
        return None
    k = KERNELS[fam]
    # a card whose reported memory differs from the catalog's is the catalog's card renamed
    # (hardware.gpus: ``rtx-4090-48gb-reported``, a modded board): its chip's rate (a review)
    name = re.sub(r"-\d+gb-reported$", "", name.lower())
    card = CARD_GEMM.get(name)
    if card is None and _geforce_desktop(name):
        card = GEFORCE_DESKTOP
    if card is None:
        return k
    fp32 = k.gemm_efficiency_fp32 if card.gemm_mamf_fp32 is None else card.gemm_mamf_fp32
    return dataclasses.replace(k, gemm_mamf=card.gemm_mamf, gemm_mamf_fp32=fp32,
                               source=f"{k.source}; {name}: {card.source}")
