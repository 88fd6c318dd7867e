"""Numbers of the Report built from the real seed-002 plan + synthetic tune/train/doctor/monitor."""

from __future__ import annotations

import json
import math

import pytest
from report_paths import FIXTURES, SEED002, SEED002_NOW

from trainfit.report import build_report, load_inputs
from trainfit.report.build import memory_components_gib
from trainfit.report.model import GIB
from trainfit.report.timeline import find_gaps

PLAN = json.loads(SEED002.read_text())


def _row(report, setting_prefix: str, mb: int):
    rows = [r for r in report.sections[0].table.rows
            if r.setting.startswith(setting_prefix) and r.micro_batch == mb]
    assert len(rows) == 1
    return rows[0]


def test_plan_only_section_is_predicted_only():
    rep = build_report(load_inputs([str(SEED002)]))
    (s,) = rep.sections
    assert s.capacity_gib == pytest.approx(21160263680 / GIB)  # 19.71 GiB, the GPU catalog's
    assert s.margin == 0.1
    assert len(s.table.rows) == 12 and [f.label for f in s.families] == [
        "amp-bf16, checkpointing off", "amp-bf16, checkpointing full"]
    assert all(r.device_measured_gib is None and r.tokens_per_s_measured is None for r in s.table.rows)
    # no baseline: speed-up vs the slowest predicted row (checkpointing full, micro-batch 1)
    slowest = min(c["tokens_per_s"] for c in PLAN["configs"])
    pick = _row(rep, "amp-bf16, checkpointing off", 32)
    assert pick.pick == "plan"
    pick_tps = PLAN["configs"][PLAN["recommended_index"]]["tokens_per_s"]
    assert pick.speed_up_predicted == pytest.approx(pick_tps / slowest)
    assert _row(rep, "amp-bf16, checkpointing full", 1).speed_up_predicted == pytest.approx(1.0)
    assert pick.device_predicted_gib == pytest.approx(17203188736 / GIB)
    assert pick.epoch_predicted_s is None  # dataset size unknown → unknown, not guessed
    assert [p.source for p in s.picks] == ["plan"]


def test_a_plan_with_unknown_speeds_reports_them_unknown():
    """Today's seed 002 plan: two GeForce cards, link unknown, so every speed is null; the report
    still shows the memory and the pick, and every speed-up as unknown (None), not 0 or 1."""
    now = json.loads(SEED002_NOW.read_text())
    assert all(c["tokens_per_s"] is None for c in now["configs"])
    rep = build_report(load_inputs([str(SEED002_NOW)]))
    (s,) = rep.sections
    assert len(s.table.rows) == len(now["configs"])
    assert all(r.speed_up_predicted is None for r in s.table.rows)
    pick = now["configs"][now["recommended_index"]]
    row = _row(rep, "amp-bf16, checkpointing off", pick["micro_batch"])
    assert row.pick == "plan"
    assert row.device_predicted_gib == pytest.approx(pick["peak_device_bytes"] / GIB)


def test_dataset_tokens_give_time_per_epoch():
    pick_tps = PLAN["configs"][PLAN["recommended_index"]]["tokens_per_s"]
    rep = build_report(load_inputs([str(SEED002)]), dataset_tokens=round(pick_tps * 1000))
    assert _row(rep, "amp-bf16, checkpointing off", 32).epoch_predicted_s == pytest.approx(1000.0, rel=1e-6)


def test_stacked_components_add_up_to_device_peak():
    rep = build_report(load_inputs([str(SEED002)]))
    for fam in rep.sections[0].families:
        for bar in fam.bars:
            assert sum(bar.components_gib.values()) == pytest.approx(bar.predicted_device_gib, rel=0.02)
    c = load_inputs([str(SEED002)]).plans[0].configs[5]
    parts = memory_components_gib(c)
    # CUDA context = device − reserved (402 MiB in the GPU catalog for this GPU)
    assert parts["CUDA context"] * 1024 == pytest.approx(402, abs=1)
    assert parts["parameters"] == pytest.approx(750769152 / GIB)


