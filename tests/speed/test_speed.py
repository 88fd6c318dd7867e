"""Speed model: wave quantization, batch scaling of recorded ops, MFU accounting, unknowns."""

import dataclasses

import pytest

from trainfit.hardware.gpus import find_gpu, generic_gpu
from trainfit.job import JobSpec
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.speed.ops import OpRecord, OpRecorder
from trainfit.speed.predict import model_flops_per_token, ops_at_batch, predict_speed_exact
from trainfit.speed.roofline import GEMM_TILE, DeviceSpeed, gemm_time, op_device_time, split_k


def _gemm_tflops(name: str) -> float:
    """A catalog card's dense bf16 GEMM rate as the speed model runs it, TFLOP/s."""
    d = DeviceSpeed.from_gpu(find_gpu(name))
    return d.gemm_efficiency * d.peak_flops["bf16"] / 1e12


def test_gemm_pays_for_partial_waves():
    dev = DeviceSpeed.from_gpu(find_gpu("a100-80gb"))
    full = gemm_time(dev, (1, GEMM_TILE * 108, GEMM_TILE, 4096), "bf16")  # one full wave
    one_more = gemm_time(dev, (1, GEMM_TILE * 108 + 1, GEMM_TILE, 4096), "bf16")
    assert one_more == pytest.approx(2 * full)  # a second, almost empty wave


def test_gemm_that_cannot_fill_a_wave_is_split_along_k():
    dev = DeviceSpeed.from_gpu(find_gpu("v100-16gb"))  # 80 SMs
    # BERT-large at one 512-token sample: 4 x 8 = 32 output tiles, 40 % of the SMs
    assert split_k(32, 1024, 80) == 2
    one_wave = gemm_time(dev, (1, 512, 1024, 1024), "fp32")
    # IEEE fp32 runs on the CUDA cores: Volta's own measured rate, not its tensor cores'
    assert dev.gemm_efficiency_fp32 != dev.gemm_efficiency
    unsplit = 2.0 * GEMM_TILE * GEMM_TILE * 1024 / (dev.peak_flops["fp32"] / 80) \
        / dev.gemm_efficiency_fp32
    partials = 8.0 * 2 * 512 * 1024 / (dev.bandwidth_bytes_s * dev.bandwidth_efficiency)
    assert one_wave == pytest.approx(unsplit / 2 + partials)
    # a wave or more of tiles, or a K too short to slice: no split, the wave quantization stands
    assert split_k(80, 4096, 80) == 1 and split_k(200, 4096, 80) == 1
    assert split_k(10, GEMM_TILE, 80) == 1
    # never more slices than free SMs, never a slice shallower than one tile
    assert split_k(30, 100 * GEMM_TILE, 80) == 2 and split_k(1, 3 * GEMM_TILE, 80) == 3


def test_unknown_peak_gives_unknown_time():
    dev = DeviceSpeed.from_gpu(find_gpu("t4"))
    op = OpRecord("mm", "forward", 2.0, 8.0, "bf16", (1, 1, 1, 1), True)
    assert op_device_time(dev, op) is None  # a T4 has no bf16
    assert DeviceSpeed.from_gpu(generic_gpu(4)).peak_flops["bf16"] is None


def _ops(src, b):
    rec = OpRecorder()
    simulate_step(JobSpec(model="t", seq_len=64, micro_batch=b, precision="amp-bf16"), src,
                  SimTarget(device="cuda"), op_hook=rec)
    return rec.ops


def test_ops_rebuilt_at_another_batch_match_the_recorded_ones(tiny_llama):
    o2, o3, o5 = _ops(tiny_llama, 2), _ops(tiny_llama, 3), _ops(tiny_llama, 5)
    rebuilt = ops_at_batch(o2, o3, 2, 3, 5)
    assert [o.name for o in rebuilt] == [o.name for o in o5]
    assert sum(o.flops for o in rebuilt) == pytest.approx(sum(o.flops for o in o5))
    assert [o.gemm for o in rebuilt] == [o.gemm for o in o5]


