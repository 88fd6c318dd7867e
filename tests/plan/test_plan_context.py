"""What a plan says beyond its numbers: the assumptions and stack it ran under, which rows are
ranked together and shown, the offload statement, a number the user observed, host RAM, and
progress while it works."""

from __future__ import annotations

import json
from importlib.metadata import version
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from trainfit.hardware.gpus import find_gpu, generic_gpu
from trainfit.job import JobSpec
from trainfit.plan.checks import host_ram_check, observed_check, with_checks
from trainfit.plan.context import AUTO_MAP_GPU_FRACTION, offload_check
from trainfit.plan.grid import plan
from trainfit.plan.rows import ABOVE_FRONTIER, mark_shown, rank_rows

GIB = 2**30


def _row(precision, ckpt, micro, device_gib, fits, eff=None, tps=1.0):
    job = SimpleNamespace(precision=precision, grad_ckpt=ckpt, micro_batch=micro,
                          effective_batch=eff or micro, grad_accum=1, offload="none",
                          activation_offload=False, ranks=1)
    mem = SimpleNamespace(fits=fits, peak_device_bytes=int(device_gib * GIB),
                          breakdown={"parameters": GIB, "activations": 2 * GIB},
                          host_offload_bytes=0, host_activation_bytes=0,
                          host_activation_exact=True)
    return SimpleNamespace(job=job, memory=mem, recommended=False, largest_fitting=False,
                           rank=None, shown=True, speed=SimpleNamespace(tokens_per_s=tps))


def test_plan_carries_its_assumptions_and_the_stack_versions(tiny_llama):
    job = JobSpec(model="t", seq_len=64, effective_batch=8, method="lora", lora_r=8,
                  precision="amp-bf16", grad_ckpt="off")
    res = plan(job, tiny_llama, find_gpu("a10g"))
    a = res.assumptions
    assert (a.method, a.lora_r, a.seq_len, a.effective_batch, a.ranks) == ("lora", 8, 64, 8, 1)
    assert a.versions["torch"] == version("torch")
    assert a.versions["transformers"] == version("transformers")
    assert sum(a.attention_kernels.values()) > 0  # the pick's simulation called SDPA
    d = res.to_dict()
    assert d["assumptions"]["versions"]["peft"] == version("peft")


def test_without_effective_batch_rows_rank_only_against_their_own_batch(tiny_llama):
    res = plan(JobSpec(model="t", seq_len=64, precision="amp-bf16"), tiny_llama, find_gpu("a10g"),
               verify=False)
    batches = {r.job.effective_batch for r in res.rows}
    assert len(batches) > 1
    for eb in batches:  # within one effective batch: ranks 1..n by speed
        ranked = sorted((r for r in res.rows if r.job.effective_batch == eb and r.rank),
                        key=lambda r: r.rank)
        assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
        speeds = [r.speed.tokens_per_s for r in ranked]
        assert speeds == sorted(speeds, reverse=True)


def test_rank_rows_fixed_batch_is_one_ranking():
    rows = [_row("fp32", "off", m, 1, True, eff=8, tps=t) for m, t in ((1, 5.0), (2, 7.0), (4, 6.0))]
    rank_rows(rows, lambda r: -r.speed.tokens_per_s)
    assert [r.rank for r in rows] == [3, 1, 2]


def test_shown_rows_are_the_frontier_and_a_few_above():
    # effective batch varies (accumulation 1): 9 micro-batches, 1..8 fit at most
    rows = [_row("amp-bf16", "off", 2 ** k, 2 ** k, 2 ** k <= 16) for k in range(9)]
    rows += [_row("amp-bf16", "full", 2 ** k, 2 ** k / 4, 2 ** k <= 64) for k in range(9)]
    mark_shown(rows)
    shown = {(r.job.grad_ckpt, r.job.micro_batch) for r in rows if r.shown}
    assert shown == {("off", 16), ("off", 32), ("off", 64), ("full", 64), ("full", 128),
                     ("full", 256)}
    # with a fixed effective batch every fitting row is kept, and at most 2 above
    rows = [_row("fp32", "off", 2 ** k, 2 ** k, 2 ** k <= 16, eff=256) for k in range(9)]
    mark_shown(rows)
    assert [r.job.micro_batch for r in rows if r.shown] == [1, 2, 4, 8, 16, 32, 64]
    assert sum(not r.memory.fits and r.shown for r in rows) == ABOVE_FRONTIER