def test_tune_measurements_merge_into_plan_rows(full_report):
    s = full_report.sections[0]
    assert len(full_report.sections) == 1  # tune of the same model joins the plan's section
    (r16,) = [r for r in s.table.rows if r.setting == "amp-bf16, checkpointing off"
              and r.micro_batch == 16]
    # two ok probes of 16 × 2: 33,000 tokens/s with 0 loader workers, 34,500 with tune's pick's 4
    # (the knob stage): each is its own row, the pick's row its own probe's (the median of the two
    # was the pick's before)
    assert r16.tokens_per_s_measured == 34500.0
    (w0,) = [r for r in s.table.rows if r.setting == "amp-bf16, checkpointing off, num_workers 0"]
    assert (w0.micro_batch, w0.tokens_per_s_measured, w0.pick) == (16, 33000.0, "")
    # the loader does not change the step: plan's prediction of it stands on both rows
    assert w0.device_predicted_gib == r16.device_predicted_gib is not None
    assert r16.device_measured_gib == pytest.approx(12.1, abs=1e-6)
    assert r16.host_ram_measured_gib == pytest.approx(13.9, abs=1e-6)
    assert r16.pick == "tune"
    # baseline (1 × 32) is the speed-up reference, at its row's median probe (14,800 tokens/s;
    # the baseline entry's own 14,000 is one measurement), predicted ref = plan row 1 × 32
    assert r16.speed_up_measured == pytest.approx(34500 / 14800)
    tps = {(c["grad_ckpt"], c["micro_batch"]): c["tokens_per_s"] for c in PLAN["configs"]}
    assert r16.speed_up_predicted == pytest.approx(tps[("off", 16)] / tps[("off", 1)])
    assert r16.epoch_measured_s == pytest.approx(25_600_000 / 34500)
    # the rows measured only with 0 workers (the batch stage's) stay beside plan's predictions
    r4 = _row(full_report, "amp-bf16, checkpointing off", 4)
    assert r4.setting == "amp-bf16, checkpointing off" and r4.tokens_per_s_measured == 29000.0
    assert r4.device_predicted_gib is not None
    assert _row(full_report, "amp-bf16, checkpointing off", 32).status_measured == "oom"
    assert _row(full_report, "amp-bf16, checkpointing off", 2).status_measured is None
    assert "baseline" in s.table.reference
    off = s.families[0]
    assert [p.status for p in off.memory_measured_gib].count("oom") == 1
    assert sorted(p.value for p in off.tokens_per_s_measured) == [14800.0, 29000.0, 33000.0, 34500.0]
    assert {p.source for p in s.picks} == {"plan", "tune"}


def test_monitor_gaps_are_counted_and_not_interpolated(full_report):
    by_path = {t.path.rsplit("/", 1)[-1]: t for t in full_report.timelines}
    jsonl, csv = by_path["monitor.jsonl"], by_path["monitor.csv"]
    # 82 rows: one per GPU (2) at each of 41 sampling instants (a review: read as 82 samples)
    assert jsonl.samples == 41 and jsonl.median_interval_s == 1.0
    assert jsonl.gaps_s == [(20.0, 35.0), (45.0, 52.0)]
    assert csv.samples == 8 and csv.gaps_s == [(8.0, 20.0)]
    util = jsonl.panels[0]
    assert [s.label for s in util.series] == ["GPU busy, GPU 0", "GPU busy, GPU 1"]
    for s in util.series:
        # 41 samples per GPU + one NaN inside each gap; nothing drawn between 20 and 35 s
        assert len(s.values) == 41 + 2
        assert sum(math.isnan(v) for v in s.values) == 2
        inside = [v for t, v in zip(s.time_s, s.values, strict=True) if 20 < t < 35]
        assert len(inside) == 1 and math.isnan(inside[0])
    mem = jsonl.panels[1]
    assert mem.limit == pytest.approx(20.0)  # gpu_memory_total_bytes 21474836480 B = 20 GiB
    wait = jsonl.panels[4].series[0]
    assert max(v for v in wait.values if not math.isnan(v)) == pytest.approx(2.0)  # 0.02 → 2 %


def test_find_gaps_threshold():
    med, gaps = find_gaps([0, 1, 2, 3, 5.4, 6.4, 9.0])
    assert med == 1.0 and gaps == [(6.4, 9.0)]  # 2.4 s is under 2.5 × 1 s; 2.6 s is over