def test_larger_micro_batch_is_faster_per_token_and_less_launch_bound(tiny_llama):
    dev = DeviceSpeed.from_gpu(find_gpu("a100-80gb"))
    fpt = 1.0
    small = predict_speed_exact(dev, _ops(tiny_llama, 2), 2, 1, 64, 1, fpt)
    big = predict_speed_exact(dev, _ops(tiny_llama, 5), 5, 1, 64, 1, fpt)
    assert big.tokens_per_s > small.tokens_per_s
    assert small.bound == "launch-bound"  # a tiny model: eager overhead dominates
    assert small.device_busy_fraction < 1.0


def test_model_flops_follow_palm(tiny_gpt2):
    cfg = tiny_gpt2.config  # tied embeddings: the head is the embedding matrix
    n, seq = 1_000_000, 64
    full = model_flops_per_token(cfg, n, n, seq, True)
    attn = 12 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * seq
    assert full == 6 * n + attn
    lora = model_flops_per_token(cfg, n, 1000, seq, False)
    assert lora == 4 * (n - 1000) + 6 * 1000 + attn


def test_hopper_sdpa_is_timed_as_cudnn_at_its_measured_rates():
    """SDPA left to itself runs cuDNN's attention on an H100 (the simulation records its op);
    its rates by head_dim are those measured there (benchmarks/results/gpu_kernels.md: 0.507 of
    the bf16 peak at 8k positions and head_dim 128, 0.391 at head_dim 64); a family without a
    measured cuDNN entry times the op with its flash rates."""
    import dataclasses

    from trainfit.speed.kernels import KERNELS
    from trainfit.speed.roofline import attention_efficiency

    h100 = DeviceSpeed.from_gpu(find_gpu("h100"))
    a100 = DeviceSpeed.from_gpu(find_gpu("a100-80gb"))
    op = OpRecord("_scaled_dot_product_cudnn_attention", "forward", 1e12, 0.0, "bf16", None, True,
                  seq=8192, causal=True, head_dim=128)
    assert attention_efficiency(h100, op) == pytest.approx(0.507, abs=0.015)
    assert attention_efficiency(h100, dataclasses.replace(op, head_dim=64)) == \
        pytest.approx(0.391, abs=0.015)
    flash = dataclasses.replace(op, name="_scaled_dot_product_flash_attention")
    assert attention_efficiency(h100, flash) < attention_efficiency(h100, op)  # FA2's, halved
    assert attention_efficiency(a100, op) == attention_efficiency(a100, flash) == \
        KERNELS["ampere_dc"].flash.efficiency(8192)


def test_b200_sdpa_is_timed_as_cudnn_at_its_published_rates():
    """SDPA on a B200 (SM 10.0) runs cuDNN's attention as on Hopper (sdpa_choice.CUDNN_SDPA_CC),
    at the rates NVIDIA's cudnn-frontend benchmark published for torch SDPA's cuDNN backend on a
    B200 (0.44 of the peak at 8k, 0.51 at 16k). A review: left on FlashAttention-2, a B200 was
    predicted slower than an H100 at 16k tokens; per second the B200 runs more attention than
    the H100 at every length from 1k to 128k."""
    from trainfit.speed.roofline import attention_efficiency

    b200, h100 = (DeviceSpeed.from_gpu(find_gpu(n)) for n in ("b200", "h100-sxm"))
    op = OpRecord("_scaled_dot_product_cudnn_attention", "forward", 1e12, 0.0, "bf16", None, True,
                  seq=8192, causal=True, head_dim=128)
    assert attention_efficiency(b200, op) == pytest.approx(0.44, rel=0.12)
    assert attention_efficiency(b200, dataclasses.replace(op, seq=16384)) == \
        pytest.approx(0.51, rel=0.12)
    for seq in (1024, 2048, 4096, 8192, 16384, 32768, 131072):
        at = dataclasses.replace(op, seq=seq)
        assert attention_efficiency(b200, at) * b200.peak_flops["bf16"] > \
            attention_efficiency(h100, at) * h100.peak_flops["bf16"], seq


