"""benchmarks/make_readme.py renders the comparison page from the results files (JSON reads only)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCH / "results"


@pytest.fixture(scope="module")
def mr(load_bench) -> ModuleType:
    return load_bench("make_readme")


def _json(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _section(page: str, title: str) -> str:
    start = page.index(title)
    end = page.find("\n### ", start + len(title))
    return page[start:] if end < 0 else page[start:end]


def test_memory_table_numbers_from_json(mr: ModuleType) -> None:
    page = mr.render(RESULTS)
    d = _json("estimate_memory_compare")
    s = d["summary"]
    sec = _section(page, "### Memory estimation")
    row = next(line for line in sec.splitlines() if line.startswith("| median \\|error\\| vs measured peak"))
    # accelerate column first, then trainfit, formatted as the JSON's fractions at 0.1 %
    assert f"| {s['accelerate']['median_abs_error']:.1%} | {s['trainfit']['median_abs_error']:.1%} |" in row
    right = next(line for line in sec.splitlines() if "right side of the GPU's capacity" in line)
    assert right.endswith(f"| {s['accelerate']['right_side_of_capacity']} | "
                          f"{s['trainfit']['right_side_of_capacity']} |")
    assert f"of {s['cases']} cases" in right
    # trainfit's side is calibration.py's number, not a re-run
    cal = _json("calibration")["summary"]
    assert s["trainfit"]["median_abs_error"] == pytest.approx(cal["median_abs_error"])
    assert f"accelerate {d['accelerate_version']}" in sec


def test_truth_and_monitor_tables(mr: ModuleType) -> None:
    page = mr.render(RESULTS)
    truth = _section(page, "### The published measurements used")
    cal, sp = _json("calibration")["summary"], _json("speed_published")["summary"]
    assert f"| {cal['median_abs_error']:.1%} | {cal['max_abs_error']:.1%} |" in truth
    assert f"| {sp['median_abs_error']:.1%} | {sp['max_abs_error']:.1%} |" in truth
    n_thr = len(json.loads((BENCH / "throughput_published.json").read_text())["cases"])
    assert f"holds {n_thr} cases" in truth
    sc = _json("speed_cpu")["summary"]
    assert f"| {sc['median_abs_error']:.1%} | {sc['max_abs_error']:.1%} |" in truth
    mon = _json("monitor_overhead")
    doctor = _section(page, "### Doctor and monitor")
    assert f"{mon['expected_overhead_percent']:.3f} % of step time" in doctor
    assert f"{mon['record_step_us']:.2f} µs" in doctor


def test_batch_size_and_lightning_sections(mr: ModuleType) -> None:
    page = mr.render(RESULTS)
    batch = _section(page, "### Batch-size finding")
    assert "transformers.trainer_utils.find_executable_batch_size" in batch
    if (RESULTS / "tune_targets.json").exists():
        for r in json.loads((RESULTS / "tune_targets.json").read_text()):
            head = f"| {r['model']} | {r['effective_batch']} |"
            line = next(x for x in batch.splitlines() if x.startswith(head))
            assert f"| {r['accelerate']['chosen_batch']} | {len(r['accelerate']['tried'])} |" in line
            assert f"{r['tune_probe_time_s']:.1f}" in line
    else:
        assert "not yet measured — run `python benchmarks/tune_targets.py`" in batch
    light = _section(page, "### Lightning `BatchSizeFinder`")
    rows = _json("tune_targets") if (RESULTS / "tune_targets.json").exists() else []
    measured = [r for r in rows if (r.get("lightning") or {}).get("status") == "measured"]
    if measured:  # measured by tune_targets.py: its numbers, not the notes'
        assert "Measured by `tune_targets.py` (`lightning_finder.py`" in light and "| 149 |" not in light
        for r in measured:
            lt = r["lightning"]
            line = next(x for x in light.splitlines() if x.startswith(f"| {r['model']} |"))
            assert f"| {lt['chosen_batch']} ({lt['largest_batch_that_ran']}) |" in line
            assert f"| {lt['probe_time_s']:.1f} |" in line
            assert f"| {statistics.median(lt['tokens_per_s_remeasured']):,.0f} |" in line
        return
    assert "measured on this machine's kind by the project's notes" in light.lower()
    assert "| 149 | 256 | no |" in light and "| 645 | 287 | no |" in light
    notes = BENCH.parent / mr.NOTES  # NOTES is relative to the repository root
    if notes.exists():  # the quoted figures are the notes' own
        text = notes.read_text()
        assert all(x in text for x in ("149 s", "645 s", "256 / 287"))


def test_regenerate_line_names_every_script(mr: ModuleType) -> None:
    page = mr.render(RESULTS)
    assert "`python benchmarks/make_readme.py`" in page
    loop = next(line for line in page.splitlines() if line.startswith("for b in "))
    for script, _, _ in mr.SCRIPTS:
        assert script[:-3] in loop
        assert f"| `{script}` |" in page


def test_missing_and_synthetic_results(mr: ModuleType, tmp_path: Path) -> None:
    # no tune / doctor results: say so, with the command that produces them
    for name in ("calibration", "estimate_memory_compare", "monitor_overhead"):
        shutil.copy(RESULTS / f"{name}.json", tmp_path)
    page = mr.render(tmp_path)
    assert "not yet measured — run `python benchmarks/tune_targets.py`" in page
    assert "not yet measured — run `python benchmarks/doctor_targets.py`" in page
    cfg = {"micro_batch": 2, "grad_accum": 3, "grad_ckpt": "full", "optimizer_impl": "foreach",
           "num_workers": 1}
    row = {"model": "synthetic-m", "effective_batch": 6, "grid_probes": 24, "grid_probe_time_s": 123.45,
           "tune_probes": 5, "tune_probe_time_s": 17.25, "tune_time_fraction_of_grid": 0.1397,
           "grid_best": cfg, "pick": cfg, "pick_vs_best": 0.987, "memory_max_rel_error": 0.0123,
           "remeasured_pick_tokens_per_s": [1000.0, 1100.0, 1234.0],
           "remeasured_best_tokens_per_s": [1000.0, 1050.0, 1100.0],
           "accelerate": {"chosen_batch": 28, "tried": [32, 28], "probe_time_s": 9.5,
                          "effective_batch_kept": False, "tokens_per_s_remeasured": [2222.0, 2224.0]}}
    (tmp_path / "tune_targets.json").write_text(json.dumps([row]))
    (tmp_path / "doctor_targets.json").write_text(json.dumps({"summary": {"jobs": 3, "speedup": 1.5}}))
    page = mr.render(tmp_path)
    batch = _section(page, "### Batch-size finding")
    assert ("| synthetic-m | 6 | 28 | 2 | 9.5 | no | 2,223 | 2×3, ckpt full, foreach, workers 1 | 5 | "
            "17.2 | yes | 1,100 |") in batch
    assert "| 24 | 123.5 | 14% |" in batch and "| 98.7% | 21%, 10% | 1.23% |" in batch
    assert statistics.median(row["remeasured_pick_tokens_per_s"]) == 1100.0
    assert "| jobs | 3 |" in page and "| speedup | 1.5 |" in page
    # no Lightning run in the results: the notes are quoted, and labelled so
    assert "| 149 | 256 | no |" in _section(page, "### Lightning `BatchSizeFinder`")
    row["lightning"] = {
        "status": "measured", "lightning_version": "2.6.6", "chosen_batch": 5, "largest_batch_that_ran": 6,
        "settings": {"mode": "binsearch", "init_val": 2, "max_trials": 25, "steps_per_trial": 3,
                     "margin": 0.05},
        "trials": [{"batch_size": b, "status": st} for b, st in ((2, "ok"), (4, "ok"), (8, "oom"),
                                                                  (6, "ok"), (7, "oom"))],
        "probe_time_s": 21.46, "effective_batch_kept": False,
        "tokens_per_s_remeasured": [300.0, 310.0, 320.0], "pick_tokens_per_s_same_session": [620.0] * 3,
        "accelerate_tokens_per_s_same_session": [200.0, 210.0, 220.0], "run": "measured 2026-01-01 by x"}
    (tmp_path / "tune_targets.json").write_text(json.dumps([row]))
    light = _section(mr.render(tmp_path), "### Lightning `BatchSizeFinder`")
    assert ("| synthetic-m | 6 | 5 (6) | 2 → 4 → 8 OOM → 6 → 7 OOM | 21.5 | no | 310 | 2×3 | 620 | 50% | "
            "6%, 0% | 28, 210 |") in light
    assert "| 149 |" not in light and "Lightning figures measured 2026-01-01 by x." in light
    assert "synthetic-m 6 vs 28" in light


def test_the_committed_seed_plans_keep_plans_invariants():
    """The committed example plans (benchmarks/seed_plans.py) obey what plan guarantees today:
    MFU ≤ HFU ≤ 1, allocated ≤ reserved ≤ device, ▲ only on a fitting row (an audit: a file
    written before MFU ≤ HFU held four rows with MFU above HFU)."""
    results = Path(__file__).resolve().parents[2] / "examples" / "results"
    files = sorted(results.glob("seed*.json"))
    assert len(files) == 5
    for f in files:
        for c in json.loads(f.read_text())["configs"]:
            where = f"{f.name} {c['precision']} {c['grad_ckpt']} {c['micro_batch']}"
            if c["mfu"] is not None:
                assert 0 < c["mfu"] <= c["hfu"] <= 1, where
            assert c["peak_allocated_bytes"] <= c["peak_reserved_bytes"], where
            if c["peak_device_bytes"] is not None:
                assert c["peak_reserved_bytes"] <= c["peak_device_bytes"], where
            assert not c["largest_fitting"] or c["fits"], where