def test_train_and_doctor(full_report):
    (t,) = full_report.trains
    assert t.tokens_per_s_measured == pytest.approx(8_192_000 / 260.0)
    assert t.micro_batch == 16 and len(t.oom_events) == 1
    (d,) = full_report.doctors
    rows = {r.metric: r for r in d.rows}
    assert rows["step time"].change_fraction == pytest.approx(0.49 / 0.70 - 1)
    wait = rows["data wait + host→device copy"]  # the input's share of each step, copy included
    assert wait.before == pytest.approx(30.0) and wait.after == pytest.approx(2.0)
    assert d.step_time_s == 0.70 and len(d.split_s) == 9


def test_doctors_verdict_and_a_measured_gain_are_said(tmp_path):
    """QA: a doctor JSON whose interleaved rounds could not decide was reported as 'applied' with
    its +12 % median change and nothing else; a gain a probe measured was headed 'predicted'."""
    from trainfit.report.doctor_tables import doctor_texts

    doc = json.loads((FIXTURES / "doctor.json").read_text())
    doc["gain"] = {"verdict": "undecided", "ratios": [1.16, 1.10], "noise": 0.65}
    doc["findings"][0]["evidence"]["probe_measured_gain_fraction"] = 0.28
    doc["findings"][0]["gain_measured"] = True
    doc["split"]["parts_scale"] = 0.9
    p = tmp_path / "doctor.json"
    p.write_text(json.dumps(doc))
    (d,) = build_report(load_inputs([str(p)])).doctors
    assert d.verdict == "undecided" and d.verdict_ratios == [1.16, 1.10] and d.verdict_noise == 0.65
    split, before_after, findings = doctor_texts(d)
    assert "scaled by 0.900" in " ".join(split.notes)  # doctor's scaling is carried, and said
    said = " ".join(before_after.notes)
    assert "doctor's verdict: could not decide" in said and "1.16×, 1.10×" in said
    assert "noise measured 65%" in said
    assert findings.rows[0][4] == "28.0 (measured, a short probe)"
    assert findings.rows[1][4] == "unknown"
    # doctor's reading (what the gain is: an upper bound) is carried; an older file says unknown
    assert findings.rows[0][1] == "unknown"
    doc["findings"][0]["detail"] = "data wait 30 % of the step; the gain if it all went is an " \
                                   "upper bound"
    p.write_text(json.dumps(doc))
    (d,) = build_report(load_inputs([str(p)])).doctors
    assert doctor_texts(d)[2].rows[0][1].endswith("is an upper bound")
    # a predicted gain that assumes the whole cost goes is shown as the bound it is
    doc["findings"][0].update(gain_measured=False, gain_upper_bound=True, gain_fraction=2.655)
    doc["findings"][0]["evidence"].pop("probe_measured_gain_fraction")
    p.write_text(json.dumps(doc))
    (d,) = build_report(load_inputs([str(p)])).doctors
    assert doctor_texts(d)[2].rows[0][4] == "≤ 265.5 (predicted upper bound)"
    # a file from before the verdict was written: said unknown, never implied
    (old,) = build_report(load_inputs([str(FIXTURES / "doctor.json")])).doctors
    assert "doctor's verdict: unknown" in " ".join(doctor_texts(old)[1].notes)
    # F6: the gain's key is gain_fraction now (it holds a measured gain too); the old name reads
    assert old.findings[0].gain_fraction == 0.28
    new = json.loads((FIXTURES / "doctor.json").read_text())
    new["findings"][0]["gain_fraction"] = new["findings"][0].pop("predicted_gain_fraction") / 2
    p.write_text(json.dumps(new))
    (d,) = build_report(load_inputs([str(p)])).doctors
    assert d.findings[0].gain_fraction == 0.14
    assert old.parts_scale is None and doctor_texts(old)[0].notes == []
    assert doctor_texts(old)[2].notes == []
    # doctor's notes and each round's bottleneck (report dropped both: an audit)
    doc["notes"] = ["the run ended after 9 optimizer steps: 7 measured of the 8 asked"]
    doc["round_bottlenecks"] = ["input-bound", "compute-bound"]
    p.write_text(json.dumps(doc))
    (d,) = build_report(load_inputs([str(p)])).doctors
    assert doctor_texts(d)[2].notes == [
        "bottleneck named by each 'before' round: input-bound, compute-bound — did not hold",
        "the run ended after 9 optimizer steps: 7 measured of the 8 asked"]