def test_nothing_fits_in_a_group_shows_its_smallest_rows():
    rows = [_row("fp32", "off", 2 ** k, 10 + k, False, eff=8) for k in range(4)]
    rows[3].recommended = True  # never hidden
    mark_shown(rows)
    assert [r.job.micro_batch for r in rows if r.shown] == [1, 2, 8]


def test_the_current_configurations_row_is_shown_far_from_the_frontier():
    """An audit: plan --current compared the pick against a row the table did not show."""
    from trainfit.job import JobSpec
    from trainfit.plan.rows import show_current

    rows = [_row("fp32", "off", 2 ** k, 10 + k, k < 2, eff=256) for k in range(9)]
    for r in rows:  # the whole job: the current one is matched on every field of the step
        r.job = JobSpec(model="t", precision="fp32", grad_ckpt="off", micro_batch=r.job.micro_batch,
                        effective_batch=256)
    mark_shown(rows)
    assert not rows[8].shown
    show_current(rows, SimpleNamespace(job=rows[8].job.replace()))
    assert rows[8].shown and sum(r.shown for r in rows) == 5


def test_offload_check_follows_transformers_auto_map_budget():
    gpu = find_gpu("t4")
    budget = int(AUTO_MAP_GPU_FRACTION * (gpu.memory_bytes - gpu.cuda_context_bytes))
    small = _row("amp-fp16", "off", 2, 8, True)
    small.memory.breakdown = {"parameters": 2 * GIB}
    o = offload_check(small, gpu)
    assert o.auto_map_budget_bytes == budget and not o.weights_offloaded and o.runs_on_gpu
    big = _row("amp-fp16", "off", 2, 8, True)
    big.memory.breakdown = {"parameters": budget + 1}
    o = offload_check(big, gpu)
    assert o.weights_offloaded and not o.runs_on_gpu
    assert offload_check(None, gpu) is None and offload_check(small, None) is None
    # the pick's own CPU offload, or its activations' offload: not "entirely on the GPU"
    small.job.offload, small.job.ranks, small.memory.host_offload_bytes = "optimizer", 2, 3 * GIB
    o = offload_check(small, gpu)
    assert not o.runs_on_gpu and (o.offload, o.host_offload_bytes, o.ranks) == ("optimizer",
                                                                                3 * GIB, 2)
    from trainfit.render.plan_words import host_held_words
    assert "3.00 GiB per rank, 2 × that = 6.00 GiB on the machine" in host_held_words(o)
    small.job.offload, small.job.activation_offload = "none", True
    small.memory.host_activation_bytes, small.memory.host_activation_exact = 5 * GIB, True
    o = offload_check(small, gpu)
    assert not o.runs_on_gpu and o.host_activation_bytes == 5 * GIB
    assert "5.00 GiB of pinned memory per rank, 2 × that = 10.00 GiB" in host_held_words(o)
    small.memory.host_activation_exact = False  # the bound: said so
    assert ": at most 5.00 GiB of pinned memory" in host_held_words(offload_check(small, gpu))


@pytest.mark.parametrize("sharding, offload, ranks", [("zero3", "optimizer", 2),
                                                      ("zero2", "optimizer", 4),
                                                      ("zero3", "all", 2), ("fsdp", "all", 2)])