def test_backward_ops_cost_the_host_more_on_a_gpu():
    """Measured on an H100's host: 15 µs per backward node (the autograd engine's device thread)
    against ~10 µs per forward op; a CPU device runs both on its own measured cost."""
    from trainfit.speed.roofline import op_host_time

    gpu = DeviceSpeed.from_gpu(find_gpu("h100"))
    fwd = OpRecord("mul", "forward", 0.0, 8.0, "bf16", None, True)
    bwd = OpRecord("mul", "backward", 0.0, 8.0, "bf16", None, True)
    view = OpRecord("view", "backward", 0.0, 0.0, "bf16", None, False)
    assert (op_host_time(gpu, fwd), op_host_time(gpu, bwd), op_host_time(gpu, view)) == \
        pytest.approx((10e-6, 15e-6, 2.5e-6))
    cpu = DeviceSpeed(name="cpu", peak_flops={"fp32": 1e11}, bandwidth_bytes_s=1e10, sm_count=None,
                      asynchronous=False, op_overhead_s=3e-6)
    assert op_host_time(cpu, bwd) == op_host_time(cpu, fwd) == 3e-6


def test_the_70_w_t4_runs_its_gemms_at_its_measured_rate():
    """A T4 holds its clock far below the boost its datasheet peak assumes (70 W): torch.matmul
    measured 42.7 of 65 TF fp16 and 4.4 of 8.1 TF fp32 there, where the Turing family's rate
    (A100's, 0.87 × 0.92) made its GEMMs 1.3× (fp16) and 1.6× (fp32) too fast.  A 250 W Turing
    GeForce card does not take the T4's rate."""
    from trainfit.speed.roofline import gemm_time

    t4 = DeviceSpeed.from_gpu(find_gpu("t4"))
    ti = DeviceSpeed.from_gpu(find_gpu("rtx-2080-ti"))
    assert t4.gemm_efficiency == pytest.approx(0.66 * 0.92)
    assert t4.gemm_efficiency_fp32 == pytest.approx(0.55)  # CUDA cores: no in-step shape factor
    # a GeForce desktop card: its 16-bit GEMMs at the lowest GeForce fraction (0.97), its fp32
    # ones at the family's (no fp32 rule)
    assert ti.gemm_efficiency == pytest.approx(0.97 * 0.92)
    assert ti.gemm_efficiency_fp32 == pytest.approx(0.87 * 0.92)
    shape = (1, 4096, 4096, 4096)
    fp16 = 2 * 4096**3 / gemm_time(t4, shape, "fp16")
    fp32 = 2 * 4096**3 / gemm_time(t4, shape, "fp32")
    assert 0.55 * 65e12 < fp16 < 0.66 * 65e12  # at most what the card measured
    assert 0.45 * 8.1e12 < fp32 <= 0.55 * 8.1e12


def test_an_mfu_above_100_percent_is_unknown_not_printed() -> None:
    """A step whose executed FLOPs exceed what the peak allows in its time is a modelling error:
    its tokens/s is as wrong as its utilisation, and the speed is unknown, said (a review: the
    MFU went blank and the tokens/s behind it was printed). A model FLOP count above the
    executed one (6N over experts a token never runs) is capped by the executed count."""
    from trainfit.speed.predict import PhaseTimes, SpeedPrediction, speed_from_times
    from trainfit.speed.roofline import DeviceSpeed

    dev = DeviceSpeed(name="g", peak_flops={"bf16": 1e15}, bandwidth_bytes_s=1e12,
                      sm_count=None, asynchronous=True)

    def timed(executed_flops: float, model_flops_per_token: float) -> SpeedPrediction:
        times = PhaseTimes({"fb": 0.010, "optimizer": 0.0}, {"fb": 0.001, "optimizer": 0.0},
                           executed_flops, False)
        # micro-batch 1 × accumulation 1 of 1,000 tokens on 1 rank, in 10 ms
        return speed_from_times(dev, times, 1e15, 1, 1, 1000, 1, model_flops_per_token,
                                peak_dtype="bf16")

    # 1e13 FLOPs in 10 ms = 1e15 FLOP/s: exactly the peak
    at_peak = timed(1e13, 1e10)
    assert at_peak.mfu == pytest.approx(1.0) and at_peak.hfu == pytest.approx(1.0)
    assert at_peak.tokens_per_s == pytest.approx(1e5)
    # a model formula above the executed FLOPs: capped by them, the speed kept
    capped = timed(1e13, 2e10)
    assert capped.mfu == pytest.approx(1.0) and capped.tokens_per_s == at_peak.tokens_per_s
    # twice the peak's FLOPs in the time: no speed at all, and why
    over = timed(2e13, 1e10)
    assert over.tokens_per_s is None and over.step_time_s is None and over.mfu is None
    assert "faster than the bf16 peak allows (200% of it in the FLOPs its kernels execute)" in \
        over.unknown_reason
    # ... unless half of them is causal attention's masked half, which the count keeps and a
    # flash kernel skips (the review's doubt): a possible step, whose utilisations, counted
    # PaLM's way, are above 100 %: those are unknown, the speed is not
    times = PhaseTimes({"fb": 0.010, "optimizer": 0.0}, {"fb": 0.001, "optimizer": 0.0}, 2e13,
                       False, skipped_flops=1e13)
    flash = speed_from_times(dev, times, 1e15, 1, 1, 1000, 1, 3e10, peak_dtype="bf16")
    assert flash.tokens_per_s == pytest.approx(1e5) and flash.mfu is None and flash.hfu is None