def test_tune_alone_makes_its_own_section():
    rep = build_report(load_inputs([str(FIXTURES / "tune.json")]))
    (s,) = rep.sections
    assert s.capacity_source.endswith("(tune's memory limit)")
    assert s.title.startswith("chatlm-mini-chinese on NVIDIA GeForce RTX 3080")
    (fam,) = s.families
    # predictions come from the probes (hollow markers), one per micro-batch
    assert sorted(p.micro_batch for p in fam.memory_predicted_gib) == [1, 4, 16, 16, 32]
    assert not fam.bars
    # with no plan, a row's predicted fit is tune's rule on its probe's prediction (not unknown):
    # micro-batch 32, 16.02 GiB predicted, is within 90 % of 19.71 GiB (it then OOMed, measured)
    fit = {r.micro_batch: r.fits_predicted for r in s.table.rows}
    assert fit == {1: True, 4: True, 16: True, 32: True}
    assert s.capacity_label == "GPU memory"


def test_a_probe_of_another_knob_setting_is_its_own_row(tmp_path):
    """A probe that differs from the pick only in a knob tune searched (here the optimizer's
    kernel) is not merged into the pick's row: a foreach probe at 231 tokens/s set the median of
    the pick's row and made a slower micro-batch read faster (a QA run)."""
    tune = json.loads((FIXTURES / "tune.json").read_text())
    (s0,) = build_report(load_inputs([str(FIXTURES / "tune.json")])).sections
    before = next(r for r in s0.table.rows if r.pick).tokens_per_s_measured
    slow = {**tune["probes"][4], "index": 6, "optimizer_impl": "foreach",
            "measured": {**tune["probes"][4]["measured"], "tokens_per_s": 231.0}}
    for p in tune["probes"]:
        p.setdefault("optimizer_impl", "fused")
    tune["pick"]["optimizer_impl"] = "fused"
    tune["probes"].append(slow)
    f = tmp_path / "tune.json"
    f.write_text(json.dumps(tune))
    (s,) = build_report(load_inputs([str(f)])).sections
    rows = {(r.setting, r.micro_batch): r for r in s.table.rows}
    pick = next(r for r in s.table.rows if r.pick)
    assert pick.tokens_per_s_measured == before > 30_000  # its own probes only
    foreach = [r for (setting, _), r in rows.items() if "optimizer_impl foreach" in setting]
    assert [r.tokens_per_s_measured for r in foreach] == [231.0]
    # the pick's persistent_workers, set by rule and never measured, splits nothing (a review)
    tune["pick"]["persistent_workers"] = True
    f.write_text(json.dumps(tune))
    (s,) = build_report(load_inputs([str(f)])).sections
    assert next(r for r in s.table.rows if r.pick).tokens_per_s_measured == before


def test_tune_on_a_cpu_names_its_memory_limit(tmp_path):
    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["device"], tune["memory_limit_bytes"] = "cpu", int(0.5 * GIB)
    p = tmp_path / "tune.json"
    p.write_text(json.dumps(tune))
    (s,) = build_report(load_inputs([str(p)])).sections
    assert s.capacity_label == "memory limit"
    # GiBs predicted over 0.45 usable; the skipped compile probe has no prediction: unknown
    assert {r.fits_predicted for r in s.table.rows if r.status_measured != "skipped"} == {False}
    assert [r.fits_predicted for r in s.table.rows if r.status_measured == "skipped"] == [None]
    from trainfit.report.figures import memory_title

    assert memory_title(s).startswith("Peak live tensor bytes (CPU)")  # not "GPU memory"


def test_ladder_and_kindless_plan(tmp_path):
    plan = json.loads((SEED002_NOW.parent / "seed004_4gb_gpt2_scratch.json").read_text())
    plan.pop("kind", None)  # as written before `kind` existed: configs + gpu make it a plan
    kindless = tmp_path / "kindless.json"
    kindless.write_text(json.dumps(plan))
    assert len(load_inputs([str(kindless)]).plans) == 1
    plan["kind"] = "plan"
    plan["recommended_index"] = None
    for c in plan["configs"]:
        c["fits"], c["recommended"] = False, False
    plan["ladder"] = [{"change": "micro-batch 1", "peak_device_bytes": 5 * GIB, "tokens_per_s": None,
                       "fits": False, "alters_learning": False},
                      {"change": "+ 8-bit AdamW", "peak_device_bytes": 3 * GIB, "tokens_per_s": 900.0,
                       "fits": True, "alters_learning": True}]
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    (s,) = build_report(load_inputs([str(p)])).sections
    assert [x.peak_device_bytes for x in s.ladder] == [5 * GIB, 3 * GIB]
    assert s.picks == [] and s.throughput_unknown_reason is not None  # generic GPU: no tokens/s