def test_a_cpu_offload_holds_in_host_ram_what_it_takes_off_the_gpu(tiny_llama, sharding, offload,
                                                                   ranks):
    """Per rank, for its 1/ranks of the parameters: the fp32 weights (ZeRO's master, FSDP's
    shard: 4 B), AdamW's two states (8 B) and the fp32 gradient (4 B: FSDP's, ZeRO's step
    copy); ZeRO-3 also keeps its 16-bit gradient partition on the host (2 B) and, with the
    parameters, their 16-bit partition (2 B); ZeRO-2 a 16-bit twin of its partition (2 B) and a
    16-bit buffer of the largest parameter — and the GPU holds less."""
    from trainfit.memory.predict import predict_memory

    # unpinned: the bytes themselves (ZeRO-2's pinned blocks: tests/memory/test_host_offload.py)
    job = JobSpec(model="t", seq_len=64, micro_batch=2, grad_accum=1, precision="amp-bf16",
                  grad_ckpt="off", ranks=ranks, sharding=sharding, offload=offload,
                  zero_pin_memory=False)
    gpu = find_gpu("a10g")
    off = predict_memory(job, tiny_llama, gpu, 0.1)
    on = predict_memory(job.replace(offload="none"), tiny_llama, gpu, 0.1)
    assert on.host_offload_bytes == 0
    pinned = 0
    if sharding == "fsdp":
        # FSDP2 pins each parameter's shard and its gradient's: power-of-two blocks, counted
        # here from the model's own shapes (dim 0 split over the ranks, fp32)
        import torch
        from transformers import LlamaForCausalLM

        from trainfit.memory.host_offload import pow2_ceil

        with torch.device("meta"):
            shapes = [p.shape for p in LlamaForCausalLM(tiny_llama.config).parameters()]
        shard = [-(-s[0] // ranks) * (s[1:].numel() if len(s) > 1 else 1) * 4 for s in shapes]
        pinned = 2 * sum(pow2_ceil(b) - b for b in shard)
        assert pinned > 0
    if sharding == "zero2":  # temp_grad_buffer_for_cpu_offload: the embedding, bf16
        pinned = 2 * tiny_llama.config.vocab_size * tiny_llama.config.hidden_size
    if sharding == "zero3" and offload == "all":
        # the optimizer's flat 16-bit buffer of the trainable partitions, pinned whatever
        # pin_memory says (stage3.py _create_param_groups_fp16_flat_cpu_memory): its rounding
        from trainfit.memory.host_offload import pow2_ceil

        part = -(-off.trainable_params // ranks)
        pinned = pow2_ceil(2 * part) - 2 * part  # in the freed per-parameter tensors' place
    per_param = (off.host_offload_bytes - pinned) * ranks / off.trainable_params
    want = {"zero2": 18, "zero3": 18 + 2 * (offload == "all"), "fsdp": 16}[sharding]
    assert per_param == pytest.approx(want, abs=0.15)
    assert off.peak_allocated_bytes < on.peak_allocated_bytes


def test_observed_check_scales_the_answer():
    rows = [_row("amp-fp16", "off", m, 4 * m, 4 * m <= 0.9 * 16) for m in (1, 2, 4, 8)]
    cur = _row("amp-fp16", "off", 2, 8, True)
    cur.memory.breakdown = {"parameters": 2 * GIB, "optimizer": GIB, "activations": 3 * GIB,
                            "temporaries": GIB}
    res = SimpleNamespace(current=cur, gpu_memory_bytes=16 * GIB, margin=0.1, rows=rows)
    o = observed_check(res, 4 * GIB, "nvidia-smi", ["seq_len"])
    assert o.ratio == pytest.approx(0.5)
    assert (o.fixed_bytes, o.seq_scaled_bytes) == (3 * GIB, 4 * GIB)
    (s,) = o.scaled
    assert (s.largest_micro_predicted, s.largest_micro_if_scaled) == (2, 4)


def test_host_ram_check_counts_weights_at_load_and_host_batches():
    job = JobSpec(model="t", seq_len=320, micro_batch=32, grad_accum=1, ranks=2,
                  precision="amp-bf16", grad_ckpt="off", num_workers=2, prefetch_factor=2)
    h = host_ram_check(job, 100_000_000, 7 * 10**9)
    assert h.weights_load_bytes_per_rank == 400_000_000  # full fine-tune: fp32 master weights
    assert h.host_batch_bytes_per_rank == 32 * 320 * 8 * 3 * (1 + 2 * 2)
    assert h.known_bytes == 2 * (400_000_000 + h.host_batch_bytes_per_rank)
    lora = host_ram_check(job.replace(method="lora"), 100_000_000, 7 * 10**9)
    assert lora.weights_load_bytes_per_rank == 200_000_000
    # an activation offload's pinned bytes (memory/host_offload.py) count on every rank
    assert "rounding" not in h.unknown  # no offload: nothing pinned to round
    zero = host_ram_check(job.replace(offload="optimizer", sharding="zero2",
                                      zero_pin_memory=False), 100_000_000, 7 * 10**9,
                          offload_bytes=10**8)
    assert "power-of-two rounding of its pinned partitions (--zero-pin-memory plans it)" in \
        zero.unknown
    pinned = host_ram_check(job.replace(offload="optimizer", sharding="zero2"), 100_000_000,
                            7 * 10**9, offload_bytes=10**8)  # pinned: DeepSpeed 0.19's default
    assert "rounding" not in pinned.unknown  # modelled: memory/zero_host.py
    zero3 = host_ram_check(job.replace(offload="optimizer", sharding="zero3"), 100_000_000,
                           7 * 10**9, offload_bytes=10**8)
    assert "rounding" not in zero3.unknown  # modelled: memory/zero_host.py
    zero3_plain = host_ram_check(job.replace(offload="all", sharding="zero3",
                                             zero_pin_memory=False), 100_000_000, 7 * 10**9,
                                 offload_bytes=10**8)
    assert "(--zero-pin-memory plans it)" in zero3_plain.unknown
    fsdp = host_ram_check(job.replace(offload="all", sharding="fsdp"), 100_000_000, 7 * 10**9,
                          offload_bytes=10**8)
    assert "rounding" not in fsdp.unknown  # modelled: memory/host_offload.py pinned_shards
    act = host_ram_check(job, 100_000_000, 7 * 10**9, offload_bytes=10**8, activation_bytes=3 * GIB)
    assert act.activation_offload_bytes_per_rank == 3 * GIB
    assert act.known_bytes == h.known_bytes + 2 * (10**8 + 3 * GIB)


def test_progress_reports_every_stage(tiny_llama):
    seen = []
    cur = JobSpec(model="t", seq_len=64, micro_batch=1, grad_accum=4, precision="amp-bf16",
                  grad_ckpt="full")
    res = plan(JobSpec(model="t", seq_len=64, effective_batch=4, precision="amp-bf16"),
               tiny_llama, find_gpu("a10g"), current=cur,
               progress=lambda what, done, total: seen.append((what, done, total)))
    assert res.current is not None
    whats = [w for w, _, _ in seen]
    assert any(w.startswith("small simulations") for w in whats)
    assert "your current configuration, full size" in whats
    groups = [(d, t) for w, d, t in seen if w.startswith("small simulations")]
    assert groups[-1][0] == groups[-1][1] == 2  # 2 checkpointing settings


def test_job_file_checks_reach_the_json(tiny_config_json, tmp_path):
    from trainfit.cli.main import app

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({
        "model": str(tiny_config_json), "gpu": "a10g", "seq_len": 64, "effective_batch": 4,
        "precision": "amp-bf16", "current": {"micro_batch": 1, "grad_accum": 4},
        "observed": {"device": "600MiB", "source": "nvidia-smi"}, "assumed": ["seq_len"],
        "host_ram_free": "7GB"}))
    r = CliRunner().invoke(app, ["plan", str(f), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    obs = d["observed"]
    assert obs["observed_device_bytes"] == 600 * 2**20
    assert obs["ratio"] == pytest.approx(600 * 2**20 / d["current"]["peak_device_bytes"])
    assert d["assumptions"]["assumed"] == ["seq_len"]
    assert d["host_ram"]["free_bytes"] == 7 * 10**9
    assert d["offload"]["runs_on_gpu"] is True
    assert "seq 64 (assumed)" in d["header"]
    assert "plan: small simulations" in r.stderr  # progress on stderr, not in the JSON


def test_bad_observed_is_a_clear_error(tiny_config_json, tmp_path, monkeypatch):
    from trainfit.cli.main import app

    def no_plan(*args, **kwargs):
        raise AssertionError("planned before the job file was checked")

    monkeypatch.setattr("trainfit.plan.grid.plan", no_plan)  # bad input fails before the work
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({"model": str(tiny_config_json), "gpu": "a10g",
                                 "seq_len": 128, "observed": "lots"}))
    r = CliRunner().invoke(app, ["plan", str(f)])
    assert r.exit_code == 2 and "`observed` needs a device size" in r.stderr


def test_with_checks_without_a_current_configuration(tiny_llama):
    res = plan(JobSpec(model="t", seq_len=64, effective_batch=4, precision="amp-bf16",
                       grad_ckpt="off"), tiny_llama, generic_gpu(8), verify=False)
    out = with_checks(res, observed_device_bytes=GIB, observed_source="x")
    assert out.observed is None  # nothing to compare the observation with


@pytest.mark.parametrize("ranks,sharding,offload,said", [
    (1, "none", "none", "1 rank, "),
    (2, "none", "none", "2 ranks (DDP)"),
    (8, "fsdp", "none", "8 ranks (FSDP)"),
    (1, "fsdp", "none", "1 rank (--sharding fsdp over one rank shards nothing: planned without "
                        "FSDP, as train runs it)"),
    (1, "fsdp", "all", "1 rank (FSDP, parameters and optimizer states on the CPU)"),
    (2, "zero3", "optimizer", "2 ranks (DeepSpeed ZeRO-3, optimizer states on the CPU)"),
    (1, "zero3", "all", "1 rank (DeepSpeed ZeRO-3, parameters and optimizer states on the CPU)"),
    (4, "zero2", "none", "4 ranks (DeepSpeed ZeRO-2)"),
])
def test_header_names_how_the_ranks_share_the_model(ranks, sharding, offload, said):
    """A ZeRO-3 plan's header said "2 ranks (DDP)": every engine is named as planned."""
    from trainfit.plan.context import plan_assumptions
    from trainfit.render.plan_words import plan_header

    job = JobSpec(model="t", seq_len=64, ranks=ranks, sharding=sharding, offload=offload)
    res = SimpleNamespace(assumptions=plan_assumptions(job, {"flash": 1}))
    assert said in plan_header(res)


@pytest.mark.parametrize("env,on", [
    ({}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128, expandable_segments:True"}, True),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, True),
    # which name wins where both are set has changed between torch releases: either may
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:True",
      "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,expandable_segments:False"}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}, False),
])
def test_the_shells_allocator_setting_is_read(env, on):
    from trainfit.memory.expandable import env_expandable_segments

    assert env_expandable_segments(env) is on


def test_header_names_the_allocator_and_a_shell_that_sets_another(monkeypatch):
    from trainfit.plan.context import plan_assumptions
    from trainfit.render.plan_words import plan_header

    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    job = JobSpec(model="t", seq_len=64)
    said = plan_header(SimpleNamespace(assumptions=plan_assumptions(job, {})))
    assert "allocator: PyTorch's default segments (this shell sets expandable_segments:True" in said
    planned = plan_assumptions(job.replace(expandable_segments=True), {})
    assert planned.expandable_segments and planned.shell_expandable_segments
    assert "allocator: expandable segments" in plan_header(SimpleNamespace(assumptions=planned))


def test_header_names_each_precisions_attention_kernel(tiny_llama):
    """SDPA picks by dtype: on an A10G a grouped-query model's fp32 rows take the math kernel
    (the memory-efficient one takes no grouped heads) and its 16-bit rows flash; the header says
    both instead of one row's."""
    from trainfit.render.plan_words import plan_header

    res = plan(JobSpec(model="t", seq_len=64, effective_batch=2, grad_ckpt="off"), tiny_llama,
               find_gpu("a10g"), verify=False)
    by = res.assumptions.attention_kernels_by_precision
    assert by["fp32"] == ["math"]
    assert by["bf16-true"] == by["amp-bf16"] == ["flash"]
    said = plan_header(res)
    assert "math kernel (fp32)" in said and "flash kernel (" in said
    one = SimpleNamespace(assumptions=SimpleNamespace(**{
        **vars(res.assumptions), "attention_kernels": {"flash": 6},
        "attention_kernels_by_precision": {"bf16-true": ["flash"], "amp-bf16": ["flash"]}}))
    assert "attention sdpa → flash kernel," in plan_header(one)  # one kernel: said once
    eager = SimpleNamespace(assumptions=SimpleNamespace(**{
        **vars(res.assumptions), "attention": "eager", "attention_kernels": {},
        "attention_kernels_by_precision": {"bf16-true": []}}))
    assert "attention eager → no SDPA kernel (the model's own matmul + softmax" in \
        plan_header(eager)  # was "→ none called kernel"


@pytest.mark.parametrize("ranks,sharding", [(1, "none"), (8, "fsdp")])
def test_the_device_map_clause_is_said_for_one_process_only(ranks, sharding):
    """device_map="auto" is one process's placement: said (as a condition) for one rank; over
    many ranks only whether the pick stays on the GPU (a QA run saw the clause under FSDP × 8)."""
    from trainfit.plan.context import OffloadCheck, plan_assumptions
    from trainfit.render.plan_words import offload_words

    job = JobSpec(model="t", seq_len=64, ranks=ranks, sharding=sharding)
    o = OffloadCheck(weights_bytes=GIB, auto_map_budget_bytes=20 * GIB, weights_offloaded=False,
                     device_peak_bytes=10 * GIB, capacity_bytes=24 * GIB, runs_on_gpu=True)
    said = offload_words(SimpleNamespace(offload=o, assumptions=plan_assumptions(job, {})))
    assert said.startswith("the pick runs entirely on the GPU: device peak 10.00 of 24.00 GiB")
    assert ('loaded with device_map="auto", transformers would keep every module' in said) == \
        (ranks == 1)


def test_every_json_row_carries_its_host_bytes(tiny_llama):
    """A review: docs/json-formats.md promised each row's host RAM (CPU offload, activation
    offload); only the pick's was in the JSON, in the top-level offload block."""
    job = JobSpec(model="t", seq_len=64, effective_batch=4, precision="amp-bf16", ranks=2,
                  sharding="zero2", offload="optimizer")
    res = plan(job, tiny_llama, find_gpu("a10g"))
    d = res.to_dict()
    assert len(d["configs"]) == len(res.rows) > 1
    for c, r in zip(d["configs"], res.rows, strict=True):
        assert c["host_offload_bytes"] == r.memory.host_offload_bytes > 0
        assert c["host_activation_bytes"] == 0 and c["host_activation_exact"] is True


def test_a_pick_keeps_fp32_weights_unless_pure_bf16_gains_beyond_the_prediction_error():
    """An audit: a script's amp-bf16 was told to train in pure bf16 (no fp32 weights) for a
    predicted +0.9 %, where speed predictions of its kind err by 14 % (median).  With a current
    configuration that keeps fp32 weights, a bf16-true row is picked only for a gain beyond the
    band's median error; the row passed over is stated."""
    from types import SimpleNamespace

    from trainfit.job import JobSpec
    from trainfit.plan.pick import keep_fp32_weights
    from trainfit.plan.pick import recommend as _recommend

    def row(precision: str, tps: float, micro: int = 4) -> SimpleNamespace:
        return SimpleNamespace(
            job=JobSpec(model="gpt2", precision=precision, micro_batch=micro, grad_accum=2,
                        grad_ckpt="off"),
            memory=SimpleNamespace(fits=True), speed=SimpleNamespace(tokens_per_s=tps))

    rows = [row("amp-bf16", 129_397.0), row("bf16-true", 130_594.0), row("fp32", 50_000.0)]
    assert _recommend(rows) == 1  # no current configuration: the fastest
    assert _recommend(rows, 0.14) == 0
    kept = keep_fp32_weights(rows, 0, 0.14)
    assert kept["precision"] == "bf16-true" and kept["tokens_per_s"] == 130_594.0
    assert kept["gain"] == pytest.approx(130_594 / 129_397 - 1)
    # a gain beyond the band is taken, and nothing is said passed over
    rows[1].speed.tokens_per_s = 129_397.0 * 1.2
    assert _recommend(rows, 0.14) == 1 and keep_fp32_weights(rows, 1, 0.14) is None
    # an amp row that does not fit is no alternative
    rows[1].speed.tokens_per_s = 130_594.0
    rows[0].memory.fits = False
    assert _recommend(rows, 0.14) == 1


def test_a_pick_keeps_the_current_precision_unless_another_gains_beyond_the_error():
    """An audit: a LoRA script on a bf16 base under amp-bf16 was told ``dtype=torch.float32,
    bf16=False`` for a predicted +11.8 %, inside the 14 % median error — doubling its frozen
    weights' memory for a gain the predictions cannot resolve.  With a current configuration
    another precision is taken only beyond the band; the row passed over is stated."""
    from types import SimpleNamespace

    from trainfit.job import JobSpec
    from trainfit.plan.pick import keep_fp32_weights
    from trainfit.plan.pick import recommend as _recommend

    def row(precision: str, tps: float) -> SimpleNamespace:
        return SimpleNamespace(
            job=JobSpec(model="gpt2", precision=precision, micro_batch=16, grad_accum=1,
                        grad_ckpt="off"),
            memory=SimpleNamespace(fits=True), speed=SimpleNamespace(tokens_per_s=tps))

    rows = [row("amp-bf16", 191_521.0), row("fp32", 214_151.0)]
    assert _recommend(rows, 0.14) == 1  # no current precision: the fastest
    assert _recommend(rows, 0.14, "amp-bf16") == 0
    kept = keep_fp32_weights(rows, 0, 0.14)
    assert kept["precision"] == "fp32" and kept["gain"] == pytest.approx(214_151 / 191_521 - 1)
    rows[1].speed.tokens_per_s = 191_521.0 * 1.3  # beyond the band: taken
    assert _recommend(rows, 0.14, "amp-bf16") == 1 and keep_fp32_weights(rows, 1, 0.14) is None


def test_header_names_the_loss_path_every_row_ran():
    """An audit: ``--trl-logprob-head`` and ``--no-trl-logprob-head`` printed the same header
    for rows 7.7 GiB apart; the loss path is named (``lm_head_chunk`` too)."""
    from trainfit.plan.context import plan_assumptions
    from trainfit.render.plan_words import plan_header

    said = {}
    for name, extra in (("trl", {"trl_logprob_head": True}), ("chunk", {"lm_head_chunk": 1024}),
                        ("whole", {})):
        job = JobSpec(model="t", seq_len=64, **extra)
        said[name] = plan_header(SimpleNamespace(assumptions=plan_assumptions(job, {}),
                                                 rows=[SimpleNamespace(job=job)]))
    assert "loss: TRL's fused log-prob head" in said["trl"]
    assert "loss: head and loss in chunks of 1,024 tokens" in said["chunk"]
    assert "loss over the whole logits" in said["whole"]


def test_the_plan_names_the_layers_lora_adapted_and_whence():
    """An audit: ``default`` is peft's default only where peft has one (Llama: q_proj, v_proj);
    for Phi-3 peft 0.21 has none and trainfit takes q, v (its fused qkv_proj) — the plan said
    neither.  Now the assumptions (header and --json) name the layers and where they came from."""
    import transformers as T

    from trainfit.model.source import ModelSource
    from trainfit.plan.context import lora_modules_of, plan_assumptions
    from trainfit.render.plan_words import _lora_modules_words

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    llama = ModelSource("l", T.LlamaConfig(**common), "causal-lm", "local")
    phi3 = ModelSource("p", T.Phi3Config(**common, pad_token_id=0), "causal-lm", "local")
    lora = JobSpec(model="x", seq_len=32, method="lora")
    assert lora_modules_of(lora, llama) == (["q_proj", "v_proj"], "peft's default for llama")
    assert lora_modules_of(lora, phi3) == (["qkv_proj"],
                                           "peft has no default for phi3: trainfit's q, v")
    asked = lora.replace(lora_targets=["q", "o", "mlp"])
    assert lora_modules_of(asked, llama) == (
        ["down_proj", "gate_proj", "o_proj", "q_proj", "up_proj"], "lora_targets q,o,mlp")
    assert lora_modules_of(lora.replace(lora_targets=["all-linear"]), llama)[0] == ["all-linear"]
    a = plan_assumptions(lora, {}, source=phi3)
    assert _lora_modules_words(a) == " on qkv_proj (peft has no default for phi3: trainfit's q, v)"
    assert plan_assumptions(lora.replace(method="full"), {}, source=llama).lora_modules == []