def test_fp32_gemms_run_at_the_cuda_cores_measured_rate_without_the_shape_factor():
    """The in-step shape factor stands for memory-side costs that CUDA-core fp32 math hides: a
    family with a measured CUDA-core rate runs fp32 at it (Hopper's 0.771, a V100 SXM2's own
    0.91, not × 0.92), bf16 keeps the factor, and a family without one takes its tensor-core
    rate.  The H100 kernel rows it is checked against: tests/benchmarks/test_benchmarks_gpu.py."""
    from trainfit.speed.kernels import GEMM_SHAPE_FACTOR, kernels_for

    gpu = find_gpu("h100-sxm")
    dev = DeviceSpeed.from_gpu(gpu)
    hopper = kernels_for(gpu.compute_capability, gpu.name)
    assert dev.gemm_efficiency_fp32 == pytest.approx(hopper.gemm_mamf_fp32)
    assert dev.gemm_efficiency == pytest.approx(hopper.gemm_mamf * GEMM_SHAPE_FACTOR)
    v100 = DeviceSpeed.from_gpu(find_gpu("v100-16gb"))
    assert v100.gemm_efficiency_fp32 == pytest.approx(0.91)
    ada = DeviceSpeed.from_gpu(find_gpu("l40"))  # (no card rate of its own, no rule)
    assert ada.gemm_efficiency_fp32 == pytest.approx(ada.gemm_efficiency)


def test_qlora_times_its_dequantizations(tiny_llama):
    """An audit: a QLoRA row had LoRA's step time to the last digit — bitsandbytes'
    dequantization of each 4-bit weight, in the forward and again in the backward, allocated
    but never timed. Each is now a kernel reading the packed half byte and writing the 16-bit
    weight (2.5 B per element), and the step is that much slower than LoRA's."""
    cfg = tiny_llama.config
    dev = DeviceSpeed.from_gpu(find_gpu("a100-80gb"))

    def ops(method):
        rec = OpRecorder()
        simulate_step(JobSpec(model="t", seq_len=64, micro_batch=2, precision="amp-bf16",
                              method=method, lora_targets="all-linear", grad_ckpt="off"),
                      tiny_llama, SimTarget(device="cuda"), op_hook=rec)
        return rec.ops

    lora, qlora = ops("lora"), ops("qlora")
    deq = [o for o in qlora if o.name == "dequantize_4bit"]
    # q, o: h×h; k, v: h×h/2 (2 of 4 heads); gate, up, down: h×ffn
    layer_elems = (2 * cfg.hidden_size ** 2 + 2 * cfg.hidden_size * cfg.hidden_size // 2
                   + 3 * cfg.hidden_size * cfg.intermediate_size)
    # 7 linears a layer, dequantized in the forward and again in the backward — but for the
    # first layer's q, k, v, whose input (the frozen embedding's) needs no gradient: as in
    # bitsandbytes, MatMul4Bit's backward does not run
    layers = cfg.num_hidden_layers
    first_qkv = cfg.hidden_size ** 2 * 2
    assert [o.phase for o in deq].count("forward") == 7 * layers
    assert [o.phase for o in deq].count("backward") == 7 * layers - 3
    assert all(o.kernel and o.dtype == "bf16" for o in deq)
    assert sum(o.bytes for o in deq) == 2.5 * (2 * layer_elems * layers - first_qkv)
    # the rest of the step computes what LoRA's does
    assert sum(o.flops for o in qlora) == pytest.approx(sum(o.flops for o in lora))
    t_lora = predict_speed_exact(dev, lora, 2, 1, 64, 1, 1.0).step_time_s
    t_qlora = predict_speed_exact(dev, qlora, 2, 1, 64, 1, 1.0).step_time_s
    assert t_qlora > t_lora