def test_the_plans_own_reasons_for_unknown_tokens_per_s(tmp_path):
    """The report said 'no known peak throughput for its dtype' of every plan without tokens/s
    (a 2 × RTX 3090 plan has a known peak: its unknown is the link), and nothing of a single row
    without them (the allocator at the card's limit): plan --json's speed_unknown_reason is
    used for both."""
    plan = json.loads((SEED002_NOW.parent / "seed004_4gb_gpt2_scratch.json").read_text())
    plan["kind"] = "plan"
    p2p = "2 ranks but the GPU has no PCIe peer-to-peer"
    for c in plan["configs"]:
        c["tokens_per_s"], c["speed_unknown_reason"] = None, p2p
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    (s,) = build_report(load_inputs([str(p)])).sections
    assert p2p in s.throughput_unknown_reason and "no known peak" not in s.throughput_unknown_reason
    one = plan["configs"][0]
    for c in plan["configs"]:
        c["tokens_per_s"], c["speed_unknown_reason"] = 1000.0, ""
    one["tokens_per_s"], one["speed_unknown_reason"] = None, "at the card's limit"
    p.write_text(json.dumps(plan))
    (s,) = build_report(load_inputs([str(p)])).sections
    assert s.throughput_unknown_reason is None
    assert [n for n in s.notes if n.startswith("tokens/s unknown on ")] == [
        f"tokens/s unknown on {one['precision']}, checkpointing {one['grad_ckpt']}, "
        f"{one['micro_batch']} × {one['grad_accum']} (predicted): at the card's limit"]


def test_time_per_epoch_counts_the_positions_tokens_per_s_counts(tmp_path):
    """tokens/s counts every position of a sample padded to seq_len (tune/probe.py); tune's
    dataset_tokens counts non-padding tokens. Chat rows of 100 tokens padded to 320: the epoch
    is 80,000 samples × 320 positions at the measured rate (742 s at 34,500 tokens/s), not the
    8,000,000 real tokens at it (232 s, a review's case)."""
    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["dataset_tokens"] = 8_000_000
    p = tmp_path / "tune.json"
    p.write_text(json.dumps(tune))
    (sec,) = build_report(load_inputs([str(p)])).sections
    (r16,) = [r for r in sec.table.rows
              if r.setting == "amp-bf16, checkpointing off" and r.micro_batch == 16]
    assert r16.epoch_measured_s == pytest.approx(80_000 * 320 / 34500)
    assert sec.table.dataset_tokens == 25_600_000
    assert "8,000,000 of them not padding" in sec.table.dataset_tokens_source
    # a script's tune counts its batches' non-padding tokens: its epoch is those at that rate
    # (an audit: positions over it made an epoch 4.5 % too long)
    tune["step_source"] = "script"
    p.write_text(json.dumps(tune))
    (sec,) = build_report(load_inputs([str(p)])).sections
    (r16,) = [r for r in sec.table.rows
              if r.setting == "amp-bf16, checkpointing off" and r.micro_batch == 16]
    assert r16.epoch_measured_s == pytest.approx(8_000_000 / 34500)
    assert sec.table.dataset_tokens == 8_000_000
    assert "non-padding tokens, as a script's tokens/s counts them" in \
        sec.table.dataset_tokens_source
    # beside a plan (positions): the plan's predicted tokens/s in the tune's count, said (a
    # review: 36,092 predicted positions/s beside 34,500 measured non-padding tokens/s)
    (sec,) = build_report(load_inputs([str(SEED002), str(p)])).sections
    share = 8_000_000 / (80_000 * 320)
    planned = {(c["precision"], c["grad_ckpt"], c["micro_batch"], c["grad_accum"]):
               c["tokens_per_s"] for c in PLAN["configs"]}
    (r16,) = [r for r in sec.table.rows
              if r.setting == "amp-bf16, checkpointing off" and r.micro_batch == 16]
    want = planned[("amp-bf16", "off", 16, r16.grad_accum)] * share
    assert r16.tokens_per_s_predicted == pytest.approx(want)
    assert r16.epoch_predicted_s == pytest.approx(8_000_000 / want)
    assert any(f"× {share:.3f} (the non-padding share" in n for n in sec.notes)


