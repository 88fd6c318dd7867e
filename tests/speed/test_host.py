"""The host side of a GPU step measured by running the step's code at a tiny width
(trainfit.speed.host): the shrink keeps the model's structure, the arithmetic that turns the
measurement into a GPU host time, the floor it never goes under, and the cache."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import (
    FalconConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    PhiConfig,
    Qwen2Config,
    T5Config,
)

from trainfit.job import JobSpec
from trainfit.model.depth import with_layers
from trainfit.model.source import ModelSource, layer_count
from trainfit.model.workload import build_model_on_meta
from trainfit.speed import host, host_timing
from trainfit.speed.host import LAUNCH_S, HostStep, host_step, shrunk_config, tiny_job
from trainfit.speed.ops import OpRecord
from trainfit.speed.predict import PhaseTimes, with_host
from trainfit.speed.roofline import DeviceSpeed

CONFIGS = {
    "llama-gqa": (LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=3,
                              num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                              pad_token_id=128004), "causal-lm"),
    "mistral": (MistralConfig(num_hidden_layers=2), "causal-lm"),
    "qwen2": (Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                          num_attention_heads=14, num_key_value_heads=2), "causal-lm"),
    "gpt2": (GPT2Config(n_layer=2), "causal-lm"),
    "neox": (GPTNeoXConfig(num_hidden_layers=2, rotary_pct=0.25), "causal-lm"),
    "phi": (PhiConfig(num_hidden_layers=2, partial_rotary_factor=0.5), "causal-lm"),
    "phi-2": (PhiConfig(num_hidden_layers=2, hidden_size=2560, intermediate_size=10240,
                        num_attention_heads=32, partial_rotary_factor=0.4), "causal-lm"),
    "falcon-mqa": (FalconConfig(num_hidden_layers=2, hidden_size=4544, num_attention_heads=71,
                                multi_query=True), "causal-lm"),
    "t5": (T5Config(num_layers=2, num_decoder_layers=2), "seq2seq-lm"),
}


def _classes(job: JobSpec, cfg, task: str):
    src = ModelSource("m", cfg, task, "local")
    if layer_count(src)[0] and task != "seq2seq-lm":
        src = with_layers(src, 2)
    return host._structure(build_model_on_meta(job, src)[0])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_tiny_model_has_the_originals_classes(name: str) -> None:
    cfg, task = CONFIGS[name]
    tiny = shrunk_config(cfg)
    assert tiny is not None
    job = tiny_job(JobSpec(model="m", method="lora"))
    assert _classes(job, tiny, task) == _classes(job, cfg, task)
    width = next(getattr(tiny, a) for a in ("hidden_size", "n_embd", "d_model")
                 if isinstance(getattr(tiny, a, None), int))
    assert width <= 71 * host.HEAD_DIM and tiny.vocab_size == host.VOCAB
    # the grouped-query repeat factor is kept (its Python is the same), heads are 8 wide
    if name == "llama-gqa":
        assert (tiny.num_attention_heads, tiny.num_key_value_heads, tiny.hidden_size) == (4, 1, 32)
        assert tiny.pad_token_id < host.VOCAB


def test_a_partial_rotary_head_keeps_an_even_rotated_part(measuring) -> None:
    """phi-2 rotates 0.4 of each head: 8 dimensions would rotate 3.2 (the tiny step failed and
    nothing was measured); 10 rotate 4.  The tiny step then runs."""
    cfg, task = CONFIGS["phi-2"]
    assert host.head_dim_for(cfg.to_dict()) == 10
    assert host.head_dim_for(GPTNeoXConfig(rotary_pct=0.25).to_dict()) == 8
    src = ModelSource("phi-2", cfg, task, "local")
    assert host_step(JobSpec(model="phi-2", method="lora"), src) is not None


def test_state_space_layers_are_not_shrunk() -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("granitemoehybrid", num_hidden_layers=2,
                               layer_types=["mamba", "attention"])
    assert shrunk_config(cfg) is None


def test_the_gpu_host_time_adds_launches_and_the_ops_the_tiny_run_lacks() -> None:
    hs = HostStep(fb_s=0.050, spread_s=0.0, kernels=2000, layers=16, cpu="x")
    # GPU: 50 ms + 2000 launches + 500 kernels more in the simulation (autocast's casts) at 10 µs
    assert hs.host_s(2500, 10e-6, gpu=True) == pytest.approx(0.050 + 2000 * LAUNCH_S + 0.005)
    # CPU: no launch; fewer simulated kernels than measured add nothing
    assert hs.host_s(1500, 10e-6, gpu=False) == pytest.approx(0.050)


def _dev() -> DeviceSpeed:
    return DeviceSpeed(name="g", peak_flops={"bf16": 1e15}, bandwidth_bytes_s=1e12, sm_count=None,
                       asynchronous=True)


def test_the_op_count_is_the_floor() -> None:
    dev = _dev()
    slow = HostStep(fb_s=0.040, spread_s=0.0, kernels=1000, layers=2, cpu="x")
    fast = HostStep(fb_s=0.001, spread_s=0.0, kernels=1000, layers=2, cpu="x")
    times = PhaseTimes({"fb": 0.010, "optimizer": 0.0}, {"fb": 0.020, "optimizer": 0.0}, 0.0, False)
    assert with_host(dev, times, slow, 1000.0)
    assert times.host_s["fb"] == pytest.approx(0.040 + 1000 * LAUNCH_S)
    times = PhaseTimes({"fb": 0.010, "optimizer": 0.0}, {"fb": 0.020, "optimizer": 0.0}, 0.0, False)
    assert not with_host(dev, times, fast, 1000.0)
    assert times.host_s["fb"] == 0.020
    assert not with_host(dev, times, None, 1000.0)


def test_a_measured_host_makes_a_small_step_launch_bound() -> None:
    from trainfit.speed.predict import predict_speed_exact

    dev = _dev()
    ops = [OpRecord("mm", "forward", 2e9, 1e6, "bf16", (1, 1024, 1024, 1024), True, 1e6)] * 10
    base = predict_speed_exact(dev, ops, 1, 1, 128, 1, 1e6)
    hs = HostStep(fb_s=0.020, spread_s=0.0, kernels=10, layers=1, cpu="x")
    timed = predict_speed_exact(dev, ops, 1, 1, 128, 1, 1e6, host=hs)
    assert not base.host_measured and timed.host_measured
    assert timed.bound == "launch-bound"
    assert timed.step_time_s == pytest.approx(0.020 + 10 * LAUNCH_S)
    assert timed.host_fb_s == pytest.approx(timed.step_time_s)
    # measured, below the op-level floor: the floor stays, and the row is not "the per-op count
    # alone" (an audit: an amp row whose casts the floor counts was called an upper bound)
    quick = predict_speed_exact(dev, ops, 1, 1, 128, 1, 1e6,
                                host=HostStep(fb_s=1e-6, spread_s=0.0, kernels=10, layers=1,
                                              cpu="x"))
    assert quick.host_measured and quick.host_fb_s == base.host_fb_s
    # a busy machine's measurement that set nothing does not make the row "maybe too slow"
    busy = HostStep(fb_s=1e-6, spread_s=0.0, kernels=10, layers=1, cpu="x", busy_cores=1.5,
                    cpus=2)
    assert busy.busy and not predict_speed_exact(dev, ops, 1, 1, 128, 1, 1e6, host=busy).host_busy


@pytest.fixture()
def measuring(monkeypatch, tmp_path, load_at):
    """Measurement on, a fresh cache, and a quiet machine (the test suite's other worker would
    otherwise mark every measurement busy: the busy path has its own test)."""
    monkeypatch.setattr(host_timing, "others_cpu_s", load_at(0.0))
    monkeypatch.setenv(host.SWITCH, "1")
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path))
    monkeypatch.setattr(host, "_MEMO", {})
    monkeypatch.setattr(host_timing, "REPEATS", 3)
    monkeypatch.setattr(host, "WARMUP", 1)
    monkeypatch.setattr(host_timing, "LOAD_WINDOW_S", 0.0)
    return tmp_path


def test_measured_once_then_read_from_the_cache(measuring, tiny_llama, monkeypatch) -> None:
    job = JobSpec(model="tiny-llama", method="lora", precision="bf16-true", grad_ckpt="full")
    hs = host_step(job, tiny_llama)
    assert hs is not None and hs.fb_s > 0 and hs.layers == 3
    # the same code path at another micro-batch, precision and length: not measured again
    monkeypatch.setattr(host, "_MEMO", {})
    monkeypatch.setattr(host, "_measure", lambda *a: pytest.fail("measured twice"))
    again = host_step(job.replace(micro_batch=8, precision="amp-bf16", seq_len=256), tiny_llama)
    assert again == hs


def test_checkpointing_and_lora_add_kernels(measuring, tiny_llama) -> None:
    full = host_step(JobSpec(model="tiny-llama", method="full", grad_ckpt="off"), tiny_llama)
    ckpt = host_step(JobSpec(model="tiny-llama", method="full", grad_ckpt="full"), tiny_llama)
    lora = host_step(JobSpec(model="tiny-llama", method="lora", grad_ckpt="off"), tiny_llama)
    assert full is not None and ckpt is not None and lora is not None
    assert ckpt.kernels > full.kernels  # the recomputed forward
    assert lora.kernels > full.kernels - 3 * 7  # adapters' matmuls; no weight gradients of the base


def test_not_measured_where_the_code_path_differs(measuring, tiny_llama) -> None:
    assert host_step(JobSpec(model="tiny-llama", compile=True), tiny_llama) is None
    custom = dataclasses.replace(tiny_llama, task="custom-lm")
    assert host_step(JobSpec(model="tiny-llama"), custom) is None


def test_switched_off(monkeypatch, tiny_llama) -> None:
    monkeypatch.setenv(host.SWITCH, "0")
    assert host_step(JobSpec(model="tiny-llama"), tiny_llama) is None


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_tiny_run_counts_the_kernels_the_simulation_records(measuring, method: str) -> None:
    """Same job, fp32, no dropout: the tiny CPU run has the kernels the simulation records for
    a GPU, one for one (attention: CPU flash for the GPU's efficient kernel), but for the few
    ops transformers runs on a real mask (cumsum, eq, all, ...: once per step, not per layer)."""
    from trainfit.memory.simulate import simulate_step
    from trainfit.speed.ops import OpRecorder
    from trainfit.speed.predict import fb_kernels

    cfg = GPT2Config(n_embd=128, n_layer=3, n_head=4, vocab_size=2000, n_positions=256,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    src = ModelSource("g", cfg, "causal-lm", "local")
    lora = {"lora_dropout": 0.0} if method == "lora" else {}
    job = JobSpec(model="g", method=method, **lora, precision="fp32", grad_ckpt="off",
                  micro_batch=1, grad_accum=1, seq_len=host.TOKENS)
    hs = host_step(job, src)
    rec = OpRecorder()
    simulate_step(job, src, op_hook=rec)
    assert hs is not None and hs.kernels > 100
    assert abs(hs.kernels - fb_kernels(rec.ops)) <= 8


def test_plan_times_its_rows_with_the_measured_host(measuring, tiny_llama, monkeypatch) -> None:
    """Through ``plan`` (extrapolated rows and the re-simulated pick), with a host step of known
    size: every timed row's forward + backward host time is the measured one plus a launch per
    kernel, so the small rows are launch-bound and their step is that host time."""
    from trainfit.hardware.gpus import find_gpu
    from trainfit.plan.grid import plan

    monkeypatch.setenv("TRAINFIT_WORKERS", "1")
    slow = HostStep(fb_s=0.5, spread_s=0.0, kernels=400, layers=3, cpu="x")
    monkeypatch.setattr(host, "_measure", lambda *a: slow)
    job = JobSpec(model="tiny-llama", method="lora", precision="bf16-true", seq_len=64)
    res = plan(job, tiny_llama, find_gpu("h100"), ladder=False)
    timed = [r for r in res.rows if r.speed is not None and r.speed.tokens_per_s]
    assert timed and all(r.speed.host_measured and r.speed.bound == "launch-bound" for r in timed)
    for r in timed:
        assert r.speed.host_fb_s >= slow.fb_s + slow.kernels * LAUNCH_S
        assert r.speed.host_fb_s < slow.fb_s + 0.05  # + the launches and the casts' op cost
        opt = r.speed.step_time_s - (r.job.grad_accum or 1) * r.speed.host_fb_s
        assert 0 <= opt < 0.05  # the rest is the optimizer's step


def test_a_job_the_tiny_run_cannot_take_keeps_the_op_count(measuring, tiny_llama,
                                                           monkeypatch) -> None:
    """QLoRA with k-bit preparation is measured as its LoRA twin (the preparation flag belongs to
    4-bit jobs only); an error inside the measurement never reaches plan."""
    job = JobSpec(model="tiny-llama", method="qlora", kbit_prepared=True)
    assert host.tiny_job(job).kbit_prepared is False
    # HF's optim="sgd" (no momentum): the tiny run's AdamW takes SGD's default (a review: the
    # JobSpec refused the momentum on AdamW, and the measurement was lost)
    sgd = host.tiny_job(JobSpec(model="tiny-llama", optimizer="sgd", sgd_momentum=0.0))
    assert (sgd.optimizer, sgd.sgd_momentum) == ("adamw", 0.9)
    assert host_step(job, tiny_llama) is not None
    # flash-attention-2 refuses fp32, the tiny run's precision: measured as sdpa, the model this
    # CPU builds for it (a review: every such plan had lost its host measurement)
    fa2 = JobSpec(model="tiny-llama", method="lora", precision="amp-bf16",
                  attention="flash-attention-2")
    assert host.tiny_job(fa2).attention == "sdpa"
    assert host_step(fa2, tiny_llama) is not None

    def boom(*a: object) -> None:
        raise RuntimeError("unforeseen")
    monkeypatch.setattr(host, "_measure", boom)
    monkeypatch.setattr(host, "_MEMO", {})
    assert host_step(JobSpec(model="tiny-llama", grad_ckpt="full", method="full"),
                     tiny_llama) is None


def test_mixture_of_experts_is_not_measured(measuring) -> None:
    """A tiny MoE step is arithmetic, not host time (the experts' matmuls loop on a CPU)."""
    from transformers import Qwen2MoeConfig

    cfg = Qwen2MoeConfig(num_hidden_layers=2, num_experts=8)
    assert host_step(JobSpec(model="m", method="lora"), ModelSource("m", cfg, "causal-lm",
                                                                     "local")) is None


def test_the_callers_random_stream_is_left_as_it_was(measuring, tiny_llama) -> None:
    import torch

    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    assert host_step(JobSpec(model="tiny-llama", method="full"), tiny_llama) is not None
    assert torch.equal(torch.rand(3), expected)


def test_the_step_is_timed_on_one_thread_and_the_pool_is_restored(measuring, tiny_llama,
                                                                   monkeypatch) -> None:
    """A GPU step's ops use no CPU thread pool: the tiny step is timed with torch's intra-op pool
    at one thread (no OpenMP fork/join, which waits on a core another process holds) unless the
    step runs on this CPU, and the caller's thread count is back afterwards, also when the step
    fails."""
    import torch

    seen: list[int] = []
    real = host._run_tiny

    def spy(*args):
        seen.append(torch.get_num_threads())
        return real(*args)

    monkeypatch.setattr(host, "_run_tiny", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        job = JobSpec(model="tiny-llama", method="full")
        assert host_step(job, tiny_llama) is not None
        assert seen == [1]
        assert torch.get_num_threads() == 2
        # a step run on this CPU (tune's CPU target) opens the pool's regions: timed with it, and
        # kept apart from the one-thread measurement
        assert host_step(job, tiny_llama, pool=True) is not None
        assert seen == [1, 2]
        assert host_step(job, tiny_llama) is not None and seen == [1, 2]  # both cached

        def fails(*args):
            raise RuntimeError("the tiny step failed")

        monkeypatch.setattr(host, "_run_tiny", fails)
        with pytest.raises(RuntimeError):
            host._measure(None, None, None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_busy_machine_is_marked_and_measured_again_by_plans_host_phase(
        measuring, tiny_llama, monkeypatch, load_at) -> None:
    """Other processes at a whole core of two: every round busy, the result marked busy; a
    caller beside the simulations does not measure it again, plan's host phase (``again``) does
    and keeps the lower cost, quiet from then on."""
    job = JobSpec(model="tiny-llama", method="full", grad_ckpt="off")
    monkeypatch.setattr(host_timing, "allowed_cpus", lambda: [0, 1])
    monkeypatch.setattr(host_timing, "others_cpu_s", load_at(1.0))
    busy = host_step(job, tiny_llama)
    assert busy is not None and busy.busy and busy.cpus == 2 and busy.step_ops > 0
    assert busy.busy_cores == pytest.approx(1.0, abs=0.05)

    monkeypatch.setattr(host, "_MEMO", {})
    with monkeypatch.context() as m:
        m.setattr(host, "_measure", lambda *a: pytest.fail("measured beside the simulations"))
        assert host_step(job, tiny_llama) == busy  # the cached one stands

    monkeypatch.setattr(host, "_MEMO", {})
    monkeypatch.setattr(host_timing, "others_cpu_s", load_at(0.0))
    quiet = host_step(job, tiny_llama, again=True)
    assert quiet is not None and not quiet.busy and quiet.busy_cores < 0.05
    assert quiet.step_ops <= busy.step_ops
    monkeypatch.setattr(host, "_MEMO", {})
    monkeypatch.setattr(host, "_measure", lambda *a: pytest.fail("a quiet run is measured once"))
    assert host_step(job, tiny_llama, again=True) == quiet


def test_two_measurements_keep_the_lower_cost_and_the_quieter_load() -> None:
    old = HostStep(fb_s=0.08, spread_s=0.0, kernels=10, layers=1, cpu="x", step_ops=8000,
                   busy_cores=1.0, cpus=2)
    higher = dataclasses.replace(old, step_ops=12000)
    lower = dataclasses.replace(old, step_ops=5000, busy_cores=0.6)
    quiet = dataclasses.replace(old, step_ops=9000, busy_cores=0.0)
    assert host.merged(old, higher) == old
    assert host.merged(old, lower) == lower
    both = host.merged(old, quiet)  # a busy machine only adds: 8000 ops stand, now quiet
    assert both.step_ops == 8000 and not both.busy
    assert host.merged(old, None) is old
    # busy is a share of the CPUs: a quarter of a core of 2, 8 cores of 64
    assert old.busy and not dataclasses.replace(old, busy_cores=0.25).busy
    assert not dataclasses.replace(old, busy_cores=8.0, cpus=64).busy
    assert dataclasses.replace(old, busy_cores=8.1, cpus=64).busy


def test_the_step_is_read_in_seconds_at_the_machines_reference(measuring) -> None:
    """Measured while the machine ran at half speed, a step reads the same seconds as one
    measured at full speed once a quiet measurement has seen the machine at full speed (cost in
    reference ops × the machine's reference); a busy measurement never sets that reference."""
    slow = HostStep(fb_s=0.2, spread_s=0.0, kernels=10, layers=1, cpu="x", step_ops=10000,
                    reference_op_s=20e-6)
    assert slow.at_machine_speed().fb_s == pytest.approx(0.2)  # the only speed seen
    busy_fast = dataclasses.replace(slow, fb_s=0.05, reference_op_s=5e-6, busy_cores=1.0)
    assert busy_fast.at_machine_speed().fb_s == pytest.approx(0.2)  # read, not lowered
    fast = dataclasses.replace(slow, fb_s=0.1, reference_op_s=10e-6)
    assert fast.at_machine_speed().fb_s == pytest.approx(0.1)
    assert slow.at_machine_speed().fb_s == pytest.approx(0.1)  # the machine's reference now
    assert HostStep(fb_s=0.05, spread_s=0.0, kernels=1, layers=1,
                    cpu="x").at_machine_speed().fb_s == 0.05  # not measured in reference ops


def test_plan_gets_the_cost_at_the_machines_reference(measuring, tiny_llama) -> None:
    """host_step returns the measured cost × the machine's reference, also from its memo once a
    later quiet measurement has lowered the reference."""
    job = JobSpec(model="tiny-llama", method="full", grad_ckpt="off")
    hs = host_step(job, tiny_llama)
    assert hs is not None and hs.step_ops > 100
    ref = host_timing.machine_reference_op_s()
    assert ref == hs.reference_op_s
    assert hs.fb_s == pytest.approx(hs.step_ops * ref)
    host_timing.machine_reference_op_s(ref / 2)  # a later quiet measurement, twice as fast
    again = host_step(job, tiny_llama)
    assert again.fb_s == pytest.approx(hs.step_ops * ref / 2)
    assert again.step_ops == hs.step_ops


def test_the_busy_note_says_how_busy() -> None:
    from trainfit.render.words import busy_note, launch_note

    assert "other processes" not in launch_note(3, 10, measured_rows=3)
    text = busy_note(2, 1.04)
    assert text.startswith("2 launch-bound row(s)")
    assert "used up to 1.0 CPU cores (measured)" in text


def test_the_launch_note_says_which_rows_were_measured() -> None:
    """QA: 16 launch-bound rows were all called per-op estimates (an upper bound) in one note
    while the next said 8 had their host time measured. Mixed rows are said apart."""
    from trainfit.render.words import launch_note

    mixed = launch_note(16, 30, measured_rows=8)
    assert "8 of them have their host time measured" in mixed and "the other 8" in mixed
    assert "measured" not in launch_note(16, 30).split("(10 µs")[0]  # none measured: per-op
    # which rows the per-op count timed (the table does not show it: a QA run)
    named = launch_note(3, 30, measured_rows=1, per_op_rows=["amp-bf16 off 1×8", "fp32 off 2×4"])
    assert "the other 2 (amp-bf16 off 1×8, fp32 off 2×4) are timed by the per-op count" in named
    assert "Their host time is the step's own code" in launch_note(16, 30, measured_rows=16)