def test_a_card_with_its_own_published_gemm_rate_takes_it():
    """The family rates came from one card each (Ampere consumer/workstation: a 3090 at 0.84;
    Ada: a 4090). The 3090 itself measures 1.07-1.08 of its datasheet, the 300 W A6000 0.61-0.80,
    the 350 W L40S 0.735 (docs/notes/kernel-efficiency.md 1b'): those cards take their own rate
    (above 1.0 taken at 1.0), the others keep their family's."""
    from trainfit.hardware.gpus import find_gpu as find
    from trainfit.speed.kernels import CARD_GEMM, KERNELS, family, kernels_for

    for name, card in CARD_GEMM.items():
        gpu = find(name)  # every entry names a catalog card (a typo would never apply)
        assert gpu.name == name and 0 < card.gemm_mamf <= 1.0 and card.source
        k = kernels_for(gpu.compute_capability, gpu.name)
        assert k.gemm_mamf == card.gemm_mamf and k.family == family(gpu.compute_capability)
        # IEEE fp32 keeps the family's rate unless the card's own was measured (the T4's)
        fp32 = card.gemm_mamf_fp32 or KERNELS[k.family].gemm_efficiency_fp32
        assert k.gemm_efficiency_fp32 == pytest.approx(fp32)
    assert kernels_for("7.5", "t4").gemm_efficiency_fp32 == pytest.approx(0.55)
    assert kernels_for("8.6", "rtx-a6000").gemm_efficiency_fp32 == pytest.approx(0.84 * 0.92)
    for name in ("l40", "rtx-3050-laptop-4gb", "b200", "h100-sxm"):  # no rule of their own
        gpu = find(name)
        fam = family(gpu.compute_capability)
        assert kernels_for(gpu.compute_capability, gpu.name).gemm_mamf == KERNELS[fam].gemm_mamf

    # the A6000's datasheet says 2.18× the 3090 (154.8 / 71); Lambda's fp16 training measured
    # 1.31-1.42× (bert_large, transformerxl-large): the GEMM rates now say 1.53× (2.18× before)
    assert _gemm_tflops("rtx-a6000") / _gemm_tflops("rtx-3090") == pytest.approx(1.526, abs=0.01)


def test_cards_without_their_own_gemm_rate_keep_the_order_of_their_measured_siblings():
    """A GeForce desktop card without its own figure takes the lowest fraction measured on one
    (0.97), not its family's (Ampere's 0.84 from one 3090 point, Blackwell's from the B200); a
    workstation card takes its measured sibling's (the same chip at the same or lower power per
    core): the 3080 12GB is no longer predicted slower than the 3080 10GB, nor the RTX 6000 Ada
    (300 W) faster than the L40S (350 W) on the same AD102."""
    from trainfit.hardware.gpus import find_gpu as find
    from trainfit.speed.kernels import GEFORCE_DESKTOP, _geforce_desktop, kernels_for

    assert [_geforce_desktop(n) for n in ("rtx-2080-ti", "rtx-4060-ti-8gb", "rtx-5080",
                                          "rtx-a6000", "rtx-6000-ada", "rtx-3050-laptop-4gb",
                                          "a10g", "gtx-1080-ti")] == [True] * 3 + [False] * 5
    for name in ("rtx-3060-12gb", "rtx-3070-ti", "rtx-4080", "rtx-5080", "rtx-2080-ti"):
        gpu = find(name)
        assert kernels_for(gpu.compute_capability, gpu.name).gemm_mamf == GEFORCE_DESKTOP.gemm_mamf
    # ordered as their cores × clocks: 3080 10GB ≤ 3080 12GB ≤ 3080 Ti ≤ 3090 (all GA102)
    ga102 = [_gemm_tflops(n) for n in ("rtx-3080-10gb", "rtx-3080-12gb", "rtx-3080-ti",
                                       "rtx-3090")]
    assert ga102 == sorted(ga102)
    assert _gemm_tflops("rtx-6000-ada") <= _gemm_tflops("l40s")
    assert _gemm_tflops("rtx-a5000") / 111.1 == pytest.approx(_gemm_tflops("rtx-a6000") / 154.8)
    assert _gemm_tflops("rtx-4080") < _gemm_tflops("rtx-4090")
    assert _gemm_tflops("rtx-5080") < _gemm_tflops("rtx-5090")
    # the 5090 takes its own measured rate, far above the B200-derived family's 0.78
    assert _gemm_tflops("rtx-5090") == pytest.approx(209.5 * 0.92, rel=1e-3)