def test_a_gpu_plan_and_a_cpu_tune_are_shown_apart(tmp_path):
    """A plan for a GPU and a tune of the same model measured on the CPU: two sections and a
    warning, not one table with a T4's prediction beside the CPU's live bytes."""
    tune = json.loads((FIXTURES / "tune.json").read_text())
    tune["device"], tune["device_name"] = "cpu", "CPU (2 cores), live tensor bytes"
    p = tmp_path / "tune_cpu.json"
    p.write_text(json.dumps(tune))
    r = build_report(load_inputs([str(SEED002), str(p)]))
    assert len(r.sections) == 2
    assert any("was measured on CPU (2 cores), live tensor bytes" in w and "shown apart" in w
               for w in r.warnings)
    same = build_report(load_inputs([str(SEED002), str(FIXTURES / "tune.json")]))
    assert len(same.sections) == 1 and not any("shown apart" in w for w in same.warnings)


def test_a_cpu_runs_timeline_does_not_call_its_tensor_count_gpu_memory():
    """An audit: on a CPU run the panel read "GPU memory (measured) — peak allocated (torch)" over
    trainfit's own count of live tensors, beside an empty GPU utilisation panel."""
    from dataclasses import replace

    from trainfit.report.inputs import MonitorLog
    from trainfit.report.monitor_log import MONITOR_COLUMNS
    from trainfit.report.timeline import build_timeline

    def log(**given: list) -> MonitorLog:
        n = 3
        cols = {k: [None] * n for k in MONITOR_COLUMNS}
        cols.update({"time_s": [0.0, 1.0, 2.0], **given})
        return MonitorLog(path="m.jsonl", columns=cols)

    # without --memory-limit nothing counts the tensors: no panel for them (a review)
    bare = build_timeline(log(), "t")
    assert not any("memory" in p.title.lower() and "host" not in p.title.lower()
                   for p in bare.panels)
    cpu = build_timeline(log(peak_allocated_bytes=[2**30, 2**30, 2**31]), "t")
    assert cpu.panels[0].title.startswith(
        "Live tensor memory (measured; a CPU run, no GPU")
    assert not any(p.title.startswith("GPU") for p in cpu.panels)
    assert cpu.panels[0].series[0].values == [1.0, 1.0, 2.0]
    gpu = build_timeline(log(peak_allocated_bytes=[2**30] * 3, peak_reserved_bytes=[2**31] * 3),
                         "t")
    assert [p.title for p in gpu.panels][:2] == ["GPU utilisation (measured)",
                                                 "GPU memory (measured)"]
    # a CPU run on a host whose GPUs NVML read (a log from before the run read none, or a
    # monitor of the host): the run's own record decides, and its --memory-limit is drawn (an
    # audit: the tensor count was "peak allocated (torch)" beside another process's GPU)
    mixed = log(peak_allocated_bytes=[2**30] * 3, gpu_index=[0.0] * 3,
                gpu_memory_total_bytes=[80.0 * 2**30] * 3, gpu_util_percent=[87.0] * 3)
    mixed = replace(mixed, run_devices=["cpu"], memory_limit_bytes=3 * 2**29)
    on_cpu = build_timeline(mixed, "t")
    assert on_cpu.panels[0].title.startswith("Live tensor memory")
    assert on_cpu.panels[0].limit == 1.5 and on_cpu.panels[0].limit_label == "--memory-limit"
    assert not any(p.title.startswith("GPU") for p in on_cpu.panels)
    # two cards of different memory: no one capacity line, each series says its card's (an
    # audit: the H100's 80 GiB line over the A10G's series)
    two = log(gpu_index=[0.0, 1.0, 0.0], gpu_memory_total_bytes=[80.0 * 2**30, 24.0 * 2**30,
                                                                 80.0 * 2**30],
              gpu_memory_used_bytes=[2.0**30] * 3, time_s=[0.0, 0.0, 1.0])
    mem = build_timeline(two, "t").panels[1]
    assert mem.limit is None
    assert [s.label for s in mem.series][:2] == ["used (nvidia-smi), GPU 0 (of 80.0 GiB)",
                                                 "used (nvidia-smi), GPU 1 (of 24.0 GiB)"]
    on_gpu = build_timeline(replace(mixed, run_devices=["cuda:0"]), "t")
    assert on_gpu.panels[0].title == "GPU utilisation (measured)"