def test_geforce_blackwell_is_not_the_b200_and_a_renamed_card_keeps_its_rate():
    """A review: the RTX 5090 (sm_120) took the B200's (sm_100) FlashAttention rate, 14 TF at 2k
    tokens against a 4090's 55; and a card renamed for its reported memory
    (``rtx-4090-48gb-reported``, a modded board) lost its own GEMM rate."""
    from trainfit.hardware.gpus import find_gpu as find
    from trainfit.speed.kernels import KERNELS, family, kernels_for

    assert family("12.0") == "blackwell_geforce" and family("10.0") == "blackwell"
    k5090 = kernels_for("12.0", "rtx-5090")
    assert k5090.flash.eff_inf == KERNELS["ada"].flash.eff_inf > 5 * KERNELS["blackwell"].flash.eff_inf
    flash = {n: DeviceSpeed.from_gpu(find(n)) for n in ("rtx-4090", "rtx-5090")}
    assert flash["rtx-5090"].peak_flops["bf16"] > flash["rtx-4090"].peak_flops["bf16"]
    assert kernels_for("8.9", "rtx-4090-48gb-reported").gemm_mamf == 1.0
    assert kernels_for("8.6", "rtx-a5000-12gb-reported").gemm_mamf == 0.70
    assert kernels_for("8.0", "a100-80gb-pcie-40gb-reported").gemm_mamf == 0.81


def test_power_capped_hopper_boards_run_their_own_measured_gemm_rate():
    """The 350 W H100 PCIe measured 0.656 of its datasheet in bf16 (the 700 W SXM board 0.80;
    zzc0721/torch-performance-test-data #95, the H800 PCIe 0.666 in #112): Hopper's family rate
    made it 21 % too fast. The H100 NVL (GH100 at a lower power per SM) takes it as its upper
    bound; the H200 and GH200 (700 W+) keep the SXM board's rate."""
    sxm, pcie, nvl = _gemm_tflops("h100-sxm"), _gemm_tflops("h100-pcie"), _gemm_tflops("h100-nvl")
    assert pcie / sxm == pytest.approx(0.66 * 756.5 / (0.80 * 989.4), rel=1e-3)
    assert pcie < nvl < sxm
    assert _gemm_tflops("h200") == pytest.approx(sxm) == pytest.approx(_gemm_tflops("gh200-96gb"))


def test_a_lora_steps_mfu_counts_no_more_flops_than_it_executes(tiny_llama):
    """An audit: LoRA rows without checkpointing printed MFU above HFU (Falcon-7B: 0.770 against
    0.761) — the formula's 4·N_frozen counts the input gradient of the first layer's frozen
    q/k/v, which autograd skips (their input, the frozen embedding's, needs none). A prediction's
    model FLOPs are now the lesser of the formula and the FLOPs the step executes."""
    cfg = tiny_llama.config
    dev = DeviceSpeed.from_gpu(find_gpu("a100-80gb"))
    rec = OpRecorder()
    job = JobSpec(model="t", seq_len=64, micro_batch=2, precision="amp-bf16", method="lora",
                  lora_targets="all-linear", grad_ckpt="off")
    sim = simulate_step(job, tiny_llama, SimTarget(device="cuda"), op_hook=rec)
    formula = model_flops_per_token(cfg, sim.total_params, sim.trainable_params, 64, False,
                                    matmul_params=sim.info["matmul_params"])
    sp = predict_speed_exact(dev, rec.ops, 2, 1, 64, 1, formula)
    # what the backward skips: 2 FLOPs per weight of the first layer's frozen q/k/v and of
    # their LoRA A matrices (rank 16), whose input is the embedding's
    h, n = cfg.hidden_size, sim.info["matmul_params"]
    first_qkv = h * h + 2 * h * (cfg.num_key_value_heads * h // cfg.num_attention_heads)
    backward_mm = sum(o.flops for o in rec.ops if o.phase == "backward" and o.name == "mm") / 128
    frozen, trainable = n - sim.trainable_params, sim.trainable_params
    assert backward_mm == 2 * frozen + 4 * trainable - 2 * (first_qkv + 3 * 16 * h)
    executed = sum(o.flops for o in rec.ops if o.phase != "optimizer") / 128
    assert executed < formula
    assert sp.model_flops_per_token == pytest.approx(executed, rel=1e-9)
    assert sp.mfu <= sp.hfu
    assert sp.mfu == pytest.approx(sp.hfu, rel=1e-9)  # no recomputation: the same FLOPs
    # with checkpointing the recomputation is executed too: the formula stands, below HFU
    rec2 = OpRecorder()
    simulate_step(dataclasses.replace(job, grad_ckpt="full"), tiny_llama,
                  SimTarget(device="cuda"), op_hook=rec2)
    sp2 = predict_speed_exact(dev, rec2.ops, 2, 1, 64, 1, formula)
    assert sp2.model_flops_per_token == formula and sp2.mfu < sp2.hfu


@pytest.mark.parametrize("precision", ["amp-bf16", "fp32"])
def test_trls_chunked_head_gemms_are_counted_and_timed_as_gemms(tiny_llama, precision):
    """A review: trl's chunked log-prob head accumulates its gradients with
    ``addmm(out_dtype=float32)`` (16-bit products, whose flop_registry entry raised on the
    ``out_dtype``) or ``addmm_`` (fp32, not in the registry): both counted 0 FLOPs and the
    in-place one was timed as an elementwise op, so a full fine-tune's executed FLOPs fell below
    PaLM's formula and its MFU was lowered 9 %. They are GEMMs, at their operands' dtype."""
    dev = DeviceSpeed.from_gpu(find_gpu("a100-80gb"))
    rec = OpRecorder()
    job = JobSpec(model="t", seq_len=64, micro_batch=2, precision=precision, method="full",
                  grad_ckpt="off", trl_logprob_head=True)
    sim = simulate_step(job, tiny_llama, SimTarget(device="cuda"), op_hook=rec)
    # 126 positions (64 - 1 per row: the shifted labels), hidden 128, vocabulary 2000
    acc = [o for o in rec.ops if o.phase == "backward" and o.name in ("addmm", "addmm_")
           and o.gemm in ((1, 126, 128, 2000), (1, 2000, 128, 126))]
    assert len(acc) == 2  # grad_hidden += tile @ W, grad_weight += tileᵀ @ h
    assert all(o.flops == 2.0 * 126 * 128 * 2000 for o in acc)
    formula = model_flops_per_token(tiny_llama.config, sim.total_params, sim.trainable_params,
                                    64, True, matmul_params=sim.info["matmul_params"])
    sp = predict_speed_exact(dev, rec.ops, 2, 1, 64, 1, formula)
    assert sp.model_flops_per_token == formula and sp.mfu <= sp.hfu


def test_a_grid_rows_speed_comes_from_its_micro_batch_segment():
    """An extrapolated row's speed is read from the points its memory is (the chord to the
    largest micro-batch), not the line through micro-batches 2 and 3: a compiled, checkpointed
    Qwen2.5-0.5B step's fused kernels move more bytes a sample at large micro-batches, and that
    line put micro-batch 64 13 % under its full-size simulation (0.087 s against 0.100 s) and
    faster than the same step without checkpointing (an audit)."""
    from trainfit.model.source import resolve_model
    from trainfit.plan.grid import plan

    src = resolve_model("qwen2.5-0.5b")
    gpu = find_gpu("h100-sxm")
    job = JobSpec(model="qwen2.5-0.5b", seq_len=128, precision="amp-bf16", grad_ckpt="full",
                  compile=True, method="full")
    (row,) = [r for r in plan(job, src, gpu, verify=False).rows if r.job.micro_batch == 64]
    exact = plan(row.job, src, gpu, verify=False).rows[0]
    assert row.how == "extrapolated" and exact.how == "simulated"
    assert row.speed.step_time_s == pytest.approx(exact.speed.step_time_s, rel=0.01)
